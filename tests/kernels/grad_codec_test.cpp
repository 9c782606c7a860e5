// qgZ's gradient wire (kernels/cpu/grad_codec.hpp) against a naive reference written here from
// the definition: each rank's part for destination d is the chunks k * parts + d of its
// gradient, coded per block of 256 with scale = absmax / q (q = 127 or 7) and code = the
// integer nearest x * q / absmax; the destination decodes each part (code * scale, in fp32)
// and adds them in rank order. The kernel must equal that bit for bit, and a decoded value
// must lie within half a scale step of its input (the closed-form bound of rounding to the
// nearest code).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/half.hpp"
#include "graph/op.hpp"
#include "kernels/cpu/grad_codec.hpp"

namespace memfit {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;
constexpr int64_t kBlock = 256;

bool valid_at(const Ranges& r, int64_t i) {
  if (r.empty()) return true;
  for (const auto& [first, count] : r)
    if (i >= first && i < first + count) return true;
  return false;
}

// The part for destination d, decoded (code * scale per element), and its blocks' scales.
struct Decoded {
  std::vector<float> values, scales;
};
Decoded reference_part(const std::vector<float>& x, const cpu::GradWire& w, int d, const Ranges& valid) {
  const int64_t m = w.part_elements();
  const float q = w.bits == 4 ? 7.0f : 127.0f;
  std::vector<float> src(size_t(m), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t s = ((i / w.chunk) * w.parts + d) * w.chunk + i % w.chunk;
    src[size_t(i)] = valid_at(valid, s) ? x[size_t(s)] : 0.0f;
  }
  Decoded out;
  for (int64_t lo = 0; lo < m; lo += w.block) {
    const int64_t hi = std::min(m, lo + w.block);
    float absmax = 0;
    for (int64_t i = lo; i < hi; ++i) absmax = std::max(absmax, std::fabs(src[size_t(i)]));
    const float scale = absmax / q;
    out.scales.push_back(scale);
    for (int64_t i = lo; i < hi; ++i) {
      const float code = absmax == 0 ? 0.0f : std::clamp(std::nearbyint(src[size_t(i)] * (q / absmax)), -q, q);
      out.values.push_back(code * scale);
    }
  }
  return out;
}

std::vector<float> random_values(int64_t n, uint32_t seed, float spread) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(gen);
  return x;
}

// ranks ranks each quantise their gradient into parts for `parts` destinations; destination d
// receives part d of every rank (as an all-to-all lays them out) and sums them.
void expect_sum_equals_reference(int ranks, int parts, int64_t chunk, int64_t chunks_per_part, int bits,
                                 const Ranges& valid) {
  SCOPED_TRACE(::testing::Message() << ranks << " ranks, " << parts << " parts of " << chunks_per_part << " chunks of "
                                    << chunk << ", int" << bits);
  const cpu::GradWire w{int64_t(parts) * chunks_per_part * chunk, parts, chunk, kBlock, bits};
  const int64_t m = w.part_elements();
  const uint64_t part_bytes = qgz_wire_bytes(m, kBlock, bits);
  std::vector<std::vector<float>> x;
  std::vector<std::vector<uint8_t>> wires;
  for (int r = 0; r < ranks; ++r) {
    x.push_back(random_values(w.n, 17 + uint32_t(r), 0.01f * float(r + 1)));
    wires.emplace_back(size_t(parts) * part_bytes, uint8_t(0xAB));
    cpu::grad_quantize<float>(x.back().data(), w, valid, wires.back().data());
  }
  for (int d = 0; d < parts; ++d) {
    std::vector<uint8_t> received;
    for (int r = 0; r < ranks; ++r)
      received.insert(received.end(), wires[size_t(r)].begin() + int64_t(d * part_bytes),
                      wires[size_t(r)].begin() + int64_t((d + 1) * part_bytes));
    std::vector<float> sum(size_t(m), -1.0f);
    cpu::grad_dequantize_sum<float>(received.data(), m, ranks, kBlock, bits, sum.data());
    std::vector<float> expect(size_t(m), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const Decoded dec = reference_part(x[size_t(r)], w, d, valid);
      for (int64_t i = 0; i < m; ++i) expect[size_t(i)] += dec.values[size_t(i)];
      // Rounding to the nearest code: within half a step of the input, padding decodes to 0.
      for (int64_t i = 0; i < m; ++i) {
        const int64_t s = ((i / chunk) * parts + d) * chunk + i % chunk;
        const float in = valid_at(valid, s) ? x[size_t(r)][size_t(s)] : 0.0f;
        const float half_step = dec.scales[size_t(i / kBlock)] / 2;
        ASSERT_LE(std::fabs(dec.values[size_t(i)] - in), half_step * (1 + 1e-5f)) << "rank " << r << " element " << i;
        if (!valid_at(valid, s)) ASSERT_EQ(dec.values[size_t(i)], 0.0f);
      }
    }
    for (int64_t i = 0; i < m; ++i) ASSERT_EQ(sum[size_t(i)], expect[size_t(i)]) << "part " << d << " element " << i;
  }
}

