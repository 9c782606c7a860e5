#include "graph/llama.hpp"

#include <cmath>

#include "core/error.hpp"
#include "graph/gpt2.hpp"  // attention_attrs

namespace memfit {

LlamaParams declare_llama_parameters(GraphBuilder& b, const ModelSpec& s) {
  MEMFIT_ASSERT(s.arch == Arch::llama, "declare_llama_parameters on a {} model", arch_name(s.arch));
  const int64_t C = s.n_embd, F = s.n_inner, HS = s.head_dim();
  const int64_t qkv_rows = (s.n_head + 2 * s.n_kv_head) * HS;
  const float std0 = 0.02f;  // HF's initializer_range for the llama family
  const TensorParallel& tp = b.tensor_parallel();
  check_tensor_parallel(s, tp);
  const std::vector<int64_t> qkv_pieces{s.n_head * HS, s.n_kv_head * HS, s.n_kv_head * HS};
  LlamaParams p;
  b.set_layer(-1);
  p.embed = b.parameter("embed_tokens.weight", Shape{s.padded_vocab, C}, ParamInit::normal, std0, true,
                        tp.rows(Shape{s.padded_vocab, C}));
  for (int64_t l = 0; l < s.n_layer; ++l) {
    b.set_layer(int(l));
    const std::string h = "layers." + std::to_string(l) + ".";
    LlamaBlock k;
    k.in_norm = b.parameter(h + "input_layernorm.weight", Shape{C}, ParamInit::ones, 0, false);
    k.qkv_w = b.parameter(h + "self_attn.qkv_proj.weight", Shape{qkv_rows, C}, ParamInit::normal, std0, true,
                          tp.rows(Shape{qkv_rows, C}, qkv_pieces));
    if (s.qkv_bias) k.qkv_b = b.parameter(h + "self_attn.qkv_proj.bias", Shape{qkv_rows}, ParamInit::zeros, 0, false,
                                           tp.rows(Shape{qkv_rows}, qkv_pieces));
    k.o_w = b.parameter(h + "self_attn.o_proj.weight", Shape{C, s.n_head * HS}, ParamInit::normal, std0, true,
                        tp.columns(Shape{C, s.n_head * HS}));
    k.post_norm = b.parameter(h + "post_attention_layernorm.weight", Shape{C}, ParamInit::ones, 0, false);
    k.gate_w = b.parameter(h + "mlp.gate_proj.weight", Shape{F, C}, ParamInit::normal, std0, true, tp.rows(Shape{F, C}));
    k.up_w = b.parameter(h + "mlp.up_proj.weight", Shape{F, C}, ParamInit::normal, std0, true, tp.rows(Shape{F, C}));
    k.down_w = b.parameter(h + "mlp.down_proj.weight", Shape{C, F}, ParamInit::normal, std0, true, tp.columns(Shape{C, F}));
    p.blocks.push_back(k);
  }
  b.set_layer(-1);
  p.norm = b.parameter("norm.weight", Shape{C}, ParamInit::ones, 0, false);
  p.lm_head = s.tied_embeddings ? p.embed
                                : b.parameter("lm_head.weight", Shape{s.padded_vocab, C}, ParamInit::normal, std0, true,
                                            tp.rows(Shape{s.padded_vocab, C}));
  // Sequence parallelism: the norms read row shards.
  for (const ParamEntry& e : b.program().params())
    if (tp.sequence_on() && !e.split.split()) b.sum_grad_over_tensor_group(e.value);
  return p;
}

TensorId llama_forward(GraphBuilder& b, const ModelSpec& s, const LlamaParams& p, TensorId tokens,
                       const std::string& prefix, AttentionKind attention) {
  const AttentionAttrs attn = attention_attrs(s, b.program().tensor(tokens).shape, b.tensor_parallel());
  const Shape full{attn.batch, attn.seq, s.n_embd};  // the residual stream's rows, all of them

  b.set_phase(Phase::forward);
  b.set_layer(-1);
  TensorId x = b.token_embedding(prefix + "embed_tokens", tokens, p.embed);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    b.set_layer(int(l));
    const LlamaBlock& k = p.blocks[size_t(l)];
    const std::string h = prefix + "layers." + std::to_string(l) + ".";
    const auto n1 = b.rmsnorm(h + "input_layernorm", x, k.in_norm, s.norm_eps);
    const TensorId qkv =
        b.linear(h + "self_attn.qkv_proj", b.column_parallel_input(h + "input_layernorm", n1.y, full), k.qkv_w, k.qkv_b);
    const TensorId rotated = b.rope(h + "self_attn.rope", qkv, attn);
    const auto att = b.attention(h + "self_attn.core", rotated, attn, attention);
    const TensorId o = b.row_parallel_linear(h + "self_attn.o_proj", att.y, k.o_w, kNoTensor);
    const TensorId res = b.add(h + "residual_attn", x, o);
    const auto n2 = b.rmsnorm(h + "post_attention_layernorm", res, k.post_norm, s.norm_eps);
    const TensorId mlp_in = b.column_parallel_input(h + "post_attention_layernorm", n2.y, full);
    const TensorId gate = b.linear(h + "mlp.gate_proj", mlp_in, k.gate_w, kNoTensor);
    const TensorId up = b.linear(h + "mlp.up_proj", mlp_in, k.up_w, kNoTensor);
    const TensorId act = b.swiglu(h + "mlp.act", gate, up);
    const TensorId down = b.row_parallel_linear(h + "mlp.down_proj", act, k.down_w, kNoTensor);
    x = b.add(h + "residual_mlp", res, down);
  }
  b.set_layer(-1);
  const TensorId hidden = b.rmsnorm(prefix + "norm", x, p.norm, s.norm_eps).y;
  return b.column_parallel_input(prefix + "norm", hidden, full);  // read by the vocabulary-parallel classifier
}

}  // namespace memfit
