// GPT-2: parameters with HF names and GPT-2 initialisation, and the forward pass as ops.
// Linear weights are kept [out, in] (nn.Linear layout); io/ transposes HF's Conv1D [in, out].
#pragma once

#include <string>
#include <vector>

#include "graph/builder.hpp"
#include "graph/model_spec.hpp"
#include "graph/op.hpp"

namespace memfit {

// The attention core's attributes for a model and a (B, T) token tensor: heads, key/value
// heads, head size and the 1/sqrt(head size) scale. Shared by every architecture's forward.
AttentionAttrs attention_attrs(const ModelSpec& spec, const Shape& tokens);
// One rank's heads under tensor parallelism (heads and key/value heads divided by the degree).
AttentionAttrs attention_attrs(const ModelSpec& spec, const Shape& tokens, const TensorParallel& tp);
// Refuses, in one line, a model whose heads, key/value heads, MLP width or padded vocabulary
// the tensor-parallel degree does not divide.
void check_tensor_parallel(const ModelSpec& spec, const TensorParallel& tp);

struct Gpt2Block {
  TensorId ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};
struct Gpt2Params {
  TensorId wte, wpe, lnf_w, lnf_b;
  std::vector<Gpt2Block> blocks;
};

Gpt2Params declare_gpt2_parameters(GraphBuilder& b, const ModelSpec& spec);

// Emits the forward pass for tokens (B, T); returns the final normalised hidden state (B, T, C).
// `prefix` keeps tensor names unique when the forward is emitted twice (training and eval);
// `attention` picks the plain or the flash form of the attention core.
TensorId gpt2_forward(GraphBuilder& b, const ModelSpec& spec, const Gpt2Params& params, TensorId tokens,
                      const std::string& prefix, AttentionKind attention = AttentionKind::plain);

}  // namespace memfit
