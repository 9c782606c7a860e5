// The dynamic quantization maps of 8-bit optimizers (Dettmers et al., "8-bit Optimizers via
// Block-wise Quantization"): 256 code values in [-1, 1] (signed, for Adam's first moment) or
// [0, 1] (unsigned, for the second moment), each a decimal exponent times a linear fraction.
// A block of values is stored as one code per value plus the block's absolute maximum; a
// value x is coded as the entry nearest to x / absmax.
//
// Subtle point: the maps are dense near zero on purpose. Adam's moments span many orders of
// magnitude inside one block, and a linear 8-bit code would flush every value below
// absmax/255 to zero; here the smallest non-zero magnitude is about 3e-7 of the absmax.
#pragma once

#include <array>
#include <cstdint>

namespace memfit {

inline constexpr int kQuantMapSize = 256;
using QuantMap = std::array<float, kQuantMapSize>;  // ascending

// For every decade e = 0..6 (magnitudes 10^(e-6) .. 10^(e-5)) the map holds the midpoints of
// n equal intervals of [0.1, 1] times 10^(e-6), with n = 2^e for the signed map (and their
// negatives) and n = 2^(e+1) for the unsigned one; then 0 and 1. Both have exactly 256
// entries: 2 (1 + 2 + ... + 64) + 2 and (2 + 4 + ... + 128) + 2.
QuantMap make_dynamic_map(bool is_signed);

// The two maps, built once (the first call; no allocation).
const QuantMap& dynamic_map_signed();
const QuantMap& dynamic_map_unsigned();

// Index of the map entry holding exactly 0 (the code of an all-zero block).
int zero_code(const QuantMap& map);

}  // namespace memfit
