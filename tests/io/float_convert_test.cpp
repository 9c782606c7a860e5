// bf16/fp16 -> fp32 widening of file bytes (io/float_convert.hpp, through core/half.hpp's
// codec), checked against published bit patterns, against the IEEE formula evaluated with
// ldexp for all 65,536 fp16 patterns, and against the CPU's own F16C conversion where the
// build has it; and reads of unaligned runs.
#include "io/float_convert.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace memfit {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// One element through the file reader.
float widen_one(DType from, uint16_t bits) {
  float out = 0;
  widen_to_f32(from, reinterpret_cast<const std::byte*>(&bits), &out, 1);
  return out;
}
float f32_from_f16_bits(uint16_t bits) { return widen_one(DType::f16, bits); }
float f32_from_bf16_bits(uint16_t bits) { return widen_one(DType::bf16, bits); }

TEST(Float16, KnownPatterns) {
  EXPECT_EQ(f32_from_f16_bits(0x3C00), 1.0f);
  EXPECT_EQ(f32_from_f16_bits(0xC000), -2.0f);
  EXPECT_EQ(f32_from_f16_bits(0x3555), 0.333251953125f);
  EXPECT_EQ(f32_from_f16_bits(0x7BFF), 65504.0f);                     // largest finite
  EXPECT_EQ(f32_from_f16_bits(0x0400), 6.103515625e-05f);             // smallest normal, 2^-14
  EXPECT_EQ(f32_from_f16_bits(0x03FF), 6.097555160522461e-05f);       // largest subnormal
  EXPECT_EQ(f32_from_f16_bits(0x0001), 5.960464477539063e-08f);       // smallest subnormal, 2^-24
  EXPECT_EQ(f32_from_f16_bits(0x8001), -5.960464477539063e-08f);
  EXPECT_EQ(bits_of(f32_from_f16_bits(0x0000)), 0x00000000u);
  EXPECT_EQ(bits_of(f32_from_f16_bits(0x8000)), 0x80000000u);         // -0 keeps its sign
  EXPECT_EQ(f32_from_f16_bits(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f32_from_f16_bits(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_of(f32_from_f16_bits(0x7E00)), 0x7FC00000u);         // canonical quiet NaN
  EXPECT_EQ(bits_of(f32_from_f16_bits(0x7C01)), 0x7FC02000u);         // signalling NaN quieted, payload kept
  EXPECT_EQ(bits_of(f32_from_f16_bits(0xFE01)), 0xFFC02000u);
}

TEST(Float16, AllPatternsMatchTheIeeeFormula) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const int sign = (h >> 15) ? -1 : 1;
    const int exponent = int((h >> 10) & 0x1f), mantissa = int(h & 0x3ff);
    const float got = f32_from_f16_bits(uint16_t(h));
    if (exponent == 31) {
      if (mantissa == 0) EXPECT_EQ(got, sign * std::numeric_limits<float>::infinity()) << h;
      else EXPECT_TRUE(std::isnan(got)) << h;
      continue;
    }
    const double expected = exponent == 0 ? sign * std::ldexp(double(mantissa), -24)
                                          : sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
    ASSERT_EQ(double(got), expected) << "pattern 0x" << std::hex << h;
    ASSERT_EQ(std::signbit(got), sign < 0) << h;
  }
}

#ifdef __F16C__
TEST(Float16, AllPatternsMatchF16cBitForBit) {
  for (uint32_t h = 0; h < 0x10000; ++h)
    ASSERT_EQ(bits_of(f32_from_f16_bits(uint16_t(h))), bits_of(_cvtsh_ss(uint16_t(h)))) << "pattern 0x" << std::hex << h;
}
#endif

TEST(BFloat16, KnownPatterns) {
  EXPECT_EQ(f32_from_bf16_bits(0x3F80), 1.0f);
  EXPECT_EQ(f32_from_bf16_bits(0xC2F7), -123.5f);
  EXPECT_EQ(f32_from_bf16_bits(0x4049), 3.140625f);
  EXPECT_EQ(f32_from_bf16_bits(0x7F7F), 3.3895313892515355e38f);  // largest finite
  EXPECT_EQ(f32_from_bf16_bits(0x0080), 1.1754943508222875e-38f); // smallest normal, 2^-126
  EXPECT_EQ(f32_from_bf16_bits(0x0001), 9.183549615799121e-41f);  // smallest subnormal, 2^-133
  EXPECT_EQ(bits_of(f32_from_bf16_bits(0x8000)), 0x80000000u);
  EXPECT_EQ(f32_from_bf16_bits(0xFF80), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_of(f32_from_bf16_bits(0x7FC1)), 0x7FC10000u);    // NaN payload kept
}

TEST(WidenToF32, ReadsUnalignedLittleEndianRuns) {
  // One byte of offset so that no element is aligned.
  const unsigned char raw[] = {0xEE, 0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B};
  float out[3];
  widen_to_f32(DType::f16, reinterpret_cast<const std::byte*>(raw + 1), out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 65504.0f);

  const unsigned char bf[] = {0xEE, 0x80, 0x3F, 0xF7, 0xC2};
  widen_to_f32(DType::bf16, reinterpret_cast<const std::byte*>(bf + 1), out, 2);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -123.5f);

  const float f[] = {0.0f, 1.5f, -7.25f};
  unsigned char shifted[13];
  std::memcpy(shifted + 1, f, sizeof(f));
  widen_to_f32(DType::f32, reinterpret_cast<const std::byte*>(shifted + 1), out, 3);
  EXPECT_EQ(out[1], 1.5f);
  EXPECT_EQ(out[2], -7.25f);
}

}  // namespace
}  // namespace memfit
