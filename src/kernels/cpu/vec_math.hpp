// Vectorizable exp and tanh for the CPU kernels. glibc only offers SIMD variants of expf under
// -ffast-math, so a plain std::exp inside an `omp simd` loop becomes a scalar call per element
// and dominates softmax and GELU. These are written with float arithmetic, fma and integer
// bit tricks only, so GCC vectorizes them inline; that is why they live in a header (the one
// place where memfit defines functions in headers).
//
// Subtle point: exp_approx clamps its argument to the range where 2^n stays a normal float,
// so it never returns inf or a denormal; softmax callers set masked entries to exactly 0
// themselves rather than relying on exp(-inf) == 0.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace memfit {

// e^x with a relative error of about 2 ulp for x in [-87.3, 88.3]; saturates outside.
inline float exp_approx(float x) {
  // Ternaries rather than std::min/max: GCC turns these into single vmin/vmax instructions,
  // while std::max's operand order costs it extra blends (and 5x in reductions).
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  // n = round(x / ln2) by adding 1.5 * 2^23, which pushes the fraction out of the mantissa;
  // the integer n then sits in the low bits of t. (std::floor would be clearer, but GCC does
  // not vectorize it without -fno-trapping-math.)
  constexpr float kRound = 12582912.0f;
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  // x = n ln2 + r with |r| <= ln2/2; ln2 split in two so that n*ln2_hi is exact.
  const float r = std::fma(n, -1.4286068203094172e-06f, std::fma(n, -0.693145751953125f, x));
  // Taylor polynomial of degree 7: the truncation error r^8/8! < 5e-9 on |r| <= 0.347.
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return p * std::bit_cast<float>((ni + 127) << 23);
}

// The exponential of a softmax, x = score - row max <= 0, flushed to exactly 0 below 2^-64.
// Probabilities that small change no fp32 sum they enter, but left alone they and their
// products with activations and gradients (which are ~1e-6 here) reach subnormal floats, and
// a GEMM fed subnormal operands runs ~70x slower on x86 (measured: the classifier's dwte
// product took 3 s instead of 43 ms).
inline float softmax_exp(float x) {
  constexpr float kCutoff = -44.3614195558365f;  // -64 ln 2
  return x < kCutoff ? 0.0f : exp_approx(x);
}

// tanh through e^{-2|u|}, which never overflows; the absolute error is a few 1e-8, which is
// what GELU needs (its tanh is always added to 1).
inline float tanh_approx(float u) {
  const float e = exp_approx(-2.0f * std::fabs(u));
  const float t = (1.0f - e) / (1.0f + e);
  return std::copysign(t, u);
}

}  // namespace memfit
