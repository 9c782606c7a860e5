// Verifies the oracle itself: each reference backward against central finite differences of
// its reference forward, in double, for the objective L = sum(G * forward(...)) with a random
// G. With h = 1e-5 the truncation error is O(h^2 f''') ~ 1e-10 and the rounding error
// O(eps / h) ~ 1e-11, so a normalised error of 1e-7 leaves a wide margin while any wrong
// term (a missing factor, a transposed index) shows up at order 1. A few forward
// references also get closed-form checks, since finite differences only test consistency.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/reference/reference.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_vector;
using Vec = std::vector<double>;

using test::dot;
using test::kGradTol;
using test::numeric_grad;

TEST(ReferenceGradcheck, Embedding) {
  const int64_t B = 2, T = 3, C = 5, Vp = 7, Tmax = 4, N = B * T;
  const std::vector<int32_t> tokens = {3, 1, 3, 6, 3, 0};  // repeats exercise the scatter-add
  Vec wte = random_vector<double>(Vp * C, 1), wpe = random_vector<double>(Tmax * C, 2);
  const Vec G = random_vector<double>(N * C, 3);
  auto objective = [&] {
    Vec x(N * C);
    ref::embedding_forward(tokens.data(), wte.data(), wpe.data(), x.data(), N, T, C, false);
    return dot(G, x);
  };
  Vec dwte(Vp * C, 9.0), dwpe(Tmax * C, 9.0);  // overwrite mode must clear the 9s
  ref::embedding_backward(G.data(), tokens.data(), dwte.data(), dwpe.data(), N, T, C, Vp, Tmax, false, false);
  EXPECT_LE(normalized_error(dwte, numeric_grad(wte, objective)), kGradTol);
  EXPECT_LE(normalized_error(dwpe, numeric_grad(wpe, objective)), kGradTol);
}

TEST(ReferenceGradcheck, LayerNorm) {
  const int64_t N = 3, C = 7;
  Vec x = random_vector<double>(N * C, 4, -2, 2), w = random_vector<double>(C, 5), b = random_vector<double>(C, 6);
  const Vec G = random_vector<double>(N * C, 7);
  auto objective = [&] {
    Vec y(N * C), mean(N), rstd(N);
    ref::layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5);
    return dot(G, y);
  };
  Vec y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  ref::layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5);
  ref::layernorm_backward(G.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), N,
                          C, false, false, false);
  EXPECT_LE(normalized_error(dx, numeric_grad(x, objective)), kGradTol);
  EXPECT_LE(normalized_error(dw, numeric_grad(w, objective)), kGradTol);
  EXPECT_LE(normalized_error(db, numeric_grad(b, objective)), kGradTol);
}

TEST(ReferenceForward, LayerNormNormalises) {
  const int64_t N = 4, C = 9;
  const Vec x = random_vector<double>(N * C, 8, 3, 5);  // mean far from 0
  const Vec w(C, 1.0), b(C, 0.0);
  Vec y(N * C), mean(N), rstd(N);
  ref::layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += y[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) v += (y[n * C + c] - m) * (y[n * C + c] - m) / C;
    EXPECT_NEAR(m, 0.0, 1e-12);
    EXPECT_NEAR(v, 1.0, 1e-12);
  }
}

