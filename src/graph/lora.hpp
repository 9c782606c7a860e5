// LoRA (Hu et al. 2021, as PEFT builds it) as a forward rewrite: every base parameter is
// frozen, and each targeted linear layer y = x W^T + b gains a trainable low-rank branch,
//   y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,   A [r, in], B [out, r],
// A drawn as PEFT's kaiming_uniform_(a = sqrt(5)) (U(+-1/sqrt(in))), B zero, so training
// starts from the base model. The base product keeps its op name and inputs, so a later pass
// (graph/quantize_base) can replace it. Adapters are named as PEFT names them:
// "<module>.lora_A.weight", "<module>.lora_B.weight".
// Llama's q_proj, k_proj and v_proj are row blocks of memfit's one fused qkv_proj weight; a
// branch on one of them adds into its column block of the product (add_columns).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/forward_rewrite.hpp"

namespace memfit {

// A linear layer as PEFT sees it: its HF module name and the rows of a memfit weight it owns.
struct LinearModule {
  std::string name;    // "layers.0.self_attn.q_proj" (memfit's names drop HF's "model." / "transformer.")
  std::string weight;  // the memfit parameter holding it: "layers.0.self_attn.qkv_proj.weight"
  std::string bias;    // the bias parameter of the weight, or empty
  int64_t row_begin = 0, rows = 0;  // its rows [row_begin, row_begin + rows) of the weight: out features
  int64_t cols = 0;                 // in features
  int64_t weight_rows = 0;          // rows of the whole weight
  bool whole() const { return rows == weight_rows; }
  std::string short_name() const;  // the last component: "q_proj"
};
// Every linear layer of a model's program, in parameter order: the 2-D ".weight" parameters
// other than embeddings and the output head, fused q/k/v split into HF's three modules.
std::vector<LinearModule> linear_modules(const Program& p);

// The modules `lora` targets (PEFT's matching: a module whose name is a target or ends with
// "." + target; "all-linear"; a regular expression full-matching the HF module path; empty:
// PEFT's default for the architecture), less exclude_modules, the modules of modules_to_save
// and, with layers_to_transform, the other layers' modules. Throws [policy] for a target that
// matches nothing (naming the modules there are), for no target left, and for a rank above
// min(in, out) of a target.
std::vector<LinearModule> lora_targets(const Program& p, const LoraPolicy& lora);

// The parameters (memfit names, sorted) of the modules that `lora.modules_to_save` trains whole
// beside the adapters: every module whose HF path ends with one of the names, as PEFT's
// _set_trainable matches ("norm" is model.norm and every layer's input_layernorm and
// post_attention_layernorm). Throws [policy] for a name that matches nothing (naming the
// modules there are), only a module holding others, a piece of llama's fused
// q/k/v, or an embedding tied to the output head.
std::vector<std::string> lora_modules_to_save(const Program& p, const LoraPolicy& lora);

// The module's path in the HF model PEFT wraps ("model.layers.0.mlp.up_proj"): what
// rank_pattern and alpha_pattern match (LoraPolicy::rank_of, scale_of).
std::string lora_module_path(const Program& p, const std::string& module);
std::string lora_a_name(const std::string& module);  // "<module>.lora_A.weight"
std::string lora_b_name(const std::string& module);  // "<module>.lora_B.weight"
std::string lora_magnitude_name(const std::string& module);  // "<module>.lora_magnitude_vector" (DoRA)

// data_rank: this rank's index among the data-parallel ranks, whose rows of the global batch
// follow the lower ranks' (dropout draws the one-rank run's mask on them).
std::shared_ptr<ForwardRewrite> make_lora_rewrite(const LoraPolicy& lora, int data_rank = 0);

}  // namespace memfit
