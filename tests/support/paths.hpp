// Where tests find committed fixtures and the built memfit binary.
#pragma once

#include <string>

namespace memfit::test {

inline std::string fixture_path(const std::string& relative) { return std::string(MEMFIT_FIXTURE_DIR) + "/" + relative; }
inline std::string memfit_binary() { return MEMFIT_BINARY; }

}  // namespace memfit::test
