#include "graph/inference_program.hpp"

#include "graph/eval_program.hpp"

#include <cmath>

#include "core/error.hpp"
#include "graph/forward_rewrite.hpp"
#include "graph/gpt2.hpp"
#include "graph/precision.hpp"
#include "graph/schedule_async.hpp"

namespace memfit {
namespace {

struct Caches {
  std::vector<TensorId> k, v;
};

// One run of attention over the cache of layer l: the tokens' k and v are appended at the
// run-time position, y is the causal attention of their queries.
TensorId cached_attention(GraphBuilder& b, const std::string& name, TensorId qkv, const AttentionAttrs& attn,
                          const GenerateShape& shape, const Caches& caches, int64_t l, bool rope) {
  const int64_t T = attn.seq, C = attn.heads * attn.head_dim;
  const TensorId y = b.transient(name + ".y", Shape{attn.batch, T, C}, Category::activations);
  CachedAttentionAttrs a{attn, shape.capacity, rope};
  // Query-key pairs: the prefill runs at position 0 (a causal triangle); a decode's position is
  // known only at run time, so it counts the cache's average, half of it.
  const double keys = name.starts_with("prefill.") ? double(T) * double(T + 1) / 2 : 0.5 * double(shape.capacity);
  b.emit({OpKind::cached_attention, name, {qkv}, {y, caches.k[size_t(l)], caches.v[size_t(l)]}, a,
          4.0 * keys * double(C), {WriteMode::overwrite, WriteMode::update, WriteMode::update}});
  return y;
}

// The residual stream after the last block for T tokens at the run-time position.
TensorId blocks_forward(GraphBuilder& b, const ModelSpec& s, const ModelParams& p, TensorId tokens,
                        const std::string& prefix, const GenerateShape& shape, const Caches& caches) {
  const AttentionAttrs attn = attention_attrs(s, b.program().tensor(tokens).shape);
  b.set_phase(Phase::forward);
  b.set_layer(-1);
  if (s.arch == Arch::gpt2) {
    const Gpt2Params& g = p.gpt2;
    const int64_t C = s.n_embd;
    const TensorId x0 = b.transient(prefix + "embedding.y", Shape{attn.batch, attn.seq, C}, Category::activations);
    b.emit({OpKind::embedding_at, prefix + "embedding", {tokens, g.wte, g.wpe}, {x0}, NoAttrs{},
            double(attn.batch * attn.seq * C)});
    TensorId x = x0;
    for (int64_t l = 0; l < s.n_layer; ++l) {
      b.set_layer(int(l));
      const Gpt2Block& k = g.blocks[size_t(l)];
      const std::string h = prefix + "h." + std::to_string(l) + ".";
      const auto ln1 = b.layernorm(h + "ln_1", x, k.ln1_w, k.ln1_b, s.norm_eps);
      const TensorId qkv = b.linear(h + "attn.c_attn", ln1.y, k.attn_w, k.attn_b);
      const TensorId att = cached_attention(b, h + "attn.core", qkv, attn, shape, caches, l, false);
      const TensorId res = b.add(h + "residual_attn", x, b.linear(h + "attn.c_proj", att, k.proj_w, k.proj_b));
      const auto ln2 = b.layernorm(h + "ln_2", res, k.ln2_w, k.ln2_b, s.norm_eps);
      const TensorId act = b.gelu(h + "mlp.gelu", b.linear(h + "mlp.c_fc", ln2.y, k.fc_w, k.fc_b));
      x = b.add(h + "residual_mlp", res, b.linear(h + "mlp.c_proj", act, k.fcproj_w, k.fcproj_b));
    }
    b.set_layer(-1);
    return x;
  }
  const LlamaParams& m = p.llama;
  TensorId x = b.token_embedding(prefix + "embed_tokens", tokens, m.embed);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    b.set_layer(int(l));
    const LlamaBlock& k = m.blocks[size_t(l)];
    const std::string h = prefix + "layers." + std::to_string(l) + ".";
    const auto n1 = b.rmsnorm(h + "input_layernorm", x, k.in_norm, s.norm_eps);
    const TensorId qkv = b.linear(h + "self_attn.qkv_proj", n1.y, k.qkv_w, k.qkv_b);
    const TensorId att = cached_attention(b, h + "self_attn.core", qkv, attn, shape, caches, l, true);
    const TensorId res = b.add(h + "residual_attn", x, b.linear(h + "self_attn.o_proj", att, k.o_w, kNoTensor));
    const auto n2 = b.rmsnorm(h + "post_attention_layernorm", res, k.post_norm, s.norm_eps);
    const TensorId gate = b.linear(h + "mlp.gate_proj", n2.y, k.gate_w, kNoTensor);
    const TensorId up = b.linear(h + "mlp.up_proj", n2.y, k.up_w, kNoTensor);
    const TensorId act = b.swiglu(h + "mlp.act", gate, up);
    x = b.add(h + "residual_mlp", res, b.linear(h + "mlp.down_proj", act, k.down_w, kNoTensor));
  }
  b.set_layer(-1);
  return x;
}

// The last position's logits: its row of the residual stream (a column block of the (1, T*C)
// stream), the final norm of that row, the product with the classifier weight.
void last_logits(GraphBuilder& b, const ModelSpec& s, const ModelParams& p, TensorId x, const std::string& prefix,
                 TensorId logits) {
  const Shape xs = b.program().tensor(x).shape;
  const int64_t C = s.n_embd, T = xs.numel() / C;
  TensorId last = x;
  if (T > 1) {
    last = b.transient(prefix + "last_row", Shape{1, C}, Category::activations);
    b.emit({OpKind::slice_columns, prefix + "last_row", {x}, {last}, ColumnsAttrs{1, T * C, (T - 1) * C, C}, double(C)});
  }
  const TensorId h = s.arch == Arch::gpt2 ? b.layernorm(prefix + "ln_f", last, p.gpt2.lnf_w, p.gpt2.lnf_b, s.norm_eps).y
                                          : b.rmsnorm(prefix + "norm", last, p.llama.norm, s.norm_eps).y;
  MatmulAttrs m;
  m.m = 1;
  m.n = s.padded_vocab;
  m.k = C;
  m.trans_b = true;
  b.emit({OpKind::matmul, prefix + "lm_head", {h, p.classifier_weight}, {logits}, m, 2.0 * double(m.n) * double(C)});
}

}  // namespace

