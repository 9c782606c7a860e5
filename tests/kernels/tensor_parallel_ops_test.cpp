// The kernels of tensor parallelism (graph/op.hpp): add_bias, the vocabulary-parallel
// classifier (classifier_partial, classifier_combine, classifier_parallel_backward) and the
// embedding ops over a vocabulary slice (EmbeddingAttrs), driven through the backends as the
// executor drives them.
//
// Oracles: naive loops written here (add_bias), the reference backend's kernels (CPU parity,
// fp32 and bf16 with the inputs rounded to bf16 first), and the one-rank ops: the fused
// classifier over the whole vocabulary and the embedding with NoAttrs, which the slices
// together must reproduce. Tolerances are those of cpu_lowp_test / backend_parity_test:
// 1e-5 normalised for fp32 results, 2^-8 for a bf16 result rounded once, 2^-6 for a bf16
// result computed from bf16-rounded d(logits).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/reference/reference.hpp"
#include "program_fixture.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_ints;
using test::random_vector;
using Vec = std::vector<float>;

constexpr double kFp32Tol = 1e-5;
constexpr double kBf16Tol = 0x1p-8;
constexpr double kTwiceRounded = 0x1p-6;
// The slices against the fused classifier, both fp32: the same logits, the softmax through the
// combined lse instead of the row's own max and sum (a few ulp of lse ~ 5: ~1e-6).
constexpr double kSliceTol = 2e-6;

const WriteMode ow = WriteMode::overwrite, acc = WriteMode::accumulate;

// A ProgramFixture on one backend whose float tensors are written and read as fp32, whatever
// their dtype.
struct Fixture : test::ProgramFixture {
  explicit Fixture(const std::string& backend_name) : backend(make_backend(backend_name)) {}

  TensorId make(const std::string& name, Shape shape, DType dtype, const Vec& values) {
    const TensorId id = tensor(name, std::move(shape), dtype);
    EXPECT_EQ(int64_t(values.size()), program.tensor(id).numel()) << name;
    visit_float_type(dtype, [&](auto t) {
      using T = decltype(t);
      for (size_t i = 0; i < values.size(); ++i) data<T>(id)[i] = narrow<T>(values[i]);
    });
    return id;
  }
  TensorId ints(const std::string& name, const std::vector<int32_t>& values) {
    const TensorId id = tensor(name, Shape{int64_t(values.size())}, DType::i32);
    set(id, values);
    return id;
  }
  Vec read(TensorId id) {
    Vec out(size_t(program.tensor(id).numel()));
    visit_float_type(program.tensor(id).dtype, [&](auto t) {
      using T = decltype(t);
      for (size_t i = 0; i < out.size(); ++i) out[i] = widen(data<T>(id)[i]);
    });
    return out;
  }
  void run(int op, const StepContext& ctx = StepContext{}) { prepare(*backend, op)->run(ctx); }

  std::unique_ptr<Backend> backend;
};

// Values as a tensor of `dtype` holds them (the oracle's inputs).
Vec rounded(const Vec& v, DType dtype) {
  Vec out(v.size());
  visit_float_type(dtype, [&](auto t) {
    using T = decltype(t);
    for (size_t i = 0; i < v.size(); ++i) out[i] = widen(narrow<T>(v[i]));
  });
  return out;
}

Vec rows_of(const Vec& v, int64_t first, int64_t count, int64_t C) {
  return Vec(v.begin() + first * C, v.begin() + (first + count) * C);
}

std::string dtype_str(DType t) { return std::string(dtype_name(t)); }

// --- add_bias ---

