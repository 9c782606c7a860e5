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

LrSchedule lr_schedule_of(const RunConfig& c) {
  LrSchedule s;
  s.kind = c.lr_schedule;
  s.lr = c.lr;
  s.warmup = c.warmup_steps;
  s.min_lr = c.min_lr < 0 ? c.lr / 10 : c.min_lr;
  s.decay_steps = c.decay_steps > 0 ? c.decay_steps : c.steps;
  s.validate();
  return s;
}

namespace {

std::string_view input_piece(std::string_view field) { return field.starts_with("--") ? "cli" : "config"; }

// "--steps" as it is, a config key quoted: "key 'train_iters'".
std::string field_name(std::string_view field) {
  return field.starts_with("--") ? std::string(field) : fmt::format("key '{}'", field);
}

std::string describe(IntRange r) { return fmt::format("an integer in [{}, {}]", r.lo, r.hi); }

std::string describe(RealRange r) {
  const std::string hi = std::isinf(r.hi) ? "" : fmt::format(" and {} {}", r.hi_open ? "<" : "<=", r.hi);
  return fmt::format("a number {} {}{}", r.lo_open ? ">" : ">=", r.lo, hi);
}

}  // namespace

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

namespace {

using json = nlohmann::json;

template <typename T>
T get_as(const json& j, const std::string& key) {
  try {
    return j.get<T>();
  } catch (const json::exception&) {
    throw Error("config", fmt::format("key '{}' has the wrong type ({})", key, j.type_name()));
  }
}

// An integer key: a JSON integer (not 2.0, not 1e5) within the range.
int64_t get_integer(const json& v, const std::string& key, IntRange r) {
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
  MEMFIT_CHECK(v.is_number_integer() && !too_big, "config", "key '{}' must be {} (got {})", key, describe(r),
               v.dump());
  return require_in(key, v.get<int64_t>(), r);
}

uint64_t get_unsigned(const json& v, const std::string& key) {
  MEMFIT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), "config",
               "key '{}' must be an integer in [0, 2^64) (got {})", key, v.dump());
  return v.get<uint64_t>();
}

double get_real(const json& v, const std::string& key, RealRange r) {
  MEMFIT_CHECK(v.is_number(), "config", "key '{}' must be {} (got {})", key, describe(r), v.dump());
  return require_in(key, v.get<double>(), r);
}

void refuse_unless(bool ok, const std::string& key, const std::string& why) {
  MEMFIT_CHECK(ok, "config", "key '{}': {}", key, why);
}

// DeepSpeed's "bf16" / "fp16" blocks.
void apply_precision_block(const std::string& key, const json& v, RunConfig& c) {
  MEMFIT_CHECK(v.is_object(), "config", "key '{}' must be an object", key);
  if (key == "fp16") c.loss_scale.convention = LossScaleConvention::deepspeed;  // DeepSpeed's keys, its rules
  for (const auto& [sub, sv] : v.items()) {
    const std::string name = key + "." + sub;
    LossScaleConfig& ls = c.loss_scale;
    if (sub == "enabled") {
      if (get_as<bool>(sv, name)) c.policy.precision = key == "bf16" ? Precision::bf16 : Precision::fp16;
    } else if (key == "bf16") {
      throw Error("config", fmt::format("unknown key '{}'", name));
    } else if (sub == "loss_scale") {
      ls.fixed_scale = get_real(sv, name, input_range::non_negative);  // 0: dynamic
    } else if (sub == "initial_scale_power") {
      ls.initial_scale = std::ldexp(1.0, int(get_integer(sv, name, IntRange{-100, 100})));
    } else if (sub == "loss_scale_window") {
      ls.window = get_integer(sv, name, input_range::steps);
    } else if (sub == "hysteresis") {
      ls.hysteresis = int(get_integer(sv, name, input_range::hysteresis));
    } else if (sub == "consecutive_hysteresis") {
      ls.consecutive_hysteresis = get_as<bool>(sv, name);
    } else if (sub == "min_loss_scale") {
      ls.min_scale = get_real(sv, name, input_range::positive);
    } else {
      throw Error("config", fmt::format("unknown key '{}'", name));
    }
  }
  c.loss_scale.validate();
}

// The "optimizer" block: {"type": ..., "params": {"lr", "betas", "eps", "weight_decay"}}, with
// the ranges PyTorch's AdamW checks.
void apply_optimizer_block(const json& v, RunConfig& c) {
  MEMFIT_CHECK(v.is_object(), "config", "key 'optimizer' must be an object");
  Policy& p = c.policy;
  const std::string type = v.contains("type") ? get_as<std::string>(v["type"], "optimizer.type") : "AdamW";
  const bool eight_bit = type == "AdamW8bit" || type == "adamw8bit";
  refuse_unless(type == "AdamW" || type == "adamw" || type == "Adam" || eight_bit, "optimizer.type",
                fmt::format("optimizer '{}' is not supported (AdamW and AdamW8bit are)", type));
  p.optimizer = eight_bit ? OptimizerKind::adamw8bit : OptimizerKind::adamw;
  for (const auto& [sub, sv] : v.items())
    if (sub != "type" && sub != "params") throw Error("config", fmt::format("unknown key 'optimizer.{}'", sub));
  if (!v.contains("params")) return;
  const json& op = v["params"];
  MEMFIT_CHECK(op.is_object(), "config", "key 'optimizer.params' must be an object");
  for (const auto& [sub, sv] : op.items()) {
    const std::string name = "optimizer.params." + sub;
    if (sub == "lr") {
      c.lr = get_real(sv, name, input_range::non_negative);
    } else if (sub == "betas") {
      MEMFIT_CHECK(sv.is_array() && sv.size() == 2, "config", "key '{}' must be two numbers (got {})", name, sv.dump());
      p.adamw.beta1 = get_real(sv[0], name + "[0]", input_range::beta);
      p.adamw.beta2 = get_real(sv[1], name + "[1]", input_range::beta);
    } else if (sub == "eps") {
      p.adamw.eps = get_real(sv, name, input_range::non_negative);
    } else if (sub == "weight_decay") {
      p.adamw.weight_decay = float(get_real(sv, name, input_range::weight_decay));
    } else {
      throw Error("config", fmt::format("unknown key '{}'", name));
    }
  }
}

