// LoRA and a quantised frozen base (QLoRA) in estimates, until the builder expresses them.
//
// LABELLED ESTIMATE. The program planned is a proxy: the run's policy without LoRA and
// quantisation, with every base parameter frozen except the weights LoRA targets (and the
// biases its `bias` option trains). The proxy's backward therefore runs where LoRA's does (from
// the loss down to the first adapter, the input gradient through every frozen layer) and saves
// what LoRA's saves: each targeted linear's input (LoRA needs it for dA as the proxy does for
// dW). Onto its per-op live bytes the estimate then applies what the proxy lacks or has too much:
//   - model states: the targeted weights become frozen storage (quant_storage() bytes when the
//     base is quantised, else the compute dtype, as graph/precision.cpp stores a frozen
//     parameter), and the adapters A [r, in], B [out, r] get the value, gradient, master and
//     optimizer state a trainable parameter of their size gets; each model-state category's
//     live bytes at every op scale by its new total over the proxy's;
//   - activations: x A^T [tokens, r] per adapter (what dB needs), plus dropout(x) [tokens, in]
//     per adapter when dropout > 0 (PEFT drops x apart for each adapter), from the layer's
//     forward to its backward (temporaries from its recompute instead, in whole-block recompute);
//   - temporaries (quantised base): one dequantisation tile of kQuantTileRows x in in the compute
//     dtype at every op of a block, and under 16-bit compute the fp32 input gradient the
//     quantised product accumulates over its tiles (kernels/quant/quant_matmul.hpp) in backward;
//   - time: the targeted weights' gradient products are removed (a frozen weight has none), the
//     optimizer scaled to the adapters' elements, the adapters' six products (two forward, four
//     backward; two more per recomputed block) and each quantised weight's dequantisation
//     (codes read, the tile written and read) added, each by the same roofline as other ops.
// Quantised storage is per memfit parameter (the fused q/k/v projection is one tensor; bnb
// quantises q, k and v apart: a few bytes of offsets and partial blocks differ).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fit/estimate.hpp"

namespace memfit {

// Rows of W the quantised products dequantise at once. kernels/quant has no default: this is
// the planner's choice until the quantised-base pass names one.
inline constexpr int64_t kQuantTileRows = 64;

// One linear layer LoRA can adapt, as PEFT sees it (HF module path, in and out features), and
// the memfit parameter that holds its rows (q, k and v share the fused qkv projection).
struct LoraLinear {
  std::string module;  // "model.layers.0.self_attn.q_proj", "transformer.h.0.attn.c_attn"
  std::string param;   // "layers.0.self_attn.qkv_proj.weight"
  std::string bias;    // memfit bias parameter of the module, "" when it has none
  int layer = 0;
  int64_t in = 0, out = 0;
};

// Every linear of the model's blocks (never lm_head), in block order.
std::vector<LoraLinear> model_linears(const ModelSpec& spec);
// PEFT's target_modules when none are given: llama family q_proj, v_proj; gpt2 c_attn.
std::vector<std::string> default_lora_targets(const ModelSpec& spec);
// The linears LoRA adapts: names as PEFT matches them (the module path or its last components;
// "all-linear"), or target_regex full-matching the module path. Throws [policy] for a name
// that matches nothing (listing the names that exist) and for a rank above min(in, out).
std::vector<LoraLinear> lora_targets(const ModelSpec& spec, const LoraPolicy& lora);

// Whether an estimate of the policy goes through this model (LoRA or a quantised base).
inline bool lora_estimated(const Policy& p) { return p.lora.enabled() || p.quantize_base.enabled(); }
// The proxy's policy (see above).
Policy lora_proxy_policy(const ModelSpec& spec, const Policy& policy);
// The unsharded summary of a LoRA or quantised-base policy: the proxy planned, then modified.
ProgramSummary plan_lora_summary(const ModelSpec& spec, const Policy& policy, const Hardware& hw,
                                 const EstimateOptions& options);

}  // namespace memfit
