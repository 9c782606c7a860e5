#include "graph/forward_rewrite.hpp"

#include <fnmatch.h>

#include <utility>

#include "core/error.hpp"
#include "graph/lora.hpp"
#include "graph/optimizer.hpp"
#include "graph/precision.hpp"
#include "graph/quantize_base.hpp"

namespace memfit {

namespace {

// --freeze: every parameter whose name matches one of the patterns is frozen. A pattern that
// matches nothing is refused, naming a few parameters, since it is almost always a typo.
class FreezeByPattern final : public ForwardRewrite {
 public:
  explicit FreezeByPattern(std::vector<std::string> patterns) : patterns_(std::move(patterns)) {}
  std::string name() const override { return "freeze"; }
  void declare(GraphBuilder& b) override {
    Program& p = b.program();
    for (const std::string& pattern : patterns_) {
      bool matched = false;
      for (ParamEntry& e : p.params()) {
        if (!parameter_name_matches(pattern, e.name)) continue;
        matched = true;
        if (e.trainable) freeze_parameter(p, e);
      }
      MEMFIT_CHECK(matched, "policy", "freeze pattern '{}' matches no parameter (names look like '{}', '{}')", pattern,
                   p.params().front().name, p.params().size() > 2 ? p.params()[2].name : p.params().back().name);
    }
  }

 private:
  std::vector<std::string> patterns_;
};

// Derives requires_grad again over the forward ops [begin, end): after a replacement an
// activation may newly lead to a trainable parameter (a low-rank branch on a frozen layer)
// or no longer lead to one.
void derive_requires_grad(Program& p, int begin, bool grad_enabled) {
  for (int i = begin; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    if (op.phase != Phase::forward) continue;
    bool grad = false;
    for (TensorId in : op.inputs) grad = grad || (in != kNoTensor && p.tensor(in).requires_grad);
    for (TensorId out : op.outputs)
      if (out != kNoTensor && p.tensor(out).category != Category::parameters)
        p.tensor(out).requires_grad = grad_enabled && grad;
  }
}

}  // namespace

ForwardRewrites forward_rewrites_for(const Policy& policy, int data_rank) {
  ForwardRewrites passes;
  if (!policy.freeze.empty()) passes.push_back(std::make_shared<FreezeByPattern>(policy.freeze));
  if (policy.lora.enabled()) passes.push_back(make_lora_rewrite(policy.lora, data_rank));
  MEMFIT_CHECK((policy.quantize_base.enabled() && policy.quantize_base.kind != BaseQuant::int8) ||
                   !policy.quantize_base.double_quant,
               "policy", "--double-quant quantises the absmax of a 4-bit base: {}",
               policy.quantize_base.enabled() ? "use --quantize-base nf4 or fp4, not int8"
                                              : "add --quantize-base nf4 or fp4");
  if (policy.quantize_base.enabled()) {
    MEMFIT_CHECK(policy.lora.enabled() || !policy.freeze.empty(), "policy",
                 "--quantize-base {} quantises frozen base weights: add LoRA (--lora-rank) or --freeze",
                 base_quant_name(policy.quantize_base.kind));
    passes.push_back(make_quantize_base_pass(policy.quantize_base, compute_dtype(policy.precision)));
  }
  return passes;
}

void declare_forward_rewrites(GraphBuilder& b, const ForwardRewrites& passes) {
  if (passes.empty()) return;
  const int saved_layer = b.layer();
  for (const auto& pass : passes) pass->declare(b);
  b.set_layer(saved_layer);
  MEMFIT_CHECK(b.program().trainable_parameter_count() > 0, "policy",
               "every parameter is frozen: nothing is left to train (check the freeze patterns)");
}

void rewrite_forward(GraphBuilder& b, int begin, const ForwardRewrites& passes) {
  Program& p = b.program();
  bool replaced_any = false;
  const int saved_layer = b.layer();
  const Phase saved_phase = b.phase();
  for (const auto& pass : passes) {
    const std::vector<Op> ops = p.take_ops_from(begin);
    for (const Op& op : ops) {
      b.set_layer(op.layer);
      b.set_phase(op.phase);
      if (op.phase == Phase::forward && pass->rewrite(op, b)) {
        replaced_any = true;
        continue;
      }
      p.add_op(op);
    }
  }
  b.set_layer(saved_layer);
  b.set_phase(saved_phase);
  if (replaced_any) derive_requires_grad(p, begin, b.grad_enabled());
}

void freeze_parameter(Program& p, ParamEntry& e) {
  MEMFIT_ASSERT(e.grad == kNoTensor && e.master == kNoTensor && e.state.empty(),
                "parameter {} frozen after its gradient, master or optimizer state was declared", e.name);
  e.trainable = false;
  for (const StoredTensor& s : e.storage) p.tensor(s.id).requires_grad = false;
}

bool parameter_name_matches(const std::string& pattern, const std::string& name) {
  // memfit's names drop HF's module prefix ("transformer." for GPT-2, "model." for the llama
  // family); a pattern may be written with or without it.
  for (const char* prefix : {"", "transformer.", "model."})
    if (fnmatch(pattern.c_str(), (prefix + name).c_str(), 0) == 0) return true;
  return false;
}

FrozenSummary summarize_frozen(const Program& p, const Policy& policy) {
  const DType cdt = compute_dtype(policy.precision);
  const DType grad_dtype = cdt == DType::f32 ? DType::f32 : policy.grad_dtype;
  FrozenSummary s;
  for (const ParamEntry& e : p.params()) {
    if (e.trainable) continue;
    const int64_t n = p.param_numel(e);
    ++s.params;
    s.elements += n;
    s.gradient_bytes += int64_t(dtype_bytes(grad_dtype, n));
    if (cdt != DType::f32) s.master_bytes += 4 * n;
    if (policy.optimizer == OptimizerKind::adamw8bit && n >= kMin8bitElements)
      s.optimizer_bytes += 2 * n + 2 * 4 * ((n + kQuantBlock - 1) / kQuantBlock);
    else
      s.optimizer_bytes += 8 * n;
  }
  return s;
}

}  // namespace memfit
