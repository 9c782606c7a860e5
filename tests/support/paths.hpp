// Where tests find committed fixtures, the built memfit binary and the MPI launcher.
#pragma once

#include <string>

namespace memfit::test {

inline std::string fixture_path(const std::string& relative) { return std::string(MEMFIT_FIXTURE_DIR) + "/" + relative; }
inline std::string memfit_binary() { return MEMFIT_BINARY; }
inline std::string mpiexec() { return MEMFIT_MPIEXEC; }  // the MPI launcher CMake found (mpirun)

}  // namespace memfit::test
