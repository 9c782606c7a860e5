// Checked size arithmetic (core/checked.hpp), shapes and byte counts built on it, and sizes as
// people write them (core/bytes.hpp). The oracle for overflow is 128-bit arithmetic: every
// result that fits is returned exactly, every one that does not is an error naming the quantity.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "core/bytes.hpp"
#include "core/checked.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/shape.hpp"
#include "support/hand_built.hpp"

namespace memfit {
namespace {

using test::error_of;

TEST(Checked, ProductsAndSumsAgreeWith128BitArithmeticOrThrowNamingTheQuantity) {
  std::mt19937_64 rng(20240601);
  int fits = 0, overflows = 0;
  for (int i = 0; i < 20000; ++i) {
    // Operands spread over every magnitude, both signs.
    const auto draw = [&] {
      const int bits = int(rng() % 64);
      int64_t v = bits == 0 ? 0 : int64_t(rng() >> (64 - bits));
      return rng() % 4 == 0 ? -v : v;
    };
    const int64_t a = draw(), b = draw();
    const __int128 product = __int128(a) * b, sum = __int128(a) + b;
    const bool product_fits = product >= INT64_MIN && product <= INT64_MAX;
    if (product_fits) {
      EXPECT_EQ(checked_mul(a, b, "rows"), int64_t(product)) << a << " x " << b;
      ++fits;
    } else {
      const std::string e = error_of([&] { checked_mul(a, b, "rows", "model"); });
      EXPECT_EQ(e.rfind("[model] rows: ", 0), 0u) << e;
      EXPECT_NE(e.find("overflows 64-bit"), std::string::npos) << e;
      ++overflows;
    }
    if (sum >= INT64_MIN && sum <= INT64_MAX) EXPECT_EQ(checked_add(a, b, "total"), int64_t(sum));
    else EXPECT_NE(error_of([&] { checked_add(a, b, "total"); }).find("[size] total: "), std::string::npos);
  }
  EXPECT_GT(fits, 1000);
  EXPECT_GT(overflows, 1000);
  // The operands are in the message, so a reader can see which sizes met.
  EXPECT_EQ(error_of([] { checked_mul<int64_t>(int64_t(1) << 40, int64_t(1) << 30, "elements"); }),
            "[size] elements: 1099511627776 x 1073741824 overflows 64-bit integers");
  EXPECT_EQ(checked_mul<uint64_t>(uint64_t(1) << 63, 1, "x"), uint64_t(1) << 63);
  EXPECT_NE(error_of([] { checked_mul<uint64_t>(uint64_t(1) << 63, 2, "x"); }).find("overflows 64-bit"), std::string::npos);
}

TEST(Checked, AlignAndUnsigned) {
  EXPECT_EQ(checked_align_up(0, 64, "b"), 0u);
  EXPECT_EQ(checked_align_up(1, 64, "b"), 64u);
  EXPECT_EQ(checked_align_up(128, 64, "b"), 128u);
  EXPECT_EQ(checked_align_up(UINT64_MAX - 63, 64, "b"), UINT64_MAX - 63);
  EXPECT_NE(error_of([] { checked_align_up(UINT64_MAX - 62, 64, "offset"); }).find("offset"), std::string::npos);
  EXPECT_EQ(checked_unsigned(5, "n"), 5u);
  EXPECT_EQ(error_of([] { checked_unsigned(-3, "element count"); }), "[size] element count is negative (-3)");
}

TEST(Checked, ShapesRefuseNegativeExtentsAndElementCountsBeyondInt64) {
  EXPECT_EQ((Shape{1 << 20, 1 << 20, 1 << 22}.numel()), int64_t(1) << 62);
  EXPECT_EQ((Shape{int64_t(1) << 62, 4, 0}.numel()), 0);  // an empty tensor, whatever the other extents
  EXPECT_EQ(Shape().numel(), 1);
  EXPECT_EQ(error_of([] { Shape{int64_t(1) << 32, int64_t(1) << 31}; }),
            "[shape] shape (4294967296, 2147483648) has more than 2^63 elements");
  EXPECT_EQ(error_of([] { Shape{4, -1}; }), "[shape] shape (4, -1) has a negative extent");
}

TEST(Checked, DtypeBytesAreExactOrRefused) {
  EXPECT_EQ(dtype_bytes(DType::f32, 3), 12u);
  EXPECT_EQ(dtype_bytes(DType::nf4, 3), 2u);  // packed, rounded up
  EXPECT_EQ(dtype_bytes(DType::bf16, int64_t(1) << 62), uint64_t(1) << 63);
  EXPECT_EQ(dtype_bytes(DType::nf4, INT64_MAX), uint64_t((__int128(INT64_MAX) * 4 + 7) / 8));
  // 2^62 fp32 elements are 2^64 bytes: not representable, so refused rather than wrapped to 0.
  EXPECT_EQ(error_of([] { dtype_bytes(DType::f32, int64_t(1) << 62); }),
            "[size] bytes of a tensor's elements: 576460752303423488 x 32 overflows 64-bit integers");
  EXPECT_NE(error_of([] { dtype_bytes(DType::f32, -64); }).find("negative"), std::string::npos);
}

TEST(Bytes, SizesAsPeopleWriteThem) {
  EXPECT_EQ(parse_bytes("12GiB"), 12 * GiB);
  EXPECT_EQ(parse_bytes("12 GiB"), 12 * GiB);
  EXPECT_EQ(parse_bytes(" 12gib "), 12 * GiB);
  EXPECT_EQ(parse_bytes("12Gi"), 12 * GiB);  // Kubernetes' binary suffix
  EXPECT_EQ(parse_bytes("12G"), 12'000'000'000u);  // SI: G and GB are 10^9
  EXPECT_EQ(parse_bytes("12GB"), 12'000'000'000u);
  EXPECT_EQ(parse_bytes("1.5MiB"), 1572864u);
  EXPECT_EQ(parse_bytes("1e9"), 1'000'000'000u);
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("512 B"), 512u);
  EXPECT_EQ(parse_bytes("2PiB"), uint64_t(2) << 50);
  EXPECT_EQ(parse_bytes("9223372036854775807"), uint64_t(INT64_MAX));  // plain bytes are read exactly
  for (const char* bad : {"", "GiB", "-1GiB", "12 GiBs", "12 XB", "nan", "inf", "1e30GiB", "0x10", "12 G iB",
                          "9223372036854775808", "+5"}) {
    const std::string e = error_of([&] { parse_bytes(bad, "--memory-budget"); });
    EXPECT_EQ(e.rfind("[size] --memory-budget: '", 0), 0u) << bad << ": " << e;
  }
}

TEST(Bytes, MemoryBudgetsAreNeitherZeroNorBeyondAnyMachine) {
  EXPECT_EQ(parse_memory_bytes("1PiB", "--memory-budget"), kMaxTierBytes);
  EXPECT_EQ(parse_memory_bytes("1", "--memory-budget"), 1u);
  EXPECT_NE(error_of([] { parse_memory_bytes("0", "--memory-budget"); }).find("no memory"), std::string::npos);
  EXPECT_NE(error_of([] { parse_memory_bytes("0.4", "--memory-budget"); }).find("no memory"), std::string::npos);
  const std::string e = error_of([] { parse_memory_bytes("1025TiB", "--memory-budget"); });
  EXPECT_NE(e.find("--memory-budget: '1025TiB' is 1126999418470400 bytes, above 1.00 PiB"), std::string::npos) << e;
}

TEST(Bytes, FormatReachesPebibytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * GiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(kMaxTierBytes), "1.00 PiB");
  EXPECT_EQ(format_bytes(UINT64_MAX), "16.00 EiB");
}

}  // namespace
}  // namespace memfit
