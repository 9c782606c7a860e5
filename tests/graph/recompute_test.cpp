// The recompute pass on GPT-2 programs: what it re-emits, where, and what the backward then
// reads. (That results do not change is tests/runtime/recompute_invariance_test.cpp.)
#include <gtest/gtest.h>

#include <set>

#include "core/error.hpp"
#include "graph/recompute.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

const ModelSpec kSpec = model_preset("gpt2-tiny");  // 4 blocks

Program build(const std::string& recompute, AttentionKind attention = AttentionKind::plain) {
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.recompute = parse_recompute(recompute);
  p.attention = attention;
  return build_training_program(kSpec, p, {}, cpu_capabilities());
}

int first_backward_of(const Program& p, int layer) {
  for (int i = 0; i < int(p.ops().size()); ++i)
    if (p.op(i).phase == Phase::backward && p.op(i).layer == layer) return i;
  return -1;
}

// Forward ops of the micro section in layer `layer`.
std::vector<int> forward_ops_of(const Program& p, int layer) {
  std::vector<int> ops;
  const Section* micro = p.find_section(SectionKind::micro);
  for (int i = micro->begin; i < micro->end; ++i)
    if (p.op(i).phase == Phase::forward && p.op(i).layer == layer) ops.push_back(i);
  return ops;
}

TEST(Recompute, ReplayedOpsCopyTheirForwardOpAndWriteFreshTemporaries) {
  for (const char* policy : {"full", "every:2", "selective:attention,mlp_activation,norms"}) {
    const Program p = build(policy);
    std::set<TensorId> recomputed_outputs;
    int replays = 0;
    for (const Op& op : p.ops()) {
      if (op.phase != Phase::recompute) continue;
      ++replays;
      ASSERT_GE(op.replays, 0) << op.name;
      const Op& fwd = p.op(op.replays);
      EXPECT_EQ(fwd.phase, Phase::forward) << op.name;
      EXPECT_EQ(fwd.kind, op.kind) << op.name;
      EXPECT_EQ(fwd.layer, op.layer) << op.name;
      EXPECT_EQ(op.name, fwd.name + ".rec");
      // Same work, except a plain attention core replayed for its probabilities only.
      if (op.outputs[0] == kNoTensor) {
        EXPECT_EQ(op.kind, OpKind::attention_forward);
        EXPECT_LT(op.flops, fwd.flops);
      } else {
        EXPECT_EQ(op.flops, fwd.flops);
      }
      ASSERT_EQ(op.inputs.size(), fwd.inputs.size());
      for (size_t i = 0; i < op.inputs.size(); ++i)  // each input: the original, or an earlier re-emission of it
        if (op.inputs[i] != fwd.inputs[i]) {
          EXPECT_TRUE(recomputed_outputs.count(op.inputs[i])) << op.name << " input " << i;
          EXPECT_EQ(p.tensor(op.inputs[i]).name, p.tensor(fwd.inputs[i]).name + ".rec");
        }
      for (TensorId t : op.outputs) {
        if (t == kNoTensor) continue;
        EXPECT_EQ(p.tensor(t).category, Category::temporaries) << p.tensor(t).name;
        recomputed_outputs.insert(t);
      }
    }
    EXPECT_GT(replays, 0) << policy;
  }
}

TEST(Recompute, FullReplaysEachBlockJustBeforeItsBackward) {
  const Program p = build("full");
  for (int layer = 0; layer < kSpec.n_layer; ++layer) {
    const std::vector<int> fwd = forward_ops_of(p, layer);
    const int first = first_backward_of(p, layer);
    // Every forward op of the block but the last two, in forward order, immediately before
    // the block's first backward op: the MLP projection's output is read only by the final
    // residual add, whose output is the next block's kept input, and no backward op reads either.
    const int n = int(fwd.size()) - 2;
    EXPECT_TRUE(p.op(fwd.back()).name.ends_with("residual_mlp"));
    for (int j = 0; j < n; ++j) {
      const Op& op = p.op(first - n + j);
      EXPECT_EQ(op.phase, Phase::recompute) << "layer " << layer << " slot " << j;
      EXPECT_EQ(op.replays, fwd[size_t(j)]) << "layer " << layer << " slot " << j;
    }
    EXPECT_NE(p.op(first - n - 1).phase, Phase::recompute);
  }
}

