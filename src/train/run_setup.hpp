// The first third of a training run (train/trainer.hpp's run_training): everything before step
// 1. It settles the ranks, opens and splits the data, builds and plans the program, refuses a
// plan over the budget, builds the executor, initialises, loads or resumes the weights, and
// checks every input and output that can be checked before the first step (the validation
// split's tokens; that --save, --report-json and --checkpoint-dir can be written), so that a
// run never trains for hours and then fails on something it could have seen at start.
// Invariant: a RunState returned by setup_run is ready for step `first_step`; nothing in it
// allocates during a step. It is neither copied nor moved (the executor refers to its members).
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "runtime/collective_op.hpp"
#include "io/token_file.hpp"
#include "runtime/executor.hpp"
#include "train/process_plan.hpp"
#include "train/checkpoint.hpp"
#include "train/data_loader.hpp"
#include "train/lr_schedule.hpp"
#include "train/run_checks.hpp"
#include "train/run_hooks.hpp"
#include "train/step_runner.hpp"
#include "train/tensor_staging.hpp"
#include "train/test_fault.hpp"
#include "train/trainer.hpp"

namespace memfit {

struct RunState {
  RunState() = default;
  RunState(const RunState&) = delete;
  RunState& operator=(const RunState&) = delete;

  std::unique_ptr<Communicator> own_comm;
  Communicator* comm = nullptr;  // the world
  int world = 1, rank = 0;
  RunConfig config;  // the topology resolved for this rank
  TestFault fault;
  std::ostringstream quiet;  // ranks other than 0 keep their lines to themselves
  std::ostream* log = nullptr;
  std::unique_ptr<Backend> backend;
  std::optional<TokenData> data;
  PreparedRun run;
  uint64_t budget = 0;
  int64_t val_tokens = 0;
  std::optional<BatchLoader> train_loader, val_loader;
  std::optional<CommGroups> groups;
  std::optional<Executor> executor;
  ProcessPlan process;  // measured and summed just before the executor allocates
  // The one host buffer through which tensors bigger than a scalar are read and written
  // (initialisation, --load, --save, checkpoints, state scans), allocated before step 1.
  TensorStaging staging;
  // What the data loader writes a batch into before Executor::write copies it into the tier
  // (a device tier needs that copy anyway): one buffer per input, sized once.
  std::vector<int32_t> batch_tokens, batch_targets;
  std::optional<StepRunner> runner;
  std::optional<UpdateWatch> update_watch;  // what a non-finite loss's message names
  LrSchedule schedule;
  CheckpointRun checkpoint_run;
  std::optional<ResumedCheckpoint> resumed;
  // Optimizer steps actually applied: a step skipped for a gradient overflow does not count
  // (AdamW's bias correction and the learning-rate schedule see only applied steps, as in
  // PyTorch's GradScaler and DeepSpeed).
  int64_t applied = 0, first_step = 1;

  std::ostream& out() { return *log; }
  Executor& ex() { return *executor; }
  const Program& program() const { return run.compiled.program; }
  // Rows of one global batch: data-parallel rank d reads rows [d*B, (d+1)*B).
  int64_t global_batch() const { return run.policy.batch * config.topology.data; }
};

// Throws what run_training documents ([train], [data], [budget], [io], [checkpoint]...).
std::unique_ptr<RunState> setup_run(const RunConfig& config, std::ostream& rank_log, RunHooks* hooks,
                                    Communicator* comm);

}  // namespace memfit
