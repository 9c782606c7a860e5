// The precision pass (graph/precision.hpp) on the GPT-2 program: every tensor's dtype is
// explicit and follows the policy, masters are their own tensors, casts are ops, fp16
// products are fp32 islands, pinned ops compute in fp32, and the memory plan's categories
// change by exactly the closed-form amounts (2 bytes per parameter saved, 4 per parameter
// spent on masters, every activation halved except the fp32 statistics and losses).
#include <gtest/gtest.h>

#include <set>

#include "core/error.hpp"
#include "graph/precision.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

Policy policy(Precision precision, DType grads = DType::f32) {
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.precision = precision;
  p.grad_dtype = grads;
  return p;
}

Program build(const Policy& p) { return build_training_program(model_preset("gpt2-tiny"), p, {}, cpu_capabilities()); }

bool is_fp32_slot(const Program& p, TensorId id) {
  const std::string& n = p.tensor(id).name;
  for (const char* suffix : {".mean", ".rstd", "losses", "logits_chunk", ".dprobs"})
    if (n.ends_with(suffix)) return true;
  return n == kLoss || n == kEvalLoss;
}

TEST(PrecisionProgram, Bf16DtypesMastersAndOptimizerCasts) {
  const Program p = build(policy(Precision::bf16));
  for (const ParamEntry& e : p.params()) {
    EXPECT_EQ(p.tensor(e.value).dtype, DType::bf16) << e.name;
    ASSERT_NE(e.master, kNoTensor) << e.name;
    const TensorDesc& m = p.tensor(e.master);
    EXPECT_EQ(m.dtype, DType::f32);
    EXPECT_EQ(m.category, Category::master_weights);
    EXPECT_EQ(m.lifetime, Lifetime::persistent);
    EXPECT_EQ(m.shape.dims(), p.tensor(e.value).shape.dims());
    EXPECT_EQ(p.tensor(e.grad).dtype, DType::f32) << "gradients default to fp32";
    for (TensorId s : e.state) EXPECT_EQ(p.tensor(s).dtype, DType::f32);
  }
  for (const TensorDesc& t : p.tensors()) {
    if (t.category != Category::activations && t.category != Category::temporaries) continue;
    if (!dtype_is_float(t.dtype) || t.lifetime == Lifetime::persistent) continue;
    const TensorId id = p.find_tensor(t.name);
    EXPECT_EQ(t.dtype, is_fp32_slot(p, id) ? DType::f32 : DType::bf16) << t.name;
  }
  // No casts in the micro section (every bf16 kind is native) and no overflow check.
  const Section* micro = p.find_section(SectionKind::micro);
  for (int i = micro->begin; i < micro->end; ++i) {
    EXPECT_NE(p.op(i).kind, OpKind::cast) << p.op(i).name;
    EXPECT_NE(p.op(i).kind, OpKind::check_finite);
  }
  // The optimizer updates the masters, then one cast per parameter narrows each into place.
  const Section* opt = p.find_section(SectionKind::optimizer);
  const Op& adamw = p.op(opt->begin);
  ASSERT_EQ(adamw.kind, OpKind::adamw);
  const size_t n = p.params().size();
  ASSERT_EQ(size_t(opt->end - opt->begin), 1 + n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(adamw.outputs[i], p.params()[i].master);
    const Op& cast = p.op(opt->begin + 1 + int(i));
    EXPECT_EQ(cast.kind, OpKind::cast);
    EXPECT_EQ(cast.inputs, std::vector<TensorId>{p.params()[i].master});
    EXPECT_EQ(cast.outputs, std::vector<TensorId>{p.params()[i].value});
  }
}

TEST(PrecisionProgram, Fp16ProductsAreFp32IslandsAndGradientsAreChecked) {
  const Program p = build(policy(Precision::fp16, DType::f16));
  const Section* micro = p.find_section(SectionKind::micro);
  // The micro section ends with the overflow check over every parameter gradient.
  const Op& check = p.op(micro->end - 1);
  ASSERT_EQ(check.kind, OpKind::check_finite);
  std::set<TensorId> grads;
  for (const ParamEntry& e : p.params()) grads.insert(e.grad);
  EXPECT_EQ(std::set<TensorId>(check.inputs.begin(), check.inputs.end()), grads);
  EXPECT_EQ(p.tensor(check.outputs[0]).name, kOverflowFlag);
  EXPECT_EQ(p.tensor(check.outputs[0]).lifetime, Lifetime::persistent);
  int islands = 0;
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    const bool product = op.kind == OpKind::matmul || op.kind == OpKind::attention_forward ||
                         op.kind == OpKind::attention_backward || op.kind == OpKind::classifier ||
                         op.kind == OpKind::classifier_eval;
    if (!product) continue;
    ++islands;
    for (const auto* list : {&op.inputs, &op.outputs})
      for (TensorId id : *list)
        if (id != kNoTensor && dtype_is_float(p.tensor(id).dtype)) { EXPECT_EQ(p.tensor(id).dtype, DType::f32) << op.name; }
    // Its 16-bit inputs are widened by casts just before it, in its phase and layer.
    const Op& before = p.op(i - 1);
    EXPECT_EQ(before.kind, OpKind::cast) << op.name;
    EXPECT_EQ(before.phase, op.phase);
    EXPECT_EQ(before.layer, op.layer);
    EXPECT_TRUE(before.name.starts_with(op.name + ".cast_in")) << before.name;
    // Its 16-bit outputs are narrowed just after it with the output's original write mode.
    const Op& after = p.op(i + 1);
    if (after.kind == OpKind::cast && after.name.starts_with(op.name + ".cast_out")) {
      EXPECT_EQ(after.inputs[0], op.outputs[size_t(after.name.back() - '0')]);
      EXPECT_EQ(p.tensor(after.inputs[0]).category, Category::temporaries);
    }
  }
  EXPECT_GT(islands, 10);
}

