// Attention over a KV cache (kernels/cpu/kv_attention.hpp): the CPU kernel against the naive
// reference (kernels/reference/reference_kv_cache.hpp), and both against full causal
// attention (the reference's plain attention, after the reference rope) over the same prefix:
// a prefill of some tokens followed by single-token decodes must give every token the output
// full attention gives it.
#include <gtest/gtest.h>
#include <omp.h>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/kv_attention.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/reference/reference.hpp"
#include "kernels/reference/reference_kv_cache.hpp"
#include "kernels/reference/reference_llama.hpp"
#include "kernel_test_util.hpp"

namespace memfit {
namespace {

struct Case {
  int64_t heads, kv_heads, head_dim, tokens, prefill;
  bool rope;
  RopeScaling scaling;
};

AttentionAttrs attrs_of_case(const Case& c, int64_t seq) {
  AttentionAttrs a;
  a.batch = 1;
  a.seq = seq;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.rope_theta = 10000.0f;
  a.rope_scaling = c.scaling;
  return a;
}

// Full causal attention over all `tokens` rows (rotated first when rope), y (T, NH*HS).
std::vector<float> full_attention(const Case& c, const std::vector<float>& qkv) {
  const AttentionAttrs a = attrs_of_case(c, c.tokens);
  std::vector<float> x = qkv;
  if (c.rope) {
    std::vector<float> r(x.size());
    ref::rope_forward(x.data(), r.data(), 1, c.tokens, c.heads, c.kv_heads, c.head_dim, double(a.rope_theta), c.scaling);
    x = r;
  }
  std::vector<float> y(size_t(c.tokens * c.heads * c.head_dim)), probs(size_t(c.heads * c.tokens * c.tokens));
  ref::attention_forward(x.data(), y.data(), probs.data(), 1, c.tokens, c.heads, c.head_dim, double(a.scale), false,
                         c.kv_heads);
  return y;
}

// Runs `prefill` tokens at position 0, then one token per run; returns y of every token.
template <class Run>
std::vector<float> cached(const Case& c, const std::vector<float>& qkv, Run run) {
  const int64_t row = (c.heads + 2 * c.kv_heads) * c.head_dim, out = c.heads * c.head_dim;
  const int64_t S = c.tokens + 3;  // a cache larger than used: rows past the position must not matter
  std::vector<float> kc = test::random_vector(size_t(c.kv_heads * S * c.head_dim), 99, -50, 50), vc = kc;
  std::vector<float> y(size_t(c.tokens * out));
  for (int64_t pos = 0; pos < c.tokens;) {
    const int64_t n = pos == 0 ? c.prefill : 1;
    run(qkv.data() + pos * row, y.data() + pos * out, kc.data(), vc.data(), n, S, pos);
    pos += n;
  }
  return y;
}

std::vector<float> cpu_cached(const Case& c, const std::vector<float>& qkv) {
  std::vector<float> inv(size_t(c.head_dim / 2));
  rope_inv_freq(10000.0f, c.head_dim, c.scaling, inv.data());
  const int threads = omp_get_max_threads();
  return cached(c, qkv, [&](const float* q, float* y, float* kc, float* vc, int64_t n, int64_t S, int64_t pos) {
    KvAttentionShape s{1, n, c.heads, c.kv_heads, c.head_dim, S, 1.0f / std::sqrt(float(c.head_dim))};
    std::vector<float> scratch(kv_attention_scratch_bytes(s, threads) / sizeof(float));
    kv_attention(q, y, kc, vc, s, pos, c.rope ? inv.data() : nullptr, scratch.data(), threads);
  });
}

std::vector<float> ref_cached(const Case& c, const std::vector<float>& qkv) {
  return cached(c, qkv, [&](const float* q, float* y, float* kc, float* vc, int64_t n, int64_t S, int64_t pos) {
    CachedAttentionAttrs a{attrs_of_case(c, n), S, c.rope};
    ref::cached_attention(q, y, kc, vc, a, c.rope, pos);
  });
}

std::vector<Case> cases() {
  RopeScaling llama3;
  llama3.kind = RopeScaling::Kind::llama3;
  llama3.factor = 8;
  llama3.original_max_positions = 16;
  return {{4, 4, 16, 9, 4, false, {}},   // GPT-2: no rope, every head its own kv
          {4, 2, 16, 12, 5, true, {}},   // GQA with rope
          {6, 2, 8, 40, 1, true, llama3},  // llama3 scaling, prefill of one token
          {2, 1, 64, 17, 17, true, {}}};  // prefill only
}

TEST(KvAttention, CpuKernelFollowsTheReference) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(testing::Message() << c.heads << "/" << c.kv_heads << " heads, rope " << c.rope);
    const auto qkv = test::random_vector(size_t(c.tokens * (c.heads + 2 * c.kv_heads) * c.head_dim), 7);
    EXPECT_LT(test::normalized_error(cpu_cached(c, qkv), ref_cached(c, qkv)), 1e-5);
  }
}

TEST(KvAttention, PrefillThenDecodesEqualFullAttentionOverThePrefix) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(testing::Message() << c.heads << "/" << c.kv_heads << " heads, rope " << c.rope);
    const auto qkv = test::random_vector(size_t(c.tokens * (c.heads + 2 * c.kv_heads) * c.head_dim), 11);
    const auto full = full_attention(c, qkv);
    EXPECT_LT(test::normalized_error(cpu_cached(c, qkv), full), 1e-5);
    EXPECT_LT(test::normalized_error(ref_cached(c, qkv), full), 1e-5);
  }
}

TEST(KvAttention, ResultsDoNotDependOnTheThreadCount) {
  const Case c = cases()[1];
  const auto qkv = test::random_vector(size_t(c.tokens * (c.heads + 2 * c.kv_heads) * c.head_dim), 5);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = cpu_cached(c, qkv);
  omp_set_num_threads(std::max(saved, 2));
  const auto many = cpu_cached(c, qkv);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, many);
}

TEST(KvAttention, RefusesPositionsBeyondTheCache) {
  KvAttentionShape s{1, 2, 2, 2, 8, 4, 0.35f};
  std::vector<float> qkv(2 * 6 * 8), y(2 * 16), kc(2 * 4 * 8), vc(kc.size()), scratch(64);
  EXPECT_THROW(kv_attention(qkv.data(), y.data(), kc.data(), vc.data(), s, 3, nullptr, scratch.data(), 16), Error);
}

TEST(KvAttention, EmbeddingAtReadsThePositionTableFromTheOffset) {
  const int64_t C = 3, V = 5, Tmax = 6;
  const auto wte = test::random_vector(size_t(V * C), 1), wpe = test::random_vector(size_t(Tmax * C), 2);
  const std::vector<int32_t> tokens = {4, 0};
  std::vector<float> got(2 * C), want(2 * C);
  embedding_at(tokens.data(), wte.data(), wpe.data(), got.data(), 1, 2, C, V, Tmax, 3);
  ref::embedding_at(tokens.data(), wte.data(), wpe.data(), want.data(), 1, 2, C, 3);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(want[size_t(t * C + c)], wte[size_t(tokens[size_t(t)] * C + c)] + wpe[size_t((3 + t) * C + c)]);
  EXPECT_EQ(got, want);
  EXPECT_THROW(embedding_at(tokens.data(), wte.data(), wpe.data(), got.data(), 1, 2, C, V, Tmax, 5), Error);
}

}  // namespace
}  // namespace memfit
