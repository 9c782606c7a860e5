// From a built program to a runnable one: the backend's library scratch (oneDNN's user
// scratchpad) becomes op workspace tensors, so the plan counts it; then memory is planned,
// each tier aligned as the buffer type the backend serves it with requires.
// `memfit plan` and `memfit train` both go through compile_program, so the plan printed
// before a run is the plan the run executes.
//
// Scratch per queue (the invariant): ops of one queue run one at a time (queue_depth 1), but
// ops of different queues may run at once (a transfer in flight while the compute queue runs
// a kernel), so each queue whose ops need scratch gets its own persistent tensor, sized for the
// largest of its ops: "library.scratch" for the compute queue (the tensor of memfit's one-queue
// programs, planned exactly as before), "library.scratch.<queue>" for the others.
#pragma once

#include "graph/program.hpp"
#include "kernels/backend.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {

struct CompiledProgram {
  Program program;
  MemoryPlan plan;
};

// Asks the backend for every op's scratch (Backend::scratch_bytes) and appends its queue's
// scratch tensor to the workspace of each op that needs some.
void attach_backend_scratch(Program& program, const Backend& backend);
CompiledProgram compile_program(Program program, const Backend& backend);

}  // namespace memfit
