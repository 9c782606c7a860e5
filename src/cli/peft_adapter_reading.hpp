// Reading a PEFT LoRA adapter beside an HF base checkpoint, tensor by tensor and without a
// program (memfit merge-lora, memfit convert-lora): PEFT's names, the modules the adapter wraps,
// the tensors it trains whole, and the factors an OLoRA / PiSSA start took from a base weight.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "io/safetensors.hpp"
#include "train/lora_start_factors.hpp"

namespace memfit::cli {

constexpr std::string_view kPeftPrefix = "base_model.model.";

struct Adapter {
  std::string a, b;       // PEFT tensor names
  std::string magnitude;  // DoRA's lora_magnitude_vector, if any
  bool used = false;
};

// The base checkpoint's name as PEFT's wrapped model has it: "model." (llama) or
// "transformer." (gpt2) first; the hub's gpt2 and a bare LlamaModel store names without it.
std::string wrapped_name(const ModelSpec& spec, const std::string& name);

bool is_adapter_factor(const std::string& name);  // lora_A, lora_B or a DoRA magnitude

// The tensors trained whole beside the adapters (the biases of bias all | lora_only, the
// modules of modules_to_save), by the wrapped HF name of the base tensor they replace
// ("transformer.h.0.attn.c_attn.bias" for PEFT's "...c_attn.base_layer.bias").
std::map<std::string, std::string> replaced_tensors(const SafetensorsReader& r);

// The adapter's modules by their wrapped HF path ("model.layers.0.self_attn.q_proj").
std::map<std::string, Adapter> adapter_modules(const SafetensorsReader& r, const std::string& dir, bool dora);

// The factors an OLoRA / PiSSA start takes from base weight w ([rows, cols] as the file stores
// it: [in, out] for GPT-2's Conv1D), computed again as the training run computed them.
LowRankFactors start_factors_of(const std::vector<float>& w, const Shape& shape, int64_t rank, double scale,
                                const LoraPolicy& lora, bool conv1d, const std::string& name);

}  // namespace memfit::cli
