// The GEMM-based kernels (matmul through sgemm or oneDNN, attention, classifier) against the
// naive references.
//
// Tolerance: fp32 GEMMs with K up to a few hundred on inputs in [-1, 1]. The reference sums
// in double; oneDNN sums K float products in blocked order, so each output carries a rounding
// error of about sqrt(K) ulp of the partial sums, i.e. ~1e-6 of the largest output for these
// sizes. max|cpu - ref| / max|ref| <= 1e-5 leaves a factor ~10 of margin while any indexing
// or transpose bug gives an error of order 1. The softmax steps use exp_approx (~1 ulp) and
// add nothing visible to that.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "kernel_test_util.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/attention_tiles.hpp"
#include "kernels/cpu/classifier.hpp"
#include "kernels/cpu/dnnl_matmul.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/sgemm.hpp"
#include "kernels/cpu/transpose.hpp"
#include "kernels/reference/reference.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_ints;
using test::random_vector;
using Vec = std::vector<float>;

constexpr double kGemmTol = 1e-5;

const DnnlEnv& env() {
  static const DnnlEnv e = DnnlEnv::make_cpu();
  return e;
}

std::vector<char> scratch_for(uint64_t bytes) { return std::vector<char>(bytes + 64); }

struct MatmulCase {
  int64_t m, n, k;
  bool trans_a, trans_b, bias;
  float alpha;
};

TEST(CpuMatmul, MatchesReferenceForTransposesBiasAlphaAndModes) {
  const std::vector<MatmulCase> cases = {
      {7, 5, 3, false, false, false, 1.0f},   {33, 17, 65, false, true, true, 1.0f},
      {16, 31, 9, true, false, false, 0.5f},  {13, 11, 129, true, true, true, -0.25f},
      {1, 257, 19, false, true, true, 2.0f},  {64, 48, 96, true, false, true, 1.0f},
      // Wide non-transposed B under a transposed A: staged through a transpose in the scratch.
      {21, kStageBMinN, 5, true, false, false, -1.5f},
      // sgemm (no transpose): rows past whole register blocks,
      // columns past whole strips and past one packed block of strips (a ragged last strip),
      // k past one packed block.
      {kSgemmMr * 3 + 5, kSgemmNr * (kSgemmNcStrips + 2) + 7, kSgemmKc + 37, false, false, true, 1.0f},
      {17 * kSgemmMr + 1, kSgemmNr + 17, 2 * kSgemmKc + 16, false, false, false, -0.75f},
  };
  for (const MatmulCase& c : cases)
    for (WriteMode mode : {WriteMode::overwrite, WriteMode::accumulate, WriteMode::accumulate_after_first_micro}) {
      SCOPED_TRACE(testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.trans_a
                                      << " tb=" << c.trans_b << " bias=" << c.bias << " alpha=" << c.alpha
                                      << " mode=" << int(mode));
      MatmulAttrs a;
      a.m = c.m, a.n = c.n, a.k = c.k, a.trans_a = c.trans_a, a.trans_b = c.trans_b, a.alpha = c.alpha;
      const Vec A = random_vector(c.m * c.k, 1), B = random_vector(c.k * c.n, 2), bias = random_vector(c.n, 3);
      const Vec C0 = random_vector(c.m * c.n, 4);
      const WriteVariants variants = WriteVariants::of(mode);
      MatmulKernel kernel(env(), a, c.bias, variants);
      auto scratch = scratch_for(MatmulKernel::scratch_bytes(env(), a, c.bias, variants));
      Vec C = C0;
      kernel.bind(A.data(), B.data(), c.bias ? bias.data() : nullptr, C.data(), scratch.data());
      for (bool acc : {false, true}) {
        if (acc ? !variants.accumulate : !variants.overwrite) continue;
        C = C0;
        Vec expect = C0;
        kernel.run(acc);
        ref::matmul(A.data(), B.data(), c.bias ? bias.data() : nullptr, expect.data(), c.m, c.n, c.k, c.trans_a,
                    c.trans_b, double(c.alpha), acc);
        EXPECT_LE(normalized_error(C, expect), kGemmTol) << "acc=" << acc;
      }
    }
}

