#include "io/hf_config.hpp"

#include <algorithm>
#include <iterator>
#include <limits>

#include "core/error.hpp"
#include "io/json_errors.hpp"
#include "io/mapped_file.hpp"

namespace memfit {

namespace {

using nlohmann::json;

constexpr std::string_view kPiece = "config";
constexpr uint64_t kMaxConfigBytes = 16 * 1024 * 1024;  // real config.json files are a few KB

// Typed access to the keys of one config.json, every error naming the file and the key.
// A key set to null counts as absent: HF writes `"n_inner": null` for "use the default".
class ConfigKeys {
 public:
  ConfigKeys(const json& j, const std::string& path) : j_(j), path_(path) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t integer(const char* key) const {
    MEMFIT_CHECK(has(key), kPiece, "{}: missing key '{}'", path_, key);
    const json& v = j_[key];
    // Sizes are bounded so that shape arithmetic downstream stays far from int64 overflow.
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    MEMFIT_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= kMax, kPiece,
                 "{}: key '{}' must be a positive integer below 2^31, got {}", path_, key, v.dump());
    return v.get<int64_t>();
  }
  int64_t integer(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

  double positive_number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    MEMFIT_CHECK(v.is_number() && v.get<double>() > 0 &&
                     v.get<double>() <= double(std::numeric_limits<float>::max()), kPiece,
                 "{}: key '{}' must be a positive number, got {}", path_, key, v.dump());
    return v.get<double>();
  }

  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    MEMFIT_CHECK(v.is_boolean(), kPiece, "{}: key '{}' must be true or false, got {}", path_, key, v.dump());
    return v.get<bool>();
  }

  std::string string(const char* key, std::string fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    MEMFIT_CHECK(v.is_string(), kPiece, "{}: key '{}' must be a string, got {}", path_, key, v.dump());
    return v.get<std::string>();
  }

  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    MEMFIT_CHECK(j_[key].is_number(), kPiece, "{}: key '{}' must be a number, got {}", path_, key, j_[key].dump());
    return j_[key].get<double>();
  }

  const json& raw(const char* key) const { return j_[key]; }

  // The keys of a nested object (none when absent).
  ConfigKeys nested(const char* key) const {
    static const json kEmpty = json::object();
    if (!has(key)) return ConfigKeys(kEmpty, path_);
    MEMFIT_CHECK(j_[key].is_object(), kPiece, "{}: key '{}' must be an object, got {}", path_, key, j_[key].dump());
    return ConfigKeys(j_[key], path_);
  }

  const std::string& path() const { return path_; }

 private:
  const json& j_;
  const std::string& path_;
};

json parse_config_file(const std::string& path) {
  const MappedFile file = MappedFile::open(path, kPiece);
  MEMFIT_CHECK(file.size() <= kMaxConfigBytes, kPiece, "{}: {} bytes is too large for a config.json", path,
               file.size());
  const char* text = reinterpret_cast<const char*>(file.data());
  try {
    return json::parse(text, text + file.size());
  } catch (const json::exception& e) {
    throw Error(kPiece, fmt::format("{}: not valid JSON: {}", path, printable_error_text(e)));
  }
}

// GPT-2 attention switches that change the math away from softmax(q k^T / sqrt(d)) v.
// (reorder_and_upcast_attn changes only the precision of the same product: accepted.)
void refuse_gpt2_attention_variants(const ConfigKeys& keys) {
  MEMFIT_CHECK(keys.boolean("scale_attn_weights", true), kPiece,
               "{}: 'scale_attn_weights': false is not supported (memfit scales attention by 1/sqrt(head_dim))",
               keys.path());
  MEMFIT_CHECK(!keys.boolean("scale_attn_by_inverse_layer_idx", false), kPiece,
               "{}: 'scale_attn_by_inverse_layer_idx': true is not supported", keys.path());
  MEMFIT_CHECK(!keys.boolean("add_cross_attention", false), kPiece,
               "{}: 'add_cross_attention': true is not supported (memfit's gpt2 is decoder-only)", keys.path());
}

