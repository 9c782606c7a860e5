// The forward-rewrite stage and frozen parameters, as programs (nothing runs here):
// - with no rewrite (or passes that change nothing) the program is identical op for op and
//   tensor for tensor to the plain build, so the loss-history goldens cannot move;
// - a frozen parameter has no gradient, master or optimizer state, and no op computes a
//   gradient for it: its linears keep only the input-gradient product, and a frozen tied
//   embedding makes the classifier skip d(wte);
// - the low-rank test pass replaces each targeted linear by base + branch writing the
//   linear's own output, and autodiff then differentiates A and B only;
// - refusals name the problem in one line.
#include <gtest/gtest.h>

#include <set>

#include "core/error.hpp"
#include "graph/forward_rewrite.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

Policy tiny_policy() {
  Policy p;
  p.batch = 2;
  p.seq = 16;
  return p;
}

Program build(const Policy& policy, const ForwardRewrites& extra = {}) {
  return build_training_program(model_preset("gpt2-tiny"), policy, {}, cpu_capabilities(), extra);
}

// A pass that looks at everything and changes nothing.
class Bystander final : public ForwardRewrite {
 public:
  std::string name() const override { return "bystander"; }
  void declare(GraphBuilder&) override { ++declared; }
  bool rewrite(const Op&, GraphBuilder&) override {
    ++seen;
    return false;
  }
  int declared = 0, seen = 0;
};

void expect_same_program(const Program& a, const Program& b) {
  ASSERT_EQ(a.ops().size(), b.ops().size());
  for (size_t i = 0; i < a.ops().size(); ++i) {
    const Op &x = a.ops()[i], &y = b.ops()[i];
    EXPECT_TRUE(x.kind == y.kind && x.name == y.name && x.inputs == y.inputs && x.outputs == y.outputs &&
                x.modes == y.modes && x.workspace == y.workspace && x.inplace == y.inplace && x.phase == y.phase &&
                x.layer == y.layer && x.flops == y.flops)
        << "op " << i << " " << x.name << " vs " << y.name;
  }
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorDesc &x = a.tensors()[i], &y = b.tensors()[i];
    EXPECT_TRUE(x.name == y.name && x.shape.dims() == y.shape.dims() && x.dtype == y.dtype &&
                x.category == y.category && x.lifetime == y.lifetime && x.requires_grad == y.requires_grad)
        << "tensor " << i << " " << x.name;
  }
}

TEST(ForwardRewrite, PassesThatChangeNothingLeaveTheProgramOpForOp) {
  for (const char* recompute : {"none", "full"}) {
    Policy pol = tiny_policy();
    pol.recompute = parse_recompute(recompute);
    pol.precision = Precision::bf16;
    auto bystander = std::make_shared<Bystander>();
    const Program plain = build(pol);
    const Program passed = build(pol, {bystander});
    SCOPED_TRACE(recompute);
    expect_same_program(plain, passed);
    EXPECT_EQ(bystander->declared, 1);
    EXPECT_GT(bystander->seen, 0);  // it saw the forward ops (of the micro-step and of eval)
  }
}

TEST(ForwardRewrite, FrozenParametersHaveNoGradientMasterOrStateAndNoWeightGradientProduct) {
  Policy pol = tiny_policy();
  pol.precision = Precision::bf16;
  pol.grad_accum = 2;
  pol.freeze = {"h.*.attn.*", "wte.weight"};
  const Program p = build(pol);
  std::set<TensorId> frozen;
  int n_frozen = 0;
  for (const ParamEntry& e : p.params()) {
    const bool should = parameter_name_matches("h.*.attn.*", e.name) || e.name == "wte.weight";
    EXPECT_EQ(e.frozen(), should) << e.name;
    if (e.frozen()) {
      ++n_frozen;
      frozen.insert(e.value);
      EXPECT_EQ(e.grad, kNoTensor) << e.name;
      EXPECT_EQ(e.master, kNoTensor) << e.name;
      EXPECT_TRUE(e.state.empty()) << e.name;
      EXPECT_EQ(p.tensor(e.value).dtype, DType::bf16) << e.name;  // stored in the compute type
    } else {
      EXPECT_NE(e.grad, kNoTensor) << e.name;
      EXPECT_NE(e.master, kNoTensor) << e.name;
      EXPECT_EQ(e.state.size(), 2u) << e.name;
    }
  }
  EXPECT_EQ(n_frozen, 1 + 4 * int(model_preset("gpt2-tiny").n_layer));
  int input_grads = 0;
  for (const Op& op : p.ops()) {
    for (TensorId out : op.outputs) EXPECT_EQ(frozen.count(out), 0u) << op.name << " writes a frozen parameter";
    if (op.name.find(".attn.c_attn") == std::string::npos && op.name.find(".attn.c_proj") == std::string::npos) continue;
    EXPECT_EQ(op.name.find(".bwd_weight"), std::string::npos) << op.name;
    EXPECT_EQ(op.name.find(".bwd_bias"), std::string::npos) << op.name;
    input_grads += op.name.ends_with(".bwd_input");
  }
  EXPECT_EQ(input_grads, 2 * int(model_preset("gpt2-tiny").n_layer));  // the gradient still flows through them
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::classifier) continue;
    EXPECT_EQ(op.outputs[2], kNoTensor) << "d(wte) of a frozen embedding";
  }
  // The adamw op updates only the trainable parameters.
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::adamw) continue;
    for (TensorId out : op.outputs) EXPECT_EQ(frozen.count(out), 0u);
    EXPECT_EQ(op.inputs.size(), p.params().size() - size_t(n_frozen));
  }
}