TEST(TensorParallelOps, AddBiasMatchesANaiveLoop) {
  const int64_t M = 37, N = 53;  // rows not a multiple of any vector width
  for (const std::string backend : {"cpu", "reference"})
    for (DType t : {DType::f32, DType::bf16})
      for (int variant = 0; variant < 3; ++variant) {  // overwrite, accumulate, in place (y is x)
        if (backend == "reference" && t != DType::f32) continue;
        SCOPED_TRACE(backend + " " + dtype_str(t) + " variant " + std::to_string(variant));
        Fixture f(backend);
        const Vec xv = random_vector(M * N, 1, -3, 3), bv = random_vector(N, 2), y0 = random_vector(M * N, 3);
        const TensorId x = f.make("x", {M, N}, t, xv), b = f.make("b", {N}, t, bv);
        const TensorId y = variant == 2 ? x : f.make("y", {M, N}, t, y0);
        f.run(f.op(OpKind::add_bias, {x, b}, {y}, NoAttrs{}, {variant == 1 ? acc : ow}));
        const Vec xr = rounded(xv, t), br = rounded(bv, t), yr = rounded(y0, t);
        Vec expect(M * N);
        for (int64_t r = 0; r < M; ++r)
          for (int64_t c = 0; c < N; ++c) {
            const size_t i = size_t(r * N + c);
            expect[i] = float(double(xr[i]) + double(br[size_t(c)]) + (variant == 1 ? double(yr[i]) : 0.0));
          }
        // fp32: y + (x + b) is two roundings in the kernel.
        EXPECT_LE(normalized_error(f.read(y), expect), t == DType::f32 ? 0x1p-22 : kBf16Tol);
      }
}

// --- the vocabulary-parallel classifier: CPU against the reference kernels ---

struct ClassifierCase {
  int64_t N = 37, C = 24, V = 100, Vs = 64, R = 16;  // chunks of 16, 16 and a tail of 5
};

ClassifierAttrs slice_attrs(const ClassifierCase& c, int64_t vocab_begin, float grad_scale) {
  ClassifierAttrs a;
  a.rows = c.N, a.vocab = c.V, a.chunk_rows = c.R, a.grad_scale = grad_scale, a.vocab_begin = vocab_begin;
  return a;
}

// A plausible lse of the rows for a slice (x and w as the kernel sees them): the slice's own
// log-sum-exp plus 0.5, as if the other slices held the rest of the mass, so that the
// probabilities are O(1) and the target's -1 in the gradient weighs as much as it does in training.
Vec plausible_lse(const Vec& x, const Vec& w, const std::vector<int32_t>& targets, const ClassifierCase& c,
                  int64_t begin) {
  Vec stats(c.N * 3), lse(c.N);
  ref::classifier_partial(x.data(), w.data(), targets.data(), stats.data(), c.N, c.C, c.V, c.Vs, begin);
  for (int64_t n = 0; n < c.N; ++n) {
    const float* st = &stats[size_t(3 * n)];
    lse[size_t(n)] = st[1] > 0 ? float(double(st[0]) + std::log(double(st[1])) + 0.5) : 1.0f;
  }
  return lse;
}

TEST(TensorParallelOps, ClassifierPartialMatchesTheReference) {
  const ClassifierCase c;
  const auto targets = random_ints(size_t(c.N), int32_t(c.V), 4);
  for (DType t : {DType::f32, DType::bf16})
    for (int64_t begin : {int64_t(0), c.Vs, 2 * c.Vs}) {  // real columns: all, the first 36, none
      SCOPED_TRACE(dtype_str(t) + " vocab_begin " + std::to_string(begin));
      Fixture f("cpu");
      const Vec xv = random_vector(c.N * c.C, 5, -2, 2), wv = random_vector(c.Vs * c.C, 6, -2, 2);
      const TensorId x = f.make("x", {c.N, c.C}, t, xv), w = f.make("w", {c.Vs, c.C}, t, wv);
      const TensorId stats = f.tensor("stats", {c.N, 3});
      f.run(f.op(OpKind::classifier_partial, {x, w, f.ints("targets", targets)}, {stats}, slice_attrs(c, begin, 1),
                 {ow}, {f.tensor("logits", {c.R, c.Vs})}));
      Vec expect(c.N * 3);
      ref::classifier_partial(rounded(xv, t).data(), rounded(wv, t).data(), targets.data(), expect.data(), c.N, c.C,
                              c.V, c.Vs, begin);
      const Vec got = f.read(stats);
      if (begin >= c.V) {
        for (int64_t n = 0; n < c.N; ++n) {
          EXPECT_EQ(got[size_t(3 * n)], -std::numeric_limits<float>::infinity()) << "row " << n;
          EXPECT_EQ(got[size_t(3 * n + 1)], 0.0f) << "row " << n;
          EXPECT_EQ(got[size_t(3 * n + 2)], 0.0f) << "row " << n;
        }
        continue;
      }
      // bf16 x bf16 products are exact in fp32: the stats are fp32 sums either way.
      EXPECT_LE(normalized_error(got, expect), kFp32Tol);
      int in_slice = 0;
      for (int64_t n = 0; n < c.N; ++n) in_slice += targets[size_t(n)] >= begin && targets[size_t(n)] < begin + c.Vs;
      EXPECT_GT(in_slice, 0) << "no target in the slice: the target logit is untested";
    }
}