// The rotary type the config asks for, from either spelling (transformers 5's rope_parameters,
// or the older top-level rope_scaling); both present and disagreeing is refused, as is a
// rope_scaling without a type or with one HF does not define. memfit plans every type; the
// trainer refuses all but "default", which is the only one its rope kernel computes.
std::string rope_type_of(const ConfigKeys& keys) {
  static constexpr std::string_view kKnown[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};
  const ConfigKeys rope = keys.nested("rope_parameters"), scaling = keys.nested("rope_scaling");
  std::string type = rope.string("rope_type", "default");
  if (keys.has("rope_scaling")) {
    const std::string scaled = scaling.string("rope_type", scaling.string("type", ""));
    MEMFIT_CHECK(!scaled.empty(), kPiece, "{}: 'rope_scaling' has no 'rope_type' (or 'type'), so its scaling is "
                 "unknown", keys.path());
    MEMFIT_CHECK(!keys.has("rope_parameters") || scaled == type, kPiece,
                 "{}: 'rope_scaling' says rope_type '{}' but 'rope_parameters' says '{}'", keys.path(), scaled, type);
    type = scaled;
  }
  MEMFIT_CHECK(std::find(std::begin(kKnown), std::end(kKnown), type) != std::end(kKnown), kPiece,
               "{}: rope_type '{}' is not one HF defines (default, linear, dynamic, yarn, longrope, llama3)",
               keys.path(), type);
  MEMFIT_CHECK(rope.number_or("partial_rotary_factor", keys.number_or("partial_rotary_factor", 1.0)) == 1.0, kPiece,
               "{}: 'partial_rotary_factor' other than 1 is not supported (memfit rotates every channel)", keys.path());
  return type;
}

// The frequency scaling of the rope types the kernels compute, with the keys HF requires for them,
// from whichever object named the type.
RopeScaling rope_scaling_of(const ConfigKeys& keys, const std::string& type) {
  RopeScaling r;
  if (type != "linear" && type != "llama3") return r;
  const ConfigKeys params = keys.has("rope_scaling") ? keys.nested("rope_scaling") : keys.nested("rope_parameters");
  auto required = [&](const char* key) {
    MEMFIT_CHECK(params.has(key), kPiece, "{}: rope_type '{}' needs '{}'", keys.path(), type, key);
    return params.positive_number(key, 0.0);
  };
  r.factor = required("factor");
  if (type == "linear") {
    r.kind = RopeScaling::Kind::linear;
    return r;
  }
  r.kind = RopeScaling::Kind::llama3;
  r.low_freq_factor = required("low_freq_factor");
  r.high_freq_factor = required("high_freq_factor");
  r.original_max_positions = required("original_max_position_embeddings");
  MEMFIT_CHECK(r.high_freq_factor > r.low_freq_factor, kPiece,
               "{}: llama3 rope scaling needs high_freq_factor ({}) above low_freq_factor ({})", keys.path(),
               r.high_freq_factor, r.low_freq_factor);
  return r;
}

// The longest sequence memfit can train exactly. Sliding-window attention (Mistral's
// sliding_window, Qwen2's use_sliding_window) equals full causal attention for sequences no
// longer than the window, so the window caps max_seq and longer sequences are refused later.
int64_t max_seq_under_sliding_window(const ConfigKeys& keys, const std::string& model_type, int64_t max_seq) {
  bool sliding = model_type != "qwen2" ? keys.has("sliding_window") : keys.boolean("use_sliding_window", false);
  if (keys.has("layer_types")) {
    const json& types = keys.raw("layer_types");
    MEMFIT_CHECK(types.is_array(), kPiece, "{}: key 'layer_types' must be an array, got {}", keys.path(),
                 types.dump());
    for (const json& t : types) {
      MEMFIT_CHECK(t == "full_attention" || t == "sliding_attention", kPiece,
                   "{}: 'layer_types' holds {}, which memfit does not support (only full_attention and "
                   "sliding_attention)", keys.path(), t.dump());
      sliding = sliding || t == "sliding_attention";
    }
  }
  if (!sliding) return max_seq;
  MEMFIT_CHECK(keys.has("sliding_window"), kPiece, "{}: sliding-window attention without a 'sliding_window' size",
               keys.path());
  return std::min(max_seq, keys.integer("sliding_window"));
}

