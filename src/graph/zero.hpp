// ZeRO data parallelism (DeepSpeed's zero_optimization.stage) as a transformation of the step
// program of one rank. Applied last (after recompute and precision), so every dtype is final.
//   all stages  parameters and gradients become views into flat buckets (one per transformer
//               block, one for the parameters outside blocks); each data-parallel rank reads
//               its own slice of the global batch, so the loss and gradient scales divide by
//               the data-parallel degree (Topology::data, not the world) and the loss is
//               all-reduced (the reported loss is the global one) in the "sync" section, which
//               runs once per step between the micro-steps and the optimizer, also when fp16
//               skips the optimizer.
//   stage 0     gradients all-reduced (per bucket in the backward with one micro-step, else
//               after the last micro-step); every rank updates everything.
//   stage 1     master weights and optimizer state shrink to this rank's shard; gradients are
//               reduce-scattered in place (full-size gradients stay), each rank updates its
//               shard, then the parameters are all-gathered.
//   stage 2     also gradients: each bucket is reduce-scattered inside the backward pass right
//               after its last gradient is written, into a gradient shard (step-transient with
//               one micro-step; with accumulation persistent, reached through a buffer then
//               added), so full-size gradients live only while their block's backward runs.
//   stage 3     also parameters: each bucket's shard is all-gathered before its forward and
//               again before its backward, one bucket ahead.
//   qwZ         (ZeRO++, Policy::zero_quantized_weights, stage 3 only) each gather becomes: this
//               rank codes its shard as int8 blocks of kQwzBlock with an fp32 scale each
//               (comm_quantize, into its block of a transient uint8 wire buffer), the wire is
//               all-gathered in place, and comm_dequantize decodes it into the gather buffer
//               just before the bucket's first use (so the gather still overlaps the previous
//               block). Masters, optimizer state and the shard itself stay exact; only the
//               gathered copy is quantised, the same bits on every rank. The layout aligns
//               parameters and shards to the block, so no block straddles two ranks, and the
//               coder skips the padding between parameters (its bytes are never written).
//   qgZ         (ZeRO++, Policy::zero_quantized_gradients, stages 2-3) each bucket's gradient
//               reduce-scatter becomes int4/int8 all-to-alls, inside each node then across nodes,
//               summed in fp32 between them (graph/zero_qgz.hpp).
//   hpZ         (ZeRO++, Policy::zero_hpz_partition_size = N, stage 3, 1 < N < data degree;
//               graph/zero_hpz.hpp) the hpZ group is N consecutive data-parallel ranks (member
//               data_rank % N). Once a bucket's forward gather has arrived (qwZ: decoded), this
//               rank copies its member's 1/N of the gathered bucket into a transient secondary
//               partition (zero.params.<tag>.secondary, communication buffers: born in the
//               forward, dead after the backward's gather), and the backward's gather collects
//               the N secondaries over the hpZ group (CommGroup::hpz) instead of the shards over
//               the data group: unquantised, the very values the forward used, so losses are
//               bitwise those without hpZ. With nodes of N ranks the backward's gathers never
//               leave the node. N equal to the data degree is plain stage 3 (as in DeepSpeed).
// Every collective runs over the data group (CollectiveAttrs::group, size Topology::data): ZeRO
// shards over the ranks that hold the same tensor-parallel slice. The exceptions: the fp16
// overflow flag, max-reduced over the world so that every rank skips the same steps, and hpZ's
// backward gathers, over the hpZ group.
// graph/schedule_async.hpp then makes the collectives asynchronous.
// Gradient clipping uses the global norm: the sum of squares over this rank's gradient shard,
// all-reduced, then its square root (GradNormAttrs::Form). An fp16 overflow flag is
// all-reduced with max so every rank skips the same steps.
//
// Frozen parameters (--freeze) have no gradient, master or optimizer state, so nothing of
// theirs is reduced or updated. Below stage 3 every rank keeps them whole, outside the
// buckets, untouched by any collective. At stage 3 they are sharded like the rest, in buckets
// of their own ("h<layer>.frozen": values only, so a trainable bucket's value and gradient
// offsets stay equal), all-gathered before each pass that reads them (a bucket no backward
// op reads gets no backward buffer), never reduce-scattered. A quantised base (QLoRA) is
// sharded the same way, as FSDP-QLoRA does: each block's codes and scales go into a bucket of
// bytes ("h<layer>.quant"), gathered as bytes (unquantised by qwZ, which codes floats), and
// each rank keeps its bytes of the one-rank storage (ParamEntry::storage_shard).
//
// Shard layout (the subtle point): each parameter starts at a multiple of `align` elements in
// its bucket, and each bucket is padded to a multiple of data degree * align, so every shard
// boundary falls at a multiple of `align` from the start of every parameter. With 8-bit AdamW
// align is the quantization block (256): no block straddles two ranks, and the blockwise
// update of a piece equals the same blocks' update without ZeRO.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/forward_rewrite.hpp"
#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

