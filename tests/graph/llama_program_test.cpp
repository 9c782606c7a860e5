// The LLaMA builder: parameter counts of the presets against the published totals (the
// shape arithmetic of ModelSpec and the tensors the builder declares agree with them), the
// program's structure (grouped-query qkv width, rotary in place, SwiGLU keeps gate and up,
// an untied lm_head with its own gradient), every recompute mode and attention kind planning
// without overlap, and `memfit train` refusing the architecture with one line.
#include <gtest/gtest.h>

#include "graph/recompute.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

TEST(LlamaProgram, ParameterCountsMatchThePublishedTotals) {
  const struct {
    const char* name;
    int64_t params;
  } cases[] = {{"llama-2-7b", 6'738'415'616},  {"llama-2-13b", 13'015'864'320}, {"llama-2-70b", 68'976'648'192},
               {"llama-3-8b", 8'030'261'248},  {"llama-3-70b", 70'553'706'496}, {"mistral-7b", 7'241'732'096}};
  for (const auto& c : cases) {
    const ModelSpec spec = model_preset(c.name);
    EXPECT_EQ(spec.parameter_count(), c.params) << c.name;
    Policy pol;
    pol.batch = 1;
    pol.seq = 16;
    pol.with_eval = false;
    const Program p = build_training_program(spec, pol, {});
    EXPECT_EQ(p.parameter_count(), c.params) << c.name;
  }
}

TEST(LlamaProgram, GroupedQueryAttentionRopeAndSwiGluHaveTheirShapes) {
  const ModelSpec s = model_preset("llama-tiny");  // 4 heads, 2 key/value heads, head size 16
  Policy pol;
  pol.batch = 2;
  pol.seq = 8;
  const Program p = build_training_program(s, pol, {});
  const TensorDesc& qkv_w = p.tensor(p.find_tensor("layers.0.self_attn.qkv_proj.weight"));
  EXPECT_EQ(qkv_w.shape, (Shape{(4 + 2 * 2) * 16, 64}));
  const TensorId lm_head = p.find_tensor("lm_head.weight");
  ASSERT_NE(lm_head, kNoTensor);
  bool saw_rope = false, saw_swiglu_bwd = false;
  for (const Op& op : p.ops()) {
    if (op.kind == OpKind::rope_forward) {
      saw_rope = true;
      EXPECT_EQ(op.inplace, (std::vector<std::pair<int, int>>{{0, 0}}));
      EXPECT_EQ(p.tensor(op.outputs[0]).shape, (Shape{2, 8, 128}));
    }
    if (op.kind == OpKind::swiglu_backward) {
      saw_swiglu_bwd = true;
      EXPECT_EQ(op.inputs.size(), 3u);  // dy, gate, up: both kept for backward
    }
    if (op.kind == OpKind::embedding_forward) EXPECT_EQ(op.inputs.size(), 2u);  // no position table
  }
  EXPECT_TRUE(saw_rope);
  EXPECT_TRUE(saw_swiglu_bwd);
  for (const ParamEntry& e : p.params()) EXPECT_NE(e.grad, kNoTensor) << e.name << " gets no gradient";
}

TEST(LlamaProgram, EveryRecomputeModeAndAttentionPlansWithoutOverlap) {
  const ModelSpec s = model_preset("llama-tiny");
  uint64_t none_peak = 0;
  for (AttentionKind attn : {AttentionKind::naive, AttentionKind::flash})
    for (const char* rec : {"none", "selective", "selective:mlp_activation,norms", "full", "every:2"})
      for (Precision prec : {Precision::fp32, Precision::bf16}) {
        Policy pol;
        pol.batch = 2;
        pol.seq = 32;
        pol.attention = attn;
        pol.precision = prec;
        pol.recompute = parse_recompute(rec);
        const Program p = build_training_program(s, pol, {});
        const MemoryPlan plan = plan_memory(p);
        EXPECT_EQ(find_overlap(p, plan), "") << rec;
        if (attn == AttentionKind::naive && prec == Precision::fp32 && std::string(rec) == "none")
          none_peak = plan.tier(Tier::device).peak_bytes;
        if (attn == AttentionKind::naive && prec == Precision::fp32 && std::string(rec) == "full") {
          EXPECT_LT(plan.tier(Tier::device).peak_bytes, none_peak);
          EXPECT_GT(recompute_flops(p), 0);
        }
        // llama kinds have 16-bit forms on the hardware planned for: no fp32 islands around them.
        if (prec == Precision::bf16)
          for (const Op& op : p.ops())
            if (op.kind == OpKind::rmsnorm_forward || op.kind == OpKind::swiglu_forward || op.kind == OpKind::rope_forward)
              EXPECT_EQ(p.tensor(op.outputs[0]).dtype, DType::bf16) << op.name;
      }
}

TEST(LlamaProgram, TrainingIsRefusedWithOneLine) {
  const auto r = test::run_memfit("train --model llama-tiny --steps 1 --batch 1 --seq 16");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("memfit: error: [train] training the llama architecture"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const auto plan = test::run_memfit("plan --model llama-tiny --batch 1 --seq 16");
  EXPECT_EQ(plan.status, 0) << plan.err;
}

}  // namespace
}  // namespace memfit
