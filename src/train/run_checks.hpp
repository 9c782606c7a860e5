// Checks a training run makes before step 1, for everything that can be known then: a run
// must not train for hours and only then fail on a bad token or an unwritable path. And the
// check after the updates that nothing non-finite reaches a saved file.
// Invariant: the probes leave nothing behind (each probe file is removed before the check
// returns), and none of these checks runs inside a step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "io/token_file.hpp"
#include "runtime/executor.hpp"
#include "train/run_config.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

// Throws [train] naming the flag and the path when --save, --report-json (on rank 0) or
// --checkpoint-dir (every rank writes its own file there) cannot be written: a probe file is
// created and removed in the directory the output will go to (the nearest existing one for a
// directory that the save creates). --report-json naming a directory is refused.
void check_output_paths(const RunConfig& config, int rank);

// Throws [data] naming the first token of [begin, end) outside [0, vocab), its position and
// the split, as the batch loader would when it reached it.
void check_split_tokens(const TokenData& data, int64_t begin, int64_t end, int64_t vocab, const std::string& split);

// A persistent float tensor of the training state (a parameter, its master copy or its
// optimizer state) holding inf or NaN.
struct NonFiniteTensor {
  std::string name;
  bool optimizer_state = false;  // m or v (AdamW), not the weights themselves
  int64_t element = 0;           // the first bad element
  double value = 0;
  std::string describe() const;  // "parameter 'h.0.mlp.c_fc.weight' (element 7 is nan)"
};

// The first non-finite weight (value or master, in parameter order) and the first non-finite
// optimizer state. Reads the whole state once: for save points, the end of the run and error
// paths, never per step. Tensors are read a staging chunk at a time.
struct StateScan {
  std::optional<NonFiniteTensor> weight, optimizer_state;
  bool finite() const { return !weight && !optimizer_state; }
};
StateScan scan_training_state(const Executor& executor, TensorStaging& staging);

// Throws [train] when the state holds a non-finite value, before `what` ("--save 'x'", "the
// checkpoint of step 7") is written: names the tensor and the cause as far as it is known.
void require_finite_state(const Executor& executor, const RunConfig& config, int64_t step, TensorStaging& staging,
                          const std::string& what);

// Throws [train] before step 1 when the weights or optimizer state just initialised, loaded
// (--load) or resumed hold inf or NaN, naming the tensor and where it came from.
void require_finite_start(const Executor& executor, const RunConfig& config, TensorStaging& staging);

// Watches the first op of the optimizer section: when the loss is already non-finite there,
// it scans the state as it was before this step's update (the only moment the state still
// tells which update broke it; after the update, NaN gradients have spread everywhere). Costs
// one float read per step; scans (and allocates) only on the error path.
class UpdateWatch : public OpObserver {
 public:
  UpdateWatch(const Executor& executor, TensorStaging& staging);
  void before_op(int op, const StepContext& ctx) override;
  void after_op(int, const StepContext&) override {}
  // The scan taken before the update of the step whose loss was non-finite, if any.
  const std::optional<StateScan>& before_update() const { return scan_; }

 private:
  const Executor& ex_;
  TensorStaging& staging_;
  int optimizer_begin_ = -1;
  TensorId loss_ = kNoTensor;
  std::optional<StateScan> scan_;
};

// Why the loss of a step is not finite, as the end of a [train] message. `updates_before` is
// the number of optimizer updates this invocation applied before the step: with none (the
// starting state was checked finite), the learning rate cannot be the cause; after updates,
// it names what became non-finite and blames --lr only when a weight did while the
// optimizer's state stayed finite, or when everything stayed finite and the forward
// overflowed (the weights grew).
std::string explain_non_finite_loss(const Executor& executor, const RunConfig& config, int64_t updates_before,
                                    const std::optional<StateScan>& before_update, TensorStaging& staging);

}  // namespace memfit
