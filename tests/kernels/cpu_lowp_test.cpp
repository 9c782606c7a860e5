// The 16-bit kernels of the CPU backend (bf16 and fp16 storage, fp32 arithmetic) against the
// fp32/double references, driven through the backend like the executor drives them (so the
// dtype dispatch of prepare() is under test too).
//
// Oracle: inputs are rounded to the 16-bit type first, and the reference runs in double on
// exactly those (widened) values; what remains is the kernel's own rounding.
// Tolerances (max |kernel - ref| / max |ref|):
//   * 16-bit outputs: one rounding of each stored element, half a unit in the last place:
//     2^-9 relative for bf16, 2^-12 for fp16, plus fp32 arithmetic; we allow 2^-8 and 2^-10.
//   * fp32 outputs of bf16 products (parameter gradients, logits): bf16 x bf16 products are
//     exact in fp32, so only the fp32 sums' rounding remains: 1e-5, as for fp32 kernels.
//   * Outputs computed from an intermediate rounded to 16 bits (attention's probabilities and
//     d(scores), the classifier's d(logits)): that rounding propagates through one more sum of
//     terms of mixed signs; we allow 4 units (2^-6 = 1.6e-2 for bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/reference/reference.hpp"
#include "program_fixture.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::random_ints;
using test::random_vector;
using Vec = std::vector<float>;

double tol16(DType t) { return t == DType::bf16 ? 0x1p-8 : 0x1p-10; }
constexpr double kFp32Tol = 1e-5;
constexpr double kTwiceRounded = 0x1p-6;

// A ProgramFixture whose tensors are filled from and read as fp32, whatever their dtype.
struct Lowp : test::ProgramFixture {
  std::unique_ptr<Backend> backend = make_cpu_backend();

  // A tensor of `dtype` holding `values` rounded to it.
  TensorId make(const std::string& name, Shape shape, DType dtype, const Vec& values) {
    const TensorId id = tensor(name, std::move(shape), dtype);
    write(id, values);
    return id;
  }
  void write(TensorId id, const Vec& values) {
    EXPECT_EQ(int64_t(values.size()), program.tensor(id).numel());
    visit_float_type(program.tensor(id).dtype, [&](auto t) {
      using T = decltype(t);
      T* d = data<T>(id);
      for (size_t i = 0; i < values.size(); ++i) d[i] = narrow<T>(values[i]);
    });
  }
  Vec read(TensorId id) {
    Vec out(size_t(program.tensor(id).numel()));
    visit_float_type(program.tensor(id).dtype, [&](auto t) {
      using T = decltype(t);
      const T* d = data<T>(id);
      for (size_t i = 0; i < out.size(); ++i) out[i] = widen(d[i]);
    });
    return out;
  }
  void run(int op, WriteMode mode = WriteMode::overwrite, int micro = 0) {
    StepContext ctx;
    ctx.micro = micro;
    ctx.micro_count = 2;
    (void)mode;
    prepare(*backend, op)->run(ctx);
  }
};

std::string name(DType t) { return std::string(dtype_name(t)); }