struct AttentionCase {
  int64_t B, T, NH, HS;
};

TEST(CpuAttention, ForwardAndBackwardMatchReference) {
  // fp32 runs attention_tiles.cpp: T = 1, 7, 33, 64, 130, 259 and 575 end in a partial block
  // of kAttentionQueryBlock queries (or fit in one), and head sizes that are not multiples of
  // 16 leave transpose edges. The blocks() checks are of the bf16 path's causal split
  // (tested in bf16 by cpu_lowp_test).
  const std::vector<AttentionCase> cases = {{1, 1, 1, 8},   {2, 7, 3, 5},   {3, 33, 2, 16},
                                            {1, 64, 4, 64}, {2, 130, 2, 8}, {1, 259, 2, 4}, {1, 575, 1, 3}};
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " HS=" << c.HS);
    const int64_t C = c.NH * c.HS;
    AttentionAttrs attrs;
    attrs.batch = c.B, attrs.seq = c.T, attrs.heads = c.NH, attrs.kv_heads = c.NH, attrs.head_dim = c.HS;
    attrs.scale = 1.0f / std::sqrt(float(c.HS));
    const AttentionShape shape = AttentionShape::of(attrs);
    if (c.T == 130) {
      EXPECT_EQ(shape.blocks(), 2);
    } else if (c.T == 259) {
      EXPECT_EQ(shape.blocks(), 4);
    } else if (c.T == 575) {
      EXPECT_EQ(shape.blocks(), 8);
    }
    const Vec qkv = random_vector(c.B * c.T * 3 * C, 5, -2, 2), dy = random_vector(c.B * c.T * C, 6);
    const Vec y0 = random_vector(c.B * c.T * C, 7), dqkv0 = random_vector(c.B * c.T * 3 * C, 8);
    const WriteVariants both{true, true};
    AttentionForwardKernel fwd(env(), shape, both);
    AttentionBackwardKernel bwd(env(), shape, both);
    auto scratch = scratch_for(std::max(AttentionForwardKernel::scratch_bytes(env(), shape, both),
                                        AttentionBackwardKernel::scratch_bytes(env(), shape, both)));
    // probs starts as garbage: the masked entries must be written as exact zeros.
    Vec y = y0, probs = random_vector(c.B * c.NH * c.T * c.T, 9), dqkv = dqkv0, dprobs(probs.size(), 7.0f);
    fwd.bind(qkv.data(), y.data(), probs.data(), scratch.data());
    bwd.bind(dy.data(), qkv.data(), probs.data(), dqkv.data(), dprobs.data(), scratch.data());
    for (bool acc : {false, true}) {
      y = y0, dqkv = dqkv0;
      Vec ey = y0, eprobs(probs.size()), edqkv = dqkv0;
      fwd.run(acc);
      bwd.run(acc);
      ref::attention_forward(qkv.data(), ey.data(), eprobs.data(), c.B, c.T, c.NH, c.HS, double(attrs.scale), acc);
      ref::attention_backward(dy.data(), qkv.data(), eprobs.data(), edqkv.data(), c.B, c.T, c.NH, c.HS,
                              double(attrs.scale), acc);
      EXPECT_LE(normalized_error(probs, eprobs), kGemmTol) << "acc=" << acc;
      EXPECT_LE(normalized_error(y, ey), kGemmTol) << "acc=" << acc;
      EXPECT_LE(normalized_error(dqkv, edqkv), kGemmTol) << "acc=" << acc;
      for (int64_t r = 0; r < c.B * c.NH * c.T; ++r)
        for (int64_t s = r % c.T + 1; s < c.T; ++s) ASSERT_EQ(probs[r * c.T + s], 0.0f) << "row " << r << " col " << s;
    }
  }
}

