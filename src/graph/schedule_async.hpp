// Asynchronous work as a transformation of the step program: one pass for every op that runs
// on a queue other than `compute` (collectives on the communicator queues, moves between tiers
// on the transfer queues). Applied last in build_training_program. Each such op whose result
// is not needed by the very next op is split into a start (the op itself, with Op::async_id
// set) and a `wait` op placed as late as the program allows; the ops in between run while the
// work is in flight (DeepSpeed's zero_optimization.overlap_comm for collectives, prefetch and
// write-behind for transfers).
//
// Where the wait goes (the subtle point): before the first later op that touches the started
// op's output bytes or writes its input bytes (views resolved to their roots and byte ranges),
// before the op that would put more than queue_depth(queue) ops of its queue in flight (with
// depth 1: the next op of the same queue; gathers and reductions are two queues, so a gradient
// reduction may stay in flight while the next block is gathered), and before its section ends
// (sections run separately: a micro-step may repeat, the optimizer may be skipped). The wait
// names the start's inputs and outputs, so the planner keeps both alive and untouched for the
// whole flight: the plan shows what asynchrony costs in memory.
#pragma once

#include <vector>

#include "graph/program.hpp"

namespace memfit {

struct AsyncOptions {
  // Communicator queues: collectives overlap compute (`--overlap-comm`); off keeps every
  // collective blocking. Transfer queues are always scheduled.
  bool overlap_comm = true;
};

void schedule_async(Program& p, const AsyncOptions& options);

// Start and wait indices of every asynchronous op, in async id order, for tests and reports.
struct AsyncSpan {
  int start = -1, wait = -1;
};
std::vector<AsyncSpan> async_spans(const Program& p);

}  // namespace memfit
