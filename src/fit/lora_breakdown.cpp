#include "fit/lora_breakdown.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace memfit {

namespace {

bool is_adapter(const ParamEntry& e) { return e.name.find(".lora_") != std::string::npos; }

}  // namespace

LoraBreakdown lora_breakdown(const Program& p, const Policy& policy) {
  LoraBreakdown l;
  l.on = true;
  l.rank = policy.lora.rank;
  for (const ParamEntry& e : p.params()) {
    if (is_adapter(e)) {
      if (e.name.find(".lora_A.") != std::string::npos) ++l.adapters;
      if (e.name.ends_with(".lora_magnitude_vector")) l.dora_magnitudes += p.param_numel(e);
      l.adapter_elements += p.param_numel(e);
      l.adapter_bytes[size_t(Category::parameters)] += p.tensor(e.value).bytes();
      if (e.grad != kNoTensor) l.adapter_bytes[size_t(Category::gradients)] += p.tensor(e.grad).bytes();
      if (e.master != kNoTensor) l.adapter_bytes[size_t(Category::master_weights)] += p.tensor(e.master).bytes();
      for (TensorId s : e.state) l.adapter_bytes[size_t(Category::optimizer_state)] += p.tensor(s).bytes();
    } else if (e.frozen() && e.value == kNoTensor) {
      ++l.quantized_tensors;
      l.quantized_elements += p.param_numel(e);
      for (const StoredTensor& s : e.storage) l.quantized_bytes += p.tensor(s.id).bytes();
    } else if (e.frozen()) {
      l.frozen_bytes += p.tensor(e.value).bytes();
    }
  }
  if (policy.quantize_base.enabled())
    l.quant = fmt::format("{}, block {}{}", base_quant_name(policy.quantize_base.kind), policy.quantize_base.block,
                          policy.quantize_base.double_quant ? ", double quantisation" : "");
  // The branch's saved tensors (x A^T, dropout(x); DoRA's z) of one micro-step's forward, the
  // largest tile and fp32 input-gradient workspace of the quantised products, DoRA's norms.
  const Section* micro = p.find_section(SectionKind::micro);
  for (int i = micro ? micro->begin : 0; i < (micro ? micro->end : 0); ++i) {
    const Op& op = p.op(i);
    if (op.phase == Phase::forward && (op.name.ends_with(".lora_A") || op.name.ends_with(".lora_dropout")))
      l.branch_bytes += p.tensor(op.outputs[0]).bytes();
    if (op.phase == Phase::forward && op.kind == OpKind::dora_scale) l.dora_saved_bytes += p.tensor(op.inputs[0]).bytes();
    if (op.phase == Phase::forward && op.kind == OpKind::dora_blend)  // with dropout: each block's z = p + q
      for (size_t i = 1; i < op.outputs.size(); ++i) l.dora_saved_bytes += p.tensor(op.outputs[i]).bytes();
    if (op.phase == Phase::forward && op.kind == OpKind::dora_norm) l.dora_norm_flops += op.flops;
    if (op.kind == OpKind::quant_linear || op.kind == OpKind::quant_linear_backward) {
      l.tile_bytes = std::max(l.tile_bytes, p.tensor(op.workspace[0]).bytes());
      if (op.workspace.size() > 1 && p.tensor(op.workspace[1]).dtype == DType::f32)
        l.input_grad_bytes = std::max(l.input_grad_bytes, p.tensor(op.workspace[1]).bytes());
    }
  }
  return l;
}

std::string lora_proposal_note(const Policy& p) {
  const bool q = p.quantize_base.enabled();
  return fmt::format("        changes what trains: only LoRA adapters (rank {}) on the frozen base{}; nothing that "
                     "trains every weight fits without offload (--lora-rank {} --lora-targets all-linear{}{})\n",
                     p.lora.rank, q ? ", stored in 4-bit NF4" : "", p.lora.rank,
                     q ? " --quantize-base nf4 --double-quant" : "", p.zero_stage == 3 ? " --zero 3" : "");
}

}  // namespace memfit
