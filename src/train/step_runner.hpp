// One optimizer step, with loss scaling when the program has an overflow check (fp16; see
// graph/precision.hpp). The executor's run_step sequences the step; this runner is its update
// gate: after the micro-steps and the sync section it reads the flag that the program's
// check_finite op wrote and lets the optimizer section run only when every gradient is
// finite. The program has no conditionals: skipping is the step not running a section.
//
// Forensics. When an overflow comes at the minimum loss scale, the step is re-run op by op
// on the same batches (recorded as they were loaded), with the same scale, checking each op's
// outputs for inf/NaN after it runs; the error names the first op whose output held one.
// Only such a step pays for the checks. Re-running gives the same values because the step
// did not change any weight or optimizer state and the kernels are deterministic.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/executor.hpp"
#include "train/loss_scaler.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

class StepRunner : private UpdateGate {
 public:
  // Installs its own input handler on `ex`, which calls `input` and records what it loaded.
  // `scaling` is used when the program has an overflow flag (and required then). The flag is
  // read as a scalar per step; the forensics read op outputs through `staging`.
  StepRunner(Executor& ex, InputHandler input, const LossScaleConfig& scaling, TensorStaging& staging);

  bool loss_scaling() const { return flag_ != kNoTensor; }
  float loss_scale() const { return scaler_ ? scaler_->scale() : 1.0f; }
  int64_t skipped_steps() const { return scaler_ ? scaler_->skipped_steps() : 0; }
  LossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }

  struct Result {
    bool applied = true;  // the optimizer section ran
    float scale = 1;      // the loss scale this step ran with
  };
  // Runs one step with ctx.step, ctx.lr as given (loss_scale is the scaler's). Throws [train]
  // with the forensics when an overflow comes at the minimum scale.
  Result run(StepContext ctx);

  // The first op (in micro-step order) whose output holds inf or NaN when the last step is
  // re-run with `ctx`, as "op 'name' (kind, phase, layer L) in micro-step m"; empty if none.
  std::string find_first_non_finite(StepContext ctx);

 private:
  void on_input(const Op& op, const StepContext& ctx);
  bool apply_update(const StepContext& ctx) override;  // reads the flag, updates the scaler

  Executor& ex_;
  TensorStaging& staging_;
  InputHandler input_;
  std::optional<LossScaler> scaler_;
  TensorId flag_ = kNoTensor;
  LossScaler::Outcome outcome_ = LossScaler::Outcome::applied;  // of the last step
  int micro_begin_ = 0, micro_end_ = 0, micro_repeat_ = 1;
  // Bytes each micro-step's load_input ops wrote, for replays.
  std::vector<const Op*> load_ops_;
  std::vector<std::vector<std::byte>> recorded_;  // [micro * load_ops + i]
  bool replaying_ = false;
};

}  // namespace memfit
