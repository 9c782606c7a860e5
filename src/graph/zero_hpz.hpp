// ZeRO++ hpZ's pieces of the ZeRO pass (see zero.hpp): the secondary partition of a stage-3
// bucket and the copy that fills it from the forward's gather. Internal to graph/zero*.cpp and
// graph/training_program.cpp.
#pragma once

#include <string>

#include "graph/zero.hpp"

namespace memfit {

// The partition size hpZ runs with: Policy::zero_hpz_partition_size when it is between 1 and
// the data degree (exclusive) at stage 3, else 1 (off: a partition of the whole data group is
// plain stage 3, as in DeepSpeed).
int hpz_partition(const Policy& policy, const Topology& topo);

// Throws [policy] for a size below 1, above 1 without stage 3, or not dividing the data degree.
void check_hpz(const Policy& policy, const Topology& topo);

struct HpzCopy {
  TensorId secondary = kNoTensor;  // zero.params.<tag>.secondary: E / n elements, transient
  Op copy;                         // this rank's 1/n of the forward's gathered bucket -> secondary
};

// Bucket bi's secondary partition over groups of n ranks (this rank is member L.rank % n) and
// the copy from `gathered` (the forward's gather buffer, E elements). Adds tensors to p, no ops.
HpzCopy hpz_copy(Program& p, const ZeroLayout& L, size_t bi, TensorId gathered, int n);

// The backward's gather `name` of a bucket: the n secondaries over the hpZ group into `gathered`.
Op hpz_gather(Program& p, const std::string& name, TensorId secondary, TensorId gathered, int n, int layer);

}  // namespace memfit