TEST(TensorParallelOps, ClassifierCombineMatchesTheReference) {
  const int64_t N = 29;
  for (int parts : {1, 2, 4}) {
    SCOPED_TRACE("parts " + std::to_string(parts));
    Fixture f("cpu");
    Vec sv = random_vector(parts * N * 3, 7, -3, 3);
    for (int64_t i = 0; i < parts * N; ++i) sv[size_t(3 * i + 1)] = std::fabs(sv[size_t(3 * i + 1)]) + 0.5f;
    if (parts > 1)  // a slice without real columns: m = -inf, s = 0, t = 0
      for (int64_t n = 0; n < N; ++n) {
        float* st = &sv[size_t(((parts - 1) * N + n) * 3)];
        st[0] = -std::numeric_limits<float>::infinity(), st[1] = 0.0f, st[2] = 0.0f;
      }
    ClassifierAttrs a;
    a.rows = N, a.parts = parts;
    const TensorId stats = f.make("stats", {parts, N, 3}, DType::f32, sv);
    const TensorId losses = f.tensor("losses", {N}), lse = f.tensor("lse", {N});
    f.run(f.op(OpKind::classifier_combine, {stats}, {losses, lse}, a, {ow, ow}));
    Vec el(N), e_lse(N);
    ref::classifier_combine(sv.data(), el.data(), e_lse.data(), parts, N);
    EXPECT_LE(normalized_error(f.read(losses), el), 1e-6);
    EXPECT_LE(normalized_error(f.read(lse), e_lse), 1e-6);
    // And against the definition, once, by hand: lse = log sum_r s_r e^{m_r}.
    double sum = 0, target = 0;
    for (int r = 0; r < parts; ++r) {
      const float* st = &sv[size_t((r * N) * 3)];
      if (st[1] > 0) sum += double(st[1]) * std::exp(double(st[0]));
      target += st[2];
    }
    EXPECT_NEAR(f.read(lse)[0], std::log(sum), 1e-5);
    EXPECT_NEAR(f.read(losses)[0], std::log(sum) - target, 1e-5);
  }
}

TEST(TensorParallelOps, ClassifierParallelBackwardMatchesTheReference) {
  const ClassifierCase c;
  const auto targets = random_ints(size_t(c.N), int32_t(c.V), 8);
  const float grad_scale = 0.37f, loss_scale = 8.0f;
  for (DType t : {DType::f32, DType::bf16})
    for (DType g : {DType::f32, t})
      for (int64_t begin : {int64_t(0), c.Vs})
        for (int mode = 0; mode < 4; ++mode) {
          if (t == DType::f32 && g != DType::f32) continue;
          const bool acc_dx = mode & 1, acc_dw = mode & 2;
          SCOPED_TRACE(dtype_str(t) + " dw " + dtype_str(g) + " vocab_begin " + std::to_string(begin) +
                       " acc_dx=" + std::to_string(acc_dx) + " acc_dw=" + std::to_string(acc_dw));
          Fixture f("cpu");
          const Vec xv = random_vector(c.N * c.C, 9, -2, 2), wv = random_vector(c.Vs * c.C, 10, -2, 2);
          const Vec lv = plausible_lse(rounded(xv, t), rounded(wv, t), targets, c, begin);
          const Vec dx0 = random_vector(c.N * c.C, 12), dw0 = random_vector(c.Vs * c.C, 13);
          const TensorId x = f.make("x", {c.N, c.C}, t, xv), w = f.make("w", {c.Vs, c.C}, t, wv);
          const TensorId lse = f.make("lse", {c.N}, DType::f32, lv);
          const TensorId dx = f.make("dx", {c.N, c.C}, t, dx0), dw = f.make("dw", {c.Vs, c.C}, g, dw0);
          StepContext ctx;
          ctx.loss_scale = loss_scale;
          f.run(f.op(OpKind::classifier_parallel_backward, {x, w, f.ints("targets", targets), lse}, {dx, dw},
                     slice_attrs(c, begin, grad_scale), {acc_dx ? acc : ow, acc_dw ? acc : ow},
                     {f.tensor("logits", {c.R, c.Vs})}),
                ctx);
          Vec edx = rounded(dx0, t), edw = rounded(dw0, g);
          ref::classifier_parallel_backward(rounded(xv, t).data(), rounded(wv, t).data(), targets.data(), lv.data(),
                                            edx.data(), edw.data(), c.N, c.C, c.V, c.Vs, begin,
                                            double(grad_scale) * loss_scale, acc_dx, acc_dw);
          const double tol = t == DType::f32 ? kFp32Tol : kTwiceRounded;
          EXPECT_LE(normalized_error(f.read(dx), edx), tol);
          EXPECT_LE(normalized_error(f.read(dw), edw), tol);
          if (!acc_dw) {  // padding rows (global column >= V) get exactly nothing
            const Vec got = f.read(dw);
            for (int64_t j = std::max<int64_t>(c.V - begin, 0); j < c.Vs; ++j)
              for (int64_t k = 0; k < c.C; ++k) ASSERT_EQ(got[size_t(j * c.C + k)], 0.0f) << "padding row " << j;
          }
        }
}

