// Resuming a checkpoint on another layout (world size, ZeRO stage, optimizer offload): each
// rank maps the pieces its own program holds (train/checkpoint_layout.hpp) onto the saved
// tensors' shards and reads exactly those byte ranges from the old rank files, never a whole
// file. Every byte read is verified by its chunk's XXH3 from the manifest before it is
// copied into the executor; a chunk is at most the staging's raw region, so the reads cost
// no memory beyond it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "runtime/executor.hpp"
#include "train/checkpoint_manifest.hpp"
#include "train/tensor_staging.hpp"

namespace memfit {

// Bytes [offset, offset + bytes) of one rank file go to bytes [root_offset, ...) of `root`.
struct RangeRead {
  uint64_t offset = 0, bytes = 0;
  TensorId root = kNoTensor;
  uint64_t root_offset = 0;
};

// The reads that fill every checkpointed tensor of rank `rank`'s program, per rank file of
// the manifest, in file order. Throws [checkpoint] when the manifest lacks a tensor this
// program holds, holds one it lacks, or describes one with another dtype or shape.
std::vector<std::vector<RangeRead>> plan_range_reads(const CheckpointManifest& m, const Program& program, int rank);

// Before anything is read: every rank file the plan reads exists and is as long as the
// manifest says (a shorter file is named with the byte its ranges reach). Throws [checkpoint].
void check_range_files(const std::filesystem::path& dir, const CheckpointManifest& m,
                       const std::vector<std::vector<RangeRead>>& plan);

// Reads the planned ranges into the executor, chunk by chunk, each chunk's checksum checked
// before its bytes are used. Throws [checkpoint] "FILE: checksum mismatch in bytes [a, b)".
void read_ranges(const std::filesystem::path& dir, const CheckpointManifest& m,
                 const std::vector<std::vector<RangeRead>>& plan, Executor& ex, TensorStaging& staging);

// Reads elements [first, first + out.size()) of saved tensor `t` (any float dtype) as fp32,
// through `raw` (at least one chunk), verifying each chunk read: what `memfit consolidate`
// uses to rebuild whole tensors one at a time.
void read_saved_f32(const std::filesystem::path& dir, const CheckpointManifest& m, const SavedTensor& t, int64_t first,
                    std::span<float> out, std::span<std::byte> raw);

}  // namespace memfit