// The backward of C = alpha op(A) op(B) + bias is itself two matmuls with transposes; this
// checks the reference matmul's transpose conventions and the formulas the linear-layer
// backward uses, for all four transpose combinations.
TEST(ReferenceGradcheck, MatmulAllTransposes) {
  const int64_t M = 3, N = 4, K = 5;
  const double alpha = 0.7;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE(testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      Vec a = random_vector<double>(M * K, 10), b = random_vector<double>(K * N, 11),
          bias = random_vector<double>(N, 12);
      const Vec G = random_vector<double>(M * N, 13);
      auto objective = [&] {
        Vec c(M * N);
        ref::matmul(a.data(), b.data(), bias.data(), c.data(), M, N, K, ta, tb, alpha, false);
        return dot(G, c);
      };
      Vec da(M * K), db(K * N), dbias(N);
      if (!ta)  // dA [M,K] = alpha G op(B)^T
        ref::matmul(G.data(), b.data(), (const double*)nullptr, da.data(), M, K, N, false, !tb, alpha, false);
      else  // dA stored [K,M] = alpha op(B) G^T
        ref::matmul(b.data(), G.data(), (const double*)nullptr, da.data(), K, M, N, tb, true, alpha, false);
      if (!tb)  // dB [K,N] = alpha op(A)^T G
        ref::matmul(a.data(), G.data(), (const double*)nullptr, db.data(), K, N, M, !ta, false, alpha, false);
      else  // dB stored [N,K] = alpha G^T op(A)
        ref::matmul(G.data(), a.data(), (const double*)nullptr, db.data(), N, K, M, true, ta, alpha, false);
      ref::bias_grad(G.data(), dbias.data(), M, N, false);
      EXPECT_LE(normalized_error(da, numeric_grad(a, objective)), kGradTol);
      EXPECT_LE(normalized_error(db, numeric_grad(b, objective)), kGradTol);
      EXPECT_LE(normalized_error(dbias, numeric_grad(bias, objective)), kGradTol);
    }
}

TEST(ReferenceGradcheck, Gelu) {
  const int64_t n = 64;
  Vec x = random_vector<double>(n, 14, -4, 4);
  const Vec G = random_vector<double>(n, 15);
  auto objective = [&] {
    Vec y(n);
    ref::gelu_forward(x.data(), y.data(), n, false);
    return dot(G, y);
  };
  Vec dx(n);
  ref::gelu_backward(G.data(), x.data(), dx.data(), n, false);
  EXPECT_LE(normalized_error(dx, numeric_grad(x, objective)), kGradTol);
}

TEST(ReferenceGradcheck, Attention) {
  const int64_t B = 2, T = 5, NH = 2, HS = 3, C = NH * HS;
  const double scale = 1.0 / std::sqrt(double(HS));
  Vec qkv = random_vector<double>(B * T * 3 * C, 16, -1.5, 1.5);
  const Vec G = random_vector<double>(B * T * C, 17);
  Vec y(B * T * C), probs(B * NH * T * T);
  auto objective = [&] {
    ref::attention_forward(qkv.data(), y.data(), probs.data(), B, T, NH, HS, scale, false);
    return dot(G, y);
  };
  objective();
  Vec dqkv(B * T * 3 * C);
  ref::attention_backward(G.data(), qkv.data(), probs.data(), dqkv.data(), B, T, NH, HS, scale, false);
  EXPECT_LE(normalized_error(dqkv, numeric_grad(qkv, objective)), kGradTol);
}

TEST(ReferenceGradcheck, FlashAttention) {
  const int64_t B = 2, T = 5, NH = 2, HS = 3, C = NH * HS;
  const double scale = 1.0 / std::sqrt(double(HS));
  Vec qkv = random_vector<double>(B * T * 3 * C, 26, -1.5, 1.5);
  const Vec G = random_vector<double>(B * T * C, 27);
  Vec y(B * T * C), lse(B * NH * T);
  auto objective = [&] {
    ref::flash_attention_forward(qkv.data(), y.data(), lse.data(), B, T, NH, HS, scale);
    return dot(G, y);
  };
  objective();
  Vec dqkv(B * T * 3 * C, 5.0);
  ref::flash_attention_backward(G.data(), qkv.data(), y.data(), lse.data(), dqkv.data(), B, T, NH, HS, scale, false);
  EXPECT_LE(normalized_error(dqkv, numeric_grad(qkv, objective)), kGradTol);
}