TEST(TensorParallelOps, ClassifierParallelBackwardSkipsAbsentOutputsAndResolvesMicroModes) {
  const ClassifierCase c;
  for (const std::string backend : {"cpu", "reference"}) {
    SCOPED_TRACE(backend);
    Fixture f(backend);
    const auto targets = random_ints(size_t(c.N), int32_t(c.V), 14);
    const Vec xv = random_vector(c.N * c.C, 15, -2, 2), wv = random_vector(c.Vs * c.C, 16, -2, 2);
    const Vec lv = plausible_lse(xv, wv, targets, c, c.Vs);
    const TensorId x = f.make("x", {c.N, c.C}, DType::f32, xv), w = f.make("w", {c.Vs, c.C}, DType::f32, wv);
    const TensorId tg = f.ints("targets", targets), lse = f.make("lse", {c.N}, DType::f32, lv);
    const TensorId dx = f.tensor("dx", {c.N, c.C}), dw = f.tensor("dw", {c.Vs, c.C});
    const ClassifierAttrs a = slice_attrs(c, c.Vs, 0.5f);
    const int only_dw = f.op(OpKind::classifier_parallel_backward, {x, w, tg, lse}, {kNoTensor, dw}, a,
                             {ow, WriteMode::accumulate_after_first_micro}, {f.tensor("logits", {c.R, c.Vs})});
    const int only_dx = f.op(OpKind::classifier_parallel_backward, {x, w, tg, lse}, {dx, kNoTensor}, a, {ow, ow},
                             {f.tensor("logits2", {c.R, c.Vs})});
    auto pw = f.prepare(*f.backend, only_dw);
    auto px = f.prepare(*f.backend, only_dx);
    Vec edx(c.N * c.C), edw(c.Vs * c.C);
    for (int micro = 0; micro < 2; ++micro) {
      StepContext ctx;
      ctx.micro = micro, ctx.micro_count = 2;
      pw->run(ctx);
      ref::classifier_parallel_backward(xv.data(), wv.data(), targets.data(), lv.data(), (float*)nullptr, edw.data(),
                                        c.N, c.C, c.V, c.Vs, c.Vs, 0.5, false, micro > 0);
      EXPECT_LE(normalized_error(f.read(dw), edw), kFp32Tol) << "micro " << micro;
    }
    px->run(StepContext{});
    ref::classifier_parallel_backward(xv.data(), wv.data(), targets.data(), lv.data(), edx.data(), (float*)nullptr,
                                      c.N, c.C, c.V, c.Vs, c.Vs, 0.5, false, false);
    EXPECT_LE(normalized_error(f.read(dx), edx), kFp32Tol);
  }
}

// --- the slices together against the fused classifier ---

struct FusedResult {
  Vec losses, dx, dwte;
};

