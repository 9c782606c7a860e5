#include "train/run_config.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

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

using json = nlohmann::json;

template <typename T>
T get_as(const json& j, const std::string& key) {
  try {
    return j.get<T>();
  } catch (const json::exception&) {
    throw Error("config", fmt::format("key '{}' has the wrong type ({})", key, j.type_name()));
  }
}

void refuse_unless(bool ok, const std::string& key, const std::string& why) {
  MEMFIT_CHECK(ok, "config", "key '{}': {}", key, why);
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
  for (const auto& [key, v] : j.items()) {
    if (key == "model") c.model = get_as<std::string>(v, key);
    else if (key == "backend") c.backend = get_as<std::string>(v, key);
    else if (key == "data") c.data = get_as<std::string>(v, key);
    else if (key == "steps" || key == "train_iters") c.steps = get_as<int64_t>(v, key);
    else if (key == "batch" || key == "train_micro_batch_size_per_gpu") p.batch = get_as<int64_t>(v, key);
    else if (key == "seq" || key == "seq_len") p.seq = get_as<int64_t>(v, key);
    else if (key == "gradient_accumulation_steps" || key == "grad_accum") p.grad_accum = get_as<int>(v, key);
    else if (key == "lr") c.lr = get_as<double>(v, key);
    else if (key == "seed") c.seed = get_as<uint64_t>(v, key);
    else if (key == "shuffle") c.shuffle = get_as<bool>(v, key);
    else if (key == "val_fraction") c.val_fraction = get_as<double>(v, key);
    else if (key == "eval_every") c.eval_every = get_as<int64_t>(v, key);
    else if (key == "eval_batches") c.eval_batches = get_as<int64_t>(v, key);
    else if (key == "warmup_steps") c.warmup_steps = get_as<int64_t>(v, key);
    else if (key == "lr_schedule") c.lr_schedule = parse_lr_schedule(get_as<std::string>(v, key));
    else if (key == "min_lr") c.min_lr = get_as<double>(v, key);
    else if (key == "decay_steps") c.decay_steps = get_as<int64_t>(v, key);
    else if (key == "keep_checkpoints") c.keep_checkpoints = get_as<int>(v, key);
    else if (key == "precision") p.precision = parse_precision(get_as<std::string>(v, key));
    else if (key == "grad_dtype") p.grad_dtype = parse_dtype(get_as<std::string>(v, key));
    else if (key == "fp32_ops") p.fp32_ops = get_as<std::vector<std::string>>(v, key);
    else if (key == "freeze")
      p.freeze = v.is_string() ? split_freeze_patterns(get_as<std::string>(v, key)) : get_as<std::vector<std::string>>(v, key);
    else if (key == "loss_scaler") c.loss_scale.convention = parse_loss_scale_convention(get_as<std::string>(v, key));
    else if (key == "bf16" || key == "fp16") {
      MEMFIT_CHECK(v.is_object(), "config", "key '{}' must be an object", key);
      if (key == "fp16") c.loss_scale.convention = LossScaleConvention::deepspeed;  // DeepSpeed's keys, its rules
      for (const auto& [sub, sv] : v.items()) {
        const std::string name = key + "." + sub;
        LossScaleConfig& ls = c.loss_scale;
        if (sub == "enabled") {
          if (get_as<bool>(sv, name)) p.precision = key == "bf16" ? Precision::bf16 : Precision::fp16;
        } else if (key == "bf16") {
          throw Error("config", fmt::format("unknown key '{}'", name));
        } else if (sub == "loss_scale") {
          ls.fixed_scale = get_as<double>(sv, name);  // 0: dynamic
        } else if (sub == "initial_scale_power") {
          const int power = get_as<int>(sv, name);
          refuse_unless(power >= -100 && power <= 100, name, fmt::format("{} is outside [-100, 100]", power));
          ls.initial_scale = std::ldexp(1.0, power);
        } else if (sub == "loss_scale_window") {
          ls.window = get_as<int64_t>(sv, name);
          refuse_unless(ls.window >= 1, name, "must be at least 1");
        } else if (sub == "hysteresis") {
          ls.hysteresis = get_as<int>(sv, name);
          refuse_unless(ls.hysteresis >= 1, name, "must be at least 1");
        } else if (sub == "consecutive_hysteresis") {
          ls.consecutive_hysteresis = get_as<bool>(sv, name);
        } else if (sub == "min_loss_scale") {
          ls.min_scale = get_as<double>(sv, name);
        } else {
          throw Error("config", fmt::format("unknown key '{}'", name));
        }
      }
      c.loss_scale.validate();
    } else if (key == "data_types") {
      MEMFIT_CHECK(v.is_object(), "config", "key 'data_types' must be an object");
      for (const auto& [sub, sv] : v.items()) {
        if (sub == "grad_accum_dtype") p.grad_dtype = parse_dtype(get_as<std::string>(sv, "data_types." + sub));
        else throw Error("config", fmt::format("unknown key 'data_types.{}'", sub));
      }
    } else if (key == "optimizer") {
      MEMFIT_CHECK(v.is_object(), "config", "key 'optimizer' must be an object");
      const std::string type = v.value("type", "AdamW");
      const bool eight_bit = type == "AdamW8bit" || type == "adamw8bit";
      refuse_unless(type == "AdamW" || type == "adamw" || type == "Adam" || eight_bit, "optimizer.type",
                    fmt::format("optimizer '{}' is not supported (AdamW and AdamW8bit are)", type));
      p.optimizer = eight_bit ? OptimizerKind::adamw8bit : OptimizerKind::adamw;
      if (v.contains("params")) {
        const json& op = v["params"];
        for (const auto& [sub, sv] : op.items()) {
          if (sub == "lr") c.lr = get_as<double>(sv, "optimizer.params.lr");
          else if (sub == "betas") {
            const auto b = get_as<std::vector<double>>(sv, "optimizer.params.betas");
            refuse_unless(b.size() == 2, "optimizer.params.betas", "expected two numbers");
            p.adamw.beta1 = b[0];
            p.adamw.beta2 = b[1];
          } else if (sub == "eps") p.adamw.eps = get_as<double>(sv, "optimizer.params.eps");
          else if (sub == "weight_decay") p.adamw.weight_decay = get_as<float>(sv, "optimizer.params.weight_decay");
          else throw Error("config", fmt::format("unknown key 'optimizer.params.{}'", sub));
        }
      }
    } else if (key == "zero_optimization") {
      MEMFIT_CHECK(v.is_object(), "config", "key 'zero_optimization' must be an object");
      for (const auto& [sub, sv] : v.items()) {
        if (sub == "stage") p.zero_stage = get_as<int>(sv, "zero_optimization.stage");
        else if (sub == "overlap_comm") p.overlap_comm = get_as<bool>(sv, "zero_optimization.overlap_comm");
        else if (sub == "offload_optimizer" || sub == "offload_param") {
          const std::string dev = sv.value("device", "none");
          (sub == "offload_optimizer" ? p.offload_optimizer : p.offload_params) = parse_tier(dev);
        } else throw Error("config", fmt::format("unknown key 'zero_optimization.{}'", sub));
      }
    } else if (key == "optimizer_in_backward") {
      p.update_in_backward = get_as<bool>(v, key);
    } else if (key == "comm_timeout") {
      c.comm_timeout = get_as<double>(v, key);
      refuse_unless(c.comm_timeout >= 0, key, "seconds must be >= 0 (0: no limit)");
    } else if (key == "gradient_clipping" || key == "grad_clip") {
      p.grad_clip = get_as<double>(v, key);
    } else if (key == "train_batch_size") {
      // DeepSpeed's global batch: must agree with micro-batch x accumulation x world size.
      const int64_t global = get_as<int64_t>(v, key);
      const int64_t implied = j.value("train_micro_batch_size_per_gpu", p.batch) *
                              j.value("gradient_accumulation_steps", p.grad_accum) * c.topology.data;
      refuse_unless(global == implied, key,
                    fmt::format("{} does not equal micro-batch x accumulation x data-parallel ranks = {}", global,
                                implied));
    } else {
      throw Error("config", fmt::format("unknown key '{}' in '{}'", key, path));
    }
  }
}

}  // namespace memfit
