// Communication that overlaps compute, as a transformation of the step program (DeepSpeed's
// zero_optimization.overlap_comm). Applied after the ZeRO pass: each collective whose result
// is not needed by the very next op is split into a start (the collective op itself, with
// Op::async_id set) and a wait op placed as late as the program allows.
// The ops in between run while the collective is in flight; the executor keeps MPI's progress
// engine turning between ops.
//
// Where the wait goes (the subtle point): before the first later op that touches the
// collective's output bytes or writes its input bytes (views resolved to their roots and byte
// ranges), before the next op of the same queue starts (gathers and reductions are two queues,
// each with at most one collective in flight, which bounds the extra memory to one bucket per queue), and
// before its section ends (sections run separately: a micro-step may repeat, the optimizer may
// be skipped). The wait names the start's inputs and outputs, so the planner keeps both alive
// and untouched for the whole flight: the plan shows what overlap costs in memory.
#pragma once

#include "graph/program.hpp"

namespace memfit {

void overlap_collectives(Program& p);

// Start and wait indices of every asynchronous collective, for tests and reports.
struct AsyncCollective {
  int start = -1, wait = -1;
};
std::vector<AsyncCollective> async_collectives(const Program& p);

}  // namespace memfit
