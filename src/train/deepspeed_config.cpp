#include "train/deepspeed_config.hpp"

#include <cmath>
#include <map>

#include "core/checked.hpp"
#include "train/config_values.hpp"

namespace memfit {

namespace {

using json = nlohmann::json;
namespace range = input_range;

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

[[noreturn]] void unknown_key(const std::string& name) { throw Error("config", fmt::format("unknown key '{}'", name)); }

// A switch memfit honours in one position only: its other value asks for a behaviour memfit lacks.
void require_switch(const json& v, const std::string& name, bool honoured, const std::string& why) {
  if (is_auto(v)) return;
  refuse_unless(get_as<bool>(v, name) == honoured, name, why);
}

const json& object_at(const json& v, const std::string& name) {
  MEMFIT_CHECK(v.is_object(), "config", "key '{}' must be an object", name);
  return v;
}

// DeepSpeed's "bf16" / "fp16" blocks.
void apply_precision_block(const std::string& key, const json& v, RunConfig& c) {
  object_at(v, key);
  if (key == "fp16") c.loss_scale.convention = LossScaleConvention::deepspeed;  // DeepSpeed's keys, its rules
  for (const auto& [sub, sv] : v.items()) {
    const std::string name = key + "." + sub;
    LossScaleConfig& ls = c.loss_scale;
    if (is_auto(sv)) continue;
    if (sub == "enabled") {
      if (get_as<bool>(sv, name)) {
        c.policy.precision = key == "bf16" ? Precision::bf16 : Precision::fp16;
        c.precision_given = true;
      }
    } else if (key == "bf16") {
      unknown_key(name);
    } else if (sub == "loss_scale") {
      ls.fixed_scale = get_real(sv, name, range::non_negative);  // 0: dynamic
    } else if (sub == "initial_scale_power") {
      ls.initial_scale = std::ldexp(1.0, int(get_integer(sv, name, IntRange{-100, 100})));
    } else if (sub == "loss_scale_window") {
      ls.window = get_integer(sv, name, range::steps);
    } else if (sub == "hysteresis") {
      ls.hysteresis = int(get_integer(sv, name, range::hysteresis));
    } else if (sub == "consecutive_hysteresis") {
      ls.consecutive_hysteresis = get_as<bool>(sv, name);
    } else if (sub == "min_loss_scale") {
      ls.min_scale = get_real(sv, name, range::positive);
    } else if (sub == "auto_cast") {
      require_switch(sv, name, false, "memfit casts inputs by its precision pass, not by autocast");
    } else if (sub == "fp16_master_weights_and_grads") {
      require_switch(sv, name, false, "memfit keeps fp32 master weights under fp16");
    } else {
      unknown_key(name);
    }
  }
  c.loss_scale.validate();
}

// The "optimizer" block: {"type": ..., "params": {"lr", "betas", "eps", "weight_decay", ...}}, with
// the ranges PyTorch's AdamW checks.
void apply_optimizer_block(const json& v, RunConfig& c) {
  object_at(v, "optimizer");
  Policy& p = c.policy;
  const std::string type = v.contains("type") ? get_as<std::string>(v["type"], "optimizer.type") : "AdamW";
  const bool eight_bit = type == "AdamW8bit" || type == "adamw8bit";
  refuse_unless(type == "AdamW" || type == "adamw" || type == "Adam" || type == "adam" || eight_bit, "optimizer.type",
                fmt::format("optimizer '{}' is not supported (Adam, AdamW and AdamW8bit are)", type));
  p.optimizer = eight_bit ? OptimizerKind::adamw8bit : OptimizerKind::adamw;
  for (const auto& [sub, sv] : v.items())
    if (sub != "type" && sub != "params") unknown_key("optimizer." + sub);
  if (!v.contains("params")) return;
  const json& op = object_at(v["params"], "optimizer.params");
  for (const auto& [sub, sv] : op.items()) {
    const std::string name = "optimizer.params." + sub;
    if (is_auto(sv)) continue;
    if (sub == "lr") {
      c.lr = get_real(sv, name, range::non_negative);
    } else if (sub == "betas") {
      MEMFIT_CHECK(sv.is_array() && sv.size() == 2, "config", "key '{}' must be two numbers (got {})", name, sv.dump());
      p.adamw.beta1 = get_real(sv[0], name + "[0]", range::beta);
      p.adamw.beta2 = get_real(sv[1], name + "[1]", range::beta);
    } else if (sub == "eps") {
      p.adamw.eps = get_real(sv, name, range::non_negative);
    } else if (sub == "weight_decay") {
      p.adamw.weight_decay = float(get_real(sv, name, range::weight_decay));
    } else if (sub == "adam_w_mode") {
      require_switch(sv, name, true, "Adam with L2 regularisation (adam_w_mode false) is not supported; AdamW is");
    } else if (sub == "bias_correction") {
      require_switch(sv, name, true, "Adam without bias correction is not supported");
    } else if (sub == "torch_adam") {
      get_as<bool>(sv, name);  // which implementation runs the same update: memfit's kernels either way
    } else {
      unknown_key(name);
    }
  }
}

// DeepSpeed's learning-rate schedulers, with the values they take in DeepSpeed's engine
// (train/lr_schedule.hpp). warmup_max_lr, like DeepSpeed, defaults to the optimizer's lr.
void apply_scheduler_block(const json& v, RunConfig& c) {
  object_at(v, "scheduler");
  const std::string type = v.contains("type") ? get_as<std::string>(v["type"], "scheduler.type") : "";
  const bool known = type == "WarmupLR" || type == "WarmupDecayLR" || type == "WarmupCosineLR";
  refuse_unless(known, "scheduler.type",
                fmt::format("scheduler '{}' is not supported (WarmupLR, WarmupDecayLR and WarmupCosineLR are)", type));
  c.lr_schedule = parse_lr_schedule(type);
  c.warmup_steps = 1000;  // DeepSpeed's defaults
  c.warmup_min_lr = 0;
  c.warmup_min_ratio = 0;
  c.cos_min_ratio = 0.0001;
  c.linear_warmup = false;
  for (const auto& [sub, sv] : v.items())
    if (sub != "type" && sub != "params") unknown_key("scheduler." + sub);
  if (!v.contains("params")) return;
  const bool cosine = c.lr_schedule == LrScheduleKind::deepspeed_warmup_cosine;
  for (const auto& [sub, sv] : object_at(v["params"], "scheduler.params").items()) {
    const std::string name = "scheduler.params." + sub;
    if (is_auto(sv)) continue;
    if (sub == "warmup_num_steps") {
      c.warmup_steps = get_count(sv, name, range::steps);
    } else if (sub == "warmup_type") {
      const std::string shape = get_as<std::string>(sv, name);
      refuse_unless(shape == "log" || shape == "linear", name, fmt::format("'{}' is neither log nor linear", shape));
      c.linear_warmup = shape == "linear";
    } else if (sub == "total_num_steps" && type != "WarmupLR") {
      c.decay_steps = get_count(sv, name, range::steps);
    } else if (sub == "warmup_min_lr" && !cosine) {
      c.warmup_min_lr = get_real(sv, name, range::non_negative);
    } else if (sub == "warmup_max_lr" && !cosine) {
      c.lr = get_real(sv, name, range::non_negative);
    } else if (sub == "warmup_min_ratio" && cosine) {
      c.warmup_min_ratio = get_real(sv, name, RealRange{0, 1});
    } else if (sub == "cos_min_ratio" && cosine) {
      c.cos_min_ratio = get_real(sv, name, range::non_negative);
    } else if (sub == "last_batch_iteration") {
      refuse_unless(get_integer(sv, name, IntRange{-1, kMaxSteps}) == -1, name,
                    "starting a schedule mid-way is what --resume does (the checkpoint keeps the step)");
    } else {
      unknown_key(name);
    }
  }
}

void apply_offload_block(const std::string& name, const json& v, Tier& tier, RunConfig::OffloadKeys& keys,
                         std::string& note) {
  object_at(v, name);
  for (const auto& [sub, sv] : v.items()) {
    const std::string key = name + "." + sub;
    if (is_auto(sv)) continue;
    // DeepSpeed's buffer pool and pinning: memfit's plan sizes the staging itself, and the CPU
    // backend's host tier is ordinary RAM. Read, checked, and said in the run log.
    if (sub == "buffer_count" || sub == "buffer_size" || sub == "max_in_cpu" || sub == "pin_memory")
      note += fmt::format("{}{} is read but bounds nothing: memfit stages offloaded tensors through buffers its plan "
                          "sizes (--offload-chunk-elements)", note.empty() ? "" : "; ", key);
    if (sub == "device") {
      tier = parse_tier(get_as<std::string>(sv, key));
    } else if (sub == "nvme_path") {
      keys.nvme_path = get_as<std::string>(sv, key);
    } else if (sub == "pin_memory") {
      keys.pin_memory = get_as<bool>(sv, key);
    } else if (sub == "buffer_count") {
      keys.buffer_count = get_count(sv, key, IntRange{1, 1 << 20});
    } else if (sub == "buffer_size") {
      keys.buffer_size = get_count(sv, key, IntRange{1, INT64_MAX});
    } else if (sub == "max_in_cpu") {
      keys.max_in_cpu = get_count(sv, key, IntRange{0, INT64_MAX});
    } else if (sub == "ratio") {
      refuse_unless(get_real(sv, key, RealRange{0, 1, true}) == 1.0, key,
                    "offloading part of the optimizer (ratio below 1) is not supported");
    } else if (sub == "fast_init") {
      get_as<bool>(sv, key);  // how DeepSpeed initialises the offloaded state; memfit plans it either way
    } else {
      unknown_key(key);
    }
  }
}

void apply_zero_block(const json& v, RunConfig& c) {
  object_at(v, "zero_optimization");
  Policy& p = c.policy;
  auto bound = [&](const json& sv, const std::string& name, int64_t& into) {
    into = get_count(sv, name, IntRange{1, INT64_MAX});
  };
  for (const auto& [sub, sv] : v.items()) {
    const std::string name = "zero_optimization." + sub;
    if (is_auto(sv)) continue;
    if (sub == "stage") p.zero_stage = int(get_integer(sv, name, range::zero_stage));
    else if (sub == "overlap_comm") p.overlap_comm = get_as<bool>(sv, name);
    else if (sub == "zero_quantized_weights") p.zero_quantized_weights = get_as<bool>(sv, name);
    else if (sub == "zero_quantized_gradients") p.zero_quantized_gradients = get_as<bool>(sv, name);
    else if (sub == "zero_hpz_partition_size")
      p.zero_hpz_partition_size = int(get_integer(sv, name, range::ranks_per_node));
    else if (sub == "offload_optimizer") {
      apply_offload_block(name, sv, p.offload_optimizer, c.offload_optimizer_keys, c.deepspeed_note);
      if (c.offload_dir.empty()) c.offload_dir = c.offload_optimizer_keys.nvme_path;
    }
    else if (sub == "offload_param")
      apply_offload_block(name, sv, p.offload_params, c.offload_param_keys, c.deepspeed_note);
    else if (sub == "contiguous_gradients")
      require_switch(sv, name, true, "memfit's gradients always live in contiguous planned buckets");
    else if (sub == "reduce_scatter")
      require_switch(sv, name, true, "memfit reduces sharded gradients by reduce-scatter; all-reduce is not offered");
    else if (sub == "allgather_partitions")
      require_switch(sv, name, true, "memfit gathers partitions by all-gather; broadcasts are not offered");
    else if (sub == "round_robin_gradients")
      require_switch(sv, name, false, "round-robin gradient partitioning is not supported");
    else if (sub == "stage3_gather_16bit_weights_on_model_save")
      require_switch(sv, name, true, "memfit's --save always writes whole weights");
    else if (sub == "reduce_bucket_size") bound(sv, name, c.zero_bounds.reduce_bucket);
    else if (sub == "allgather_bucket_size") bound(sv, name, c.zero_bounds.allgather_bucket);
    else if (sub == "stage3_prefetch_bucket_size") bound(sv, name, c.zero_bounds.prefetch_bucket);
    else if (sub == "stage3_max_live_parameters") bound(sv, name, c.zero_bounds.max_live_parameters);
    else if (sub == "sub_group_size") bound(sv, name, c.zero_bounds.sub_group);
    else if (sub == "stage3_max_reuse_distance") get_count(sv, name, IntRange{0, INT64_MAX});  // memfit releases at last use
    else if (sub == "stage3_param_persistence_threshold")
      refuse_unless(get_count(sv, name, IntRange{0, INT64_MAX}) == 0, name,
                    "memfit shards every parameter at stage 3; keeping small ones whole is not supported (use 0)");
    else unknown_key(name);
  }
}

// activation_checkpointing: DeepSpeed's checkpointing of each transformer layer's input, which
// is memfit's full recomputation unless --recompute says otherwise.
void apply_activation_checkpointing_block(const json& v, RunConfig& c) {
  object_at(v, "activation_checkpointing");
  for (const auto& [sub, sv] : v.items()) {
    const std::string name = "activation_checkpointing." + sub;
    if (is_auto(sv)) continue;
    if (sub == "partition_activations")
      require_switch(sv, name, false, "partitioning checkpoints needs tensor parallelism, which memfit lacks");
    else if (sub == "cpu_checkpointing")
      require_switch(sv, name, false, "keeping checkpoints on the host is not supported");
    else if (sub == "profile") require_switch(sv, name, false, "use memfit profile for a trace");
    else if (sub == "contiguous_memory_optimization" || sub == "synchronize_checkpoint_boundary")
      get_as<bool>(sv, name);  // memfit's checkpoints are contiguous and planned; its ops run in order
    else if (sub == "number_checkpoints") {
      if (!sv.is_null()) get_integer(sv, name, IntRange{1, INT32_MAX});
    } else {
      unknown_key(name);
    }
  }
  if (c.policy.recompute.mode == RecomputeMode::none) c.policy.recompute = parse_recompute("full");
}

// "memfit_hf" (what memfit's --emit deepspeed writes for the HF side of the run, fit/compare.hpp):
// the HF Trainer's gradient checkpointing is full recomputation, attn_implementation sdpa (and
// flash_attention_2) is flash attention and eager is plain. Keys are applied in name order, so a
// "memfit" block has already been read: a conflict with it is refused, not overwritten.
void apply_hf_block(const json& v, RunConfig& c) {
  Policy& p = c.policy;
  for (const auto& [group, gv] : object_at(v, "memfit_hf").items()) {
    const std::string gname = "memfit_hf." + group;
    if (group != "training_arguments" && group != "from_pretrained") unknown_key(gname);
    for (const auto& [sub, sv] : object_at(gv, gname).items()) {
      const std::string name = gname + "." + sub;
      const bool full = p.recompute.mode == RecomputeMode::full;
      if (group == "training_arguments" && sub == "gradient_checkpointing") {
        if (get_as<bool>(sv, name)) {
          refuse_unless(full || p.recompute.mode == RecomputeMode::none, name,
                        fmt::format("HF's gradient checkpointing recomputes whole blocks; the file asks for '{}'",
                                    p.recompute.to_string()));
          p.recompute = parse_recompute("full");
        } else {
          refuse_unless(!full, name, "false, but the file asks for full recomputation (activation_checkpointing "
                                     "or memfit.recompute)");
        }
      } else if (group == "training_arguments" && sub == "gradient_checkpointing_kwargs") {
        for (const auto& [k, kv] : object_at(sv, name).items())
          if (k == "use_reentrant") get_as<bool>(kv, name + "." + k);  // the same recomputation either way
          else unknown_key(name + "." + k);
      } else if (group == "from_pretrained" && sub == "attn_implementation") {
        const std::string impl = get_as<std::string>(sv, name);
        refuse_unless(impl == "sdpa" || impl == "flash_attention_2" || impl == "eager", name,
                      fmt::format("'{}' is none of sdpa, flash_attention_2 and eager", impl));
        const AttentionKind a = impl == "eager" ? AttentionKind::plain : AttentionKind::flash;
        refuse_unless(!c.attention_given || p.attention == a, name,
                      fmt::format("'{}' is {} attention, but memfit.attention says {}", impl, attention_name(a),
                                  attention_name(p.attention)));
        p.attention = a;
        c.attention_given = true;
      } else {
        unknown_key(name);
      }
    }
  }
}

// Keys of DeepSpeed features memfit does not have, with what to use instead where there is something.
const std::map<std::string, std::string, std::less<>>& refused_features() {
  static const std::map<std::string, std::string, std::less<>> kRefused = {
      {"amp", "memfit's mixed precision is bf16 or fp16 with its own loss scaling"},
      {"flops_profiler", "use memfit profile"},
      {"tensorboard", "memfit writes --report-json"},
      {"wandb", "memfit writes --report-json"},
      {"csv_monitor", "memfit writes --report-json"},
      {"comet", "memfit writes --report-json"},
      {"comms_logger", "use memfit profile"},
      {"elasticity", "elastic training is not supported"},
      {"pipeline", "pipeline parallelism is not supported"},
      {"sparse_attention", "sparse attention is not supported"},
      {"compression_training", "compression training is not supported"},
      {"curriculum_learning", "curriculum learning is not supported"},
      {"data_efficiency", "data efficiency sampling is not supported"},
      {"autotuning", "use memfit plan --fit"},
      {"communication_data_type", "memfit communicates gradients in the gradient dtype (data_types.grad_accum_dtype)"},
      {"dump_state", "not supported"},
  };
  return kRefused;
}

// DeepSpeed's asynchronous I/O settings for NVMe offload: the disk tier's request size and the
// requests kept in flight (memory/disk_file.hpp). The rest shape how DeepSpeed's own library
// submits (memfit submits a transfer's requests as one batch and polls their completions).
void apply_aio_block(const json& v, RunConfig& c) {
  for (const auto& [sub, sv] : object_at(v, "aio").items()) {
    const std::string key = "aio." + sub;
    if (is_auto(sv)) continue;
    if (sub == "block_size") {
      const int64_t b = get_count(sv, key, IntRange{4096, int64_t(1) << 30});
      refuse_unless(b % 4096 == 0, key, "the block size must be a multiple of 4096 bytes (O_DIRECT)");
      c.disk_io.block_size = uint64_t(b);
    } else if (sub == "queue_depth") {
      c.disk_io.queue_depth = int(get_count(sv, key, IntRange{1, 1024}));
    } else if (sub == "thread_count" || sub == "intra_op_parallelism") {
      get_count(sv, key, IntRange{1, 1024});  // one submitting thread per direction (the transfer engine's)
    } else if (sub == "single_submit" || sub == "overlap_events") {
      get_as<bool>(sv, key);
    } else if (sub == "use_gds") {
      require_switch(sv, key, false, "GPUDirect Storage needs a GPU backend");
    } else {
      unknown_key(key);
    }
  }
}

void set_batch_key(std::optional<int64_t>& into, const json& v, const std::string& key) {
  if (!is_auto(v)) into = get_integer(v, key, IntRange{1, INT64_MAX});
}

}  // namespace

bool apply_deepspeed_key(const std::string& key, const json& v, RunConfig& c) {
  if (auto it = refused_features().find(key); it != refused_features().end())
    throw Error("config", fmt::format("key '{}': {}", key, it->second));
  if (key == "train_batch_size") set_batch_key(c.file_batch.global, v, key);
  else if (key == "train_micro_batch_size_per_gpu") set_batch_key(c.file_batch.micro, v, key);
  else if (key == "gradient_accumulation_steps") set_batch_key(c.file_batch.accum, v, key);
  else if (key == "gradient_clipping") { if (!is_auto(v)) c.policy.grad_clip = get_real(v, key, range::non_negative); }
  else if (key == "steps_per_print") c.log_every = get_integer(v, key, range::interval);
  else if (key == "wall_clock_breakdown" || key == "memory_breakdown") get_as<bool>(v, key);  // memfit always reports both
  else if (key == "zero_allow_untested_optimizer" || key == "zero_force_ds_cpu_optimizer") get_as<bool>(v, key);
  else if (key == "prescale_gradients") require_switch(v, key, false, "memfit scales gradients once, after reduction");
  else if (key == "gradient_predivide_factor")
    refuse_unless(is_auto(v) || get_real(v, key, range::positive) == 1.0, key, "pre-division of gradients is not supported");
  else if (key == "bf16" || key == "fp16") apply_precision_block(key, v, c);
  else if (key == "optimizer") apply_optimizer_block(v, c);
  else if (key == "scheduler") apply_scheduler_block(v, c);
  else if (key == "zero_optimization") apply_zero_block(v, c);
  else if (key == "activation_checkpointing") apply_activation_checkpointing_block(v, c);
  else if (key == "aio") apply_aio_block(v, c);
  else if (key == "memfit_hf") apply_hf_block(v, c);
  else if (key == "data_types") {
    for (const auto& [sub, sv] : object_at(v, key).items()) {
      if (sub == "grad_accum_dtype") c.policy.grad_dtype = parse_dtype(get_as<std::string>(sv, "data_types." + sub));
      else unknown_key("data_types." + sub);
    }
  } else {
    return false;
  }
  return true;
}

void resolve_batch_keys(RunConfig& c, int data_parallel, std::string& note) {
  RunConfig::BatchKeys keys = c.file_batch;
  std::vector<std::string> notes;
  if (c.batch_flag && keys.micro && *keys.micro != c.policy.batch)
    notes.push_back(fmt::format("--batch {} replaces train_micro_batch_size_per_gpu {}", c.policy.batch, *keys.micro));
  if (c.grad_accum_flag && keys.accum && *keys.accum != c.policy.grad_accum)
    notes.push_back(fmt::format("--grad-accum {} replaces gradient_accumulation_steps {}", c.policy.grad_accum,
                                *keys.accum));
  // Only a flag that says something the file did not can overrule the file's train_batch_size.
  const bool flags_differ = (c.batch_flag && keys.micro != std::optional<int64_t>(c.policy.batch)) ||
                            (c.grad_accum_flag && keys.accum != std::optional<int64_t>(c.policy.grad_accum));
  if (c.batch_flag) keys.micro = c.policy.batch;
  if (c.grad_accum_flag) keys.accum = c.policy.grad_accum;
  if (keys.global && flags_differ && keys.micro && keys.accum) {
    const int64_t implied = *keys.micro * *keys.accum * data_parallel;
    if (implied != *keys.global) {
      notes.push_back(fmt::format("train_batch_size {} gives way to the flags' {} x {} x {} ranks = {}", *keys.global,
                                  *keys.micro, *keys.accum, data_parallel, implied));
      keys.global.reset();
    }
  }
  const int64_t W = data_parallel;
  if (keys.global) {
    const int64_t global = *keys.global;
    auto divide = [&](int64_t by, const char* what) {
      refuse_unless(global % by == 0, "train_batch_size",
                    fmt::format("{} is not divisible by {} = {}", global, what, by));
      return global / by;
    };
    if (keys.micro && !keys.accum) keys.accum = divide(*keys.micro * W, "micro-batch x data-parallel ranks");
    else if (keys.accum && !keys.micro) keys.micro = divide(*keys.accum * W, "accumulation x data-parallel ranks");
    else if (!keys.micro && !keys.accum) keys.accum = 1, keys.micro = divide(W, "data-parallel ranks");
    const int64_t implied = checked_mul(checked_mul(*keys.micro, *keys.accum, "train_batch_size", "config"), W,
                                        "train_batch_size", "config");
    refuse_unless(global == implied, "train_batch_size",
                  fmt::format("{} does not equal micro-batch x accumulation x data-parallel ranks = {} x {} x {} = {}",
                              global, *keys.micro, *keys.accum, W, implied));
  }
  if (keys.micro) c.policy.batch = require_in("train_micro_batch_size_per_gpu", *keys.micro, range::batch);
  if (keys.accum) c.policy.grad_accum = int(require_in("gradient_accumulation_steps", *keys.accum, range::accumulation));
  note.clear();
  for (const std::string& n : notes) note += (note.empty() ? "" : "; ") + n;
}

}  // namespace memfit
