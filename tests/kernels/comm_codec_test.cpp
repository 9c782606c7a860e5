// qwZ's int8 wire (kernels/cpu/comm_codec.hpp) against a naive reference written here from the
// definition, in double: per block, absmax over the valid elements, scale = absmax / 127
// rounded to fp32, code = the integer nearest x * 127 / absmax (ties to even), value = code *
// scale rounded to fp32 and then to the output type. Also the properties the ZeRO pass relies
// on: padding decodes to 0 and cannot change a block's scale, a decoded value is within half
// a scale step of its input, a block holding NaN decodes to NaN, and decoding R ranks' wires
// laid end to end equals decoding each one alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/half.hpp"
#include "graph/op.hpp"
#include "kernels/cpu/comm_codec.hpp"

namespace memfit {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;
constexpr int64_t kBlock = 256;

struct Reference {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<double> exact;  // x * 127 / absmax before rounding (ties are judged on it)
};

bool in_ranges(const Ranges& r, int64_t i) {
  for (const auto& [first, count] : r)
    if (i >= first && i < first + count) return true;
  return false;
}

template <class T>
Reference reference_quantize(const std::vector<T>& x, const Ranges& valid) {
  const int64_t n = int64_t(x.size());
  Reference r{std::vector<int8_t>(size_t(n), 0), std::vector<float>(size_t(n / kBlock), 0),
              std::vector<double>(size_t(n), 0)};
  for (int64_t b = 0; b < n / kBlock; ++b) {
    double absmax = 0;
    for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i)
      if (in_ranges(valid, i)) absmax = std::max(absmax, std::fabs(double(widen(x[size_t(i)]))));
    r.scales[size_t(b)] = float(absmax) / 127.0f;
    if (absmax == 0) continue;
    for (int64_t i = b * kBlock; i < (b + 1) * kBlock; ++i) {
      if (!in_ranges(valid, i)) continue;
      const double e = double(widen(x[size_t(i)])) * 127.0 / absmax;
      r.exact[size_t(i)] = e;
      r.codes[size_t(i)] = int8_t(std::nearbyint(e));
    }
  }
  return r;
}

template <class T>
std::vector<T> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<T> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = narrow<T>(normal(rng) * (i % 97 == 0 ? 8.0f : 1.0f));
  return x;
}

template <class T>
void check_against_reference(uint32_t seed) {
  const int64_t n = 8 * kBlock;
  std::vector<T> x = random_values<T>(n, seed);
  // Two parameters with padding after each (as ZeRO lays them out), one ending mid-block.
  const Ranges valid = {{0, 700}, {768, 1100}};
  for (int64_t i = 0; i < n; ++i)
    if (!in_ranges(valid, i)) x[size_t(i)] = narrow<T>(i % 2 ? 1e4f : std::numeric_limits<float>::quiet_NaN());
  std::vector<uint8_t> wire(comm_wire_bytes(n, kBlock));
  cpu::comm_quantize_int8<T>(x.data(), n, kBlock, valid, wire.data());
  const Reference ref = reference_quantize(x, valid);
  std::vector<float> scales(size_t(n / kBlock));
  std::memcpy(scales.data(), wire.data() + n, scales.size() * sizeof(float));
  for (size_t b = 0; b < scales.size(); ++b) EXPECT_EQ(scales[b], ref.scales[b]) << "block " << b;
  int ties = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int8_t code = int8_t(wire[size_t(i)]);
    const double e = ref.exact[size_t(i)];
    // fp32's x * (127 / absmax) may land across a .5 that double puts on the other side.
    if (std::fabs(std::fabs(e - std::trunc(e)) - 0.5) < 1e-4) {
      EXPECT_LE(std::abs(code - ref.codes[size_t(i)]), 1) << "element " << i;
      ++ties;
    } else {
      EXPECT_EQ(code, ref.codes[size_t(i)]) << "element " << i;
    }
  }
  EXPECT_LT(ties, 8);
  std::vector<T> y(static_cast<size_t>(n));
  cpu::comm_dequantize_int8<T>(wire.data(), n, kBlock, 1, y.data());
  for (int64_t i = 0; i < n; ++i) {
    const float scale = scales[size_t(i / kBlock)];
    const int8_t code = int8_t(wire[size_t(i)]);
    EXPECT_EQ(widen(y[size_t(i)]), widen(narrow<T>(float(double(code) * double(scale))))) << "element " << i;
    if (!in_ranges(valid, i)) {
      EXPECT_EQ(widen(y[size_t(i)]), 0.0f) << "padding element " << i;
    } else if constexpr (std::is_same_v<T, float>) {
      EXPECT_LE(std::fabs(y[size_t(i)] - x[size_t(i)]), 0.5f * scale * (1 + 1e-5f)) << "element " << i;
    }
  }
}

TEST(CommCodec, Fp32MatchesTheNaiveReference) { check_against_reference<float>(7); }
TEST(CommCodec, Bf16MatchesTheNaiveReference) { check_against_reference<bf16_t>(8); }
TEST(CommCodec, Fp16MatchesTheNaiveReference) { check_against_reference<fp16_t>(9); }

TEST(CommCodec, ZeroBlocksCodeToZeroAndNonFiniteBlocksDecodeToNaN) {
  const int64_t n = 3 * kBlock;
  std::vector<float> x(size_t(n), 0.0f);
  x[size_t(kBlock + 5)] = std::numeric_limits<float>::infinity();
  x[size_t(2 * kBlock + 9)] = std::numeric_limits<float>::quiet_NaN();
  x[size_t(2 * kBlock + 10)] = 1.0f;
  std::vector<uint8_t> wire(comm_wire_bytes(n, kBlock));
  cpu::comm_quantize_int8<float>(x.data(), n, kBlock, Ranges{{0, n}}, wire.data());
  std::vector<float> y(size_t(n), 1.0f);
  cpu::comm_dequantize_int8<float>(wire.data(), n, kBlock, 1, y.data());
  for (int64_t i = 0; i < kBlock; ++i) EXPECT_EQ(y[size_t(i)], 0.0f);
  for (int64_t i = kBlock; i < n; ++i) EXPECT_TRUE(std::isnan(y[size_t(i)])) << i;
}

TEST(CommCodec, GatheredWiresDecodeAsEachRanksOwn) {
  const int ranks = 3;
  const int64_t per_rank = 2 * kBlock, bytes = int64_t(comm_wire_bytes(per_rank, kBlock));
  std::vector<uint8_t> gathered(size_t(ranks * bytes));
  std::vector<std::vector<float>> alone;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> x = random_values<float>(per_rank, 100 + uint32_t(r));
    cpu::comm_quantize_int8<float>(x.data(), per_rank, kBlock, Ranges{{0, per_rank}}, gathered.data() + r * bytes);
    alone.emplace_back(size_t(per_rank));
    cpu::comm_dequantize_int8<float>(gathered.data() + r * bytes, per_rank, kBlock, 1, alone.back().data());
  }
  std::vector<float> y(size_t(ranks * per_rank));
  cpu::comm_dequantize_int8<float>(gathered.data(), ranks * per_rank, kBlock, ranks, y.data());
  for (int r = 0; r < ranks; ++r)
    for (int64_t i = 0; i < per_rank; ++i) EXPECT_EQ(y[size_t(r * per_rank + i)], alone[size_t(r)][size_t(i)]);
}

}  // namespace
}  // namespace memfit
