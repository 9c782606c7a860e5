#include "io/float_convert.hpp"

#include <bit>
#include <cstring>

#include "core/error.hpp"

namespace memfit {

static_assert(std::endian::native == std::endian::little, "memfit io reads little-endian files in place");

float f32_from_bf16_bits(uint16_t bits) {
  // bf16 is the top half of an fp32: every bit is kept, NaN payloads included.
  return std::bit_cast<float>(uint32_t(bits) << 16);
}

float f32_from_f16_bits(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32 (10 significant bits, and 2^-24 is a
    // normal fp32 power of two).
    const float magnitude = float(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    // Infinity, or NaN made quiet (bit 22) with its payload kept, as F16C's vcvtph2ps does.
    uint32_t f = sign | 0x7f800000u | (mantissa << 13);
    if (mantissa != 0) f |= 0x00400000u;
    return std::bit_cast<float>(f);
  }
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

void widen_to_f32(DType from, const std::byte* src, float* dst, int64_t n) {
  switch (from) {
    case DType::f32:
      std::memcpy(dst, src, size_t(n) * sizeof(float));
      return;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = f32_from_bf16_bits(bits);
      }
      return;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = f32_from_f16_bits(bits);
      }
      return;
    default:
      MEMFIT_ASSERT(false, "widen_to_f32 from non-float dtype {}", dtype_name(from));
  }
}

}  // namespace memfit
