// The 16-bit conversions every low-precision kernel uses (core/half.hpp), against independent
// oracles: widening against the formats' definitions (sign x 2^e x 1.m in double arithmetic)
// for all 65,536 patterns of each format, narrowing against reference rounding written from the format definitions (double
// arithmetic) over millions of fp32 patterns, and against the x86 conversion instructions
// (F16C vcvtps2ph, AVX512-BF16 vcvtneps2bf16) where the build has them.
#include "kernels/cpu/avx512_quiet.hpp"  // first: _mm_cvtness_sbh below trips GCC 12's own warning
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "core/half.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/reference/reference.hpp"

#if defined(__F16C__) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace memfit {
namespace {

bool is_nan_bits(uint16_t h, uint16_t exponent_mask) {
  return (h & exponent_mask) == exponent_mask && (h & uint16_t(~exponent_mask & 0x7fff)) != 0;
}

// The value of a 16-bit pattern from the format's definition: exponent_bits and mantissa_bits
// wide, bias 2^(exponent_bits-1) - 1; exponent 0 is subnormal, all ones is infinity or NaN.
double reference_value(uint16_t h, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int exponent = (h >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = h & ((1 << mantissa_bits) - 1);
  const double sign = (h >> 15) ? -1.0 : 1.0;
  if (exponent == (1 << exponent_bits) - 1) return mantissa == 0 ? sign * INFINITY : NAN;
  if (exponent == 0) return sign * std::ldexp(double(mantissa), 1 - bias - mantissa_bits);
  return sign * std::ldexp(1.0 + std::ldexp(double(mantissa), -mantissa_bits), exponent - bias);
}

void expect_widens_to(float got, uint16_t h, int exponent_bits, int mantissa_bits) {
  const double want = reference_value(h, exponent_bits, mantissa_bits);
  if (std::isnan(want)) {
    ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    ASSERT_EQ(std::signbit(got), bool(h >> 15)) << std::hex << h;
    return;
  }
  ASSERT_EQ(double(got), want) << std::hex << h;
  ASSERT_EQ(std::signbit(got), bool(h >> 15)) << std::hex << h;  // -0 keeps its sign
}

TEST(Half, WideningIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f16 = widen(fp16_t{uint16_t(h)});
    expect_widens_to(f16, uint16_t(h), 5, 10);
    if (std::isnan(f16)) {  // fp16 NaNs come out quiet (fp32 bit 22) with their 10-bit payload kept
      ASSERT_EQ((std::bit_cast<uint32_t>(f16) >> 13) & 0x3ffu, (h & 0x3ffu) | 0x200u) << std::hex << h;
    }
    const float b16 = widen(bf16_t{uint16_t(h)});
    expect_widens_to(b16, uint16_t(h), 8, 7);
    ASSERT_EQ(std::bit_cast<uint32_t>(b16), h << 16) << std::hex << h;  // bf16 is fp32's top half, NaNs too
#if defined(__F16C__)
    ASSERT_EQ(std::bit_cast<uint32_t>(f16), std::bit_cast<uint32_t>(_cvtsh_ss(uint16_t(h)))) << std::hex << h;
#endif
  }
}

// fp32 patterns: a stride through all of them plus every pattern within a few units of
// each fp16 / bf16 rounding boundary of interest (halfway points, the subnormal edges,
// overflow to infinity).
std::vector<uint32_t> test_patterns() {
  std::vector<uint32_t> v;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 1021) v.push_back(uint32_t(u));
  for (float edge : {65504.0f, 65520.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 1.0f, 1.00048828125f,
                     3.3895314e38f, 0x1p-126f, 1.00390625f})
    for (int d = -4; d <= 4; ++d)
      for (uint32_t sign : {0u, 0x80000000u}) v.push_back((std::bit_cast<uint32_t>(edge) + uint32_t(d)) | sign);
  return v;
}

TEST(Half, NarrowingRoundsToNearestEvenLikeTheReference) {
  int64_t checked = 0;
  for (uint32_t u : test_patterns()) {
    const float x = std::bit_cast<float>(u);
    const uint16_t h = narrow<fp16_t>(x).bits, b = narrow<bf16_t>(x).bits;
    if (std::isnan(x)) {
      ASSERT_TRUE(is_nan_bits(h, 0x7c00) && (h & 0x0200)) << std::hex << u;  // quiet NaN
      ASSERT_TRUE(is_nan_bits(b, 0x7f80) && (b & 0x0040)) << std::hex << u;
      continue;
    }
    ASSERT_EQ(h, ref::round_to_fp16_bits(double(x))) << "fp16 of " << std::hexfloat << x;
    ASSERT_EQ(b, ref::round_to_bf16_bits(double(x))) << "bf16 of " << std::hexfloat << x;
    ++checked;
  }
  EXPECT_GT(checked, 4000000);
}

#if defined(__F16C__) || defined(__AVX512BF16__)
TEST(Half, NarrowingMatchesTheConversionInstructions) {
  for (uint32_t u : test_patterns()) {
    const float x = std::bit_cast<float>(u);
#if defined(__F16C__)
    ASSERT_EQ(narrow<fp16_t>(x).bits, _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)) << std::hex << u;
#endif
#if defined(__AVX512BF16__)
    ASSERT_EQ(narrow<bf16_t>(x).bits, std::bit_cast<uint16_t>(_mm_cvtness_sbh(x))) << std::hex << u;
#endif
  }
}
#endif

// The vectorized loops (a cast is accumulate_forward between types) give the scalar bits.
TEST(Half, VectorLoopsGiveTheScalarConversions) {
  std::vector<float> x;
  for (uint32_t u : test_patterns()) x.push_back(std::bit_cast<float>(u));
  std::vector<fp16_t> h(x.size());
  std::vector<bf16_t> b(x.size());
  accumulate_forward(x.data(), h.data(), int64_t(x.size()), false);
  accumulate_forward(x.data(), b.data(), int64_t(x.size()), false);
  std::vector<float> back(x.size());
  accumulate_forward(h.data(), back.data(), int64_t(x.size()), false);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i].bits, narrow<fp16_t>(x[i]).bits) << i;
    ASSERT_EQ(b[i].bits, narrow<bf16_t>(x[i]).bits) << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(widen(h[i]))) << i;
  }
}

}  // namespace
}  // namespace memfit