// The fused classifier over wte (parts * Vs rows, V real), dx overwritten and dwte accumulated
// onto dwte0, with a loss scale.
FusedResult run_fused(const std::string& backend, const ClassifierCase& c, int64_t Vp, const Vec& xv, const Vec& wv,
                      const std::vector<int32_t>& targets, const Vec& dwte0, float grad_scale, float loss_scale) {
  Fixture f(backend);
  ClassifierAttrs a;
  a.rows = c.N, a.vocab = c.V, a.chunk_rows = c.R, a.grad_scale = grad_scale;
  const TensorId x = f.make("x", {c.N, c.C}, DType::f32, xv), wte = f.make("wte", {Vp, c.C}, DType::f32, wv);
  const TensorId losses = f.tensor("losses", {c.N}), dx = f.tensor("dx", {c.N, c.C});
  const TensorId dwte = f.make("dwte", {Vp, c.C}, DType::f32, dwte0);
  StepContext ctx;
  ctx.loss_scale = loss_scale;
  f.run(f.op(OpKind::classifier, {x, wte, f.ints("targets", targets)}, {losses, dx, dwte}, a, {ow, ow, acc},
             {f.tensor("logits", {c.R, Vp})}),
        ctx);
  return {f.read(losses), f.read(dx), f.read(dwte)};
}

// The same through `parts` slices of Vs rows each: every slice's classifier_partial, the stats
// concatenated in slice order, classifier_combine, then every slice's
// classifier_parallel_backward (dx overwritten, dw accumulated onto its rows of dwte0).
// Returns the losses, the slices' dx summed and their dw stacked.
FusedResult run_slices(const std::string& backend, const ClassifierCase& c, int parts, const Vec& xv, const Vec& wv,
                       const std::vector<int32_t>& targets, const Vec& dwte0, float grad_scale, float loss_scale,
                       Vec* lse_out = nullptr) {
  Fixture f(backend);
  const TensorId x = f.make("x", {c.N, c.C}, DType::f32, xv), tg = f.ints("targets", targets);
  std::vector<TensorId> w(static_cast<size_t>(parts)), stats(static_cast<size_t>(parts));
  Vec all_stats;
  for (int r = 0; r < parts; ++r) {
    w[size_t(r)] = f.make("w" + std::to_string(r), {c.Vs, c.C}, DType::f32, rows_of(wv, r * c.Vs, c.Vs, c.C));
    stats[size_t(r)] = f.tensor("stats" + std::to_string(r), {c.N, 3});
    f.run(f.op(OpKind::classifier_partial, {x, w[size_t(r)], tg}, {stats[size_t(r)]},
               slice_attrs(c, r * c.Vs, grad_scale), {ow}, {f.tensor("logits" + std::to_string(r), {c.R, c.Vs})}));
    const Vec s = f.read(stats[size_t(r)]);
    all_stats.insert(all_stats.end(), s.begin(), s.end());  // the tensor group's all_gather
  }
  ClassifierAttrs ca;
  ca.rows = c.N, ca.parts = parts;
  const TensorId gathered = f.make("gathered", {parts, c.N, 3}, DType::f32, all_stats);
  const TensorId losses = f.tensor("losses", {c.N}), lse = f.tensor("lse", {c.N});
  f.run(f.op(OpKind::classifier_combine, {gathered}, {losses, lse}, ca, {ow, ow}));
  FusedResult out{f.read(losses), Vec(size_t(c.N * c.C), 0.0f), {}};
  if (lse_out) *lse_out = f.read(lse);
  StepContext ctx;
  ctx.loss_scale = loss_scale;
  for (int r = 0; r < parts; ++r) {
    const TensorId dx = f.tensor("dx" + std::to_string(r), {c.N, c.C});
    const TensorId dw = f.make("dw" + std::to_string(r), {c.Vs, c.C}, DType::f32, rows_of(dwte0, r * c.Vs, c.Vs, c.C));
    f.run(f.op(OpKind::classifier_parallel_backward, {x, w[size_t(r)], tg, lse}, {dx, dw},
               slice_attrs(c, r * c.Vs, grad_scale), {ow, acc}, {f.tensor("blogits" + std::to_string(r), {c.R, c.Vs})}),
          ctx);
    const Vec dxr = f.read(dx), dwr = f.read(dw);
    for (size_t i = 0; i < dxr.size(); ++i) out.dx[i] += dxr[i];  // the tensor group's all_reduce
    out.dwte.insert(out.dwte.end(), dwr.begin(), dwr.end());
  }
  return out;
}

