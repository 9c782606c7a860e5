// MemoryPlan: where every tensor of a program lives (tier, byte offset) and what that costs,
// as plain data. Built by plan_memory():
//   1. liveness (plan/liveness.hpp);
//   2. in-place chains: an op's output takes the bytes of an input that dies at that op when
//      the op allows it (Op::inplace), so the pair is one buffer;
//   3. per tier, persistent buffers are laid out first from offset 0; transient buffers are
//      placed by walking the ops in order, freeing buffers after their last op and putting
//      each new buffer (largest first) into the best-fitting free hole, else on top.
// The arena of a tier is exactly `peak_bytes` long: the highest byte any tensor occupies.
// Offsets in a tier are multiples of that tier's alignment, which the caller passes in from
// the buffer type serving the tier (Backend::buffer_type; plan/ cannot see memory/): 64 bytes
// for host RAM, 4 KiB for a disk file that O_DIRECT will read.
// Invariant (tested on random programs): no two tensors whose intervals overlap share a byte.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/program.hpp"
#include "plan/liveness.hpp"

namespace memfit {

inline constexpr uint64_t kTensorAlignment = 64;  // bytes; a cache line, one AVX-512 vector

using TierAlignments = std::array<uint64_t, kNumTiers>;  // bytes, per Tier
inline constexpr TierAlignments kDefaultTierAlignments = {kTensorAlignment, kTensorAlignment, kTensorAlignment};

struct TensorPlacement {
  Tier tier = Tier::device;
  uint64_t offset = 0;  // bytes from the start of the tier's arena (views included)
  uint64_t bytes = 0;
  Interval live;
  int buffer = -1;      // index of the buffer the tensor occupies; -1 when never used
};

using CategoryBytes = std::array<uint64_t, kNumCategories>;

struct TierPlan {
  uint64_t peak_bytes = 0;      // arena size: max over tensors of offset + bytes
  uint64_t max_live_bytes = 0;  // largest total of live buffers at any op (a lower bound on peak_bytes)
  int peak_op = -1;             // op at which the arena first reached peak_bytes
  int max_live_op = -1;
  CategoryBytes at_peak{};      // live bytes per category while peak_op runs
  uint64_t free_at_peak = 0;    // bytes below the peak not holding a live tensor at peak_op
  std::vector<uint64_t> live_bytes;             // per op: bytes of live buffers
  std::vector<CategoryBytes> live_by_category;  // per op, per category
  double packing_ratio() const { return max_live_bytes ? double(peak_bytes) / double(max_live_bytes) : 1.0; }
};

struct MemoryPlan {
  std::vector<TensorPlacement> tensors;  // indexed by TensorId
  std::array<TierPlan, kNumTiers> tiers;
  TierAlignments alignments = kDefaultTierAlignments;  // what the offsets were aligned to
  const TierPlan& tier(Tier t) const { return tiers[size_t(t)]; }
};

// Throws [plan] on a program that cannot be planned (a transient tensor no op touches) or an
// alignment that is not a power of two.
MemoryPlan plan_memory(const Program& program, const TierAlignments& alignments = kDefaultTierAlignments);

// Checks the invariant: tensors of the same tier whose intervals overlap occupy disjoint
// bytes unless one is a view of the other's root or they share an in-place buffer in
// sequence. Returns the first violation as text, empty when none.
std::string find_overlap(const Program& program, const MemoryPlan& plan);

}  // namespace memfit