ModelSpec read_gpt2(const ConfigKeys& keys) {
  const std::string activation = keys.string("activation_function", "gelu_new");
  // gelu_pytorch_tanh is the same tanh approximation as gelu_new, computed by a fused kernel.
  MEMFIT_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", kPiece,
               "{}: activation_function '{}' is not supported (memfit's gpt2 uses the tanh GELU, 'gelu_new')",
               keys.path(), activation);
  ModelSpec s;
  s.arch = Arch::gpt2;
  s.n_layer = keys.integer("n_layer");
  s.n_head = keys.integer("n_head");
  s.n_kv_head = s.n_head;
  s.n_embd = keys.integer("n_embd");
  s.n_inner = keys.integer("n_inner", 4 * s.n_embd);
  s.vocab_size = keys.integer("vocab_size");
  MEMFIT_CHECK(keys.has("n_positions") || keys.has("n_ctx"), kPiece, "{}: missing key 'n_positions' (or 'n_ctx')",
               keys.path());
  s.max_seq = keys.has("n_positions") ? keys.integer("n_positions") : keys.integer("n_ctx");
  s.norm_eps = float(keys.positive_number("layer_norm_epsilon", 1e-5));
  // memfit's gpt2 graph always ties lm_head to wte; an untied file's lm_head.weight would be
  // dropped and a different model trained, so the key is refused rather than ignored.
  MEMFIT_CHECK(keys.boolean("tie_word_embeddings", true), kPiece,
               "{}: 'tie_word_embeddings': false is not supported for gpt2 (memfit's gpt2 ties lm_head to wte)",
               keys.path());
  refuse_gpt2_attention_variants(keys);
  return s;
}

ModelSpec read_llama_family(const ConfigKeys& keys, const std::string& model_type) {
  const std::string activation = keys.string("hidden_act", "silu");
  MEMFIT_CHECK(activation == "silu", kPiece,
               "{}: hidden_act '{}' is not supported (memfit's llama uses SwiGLU with 'silu')", keys.path(),
               activation);
  for (const char* bias : {"attention_bias", "mlp_bias"})
    MEMFIT_CHECK(!keys.boolean(bias, false), kPiece, "{}: '{}': true is not supported (memfit's llama has no "
                 "projection biases)", keys.path(), bias);
  ModelSpec s;
  s.arch = Arch::llama;
  s.n_layer = keys.integer("num_hidden_layers");
  s.n_head = keys.integer("num_attention_heads");
  s.n_kv_head = keys.integer("num_key_value_heads", s.n_head);
  s.n_embd = keys.integer("hidden_size");
  s.n_inner = keys.integer("intermediate_size");
  s.vocab_size = keys.integer("vocab_size");
  s.max_seq = max_seq_under_sliding_window(keys, model_type, keys.integer("max_position_embeddings"));
  s.norm_eps = float(keys.positive_number("rms_norm_eps", 1e-6));
  // transformers 5 writes the rotary settings as rope_parameters {rope_theta, rope_type, ...};
  // earlier versions as top-level rope_theta and rope_scaling {rope_type or type, ...}.
  const ConfigKeys rope = keys.nested("rope_parameters");
  s.rope_theta = float(rope.positive_number("rope_theta", keys.positive_number("rope_theta", 10000.0)));
  s.rope_type = rope_type_of(keys);
  s.rope_scaling = rope_scaling_of(keys, s.rope_type);
  s.tied_embeddings = keys.boolean("tie_word_embeddings", false);
  if (keys.has("head_dim") && s.n_embd % s.n_head == 0)
    MEMFIT_CHECK(keys.integer("head_dim") == s.n_embd / s.n_head, kPiece,
                 "{}: head_dim {} differs from hidden_size / num_attention_heads = {}, which memfit does not support",
                 keys.path(), keys.integer("head_dim"), s.n_embd / s.n_head);
  return s;
}

}  // namespace