void expect_slices_equal_fused(const std::string& backend, const ClassifierCase& c, int parts, uint32_t seed) {
  const int64_t Vp = parts * c.Vs;
  const auto targets = random_ints(size_t(c.N), int32_t(c.V), seed);
  const Vec xv = random_vector(c.N * c.C, seed + 1, -2, 2), wv = random_vector(Vp * c.C, seed + 2, -2, 2);
  const Vec dwte0 = random_vector(Vp * c.C, seed + 3);
  const float grad_scale = 1.0f / float(c.N), loss_scale = 16.0f;
  const FusedResult fused = run_fused(backend, c, Vp, xv, wv, targets, dwte0, grad_scale, loss_scale);
  Vec lse;
  const FusedResult sliced = run_slices(backend, c, parts, xv, wv, targets, dwte0, grad_scale, loss_scale, &lse);
  EXPECT_LE(normalized_error(sliced.losses, fused.losses), kSliceTol);
  EXPECT_LE(normalized_error(sliced.dx, fused.dx), kSliceTol);
  EXPECT_LE(normalized_error(sliced.dwte, fused.dwte), kSliceTol);
  // The padding rows (global column >= V) received nothing in either: dwte0 is still there.
  for (int64_t i = c.V * c.C; i < Vp * c.C; ++i) ASSERT_EQ(sliced.dwte[size_t(i)], dwte0[size_t(i)]) << i;
  // The gradient is there to compare: the fused dx is not all zero, and lse is a real log-sum-exp.
  EXPECT_GT(normalized_error(fused.dx, Vec(fused.dx.size(), 0.0f)), 0.0);
  for (float l : lse) ASSERT_TRUE(std::isfinite(l));
}

TEST(TensorParallelOps, OneSliceEqualsTheFusedClassifier) {
  ClassifierCase c;
  c.Vs = 112;  // V = 100 real columns and 12 of padding, one slice
  for (const std::string backend : {"cpu", "reference"}) {
    SCOPED_TRACE(backend);
    expect_slices_equal_fused(backend, c, 1, 20);
  }
}

TEST(TensorParallelOps, TwoSlicesWithPaddingEqualTheFusedClassifier) {
  const ClassifierCase c;  // [0, 64) and [64, 128) of V = 100: 28 padding columns in the second
  for (const std::string backend : {"cpu", "reference"}) {
    SCOPED_TRACE(backend);
    expect_slices_equal_fused(backend, c, 2, 30);
  }
}

TEST(TensorParallelOps, ASliceOfOnlyPaddingTakesNoPart) {
  ClassifierCase c;
  c.Vs = 50;  // [0, 50), [50, 100), [100, 150) of V = 100: the third slice is all padding
  for (const std::string backend : {"cpu", "reference"}) {
    SCOPED_TRACE(backend);
    expect_slices_equal_fused(backend, c, 3, 40);
  }
}

// --- embedding over vocabulary slices ---

struct EmbeddingCase {
  int64_t B = 3, T = 7, C = 20, V = 23, Tmax = 9, split = 14;  // slices [0, 14) and [14, 23)
};

EmbeddingAttrs slice_of(int64_t begin, bool positions) {
  EmbeddingAttrs a;
  a.vocab_begin = begin, a.add_positions = positions;
  return a;
}