void check_generate_shape(const ModelSpec& spec, const GenerateShape& shape) {
  MEMFIT_CHECK(shape.prompt >= 1, "policy", "generation needs a prompt of at least one token");
  MEMFIT_CHECK(shape.capacity >= shape.prompt, "policy", "a KV cache of {} positions cannot hold a prompt of {} tokens",
               shape.capacity, shape.prompt);
  MEMFIT_CHECK(shape.capacity <= spec.max_seq, "policy",
               "prompt ({} tokens) + new tokens ({}) = {} positions exceeds the {} positions of model '{}'",
               shape.prompt, shape.capacity - shape.prompt, shape.capacity, spec.max_seq, spec.name);
}

void emit_generate_section(GraphBuilder& b, const ModelSpec& spec, const ModelParams& params, const Policy& policy,
                           const GenerateShape& shape, const ForwardRewrites& rewrites) {
  check_generate_shape(spec, shape);
  Program& p = b.program();
  const int64_t KV = spec.n_kv_head > 0 ? spec.n_kv_head : spec.n_head;
  Caches caches;
  for (int64_t l = 0; l < spec.n_layer; ++l) {
    b.set_layer(int(l));
    const Shape cs{1, KV, shape.capacity, spec.head_dim()};
    const DType dt = compute_dtype(policy.precision);
    caches.k.push_back(b.persistent("kv_cache." + std::to_string(l) + ".k", cs, Category::kv_cache, dt));
    caches.v.push_back(b.persistent("kv_cache." + std::to_string(l) + ".v", cs, Category::kv_cache, dt));
  }
  b.set_layer(-1);
  const TensorId prompt = b.persistent(kGenPromptTokens, Shape{1, shape.prompt}, Category::activations, DType::i32);
  const TensorId token = b.persistent(kGenToken, Shape{1, 1}, Category::activations, DType::i32);
  const TensorId logits = b.persistent(kGenLogits, Shape{1, spec.padded_vocab}, Category::activations);
  const bool grad = b.grad_enabled();
  b.set_grad_enabled(false);
  p.begin_section(SectionKind::generate);
  const int begin = int(p.ops().size());
  for (const auto& [tokens, prefix] : {std::pair{prompt, std::string("prefill.")}, std::pair{token, std::string("decode.")}}) {
    const TensorId x = blocks_forward(b, spec, params, tokens, prefix, shape, caches);
    last_logits(b, spec, params, x, prefix, logits);
  }
  rewrite_forward(b, begin, rewrites);
  p.end_section();
  b.set_grad_enabled(grad);
}

Program build_inference_program(const ModelSpec& spec, const Policy& policy, const OpCapabilities& backend,
                                const GenerateShape& shape) {
  spec.validate();
  Program p;
  GraphBuilder b(p);
  const FrozenModel m = declare_frozen_model(b, spec, policy);
  emit_generate_section(b, spec, m.params, policy, shape, m.rewrites);
  apply_precision(p, policy, backend);
  schedule_async(p, AsyncOptions{.overlap_comm = policy.overlap_comm});
  p.validate();
  return p;
}

GenerateOps find_generate_ops(const Program& p) {
  const Section* s = p.find_section(SectionKind::generate);
  MEMFIT_CHECK(s, "graph", "the program has no generate section");
  GenerateOps g;
  g.prefill_begin = s->begin;
  g.decode_end = s->end;
  g.prefill_end = g.decode_begin = s->end;
  for (int i = s->begin; i < s->end; ++i)
    if (p.op(i).name.starts_with("decode.")) {
      g.prefill_end = g.decode_begin = i;
      break;
    }
  g.prompt_tokens = p.find_tensor(kGenPromptTokens);
  g.token = p.find_tensor(kGenToken);
  g.logits = p.find_tensor(kGenLogits);
  MEMFIT_CHECK(g.prompt_tokens != kNoTensor && g.token != kNoTensor && g.logits != kNoTensor &&
                   g.decode_begin > g.prefill_begin && g.decode_end > g.decode_begin,
               "graph", "the generate section lacks its prefill, decode or tensors");
  g.prompt = p.tensor(g.prompt_tokens).shape.last();
  g.capacity = p.tensor(p.find_tensor("kv_cache.0.k")).shape[2];
  return g;
}

}  // namespace memfit