// sgemm and the fp32 attention sum every output on one thread in a fixed order, so the bits
// must not depend on how many threads share the work (the products are sized so that 1, 2
// and 3 threads split them differently: 7 strips of columns, 5 heads).
TEST(CpuGemm, Fp32KernelsGiveTheSameBitsOnAnyThreadCount) {
  const int saved = omp_get_max_threads();
  const SgemmShape gemm{37, 7 * kSgemmNr - 5, kSgemmKc + 9, 0.5f};
  const Vec a = random_vector(gemm.m * gemm.k, 21), b = random_vector(gemm.k * gemm.n, 22);
  const Vec bias = random_vector(gemm.n, 23), c0 = random_vector(gemm.m * gemm.n, 24);
  const AttentionShape att{5, 70, 1, 16, 0.25f, DType::f32};
  const Vec qkv = random_vector(att.batch * att.seq * 3 * att.channels(), 25, -2, 2);
  const Vec dy = random_vector(att.batch * att.seq * att.channels(), 26);
  std::vector<Vec> outs;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Vec c = c0, y(dy.size()), probs(att.batch * att.heads * att.seq * att.seq), dprobs(probs.size());
    Vec dqkv(qkv.size());
    auto gs = scratch_for(sgemm_scratch_bytes(gemm, threads));
    sgemm(gemm, a.data(), b.data(), bias.data(), c.data(), true, gs.data(), threads);
    auto as = scratch_for(attention_tiles_scratch_bytes(att, threads));
    attention_forward_tiles(att, qkv.data(), y.data(), probs.data(), false, as.data(), threads);
    attention_backward_tiles(att, dy.data(), qkv.data(), probs.data(), dqkv.data(), dprobs.data(), false, as.data(),
                             threads);
    c.insert(c.end(), y.begin(), y.end());
    c.insert(c.end(), dqkv.begin(), dqkv.end());
    outs.push_back(std::move(c));
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < outs.size(); ++i) {
    ASSERT_EQ(outs[i].size(), outs[0].size());
    for (size_t j = 0; j < outs[0].size(); ++j) ASSERT_EQ(outs[i][j], outs[0][j]) << "threads " << i + 1 << " at " << j;
  }
}

// Whole 16 x 16 blocks, ragged edges on both sides, and a strided source and destination.
TEST(CpuTranspose, EqualsAnElementCopy) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 70}, {16, 16}, {3, 50}, {130, 7}, {64, 192}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    const Vec src = random_vector(rows * cols, 31);
    Vec dst(rows * cols, -1.0f);
    transpose(dst.data(), src.data(), rows, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(dst[c * rows + r], src[r * cols + c]) << r << ", " << c;
    // rows x cols taken out of a wider source, written into a wider destination.
    const int64_t lds = cols + 5, ldd = rows + 3;
    const Vec wide = random_vector(rows * lds, 32);
    Vec out(cols * ldd, -1.0f);
    transpose_serial(out.data(), ldd, wide.data(), lds, rows, cols);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < ldd; ++r)
        ASSERT_EQ(out[c * ldd + r], r < rows ? wide[r * lds + c] : -1.0f) << r << ", " << c;
  }
}

// Grouped kv heads run (cpu_gqa_attention_test); a group that does not divide the heads is refused.
TEST(CpuAttention, UnevenKvGroupsAreRejected) {
  AttentionAttrs attrs;
  attrs.batch = 1, attrs.seq = 4, attrs.heads = 4, attrs.kv_heads = 3, attrs.head_dim = 8, attrs.scale = 0.3f;
  EXPECT_THROW(AttentionShape::of(attrs), Error);
}

struct ClassifierCase {
  int64_t N, C, V, Vp, R;
};

