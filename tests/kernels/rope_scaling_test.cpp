// Rotary frequency scaling (Llama 3.1's llama3 and linear): the CPU kernel's inv_freq table is
// transformers' bit for bit (tables recorded by tools/make_llama_fixtures.py --rope-scaling
// llama3), and the rotation with it follows the reference kernel, which applies Meta's scaling
// rule in double. The end-to-end check is llama_parity_test's llama31 fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "io/safetensors.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/reference/reference_llama.hpp"
#include "support/paths.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_vector;

RopeScaling llama3(double factor, double low, double high, double original) {
  RopeScaling s;
  s.kind = RopeScaling::Kind::llama3;
  s.factor = factor;
  s.low_freq_factor = low;
  s.high_freq_factor = high;
  s.original_max_positions = original;
  return s;
}

std::vector<float> recorded_table(const std::string& name) {
  const SafetensorsReader expected(test::fixture_path("llama31_tiny_torch/expected.safetensors"));
  const SafetensorsEntry* e = expected.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  std::vector<float> table(size_t(e->shape.numel()));
  expected.read_f32(name, e->shape, table.data());
  return table;
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << i << ": " << got[i] << " vs " << want[i];
}

TEST(RopeScaling, Llama3TableIsTransformersBitForBit) {
  // Llama 3.1 8B: head_dim 128, theta 5e5, factor 8 over 8192 positions.
  std::vector<float> table(64);
  rope_inv_freq(500000.0f, 128, llama3(8, 1, 4, 8192), table.data());
  expect_bitwise(table, recorded_table("inv_freq.llama31_8b"));
  // The fixture model: head_dim 8, original context 16.
  std::vector<float> tiny(4);
  rope_inv_freq(500000.0f, 8, llama3(8, 1, 4, 16), tiny.data());
  expect_bitwise(tiny, recorded_table("inv_freq"));
}

TEST(RopeScaling, AllThreeBandsOccurInTheLlama31Table) {
  // The test above would not notice a wrong band if the table had none of it.
  std::vector<float> scaled(64), plain(64);
  rope_inv_freq(500000.0f, 128, llama3(8, 1, 4, 8192), scaled.data());
  rope_inv_freq(500000.0f, 128, RopeScaling{}, plain.data());
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    if (scaled[i] == plain[i]) ++kept;
    else if (scaled[i] == plain[i] / 8) ++divided;
    else ++blended;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(RopeScaling, LinearDividesEveryFrequency) {
  RopeScaling linear;
  linear.kind = RopeScaling::Kind::linear;
  linear.factor = 4;
  std::vector<float> scaled(32), plain(32);
  rope_inv_freq(10000.0f, 64, linear, scaled.data());
  rope_inv_freq(10000.0f, 64, RopeScaling{}, plain.data());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(scaled[i], plain[i] / 4.0f) << i;
}

TEST(RopeScaling, KernelFollowsTheReferenceUnderEveryScaling) {
  RopeScaling linear;
  linear.kind = RopeScaling::Kind::linear;
  linear.factor = 2;
  const int64_t B = 2, T = 40, H = 4, KV = 2, HS = 16, row = (H + 2 * KV) * HS;
  const std::vector<float> x = random_vector(B * T * row, 41);
  for (const RopeScaling& s : {llama3(8, 1, 4, 16), linear}) {
    std::vector<float> y(x.size()), ey(x.size()), plain(x.size()), dx(x.size()), edx(x.size());
    rope_forward(x.data(), y.data(), B, T, H, KV, HS, 500000.0f, s);
    ref::rope_forward(x.data(), ey.data(), B, T, H, KV, HS, 500000.0, s);
    rope_forward(x.data(), plain.data(), B, T, H, KV, HS, 500000.0f);
    // Float angles against exact ones over 40 positions: a few 1e-6 (cpu_llama_ops_test's bound).
    EXPECT_LE(normalized_error(y, ey), 2 * (double(T - 1) * (std::log(500000.0) + 4) * 6e-8 + 8 * 6e-8));
    EXPECT_GT(normalized_error(plain, ey), 1e-3);  // the scaling changes the rotation
    rope_backward(x.data(), dx.data(), B, T, H, KV, HS, 500000.0f, s);
    ref::rope_backward(x.data(), edx.data(), B, T, H, KV, HS, 500000.0, s);
    EXPECT_LE(normalized_error(dx, edx), 2 * (double(T - 1) * (std::log(500000.0) + 4) * 6e-8 + 8 * 6e-8));
  }
}

}  // namespace
}  // namespace memfit
