// The cold paths of core/checked.hpp: formatting the operands of an overflow into its error.
#include "core/checked.hpp"

#include <charconv>

#include "core/error.hpp"

namespace memfit {

namespace detail {

template <class T>
std::string_view decimal(T v, char (&buf)[24]) {
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string_view(buf, size_t(end - buf)) : std::string_view("?");
}

template std::string_view decimal<int>(int, char (&)[24]);
template std::string_view decimal<long>(long, char (&)[24]);
template std::string_view decimal<long long>(long long, char (&)[24]);
template std::string_view decimal<unsigned>(unsigned, char (&)[24]);
template std::string_view decimal<unsigned long>(unsigned long, char (&)[24]);
template std::string_view decimal<unsigned long long>(unsigned long long, char (&)[24]);

}  // namespace detail

void throw_overflow(std::string_view piece, std::string_view what, std::string_view a, char op, std::string_view b,
                    int bits) {
  throw Error(piece, fmt::format("{}: {} {} {} overflows {}-bit integers", what, a, op, b, bits));
}

uint64_t checked_align_up(uint64_t x, uint64_t alignment, std::string_view what, std::string_view piece) {
  const uint64_t padded = checked_add(x, alignment - 1, what, piece);
  return padded / alignment * alignment;
}

uint64_t checked_unsigned(int64_t v, std::string_view what, std::string_view piece) {
  if (v < 0) throw Error(piece, fmt::format("{} is negative ({})", what, v));
  return uint64_t(v);
}

}  // namespace memfit