inline constexpr int64_t kQwzBlock = 256;  // elements per int8 block of qwZ's wire
inline constexpr int64_t kStoredPartAlign = 64;  // bytes: each stored tensor of a bytes bucket starts at a cache line

struct ZeroBucket {
  std::string tag;               // "outer" or "h<layer>", then ".frozen" for a frozen bucket
  int layer = -1;
  bool frozen = false;           // values only: no gradient, master or optimizer state (stage 3)
  // Stage 3, a frozen bucket of parameters stored as several tensors (a quantised base's codes
  // and scales): its elements are bytes (u8), each stored tensor a view at a multiple of
  // kStoredPartAlign bytes, `offsets` the first one's. Only gathered, never updated.
  bool bytes = false;
  std::vector<int> params;       // indices into Program::params(), in declaration order
  std::vector<int64_t> offsets;  // element offset of each parameter in the bucket
  int64_t used = 0;              // elements of parameters
  int64_t elements = 0;          // padded to a multiple of world_size * align
};

struct ZeroLayout {
  int world_size = 1, rank = 0;  // of the data group (Topology::data, Topology::data_rank())
  int64_t align = 32;
  std::vector<ZeroBucket> buckets;

  int64_t shard(const ZeroBucket& b) const { return b.elements / world_size; }
  // This rank's piece of the parameter at `offset` (numel elements) of bucket b, as
  // (first element relative to the parameter, count); count 0 when it holds none.
  std::pair<int64_t, int64_t> piece(const ZeroBucket& b, int64_t offset, int64_t numel) const;
  int64_t padded_elements() const;  // sum of bucket sizes
};

// Throws [policy] for a stage outside 0..3 or a degree below 1.
ZeroLayout zero_layout(const Program& p, const Policy& policy, const Topology& topo);

// No-op for stage 0 in a world of one (the program stays as it was). Shards over the data
// group of `topo`, whatever its tensor-parallel degree.
void apply_zero(Program& p, const Policy& policy, const Topology& topo);

// What freezing saves on one rank (FrozenSummary's closed form, graph/forward_rewrite.hpp):
// masters and optimizer state divide over the data-parallel ranks from stage 1, gradients
// from stage 2 (rounded up per category; the layout's padding aside). Stage 0: the whole.
FrozenSummary frozen_savings_per_rank(const FrozenSummary& whole, const Policy& policy, const Topology& topo);

// Bytes one rank sends per optimizer step (the micro section's collectives times its repeat,
// plus the sync and optimizer sections'), from each collective's ring volume (Op::comm_bytes:
// all-reduce 2 (N-1)/N of the buffer, reduce-scatter and all-gather (N-1)/N).
double communication_bytes_per_step(const Program& p);

// What one rank's collectives send per optimizer step, by purpose (eval's gathers run outside
// steps and count nowhere), and the split of the same bytes over the nodes of ranks_per_node
// consecutive world ranks, for ring algorithms: a rank sends each collective's ring volume to
// its right neighbour in the group, which is on its node or not. node_link is what leaves a
// node per step (the ZeRO++ paper's cross-node volume), 0 when every group lies on one node:
// for a ring, one direction of the link across each node boundary; for an all-to-all (qgZ),
// the inter-node shares of all the node's data ranks, each of which runs the same exchange.
enum class CommPurpose : uint8_t {
  param_gather_forward,   // stage 3 (qwZ: the int8 wire)
  param_gather_backward,  // stage 3, backward and recomputation
  param_gather_update,    // stages 1-2: the updated shards, after the optimizer
  grad_reduce_scatter,    // stages 1-3
  grad_all_reduce,        // stage 0
  scalars,                // loss, overflow flag, gradient norm
  tensor_parallel,        // the tensor group's activation sums and classifier statistics
};
inline constexpr int kNumCommPurposes = 7;
std::string_view comm_purpose_name(CommPurpose c);  // "param_gather_forward", ...

struct CommVolume {
  double by_purpose[kNumCommPurposes] = {};
  double total = 0, intra_node = 0, inter_node = 0, node_link = 0;
  int ranks_per_node = 1, nodes = 1;
};
// Throws [policy] for ranks_per_node < 1. The rank is topo.rank's.
CommVolume communication_volume(const Program& p, const Topology& topo, int ranks_per_node);

}  // namespace memfit