void apply_zero_block(const json& v, Policy& p) {
  MEMFIT_CHECK(v.is_object(), "config", "key 'zero_optimization' must be an object");
  for (const auto& [sub, sv] : v.items()) {
    const std::string name = "zero_optimization." + sub;
    if (sub == "stage") {
      p.zero_stage = int(get_integer(sv, name, input_range::zero_stage));
    } else if (sub == "overlap_comm") {
      p.overlap_comm = get_as<bool>(sv, name);
    } else if (sub == "offload_optimizer" || sub == "offload_param") {
      MEMFIT_CHECK(sv.is_object(), "config", "key '{}' must be an object", name);
      const std::string dev = sv.contains("device") ? get_as<std::string>(sv["device"], name + ".device") : "none";
      (sub == "offload_optimizer" ? p.offload_optimizer : p.offload_params) = parse_tier(dev);
    } else {
      throw Error("config", fmt::format("unknown key '{}'", name));
    }
  }
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
  Policy& p = c.policy;
  namespace range = input_range;
  std::optional<int64_t> global_batch;  // train_batch_size: checked once every key is read
  for (const auto& [key, v] : j.items()) {
    if (key == "model") c.model = get_as<std::string>(v, key);
    else if (key == "backend") c.backend = get_as<std::string>(v, key);
    else if (key == "data") c.data = get_as<std::string>(v, key);
    else if (key == "steps" || key == "train_iters") c.steps = get_integer(v, key, range::steps);
    else if (key == "batch" || key == "train_micro_batch_size_per_gpu") p.batch = get_integer(v, key, range::batch);
    else if (key == "seq" || key == "seq_len") p.seq = get_integer(v, key, range::batch);
    else if (key == "gradient_accumulation_steps" || key == "grad_accum")
      p.grad_accum = int(get_integer(v, key, range::accumulation));
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
    else if (key == "precision") p.precision = parse_precision(get_as<std::string>(v, key));
    else if (key == "grad_dtype") p.grad_dtype = parse_dtype(get_as<std::string>(v, key));
    else if (key == "fp32_ops") p.fp32_ops = get_as<std::vector<std::string>>(v, key);
    else if (key == "freeze")
      p.freeze = v.is_string() ? split_freeze_patterns(get_as<std::string>(v, key)) : get_as<std::vector<std::string>>(v, key);
    else if (key == "loss_scaler") c.loss_scale.convention = parse_loss_scale_convention(get_as<std::string>(v, key));
    else if (key == "bf16" || key == "fp16") apply_precision_block(key, v, c);
    else if (key == "data_types") {
      MEMFIT_CHECK(v.is_object(), "config", "key 'data_types' must be an object");
      for (const auto& [sub, sv] : v.items()) {
        if (sub == "grad_accum_dtype") p.grad_dtype = parse_dtype(get_as<std::string>(sv, "data_types." + sub));
        else throw Error("config", fmt::format("unknown key 'data_types.{}'", sub));
      }
    } else if (key == "optimizer") {
      apply_optimizer_block(v, c);
    } else if (key == "zero_optimization") {
      apply_zero_block(v, p);
    } else if (key == "optimizer_in_backward") {
      p.update_in_backward = get_as<bool>(v, key);
    } else if (key == "comm_timeout") {
      c.comm_timeout = get_real(v, key, range::comm_timeout);
    } else if (key == "gradient_clipping" || key == "grad_clip") {
      p.grad_clip = get_real(v, key, range::non_negative);
    } else if (key == "train_batch_size") {
      global_batch = get_integer(v, key, IntRange{1, INT64_MAX});
    } else {
      throw Error("config", fmt::format("unknown key '{}' in '{}'", key, path));
    }
  }
  if (global_batch) {
    // DeepSpeed's global batch: must agree with micro-batch x accumulation x data-parallel ranks.
    const int64_t implied = checked_mul(checked_mul(p.batch, int64_t(p.grad_accum), "train_batch_size", "config"),
                                        int64_t(c.topology.data), "train_batch_size", "config");
    refuse_unless(*global_batch == implied, "train_batch_size",
                  fmt::format("{} does not equal micro-batch x accumulation x data-parallel ranks = {}",
                              *global_batch, implied));
  }
}

}  // namespace memfit