TEST(CpuLowp, EmbeddingForwardAndBackward) {
  for (DType t : {DType::bf16, DType::f16})
    for (DType g : {DType::f32, t}) {
      SCOPED_TRACE(name(t) + " gradients " + name(g));
      Lowp f;
      const int64_t B = 3, T = 11, C = 40, V = 97, Tmax = 16;
      const auto toks = random_ints(B * T, int32_t(V), 1);
      const TensorId tok = f.tensor("tok", {B, T}, DType::i32);
      f.set(tok, toks);
      const TensorId wte = f.make("wte", {V, C}, t, random_vector(V * C, 2));
      const TensorId wpe = f.make("wpe", {Tmax, C}, t, random_vector(Tmax * C, 3));
      const TensorId x = f.make("x", {B, T, C}, t, Vec(B * T * C, 0.0f));
      f.run(f.op(OpKind::embedding_forward, {tok, wte, wpe}, {x}));
      Vec ex(B * T * C);
      const Vec wv = f.read(wte), pv = f.read(wpe);
      ref::embedding_forward(toks.data(), wv.data(), pv.data(), ex.data(), B * T, T, C, false);
      EXPECT_LE(normalized_error(f.read(x), ex), tol16(t));

      const TensorId dx = f.make("dx", {B, T, C}, t, random_vector(B * T * C, 4));
      const Vec dwte0 = random_vector(V * C, 5), dwpe0 = random_vector(Tmax * C, 6);
      const TensorId dwte = f.make("dwte", {V, C}, g, dwte0), dwpe = f.make("dwpe", {Tmax, C}, g, dwpe0);
      Vec edwte = f.read(dwte), edwpe = f.read(dwpe);
      f.run(f.op(OpKind::embedding_backward, {dx, tok}, {dwte, dwpe}, NoAttrs{},
                 {WriteMode::accumulate, WriteMode::accumulate}));
      const Vec dxv = f.read(dx);
      ref::embedding_backward(dxv.data(), toks.data(), edwte.data(), edwpe.data(), B * T, T, C, V, Tmax, true, true);
      // A 16-bit dwte is rounded once per token that hits its row (embedding.hpp): ~2 here.
      const double tol = g == DType::f32 ? kFp32Tol : 2 * tol16(g);
      EXPECT_LE(normalized_error(f.read(dwte), edwte), tol);
      EXPECT_LE(normalized_error(f.read(dwpe), edwpe), g == DType::f32 ? kFp32Tol : tol16(g));
    }
}

TEST(CpuLowp, LayerNormForwardAndBackward) {
  for (DType t : {DType::bf16, DType::f16})
    for (DType g : {DType::f32, t}) {
      SCOPED_TRACE(name(t) + " gradients " + name(g));
      Lowp f;
      const int64_t N = 37, C = 130;
      const TensorId x = f.make("x", {N, C}, t, random_vector(N * C, 1, -3, 3));
      const TensorId w = f.make("w", {C}, t, random_vector(C, 2));
      const TensorId b = f.make("b", {C}, t, random_vector(C, 3));
      const TensorId y = f.make("y", {N, C}, t, Vec(N * C));
      const TensorId mean = f.tensor("mean", {N}), rstd = f.tensor("rstd", {N});
      f.run(f.op(OpKind::layernorm_forward, {x, w, b}, {y, mean, rstd}, NormAttrs{1e-5f}));
      const Vec xv = f.read(x), wv = f.read(w), bv = f.read(b);
      Vec ey(N * C), emean(N), erstd(N);
      ref::layernorm_forward(xv.data(), wv.data(), bv.data(), ey.data(), emean.data(), erstd.data(), N, C, 1e-5);
      EXPECT_LE(normalized_error(f.read(y), ey), tol16(t));
      EXPECT_LE(normalized_error(f.get(mean), emean), kFp32Tol);  // statistics stay fp32
      EXPECT_LE(normalized_error(f.get(rstd), erstd), kFp32Tol);

      const TensorId dy = f.make("dy", {N, C}, t, random_vector(N * C, 4));
      const TensorId dx = f.make("dx", {N, C}, t, Vec(N * C));
      const TensorId dw = f.make("dw", {C}, g, random_vector(C, 5)), db = f.make("db", {C}, g, random_vector(C, 6));
      Vec edx(N * C), edw = f.read(dw), edb = f.read(db);
      f.run(f.op(OpKind::layernorm_backward, {dy, x, w, mean, rstd}, {dx, dw, db}, NormAttrs{1e-5f},
                 {WriteMode::overwrite, WriteMode::accumulate, WriteMode::accumulate}));
      const Vec dyv = f.read(dy), mv = f.get(mean), rv = f.get(rstd);
      ref::layernorm_backward(dyv.data(), xv.data(), wv.data(), mv.data(), rv.data(), edx.data(), edw.data(),
                              edb.data(), N, C, false, true, true);
      EXPECT_LE(normalized_error(f.read(dx), edx), tol16(t));
      EXPECT_LE(normalized_error(f.read(dw), edw), g == DType::f32 ? kFp32Tol : tol16(g));
      EXPECT_LE(normalized_error(f.read(db), edb), g == DType::f32 ? kFp32Tol : tol16(g));
    }
}

