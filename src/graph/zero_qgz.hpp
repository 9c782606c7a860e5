// ZeRO++ qgZ's piece of the ZeRO pass (see zero.hpp): one bucket's gradient reduce-scatter as
// quantised all-to-alls. Internal to graph/zero*.cpp.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graph/zero.hpp"

namespace memfit {

inline constexpr int64_t kQgzBlock = 256;  // elements per block of qgZ's wire (and one scale)

// The ops replacing "reduce-scatter bucket bi's `grads` into this rank's `shard` of it": `now` right after the bucket's last gradient, `later`
// (the decoding sum of the last hop) as late as the pass allows, so that the last all-to-all
// overlaps the backward. Adds the wires and the fp32 partial sum to p (transient, communication).
// One hop over the data group when the topology's data ranks per node are 1 or all of them,
// else two (node, then across_nodes).
struct QgzReduce {
  std::vector<Op> now, later;
};
// With k > 1 micro-steps the result lands in a transient buffer that `later` then adds to the
// shard (accumulate_shard).
QgzReduce qgz_reduce_scatter(Program& p, const ZeroLayout& L, size_t bi, const Topology& topo, int bits,
                             TensorId grads, TensorId shard, int k);

// With accumulation: the micro-step's reduced shard of bucket bi, in `buf`, added to `shard`.
Op accumulate_shard(const ZeroLayout& L, size_t bi, TensorId buf, TensorId shard);

// Whether qgZ takes two hops on this topology (data ranks per node strictly between 1 and the
// data degree).
bool qgz_two_hops(const Topology& topo);

}  // namespace memfit
