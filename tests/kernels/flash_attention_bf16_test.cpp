// Flash attention on bf16 storage, whose tile products run on bf16 operands with fp32 sums
// where the CPU has AVX512-BF16 (kernels/cpu/flash_attention_bf16.cpp, tile_dot_bf16.cpp), and
// on widened fp32 tiles elsewhere; either way:
// - the kernel against the double reference on the inputs as rounded to bf16, on shapes that
//   exercise the paths the products take: T ragged in the 64-row tiles (the causal diagonal
//   tile skips register blocks per row), head sizes of 64 (TinyLlama's), 80 (two column chunks)
//   and 33 (odd: a word of the last pair is padding), grouped, multi-query and multi-head, both
//   write modes of dqkv;
// - the same bits on 1, 2 and 3 threads;
// - tile_dot_bf16 itself (with AVX512-BF16): against double sums on odd sizes and strides, and
//   each causal mode against the full product on a tile whose masked triangle holds zeros.
// Tolerance (max |kernel - ref| / max |ref|): 2^-8, as cpu_gqa_attention_test's bf16. The
// outputs are rounded to bf16 once (2^-9 relative), and the probabilities and dS are rounded
// to bf16 as they enter a product (2^-9 relative per term of an fp32 sum); measured up to
// 3.5e-3 on these shapes. lse stays fp32: 1e-5. A wrong mask or skipped block errs by order 1.
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "core/half.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/flash_attention.hpp"
#include "kernels/cpu/tile_dot_bf16.hpp"
#include "kernels/reference/reference.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_vector;
using Vec = std::vector<float>;
using DVec = std::vector<double>;

constexpr double kBf16Tol = 1.0 / 256;
constexpr double kLseTol = 1e-5;

struct Shape {
  int64_t B, T, H, KV, HS;
  AttentionShape shape() const {
    AttentionShape s;
    s.batch = B, s.seq = T, s.heads = H, s.kv_heads = KV, s.head_dim = HS, s.scale = 1.0f / std::sqrt(float(HS));
    return s;
  }
};

std::vector<bf16_t> to_bf16(const Vec& v) {
  std::vector<bf16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = narrow<bf16_t>(v[i]);
  return out;
}
template <class F>
std::vector<F> widened(const std::vector<bf16_t>& v) {
  std::vector<F> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F(widen(v[i]));
  return out;
}

struct Bf16Run {
  std::vector<bf16_t> qkv, dy, dqkv0;  // the inputs
  Vec y, lse, dqkv;                    // the outputs, widened
};

Bf16Run run_bf16(const Shape& c, bool accumulate, uint32_t seed, int threads) {
  const AttentionShape s = c.shape();
  const int64_t N = c.B * c.T;
  Bf16Run r;
  r.qkv = to_bf16(random_vector(size_t(N * s.qkv_channels()), seed, -2, 2));
  r.dy = to_bf16(random_vector(size_t(N * s.channels()), seed + 1));
  r.dqkv0 = to_bf16(random_vector(size_t(N * s.qkv_channels()), seed + 2));
  std::vector<bf16_t> y(size_t(N * s.channels())), dqkv = r.dqkv0;
  r.lse.resize(size_t(c.B * c.H * c.T));
  const uint64_t bytes = std::max(flash_forward_scratch_bytes(s, threads), flash_backward_scratch_bytes(s, threads));
  std::vector<float> scratch(bytes / sizeof(float));
  omp_set_num_threads(threads);
  flash_attention_forward(s, r.qkv.data(), y.data(), r.lse.data(), scratch.data(), threads);
  flash_attention_backward(s, r.dy.data(), r.qkv.data(), y.data(), r.lse.data(), dqkv.data(), accumulate,
                           scratch.data(), threads);
  r.y = widened<float>(y), r.dqkv = widened<float>(dqkv);
  return r;
}

TEST(FlashAttentionBf16, MatchesReferenceOnRaggedGroupedShapes) {
  const int saved = omp_get_max_threads();
  const Shape shapes[] = {
      {1, 200, 8, 2, 64}, {2, 97, 6, 3, 80}, {1, 130, 4, 4, 33}, {1, 64, 2, 1, 64}, {2, 7, 4, 2, 64}};
  uint32_t seed = 400;
  for (const Shape& c : shapes)
    for (bool accumulate : {false, true}) {
      const std::string what = fmt::format("B={} T={} H={} KV={} HS={} accumulate={}", c.B, c.T, c.H, c.KV, c.HS,
                                           accumulate);
      SCOPED_TRACE(what);
      const Bf16Run k = run_bf16(c, accumulate, seed += 10, 2);
      const DVec qkv = widened<double>(k.qkv), dy = widened<double>(k.dy);
      DVec y(k.y.size()), lse(k.lse.size()), dqkv = widened<double>(k.dqkv0);
      const double scale = double(c.shape().scale);
      ref::flash_attention_forward(qkv.data(), y.data(), lse.data(), c.B, c.T, c.H, c.HS, scale, c.KV);
      ref::flash_attention_backward(dy.data(), qkv.data(), y.data(), lse.data(), dqkv.data(), c.B, c.T, c.H, c.HS,
                                    scale, accumulate, c.KV);
      const double ey = normalized_error(k.y, y), el = normalized_error(k.lse, lse);
      const double ed = normalized_error(k.dqkv, dqkv);
      std::printf("bf16 flash %s: normalised error y %.2g, lse %.2g, dqkv %.2g\n", what.c_str(), ey, el, ed);
      EXPECT_LE(ey, kBf16Tol);
      EXPECT_LE(el, kLseTol);
      EXPECT_LE(ed, kBf16Tol);
    }
  omp_set_num_threads(saved);
}