TEST(CpuLowp, GeluAddAccumulateBiasGradAndCasts) {
  const int64_t M = 33, N = 70, n = M * N;
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(name(t));
    Lowp f;
    const TensorId x = f.make("x", {M, N}, t, random_vector(n, 1, -4, 4));
    const TensorId dy = f.make("dy", {M, N}, t, random_vector(n, 2));
    const Vec y0 = random_vector(n, 3);
    const TensorId y = f.make("y", {M, N}, t, y0), dx = f.make("dx", {M, N}, t, Vec(n));
    const Vec xv = f.read(x), dyv = f.read(dy);
    Vec ey = f.read(y), edx(n);
    f.run(f.op(OpKind::gelu_forward, {x}, {y}, NoAttrs{}, {WriteMode::accumulate}));
    ref::gelu_forward(xv.data(), ey.data(), n, true);
    EXPECT_LE(normalized_error(f.read(y), ey), tol16(t));
    f.run(f.op(OpKind::gelu_backward, {dy, x}, {dx}));
    ref::gelu_backward(dyv.data(), xv.data(), edx.data(), n, false);
    EXPECT_LE(normalized_error(f.read(dx), edx), tol16(t));

    const TensorId s = f.make("s", {M, N}, t, Vec(n));
    Vec es(n);
    f.run(f.op(OpKind::add, {x, dy}, {s}));
    ref::add(xv.data(), dyv.data(), es.data(), n, false);
    EXPECT_LE(normalized_error(f.read(s), es), tol16(t));

    for (DType g : {DType::f32, t}) {
      const TensorId db = f.make("db" + name(g), {N}, g, random_vector(N, 4));
      Vec edb = f.read(db);
      f.run(f.op(OpKind::bias_grad, {dy}, {db}, NoAttrs{}, {WriteMode::accumulate}));
      ref::bias_grad(dyv.data(), edb.data(), M, N, true);
      EXPECT_LE(normalized_error(f.read(db), edb), g == DType::f32 ? kFp32Tol : tol16(g)) << "bias_grad " << name(g);
    }
    // Casts between every pair, overwrite and accumulate; accumulate is also the kind
    // `accumulate` between two types.
    for (DType from : {DType::f32, DType::bf16, DType::f16})
      for (DType to : {DType::f32, DType::bf16, DType::f16})
        for (OpKind kind : {OpKind::cast, OpKind::accumulate})
          for (WriteMode mode : {WriteMode::overwrite, WriteMode::accumulate}) {
            const TensorId a = f.make("a", {n}, from, random_vector(n, 5, -70000, 70000));
            const TensorId z = f.make("z", {n}, to, random_vector(n, 6, -100, 100));
            const Vec av = f.read(a);
            Vec ez = f.read(z);
            f.run(f.op(kind, {a}, {z}, NoAttrs{}, {mode}));
            const Vec got = f.read(z);
            for (int64_t i = 0; i < n; ++i) {
              // Exactly one rounding of the fp32 result, with inf beyond the type's range.
              const float want32 = mode == WriteMode::accumulate ? ez[size_t(i)] + av[size_t(i)] : av[size_t(i)];
              float want = want32;
              if (to == DType::bf16) want = widen(bf16_t{ref::round_to_bf16_bits(want32)});
              if (to == DType::f16) want = widen(fp16_t{ref::round_to_fp16_bits(want32)});
              ASSERT_EQ(got[size_t(i)], want) << name(from) << " -> " << name(to) << " element " << i;
            }
          }
  }
}

