// RunConfig: everything a `memfit train` or `memfit plan` run is told, from flags and from a
// JSON config file. The config file accepts memfit's own keys and the DeepSpeed keys that
// mean the same thing; keys this build cannot honour yet are refused by name rather than
// ignored.
#pragma once

#include <cstdint>
#include <string>

#include "graph/model_spec.hpp"
#include "graph/policy.hpp"
#include "io/token_file.hpp"
#include "train/loss_scaler.hpp"
#include "train/lr_schedule.hpp"

namespace memfit {

struct RunConfig {
  std::string model = "gpt2-tiny";  // preset name or path of an HF config.json
  std::string backend = "cpu";      // kernels/backend.hpp make_backend: cpu | reference
  Policy policy;
  Topology topology;

  std::string data;  // token file or text file; empty: the built-in synthetic corpus
  TokenFormat data_format = TokenFormat::automatic;
  int64_t steps = 50;
  double lr = 1e-3;
  int64_t warmup_steps = 0;  // linear warmup from 0 to lr
  LrScheduleKind lr_schedule = LrScheduleKind::constant;
  double min_lr = -1;        // cosine floor; < 0: lr / 10
  int64_t decay_steps = 0;   // cosine: the step the floor is reached; 0: the last step
  uint64_t seed = 1337;
  bool shuffle = false;
  double val_fraction = 0.1;  // share of the data held out at its end; 0: no validation
  int64_t eval_every = 0;     // 0: validate after the last step only
  int64_t eval_batches = 4;
  std::string load;  // safetensors file or a directory holding model.safetensors
  std::string save;  // directory (model.safetensors + config.json) or a .safetensors path
  std::string report_json;
  std::string checkpoint_dir;    // sharded training checkpoints (train/checkpoint.hpp) go here
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only after the last step (when a dir is set)
  std::string resume;            // a checkpoint root (its newest valid one) or one step directory to continue from
  int keep_checkpoints = 2;      // complete checkpoints kept in checkpoint_dir (older ones removed after a save)
  uint64_t memory_budget = 0;  // bytes; 0: the memory available on this machine
  LossScaleConfig loss_scale;  // fp16 runs (DeepSpeed's fp16 block selects its convention)
  int64_t log_every = 1;
  double comm_timeout = 300;  // seconds a collective may wait for the other ranks; 0: no limit
};

ModelSpec resolve_model(const std::string& model);  // throws [model] / [config]

// The learning-rate schedule of a run, defaults resolved and validated (throws [train]).
LrSchedule lr_schedule_of(const RunConfig& config);

// Freeze patterns from "h.*.attn.*,wte.weight" (--freeze, or the config key as one string).
std::vector<std::string> split_freeze_patterns(const std::string& text);

// Applies a JSON config file on top of `config` (flags given on the command line are
// applied after it by the CLI). Throws [config] on malformed files and unknown keys.
void apply_config_file(const std::string& path, RunConfig& config);

}  // namespace memfit
