#include "graph/model_spec.hpp"

#include "core/error.hpp"

namespace memfit {

std::string_view arch_name(Arch a) { return a == Arch::gpt2 ? "gpt2" : "llama"; }

int64_t pad_vocab(int64_t vocab, int64_t multiple) { return (vocab + multiple - 1) / multiple * multiple; }

int64_t ModelSpec::parameter_count() const {
  const int64_t C = n_embd, F = n_inner, Vp = padded_vocab;
  if (arch == Arch::gpt2) {
    const int64_t per_layer = 2 * C                // ln_1
                              + C * 3 * C + 3 * C  // c_attn
                              + C * C + C          // attn.c_proj
                              + 2 * C              // ln_2
                              + C * F + F          // c_fc
                              + F * C + C;         // mlp.c_proj
    return Vp * C + max_seq * C + n_layer * per_layer + 2 * C + (tied_embeddings ? 0 : Vp * C);
  }
  const int64_t kv = n_kv_head * head_dim();
  const int64_t per_layer = C                      // input norm
                            + C * C + 2 * C * kv   // q, k, v
                            + C * C                // o
                            + C                    // post-attention norm
                            + 3 * C * F            // gate, up, down
                            + (qkv_bias ? C + 2 * kv : 0);
  return Vp * C + n_layer * per_layer + C + (tied_embeddings ? 0 : Vp * C);
}

void ModelSpec::validate() const {
  MEMFIT_CHECK(n_layer > 0 && n_head > 0 && n_embd > 0 && vocab_size > 0 && max_seq > 0 && n_inner > 0, "model",
               "model '{}' has a zero or negative size (layers {}, heads {}, channels {}, vocabulary {}, context {})",
               name, n_layer, n_head, n_embd, vocab_size, max_seq);
  MEMFIT_CHECK(n_embd % n_head == 0, "model", "model '{}': {} channels do not split into {} heads", name, n_embd,
               n_head);
  MEMFIT_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "model",
               "model '{}': {} key/value heads do not divide {} heads", name, n_kv_head, n_head);
  MEMFIT_CHECK(padded_vocab >= vocab_size, "model", "model '{}': padded vocabulary {} is below the vocabulary {}",
               name, padded_vocab, vocab_size);
}

namespace {

ModelSpec gpt2_shape(std::string name, int64_t layers, int64_t heads, int64_t channels, int64_t vocab,
                     int64_t context) {
  ModelSpec s;
  s.name = std::move(name);
  s.arch = Arch::gpt2;
  s.n_layer = layers;
  s.n_head = heads;
  s.n_kv_head = heads;
  s.n_embd = channels;
  s.n_inner = 4 * channels;
  s.vocab_size = vocab;
  s.padded_vocab = pad_vocab(vocab);
  s.max_seq = context;
  s.norm_eps = 1e-5f;
  s.tied_embeddings = true;
  return s;
}

// The published config.json of each model (max_position_embeddings, rms_norm_eps, rope_theta).
ModelSpec llama_shape(std::string name, int64_t layers, int64_t heads, int64_t kv_heads, int64_t channels,
                      int64_t inner, int64_t vocab, int64_t context, float eps, float theta) {
  ModelSpec s;
  s.name = std::move(name);
  s.arch = Arch::llama;
  s.n_layer = layers;
  s.n_head = heads;
  s.n_kv_head = kv_heads;
  s.n_embd = channels;
  s.n_inner = inner;
  s.vocab_size = vocab;
  s.padded_vocab = pad_vocab(vocab);
  s.max_seq = context;
  s.norm_eps = eps;
  s.tied_embeddings = false;
  s.rope_theta = theta;
  return s;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"gpt2-tiny",   "gpt2",        "gpt2-medium", "gpt2-large", "gpt2-xl",    "llama-tiny",
          "llama-2-7b",  "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b"};
}

ModelSpec model_preset(std::string_view name) {
  // gpt2-tiny: byte-level vocabulary, small enough for tests and the demo to run in seconds.
  if (name == "gpt2-tiny") return gpt2_shape("gpt2-tiny", 4, 4, 128, 256, 256);
  if (name == "gpt2") return gpt2_shape("gpt2", 12, 12, 768, 50257, 1024);
  if (name == "gpt2-medium") return gpt2_shape("gpt2-medium", 24, 16, 1024, 50257, 1024);
  if (name == "gpt2-large") return gpt2_shape("gpt2-large", 36, 20, 1280, 50257, 1024);
  if (name == "gpt2-xl") return gpt2_shape("gpt2-xl", 48, 25, 1600, 50257, 1024);
  // llama-tiny: grouped-query attention at test size (planning tests).
  if (name == "llama-tiny") return llama_shape("llama-tiny", 2, 4, 2, 64, 172, 256, 256, 1e-6f, 10000.0f);
  if (name == "llama-2-7b") return llama_shape("llama-2-7b", 32, 32, 32, 4096, 11008, 32000, 4096, 1e-5f, 1e4f);
  if (name == "llama-2-13b") return llama_shape("llama-2-13b", 40, 40, 40, 5120, 13824, 32000, 4096, 1e-5f, 1e4f);
  if (name == "llama-2-70b") return llama_shape("llama-2-70b", 80, 64, 8, 8192, 28672, 32000, 4096, 1e-5f, 1e4f);
  if (name == "llama-3-8b") return llama_shape("llama-3-8b", 32, 32, 8, 4096, 14336, 128256, 8192, 1e-5f, 5e5f);
  if (name == "llama-3-70b") return llama_shape("llama-3-70b", 80, 64, 8, 8192, 28672, 128256, 8192, 1e-5f, 5e5f);
  if (name == "mistral-7b") return llama_shape("mistral-7b", 32, 32, 8, 4096, 14336, 32000, 32768, 1e-5f, 1e4f);
  std::string known;
  for (const std::string& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("model", fmt::format("unknown model '{}' (presets: {}; or the path of an HF config.json)", name, known));
}

}  // namespace memfit
