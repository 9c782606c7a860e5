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

using json = nlohmann::json;

namespace {

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
  else if (key == "precision") p.precision = parse_precision(get_as<std::string>(v, key));
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
  } else if (key == "classifier_chunk_rows") {
    p.classifier_chunk_rows = get_integer(v, key, range::chunk_rows);
  } else if (key == "offload_optimizer") {
    p.offload_optimizer = parse_tier(get_as<std::string>(v, key));
  } else if (key == "offload_dir") {
    c.offload_dir = get_as<std::string>(v, key);
  } else if (key == "offload_chunk_elements") {
    p.offload_chunk_elements = get_integer(v, key, range::offload_chunk);
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
