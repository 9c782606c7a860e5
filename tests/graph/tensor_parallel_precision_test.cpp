// The precision pass (graph/precision.hpp) on the ops of tensor parallelism: under a 16-bit
// policy the vocabulary-parallel classifier's stats, lse and losses stay fp32 (graph/op.hpp),
// while x, w, dx, dw and add_bias's tensors follow the policy like the fused classifier's; on
// the CPU (bf16 kernels, no fp16 ones) bf16 needs no island and fp16 gets one around each
// product but none around classifier_combine, which touches only fp32 tensors.
#include <gtest/gtest.h>

#include <string>

#include "graph/precision.hpp"
#include "graph/program.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

struct TpProgram {
  Program p;
  TensorId x, w, targets, stats, gathered, losses, lse, dx, dw, b, y;

  TpProgram() {
    const int64_t N = 8, C = 16, Vs = 32, R = 4;
    auto add = [&](const std::string& name, Shape shape, Category category, DType dtype = DType::f32) {
      TensorDesc d;
      d.name = name, d.shape = std::move(shape), d.category = category, d.dtype = dtype;
      return p.add_tensor(d);
    };
    x = add("x", {N, C}, Category::activations);
    w = add("w", {Vs, C}, Category::parameters);
    targets = add("targets", {N}, Category::activations, DType::i32);
    stats = add("stats", {N, 3}, Category::activations);
    gathered = add("gathered", {2, N, 3}, Category::activations);
    losses = add("losses", {N}, Category::activations);
    lse = add("lse", {N}, Category::activations);
    dx = add("dx", {N, C}, Category::activations);
    dw = add("dw", {Vs, C}, Category::gradients);
    b = add("b", {C}, Category::parameters);
    y = add("y", {N, C}, Category::activations);
    const TensorId chunk = add("logits_chunk", {R, Vs}, Category::temporaries);
    ClassifierAttrs a;
    a.rows = N, a.vocab = 50, a.chunk_rows = R, a.vocab_begin = Vs, a.parts = 2;
    p.begin_section(SectionKind::micro);
    auto op = [&](OpKind kind, std::vector<TensorId> in, std::vector<TensorId> out, OpAttrs attrs,
                  std::vector<TensorId> ws = {}) {
      Op o;
      o.kind = kind, o.name = std::string(op_kind_name(kind));
      o.inputs = std::move(in), o.outputs = std::move(out), o.attrs = std::move(attrs), o.workspace = std::move(ws);
      o.modes.assign(o.outputs.size(), WriteMode::overwrite);
      p.add_op(std::move(o));
    };
    op(OpKind::add_bias, {x, b}, {y}, NoAttrs{});
    op(OpKind::classifier_partial, {y, w, targets}, {stats}, a, {chunk});
    op(OpKind::classifier_combine, {gathered}, {losses, lse}, a);
    op(OpKind::classifier_parallel_backward, {y, w, targets, lse}, {dx, dw}, a, {chunk});
    p.end_section();
  }
};

Policy policy(Precision precision) {
  Policy pol;
  pol.precision = precision;
  pol.grad_dtype = compute_dtype(precision);
  return pol;
}

TEST(TensorParallelPrecision, StatsLseAndLossesStayFp32UnderBf16WithoutIslands) {
  TpProgram t;
  apply_precision(t.p, policy(Precision::bf16), cpu_capabilities());
  for (TensorId id : {t.stats, t.gathered, t.losses, t.lse}) EXPECT_EQ(t.p.tensor(id).dtype, DType::f32) << t.p.tensor(id).name;
  for (TensorId id : {t.x, t.w, t.dx, t.dw, t.b, t.y}) EXPECT_EQ(t.p.tensor(id).dtype, DType::bf16) << t.p.tensor(id).name;
  EXPECT_EQ(t.p.tensor(t.targets).dtype, DType::i32);
  EXPECT_EQ(t.p.tensor(t.p.find_tensor("logits_chunk")).dtype, DType::f32);
  ASSERT_EQ(t.p.ops().size(), 4u);  // every kind has a bf16 CPU kernel (combine is all fp32)
  for (const Op& op : t.p.ops()) EXPECT_NE(op.kind, OpKind::cast) << op.name;
}

TEST(TensorParallelPrecision, Fp16OnTheCpuGivesTheProductsIslandsButNotTheCombine) {
  TpProgram t;
  apply_precision(t.p, policy(Precision::fp16), cpu_capabilities());
  for (TensorId id : {t.stats, t.gathered, t.losses, t.lse}) EXPECT_EQ(t.p.tensor(id).dtype, DType::f32) << t.p.tensor(id).name;
  int casts = 0;
  for (const Op& op : t.p.ops()) {
    casts += op.kind == OpKind::cast;
    if (op.kind == OpKind::classifier_combine) {
      EXPECT_EQ(op.inputs[0], t.gathered);
      EXPECT_EQ(op.outputs, (std::vector<TensorId>{t.losses, t.lse}));
    }
    // The islands' products read fp32 copies of y and w (and write fp32 dx and dw).
    if (op.kind == OpKind::classifier_partial || op.kind == OpKind::classifier_parallel_backward) {
      for (TensorId id : op.inputs) {
        if (dtype_is_float(t.p.tensor(id).dtype)) {
          EXPECT_EQ(t.p.tensor(id).dtype, DType::f32) << op.name;
        }
      }
    }
  }
  EXPECT_GT(casts, 0);
}

}  // namespace
}  // namespace memfit
