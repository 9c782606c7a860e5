// Sharded training checkpoints: everything a run needs to continue bit for bit. Each rank
// writes its own file (rank-R-of-W.bin) holding every persistent tensor of its program that
// carries model state (parameters, master weights, optimizer state: under ZeRO its shards),
// then rank 0 writes manifest.json last: the step, the data position, the loss scaler, and
// the size and checksum of every rank's file. The subtle point is the order: rank files go
// to a temporary name and are renamed, all ranks meet at a barrier, and only then does the
// manifest appear (also by rename), so a directory with a manifest is always complete and a
// crash mid-save leaves the previous checkpoint's manifest describing files that still match
// their checksums or fail loudly.
// Gradients are not saved: the first micro-step of every step overwrites them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dist/communicator.hpp"
#include "graph/policy.hpp"
#include "runtime/executor.hpp"
#include "train/loss_scaler.hpp"

namespace memfit {

struct TrainingPosition {
  int64_t step = 0;     // the last completed step
  int64_t applied = 0;  // optimizer steps applied (AdamW's bias correction, the lr schedule)
  int64_t loader_epoch = 0, loader_cursor = 0;
  std::optional<LossScaler::State> scaler;
};

// Collective: every rank of `comm` calls it. Throws [checkpoint] when a file cannot be written.
void save_checkpoint(const std::string& dir, const Executor& ex, const std::string& model, const Policy& policy,
                     const TrainingPosition& at, Communicator& comm);

// Collective. Fills the executor's checkpointed tensors and returns the position to continue
// from. Throws [checkpoint] when the manifest is missing, was written by another world size,
// ZeRO stage or model, or a rank file does not match its manifest entry or this program.
TrainingPosition load_checkpoint(const std::string& dir, Executor& ex, const std::string& model, const Policy& policy,
                                 Communicator& comm);

}  // namespace memfit