struct MmCase {
  int64_t m, n, k;
  bool ta, tb, bias;
  float alpha;
};

TEST(CpuLowp, Bf16MatmulAccumulatesInFp32) {
  const std::vector<MmCase> cases = {{33, 17, 65, false, true, true, 1.0f}, {16, 31, 9, true, false, false, 0.5f},
                                     {13, 11, 129, true, true, true, -0.25f}, {64, 2100, 96, false, false, true, 1.0f},
                                     {96, 48, 64, true, false, false, 1.0f}};
  for (const MmCase& c : cases)
    for (DType out : {DType::bf16, DType::f32})
      for (WriteMode mode : {WriteMode::overwrite, WriteMode::accumulate_after_first_micro}) {
        SCOPED_TRACE(testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.ta << " tb=" << c.tb
                                        << " bias=" << c.bias << " out=" << name(out) << " mode=" << int(mode));
        Lowp f;
        MatmulAttrs a;
        a.m = c.m, a.n = c.n, a.k = c.k, a.trans_a = c.ta, a.trans_b = c.tb, a.alpha = c.alpha;
        const TensorId A = f.make("A", {c.m * c.k}, DType::bf16, random_vector(c.m * c.k, 1));
        const TensorId B = f.make("B", {c.k * c.n}, DType::bf16, random_vector(c.k * c.n, 2));
        const TensorId bias = f.make("bias", {c.n}, DType::bf16, random_vector(c.n, 3));
        const TensorId C = f.make("C", {c.m * c.n}, out, random_vector(c.m * c.n, 4));
        std::vector<TensorId> in = {A, B};
        if (c.bias) in.push_back(bias);
        const int op = f.op(OpKind::matmul, in, {C}, a, {mode});
        auto prepared = f.prepare(*f.backend, op);
        const Vec Av = f.read(A), Bv = f.read(B), biasv = f.read(bias);
        Vec expect(c.m * c.n);
        for (int micro = 0; micro < 2; ++micro) {
          StepContext ctx;
          ctx.micro = micro;
          prepared->run(ctx);
          const bool acc = mode == WriteMode::accumulate_after_first_micro && micro > 0;
          ref::matmul(Av.data(), Bv.data(), c.bias ? biasv.data() : nullptr, expect.data(), c.m, c.n, c.k, c.ta, c.tb,
                      double(c.alpha), acc);
          EXPECT_LE(normalized_error(f.read(C), expect), out == DType::f32 ? kFp32Tol : tol16(out)) << "micro " << micro;
          expect = f.read(C);  // the next micro-step adds to what is stored
        }
      }
}

