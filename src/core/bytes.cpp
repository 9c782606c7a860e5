#include "core/bytes.hpp"

#include <cctype>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace memfit {

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.{}f} {}", v, v >= 100 ? 1 : 2, units[u]);
}

uint64_t parse_bytes(std::string_view text) {
  std::string s(text);
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (...) {
    throw Error("size", fmt::format("'{}' is not a size (examples: 24GiB, 80GB, 512MiB, 1e9)", text));
  }
  std::string unit;
  for (char c : s.substr(pos))
    if (!std::isspace(static_cast<unsigned char>(c))) unit += char(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb") scale = 1e3;
  else if (unit == "m" || unit == "mb") scale = 1e6;
  else if (unit == "g" || unit == "gb") scale = 1e9;
  else if (unit == "t" || unit == "tb") scale = 1e12;
  else if (unit == "kib") scale = double(KiB);
  else if (unit == "mib") scale = double(MiB);
  else if (unit == "gib") scale = double(GiB);
  else if (unit == "tib") scale = double(GiB) * 1024;
  if (scale == 0 || !(value >= 0) || std::isinf(value))
    throw Error("size", fmt::format("'{}' is not a size (examples: 24GiB, 80GB, 512MiB, 1e9)", text));
  return uint64_t(std::llround(value * scale));
}

}  // namespace memfit
