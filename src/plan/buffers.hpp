// The plan's buffers, seen from outside the planner: each is a run of bytes of one tier that
// holds one root tensor, or a chain of roots that replace each other in place (Op::inplace).
// Rebuilt from a MemoryPlan (plan_memory keeps its own Buffer type private), for the views
// that need "what occupies which bytes when": the profiler's planned arena top, the leak
// guard's poisoning of dead buffers, and the tensors live at the peak.
// Subtle point: at the op where one member of a chain replaces another, both members are
// live by their intervals, but the bytes are counted once, for the newer member (the plan's
// timeline does the same), so sums over buffers equal TierPlan::live_bytes exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {

struct PlannedBuffer {
  Tier tier = Tier::device;
  bool persistent = false;
  uint64_t offset = 0;
  uint64_t bytes = 0;             // the first member's bytes; later members fit inside
  Interval live;                  // union of the members' intervals
  std::vector<TensorId> members;  // roots, in order of birth
};

std::vector<PlannedBuffer> planned_buffers(const Program& program, const MemoryPlan& plan);

// The member that holds the buffer's bytes while `op` runs: the newest one born by then.
TensorId buffer_holder(const PlannedBuffer& buffer, const MemoryPlan& plan, int op);

// Per op: the end of the highest buffer of `tier` live at that op, i.e. how far up the arena
// is in use while the op runs. Its maximum over ops is the tier's planned peak.
std::vector<uint64_t> planned_arena_top(const std::vector<PlannedBuffer>& buffers, Tier tier, int n_ops);

}  // namespace memfit