TEST(TensorParallelOps, EmbeddingSlicesMatchTheReference) {
  const EmbeddingCase e;
  const int64_t N = e.B * e.T;
  const auto tokens = random_ints(size_t(N), int32_t(e.V), 50);
  for (DType t : {DType::f32, DType::bf16})
    for (bool positions : {true, false})
      for (int64_t begin : {int64_t(0), e.split}) {
        SCOPED_TRACE(dtype_str(t) + (positions ? " with" : " without") + " positions, vocab_begin " +
                     std::to_string(begin));
        const int64_t rows = begin == 0 ? e.split : e.V - e.split;
        Fixture f("cpu");
        const TensorId tok = f.tensor("tok", {e.B, e.T}, DType::i32);
        f.set(tok, tokens);
        const Vec wv = random_vector(rows * e.C, 51), pv = random_vector(e.Tmax * e.C, 52);
        const Vec x0 = random_vector(N * e.C, 53), dyv = random_vector(N * e.C, 54);
        const Vec dwte0 = random_vector(rows * e.C, 55), dwpe0 = random_vector(e.Tmax * e.C, 56);
        const TensorId wte = f.make("wte", {rows, e.C}, t, wv), wpe = f.make("wpe", {e.Tmax, e.C}, t, pv);
        const TensorId x = f.make("x", {e.B, e.T, e.C}, t, x0);
        f.run(f.op(OpKind::embedding_forward, {tok, wte, wpe}, {x}, slice_of(begin, positions), {acc}));
        Vec ex = rounded(x0, t);
        ref::embedding_forward(tokens.data(), rounded(wv, t).data(), positions ? rounded(pv, t).data() : nullptr,
                               ex.data(), N, e.T, e.C, true, begin, rows);
        EXPECT_LE(normalized_error(f.read(x), ex), t == DType::f32 ? 1e-7 : kBf16Tol);

        const TensorId dy = f.make("dy", {e.B, e.T, e.C}, t, dyv);
        const TensorId dwte = f.make("dwte", {rows, e.C}, DType::f32, dwte0);
        const TensorId dwpe = f.make("dwpe", {e.Tmax, e.C}, DType::f32, dwpe0);
        f.run(f.op(OpKind::embedding_backward, {dy, tok}, {dwte, dwpe}, slice_of(begin, positions), {acc, ow}));
        Vec edwte = dwte0, edwpe(e.Tmax * e.C);
        ref::embedding_backward(rounded(dyv, t).data(), tokens.data(), edwte.data(), edwpe.data(), N, e.T, e.C, rows,
                                e.Tmax, true, false, begin, true);
        EXPECT_LE(normalized_error(f.read(dwte), edwte), kFp32Tol);
        EXPECT_LE(normalized_error(f.read(dwpe), edwpe), kFp32Tol);
      }
}

