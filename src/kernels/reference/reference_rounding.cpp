// Reference rounding of real numbers to bf16 and fp16 bit patterns, written from the format
// definitions with double arithmetic (frexp / ldexp / nearbyint), independent of the bit
// tricks in core/half.hpp that the kernels use.
#include <cfenv>
#include <cmath>
#include <cstdint>

#include "kernels/reference/reference.hpp"

namespace memfit::ref {

namespace {

// Rounds |x| (finite, > 0) to a binary format with `mantissa_bits` stored mantissa bits, the
// given exponent bias and maximum biased exponent; returns the magnitude's bit pattern.
uint16_t round_magnitude(double x, int mantissa_bits, int bias, int max_exponent) {
  int e = 0;
  std::frexp(x, &e);                        // x = f 2^e, f in [0.5, 1): leading bit has weight 2^(e-1)
  int exponent = e - 1;                     // unbiased exponent of x
  const int min_normal = 1 - bias;
  if (exponent < min_normal) exponent = min_normal;  // subnormal: fixed spacing 2^(min_normal - m)
  const double ulp = std::ldexp(1.0, exponent - mantissa_bits);
  const double units = std::nearbyint(x / ulp);  // round half to even (default rounding mode)
  // units in [2^m, 2^(m+1)] for normals (2^(m+1) carries into the next binade), < 2^m for subnormals.
  uint32_t biased = uint32_t(exponent + bias), mantissa = 0;
  const double implicit = std::ldexp(1.0, mantissa_bits);
  if (units >= 2 * implicit) {
    ++biased;
    mantissa = 0;
  } else if (units >= implicit) {
    mantissa = uint32_t(units - implicit);
  } else {
    biased = 0;  // subnormal (or rounded down to zero)
    mantissa = uint32_t(units);
  }
  if (int(biased) > max_exponent) return uint16_t(uint32_t(max_exponent + 1) << mantissa_bits);  // infinity
  return uint16_t((biased << mantissa_bits) | mantissa);
}

}  // namespace

uint16_t round_to_fp16_bits(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;
  if (std::isinf(x)) return sign | 0x7c00;
  if (x == 0) return sign;
  return sign | round_magnitude(std::fabs(x), 10, 15, 30);
}

uint16_t round_to_bf16_bits(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7fc0;
  if (std::isinf(x)) return sign | 0x7f80;
  // fp32 subnormals flush to zero (the behaviour of vcvtneps2bf16 that memfit follows).
  if (std::fabs(x) < std::ldexp(1.0, -126)) return sign;
  return sign | round_magnitude(std::fabs(x), 7, 127, 254);
}

}  // namespace memfit::ref
