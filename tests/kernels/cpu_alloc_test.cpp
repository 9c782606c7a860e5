// The step-loop promise: after prepare(), run() allocates nothing in memfit code, and whatever
// oneDNN allocates inside its execute calls (argument maps) is freed before the call returns.
// malloc and friends are interposed by tests/support/alloc_counter; allocations made inside
// a LibraryCallScope are counted apart from memfit's own.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/backend.hpp"
#include "program_fixture.hpp"
#include "support/alloc_counter.hpp"

namespace memfit {
namespace {

using test::ProgramFixture;
using test::random_ints;
using test::random_vector;

TEST(CpuBackendAllocations, RunAllocatesNothingAfterPrepare) {
  auto backend = make_cpu_backend();
  ProgramFixture f;
  const int64_t B = 2, T = 16, NH = 2, HS = 8, C = NH * HS, N = B * T, V = 50, Vp = 64, R = 12;
  const TensorId tokens = f.tensor("tokens", {B, T}, DType::i32), targets = f.tensor("targets", {N}, DType::i32);
  const TensorId wte = f.tensor("wte", {Vp, C}), wpe = f.tensor("wpe", {T, C}), x = f.tensor("x", {N, C});
  const TensorId lw = f.tensor("lw", {C}), lb = f.tensor("lb", {C}), h = f.tensor("h", {N, C});
  const TensorId mean = f.tensor("mean", {N}), rstd = f.tensor("rstd", {N});
  const TensorId w = f.tensor("w", {3 * C, C}), bias = f.tensor("bias", {3 * C}), qkv = f.tensor("qkv", {N, 3 * C});
  const TensorId y = f.tensor("y", {N, C}), probs = f.tensor("probs", {B, NH, T, T});
  const TensorId losses = f.tensor("losses", {N}), loss = f.tensor("loss", {1}), dx = f.tensor("dx", {N, C});
  const TensorId dwte = f.tensor("dwte", {Vp, C}), logits = f.tensor("logits", {R, Vp});
  const TensorId dqkv = f.tensor("dqkv", {N, 3 * C}), dprobs = f.tensor("dprobs", {B, NH, T, T});
  const TensorId dw = f.tensor("dw", {3 * C, C}), dbias = f.tensor("dbias", {3 * C}), dh = f.tensor("dh", {N, C});
  const TensorId dlw = f.tensor("dlw", {C}), dlb = f.tensor("dlb", {C}), dwpe = f.tensor("dwpe", {T, C});
  const TensorId g = f.tensor("g", {N, C});
  const TensorId fy = f.tensor("flash.y", {N, C}), lse = f.tensor("flash.lse", {B, NH, T});
  std::vector<TensorId> params = {wte, wpe, lw, lb, w, bias}, grads = {dwte, dwpe, dlw, dlb, dw, dbias}, m, v;
  for (TensorId p : params) {
    m.push_back(f.tensor(f.program.tensor(p).name + ".m", f.program.tensor(p).shape));
    v.push_back(f.tensor(f.program.tensor(p).name + ".v", f.program.tensor(p).shape));
  }

  const WriteMode ga = WriteMode::accumulate_after_first_micro;  // exercises both variants
  MatmulAttrs fwd_mm, dx_mm, dw_mm;
  fwd_mm.m = N, fwd_mm.n = 3 * C, fwd_mm.k = C, fwd_mm.trans_b = true;
  dx_mm.m = N, dx_mm.n = C, dx_mm.k = 3 * C;
  dw_mm.m = 3 * C, dw_mm.n = C, dw_mm.k = N, dw_mm.trans_a = true;
  AttentionAttrs att;
  att.batch = B, att.seq = T, att.heads = NH, att.kv_heads = NH, att.head_dim = HS, att.scale = 0.35f;
  ClassifierAttrs cls;
  cls.rows = N, cls.vocab = V, cls.chunk_rows = R, cls.grad_scale = 1.0f / float(N);
  AdamWAttrs adam;
  adam.weight_decay = {0.1f, 0.1f, 0.0f, 0.0f, 0.1f, 0.0f};
  std::vector<TensorId> adam_out = params;
  adam_out.insert(adam_out.end(), m.begin(), m.end());
  adam_out.insert(adam_out.end(), v.begin(), v.end());

  const std::vector<int> ops = {
      f.op(OpKind::embedding_forward, {tokens, wte, wpe}, {x}),
      f.op(OpKind::layernorm_forward, {x, lw, lb}, {h, mean, rstd}, NormAttrs{}),
      f.op(OpKind::matmul, {h, w, bias}, {qkv}, fwd_mm),
      f.op(OpKind::attention_forward, {qkv}, {y, probs}, att),
      f.op(OpKind::flash_attention_forward, {qkv}, {fy, lse}, att),
      f.op(OpKind::gelu_forward, {y}, {g}),
      f.op(OpKind::add, {g, x}, {g}),
      f.op(OpKind::classifier, {g, wte, targets}, {losses, dx, dwte}, cls, {WriteMode::overwrite, WriteMode::overwrite, ga},
           {logits}),
      f.op(OpKind::loss_mean, {losses}, {loss}, ScaleAttrs{1.0f / float(N)}, {ga}),
      f.op(OpKind::classifier_eval, {g, wte, targets}, {losses}, cls, {}, {logits}),
      f.op(OpKind::gelu_backward, {dx, y}, {dx}),
      f.op(OpKind::attention_backward, {dx, qkv, probs}, {dqkv}, att, {WriteMode::overwrite}, {dprobs}),
      f.op(OpKind::flash_attention_backward, {dx, qkv, fy, lse}, {dqkv}, att, {WriteMode::accumulate}),
      f.op(OpKind::matmul, {dqkv, w}, {dh}, dx_mm),
      f.op(OpKind::matmul, {dqkv, h}, {dw}, dw_mm, {ga}),
      f.op(OpKind::bias_grad, {dqkv}, {dbias}, NoAttrs{}, {ga}),
      f.op(OpKind::layernorm_backward, {dh, x, lw, mean, rstd}, {dh, dlw, dlb}, NoAttrs{},
           {WriteMode::overwrite, ga, ga}),
      f.op(OpKind::accumulate, {dh}, {dx}, NoAttrs{}, {WriteMode::accumulate}),
      f.op(OpKind::embedding_backward, {dx, tokens}, {dwte, dwpe}, NoAttrs{}, {WriteMode::accumulate, ga}),
      f.op(OpKind::adamw, grads, adam_out, adam, std::vector<WriteMode>(adam_out.size(), WriteMode::update)),
      f.op(OpKind::fill, {}, {dw}, FillAttrs{0.0f}),
  };
  f.set(tokens, random_ints(N, int32_t(V), 1));
  f.set(targets, random_ints(N, int32_t(V), 2));
  for (TensorId p : params) f.set(p, random_vector(size_t(f.program.tensor(p).numel()), uint32_t(p), -0.5, 0.5));
  f.set(lw, std::vector<float>(C, 1.0f));

  std::vector<std::unique_ptr<PreparedOp>> prepared;
  for (int op : ops) prepared.push_back(f.prepare(*backend, op));
  auto step = [&](int64_t index) {
    for (int micro = 0; micro < 2; ++micro) {
      StepContext ctx;
      ctx.step = index, ctx.lr = 1e-3f, ctx.micro = micro, ctx.micro_count = 2;
      for (auto& p : prepared) p->run(ctx);
    }
  };
  step(1);  // first runs may initialise library state (thread pools, JIT caches) once

  test::alloc_counter_start();
  for (int64_t s = 2; s <= 4; ++s) step(s);
  const test::AllocCounts counts = test::alloc_counter_stop();
  // oneDNN's own argument maps: nonzero shows the LibraryCallScopes are where they should be.
  RecordProperty("library_allocations", std::to_string(counts.library_allocations));
  EXPECT_EQ(counts.memfit_allocations, 0);
  EXPECT_EQ(counts.library_bytes_outstanding, 0);
  EXPECT_TRUE(std::isfinite(f.get(loss)[0]));
}

}  // namespace
}  // namespace memfit