TEST(Recompute, EveryKReplaysASegmentOnceAtItsLastBlock) {
  const Program p = build("every:2");
  auto replayed_layers_before = [&](int layer) {
    std::set<int> layers;
    for (int i = first_backward_of(p, layer) - 1; i >= 0 && p.op(i).phase == Phase::recompute; --i)
      layers.insert(p.op(i).layer);
    return layers;
  };
  EXPECT_EQ(replayed_layers_before(3), (std::set<int>{2, 3}));
  EXPECT_EQ(replayed_layers_before(2), (std::set<int>{}));
  EXPECT_EQ(replayed_layers_before(1), (std::set<int>{0, 1}));
  EXPECT_EQ(replayed_layers_before(0), (std::set<int>{}));
  // every:sqrt on 4 blocks is every:2.
  EXPECT_EQ(every_sqrt(4), 2);
  EXPECT_EQ(every_sqrt(12), 3);
  EXPECT_EQ(every_sqrt(48), 7);
  EXPECT_EQ(build("every:sqrt").ops().size(), p.ops().size());
}

TEST(Recompute, SelectiveReplaysTheAttentionCoreRightBeforeItsBackward) {
  const Program p = build("selective");
  int replays = 0;
  for (int i = 0; i < int(p.ops().size()); ++i) {
    if (p.op(i).phase != Phase::recompute) continue;
    ++replays;
    EXPECT_EQ(p.op(i).kind, OpKind::attention_forward);
    EXPECT_EQ(p.op(i + 1).kind, OpKind::attention_backward);
    EXPECT_EQ(p.op(i + 1).inputs[2], p.op(i).outputs[1]) << "the backward reads the recomputed probabilities";
    EXPECT_EQ(p.op(i).outputs[0], kNoTensor) << "y is kept, so the replay computes probabilities only";
  }
  EXPECT_EQ(replays, kSpec.n_layer);
  // With flash attention there is nothing to recompute: the program is the plain flash one.
  EXPECT_EQ(build("selective", AttentionKind::flash).ops().size(), build("none", AttentionKind::flash).ops().size());
}

TEST(Recompute, DroppedActivationsDieInForward) {
  // Under full recomputation, the only forward activations of a block still live when the
  // backward starts are the block outputs (the next block's inputs).
  const Program p = build("full");
  const MemoryPlan plan = plan_memory(p);
  const int backward_start = first_backward_of(p, -1);
  for (int layer = 0; layer < kSpec.n_layer; ++layer)
    for (int i : forward_ops_of(p, layer))
      for (TensorId t : p.op(i).outputs) {
        const bool block_output = p.op(i).name.ends_with("residual_mlp");
        EXPECT_EQ(plan.tensors[size_t(t)].live.last >= backward_start, block_output) << p.tensor(t).name;
      }
}

TEST(Recompute, PolicyErrorsNameTheProblem) {
  auto message = [](const std::string& recompute) {
    try {
      build(recompute);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("selective:softmax").find("unknown op 'softmax'"), std::string::npos);
  EXPECT_NE(message("auto").find("memory budget"), std::string::npos) << message("auto");
  EXPECT_THROW(parse_recompute("every:0"), Error);
  EXPECT_THROW(parse_recompute("fully"), Error);
}

TEST(Recompute, NamesOfResolvedChoices) {
  RecomputePolicy r;
  r.mode = RecomputeMode::automatic;
  r.blocks = resolve_recompute(parse_recompute("selective:attention,norms"), 3);
  r.blocks.push_back(resolve_recompute(parse_recompute("full"), 1)[0]);
  EXPECT_EQ(r.to_string(), "auto:attention+norms x3,full x1");
  EXPECT_EQ(resolve_recompute(r, 4), r.blocks);
}

}  // namespace
}  // namespace memfit
