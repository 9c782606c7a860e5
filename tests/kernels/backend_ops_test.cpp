// Each backend (kernels/backend.hpp make_backend: cpu, reference) driven the way the executor
// drives it, in the manner of ggml's test-backend-ops: the same tests run on every backend
// (BackendOps, parameterised by the backend's name). A hand-built Program, prepare() with a
// binding into buffers, run() with a StepContext. Checks that shapes and attributes are
// read from the program, that write modes are resolved per micro-step, that absent outputs
// are skipped, and that unsupported ops fail at prepare time with the op named. Kernel
// accuracy is covered by the other kernel tests; the tolerances here are the same
// (normalised max error 1e-5 for GEMM-based ops, 1e-6 for elementwise and row ops).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "kernels/reference/reference.hpp"
#include "program_fixture.hpp"

namespace memfit {
namespace {

using test::normalized_error;
using test::ProgramFixture;
using test::random_ints;
using test::random_vector;
using Vec = std::vector<float>;

constexpr double kGemmTol = 1e-5;
constexpr double kRowTol = 1e-5;

// The backends every BackendOps test runs on.
class BackendOps : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Backends, BackendOps, ::testing::Values("cpu", "reference"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

StepContext micro(int index) {
  StepContext ctx;
  ctx.micro = index;
  ctx.micro_count = 2;
  return ctx;
}

TEST_P(BackendOps, LinearLayerMatmulWithMicroStepModes) {
  auto backend = make_backend(GetParam());
  EXPECT_EQ(backend->name(), GetParam());
  ProgramFixture f;
  const int64_t N = 24, in = 19, out = 33;
  const TensorId x = f.tensor("x", {N, in}), w = f.tensor("w", {out, in}), b = f.tensor("b", {out});
  const TensorId y = f.tensor("y", {N, out});
  MatmulAttrs a;
  a.m = N, a.n = out, a.k = in, a.trans_b = true;
  const int op = f.op(OpKind::matmul, {x, w, b}, {y}, a, {WriteMode::accumulate_after_first_micro});
  const Vec xv = random_vector(N * in, 1), wv = random_vector(out * in, 2), bv = random_vector(out, 3);
  f.set(x, xv), f.set(w, wv), f.set(b, bv), f.set(y, random_vector(N * out, 4));
  auto prepared = f.prepare(*backend, op);

  Vec expect(N * out);
  ref::matmul(xv.data(), wv.data(), bv.data(), expect.data(), N, out, in, false, true, 1.0, false);
  prepared->run(micro(0));  // first micro-step overwrites the garbage in y
  EXPECT_LE(normalized_error(f.get(y), expect), kGemmTol);
  ref::matmul(xv.data(), wv.data(), bv.data(), expect.data(), N, out, in, false, true, 1.0, true);
  prepared->run(micro(1));  // later ones accumulate
  EXPECT_LE(normalized_error(f.get(y), expect), kGemmTol);
}

TEST_P(BackendOps, AttentionForwardAndBackward) {
  auto backend = make_backend(GetParam());
  ProgramFixture f;
  const int64_t B = 2, T = 13, NH = 3, HS = 8, C = NH * HS;
  AttentionAttrs a;
  a.batch = B, a.seq = T, a.heads = NH, a.kv_heads = NH, a.head_dim = HS, a.scale = 1.0f / std::sqrt(float(HS));
  const TensorId qkv = f.tensor("qkv", {B, T, 3 * C}), y = f.tensor("y", {B, T, C});
  const TensorId probs = f.tensor("probs", {B, NH, T, T}), dy = f.tensor("dy", {B, T, C});
  const TensorId dqkv = f.tensor("dqkv", {B, T, 3 * C}), dprobs = f.tensor("dprobs", {B, NH, T, T});
  const int fwd = f.op(OpKind::attention_forward, {qkv}, {y, probs}, a);
  const int bwd = f.op(OpKind::attention_backward, {dy, qkv, probs}, {dqkv}, a, {WriteMode::accumulate}, {dprobs});
  const Vec qkvv = random_vector(B * T * 3 * C, 5, -2, 2), dyv = random_vector(B * T * C, 6);
  const Vec dqkv0 = random_vector(B * T * 3 * C, 7);
  f.set(qkv, qkvv), f.set(dy, dyv), f.set(dqkv, dqkv0);
  auto pf = f.prepare(*backend, fwd);
  auto pb = f.prepare(*backend, bwd);
  pf->run(StepContext{});
  pb->run(StepContext{});
  Vec ey(B * T * C), eprobs(B * NH * T * T), edqkv = dqkv0;
  ref::attention_forward(qkvv.data(), ey.data(), eprobs.data(), B, T, NH, HS, double(a.scale), false);
  ref::attention_backward(dyv.data(), qkvv.data(), eprobs.data(), edqkv.data(), B, T, NH, HS, double(a.scale), true);
  EXPECT_LE(normalized_error(f.get(y), ey), kGemmTol);
  EXPECT_LE(normalized_error(f.get(probs), eprobs), kGemmTol);
  EXPECT_LE(normalized_error(f.get(dqkv), edqkv), kGemmTol);
}

TEST_P(BackendOps, ClassifierUsesLossScaleAndFirstChunkMode) {
  auto backend = make_backend(GetParam());
  ProgramFixture f;
  const int64_t N = 11, C = 9, V = 21, Vp = 24, R = 4;
  ClassifierAttrs a;
  a.rows = N, a.vocab = V, a.chunk_rows = R, a.grad_scale = 1.0f / float(N);
  const TensorId x = f.tensor("x", {N, C}), wte = f.tensor("wte", {Vp, C});
  const TensorId targets = f.tensor("targets", {N}, DType::i32), losses = f.tensor("losses", {N});
  const TensorId dx = f.tensor("dx", {N, C}), dwte = f.tensor("dwte", {Vp, C}), logits = f.tensor("logits", {R, Vp});
  const int op = f.op(OpKind::classifier, {x, wte, targets}, {losses, dx, dwte}, a,
                      {WriteMode::overwrite, WriteMode::overwrite, WriteMode::accumulate_after_first_micro}, {logits});
  const Vec xv = random_vector(N * C, 8, -2, 2), wv = random_vector(Vp * C, 9, -2, 2);
  const auto tv = random_ints(N, int32_t(V), 10);
  f.set(x, xv), f.set(wte, wv), f.set(targets, tv), f.set(dwte, random_vector(Vp * C, 11));
  auto prepared = f.prepare(*backend, op);

  StepContext ctx = micro(0);
  ctx.loss_scale = 4.0f;
  const double dscale = double(a.grad_scale) * 4.0;
  prepared->run(ctx);
  Vec el(N), edx(N * C), edwte(Vp * C);
  ref::classifier(xv.data(), wv.data(), tv.data(), el.data(), edx.data(), edwte.data(), N, C, V, Vp, dscale, false,
                  false);
  EXPECT_LE(normalized_error(f.get(losses), el), kGemmTol);
  EXPECT_LE(normalized_error(f.get(dx), edx), kGemmTol);
  EXPECT_LE(normalized_error(f.get(dwte), edwte), kGemmTol);
  prepared->run(micro(1));  // loss_scale 1 now; dwte accumulates from the first chunk on
  ref::classifier(xv.data(), wv.data(), tv.data(), el.data(), edx.data(), edwte.data(), N, C, V, Vp,
                  double(a.grad_scale), false, true);
  EXPECT_LE(normalized_error(f.get(dx), edx), kGemmTol);
  EXPECT_LE(normalized_error(f.get(dwte), edwte), kGemmTol);
}

TEST_P(BackendOps, ClassifierEvalAndAbsentOutputs) {
  auto backend = make_backend(GetParam());
  ProgramFixture f;
  const int64_t N = 7, C = 5, V = 10, Vp = 16, R = 3;
  ClassifierAttrs a;
  a.rows = N, a.vocab = V, a.chunk_rows = R, a.grad_scale = 0.5f;
  const TensorId x = f.tensor("x", {N, C}), wte = f.tensor("wte", {Vp, C});
  const TensorId targets = f.tensor("targets", {N}, DType::i32), losses = f.tensor("losses", {N});
  const TensorId losses2 = f.tensor("losses2", {N}), dwte = f.tensor("dwte", {Vp, C});
  const TensorId logits = f.tensor("logits", {R, Vp});
  const int eval = f.op(OpKind::classifier_eval, {x, wte, targets}, {losses}, a, {}, {logits});
  // Training without dx (a frozen input): that output is kNoTensor.
  const int train = f.op(OpKind::classifier, {x, wte, targets}, {losses2, kNoTensor, dwte}, a, {}, {logits});
  const Vec xv = random_vector(N * C, 12, -2, 2), wv = random_vector(Vp * C, 13, -2, 2);
  const auto tv = random_ints(N, int32_t(V), 14);
  f.set(x, xv), f.set(wte, wv), f.set(targets, tv);
  f.prepare(*backend, eval)->run(StepContext{});
  f.prepare(*backend, train)->run(StepContext{});
  Vec el(N), edwte(Vp * C);
  ref::classifier(xv.data(), wv.data(), tv.data(), el.data(), (float*)nullptr, edwte.data(), N, C, V, Vp, 0.5, false,
                  false);
  EXPECT_LE(normalized_error(f.get(losses), el), kGemmTol);
  EXPECT_LE(normalized_error(f.get(losses2), el), kGemmTol);
  EXPECT_LE(normalized_error(f.get(dwte), edwte), kGemmTol);
}

// The row-wise, elementwise and optimizer ops through the backend, chained like a tiny
// model: embedding -> layernorm -> gelu -> add, then their backwards, loss_mean, fill and
// adamw.
TEST_P(BackendOps, RowAndElementwiseOpsReadShapesFromTheProgram) {
  auto backend = make_backend(GetParam());
  ProgramFixture f;
  const int64_t B = 2, T = 5, C = 13, Vp = 17, Tmax = 8, N = B * T;
  const TensorId tokens = f.tensor("tokens", {B, T}, DType::i32), wte = f.tensor("wte", {Vp, C});
  const TensorId wpe = f.tensor("wpe", {Tmax, C}), x = f.tensor("x", {B, T, C});
  const TensorId lw = f.tensor("ln.w", {C}), lb = f.tensor("ln.b", {C}), h = f.tensor("h", {B, T, C});
  const TensorId g = f.tensor("g", {B, T, C}), r = f.tensor("r", {B, T, C});
  const TensorId dh = f.tensor("dh", {B, T, C});
  const TensorId dwte = f.tensor("dwte", {Vp, C}), dwpe = f.tensor("dwpe", {Tmax, C});
  const TensorId bg = f.tensor("bg", {C}), loss = f.tensor("loss", {1}), m = f.tensor("m", {Vp, C});
  const TensorId v = f.tensor("v", {Vp, C});
  NormAttrs norm;
  norm.eps = 1e-5f;
  AdamWAttrs adam;
  adam.weight_decay = {0.1f};
  std::vector<int> ops = {
      f.op(OpKind::embedding_forward, {tokens, wte, wpe}, {x}),
      f.op(OpKind::layernorm_forward, {x, lw, lb}, {h, kNoTensor, kNoTensor}, norm),  // stats not kept
      f.op(OpKind::gelu_forward, {h}, {g}),
      f.op(OpKind::add, {g, x}, {r}),
      f.op(OpKind::accumulate, {r}, {dh}),
      f.op(OpKind::gelu_backward, {dh, h}, {dh}),  // in place
      f.op(OpKind::bias_grad, {dh}, {bg}, NoAttrs{}, {WriteMode::accumulate}),
      f.op(OpKind::embedding_backward, {dh, tokens}, {dwte, dwpe}),
      f.op(OpKind::loss_mean, {bg}, {loss}, ScaleAttrs{0.5f}),
      f.op(OpKind::fill, {}, {m}, FillAttrs{0.0f}),
      f.op(OpKind::fill, {}, {v}, FillAttrs{0.0f}),
      f.op(OpKind::adamw, {dwte}, {wte, m, v}, adam, {WriteMode::update, WriteMode::update, WriteMode::update}),
  };
  const auto tv = random_ints(N, int32_t(Vp), 15);
  const Vec wtev = random_vector(Vp * C, 16), wpev = random_vector(Tmax * C, 17), lwv = random_vector(C, 18);
  const Vec lbv = random_vector(C, 19), bg0 = random_vector(C, 20);
  f.set(tokens, tv), f.set(wte, wtev), f.set(wpe, wpev), f.set(lw, lwv), f.set(lb, lbv), f.set(bg, bg0);
  for (int op : ops) f.prepare(*backend, op)->run(StepContext{1, 1e-2f});

  Vec ex(N * C), eh(N * C), eg(N * C), er(N * C), edh(N * C), ebg = bg0, edwte(Vp * C), edwpe(Tmax * C);
  Vec mean(N), rstd(N);
  float eloss = 0;
  ref::embedding_forward(tv.data(), wtev.data(), wpev.data(), ex.data(), N, T, C, false);
  ref::layernorm_forward(ex.data(), lwv.data(), lbv.data(), eh.data(), mean.data(), rstd.data(), N, C, 1e-5);
  ref::gelu_forward(eh.data(), eg.data(), N * C, false);
  ref::add(eg.data(), ex.data(), er.data(), N * C, false);
  ref::gelu_backward(er.data(), eh.data(), edh.data(), N * C, false);
  ref::bias_grad(edh.data(), ebg.data(), N, C, true);
  ref::embedding_backward(edh.data(), tv.data(), edwte.data(), edwpe.data(), N, T, C, Vp, Tmax, false, false);
  ref::loss_mean(ebg.data(), &eloss, C, 0.5, false);
  EXPECT_LE(normalized_error(f.get(h), eh), kRowTol);
  EXPECT_LE(normalized_error(f.get(r), er), kRowTol);
  EXPECT_LE(normalized_error(f.get(dh), edh), kRowTol);
  EXPECT_LE(normalized_error(f.get(bg), ebg), kRowTol);
  EXPECT_LE(normalized_error(f.get(dwte), edwte), kRowTol);
  EXPECT_LE(normalized_error(f.get(dwpe), edwpe), kRowTol);
  EXPECT_NEAR(f.get(loss)[0], eloss, 1e-5 * std::fabs(eloss));
  // AdamW is checked on the gradient the chain actually produced, so that the chain's own
  // rounding (squared in v) does not blur the optimizer's.
  const Vec grad = f.get(dwte);
  Vec ewte = wtev, em(Vp * C, 0.0f), ev(Vp * C, 0.0f);
  // The betas travel as float in AdamWAttrs: 1 - 0.999f is 1.3e-5 (relative) away from 0.001,
  // so the reference gets the same float values.
  ref::adamw(ewte.data(), grad.data(), em.data(), ev.data(), Vp * C, double(1e-2f), double(adam.beta1),
             double(adam.beta2), double(adam.eps), double(0.1f), 1);
  // Adam's first step moves each element by about lr, so compare the update p - p0, not p,
  // whose scale would hide an error in it; p is rounded to float (ulp ~6e-8 for |p| < 1)
  // before the subtraction, ~6e-6 of an lr = 1e-2 step.
  Vec du(Vp * C), edu(Vp * C);
  const Vec wte_now = f.get(wte);
  for (size_t i = 0; i < du.size(); ++i) du[i] = wte_now[i] - wtev[i], edu[i] = ewte[i] - wtev[i];
  EXPECT_LE(normalized_error(du, edu), 2e-5);
  EXPECT_LE(normalized_error(f.get(m), em), 1e-6);
  EXPECT_LE(normalized_error(f.get(v), ev), 1e-6);
}

TEST(CpuBackend, UnsupportedOpsFailAtPrepareNamingTheOp) {
  auto backend = make_cpu_backend();
  ProgramFixture f;
  const TensorId a = f.tensor("a", {4, 8}), b = f.tensor("b", {8, 4}), c = f.tensor("c", {4, 4});
  const TensorId a16 = f.tensor("a16", {4, 8}, DType::bf16), w = f.tensor("w", {8});
  const TensorId tok = f.tensor("tok", {2, 2}, DType::i32);
  MatmulAttrs mm;
  mm.m = 4, mm.n = 4, mm.k = 8;
  auto message = [&](int op) -> std::string {
    try {
      f.prepare(*backend, op);
    } catch (const Error& e) {
      EXPECT_EQ(e.piece(), "kernels");
      return e.what();
    }
    return "no exception";
  };
  EXPECT_NE(message(f.op(OpKind::matmul, {a16, b}, {c}, mm)).find("no CPU kernel for matmul (bf16) yet"),
            std::string::npos);
  // A norm whose output dtype differs from its input's breaks the op contract (op_contract.hpp).
  const TensorId rstd = f.tensor("rstd", {4});
  const std::string rms = message(f.op(OpKind::rmsnorm_forward, {a, w}, {a16, rstd}));
  EXPECT_NE(rms.find("(rmsnorm_forward): tensor 'a16' is bf16; the op contract needs fp32"), std::string::npos) << rms;
  // A weight gradient of the wrong size is refused before the kernel could write past it.
  const TensorId w5 = f.tensor("w5", {5});
  const std::string dw = message(f.op(OpKind::rmsnorm_backward, {a, a, w, rstd}, {a, w5}));
  EXPECT_NE(dw.find("dw 'w5' has 5 elements, expected 8"), std::string::npos) << dw;
  const TensorId a8 = f.tensor("a8", {4, 8}, DType::i8);
  const std::string cast = message(f.op(OpKind::cast, {a}, {a8}));
  EXPECT_NE(cast.find("(cast): tensor 'a8' is int8; the op contract needs a float type"), std::string::npos) << cast;
  // fp16 products: oneDNN 2.6 has none on CPUs (the precision pass makes them fp32 islands).
  const TensorId ah = f.tensor("ah", {4, 8}, DType::f16), bh = f.tensor("bh", {8, 4}, DType::f16);
  EXPECT_NE(message(f.op(OpKind::matmul, {ah, bh}, {c}, mm)).find("no CPU kernel for matmul (fp16)"),
            std::string::npos);
  EXPECT_NE(message(f.op(OpKind::all_reduce, {}, {a})).find("no CPU kernel for all_reduce"), std::string::npos);
  EXPECT_NE(message(f.op(OpKind::load_input, {}, {tok})).find("load_input"), std::string::npos);
  // A shape that contradicts the attributes.
  mm.k = 7;
  EXPECT_NE(message(f.op(OpKind::matmul, {a, b}, {c}, mm)).find("elements"), std::string::npos);
}

TEST_P(BackendOps, BindingsAreCheckedAndAbsentOutputsSkipped) {
  auto backend = make_backend(GetParam());
  ProgramFixture f;
  const int64_t M = 64, N = 48, K = 40;
  const TensorId a = f.tensor("a", {M, K}), b = f.tensor("b", {N, K}), c = f.tensor("c", {M, N});
  MatmulAttrs mm;
  mm.m = M, mm.n = N, mm.k = K, mm.trans_b = true;
  const int op = f.op(OpKind::matmul, {a, b}, {c}, mm);
  const Op& o = f.program.op(op);
  OpBinding bare{{f.data(a), f.data(b)}, {f.data(c)}, {}};
  if (backend->scratch_bytes(f.program, o) > 0) {  // the scratch tensor is required when asked for
    EXPECT_THROW(backend->prepare(f.program, o, bare), Error);
  }
  // A binding with more workspace entries than the op has tensors is refused.
  EXPECT_THROW(backend->prepare(f.program, o, OpBinding{bare.inputs, bare.outputs, {f.data(c)}}), Error);
  EXPECT_THROW(backend->prepare(f.program, o, OpBinding{{f.data(a)}, {f.data(c)}, {}}), Error);

  // An op whose only output is absent runs as a no-op.
  const TensorId dy = f.tensor("dy", {M, N});
  const int bg = f.op(OpKind::bias_grad, {dy}, {kNoTensor});
  f.prepare(*backend, bg)->run(StepContext{});
}

}  // namespace
}  // namespace memfit
