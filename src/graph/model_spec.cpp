#include "graph/model_spec.hpp"

#include <utility>

#include "core/checked.hpp"
#include "core/error.hpp"

namespace memfit {

std::string_view arch_name(Arch a) { return a == Arch::gpt2 ? "gpt2" : "llama"; }

int64_t pad_vocab(int64_t vocab, int64_t multiple) { return (vocab + multiple - 1) / multiple * multiple; }

int64_t ModelSpec::qkv_rows() const {
  return arch == Arch::gpt2 ? 3 * n_embd : (n_head + 2 * n_kv_head) * head_dim();
}

namespace {

// Checked sums and products of the parameter count, each failure naming the model and the term.
struct ParamArithmetic {
  const ModelSpec& spec;
  int64_t mul(int64_t a, int64_t b, std::string_view term) const {
    return checked_mul(a, b, fmt::format("model '{}': parameters of {}", spec.name, term), "model");
  }
  int64_t add(int64_t a, int64_t b) const {
    return checked_add(a, b, fmt::format("model '{}': parameter count", spec.name), "model");
  }
};

}  // namespace

int64_t ModelSpec::parameter_count() const {
  const ParamArithmetic m{*this};
  const int64_t C = n_embd, F = n_inner, Vp = padded_vocab;
  const int64_t embeddings = m.mul(Vp, C, "the token embedding");
  const int64_t head = tied_embeddings ? 0 : embeddings;
  const int64_t attention =
      m.add(m.mul(qkv_rows(), C, "the q/k/v projection"), m.mul(C, n_head * head_dim(), "the attention output"));
  const int64_t mlp = m.mul(m.mul(C, F, "the MLP"), arch == Arch::gpt2 ? 2 : 3, "the MLP");
  if (arch == Arch::gpt2) {
    // ln_1, ln_2 (2 x 2C), c_attn bias 3C, attn.c_proj bias C, c_fc bias F, mlp.c_proj bias C.
    const int64_t small = m.add(m.mul(C, 9, "the biases and norms"), F);
    const int64_t per_layer = m.add(m.add(attention, mlp), small);
    const int64_t positions = m.mul(max_seq, C, "the position embedding");
    return m.add(m.add(m.add(m.add(embeddings, positions), m.mul(n_layer, per_layer, "the blocks")), 2 * C), head);
  }
  // Input and post-attention norms (2C), the q/k/v biases (qwen2).
  const int64_t small = m.add(2 * C, qkv_bias ? qkv_rows() : 0);
  const int64_t per_layer = m.add(m.add(attention, mlp), small);
  return m.add(m.add(m.add(embeddings, m.mul(n_layer, per_layer, "the blocks")), C), head);
}

void ModelSpec::validate() const {
  MEMFIT_CHECK(n_layer > 0 && n_head > 0 && n_embd > 0 && vocab_size > 0 && max_seq > 0 && n_inner > 0, "model",
               "model '{}' has a zero or negative size (layers {}, heads {}, channels {}, vocabulary {}, context {})",
               name, n_layer, n_head, n_embd, vocab_size, max_seq);
  MEMFIT_CHECK(n_layer <= kMaxLayers, "model", "model '{}': n_layer {} exceeds {} layers, 10 times the deepest "
               "published transformer", name, n_layer, kMaxLayers);
  // Every matrix dimension the kernels see; heads and key/value heads are bounded by n_embd below.
  const std::pair<const char*, int64_t> dims[] = {{"n_embd (hidden size)", n_embd},
                                                  {"n_inner (MLP width)", n_inner},
                                                  {"vocab_size", vocab_size},
                                                  {"padded_vocab (vocab_size rounded up to 64)", padded_vocab},
                                                  {"max_seq (context length)", max_seq}};
  for (const auto& [field, v] : dims)
    MEMFIT_CHECK(v <= kMaxKernelDim, "model", "model '{}': {} {} exceeds {}, the largest matrix dimension oneDNN's "
                 "matmul kernels index (32-bit)", name, field, v, kMaxKernelDim);
  MEMFIT_CHECK(n_embd % n_head == 0, "model", "model '{}': {} channels do not split into {} heads", name, n_embd,
               n_head);
  MEMFIT_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "model",
               "model '{}': {} key/value heads do not divide {} heads", name, n_kv_head, n_head);
  MEMFIT_CHECK(padded_vocab >= vocab_size, "model", "model '{}': padded vocabulary {} is below the vocabulary {}",
               name, padded_vocab, vocab_size);
  // n_head <= n_embd and n_kv_head <= n_head now, so these products fit comfortably in int64_t.
  MEMFIT_CHECK(qkv_rows() <= kMaxKernelDim, "model", "model '{}': the fused q/k/v projection has {} rows, above {}, "
               "the largest matrix dimension oneDNN's matmul kernels index (32-bit)", name, qkv_rows(), kMaxKernelDim);
  const int64_t params = parameter_count();
  MEMFIT_CHECK(params <= kMaxParameters, "model", "model '{}' has {} parameters, above the {} (2^50) this build "
               "plans for", name, params, kMaxParameters);
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

// Llama 3.1 and 3.2: 131072 positions reached by llama3 rotary scaling over Llama 3's 8192.
ModelSpec llama31_shape(std::string name, int64_t layers, int64_t heads, int64_t channels, int64_t inner,
                        double factor, bool tied) {
  ModelSpec s = llama_shape(std::move(name), layers, heads, 8, channels, inner, 128256, 131072, 1e-5f, 5e5f);
  s.tied_embeddings = tied;
  s.rope_type = "llama3";
  s.rope_scaling.kind = RopeScaling::Kind::llama3;
  s.rope_scaling.factor = factor;
  s.rope_scaling.low_freq_factor = 1.0;
  s.rope_scaling.high_freq_factor = 4.0;
  s.rope_scaling.original_max_positions = 8192.0;
  return s;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"gpt2-tiny",   "gpt2",         "gpt2-medium",  "gpt2-large",   "gpt2-xl",     "llama-tiny",
          "llama-2-7b",  "llama-2-13b",  "llama-2-70b",  "llama-3-8b",   "llama-3-70b", "llama-3.1-8b",
          "llama-3.2-1b", "llama-3.2-3b", "mistral-7b",  "llama-65b"};
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
  // LLaMA (1) 65B, the QLoRA paper's largest model: no grouped-query attention, 2048 positions.
  if (name == "llama-65b") return llama_shape("llama-65b", 80, 64, 64, 8192, 22016, 32000, 2048, 1e-6f, 1e4f);
  if (name == "llama-2-7b") return llama_shape("llama-2-7b", 32, 32, 32, 4096, 11008, 32000, 4096, 1e-5f, 1e4f);
  if (name == "llama-2-13b") return llama_shape("llama-2-13b", 40, 40, 40, 5120, 13824, 32000, 4096, 1e-5f, 1e4f);
  if (name == "llama-2-70b") return llama_shape("llama-2-70b", 80, 64, 8, 8192, 28672, 32000, 4096, 1e-5f, 1e4f);
  if (name == "llama-3-8b") return llama_shape("llama-3-8b", 32, 32, 8, 4096, 14336, 128256, 8192, 1e-5f, 5e5f);
  if (name == "llama-3-70b") return llama_shape("llama-3-70b", 80, 64, 8, 8192, 28672, 128256, 8192, 1e-5f, 5e5f);
  if (name == "llama-3.1-8b") return llama31_shape("llama-3.1-8b", 32, 32, 4096, 14336, 8.0, false);
  if (name == "llama-3.2-1b") return llama31_shape("llama-3.2-1b", 16, 32, 2048, 8192, 32.0, true);
  if (name == "llama-3.2-3b") return llama31_shape("llama-3.2-3b", 28, 24, 3072, 8192, 32.0, true);
  if (name == "mistral-7b") return llama_shape("mistral-7b", 32, 32, 8, 4096, 14336, 32000, 32768, 1e-5f, 1e4f);
  std::string known;
  for (const std::string& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("model", fmt::format("unknown model '{}' (presets: {}; or the path of an HF config.json)", name, known));
}

}  // namespace memfit
