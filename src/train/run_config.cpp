#include "train/run_config.hpp"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "io/hf_config.hpp"
#include "train/config_values.hpp"
#include "train/deepspeed_config.hpp"

namespace memfit {

ModelSpec resolve_model(const std::string& model) {
  namespace fs = std::filesystem;
  const bool looks_like_path = model.find('/') != std::string::npos || model.ends_with(".json");
  if (looks_like_path) {
    fs::path path(model);
    if (fs::is_directory(path)) path /= "config.json";
    return read_hf_config(path.string());
  }
  return model_preset(model);
}

std::vector<std::string> split_freeze_patterns(const std::string& text) {
  std::vector<std::string> patterns;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    if (comma > at) patterns.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return patterns;
}



void apply_quantised_base_defaults(RunConfig& c) {
  if (!c.policy.quantize_base.enabled()) return;
  if (!c.precision_given) c.policy.precision = Precision::bf16;
  if (!c.attention_given) c.policy.attention = AttentionKind::flash;
}

LrSchedule lr_schedule_of(const RunConfig& c) {
  LrSchedule s;
  s.kind = c.lr_schedule;
  s.lr = c.lr;
  s.warmup = c.warmup_steps;
  s.min_lr = c.min_lr < 0 ? c.lr / 10 : c.min_lr;
  s.decay_steps = c.decay_steps > 0 ? c.decay_steps : c.steps;
  s.warmup_min_lr = c.warmup_min_lr;
  s.warmup_min_ratio = c.warmup_min_ratio;
  s.cos_min_ratio = c.cos_min_ratio;
  s.linear_warmup = c.linear_warmup;
  s.validate();
  return s;
}

namespace {

std::string_view input_piece(std::string_view field) { return field.starts_with("--") ? "cli" : "config"; }

// "--steps" as it is, a config key quoted: "key 'train_iters'".
std::string field_name(std::string_view field) {
  return field.starts_with("--") ? std::string(field) : fmt::format("key '{}'", field);
}

}  // namespace

std::string describe(IntRange r) { return fmt::format("an integer in [{}, {}]", r.lo, r.hi); }

std::string describe(RealRange r) {
  const std::string hi = std::isinf(r.hi) ? "" : fmt::format(" and {} {}", r.hi_open ? "<" : "<=", r.hi);
  return fmt::format("a number {} {}{}", r.lo_open ? ">" : ">=", r.lo, hi);
}

int64_t require_in(std::string_view field, int64_t v, IntRange r) {
  MEMFIT_CHECK(v >= r.lo && v <= r.hi, input_piece(field), "{} must be {} (got {})", field_name(field), describe(r),
               v);
  return v;
}

double require_in(std::string_view field, double v, RealRange r) {
  const bool above_lo = r.lo_open ? v > r.lo : v >= r.lo;
  const bool below_hi = r.hi_open ? v < r.hi : v <= r.hi;
  MEMFIT_CHECK(std::isfinite(v) && above_lo && below_hi, input_piece(field), "{} must be {} (got {})",
               field_name(field), describe(r), v);
  return v;
}

namespace {

template <typename T>
T parse_whole_text(std::string_view field, std::string_view text, std::string_view expected) {
  T v{};
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  MEMFIT_CHECK(ec != std::errc::result_out_of_range, input_piece(field), "{}: '{}' is out of range for {}", field,
               text, expected);
  MEMFIT_CHECK(ec == std::errc() && stop == end && !text.empty(), input_piece(field), "{}: '{}' is not {}", field,
               text, expected);
  return v;
}

}  // namespace

int64_t parse_integer_text(std::string_view field, std::string_view text) {
  return parse_whole_text<int64_t>(field, text, "an integer");
}

uint64_t parse_unsigned_text(std::string_view field, std::string_view text) {
  return parse_whole_text<uint64_t>(field, text, "an integer in [0, 2^64)");
}

double parse_real_text(std::string_view field, std::string_view text) {
  const double v = parse_whole_text<double>(field, text, "a number");
  MEMFIT_CHECK(std::isfinite(v), input_piece(field), "{}: '{}' is not a finite number", field, text);
  return v;
}

int64_t require_quant_block(std::string_view field, int64_t block) {
  require_in(field, block, input_range::quant_block);
  MEMFIT_CHECK((block & (block - 1)) == 0, input_piece(field),
               "{}: block size {} is not one bitsandbytes supports (32, 64, 128, ..., 4096)", field, block);
  return block;
}

using json = nlohmann::json;

namespace {

// PEFT's init_lora_weights: true, "gaussian" and false are drawn as PEFT draws them; "olora",
// "pissa" and "pissa_niter_N" also rewrite the base (train/lora_base_start.hpp); "orthogonal"
// only draws other starting adapters, which an adapter's file replaces; the others (corda,
// eva, loftq, ...) need data or a quantiser memfit does not have.
void parse_lora_init_value(const json& v, bool weights_from_file, LoraPolicy& l) {
  if (v.is_null() || v.is_boolean()) {
    parse_lora_init(v.is_null() || v.get<bool>() ? "true" : "false", l);
    return;
  }
  const std::string name = v.is_string() ? v.get<std::string>() : v.dump();
  if (parse_lora_init(name, l)) return;
  MEMFIT_CHECK(name == "orthogonal", "config",
               "lora.init_lora_weights '{}' is not supported: memfit builds true, \"gaussian\", false, \"olora\", "
               "\"pissa\" and \"pissa_niter_N\"", name);
  MEMFIT_CHECK(weights_from_file, "config",
               "lora.init_lora_weights {} is not supported: memfit draws PEFT's true, \"gaussian\" or false", name);
  l.init = LoraInit::peft_default;
}

}  // namespace

// PEFT's LoraConfig (adapter_config.json's keys). Keys that only describe the adapter file
// (peft_type, task_type, base_model_name_or_path, ...) are accepted and ignored; a key that
// would change the model in a way memfit does not build is refused.
void apply_lora_config(const json& j, RunConfig& c, bool weights_from_file) {
  MEMFIT_CHECK(j.is_object(), "config", "key 'lora' must be an object (PEFT's LoraConfig)");
  LoraPolicy& l = c.policy.lora;
  namespace range = input_range;
  for (const auto& [key, v] : j.items()) {
    if (key == "r") l.rank = get_integer(v, "lora.r", range::lora_rank);
    else if (key == "lora_alpha") l.alpha = get_real(v, "lora.lora_alpha", range::positive);
    else if (key == "lora_dropout") l.dropout = get_real(v, "lora.lora_dropout", range::fraction);
    else if (key == "bias") l.bias = parse_lora_bias(get_as<std::string>(v, "lora.bias"));
    else if (key == "target_modules") {
      l.targets.clear();
      l.target_regex.clear();
      if (v.is_null()) continue;
      if (v.is_string()) {
        // PEFT: a string is a regular expression over module names, except "all-linear".
        const std::string t = get_as<std::string>(v, "lora.target_modules");
        if (t == "all-linear") l.targets = {t};
        else l.target_regex = t;
      } else {
        l.targets = get_as<std::vector<std::string>>(v, "lora.target_modules");
      }
    } else if (key == "peft_type") {
      MEMFIT_CHECK(v.is_null() || get_as<std::string>(v, "lora.peft_type") == "LORA", "config",
                   "lora.peft_type must be LORA");
    } else if (key == "use_rslora") {
      l.rslora = get_as<bool>(v, "lora.use_rslora");
    } else if (key == "modules_to_save") {
      // PEFT takes a list of module names (null: none).
      l.modules_to_save = v.is_null() ? std::vector<std::string>{}
                                      : get_as<std::vector<std::string>>(v, "lora.modules_to_save");
    } else if (key == "use_dora") {
      l.dora = get_as<bool>(v, "lora.use_dora");
    } else if (key == "lora_bias" || key == "use_qalora" ||
               key == "fan_in_fan_out") {
      // fan_in_fan_out describes GPT-2's Conv1D storage, which memfit reads as HF stores it.
      if (key != "fan_in_fan_out")
        MEMFIT_CHECK(!v.is_boolean() || !v.get<bool>(), "config", "lora.{}: true is not supported", key);
    } else if (key == "memfit_start_seed") {
      l.start_seed = get_as<int64_t>(v, "lora.memfit_start_seed");
    } else if (key == "init_lora_weights") {
      parse_lora_init_value(v, weights_from_file, l);
    } else if (key == "exclude_modules") {
      l.exclude_modules.clear();
      l.exclude_regex.clear();
      if (v.is_string()) l.exclude_regex = get_as<std::string>(v, "lora.exclude_modules");
      else if (!v.is_null()) l.exclude_modules = get_as<std::vector<std::string>>(v, "lora.exclude_modules");
    } else if (key == "layers_to_transform") {
      l.layers_to_transform = v.is_null()      ? std::vector<int64_t>{}
                              : v.is_number() ? std::vector<int64_t>{get_as<int64_t>(v, "lora.layers_to_transform")}
                                              : get_as<std::vector<int64_t>>(v, "lora.layers_to_transform");
    } else if (key == "layers_pattern") {
      l.layers_pattern = v.is_null()      ? std::vector<std::string>{}
                         : v.is_string() ? std::vector<std::string>{get_as<std::string>(v, "lora.layers_pattern")}
                                         : get_as<std::vector<std::string>>(v, "lora.layers_pattern");
    } else if (key == "rank_pattern" || key == "alpha_pattern") {
      // PEFT writes {} for none; a key is a module-path pattern, its value a rank or an alpha.
      MEMFIT_CHECK(v.is_null() || v.is_object(), "config", "lora.{} must be an object of module patterns", key);
      if (key == "rank_pattern") l.rank_pattern.clear();
      else l.alpha_pattern.clear();
      if (v.is_object())
        for (const auto& [pattern, value] : v.items()) {
          const std::string what = "lora." + key + "." + pattern;
          if (key == "rank_pattern") l.rank_pattern.push_back({pattern, get_integer(value, what, range::lora_rank)});
          else l.alpha_pattern.push_back({pattern, get_real(value, what, range::positive)});
        }
    } else if (key == "alora_invocation_tokens" || key == "arrow_config" ||
               key == "kasa_config" || key == "lora_ga_config" || key == "monteclora_config" ||
               key == "velora_config" || key == "use_bdlora" ||
               key == "trainable_token_indices" || key == "target_parameters" || key == "layer_replication" ||
               key == "loftq_config" || key == "eva_config" || key == "corda_config") {
      // Later PEFT versions write these as null (or false) for a plain LoRA adapter.
      if (v.is_boolean() && !v.get<bool>()) continue;
      MEMFIT_CHECK(v.is_null() || (v.is_object() && v.empty()) || (v.is_array() && v.empty()), "config",
                   "lora.{} is not supported (leave it null or empty)", key);
    } else if (key == "task_type" || key == "base_model_name_or_path" || key == "inference_mode" ||
               key == "revision" || key == "auto_mapping" || key == "megatron_config" ||
               key == "megatron_core" || key == "runtime_config" || key == "qalora_group_size" ||
               key == "peft_version" || key == "ensure_weight_tying") {
      continue;
    } else {
      throw Error("config", fmt::format("unknown key 'lora.{}' (PEFT's LoraConfig keys)", key));
    }
  }
}

namespace {

// transformers' BitsAndBytesConfig (a model's quantization_config).
void apply_quantization_config(const json& j, RunConfig& c) {
  MEMFIT_CHECK(j.is_object(), "config", "key 'quantization_config' must be an object (BitsAndBytesConfig)");
  BaseQuantPolicy& q = c.policy.quantize_base;
  bool four = false, eight = false;
  std::string type = "fp4";  // bitsandbytes' default bnb_4bit_quant_type
  for (const auto& [key, v] : j.items()) {
    if (key == "load_in_4bit") four = get_as<bool>(v, key);
    else if (key == "load_in_8bit") eight = get_as<bool>(v, key);
    else if (key == "bnb_4bit_quant_type") type = get_as<std::string>(v, key);
    else if (key == "bnb_4bit_use_double_quant") q.double_quant = get_as<bool>(v, key);
    else if (key == "bnb_4bit_compute_dtype") {
      // transformers writes the torch dtype's name ("bfloat16", "float16", "float32").
      const std::string d = get_as<std::string>(v, key);
      const bool bf16 = d == "bfloat16" || d == "bf16", fp16 = d == "float16" || d == "fp16" || d == "half";
      MEMFIT_CHECK(bf16 || fp16 || d == "float32" || d == "fp32" || d == "float", "config",
                   "quantization_config.bnb_4bit_compute_dtype '{}' is not bfloat16, float16 or float32", d);
      c.policy.precision = bf16 ? Precision::bf16 : fp16 ? Precision::fp16 : Precision::fp32;
      c.precision_given = true;
    } else if (key == "quant_method" || key == "bnb_4bit_quant_storage" || key == "llm_int8_skip_modules" ||
               key == "llm_int8_threshold" || key == "llm_int8_has_fp16_weight" ||
               key == "llm_int8_enable_fp32_cpu_offload" || key == "_load_in_4bit" || key == "_load_in_8bit") {
      continue;
    } else {
      throw Error("config", fmt::format("unknown key 'quantization_config.{}'", key));
    }
  }
  MEMFIT_CHECK(!(four && eight), "config", "quantization_config: load_in_4bit and load_in_8bit are both true");
  if (four) q.kind = parse_base_quant(type);
  else if (eight) q.kind = BaseQuant::int8;
}

// memfit's own keys (at the top level, or inside a "memfit" block, which is where memfit's
// --emit deepspeed puts what DeepSpeed has no key for). False: not one of memfit's keys.
bool apply_memfit_key(const std::string& key, const json& v, RunConfig& c) {
  Policy& p = c.policy;
  namespace range = input_range;
  if (key == "model") c.model = get_as<std::string>(v, key);
  else if (key == "backend") c.backend = get_as<std::string>(v, key);
  else if (key == "data") c.data = get_as<std::string>(v, key);
  else if (key == "tokenizer") c.tokenizer = get_as<std::string>(v, key);
  else if (key == "steps" || key == "train_iters") c.steps = get_integer(v, key, range::steps);
  else if (key == "batch") p.batch = get_integer(v, key, range::batch);
  else if (key == "seq" || key == "seq_len") p.seq = get_integer(v, key, range::batch);
  else if (key == "grad_accum") p.grad_accum = int(get_integer(v, key, range::accumulation));
  else if (key == "lr") c.lr = get_real(v, key, range::non_negative);
  else if (key == "seed") c.seed = get_unsigned(v, key);
  else if (key == "shuffle") c.shuffle = get_as<bool>(v, key);
  else if (key == "val_fraction") c.val_fraction = get_real(v, key, range::fraction);
  else if (key == "eval_every") c.eval_every = get_integer(v, key, range::interval);
  else if (key == "eval_batches") c.eval_batches = get_integer(v, key, range::steps);
  else if (key == "warmup_steps") c.warmup_steps = get_integer(v, key, range::interval);
  else if (key == "lr_schedule") c.lr_schedule = parse_lr_schedule(get_as<std::string>(v, key));
  else if (key == "min_lr") c.min_lr = get_real(v, key, range::non_negative);
  else if (key == "decay_steps") c.decay_steps = get_integer(v, key, range::interval);
  else if (key == "keep_checkpoints") c.keep_checkpoints = int(get_integer(v, key, range::kept_checkpoints));
  else if (key == "precision") {
    p.precision = parse_precision(get_as<std::string>(v, key));
    c.precision_given = true;
  }
  else if (key == "grad_dtype") p.grad_dtype = parse_dtype(get_as<std::string>(v, key));
  else if (key == "fp32_ops") p.fp32_ops = get_as<std::vector<std::string>>(v, key);
  else if (key == "freeze")
    p.freeze = v.is_string() ? split_freeze_patterns(get_as<std::string>(v, key)) : get_as<std::vector<std::string>>(v, key);
  else if (key == "loss_scaler") c.loss_scale.convention = parse_loss_scale_convention(get_as<std::string>(v, key));
  else if (key == "optimizer_in_backward") {
    p.update_in_backward = get_as<bool>(v, key);
  } else if (key == "comm_timeout") {
    c.comm_timeout = get_real(v, key, range::comm_timeout);
  } else if (key == "grad_clip") {
    p.grad_clip = get_real(v, key, range::non_negative);
  } else if (key == "recompute") {
    p.recompute = parse_recompute(get_as<std::string>(v, key));
  } else if (key == "attention") {
    p.attention = parse_attention(get_as<std::string>(v, key));
    c.attention_given = true;
  } else if (key == "classifier_chunk_rows") {
    p.classifier_chunk_rows = get_integer(v, key, range::chunk_rows);
  } else if (key == "offload_optimizer") {
    p.offload_optimizer = parse_tier(get_as<std::string>(v, key));
  } else if (key == "offload_dir") {
    c.offload_dir = get_as<std::string>(v, key);
  } else if (key == "offload_chunk_elements") {
    p.offload_chunk_elements = get_integer(v, key, range::offload_chunk);
  } else if (key == "lora") {
    apply_lora_config(v, c);
  } else if (key == "load_adapter") {
    c.load_adapter = get_as<std::string>(v, key);
  } else if (key == "quantization_config") {
    apply_quantization_config(v, c);
  } else if (key == "quantize_base") {
    p.quantize_base.kind = parse_base_quant(get_as<std::string>(v, key));
  } else if (key == "quant_block") {
    p.quantize_base.block = require_quant_block(key, get_integer(v, key, range::quant_block));
  } else if (key == "double_quant") {
    p.quantize_base.double_quant = get_as<bool>(v, key);
  } else {
    return false;
  }
  return true;
}

}  // namespace

void apply_config_file(const std::string& path, RunConfig& c) {
  std::ifstream in(path);
  MEMFIT_CHECK(in.good(), "config", "cannot open config file '{}'", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error("config", fmt::format("'{}' is not valid JSON: {}", path, e.what()));
  }
  MEMFIT_CHECK(j.is_object(), "config", "'{}' must hold a JSON object", path);
  for (const auto& [key, v] : j.items()) {
    if (apply_deepspeed_key(key, v, c) || apply_memfit_key(key, v, c)) continue;
    if (key == "memfit") {
      MEMFIT_CHECK(v.is_object(), "config", "key 'memfit' must be an object");
      for (const auto& [sub, sv] : v.items())
        if (!apply_memfit_key(sub, sv, c)) throw Error("config", fmt::format("unknown key 'memfit.{}' in '{}'", sub, path));
      continue;
    }
    throw Error("config", fmt::format("unknown key '{}' in '{}'", key, path));
  }
  // The file alone must be consistent; flags given later are settled again (cli/options.cpp).
  resolve_batch_keys(c, c.topology.data, c.config_note);
}

}  // namespace memfit