TEST(FlashAttentionBf16, SameBitsOnAnyThreadCount) {
  const int saved = omp_get_max_threads();
  const Shape c{3, 150, 8, 2, 64};
  const Bf16Run one = run_bf16(c, true, 500, 1);
  for (int threads : {2, 3}) {
    const Bf16Run k = run_bf16(c, true, 500, threads);
    EXPECT_EQ(k.y, one.y) << threads << " threads";
    EXPECT_EQ(k.lse, one.lse) << threads << " threads";
    EXPECT_EQ(k.dqkv, one.dqkv) << threads << " threads";
  }
  omp_set_num_threads(saved);
}

#if defined(__AVX512BF16__)
// A (M x K) and B (K x N) of bf16 values as tile_dot_bf16's words: A's rows at a_rs words
// apart, B's pair rows ldb words apart; an odd K padded with zeros.
struct WordTiles {
  int64_t M, N, K, KP, a_rs, ldb;
  std::vector<bf16_t> A, B;  // row-major, as values
  std::vector<uint32_t> a, b;
  WordTiles(int64_t m, int64_t n, int64_t k, uint32_t seed, bool lower_a = false)
      : M(m), N(n), K(k), KP((k + 1) / 2), a_rs(KP + 3), ldb(n + 5) {
    A = to_bf16(random_vector(size_t(M * K), seed)), B = to_bf16(random_vector(size_t(K * N), seed + 1));
    if (lower_a)  // A(m, k) = 0 for k > m: the dQ product's dS on the diagonal
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = i + 1; j < K; ++j) A[size_t(i * K + j)] = bf16_t{};
    a.assign(size_t(M * a_rs), 0xFFFFFFFFu), b.assign(size_t(KP * ldb), 0xFFFFFFFFu);  // NaN where never read
    auto at = [](const std::vector<bf16_t>& v, int64_t i, bool in) { return in ? uint32_t(v[size_t(i)].bits) : 0u; };
    for (int64_t i = 0; i < M; ++i)
      for (int64_t p = 0; p < KP; ++p)
        a[size_t(i * a_rs + p)] = at(A, i * K + 2 * p, true) | at(A, i * K + 2 * p + 1, 2 * p + 1 < K) << 16;
    for (int64_t p = 0; p < KP; ++p)
      for (int64_t j = 0; j < N; ++j)
        b[size_t(p * ldb + j)] = at(B, 2 * p * N + j, true) | at(B, (2 * p + 1) * N + j, 2 * p + 1 < K) << 16;
  }
  Vec product(TileCausal causal, float alpha, float c0) const {
    Vec c(size_t(M * N), c0);
    tile_dot_bf16(M, N, KP, a.data(), a_rs, 1, b.data(), ldb, c.data(), N, alpha, c0 != 0, causal);
    return c;
  }
};

TEST(TileDotBf16, MatchesDoubleSumsOnOddSizes) {
  for (const auto [m, n, k] : {std::array<int64_t, 3>{13, 70, 33}, {6, 16, 2}, {64, 64, 64}, {1, 5, 1}, {7, 129, 80}}) {
    const WordTiles t(m, n, k, uint32_t(m * n + k));
    const Vec got = t.product(TileCausal::none, 0.5f, 2.0f);
    DVec want(size_t(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t x = 0; x < k; ++x) sum += double(widen(t.A[size_t(i * k + x)])) * widen(t.B[size_t(x * n + j)]);
        want[size_t(i * n + j)] = 2.0 + 0.5 * sum;
      }
    EXPECT_LE(normalized_error(got, want), 1e-6) << m << " x " << n << " x " << k;
  }
}

TEST(TileDotBf16, CausalModesSkipOnlyWhatIsMaskedOrZero) {
  // Column modes: the wanted part of C equals the full product's bits.
  const WordTiles t(61, 61, 64, 7);
  const Vec full = t.product(TileCausal::none, 0.125f, 0.0f);
  const Vec from = t.product(TileCausal::cols_from_row, 0.125f, 0.0f);
  const Vec to = t.product(TileCausal::cols_to_row, 0.125f, 0.0f);
  for (int64_t i = 0; i < t.M; ++i)
    for (int64_t j = 0; j < t.N; ++j) {
      const size_t e = size_t(i * t.N + j);
      if (j >= i) {
        ASSERT_EQ(from[e], full[e]) << i << ", " << j;
      }
      if (j <= i) {
        ASSERT_EQ(to[e], full[e]) << i << ", " << j;
      }
    }
  // k_to_row: A(m, k) = 0 for k > m, so every sum keeps its bits.
  const WordTiles lower(61, 80, 61, 8, true);
  EXPECT_EQ(lower.product(TileCausal::k_to_row, 1.0f, 1.0f), lower.product(TileCausal::none, 1.0f, 1.0f));
  // k_from_row: A(m, k) = 0 for k < m (the dK and dV products' P^T and dS^T on the diagonal).
  WordTiles upper(61, 80, 61, 9);
  for (int64_t i = 0; i < upper.M; ++i)
    for (int64_t p = 0; p < upper.KP; ++p) {
      uint32_t& w = upper.a[size_t(i * upper.a_rs + p)];
      if (2 * p < i) w &= 0xFFFF0000u;
      if (2 * p + 1 < i) w &= 0x0000FFFFu;
    }
  EXPECT_EQ(upper.product(TileCausal::k_from_row, 1.0f, 0.0f), upper.product(TileCausal::none, 1.0f, 0.0f));
}
#endif

}  // namespace
}  // namespace memfit