ModelSpec read_hf_config(const std::string& path) {
  const json j = parse_config_file(path);
  MEMFIT_CHECK(j.is_object(), kPiece, "{}: must hold a JSON object, got {}", path, j.type_name());
  const ConfigKeys keys(j, path);
  MEMFIT_CHECK(keys.has("model_type"), kPiece, "{}: missing key 'model_type'", path);
  const std::string model_type = keys.string("model_type", "");
  ModelSpec spec;
  if (model_type == "gpt2") {
    spec = read_gpt2(keys);
  } else if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2") {
    spec = read_llama_family(keys, model_type);
    spec.qkv_bias = model_type == "qwen2";  // Qwen2's q, k and v projections always carry biases
  } else {
    throw Error(kPiece, fmt::format("{}: model_type '{}' is not supported (supported: gpt2, llama, mistral, qwen2)",
                                    path, model_type));
  }
  spec.name = fmt::format("{} from {}", model_type, path);
  spec.padded_vocab = pad_vocab(spec.vocab_size);
  try {
    spec.validate();
  } catch (const Error& e) {
    // Re-raised under [config] so that every failure of this reader names the file first.
    throw Error(kPiece, fmt::format("{}: {}", path, std::string_view(e.what()).substr(e.piece().size() + 3)));
  }
  return spec;
}

json gpt2_hf_config(const ModelSpec& spec) {
  MEMFIT_CHECK(spec.arch == Arch::gpt2, kPiece, "model '{}' is {}, and only gpt2 models have a GPT-2 config.json",
               spec.name, arch_name(spec.arch));
  MEMFIT_CHECK(spec.n_kv_head == spec.n_head, kPiece, "model '{}': GPT-2 has no grouped-query attention ({} kv heads "
               "for {} heads)", spec.name, spec.n_kv_head, spec.n_head);
  spec.validate();
  // The float epsilon written as its shortest decimal (1e-05, not 9.99999974737875e-06).
  const double eps = std::stod(fmt::format("{}", spec.norm_eps));
  return json{
      {"model_type", "gpt2"},
      {"architectures", json::array({"GPT2LMHeadModel"})},
      {"n_layer", spec.n_layer},
      {"n_head", spec.n_head},
      {"n_embd", spec.n_embd},
      {"n_positions", spec.max_seq},
      {"n_ctx", spec.max_seq},
      {"vocab_size", spec.vocab_size},
      {"n_inner", spec.n_inner == 4 * spec.n_embd ? json(nullptr) : json(spec.n_inner)},
      {"layer_norm_epsilon", eps},
      {"activation_function", "gelu_new"},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"tie_word_embeddings", spec.tied_embeddings},
      {"torch_dtype", "float32"},
  };
}

json llama_hf_config(const ModelSpec& spec) {
  MEMFIT_CHECK(spec.arch == Arch::llama, kPiece, "model '{}' is {}, not a llama-family model", spec.name,
               arch_name(spec.arch));
  spec.validate();
  // Qwen2 is the family member whose q, k and v projections carry biases.
  const bool qwen2 = spec.qkv_bias;
  const double eps = std::stod(fmt::format("{}", spec.norm_eps));
  const double theta = std::stod(fmt::format("{}", spec.rope_theta));
  json config{
      {"model_type", qwen2 ? "qwen2" : "llama"},
      {"architectures", json::array({qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"})},
      {"num_hidden_layers", spec.n_layer},
      {"num_attention_heads", spec.n_head},
      {"num_key_value_heads", spec.n_kv_head},
      {"hidden_size", spec.n_embd},
      {"head_dim", spec.head_dim()},
      {"intermediate_size", spec.n_inner},
      {"vocab_size", spec.vocab_size},
      {"max_position_embeddings", spec.max_seq},
      {"rms_norm_eps", eps},
      {"rope_theta", theta},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"tie_word_embeddings", spec.tied_embeddings},
      {"torch_dtype", "float32"},
  };
  // The legacy spelling, which transformers 4 and 5 both read.
  const RopeScaling& r = spec.rope_scaling;
  if (r.kind == RopeScaling::Kind::linear) config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
  if (r.kind == RopeScaling::Kind::llama3)
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", r.factor},
                              {"low_freq_factor", r.low_freq_factor},
                              {"high_freq_factor", r.high_freq_factor},
                              {"original_max_position_embeddings", int64_t(r.original_max_positions)}};
  return config;
}

json hf_config(const ModelSpec& spec) { return spec.arch == Arch::gpt2 ? gpt2_hf_config(spec) : llama_hf_config(spec); }

}  // namespace memfit