TEST(CpuLowp, Bf16AttentionForwardAndBackward) {
  // T = 130 and 259: 2 and 4 uneven causal blocks.
  for (auto [B, T, NH, HS] : {std::tuple{2, 33, 2, 16}, std::tuple{1, 130, 2, 8}, std::tuple{1, 259, 3, 16}})
    for (WriteMode mode : {WriteMode::overwrite, WriteMode::accumulate}) {
      SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " NH=" << NH << " HS=" << HS << " mode=" << int(mode));
      Lowp f;
      const int64_t C = NH * HS;
      AttentionAttrs attrs;
      attrs.batch = B, attrs.seq = T, attrs.heads = NH, attrs.kv_heads = NH, attrs.head_dim = HS;
      attrs.scale = 1.0f / std::sqrt(float(HS));
      const TensorId qkv = f.make("qkv", {B, T, 3 * C}, DType::bf16, random_vector(B * T * 3 * C, 1, -2, 2));
      const TensorId y = f.make("y", {B, T, C}, DType::bf16, random_vector(B * T * C, 2));
      // probs starts as garbage: masked entries must come out as exact zeros.
      const TensorId probs = f.make("probs", {B, NH, T, T}, DType::bf16, random_vector(B * NH * T * T, 3));
      const TensorId dy = f.make("dy", {B, T, C}, DType::bf16, random_vector(B * T * C, 4));
      const TensorId dqkv = f.make("dqkv", {B, T, 3 * C}, DType::bf16, random_vector(B * T * 3 * C, 5));
      const TensorId dprobs = f.tensor("dprobs", {B, NH, T, T});
      Vec ey = f.read(y), edqkv = f.read(dqkv), eprobs(B * NH * T * T);
      f.run(f.op(OpKind::attention_forward, {qkv}, {y, probs}, attrs, {mode, WriteMode::overwrite}));
      f.run(f.op(OpKind::attention_backward, {dy, qkv, probs}, {dqkv}, attrs, {mode}, {dprobs}));
      const Vec qv = f.read(qkv), dyv = f.read(dy);
      ref::attention_forward(qv.data(), ey.data(), eprobs.data(), B, T, NH, HS, double(attrs.scale),
                             mode == WriteMode::accumulate);
      ref::attention_backward(dyv.data(), qv.data(), eprobs.data(), edqkv.data(), B, T, NH, HS, double(attrs.scale),
                              mode == WriteMode::accumulate);
      const Vec pv = f.read(probs);
      EXPECT_LE(normalized_error(pv, eprobs), tol16(DType::bf16));
      EXPECT_LE(normalized_error(f.read(y), ey), kTwiceRounded);
      EXPECT_LE(normalized_error(f.read(dqkv), edqkv), kTwiceRounded);
      for (int64_t r = 0; r < B * NH * T; ++r)
        for (int64_t s = r % T + 1; s < T; ++s) ASSERT_EQ(pv[size_t(r * T + s)], 0.0f) << "row " << r << " col " << s;
    }
}

TEST(CpuLowp, Bf16ClassifierWithChunksAndModes) {
  const int64_t N = 200, C = 48, V = 250, Vp = 256, R = 64;  // chunks of 64, 64, 64 and a tail of 8
  for (DType g : {DType::f32, DType::bf16})
    for (int mode = 0; mode < 4; ++mode) {
      const bool acc_dx = mode & 1, acc_dwte = mode & 2;
      SCOPED_TRACE(testing::Message() << "dwte " << name(g) << " acc_dx=" << acc_dx << " acc_dwte=" << acc_dwte);
      Lowp f;
      const TensorId x = f.make("x", {N, C}, DType::bf16, random_vector(N * C, 1, -2, 2));
      const TensorId wte = f.make("wte", {Vp, C}, DType::bf16, random_vector(Vp * C, 2, -2, 2));
      auto targets = random_ints(N, int32_t(V), 3);
      targets[0] = int32_t(V - 1);
      const TensorId tg = f.tensor("targets", {N}, DType::i32);
      f.set(tg, targets);
      const TensorId losses = f.tensor("losses", {N});
      const TensorId dx = f.make("dx", {N, C}, DType::bf16, random_vector(N * C, 4));
      const TensorId dwte = f.make("dwte", {Vp, C}, g, random_vector(Vp * C, 5));
      const TensorId chunk = f.tensor("logits", {R, Vp});
      ClassifierAttrs a;
      a.rows = N, a.vocab = V, a.chunk_rows = R, a.grad_scale = 0.37f;
      Vec edx = f.read(dx), edwte = f.read(dwte), elosses(N);
      const auto wm = [](bool acc) { return acc ? WriteMode::accumulate : WriteMode::overwrite; };
      f.run(f.op(OpKind::classifier, {x, wte, tg}, {losses, dx, dwte}, a,
                 {WriteMode::overwrite, wm(acc_dx), wm(acc_dwte)}, {chunk}));
      const Vec xv = f.read(x), wv = f.read(wte);
      ref::classifier(xv.data(), wv.data(), targets.data(), elosses.data(), edx.data(), edwte.data(), N, C, V, Vp,
                      0.37, acc_dx, acc_dwte);
      EXPECT_LE(normalized_error(f.get(losses), elosses), kFp32Tol);  // the loss is fp32 from exact products
      EXPECT_LE(normalized_error(f.read(dx), edx), kTwiceRounded);
      EXPECT_LE(normalized_error(f.read(dwte), edwte), kTwiceRounded);
      if (!acc_dwte) {
        const Vec got = f.read(dwte);
        for (int64_t i = V * C; i < Vp * C; ++i) ASSERT_EQ(got[size_t(i)], 0.0f) << "padding row element " << i;
      }
    }
}