TEST(ForwardRewrite, LoraReplacesTargetedLinearsAndDifferentiatesOnlyTheAdapters) {
  Policy pol = tiny_policy();
  pol.lora.rank = 4;
  pol.lora.targets = {"c_attn"};
  const Program p = build(pol, {});
  const int64_t L = model_preset("gpt2-tiny").n_layer;
  int trainable = 0;
  for (const ParamEntry& e : p.params()) {
    const bool adapter = e.name.find(".lora_") != std::string::npos;
    EXPECT_EQ(e.trainable, adapter) << e.name;
    trainable += e.trainable;
  }
  EXPECT_EQ(trainable, 2 * L);
  int branches = 0, weight_grads = 0;
  for (const Op& op : p.ops()) {
    branches += op.name.ends_with("c_attn.lora_B");  // micro-step and eval forwards
    if (op.name.ends_with(".bwd_weight")) {
      ++weight_grads;
      EXPECT_NE(op.name.find(".lora_"), std::string::npos) << op.name << ": only adapters get weight gradients";
    }
  }
  EXPECT_EQ(branches, 2 * L);
  EXPECT_EQ(weight_grads, 2 * L);
  // The base product writes the linear's own output and the adapter adds into it in place,
  // so every reader is unchanged: in each forward (micro-step, eval), first the product, then
  // the adapter's update.
  const TensorId y = p.find_tensor("h.0.attn.c_attn.y");
  ASSERT_NE(y, kNoTensor);
  std::vector<std::string> writers;
  for (const Op& op : p.ops())
    for (size_t j = 0; j < op.outputs.size(); ++j)
      if (op.outputs[j] == y && op.phase == Phase::forward)
        writers.push_back(op.name + (op.modes.at(j) == WriteMode::update ? " update" : " overwrite"));
  ASSERT_GE(writers.size(), 2u);
  EXPECT_EQ(writers[0], "h.0.attn.c_attn overwrite");
  EXPECT_EQ(writers[1], "h.0.attn.c_attn.lora_B update");
  EXPECT_TRUE(p.tensor(y).requires_grad);  // A and B lie behind it, though W does not
}

void expect_refused(const Policy& pol, const Topology& topo, const std::vector<std::string>& needles) {
  try {
    build_training_program(model_preset("gpt2-tiny"), pol, topo, cpu_capabilities());
    ADD_FAILURE() << "built";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << n << " in: " << m;
  }
}

TEST(ForwardRewrite, PatternsMatchNamesWithOrWithoutTheHfPrefix) {
  EXPECT_TRUE(parameter_name_matches("h.*.attn.*", "h.0.attn.c_attn.weight"));
  EXPECT_TRUE(parameter_name_matches("transformer.h.*.attn.*", "h.11.attn.c_proj.bias"));
  EXPECT_TRUE(parameter_name_matches("model.embed_tokens.weight", "embed_tokens.weight"));
  EXPECT_FALSE(parameter_name_matches("h.*.attn.*", "h.0.mlp.c_fc.weight"));
  EXPECT_FALSE(parameter_name_matches("wte.weight", "wpe.weight"));
  EXPECT_FALSE(parameter_name_matches("h.1*", "h.0.ln_1.weight"));
}

TEST(ForwardRewrite, RefusalsNameTheProblem) {
  Policy pol = tiny_policy();
  pol.freeze = {"h.*.atn.*"};
  expect_refused(pol, {}, {"[policy]", "'h.*.atn.*' matches no parameter", "wte.weight"});
  pol.freeze = {"*"};
  expect_refused(pol, {}, {"[policy]", "every parameter is frozen"});
  // Freezing with data parallelism is built (graph/zero.hpp; tests/graph/zero_program_test.cpp).
  pol.freeze = {"h.0.*"};
  pol.zero_stage = 1;
  EXPECT_NO_THROW(build_training_program(model_preset("gpt2-tiny"), pol, Topology{2, 1, 0}, cpu_capabilities()));
}

TEST(ForwardRewrite, StorageRecordsAreChecked) {
  Program p = build(tiny_policy());
  for (const ParamEntry& e : p.params()) {
    EXPECT_TRUE(e.plain_storage()) << e.name;
    EXPECT_EQ(e.stored(ParamRole::value), e.value);
    EXPECT_EQ(e.stored(ParamRole::codes), kNoTensor);
  }
  EXPECT_EQ(p.trainable_parameter_count(), p.parameter_count());
  // A trainable parameter must have a value to update; a frozen one must carry no state.
  ParamEntry& e = p.params()[1];
  const TensorId value = e.value;
  e.storage = {{ParamRole::codes, value}};
  e.value = kNoTensor;
  EXPECT_THROW(p.validate(), Error);
  e.storage = {{ParamRole::value, value}};
  e.value = value;
  e.trainable = false;
  EXPECT_THROW(p.validate(), Error);  // still has a gradient, master or state
}

}  // namespace
}  // namespace memfit
