// The manifest of a training checkpoint (manifest.json, written last into its step
// directory): where the run stands (step, optimizer steps applied, data position, loss
// scaler), what it is (model, world size, ZeRO stage, precision, optimizer, learning-rate
// schedule and its horizon), and the size and XXH3 checksum of every rank's file. The file
// carries its own checksum: XXH3 of the compact JSON of every other field.
//
// Format 3 (written since checkpoints reshard) adds the global layout: every saved tensor's
// shards (train/checkpoint_layout.hpp), an XXH3 per chunk of every rank file (so that a read
// of a byte range is verified without reading the whole file), and the batch geometry in rows
// (so that another world size or accumulation with the same rows per step continues the same
// data). Format 2 manifests (no layout) still parse; they resume only on their own layout.
//
// Invariant: parse_checkpoint_manifest accepts exactly what format_checkpoint_manifest can
// write. Every field is read by name with its type, integer-ness and range checked; unknown
// fields are refused; cross-field facts (applied <= step, the data position that `step`
// steps of `batches_per_step` batches reach) are checked after the checksum, so an edit
// without a matching checksum is reported as one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/policy.hpp"
#include "train/checkpoint_layout.hpp"
#include "train/loss_scaler.hpp"
#include "train/lr_schedule.hpp"

namespace memfit {

inline constexpr const char* kCheckpointFormat = "memfit-checkpoint-3";
inline constexpr const char* kCheckpointFormatWithoutLayout = "memfit-checkpoint-2";
inline constexpr uint64_t kMaxManifestBytes = 16u << 20;  // with 1 MiB chunks: about 1 TiB of rank files
inline constexpr uint64_t kMaxChunkBytes = 1u << 20;  // a chunk must fit the staging's raw region

struct RankFileEntry {
  std::string file;  // rank-R-of-W.bin, in the manifest's directory
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  // Format 3: XXH3 of each chunk_bytes-sized piece of the file before its trailer (the last
  // one shorter), in order.
  uint64_t chunk_bytes = 0;
  std::vector<uint64_t> chunks;
};

struct CheckpointManifest {
  int64_t step = 0;         // the last completed step (>= 1)
  int64_t applied = 0;      // optimizer steps applied (<= step: overflowing fp16 steps are skipped)
  int64_t total_steps = 0;  // the run's --steps when it saved this (>= step)
  std::string model;        // as the run named it (preset or config path)
  nlohmann::json model_spec = nlohmann::json::object();  // architecture and sizes (flat object)
  int world_size = 1;
  int zero_stage = 0;
  Precision precision = Precision::fp32;
  OptimizerKind optimizer = OptimizerKind::adamw;
  LrSchedule schedule;      // decay_steps always resolved: the schedule's horizon
  int64_t loader_epoch = 0, loader_cursor = 0;
  int64_t batches_per_epoch = 1, batches_per_step = 1;  // global batches
  std::optional<LossScaler::State> loss_scaler;
  std::vector<RankFileEntry> ranks;  // one per rank, in rank order
  // Format 3 only (empty / 0 in a format 2 manifest, which is written as such).
  int64_t rows_per_batch = 0;        // rows of one global batch (micro-batch x data ranks)
  bool shuffle = false;
  std::vector<SavedTensor> tensors;  // the global layout
  bool has_layout() const { return !tensors.empty(); }
};

std::string rank_file_name(int rank, int world_size);  // rank-R-of-W.bin

// The manifest as JSON text, its checksum field included.
std::string format_checkpoint_manifest(const CheckpointManifest& manifest);

// Parses and validates manifest text on its own (no files, no run). Throws [checkpoint]
// with the offending field named ("field 'loader.epoch' is ..."); callers add the path.
CheckpointManifest parse_checkpoint_manifest(std::string_view json);

// The data position (epoch, cursor) BatchLoader reports after `batches` batches from the
// start: epochs roll over lazily, so a finished epoch reads as cursor == batches_per_epoch.
std::pair<int64_t, int64_t> loader_position_after(int64_t batches, int64_t batches_per_epoch);

}  // namespace memfit