TEST(CpuLowp, AdamWUnscales16BitGradients) {
  for (DType g : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(name(g));
    Lowp f;
    const int64_t n = 1000;
    const float scale = 1024;
    const Vec grad = random_vector(n, 1, -1e-3, 1e-3);
    Vec scaled(n);
    for (int64_t i = 0; i < n; ++i) scaled[size_t(i)] = grad[size_t(i)] * scale;
    const TensorId gt = f.make("g", {n}, g, scaled);
    const TensorId p = f.make("p", {n}, DType::f32, random_vector(n, 2));
    const TensorId m = f.make("m", {n}, DType::f32, random_vector(n, 3, -1e-4, 1e-4));
    const TensorId v = f.make("v", {n}, DType::f32, random_vector(n, 4, 0, 1e-6));
    Vec ep = f.get(p), em = f.get(m), ev = f.get(v);
    AdamWAttrs a;
    a.weight_decay = {0.1f};
    const int op = f.op(OpKind::adamw, {gt}, {p, m, v}, a,
                        {WriteMode::update, WriteMode::update, WriteMode::update});
    StepContext ctx;
    ctx.step = 3;
    ctx.lr = 1e-3;
    ctx.loss_scale = scale;
    f.prepare(*f.backend, op)->run(ctx);
    // The reference sees the stored (rounded) gradient divided by the scale, in double.
    Vec unscaled = f.read(gt);
    for (float& x : unscaled) x /= scale;
    ref::adamw(ep.data(), unscaled.data(), em.data(), ev.data(), n, 1e-3, 0.9, 0.999, 1e-8, 0.1, 3);
    EXPECT_LE(normalized_error(f.get(p), ep), 1e-6);
    EXPECT_LE(normalized_error(f.get(m), em), 1e-6);
    EXPECT_LE(normalized_error(f.get(v), ev), 1e-6);
  }
}

TEST(CpuLowp, CheckFiniteFindsInfAndNaNAnywhere) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    Lowp f;
    const int64_t n = 100000;  // more than one thread's share
    const TensorId a = f.make("a", {n}, t, random_vector(n, 1, -60000, 60000));
    const TensorId b = f.make("b", {77}, DType::f32, random_vector(77, 2));
    const TensorId flag = f.tensor("flag", {1});
    const int op = f.op(OpKind::check_finite, {a, b}, {flag});
    auto prepared = f.prepare(*f.backend, op);
    prepared->run(StepContext{});
    EXPECT_EQ(f.get(flag)[0], 0.0f) << name(t);
    for (int64_t at : {int64_t(0), n / 2 + 1, n - 1})
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        Vec values = f.read(a);
        values[size_t(at)] = bad;
        f.write(a, values);
        prepared->run(StepContext{});
        EXPECT_EQ(f.get(flag)[0], 1.0f) << name(t) << " at " << at << " value " << bad;
        values[size_t(at)] = 1.0f;
        f.write(a, values);
      }
    Vec bv = f.get(b);
    bv[76] = NAN;
    f.set(b, bv);
    prepared->run(StepContext{});
    EXPECT_EQ(f.get(flag)[0], 1.0f) << "in the second tensor";
  }
}

}  // namespace
}  // namespace memfit
