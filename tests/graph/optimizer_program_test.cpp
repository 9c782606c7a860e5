// The optimizer section of the training program against closed-form numbers: the bytes of
// optimizer state the plan reserves (AdamW: 8 per parameter; 8-bit AdamW: 2 per parameter
// plus 8 per block of 256, and 8 for tensors under 4096 elements), and its ops: every
// trainable parameter updated exactly once, by the op its state layout calls for, with the
// global norm computed before the updates that read it when clipping is on.
#include <gtest/gtest.h>

#include <map>

#include "core/error.hpp"
#include "graph/optimizer.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

Policy policy_with(OptimizerKind opt, double clip = 0) {
  Policy p;
  p.batch = 1;
  p.seq = 8;
  p.optimizer = opt;
  p.grad_clip = clip;
  p.with_eval = false;
  return p;
}

uint64_t closed_form_state_bytes(const ModelSpec& spec, OptimizerKind opt) {
  const Program p = build_training_program(spec, policy_with(OptimizerKind::adamw), {}, cpu_capabilities());
  uint64_t bytes = 0;
  for (const ParamEntry& e : p.params()) {
    const uint64_t n = uint64_t(p.tensor(e.value).numel());
    if (opt == OptimizerKind::adamw8bit && n >= 4096) bytes += 2 * n + 2 * 4 * ((n + 255) / 256);
    else bytes += 8 * n;
  }
  return bytes;
}

TEST(OptimizerProgram, PlannedStateBytesMatchTheClosedForm) {
  for (const char* name : {"gpt2-tiny", "gpt2"}) {
    const ModelSpec spec = model_preset(name);
    for (OptimizerKind opt : {OptimizerKind::adamw, OptimizerKind::adamw8bit}) {
      const Program p = build_training_program(spec, policy_with(opt), {}, cpu_capabilities());
      const MemoryPlan plan = plan_memory(p);
      const uint64_t planned = plan.tier(Tier::device).at_peak[size_t(Category::optimizer_state)];
      EXPECT_EQ(planned, closed_form_state_bytes(spec, opt)) << name << " " << optimizer_name(opt);
      const double per_param = double(planned) / double(p.parameter_count());
      std::printf("%s %s: %lu bytes of optimizer state, %.4f per parameter\n", name,
                  std::string(optimizer_name(opt)).c_str(), (unsigned long)planned, per_param);
      if (opt == OptimizerKind::adamw) {
        EXPECT_EQ(per_param, 8.0);
      }
    }
  }
  // GPT-2 124M: 2 + 8/256 = 2.03125 for the matrices, and the few fp32 biases and norms.
  const ModelSpec gpt2 = model_preset("gpt2");
  const double per_param = double(closed_form_state_bytes(gpt2, OptimizerKind::adamw8bit)) /
                           double(build_training_program(gpt2, policy_with(OptimizerKind::adamw), {}, cpu_capabilities()).parameter_count());
  EXPECT_GT(per_param, 2.03125);
  EXPECT_LT(per_param, 2.04);
}

TEST(OptimizerProgram, EveryParameterIsUpdatedOnceByTheOpOfItsStateLayout) {
  for (double clip : {0.0, 1.0}) {
    const Program p = build_training_program(model_preset("gpt2-tiny"), policy_with(OptimizerKind::adamw8bit, clip), {}, cpu_capabilities());
    const Section* opt = p.find_section(SectionKind::optimizer);
    ASSERT_NE(opt, nullptr);
    std::map<TensorId, int> updates;
    int norm_op = -1;
    const TensorId norm = p.find_tensor(kGradNorm);
    EXPECT_EQ(norm != kNoTensor, clip > 0);
    for (int i = opt->begin; i < opt->end; ++i) {
      const Op& op = p.op(i);
      if (op.kind == OpKind::grad_norm) {
        norm_op = i;
        EXPECT_EQ(op.outputs, std::vector<TensorId>{norm});
        EXPECT_EQ(op.inputs.size(), p.params().size());
        continue;
      }
      ASSERT_TRUE(op.kind == OpKind::adamw || op.kind == OpKind::adamw8bit) << op.name;
      const auto& a = std::get<AdamWAttrs>(op.attrs);
      EXPECT_EQ(a.max_grad_norm, clip);
      const size_t roles = op.kind == OpKind::adamw8bit ? 5 : 3, n = op.outputs.size() / roles;
      EXPECT_EQ(op.inputs.size(), n + (clip > 0 ? 1 : 0));
      if (clip > 0) {
        EXPECT_EQ(op.inputs.back(), norm);
        EXPECT_LT(norm_op, i) << "the norm must be computed before " << op.name;
      }
      for (size_t t = 0; t < n; ++t) {
        ++updates[op.outputs[t]];
        const TensorDesc& target = p.tensor(op.outputs[t]);
        const bool big = target.numel() >= kMin8bitElements;
        EXPECT_EQ(op.kind == OpKind::adamw8bit, big) << target.name;
        if (op.kind == OpKind::adamw8bit) {
          EXPECT_EQ(p.tensor(op.outputs[n + t]).dtype, DType::u8);
          EXPECT_EQ(p.tensor(op.outputs[3 * n + t]).numel(), (target.numel() + a.block - 1) / a.block);
          EXPECT_EQ(p.tensor(op.outputs[3 * n + t]).category, Category::optimizer_state);
        }
      }
    }
    for (const ParamEntry& e : p.params()) EXPECT_EQ(updates[e.value], 1) << e.name;
  }
}

TEST(OptimizerProgram, UpdateTargetIsTheMasterCopyWhenThereIsOne) {
  ParamEntry e;
  e.value = 3;
  EXPECT_EQ(update_target(e), 3);
  e.master = 7;
  EXPECT_EQ(update_target(e), 7);
}

TEST(OptimizerProgram, RefusesANegativeClippingNorm) {
  try {
    build_training_program(model_preset("gpt2-tiny"), policy_with(OptimizerKind::adamw, -1.0), {}, cpu_capabilities());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient clipping"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit
