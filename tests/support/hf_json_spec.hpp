// The ModelSpec an HF config (or a fixture's model block) describes, built from its own keys
// with HF's defaults where it leaves one out, so that the fit tests do not lean on
// io/hf_config's reading. The kind is "model_type" (an HF config) or "arch" (the fixture tools'
// model blocks).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "graph/model_spec.hpp"

namespace memfit::test {

inline ModelSpec spec_of_hf_json(const nlohmann::json& c) {
  const std::string kind = c.contains("model_type") ? c.at("model_type") : c.at("arch");
  ModelSpec s;
  if (kind == "gpt2") {
    s.arch = Arch::gpt2;
    s.n_layer = c.at("n_layer"), s.n_embd = c.at("n_embd"), s.n_head = c.at("n_head");
    s.n_kv_head = s.n_head;
    s.n_inner = c.value("n_inner", nlohmann::json()).is_null() ? 4 * s.n_embd : c.at("n_inner").get<int64_t>();
    s.max_seq = c.at("n_positions");
    s.tied_embeddings = true;
  } else {
    s.arch = Arch::llama;
    s.n_layer = c.at("num_hidden_layers"), s.n_embd = c.at("hidden_size"), s.n_head = c.at("num_attention_heads");
    s.n_kv_head = c.at("num_key_value_heads"), s.n_inner = c.at("intermediate_size");
    s.max_seq = c.at("max_position_embeddings");
    s.tied_embeddings = c.value("tie_word_embeddings", false);
  }
  s.vocab_size = c.at("vocab_size");
  s.padded_vocab = pad_vocab(s.vocab_size);
  s.name = kind;
  return s;
}

}  // namespace memfit::test
