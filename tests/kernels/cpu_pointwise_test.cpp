// The OpenMP kernels (embedding, layernorm, gelu, elementwise, reductions, AdamW) against the
// naive references on random inputs of awkward sizes, in overwrite and accumulate modes and
// with the aliasing the op contract allows. Tolerances are normalised max errors
// (max|cpu - ref| / max|ref|); each test states why its bound is what it is. Reductions that
// promise thread-count independence are also run with 1, 2 and 3 threads and compared bit
// for bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/dora.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/reference/reference.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_ints;
using test::random_vector;
using Vec = std::vector<float>;

using test::expect_thread_count_independent;

// Single float additions of values in [-1, 1], rounded once in float instead of once in
// double: at most a couple of ulp of the largest value.
constexpr double kAddTol = 1e-6;

TEST(CpuEmbedding, ForwardMatchesReference) {
  for (bool acc : {false, true}) {
    const int64_t B = 3, T = 7, C = 37, Vp = 53, Tmax = 11, N = B * T;
    const auto tokens = random_ints(N, int32_t(Vp), 1);
    const Vec wte = random_vector(Vp * C, 2), wpe = random_vector(Tmax * C, 3), x0 = random_vector(N * C, 4);
    Vec x = x0, expect = x0;
    embedding_forward(tokens.data(), wte.data(), wpe.data(), x.data(), N, T, C, Vp, acc);
    ref::embedding_forward(tokens.data(), wte.data(), wpe.data(), expect.data(), N, T, C, acc);
    EXPECT_LE(normalized_error(x, expect), kAddTol) << "acc=" << acc;
  }
}

TEST(CpuEmbedding, BackwardMatchesReferenceAndIsDeterministic) {
  const int64_t B = 4, T = 9, C = 131, Vp = 29, Tmax = 13, N = B * T;
  auto tokens = random_ints(N, 7, 5);  // only 7 distinct tokens: many repeats
  tokens[3] = int32_t(Vp - 1);
  const Vec dx = random_vector(N * C, 6);
  for (bool acc_wte : {false, true})
    for (bool acc_wpe : {false, true}) {
      SCOPED_TRACE(testing::Message() << "acc_wte=" << acc_wte << " acc_wpe=" << acc_wpe);
      const Vec wte0 = random_vector(Vp * C, 7), wpe0 = random_vector(Tmax * C, 8);
      Vec dwte = wte0, dwpe = wpe0, ewte = wte0, ewpe = wpe0;
      embedding_backward(dx.data(), tokens.data(), dwte.data(), dwpe.data(), N, T, C, Vp, Tmax, acc_wte, acc_wpe);
      ref::embedding_backward(dx.data(), tokens.data(), ewte.data(), ewpe.data(), N, T, C, Vp, Tmax, acc_wte, acc_wpe);
      // Up to B*T float additions per element (a token repeated across rows): the error
      // grows like sqrt(count) ulp of the running sum; 1e-5 of the largest value is ample.
      EXPECT_LE(normalized_error(dwte, ewte), 1e-5);
      EXPECT_LE(normalized_error(dwpe, ewpe), 1e-5);
    }
  // One output absent.
  Vec dwpe(Tmax * C, 5.0f), ewpe(Tmax * C, 5.0f);
  embedding_backward(dx.data(), tokens.data(), (float*)nullptr, dwpe.data(), N, T, C, Vp, Tmax, false, false);
  ref::embedding_backward(dx.data(), tokens.data(), (float*)nullptr, ewpe.data(), N, T, C, Vp, Tmax, false, false);
  EXPECT_LE(normalized_error(dwpe, ewpe), 1e-5);
  expect_thread_count_independent([&] {
    Vec a(Vp * C), b(Tmax * C);
    embedding_backward(dx.data(), tokens.data(), a.data(), b.data(), N, T, C, Vp, Tmax, false, false);
    return std::vector<Vec>{a, b};
  });
}

TEST(CpuLayerNorm, ForwardMatchesReference) {
  for (int64_t N : {1, 5, 33})
    for (int64_t C : {7, 64, 131}) {
      SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
      const Vec x = random_vector(N * C, 9, 2, 4);  // |mean| > std: punishes one-pass variance
      const Vec w = random_vector(C, 10), b = random_vector(C, 11);
      Vec y(N * C), mean(N), rstd(N), ey(N * C), emean(N), erstd(N);
      layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5f);
      ref::layernorm_forward(x.data(), w.data(), b.data(), ey.data(), emean.data(), erstd.data(), N, C, 1e-5);
      // Float sums over C <= 131 values: relative error ~ log2(C) ulp on mean and variance,
      // amplified by at most rstd * |x - mean| ~ 2 in y.
      EXPECT_LE(normalized_error(y, ey), 1e-5);
      EXPECT_LE(normalized_error(mean, emean), 1e-6);
      EXPECT_LE(normalized_error(rstd, erstd), 1e-5);
    }
}

