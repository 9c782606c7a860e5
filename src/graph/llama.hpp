// LLaMA (and Mistral, Qwen2): parameters and the forward pass as ops, for planning. RMSNorm,
// rotary embeddings, SwiGLU MLP, grouped-query attention, untied embeddings (lm_head).
// Names follow HF without the "model." prefix, except that q, k and v are one fused
// projection "layers.L.self_attn.qkv_proj" ((NH + 2 KV) HS rows: q heads, then k, then v),
// the layout the attention op reads; loading HF weights would concatenate q_proj, k_proj and
// v_proj into it. Memory and FLOPs are those of the three separate projections.
#pragma once

#include <string>
#include <vector>

#include "graph/builder.hpp"
#include "graph/model_spec.hpp"

namespace memfit {

struct LlamaBlock {
  TensorId in_norm, qkv_w, qkv_b = kNoTensor, o_w, post_norm, gate_w, up_w, down_w;
};
struct LlamaParams {
  TensorId embed, norm, lm_head;  // lm_head == embed when the embeddings are tied
  std::vector<LlamaBlock> blocks;
};

LlamaParams declare_llama_parameters(GraphBuilder& b, const ModelSpec& spec);

// Emits the forward pass for tokens (B, T); returns the final normalised hidden state.
TensorId llama_forward(GraphBuilder& b, const ModelSpec& spec, const LlamaParams& params, TensorId tokens,
                       const std::string& prefix, AttentionKind attention = AttentionKind::plain);

}  // namespace memfit
