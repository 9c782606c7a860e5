// Exact widening of the 16-bit float formats found in checkpoint files to fp32: every bf16 and
// fp16 value (subnormals, infinities and NaNs included) has an fp32 value that equals it.
// bf16 keeps every bit (a shift); fp16 NaNs come out quiet with their payload kept, bit for
// bit what x86 F16C (vcvtph2ps) gives, so either may be used without changing results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"

namespace memfit {

float f32_from_bf16_bits(uint16_t bits);
float f32_from_f16_bits(uint16_t bits);

// Widens n little-endian elements of type `from` (f32, bf16 or f16) at src into dst.
// src needs no alignment (it may point into a mapped file at any offset).
void widen_to_f32(DType from, const std::byte* src, float* dst, int64_t n);

}  // namespace memfit