TEST(CpuLayerNorm, BackwardMatchesReferenceInEveryMode) {
  const int64_t N = 37, C = 131;
  const Vec x = random_vector(N * C, 12, -2, 3), w = random_vector(C, 13), b = random_vector(C, 14);
  const Vec dy = random_vector(N * C, 15);
  Vec y(N * C), mean(N), rstd(N);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5f);
  for (int mode = 0; mode < 8; ++mode) {
    const bool acc_dx = mode & 1, acc_dw = mode & 2, acc_db = mode & 4;
    SCOPED_TRACE(testing::Message() << "acc dx/dw/db = " << acc_dx << acc_dw << acc_db);
    const Vec dx0 = random_vector(N * C, 16), dw0 = random_vector(C, 17), db0 = random_vector(C, 18);
    Vec dx = dx0, dw = dw0, db = db0, edx = dx0, edw = dw0, edb = db0;
    layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), N, C,
                       acc_dx, acc_dw, acc_db);
    ref::layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), edx.data(), edw.data(),
                            edb.data(), N, C, acc_dx, acc_dw, acc_db);
    // dx: float sums over C terms and a difference of terms of similar size, ~1e-6 relative
    // to the row's scale. dw, db: summed in double, so only the final rounding remains.
    EXPECT_LE(normalized_error(dx, edx), 1e-5);
    EXPECT_LE(normalized_error(dw, edw), 1e-6);
    EXPECT_LE(normalized_error(db, edb), 1e-6);
  }
  // In place: dx overwrites dy; dw absent.
  Vec inplace = dy, edx(N * C), db(C), edb(C);
  layernorm_backward(inplace.data(), x.data(), w.data(), mean.data(), rstd.data(), inplace.data(), (float*)nullptr, db.data(),
                     N, C, false, false, false);
  ref::layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), edx.data(), (float*)nullptr,
                          edb.data(), N, C, false, false, false);
  EXPECT_LE(normalized_error(inplace, edx), 1e-5);
  EXPECT_LE(normalized_error(db, edb), 1e-6);
  expect_thread_count_independent([&] {
    Vec dx(N * C), dw(C), db2(C);
    layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db2.data(), N, C,
                       false, false, false);
    return std::vector<Vec>{dx, dw, db2};
  });
}

TEST(CpuGelu, ForwardAndBackwardMatchReference) {
  const int64_t n = 10007;  // not a multiple of the vector width
  const Vec x = random_vector(n, 19, -6, 6), dy = random_vector(n, 20);
  for (bool acc : {false, true}) {
    const Vec y0 = random_vector(n, 21);
    Vec y = y0, ey = y0, dx = y0, edx = y0;
    gelu_forward(x.data(), y.data(), n, acc);
    ref::gelu_forward(x.data(), ey.data(), n, acc);
    gelu_backward(dy.data(), x.data(), dx.data(), n, acc);
    ref::gelu_backward(dy.data(), x.data(), edx.data(), n, acc);
    // tanh_approx has an absolute error of a few 1e-8 and GELU adds it to 1: a few ulp.
    EXPECT_LE(normalized_error(y, ey), 1e-6) << "acc=" << acc;
    EXPECT_LE(normalized_error(dx, edx), 1e-6) << "acc=" << acc;
  }
  // dx in place of dy.
  Vec inplace = dy, edx(n);
  gelu_backward(inplace.data(), x.data(), inplace.data(), n, false);
  ref::gelu_backward(dy.data(), x.data(), edx.data(), n, false);
  EXPECT_LE(normalized_error(inplace, edx), 1e-6);
}

TEST(CpuElementwise, AddAccumulateFillWithAliasing) {
  const int64_t n = 1001;
  const Vec a = random_vector(n, 22), b = random_vector(n, 23), y0 = random_vector(n, 24);
  for (bool acc : {false, true}) {
    Vec y = y0, ey = y0;
    add_forward(a.data(), b.data(), y.data(), n, acc);
    ref::add(a.data(), b.data(), ey.data(), n, acc);
    EXPECT_LE(normalized_error(y, ey), kAddTol);
    y = y0, ey = y0;
    accumulate_forward(a.data(), y.data(), n, acc);
    ref::accumulate(a.data(), ey.data(), n, acc);
    EXPECT_LE(normalized_error(y, ey), kAddTol);
    y = y0, ey = y0;
    fill_forward(y.data(), n, 0.375f, acc);
    ref::fill(ey.data(), n, 0.375, acc);
    EXPECT_LE(normalized_error(y, ey), kAddTol);
  }
  Vec ya = a, yb = b, expect(n);
  ref::add(a.data(), b.data(), expect.data(), n, false);
  add_forward(ya.data(), b.data(), ya.data(), n, false);  // y aliases a
  add_forward(a.data(), yb.data(), yb.data(), n, false);  // y aliases b
  EXPECT_EQ(ya, expect);
  EXPECT_EQ(yb, expect);
}

