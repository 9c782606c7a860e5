// Byte counts for people: "1.50 GiB" out; sizes as people write them in.
//
// Accepted sizes: a non-negative decimal number (1.5, 1e9), optional spaces, then a unit in any
// case: none or B (bytes); KiB, MiB, GiB, TiB, PiB and Ki, Mi, Gi, Ti, Pi (powers of 1024);
// K/KB, M/MB, G/GB, T/TB, P/PB (powers of 1000, as disk and memory vendors and Kubernetes write
// them: 12G = 12GB = 12e9 bytes, 12GiB = 12Gi = 12 x 2^30). A fraction of a byte is rounded to
// the nearest byte. Anything else (a sign, inf, nan, an unknown unit) is refused, and so is a
// size of 2^63 bytes or more.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace memfit {

std::string format_bytes(uint64_t bytes);  // binary units, 3 significant digits
// Throws [size] naming `field` (the flag or key the text came from) on malformed input.
uint64_t parse_bytes(std::string_view text, std::string_view field = {});
// A memory budget or capacity: as parse_bytes, and also refused when 0 or above kMaxTierBytes
// (core/checked.hpp, 1 PiB): no machine has that much memory in one tier of one process.
uint64_t parse_memory_bytes(std::string_view text, std::string_view field);

inline constexpr uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

}  // namespace memfit
