// The shape of a transformer: everything the program builder needs to know about a model.
// Presets carry the published shapes; HF config.json files are read by io/hf_config.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace memfit {

enum class Arch : uint8_t { gpt2, llama };
std::string_view arch_name(Arch a);

struct ModelSpec {
  std::string name;
  Arch arch = Arch::gpt2;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;     // grouped-query attention (llama); = n_head for gpt2
  int64_t n_embd = 0;        // C
  int64_t n_inner = 0;       // MLP hidden size (gpt2: 4C)
  int64_t vocab_size = 0;    // real vocabulary
  int64_t padded_vocab = 0;  // rows of the embedding table (multiple of 64 for GEMM speed)
  int64_t max_seq = 0;       // n_positions / max_position_embeddings
  float norm_eps = 1e-5f;
  bool tied_embeddings = true;
  float rope_theta = 10000.0f;
  std::string rope_type = "default";  // HF's rope scaling ("llama3", "linear", ...): planned, not trained
  bool qkv_bias = false;     // llama family: biases on q, k and v (qwen2)

  int64_t head_dim() const { return n_embd / n_head; }
  // Parameter count from closed-form shape arithmetic (padded vocabulary rows included).
  int64_t parameter_count() const;
  // Throws [model] when shapes are inconsistent (heads not dividing C, zero sizes, ...).
  void validate() const;
};

int64_t pad_vocab(int64_t vocab, int64_t multiple = 64);
// Throws [model] listing the known names.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

}  // namespace memfit
