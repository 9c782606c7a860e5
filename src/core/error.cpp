#include "core/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace memfit {

Error::Error(std::string_view piece, const std::string& message)
    : std::runtime_error(fmt::format("[{}] {}", piece, message)), piece_(piece) {}

void invariant_failed(const char* file, int line, const char* condition,
                      const std::string& message) {
  std::fprintf(stderr, "memfit: invariant violated at %s:%d: %s: %s\n", file, line, condition,
               message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace memfit
