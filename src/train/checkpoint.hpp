// Sharded training checkpoints that survive a crash at any moment: everything a run needs to
// continue bit for bit. Every save writes a new directory ROOT/step-000123/ holding each
// rank's file (train/checkpoint_rank_file.hpp) and then the manifest
// (train/checkpoint_manifest.hpp), every file and directory fsynced; ROOT/latest is moved to
// it only after all ranks agreed that their files are complete and rank 0 checked their
// sizes and checksums, and older checkpoints beyond --keep-checkpoints are removed only
// after that (train/checkpoint_dir.hpp).
//
// Every function here is collective: every rank of `comm` calls it, and each phase ends in
// an agreement (an all-reduce of a status, then the first failing rank's message broadcast),
// so an error one rank sees is thrown by every rank with the same one-line message and no
// rank is left waiting in a collective. Resuming validates before it loads: every rank
// checks its own file completely, the ranks agree, and only then are tensors read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/communicator.hpp"
#include "graph/policy.hpp"
#include "runtime/executor.hpp"
#include "train/checkpoint_manifest.hpp"
#include "train/loss_scaler.hpp"
#include "train/lr_schedule.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

struct TrainingPosition {
  int64_t step = 0;     // the last completed step
  int64_t applied = 0;  // optimizer steps applied (AdamW's bias correction, the lr schedule)
  int64_t loader_epoch = 0, loader_cursor = 0;
  std::optional<LossScaler::State> scaler;
};

// What a checkpoint records about its run, and what a resumed run must agree with.
struct CheckpointRun {
  std::string model;                   // as given (preset name or config path)
  nlohmann::json model_spec;           // flat object: architecture and sizes (trainer's model_json)
  int world_size = 1;
  int zero_stage = 0;
  Precision precision = Precision::fp32;
  OptimizerKind optimizer = OptimizerKind::adamw;
  int64_t batches_per_epoch = 1, batches_per_step = 1;  // of the training data loader
  bool loss_scaler = false;            // the run keeps a loss-scaler state (fp16)
  LrSchedule schedule;                 // decay_steps resolved: the horizon
  int64_t total_steps = 0;             // --steps
  int64_t rows_per_batch = 1;          // of one global batch: micro-batch x data-parallel ranks
  bool shuffle = false;                // --shuffle (the batch order depends on rows_per_batch)
};

struct SavedCheckpoint {
  std::string dir;                   // ROOT/step-000123
  std::vector<std::string> removed;  // older checkpoints removed by --keep-checkpoints
  std::string warning;               // set when removing them failed (the save itself succeeded)
};

// Throws [checkpoint] on every rank when any rank could not write or rank 0 could not check
// or publish the checkpoint; `latest` then still names the previous one.
// The executor's tensors are read through `staging` (train/tensor_staging.hpp).
SavedCheckpoint save_checkpoint(const std::string& root, const Executor& ex, TensorStaging& staging,
                                const CheckpointRun& run,
                                const TrainingPosition& at, int keep, Communicator& comm);

struct ResumedCheckpoint {
  std::string root;              // the directory of checkpoints it came from
  std::string dir;               // the step directory loaded
  CheckpointManifest manifest;
  TrainingPosition at;
  std::vector<std::string> skipped;  // newer ones passed over: "step-000124: <reason>"
  std::vector<std::string> notes;    // other remarks for the log (a stale `latest`)
};

// `path` is either a step directory (exactly that checkpoint) or a checkpoint root (the
// newest valid one; damaged or unfinished newer ones are skipped and named). Fills the
// executor's checkpointed tensors. A checkpoint with a global layout (manifest format 3)
// resumes on any world size, ZeRO stage and optimizer offload: each rank reads only the byte
// ranges its own tensors need from the old rank files, verifying every chunk it reads, and
// the data position is carried over in rows. Throws [checkpoint] on every rank, naming the
// file and field, when no valid checkpoint is found or the newest valid one belongs to another
// kind of run (model, precision, optimizer, rows per step, data order; world size and stage
// for a format 2 checkpoint).
ResumedCheckpoint resume_checkpoint(const std::string& path, Executor& ex, TensorStaging& staging,
                                    const CheckpointRun& run,
                                    Communicator& comm);

// The learning-rate schedule a resumed run follows: this invocation's, with the checkpoint's
// horizon (its resolved decay steps) unless --decay-steps was given, so that a cosine decay
// does not follow each invocation's --steps. `note` says what differs from the checkpoint's
// run ("" when nothing does). Throws [train] when the result is not a valid schedule.
LrSchedule resumed_lr_schedule(LrSchedule invoked, bool decay_steps_given, int64_t steps,
                               const CheckpointManifest& manifest, std::string& note);

// Before the first save into `root`. A run that did not resume from `root` refuses it when it
// already holds a complete checkpoint (nothing a user saved is overwritten); unfinished step
// directories are removed. A run resumed from `root` removes the unfinished directories newer
// than its step and moves the complete ones aside (NAME.set-aside: they belong to a future
// this run abandons). Returns lines for the log.
std::vector<std::string> prepare_checkpoint_root(const std::string& root, const ResumedCheckpoint* resumed,
                                                 Communicator& comm);

}  // namespace memfit