TEST(GradCodec, OneHopSumEqualsTheNaiveSumOfDecodedParts) {
  for (int bits : {8, 4}) expect_sum_equals_reference(4, 4, 512, 1, bits, {});
}

TEST(GradCodec, FirstHopOrdersChunksByDestination) {
  // Two nodes of two: parts for 2 local destinations, each the 2 shards it forwards.
  for (int bits : {8, 4}) expect_sum_equals_reference(2, 2, 512, 2, bits, {});
  for (int bits : {8, 4}) expect_sum_equals_reference(3, 2, 256, 3, bits, {});
}

TEST(GradCodec, PaddingIsNeitherReadNorSent) {
  const Ranges valid{{3, 500}, {700, 1000}, {1900, 100}};
  for (int bits : {8, 4}) expect_sum_equals_reference(2, 2, 512, 2, bits, valid);
}

TEST(GradCodec, PartialLastBlock) {
  // Parts of 300 and 301 elements: a full block and a partial one (an odd int4 count too).
  for (int bits : {8, 4}) {
    expect_sum_equals_reference(3, 2, 300, 1, bits, {});
    expect_sum_equals_reference(2, 1, 301, 1, bits, {});
  }
}

TEST(GradCodec, Int4BoundIsHalfAScaleStep) {
  // A block of 256 spanning [-a, a]: the worst error of 7 levels per side is a / 14.
  const cpu::GradWire w{256, 1, 256, kBlock, 4};
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[size_t(i)] = -1.0f + 2.0f * float(i) / 255.0f;
  std::vector<uint8_t> wire(qgz_wire_bytes(256, kBlock, 4));
  EXPECT_EQ(wire.size(), 128u + 4u);
  cpu::grad_quantize<float>(x.data(), w, {}, wire.data());
  std::vector<float> y(256);
  cpu::grad_dequantize_sum<float>(wire.data(), 256, 1, kBlock, 4, y.data());
  float worst = 0;
  for (int i = 0; i < 256; ++i) worst = std::max(worst, std::fabs(y[size_t(i)] - x[size_t(i)]));
  EXPECT_LE(worst, (1.0f / 7.0f) / 2 * (1 + 1e-6f));
  EXPECT_GT(worst, (1.0f / 7.0f) / 2 * 0.9f);  // the bound is reached: the codes really are 4-bit
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[255], 1.0f);
}

TEST(GradCodec, NonFiniteBlockSumsToNaNAndBf16OutputRoundsOnce) {
  const cpu::GradWire w{512, 1, 512, kBlock, 8};
  std::vector<float> x = random_values(512, 3, 1.0f);
  x[5] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> wire(qgz_wire_bytes(512, kBlock, 8));
  cpu::grad_quantize<float>(x.data(), w, {}, wire.data());
  std::vector<float> y(512);
  cpu::grad_dequantize_sum<float>(wire.data(), 512, 1, kBlock, 8, y.data());
  for (int i = 0; i < 256; ++i) EXPECT_TRUE(std::isnan(y[size_t(i)])) << i;
  for (int i = 256; i < 512; ++i) EXPECT_TRUE(std::isfinite(y[size_t(i)])) << i;
  std::vector<bf16_t> yb(512);
  cpu::grad_dequantize_sum<bf16_t>(wire.data(), 512, 1, kBlock, 8, yb.data());
  for (int i = 256; i < 512; ++i) EXPECT_EQ(widen(yb[size_t(i)]), widen(narrow<bf16_t>(y[size_t(i)]))) << i;
}

}  // namespace
}  // namespace memfit
