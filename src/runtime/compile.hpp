// From a built program to a runnable one: the backend's library scratch (oneDNN's user
// scratchpad) becomes one persistent tensor, the workspace of every op that needs it, so the
// plan counts it; then memory is planned.
// `memfit plan` and `memfit train` both go through compile_program, so the plan printed
// before a run is the plan the run executes.
#pragma once

#include "graph/program.hpp"
#include "kernels/backend.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {

struct CompiledProgram {
  Program program;
  MemoryPlan plan;
};

void attach_backend_scratch(Program& program, const Backend& backend);
CompiledProgram compile_program(Program program, const Backend& backend);

}  // namespace memfit
