// Widening of the float formats found in weight and checkpoint files to fp32, straight from
// the file's bytes. The conversion itself is core/half.hpp's, the one 16-bit codec of memfit
// (exact: every bf16 and fp16 value, subnormals, infinities and NaNs included, has an fp32
// value that equals it); this file only reads little-endian elements at any alignment.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"

namespace memfit {

// Widens n little-endian elements of type `from` (f32, bf16 or f16) at src into dst.
// src needs no alignment (it may point into a mapped file at any offset).
void widen_to_f32(DType from, const std::byte* src, float* dst, int64_t n);

}  // namespace memfit
