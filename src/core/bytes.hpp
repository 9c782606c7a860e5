// Byte counts for people: "1.50 GiB" out, "24GB" / "24GiB" / "1.5e9" in.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

std::string format_bytes(uint64_t bytes);  // binary units, 3 significant digits
uint64_t parse_bytes(std::string_view text);  // throws [size] on malformed input

inline constexpr uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

}  // namespace memfit
