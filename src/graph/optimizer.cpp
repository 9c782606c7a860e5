#include "graph/optimizer.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace memfit {

TensorId update_target(const ParamEntry& e) { return e.master != kNoTensor ? e.master : e.value; }

bool has_8bit_state(const Program& p, const ParamEntry& e, const Policy& policy) {
  return policy.optimizer == OptimizerKind::adamw8bit && p.tensor(e.value).numel() >= kMin8bitElements;
}

void declare_optimizer_state(GraphBuilder& b, const Policy& policy) {
  Program& p = b.program();
  for (ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    const TensorDesc& t = p.tensor(e.value);
    const Shape shape = t.shape;
    b.set_layer(t.layer);
    if (has_8bit_state(p, e, policy)) {
      const Shape blocks{(shape.numel() + kQuantBlock - 1) / kQuantBlock};
      e.state.push_back(b.persistent("adamw8bit.m." + e.name, shape, Category::optimizer_state, DType::u8));
      e.state.push_back(b.persistent("adamw8bit.v." + e.name, shape, Category::optimizer_state, DType::u8));
      e.state.push_back(b.persistent("adamw8bit.m_absmax." + e.name, blocks, Category::optimizer_state));
      e.state.push_back(b.persistent("adamw8bit.v_absmax." + e.name, blocks, Category::optimizer_state));
    } else {
      e.state.push_back(b.persistent("adamw.m." + e.name, shape, Category::optimizer_state));
      e.state.push_back(b.persistent("adamw.v." + e.name, shape, Category::optimizer_state));
    }
  }
  b.set_layer(-1);
}

void emit_optimizer_step(GraphBuilder& b, const Policy& policy) {
  Program& p = b.program();
  b.set_phase(Phase::optimizer);
  b.set_layer(-1);
  AdamWAttrs a;
  a.beta1 = policy.adamw.beta1;
  a.beta2 = policy.adamw.beta2;
  a.eps = policy.adamw.eps;
  a.max_grad_norm = policy.grad_clip;
  a.block = kQuantBlock;

  // One update op per state layout: grads, then targets and state tensors grouped by role.
  struct Group {
    std::vector<TensorId> grads;
    std::vector<std::vector<TensorId>> outputs;  // [targets, state role 0, role 1, ...]
    std::vector<float> decay;
    double elements = 0;
  };
  Group fp32, q8;
  fp32.outputs.resize(3);
  q8.outputs.resize(5);
  std::vector<TensorId> all_grads;
  double all_elements = 0;
  for (const ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    MEMFIT_ASSERT(e.grad != kNoTensor, "parameter {} received no gradient", e.name);
    Group& g = e.state.size() == 4 ? q8 : fp32;
    MEMFIT_ASSERT(g.outputs.size() == e.state.size() + 1, "parameter {} has {} state tensors", e.name, e.state.size());
    g.grads.push_back(e.grad);
    g.outputs[0].push_back(update_target(e));
    for (size_t r = 0; r < e.state.size(); ++r) g.outputs[r + 1].push_back(e.state[r]);
    g.decay.push_back(e.decay ? policy.adamw.weight_decay : 0.0f);
    const double n = double(p.tensor(e.value).numel());
    g.elements += n;
    all_elements += n;
    all_grads.push_back(e.grad);
  }

  TensorId norm = kNoTensor;
  if (policy.grad_clip > 0) {
    const GradNormAttrs na;
    norm = b.persistent(kGradNorm, Shape{1}, Category::activations);
    const int64_t chunks = std::max<int64_t>(1, (int64_t(all_elements) + na.chunk - 1) / na.chunk);
    const TensorId partials = b.transient("grad_norm.partials", Shape{chunks}, Category::temporaries);
    b.emit({OpKind::grad_norm, "grad_norm", all_grads, {norm}, na, 2.0 * all_elements, {WriteMode::overwrite},
            {partials}});
  }
  auto emit_update = [&](OpKind kind, const char* name, Group& g, double flops_per_element) {
    if (g.grads.empty()) return;
    AdamWAttrs attrs = a;
    attrs.weight_decay = g.decay;
    std::vector<TensorId> inputs = g.grads;
    if (norm != kNoTensor) inputs.push_back(norm);
    std::vector<TensorId> outputs;
    for (const auto& role : g.outputs) outputs.insert(outputs.end(), role.begin(), role.end());
    std::vector<WriteMode> modes(outputs.size(), WriteMode::update);
    b.emit({kind, name, inputs, outputs, attrs, flops_per_element * g.elements, modes});
  };
  emit_update(OpKind::adamw8bit, "adamw8bit", q8, 24.0);
  emit_update(OpKind::adamw, "adamw", fp32, 12.0);
  // Mixed precision: the updated masters are narrowed into the 16-bit parameters.
  for (const ParamEntry& e : p.params())
    if (e.trainable && e.master != kNoTensor)
      b.emit({OpKind::cast, "cast." + e.name, {e.master}, {e.value}, NoAttrs{}, double(p.tensor(e.value).numel())});
}

}  // namespace memfit
