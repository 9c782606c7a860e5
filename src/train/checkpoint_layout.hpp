// The global description of a checkpoint's tensors, which lets a checkpoint resume on any
// layout (world size, ZeRO stage, optimizer offload) with no conversion step.
//
// A saved tensor is named as a one-rank program names it ("h.0.attn.c_attn.weight",
// "master.wte.weight", "adamw.m.…", "adamw8bit.m_absmax.…") and has a global shape; its
// shards say which rank file holds which elements of it, flattened in row-major order, at
// which byte of the file. Padding (ZeRO's bucket tails and alignment gaps) is in no shard.
// A replicated tensor (every rank's copy of a stage-0 tensor, stage 1-2's whole parameter
// buckets) is described once: stage 1-2 values by the ranks that own each piece, anything
// else whole by rank 0. A tensor-parallel slice is described as runs of the global tensor
// (graph/tensor_parallel.hpp slice_runs), by data rank 0 of each slice; a parameter replicated
// over the tensor group by tensor rank 0 only.
//
// Invariant (checked by the manifest parser): the shards of a tensor, in order of `first`,
// cover [0, numel) exactly once, each inside its rank file's bytes.
//
// 8-bit AdamW's absmax tensors index blocks of 256 elements of the parameter. ZeRO aligns
// every parameter and every shard boundary to 256 elements under adamw8bit
// (graph/zero_layout.cpp), so a piece starting at element o holds blocks from o / 256 on:
// blocks are global, and a block's codes and absmax always sit on the same rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/shape.hpp"
#include "graph/program.hpp"

namespace memfit {

struct TensorShard {
  int file = 0;         // index of the rank file (rank-F-of-W.bin)
  int64_t first = 0;    // first element of the global tensor
  int64_t count = 0;    // elements, stored contiguously
  uint64_t offset = 0;  // byte of the rank file where element `first` starts
};

struct SavedTensor {
  std::string name;   // as a one-rank program names it
  std::string param;  // the parameter it belongs to
  std::string role;   // value, master, adamw.m, adamw8bit.m_absmax, codes, ...
  DType dtype = DType::f32;
  Shape shape;        // global
  std::vector<TensorShard> shards;
};

// Elements [first, first + count) of global tensor `tensor` live at element `at` of this
// rank's checkpointed root `root`. `described` marks the copy the manifest names (a replica
// is described by one rank; every rank still needs its own copy filled on resume).
struct LocalPiece {
  SavedTensor tensor;  // without shards
  TensorId root = kNoTensor;
  int64_t at = 0;
  int64_t first = 0, count = 0;
  bool described = true;
  int64_t param_index = 0;  // in Program::params()
};

// Every piece of a global tensor that rank `rank` (of the data group) holds in its program's
// checkpointed roots (train/checkpoint_rank_file.hpp), in program order. Throws [checkpoint]
// when a checkpointed root holds no piece (a tensor this description does not know).
std::vector<LocalPiece> local_pieces(const Program& program, int rank);

// The pieces this rank describes, as JSON for rank 0 to merge: [[name, param, role, dtype,
// shape, first, count, file offset, parameter index], ...]; `root_offsets[i]` is the file
// offset of root checkpointed_tensors()[i].
std::string describe_pieces(const Program& program, int rank, const std::vector<uint64_t>& root_offsets);

// Rank 0: every rank's description merged into global tensors (in the program's parameter
// order, shards by `first`). Throws [checkpoint] on a malformed description.
std::vector<SavedTensor> merge_descriptions(const std::vector<std::string>& per_rank);

// The manifest's "tensors" field: written compactly (a shard is [file, first, count, offset]),
// read strictly (field errors name their JSON path). check_shards is the invariant above,
// given each rank file's size in bytes (its trailing checksum excluded from the ranges).
nlohmann::json tensors_json(const std::vector<SavedTensor>& tensors);
std::vector<SavedTensor> read_tensors(const nlohmann::json& v, int files);
void check_shards(const std::vector<SavedTensor>& tensors, const std::vector<uint64_t>& file_bytes);

}  // namespace memfit
