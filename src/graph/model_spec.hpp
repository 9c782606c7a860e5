// The shape of a transformer: everything the program builder needs to know about a model.
// Presets carry the published shapes; HF config.json files are read by io/hf_config.hpp.
// Invariant: a spec that passed validate() has sizes every kernel can index and a parameter
// count that fits int64_t with room to spare, so the builder's shape arithmetic is exact.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/op.hpp"

namespace memfit {

// Bounds every published model satisfies, checked by ModelSpec::validate before any program is
// built (with core/checked.hpp's kMaxKernelDim for every matrix dimension).
inline constexpr int64_t kMaxLayers = 10'000;  // 10x the deepest published transformer (DeepNet, 1,000 layers)
inline constexpr int64_t kMaxParameters = int64_t(1) << 50;  // ~1.1e15, ~500x the largest models trained

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
  // HF's rope type ("default", "linear", "llama3", "dynamic", "yarn", "longrope"): every type is
  // planned; the kernels compute default, linear and llama3 (rope_scaling), so only those train.
  std::string rope_type = "default";
  RopeScaling rope_scaling;
  bool qkv_bias = false;     // llama family: biases on q, k and v (qwen2)

  int64_t head_dim() const { return n_embd / n_head; }
  // Parameter count from closed-form shape arithmetic (padded vocabulary rows included);
  // throws [model] naming the term that overflows int64_t.
  int64_t parameter_count() const;
  // Rows of the fused q/k/v projection (gpt2: 3C; llama: (NH + 2 KV) x head size).
  int64_t qkv_rows() const;
  // Throws [model] naming the field when shapes are inconsistent (heads not dividing C, zero
  // sizes, ...) or out of bounds (kMaxLayers, kMaxKernelDim, kMaxParameters).
  void validate() const;
};

int64_t pad_vocab(int64_t vocab, int64_t multiple = 64);
// Throws [model] listing the known names.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

}  // namespace memfit