TEST(CpuReduce, BiasGradAndLossMean) {
  for (int64_t N : {5, 64, 200}) {
    const int64_t M = 37;
    const Vec dy = random_vector(M * N, 25);
    for (bool acc : {false, true}) {
      const Vec db0 = random_vector(N, 26);
      Vec db = db0, edb = db0;
      bias_grad(dy.data(), db.data(), M, N, acc);
      ref::bias_grad(dy.data(), edb.data(), M, N, acc);
      // The reference sums in double; the kernel sums groups of kRowGroup rows in float, so
      // each group carries at most (kRowGroup - 1) float roundings: 15 * 2^-24 < 1e-6.
      EXPECT_LE(normalized_error(db, edb), 1e-6) << "N=" << N << " acc=" << acc;
    }
    expect_thread_count_independent([&] {
      Vec db(N);
      bias_grad(dy.data(), db.data(), M, N, false);
      return std::vector<Vec>{db};
    });
  }
  const Vec losses = random_vector(1037, 27, 0, 11);
  for (bool acc : {false, true}) {
    float loss = 2.5f, expect = 2.5f;
    loss_mean(losses.data(), &loss, int64_t(losses.size()), 1.0f / 1037, acc);
    ref::loss_mean(losses.data(), &expect, int64_t(losses.size()), double(1.0f / 1037), acc);
    EXPECT_NEAR(loss, expect, 1e-6 * std::fabs(expect));
  }
}

TEST(CpuAdamW, FusedPassMatchesReferenceOverSteps) {
  // Tensor sizes from 1 element to several thousand so thread slices start and end inside
  // tensors and cross several small ones.
  const std::vector<int64_t> sizes = {1, 3, 17, 1000, 4097, 2};
  const std::vector<float> decay = {0.1f, 0.0f, 0.1f, 0.05f, 0.1f, 0.0f};
  std::vector<Vec> p, g, m, v, ep, em, ev;
  std::vector<AdamWTensor> tensors;
  for (size_t i = 0; i < sizes.size(); ++i) {
    p.push_back(random_vector(sizes[i], 30 + uint32_t(i)));
    g.push_back(random_vector(sizes[i], 40 + uint32_t(i)));
    m.push_back(Vec(sizes[i], 0.0f));
    v.push_back(Vec(sizes[i], 0.0f));
  }
  ep = p, em = m, ev = v;
  for (size_t i = 0; i < sizes.size(); ++i)
    tensors.push_back(AdamWTensor{p[i].data(), g[i].data(), DType::f32, m[i].data(), v[i].data(), sizes[i], decay[i]});
  const AdamWSet set(tensors);
  for (int64_t step = 1; step <= 3; ++step) {
    const AdamWHyper h{1e-3f * float(step), 0.9f, 0.95f, 1e-8f, step};
    set.run(h);
    for (size_t i = 0; i < sizes.size(); ++i)
      ref::adamw(ep[i].data(), g[i].data(), em[i].data(), ev[i].data(), sizes[i], double(h.lr), double(h.beta1),
                 double(h.beta2), double(h.eps), double(decay[i]), step);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    // A few float roundings per element per step against double: ~1e-7 relative. The
    // update m / (sqrt(v) + eps) is well conditioned because |g| is far above eps here.
    EXPECT_LE(normalized_error(p[i], ep[i]), 1e-6) << "tensor " << i;
    EXPECT_LE(normalized_error(m[i], em[i]), 1e-6) << "tensor " << i;
    EXPECT_LE(normalized_error(v[i], ev[i]), 1e-6) << "tensor " << i;
  }
}

// DoRA's row norms ||W + s B A|| against a naive double sum, through the tiled kernel (rank 3)
// and the row-by-row one it takes above rank 1024.
TEST(CpuDora, RowNormsMatchANaiveSum) {
  const int64_t k = 300, rows = 11, row_begin = 2;
  for (int64_t rank : {3, 1100}) {
    SCOPED_TRACE(rank);
    const std::vector<float> w = random_vector<float>(size_t((row_begin + rows) * k), 1);
    const std::vector<float> a = random_vector<float>(size_t(rank * k), 2);
    const std::vector<float> b = random_vector<float>(size_t(rows * rank), 3, -0.1, 0.1);
    std::vector<float> norm(static_cast<size_t>(rows));
    dora_norm_rows<float>(w.data(), a.data(), b.data(), norm.data(), k, row_begin, rows, rank, 0.7f);
    for (int64_t j = 0; j < rows; ++j) {
      double sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        double ba = 0;
        for (int64_t r = 0; r < rank; ++r) ba += double(b[size_t(j * rank + r)]) * a[size_t(r * k + c)];
        sum += std::pow(w[size_t((row_begin + j) * k + c)] + 0.7 * ba, 2);
      }
      EXPECT_NEAR(norm[size_t(j)], std::sqrt(sum), 1e-5 * std::sqrt(sum)) << j;
    }
  }
}

}  // namespace
}  // namespace memfit
