// Tensor parallelism, Megatron-LM style: the ranks of a tensor group (graph/policy.hpp
// Topology::tensor, adjacent world ranks) each hold a slice of every large weight and compute
// the matching slice of the block.
//
//   column-parallel (qkv, fc, gate, up; the vocabulary of wte/lm_head): the weight's output
//     rows are split; the input is replicated, so its gradient, a partial sum on each rank, is
//     summed over the group before it flows on (Megatron's f: identity forward, all_reduce
//     backward);
//   row-parallel (attention output, the MLP's down/c_proj): the weight's input columns are
//     split; each rank's product is a partial sum, all_reduced over the group in the forward
//     (Megatron's g: all_reduce forward, identity backward); its bias is added once, after it.
//
// Every tensor-parallel collective is an op of the program like ZeRO's, so the planner sizes
// its buffers and schedule_async overlaps it. A rank's parameter is named as the one-rank
// program names it; its TensorSplit says which elements of the one-rank tensor it holds, so
// initialisation draws exactly the one-rank values and checkpoints describe global tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.hpp"
#include "graph/tensor.hpp"

namespace memfit {

struct TensorSplit {
  enum class Axis : uint8_t { none, rows, columns };
  Axis axis = Axis::none;
  int parts = 1, index = 0;
  Shape global;  // the one-rank shape; empty when axis is none
  // rows: the global rows of each separately split piece, in order (a fused projection: llama's
  // q, k and v rows); empty means one piece. Each piece's rows divide by parts.
  std::vector<int64_t> segments;
  bool split() const { return axis != Axis::none; }
};

// A run of elements stored contiguously in both the rank's (local) and the global tensor,
// flattened in row-major order.
struct SliceRun {
  int64_t local = 0, global = 0, count = 0;
};

// The runs of local elements [first, first + count) of a rank's tensor of `local` shape, in
// ascending local order; one run covering the range when the tensor is not split.
std::vector<SliceRun> slice_runs(const TensorSplit& split, const Shape& local, int64_t first, int64_t count);
std::vector<SliceRun> slice_runs(const TensorSplit& split, const Shape& local);
// The local shape of a split; checks that the split divides the global shape.
Shape local_shape(const TensorSplit& split);

// The tensor-parallel degree and this rank's index in its group, as a builder emits for.
//
// Sequence parallelism (`sequence`): between the blocks' products the residual stream, the
// norms and their outputs hold rows [index, index + 1) * N / parts of the N = batch x sequence
// rows (rows of the flattened batch, so any batch size splits). A column-parallel product's
// input is all_gathered from them (backward: reduce_scatter) and a row-parallel product's
// partial sums are reduce_scattered into them (backward: all_gather), replacing Megatron's f
// and g. The replicated parameters that read row shards (norm weights, row-parallel biases)
// then have partial gradients, summed over the group once per micro-step; the gathered inputs
// are not kept for the backward but gathered again (graph/recompute.cpp), so the block keeps
// only row shards, as the paper's sbh/t (34 + 5as/h) counts.
struct TensorParallel {
  int parts = 1;
  int index = 0;
  bool sequence = false;
  bool on() const { return parts > 1; }
  bool sequence_on() const { return on() && sequence; }
  // A weight split over its output rows (segments as TensorSplit::segments) or input columns.
  TensorSplit rows(Shape global, std::vector<int64_t> segments = {}) const;
  TensorSplit columns(Shape global) const;
};

// Whether tensor rank `tensor_rank` counts a parameter's gradient in the global norm: a split
// parameter's slice always; a parameter replicated over the tensor group (the same gradient
// on every member) only on member 0, so that it counts once.
inline bool counts_in_global_norm(const TensorSplit& split, int tensor_rank) {
  return split.split() || tensor_rank == 0;
}

// "a tensor-parallel degree of <t> needs <what> divisible by it (got <n>)": the one-line
// refusal of a split that does not divide.
void check_divisible(int64_t n, int parts, const std::string& what);

}  // namespace memfit
