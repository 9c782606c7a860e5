// HF transformers config.json in and out. Reading maps the keys of the supported model types
// onto a ModelSpec; writing produces a config.json that GPT2LMHeadModel loads.
//
// Invariant: read_hf_config returns a spec that passed ModelSpec::validate(), or throws
// [config] naming the file and the offending key. Keys that change the model's math in a way
// memfit does not implement (another activation, a head_dim that is not hidden/heads, biases
// on llama projections) are refused rather than ignored. Known gaps, where ModelSpec has no
// field yet: rope_scaling (Llama 3.1) and mistral's sliding_window are read past, not modelled.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "graph/model_spec.hpp"

namespace memfit {

// model_type "gpt2" -> Arch::gpt2; "llama", "mistral", "qwen2" -> Arch::llama.
ModelSpec read_hf_config(const std::string& path);

// The config.json for a gpt2 spec (vocab_size is the real vocabulary, not the padded one).
// Throws [config] for a non-gpt2 spec.
nlohmann::json gpt2_hf_config(const ModelSpec& spec);
// The HF config.json of a llama-family model (model_type llama, or qwen2 when q, k and v carry
// biases), with the keys read_hf_config reads back.
nlohmann::json llama_hf_config(const ModelSpec& spec);
// The config.json HF transformers loads `spec` with: GPT-2 or llama family.
nlohmann::json hf_config(const ModelSpec& spec);

}  // namespace memfit
