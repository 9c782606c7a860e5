#include "io/json_errors.hpp"

#include <fmt/format.h>

namespace memfit {

std::string printable_error_text(const std::exception& e) {
  std::string out;
  for (const char* p = e.what(); *p; ++p) {
    const auto byte = static_cast<unsigned char>(*p);
    if (byte >= 0x20 && byte < 0x7f) out += char(byte);
    else out += fmt::format("\\x{:02x}", byte);
  }
  return out;
}

}  // namespace memfit
