#include "graph/gpt2.hpp"

#include <cmath>

#include "core/error.hpp"

namespace memfit {

Gpt2Params declare_gpt2_parameters(GraphBuilder& b, const ModelSpec& s) {
  MEMFIT_ASSERT(s.arch == Arch::gpt2, "declare_gpt2_parameters on a {} model", arch_name(s.arch));
  const int64_t C = s.n_embd, F = s.n_inner;
  // GPT-2 initialisation: normal(0, 0.02), residual projections scaled by 1/sqrt(2 * layers).
  const float std0 = 0.02f, std_resid = 0.02f / std::sqrt(2.0f * float(s.n_layer));
  const TensorParallel& tp = b.tensor_parallel();
  check_tensor_parallel(s, tp);
  Gpt2Params p;
  b.set_layer(-1);
  // The vocabulary is split over the tensor group (wte is also the classifier); positions and
  // norms are replicated.
  p.wte = b.parameter("wte.weight", Shape{s.padded_vocab, C}, ParamInit::normal, std0, true,
                      tp.rows(Shape{s.padded_vocab, C}));
  p.wpe = b.parameter("wpe.weight", Shape{s.max_seq, C}, ParamInit::normal, std0, true);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    b.set_layer(int(l));
    const std::string h = "h." + std::to_string(l) + ".";
    Gpt2Block k;
    k.ln1_w = b.parameter(h + "ln_1.weight", Shape{C}, ParamInit::ones, 0, false);
    k.ln1_b = b.parameter(h + "ln_1.bias", Shape{C}, ParamInit::zeros, 0, false);
    // Column-parallel: each of q, k and v split by heads.
    k.attn_w = b.parameter(h + "attn.c_attn.weight", Shape{3 * C, C}, ParamInit::normal, std0, true,
                           tp.rows(Shape{3 * C, C}, {C, C, C}));
    k.attn_b = b.parameter(h + "attn.c_attn.bias", Shape{3 * C}, ParamInit::zeros, 0, false,
                           tp.rows(Shape{3 * C}, {C, C, C}));
    k.proj_w = b.parameter(h + "attn.c_proj.weight", Shape{C, C}, ParamInit::normal, std_resid, true,
                           tp.columns(Shape{C, C}));
    k.proj_b = b.parameter(h + "attn.c_proj.bias", Shape{C}, ParamInit::zeros, 0, false);
    k.ln2_w = b.parameter(h + "ln_2.weight", Shape{C}, ParamInit::ones, 0, false);
    k.ln2_b = b.parameter(h + "ln_2.bias", Shape{C}, ParamInit::zeros, 0, false);
    k.fc_w = b.parameter(h + "mlp.c_fc.weight", Shape{F, C}, ParamInit::normal, std0, true, tp.rows(Shape{F, C}));
    k.fc_b = b.parameter(h + "mlp.c_fc.bias", Shape{F}, ParamInit::zeros, 0, false, tp.rows(Shape{F}));
    k.fcproj_w = b.parameter(h + "mlp.c_proj.weight", Shape{C, F}, ParamInit::normal, std_resid, true,
                             tp.columns(Shape{C, F}));
    k.fcproj_b = b.parameter(h + "mlp.c_proj.bias", Shape{C}, ParamInit::zeros, 0, false);
    p.blocks.push_back(k);
  }
  b.set_layer(-1);
  p.lnf_w = b.parameter("ln_f.weight", Shape{C}, ParamInit::ones, 0, false);
  p.lnf_b = b.parameter("ln_f.bias", Shape{C}, ParamInit::zeros, 0, false);
  // Sequence parallelism: the norms and the row-parallel biases read row shards (the position
  // table reads the gathered gradient of all rows).
  for (const ParamEntry& e : b.program().params())
    if (tp.sequence_on() && !e.split.split() && e.value != p.wpe) b.sum_grad_over_tensor_group(e.value);
  return p;
}

AttentionAttrs attention_attrs(const ModelSpec& s, const Shape& tokens) {
  AttentionAttrs attn;
  attn.batch = tokens[0];
  attn.seq = tokens[1];
  attn.heads = s.n_head;
  attn.kv_heads = s.n_kv_head;
  attn.head_dim = s.head_dim();
  attn.scale = 1.0f / std::sqrt(float(attn.head_dim));
  attn.rope_theta = s.rope_theta;
  attn.rope_scaling = s.rope_scaling;
  return attn;
}

AttentionAttrs attention_attrs(const ModelSpec& s, const Shape& tokens, const TensorParallel& tp) {
  AttentionAttrs attn = attention_attrs(s, tokens);
  attn.heads /= tp.parts;  // checked divisible by check_tensor_parallel
  attn.kv_heads /= tp.parts;
  return attn;
}

void check_tensor_parallel(const ModelSpec& s, const TensorParallel& tp) {
  if (!tp.on()) return;
  check_divisible(s.n_head, tp.parts, "the attention heads of model '" + s.name + "'");
  check_divisible(s.n_kv_head, tp.parts, "the key/value heads of model '" + s.name + "' (each rank needs whole groups)");
  check_divisible(s.n_inner, tp.parts, "the MLP width of model '" + s.name + "'");
  check_divisible(s.padded_vocab, tp.parts, "the padded vocabulary of model '" + s.name + "'");
}

TensorId gpt2_forward(GraphBuilder& b, const ModelSpec& s, const Gpt2Params& p, TensorId tokens,
                      const std::string& prefix, AttentionKind attention) {
  const AttentionAttrs attn = attention_attrs(s, b.program().tensor(tokens).shape, b.tensor_parallel());
  const Shape full{attn.batch, attn.seq, s.n_embd};  // the residual stream's rows, all of them

  b.set_phase(Phase::forward);
  b.set_layer(-1);
  TensorId x = b.embedding(prefix + "embedding", tokens, p.wte, p.wpe);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    b.set_layer(int(l));
    const Gpt2Block& k = p.blocks[size_t(l)];
    const std::string h = prefix + "h." + std::to_string(l) + ".";
    const auto ln1 = b.layernorm(h + "ln_1", x, k.ln1_w, k.ln1_b, s.norm_eps);
    const TensorId qkv = b.linear(h + "attn.c_attn", b.column_parallel_input(h + "ln_1", ln1.y, full), k.attn_w, k.attn_b);
    const auto att = b.attention(h + "attn.core", qkv, attn, attention);
    const TensorId proj = b.row_parallel_linear(h + "attn.c_proj", att.y, k.proj_w, k.proj_b);
    const TensorId res = b.add(h + "residual_attn", x, proj);
    const auto ln2 = b.layernorm(h + "ln_2", res, k.ln2_w, k.ln2_b, s.norm_eps);
    const TensorId fc = b.linear(h + "mlp.c_fc", b.column_parallel_input(h + "ln_2", ln2.y, full), k.fc_w, k.fc_b);
    const TensorId act = b.gelu(h + "mlp.gelu", fc);
    const TensorId fcproj = b.row_parallel_linear(h + "mlp.c_proj", act, k.fcproj_w, k.fcproj_b);
    x = b.add(h + "residual_mlp", res, fcproj);
  }
  b.set_layer(-1);
  const TensorId hidden = b.layernorm(prefix + "ln_f", x, p.lnf_w, p.lnf_b, s.norm_eps).y;
  return b.column_parallel_input(prefix + "ln_f", hidden, full);  // read by the vocabulary-parallel classifier
}

}  // namespace memfit
