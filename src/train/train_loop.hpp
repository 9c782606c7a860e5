// The middle third of a training run: the steps from RunState::first_step to --steps, with
// the learning-rate schedule, loss scaling's skipped steps, progress lines, checkpoints and
// periodic validation, then the final validation. What it records goes into the report
// (train/run_report.hpp).
// Invariants: nothing here allocates inside a step (the histories grow between steps); a
// step whose loss is not finite stops the run unless loss scaling skipped it (fp16), with a
// message that names the cause (train/run_checks.hpp); no checkpoint is written from a state
// holding a non-finite weight.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "train/run_setup.hpp"

namespace memfit {

struct LoopRecord {
  nlohmann::json history = nlohmann::json::array(), val_history = nlohmann::json::array();
  nlohmann::json lr_history = nlohmann::json::array(), norm_history = nlohmann::json::array();
  nlohmann::json scale_history = nlohmann::json::array(), skipped_at = nlohmann::json::array();
  bool has_grad_norm = false;
  double timed_seconds = 0, timed_cpu_seconds = 0;  // steps after the first (warm-up excluded)
  int64_t timed_steps = 0;
  float first_loss = NAN, last_loss = NAN;
  std::optional<double> final_val;
};

LoopRecord run_train_loop(RunState& state, RunHooks* hooks);

}  // namespace memfit