TEST(ReferenceForward, AttentionWithZeroQueriesAveragesThePrefix) {
  const int64_t B = 1, T = 4, NH = 2, HS = 3, C = NH * HS;
  Vec qkv = random_vector<double>(B * T * 3 * C, 18);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) qkv[t * 3 * C + c] = 0.0;  // q = 0: uniform over keys 0..t
  Vec y(B * T * C), probs(B * NH * T * T);
  ref::attention_forward(qkv.data(), y.data(), probs.data(), B, T, NH, HS, 0.5, false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double mean = 0;
      for (int64_t s = 0; s <= t; ++s) mean += qkv[s * 3 * C + 2 * C + c] / double(t + 1);
      EXPECT_NEAR(y[t * C + c], mean, 1e-12);
    }
  for (int64_t h = 0; h < NH; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = t + 1; s < T; ++s) EXPECT_EQ(probs[(h * T + t) * T + s], 0.0);
}

TEST(ReferenceGradcheck, Classifier) {
  const int64_t N = 4, C = 3, V = 5, Vp = 7;
  const double grad_scale = 0.25;
  Vec x = random_vector<double>(N * C, 19, -2, 2), wte = random_vector<double>(Vp * C, 20, -2, 2);
  const std::vector<int32_t> targets = {4, 0, 2, 4};
  auto objective = [&] {
    Vec losses(N);
    ref::classifier(x.data(), wte.data(), targets.data(), losses.data(), (double*)nullptr, (double*)nullptr, N, C, V,
                    Vp, grad_scale, false, false);
    double s = 0;
    for (double l : losses) s += grad_scale * l;
    return s;
  };
  Vec losses(N), dx(N * C), dwte(Vp * C);
  ref::classifier(x.data(), wte.data(), targets.data(), losses.data(), dx.data(), dwte.data(), N, C, V, Vp, grad_scale,
                  false, false);
  EXPECT_LE(normalized_error(dx, numeric_grad(x, objective)), kGradTol);
  EXPECT_LE(normalized_error(dwte, numeric_grad(wte, objective)), kGradTol);
  for (int64_t j = V; j < Vp; ++j)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dwte[j * C + c], 0.0) << "padding row " << j;
}

TEST(ReferenceForward, ClassifierUniformLogitsGiveLogV) {
  // x = 0 makes every logit 0: the loss is log V, not log Vp — the padding takes no part.
  const int64_t N = 3, C = 4, V = 6, Vp = 8;
  const Vec x(N * C, 0.0), wte = random_vector<double>(Vp * C, 21);
  const std::vector<int32_t> targets = {0, 5, 2};
  Vec losses(N);
  ref::classifier(x.data(), wte.data(), targets.data(), losses.data(), (double*)nullptr, (double*)nullptr, N, C, V, Vp,
                  1.0, false, false);
  for (double l : losses) EXPECT_NEAR(l, std::log(double(V)), 1e-12);
}

TEST(ReferenceForward, AdamWFirstStepMovesByLr) {
  // At step 1 the bias-corrected moments are g and g^2, so the update is lr * g / (|g| + eps)
  // = lr * sign(g) up to eps, after the decoupled decay p * (1 - lr * wd).
  const double lr = 1e-2, wd = 0.1;
  std::vector<double> p = {1.0, -2.0, 0.5}, g = {0.3, -4.0, 1e-3}, m(3, 0.0), v(3, 0.0);
  const std::vector<double> p0 = p;
  ref::adamw(p.data(), g.data(), m.data(), v.data(), 3, lr, 0.9, 0.999, 1e-8, wd, 1);
  for (size_t i = 0; i < 3; ++i) {
    const double expect = p0[i] * (1 - lr * wd) - lr * g[i] / (std::fabs(g[i]) + 1e-8);
    EXPECT_NEAR(p[i], expect, 1e-12);
    EXPECT_NEAR(m[i], 0.1 * g[i], 1e-15);
    EXPECT_NEAR(v[i], 0.001 * g[i] * g[i], 1e-15);
  }
}

}  // namespace
}  // namespace memfit