TEST(PrecisionProgram, PinnedOpsComputeInFp32) {
  Policy pol = policy(Precision::bf16);
  pol.fp32_ops = {"gelu_forward", "h.0.attn.core*"};
  const Program p = build(pol);
  int pinned = 0;
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    if (op.kind == OpKind::cast) continue;
    const bool want = op.kind == OpKind::gelu_forward || op.name.starts_with("h.0.attn.core");
    auto any16 = [&](const std::vector<TensorId>& ids) {
      for (TensorId id : ids)
        if (id != kNoTensor && p.tensor(id).dtype == DType::bf16) return true;
      return false;
    };
    const bool native16 = any16(op.inputs) || any16(op.outputs);
    if (want) {
      EXPECT_FALSE(native16) << op.name << " is pinned but touches bf16 tensors";
      EXPECT_EQ(p.op(i - 1).kind, OpKind::cast) << op.name;
      ++pinned;
    }
    // Their neighbours of the same kinds stay bf16.
    if (op.kind == OpKind::gelu_backward || op.name.starts_with("h.1.attn.core")) { EXPECT_TRUE(native16) << op.name; }
  }
  const int64_t layers = model_preset("gpt2-tiny").n_layer;
  EXPECT_EQ(pinned, 2 /* gelu fwd, train and eval */ * layers + 2 /* h.0 attention fwd, bwd */);
  pol.fp32_ops = {"geluforward"};
  EXPECT_THROW(build(pol), Error);
  Policy bad = policy(Precision::bf16, DType::f16);
  EXPECT_THROW(build(bad), Error);
  Policy fp32 = policy(Precision::fp32);
  fp32.fp32_ops = {"matmul"};
  EXPECT_THROW(build(fp32), Error);
}

// Live bytes per category at the classifier (the start of backward, where activations peak).
CategoryBytes at_classifier(const Program& p, const MemoryPlan& plan) {
  for (int i = 0; i < int(p.ops().size()); ++i)
    if (p.op(i).name == "classifier") return plan.tier(Tier::device).live_by_category[size_t(i)];
  ADD_FAILURE() << "no classifier op";
  return {};
}

TEST(PrecisionProgram, PlanSavingsAreExact) {
  Policy base = policy(Precision::fp32);
  base.batch = 4, base.seq = 64;
  const Program p32 = build(base);
  const int64_t n = p32.parameter_count();
  for (DType grads : {DType::f32, DType::bf16}) {
    Policy pol = base;
    pol.precision = Precision::bf16;
    pol.grad_dtype = grads;
    const Program p16 = build(pol);
    const CategoryBytes a = at_classifier(p32, plan_memory(p32)), b = at_classifier(p16, plan_memory(p16));
    auto at = [](const CategoryBytes& c, Category k) { return int64_t(c[size_t(k)]); };
    EXPECT_EQ(at(a, Category::parameters), 4 * n);
    EXPECT_EQ(at(b, Category::parameters), 2 * n);
    EXPECT_EQ(at(b, Category::master_weights), 4 * n);
    EXPECT_EQ(at(b, Category::optimizer_state), at(a, Category::optimizer_state));
    EXPECT_EQ(at(b, Category::gradients) * (grads == DType::f32 ? 1 : 2), at(a, Category::gradients));
    // Activations: halved, except the fp32 ones (layernorm statistics, losses, the loss) and
    // the int32 tokens and targets.
    int64_t fp32_kept = 0;
    const MemoryPlan plan16 = plan_memory(p16);
    int classifier = 0;
    while (p16.op(classifier).name != "classifier") ++classifier;
    for (size_t id = 0; id < p16.tensors().size(); ++id) {
      const TensorDesc& t = p16.tensors()[id];
      const TensorPlacement& pl = plan16.tensors[id];
      if (t.category == Category::activations && t.dtype != DType::bf16 && pl.buffer >= 0 &&
          pl.live.first <= classifier && pl.live.last >= classifier)
        fp32_kept += int64_t(t.bytes());
    }
    EXPECT_GT(fp32_kept, 0);
    EXPECT_EQ(2 * (at(b, Category::activations) - fp32_kept), at(a, Category::activations) - fp32_kept);
  }
}

}  // namespace
}  // namespace memfit
