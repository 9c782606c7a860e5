// Errors. User-facing failures throw memfit::Error with the piece named first
// ("[safetensors] ..."); the CLI turns them into one line and an exit code.
// Broken invariants (a bug in memfit, not in the input) abort with file and line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace memfit {

class Error : public std::runtime_error {
 public:
  Error(std::string_view piece, const std::string& message);
  const std::string& piece() const { return piece_; }

 private:
  std::string piece_;
};

[[noreturn]] void invariant_failed(const char* file, int line, const char* condition,
                                   const std::string& message);

}  // namespace memfit

// Throws memfit::Error("[piece] message") when cond is false.
#define MEMFIT_CHECK(cond, piece, ...)                                   \
  do {                                                                   \
    if (!(cond)) throw ::memfit::Error((piece), fmt::format(__VA_ARGS__)); \
  } while (0)

// Aborts with file and line: for conditions only a memfit bug can violate.
#define MEMFIT_ASSERT(cond, ...)                                                      \
  do {                                                                                \
    if (!(cond)) ::memfit::invariant_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
