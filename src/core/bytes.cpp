#include "core/bytes.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include "core/checked.hpp"
#include "core/error.hpp"

namespace memfit {

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) v /= 1024.0, ++u;
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.{}f} {}", v, v >= 100 ? 1 : 2, units[u]);
}

namespace {

constexpr std::string_view kExamples = "examples: 12GiB, 12 GiB, 12G (= 12e9), 512MiB, 1e9";

// Bytes per unit; 0 for an unknown unit. `unit` is lower case without spaces.
double unit_scale(std::string_view unit) {
  if (unit.empty() || unit == "b") return 1;
  static constexpr std::string_view prefixes = "kmgtp";
  const size_t power = prefixes.find(unit[0]) + 1;  // 0 when not a prefix
  if (power == 0) return 0;
  const std::string_view rest = unit.substr(1);
  if (rest.empty() || rest == "b") return std::pow(1000.0, double(power));
  if (rest == "i" || rest == "ib") return std::ldexp(1.0, 10 * int(power));
  return 0;
}

std::string trimmed(std::string_view text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return std::string(text.substr(b, e - b));
}

}  // namespace

uint64_t parse_bytes(std::string_view text, std::string_view field) {
  const std::string s = trimmed(text);
  auto refuse = [&](std::string_view why) {
    throw Error("size", fmt::format("{}{}'{}' {} ({})", field, field.empty() ? "" : ": ", text, why, kExamples));
  };
  // The number: digits first (no sign, no "inf" or "nan"), then from_chars reads it exactly.
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) refuse("is not a size");
  double value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || !std::isfinite(value)) refuse("is not a size");
  std::string unit;
  for (const char* c = end; c != s.data() + s.size(); ++c)
    unit += char(std::tolower(static_cast<unsigned char>(*c)));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit[0]))) unit.erase(0, 1);
  const double scale = unit_scale(unit);
  if (scale == 0) refuse("has an unknown unit");
  // A plain count of bytes is read as an integer, so every uint64_t below 2^63 is exact.
  const std::string_view number(s.data(), size_t(end - s.data()));
  if (scale == 1 && number.find_first_not_of("0123456789") == std::string_view::npos) {
    uint64_t n = 0;
    const auto [e2, ec2] = std::from_chars(number.data(), number.data() + number.size(), n);
    if (ec2 != std::errc() || n >= (uint64_t(1) << 63)) refuse("is 2^63 bytes or more");
    return n;
  }
  const double bytes = std::round(value * scale);
  if (!(bytes < std::ldexp(1.0, 63))) refuse("is 2^63 bytes or more");
  return uint64_t(bytes);
}

uint64_t parse_memory_bytes(std::string_view text, std::string_view field) {
  const uint64_t bytes = parse_bytes(text, field);
  MEMFIT_CHECK(bytes > 0, "size", "{}: '{}' is no memory at all; give a size such as 12GiB", field, text);
  MEMFIT_CHECK(bytes <= kMaxTierBytes, "size", "{}: '{}' is {} bytes, above {} ({} bytes), more than any machine "
               "has in one memory tier", field, text, bytes, format_bytes(kMaxTierBytes), kMaxTierBytes);
  return bytes;
}

}  // namespace memfit
