#include "graph/optimizer.hpp"

#include "core/error.hpp"

namespace memfit {

void declare_optimizer_state(GraphBuilder& b, const Policy& policy) {
  Program& p = b.program();
  MEMFIT_ASSERT(policy.optimizer == OptimizerKind::adamw, "optimizer {} has no state layout", optimizer_name(policy.optimizer));
  for (ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    const TensorDesc& t = p.tensor(e.value);
    b.set_layer(t.layer);
    e.state.push_back(b.persistent("adamw.m." + e.name, t.shape, Category::optimizer_state));
    e.state.push_back(b.persistent("adamw.v." + e.name, t.shape, Category::optimizer_state));
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
  std::vector<TensorId> grads, params, ms, vs;
  double elements = 0;
  for (const ParamEntry& e : p.params()) {
    if (!e.trainable) continue;
    MEMFIT_ASSERT(e.grad != kNoTensor, "parameter {} received no gradient", e.name);
    grads.push_back(e.grad);
    params.push_back(e.master != kNoTensor ? e.master : e.value);  // mixed precision: the fp32 master
    ms.push_back(e.state[0]);
    vs.push_back(e.state[1]);
    a.weight_decay.push_back(e.decay ? policy.adamw.weight_decay : 0.0f);
    elements += double(p.tensor(e.value).numel());
  }
  std::vector<TensorId> outputs = params;
  outputs.insert(outputs.end(), ms.begin(), ms.end());
  outputs.insert(outputs.end(), vs.begin(), vs.end());
  std::vector<WriteMode> modes(outputs.size(), WriteMode::update);
  b.emit({OpKind::adamw, "adamw", grads, outputs, a, 12.0 * elements, modes});
  // Mixed precision: the updated masters are narrowed into the 16-bit parameters.
  for (const ParamEntry& e : p.params())
    if (e.trainable && e.master != kNoTensor)
      b.emit({OpKind::cast, "cast." + e.name, {e.master}, {e.value}, NoAttrs{}, double(p.tensor(e.value).numel())});
}


}  // namespace memfit