TEST(TensorParallelOps, EmbeddingSlicesTogetherEqualTheOneRankOp) {
  const EmbeddingCase e;
  const int64_t N = e.B * e.T;
  auto tokens = random_ints(size_t(N), int32_t(e.V), 60);
  tokens[0] = 0, tokens[1] = int32_t(e.split - 1), tokens[2] = int32_t(e.split), tokens[3] = int32_t(e.V - 1);
  for (const std::string backend : {"cpu", "reference"}) {
    SCOPED_TRACE(backend);
    Fixture f(backend);
    const TensorId tok = f.tensor("tok", {e.B, e.T}, DType::i32);
    f.set(tok, tokens);
    const Vec wv = random_vector(e.V * e.C, 61), pv = random_vector(e.Tmax * e.C, 62);
    const Vec dyv = random_vector(N * e.C, 63);
    const TensorId wpe = f.make("wpe", {e.Tmax, e.C}, DType::f32, pv), dy = f.make("dy", {e.B, e.T, e.C}, DType::f32, dyv);

    // One rank: the whole table.
    const TensorId wte = f.make("wte", {e.V, e.C}, DType::f32, wv), x = f.tensor("x", {e.B, e.T, e.C});
    const TensorId dwte = f.tensor("dwte", {e.V, e.C}), dwpe = f.tensor("dwpe", {e.Tmax, e.C});
    f.run(f.op(OpKind::embedding_forward, {tok, wte, wpe}, {x}, NoAttrs{}, {ow}));
    f.run(f.op(OpKind::embedding_backward, {dy, tok}, {dwte, dwpe}, NoAttrs{}, {ow, ow}));

    // Two ranks: rows [0, split) adding the positions, rows [split, V) leaving them out.
    const int64_t rows1 = e.V - e.split;
    const TensorId wte0 = f.make("wte0", {e.split, e.C}, DType::f32, rows_of(wv, 0, e.split, e.C));
    const TensorId wte1 = f.make("wte1", {rows1, e.C}, DType::f32, rows_of(wv, e.split, rows1, e.C));
    const TensorId x0 = f.tensor("x0", {e.B, e.T, e.C}), x1 = f.tensor("x1", {e.B, e.T, e.C});
    f.set(x0, random_vector(N * e.C, 64)), f.set(x1, random_vector(N * e.C, 65));  // overwritten
    f.run(f.op(OpKind::embedding_forward, {tok, wte0, wpe}, {x0}, slice_of(0, true), {ow}));
    f.run(f.op(OpKind::embedding_forward, {tok, wte1, wpe}, {x1}, slice_of(e.split, false), {ow}));
    const Vec one = f.read(x), a = f.read(x0), b = f.read(x1);
    Vec sum(one.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = a[i] + b[i];  // the tensor group's all_reduce
    // Exact: each element is wte + wpe on one side and 0 (or wpe alone) on the other.
    EXPECT_EQ(sum, one);
    // And not trivially so: each slice's x has rows it leaves to the other (zero rows in x1).
    int zero_rows = 0;
    for (int64_t n = 0; n < N; ++n) zero_rows += tokens[size_t(n)] < e.split && b[size_t(n * e.C)] == 0.0f;
    EXPECT_GT(zero_rows, 0);

    const TensorId dwte0 = f.tensor("dwte0", {e.split, e.C}), dwte1 = f.tensor("dwte1", {rows1, e.C});
    const TensorId dwpe0 = f.tensor("dwpe0", {e.Tmax, e.C}), dwpe1 = f.tensor("dwpe1", {e.Tmax, e.C});
    f.set(dwte0, random_vector(e.split * e.C, 66)), f.set(dwte1, random_vector(rows1 * e.C, 67));
    f.run(f.op(OpKind::embedding_backward, {dy, tok}, {dwte0, dwpe0}, slice_of(0, true), {ow, ow}));
    f.run(f.op(OpKind::embedding_backward, {dy, tok}, {dwte1, dwpe1}, slice_of(e.split, false), {ow, ow}));
    const Vec full = f.read(dwte);
    EXPECT_EQ(f.read(dwte0), rows_of(full, 0, e.split, e.C));
    EXPECT_EQ(f.read(dwte1), rows_of(full, e.split, rows1, e.C));
    EXPECT_EQ(f.read(dwpe0), f.read(dwpe));
    EXPECT_EQ(f.read(dwpe1), f.read(dwpe));  // dwpe from dy even where the forward left wpe out

    // A slice without a dwpe output writes dwte alone.
    const TensorId dwte1b = f.tensor("dwte1b", {rows1, e.C});
    f.run(f.op(OpKind::embedding_backward, {dy, tok}, {dwte1b}, slice_of(e.split, false), {ow}));
    EXPECT_EQ(f.read(dwte1b), rows_of(full, e.split, rows1, e.C));
  }
}

TEST(TensorParallelOps, OneRankEmbeddingStillRefusesTokensOutsideTheTable) {
  // NoAttrs keeps the one-rank check (a token past the table is a bug, not another rank's).
  // The death tests re-run the test in a fresh process: the OpenMP threads make a fork unsafe.
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  const int64_t B = 1, T = 4, C = 8, V = 5;
  Fixture f("cpu");
  const TensorId tok = f.tensor("tok", {B, T}, DType::i32);
  f.set(tok, std::vector<int32_t>{0, 1, 2, int32_t(V)});
  const TensorId wte = f.make("wte", {V, C}, DType::f32, random_vector(V * C, 70));
  const TensorId x = f.tensor("x", {B, T, C});
  const int one_rank = f.op(OpKind::embedding_forward, {tok, wte}, {x}, NoAttrs{}, {ow});
  EXPECT_DEATH(f.run(one_rank), "outside");
  // With EmbeddingAttrs the same token is simply another rank's; a negative one is still refused.
  f.run(f.op(OpKind::embedding_forward, {tok, wte}, {x}, slice_of(0, true), {ow}));
  const Vec got = f.read(x);
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(got[size_t(3 * C + c)], 0.0f);
  f.set(tok, std::vector<int32_t>{0, 1, -1, 2});
  const int negative = f.op(OpKind::embedding_forward, {tok, wte}, {x}, slice_of(0, true), {ow});
  EXPECT_DEATH(f.run(negative), "negative");
}

}  // namespace
}  // namespace memfit