TEST(CpuClassifier, MatchesReferenceWithChunksPaddingAndModes) {
  // R not dividing N, R > N, R == 1, Vp > V, odd C.
  const std::vector<ClassifierCase> cases = {
      {10, 7, 13, 16, 4}, {9, 33, 50, 64, 9}, {5, 16, 31, 31, 8}, {6, 5, 20, 24, 1}, {37, 48, 101, 128, 16}};
  const float dscale = 0.37f;
  for (const ClassifierCase& c : cases)
    for (int mode = 0; mode < 4; ++mode) {
      const bool acc_dx = mode & 1, acc_dwte = mode & 2;
      SCOPED_TRACE(testing::Message() << "N=" << c.N << " C=" << c.C << " V=" << c.V << " Vp=" << c.Vp
                                      << " R=" << c.R << " acc_dx=" << acc_dx << " acc_dwte=" << acc_dwte);
      const ClassifierShape shape{c.N, c.C, c.V, c.Vp, c.R};
      ClassifierOutputs outputs;
      outputs.dx = outputs.dwte = true;
      outputs.dx_modes = outputs.dwte_modes = WriteVariants{true, true};
      ClassifierKernel kernel(env(), shape, outputs);
      auto scratch = scratch_for(ClassifierKernel::scratch_bytes(env(), shape, outputs));
      const Vec x = random_vector(c.N * c.C, 10, -2, 2), wte = random_vector(c.Vp * c.C, 11, -2, 2);
      auto targets = random_ints(c.N, int32_t(c.V), 12);
      targets[0] = int32_t(c.V - 1);
      const Vec dx0 = random_vector(c.N * c.C, 13), dwte0 = random_vector(c.Vp * c.C, 14);
      Vec losses(c.N), dx = dx0, dwte = dwte0, logits(std::min(c.R, c.N) * c.Vp);
      kernel.bind(x.data(), wte.data(), targets.data(), losses.data(), dx.data(), dwte.data(), logits.data(),
                  scratch.data());
      kernel.run(dscale, acc_dx, acc_dwte);
      Vec elosses(c.N), edx = dx0, edwte = dwte0;
      ref::classifier(x.data(), wte.data(), targets.data(), elosses.data(), edx.data(), edwte.data(), c.N, c.C, c.V,
                      c.Vp, double(dscale), acc_dx, acc_dwte);
      EXPECT_LE(normalized_error(losses, elosses), kGemmTol);
      EXPECT_LE(normalized_error(dx, edx), kGemmTol);
      EXPECT_LE(normalized_error(dwte, edwte), kGemmTol);
      if (!acc_dwte) {  // the padding rows of dwte receive exactly nothing
        for (int64_t j = c.V; j < c.Vp; ++j)
          for (int64_t k = 0; k < c.C; ++k) ASSERT_EQ(dwte[j * c.C + k], 0.0f);
      }
    }
}

TEST(CpuClassifier, EvalComputesLossesOnly) {
  const ClassifierShape shape{23, 19, 40, 48, 6};
  ClassifierOutputs outputs;  // losses only
  ClassifierKernel kernel(env(), shape, outputs);
  auto scratch = scratch_for(ClassifierKernel::scratch_bytes(env(), shape, outputs));
  const Vec x = random_vector(shape.rows * shape.channels, 15, -2, 2);
  const Vec wte = random_vector(shape.padded_vocab * shape.channels, 16, -2, 2);
  const auto targets = random_ints(shape.rows, int32_t(shape.vocab), 17);
  Vec losses(shape.rows), logits(shape.chunk_rows * shape.padded_vocab), expect(shape.rows);
  kernel.bind(x.data(), wte.data(), targets.data(), losses.data(), nullptr, nullptr, logits.data(), scratch.data());
  kernel.run(1.0f, false, false);
  ref::classifier(x.data(), wte.data(), targets.data(), expect.data(), (float*)nullptr, (float*)nullptr, shape.rows,
                  shape.channels, shape.vocab, shape.padded_vocab, 1.0, false, false);
  EXPECT_LE(normalized_error(losses, expect), kGemmTol);
}

}  // namespace
}  // namespace memfit
