// PEFT adapter directories: adapter_config.json (PEFT's LoraConfig) and adapter_model.safetensors
// (the adapters under PEFT's names), as peft.PeftModel.from_pretrained loads them onto the
// transformers base model and as PeftModel.save_pretrained writes them.
// PEFT names an adapter tensor after the module path of the wrapped HF model:
//   memfit "layers.0.self_attn.q_proj.lora_A.weight" <-> "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
//   memfit "h.0.attn.c_attn.lora_B.weight"           <-> "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"
// A is [r, in] and B [out, r] in both; GPT-2's Conv1D storage (fan_in_fan_out) transposes only
// the base weight, never the adapters.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "runtime/executor.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

struct RunConfig;

// "<module>.lora_A.weight", "<module>.lora_B.weight" or (DoRA) "<module>.lora_magnitude_vector"
bool is_lora_adapter(const std::string& param);
// PEFT's name of a memfit parameter ("base_model.model." + the HF name; llama's output head is
// "base_model.model.lm_head.weight").
std::string peft_tensor_name(const ModelSpec& spec, const std::string& param);

// The adapter_config.json of a run: LoraConfig's keys with PEFT's defaults; target_modules as
// the run gave them, or (PEFT's defaults, "all-linear") the names of the modules they matched.
nlohmann::json adapter_config_json(const Program& p, const ModelSpec& spec, const LoraPolicy& lora,
                                   const std::string& base_model);

// Reads DIR/adapter_config.json onto `lora`: a run without LoRA settings takes the file's; one
// with them (a rank given) must agree on r, lora_alpha and target_modules. Throws [adapter].
void apply_adapter_config(const std::string& dir, LoraPolicy& lora);

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (fp32): the adapters and,
// with bias all | lora_only, the trained biases under PEFT's names (a module with a LoRA
// branch holds its bias as "<module>.base_layer.bias"). `whole`: every parameter gathered
// (ZeRO), else the values are read from the executor.
void save_adapter(const std::string& dir, const Executor& ex, const ModelSpec& spec, const LoraPolicy& lora,
                  const std::string& base_model, TensorStaging& staging,
                  const std::vector<std::vector<float>>* whole = nullptr);

// A run's weights before its first step: --load's (the adapters of a base checkpoint as PEFT
// starts them) or the seeded initialisation, an OLoRA / PiSSA start, DoRA's magnitudes, then
// --load-adapter's. `resuming`: a checkpoint replaces them afterwards, so nothing starts.
void load_run_weights(const RunConfig& config, Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                      bool resuming);

// The weights of a program that only infers (eval, generate): --load's (the adapters of a
// base checkpoint as PEFT starts them), else the seeded initialisation; then --load-adapter's.
// Says on `log` what it used.
void load_inference_weights(const RunConfig& config, Executor& ex, const ModelSpec& spec, TensorStaging& staging,
                            std::ostream& log);

// Loads DIR/adapter_model.safetensors into the program's adapters and trained biases. An
// adapter made for another base (a tensor missing, extra or of another shape) is refused
// naming the first difference.
// `lora`: the run's LoRA settings (apply_adapter_config already made them the file's).
void load_adapter(const std::string& dir, Executor& ex, const ModelSpec& spec, const LoraPolicy& lora,
                  TensorStaging& staging);

}  // namespace memfit
