// Candidate runs for the planner's questions ("what fits?"): a RunConfig with one knob
// changed is built, compiled and planned exactly as `memfit train` would (prepare_run), but
// not run. A candidate the build refuses ("[policy] ... is not supported") is reported as
// unavailable rather than as an error, so suggestions for techniques that other parts of
// memfit add later (recomputation, mixed precision, ...) appear as soon as they build.
#pragma once

#include <cstdint>
#include <string>

#include "graph/model_spec.hpp"
#include "graph/program.hpp"
#include "plan/memory_plan.hpp"
#include "kernels/backend.hpp"
#include "train/run_config.hpp"

namespace memfit {

struct CandidatePlan {
  bool built = false;
  bool unsupported = false;  // refused by this build ([policy] "not supported")
  std::string refused;       // the refusal, when not built
  uint64_t peak = 0;         // planned bytes in memory (memory_peak)
  int peak_op = -1;
  double flops_per_token = 0;  // arithmetic work per trained token (micro-steps x repeats + optimizer)
};

CandidatePlan plan_candidate(const RunConfig& config, const Backend& backend);
// The planned bytes held in this machine's memory, which the budget bounds: the device tier
// plus the host tier (on the CPU backend both are RAM; optimizer offload to the host moves
// bytes between them without saving any). The disk tier is bounded by its filesystem.
uint64_t memory_peak(const MemoryPlan& plan);
double flops_per_token(const Program& program, const Policy& policy);

// Largest micro-batch in [1, hi] whose plan fits `budget` (0 when none), `config`'s other
// settings unchanged.
int64_t largest_fitting_batch(const RunConfig& config, const Backend& backend, uint64_t budget, int64_t hi);
RunConfig with_batch(RunConfig config, int64_t batch);

// What planning cannot see but the run would refuse when it starts: the CPU backend has no
// bf16 kernel for plain attention over grouped kv heads (its oneDNN descriptors pair each query
// head with the kv head of the same index). Changes `config` so that it runs and returns the
// flags that say so (" --attention flash"), or "" when it already runs. Suggestions pass
// through it, so a printed change is one the run accepts when appended to the command.
std::string make_runnable(RunConfig& config, const ModelSpec& spec, const Backend& backend);

}  // namespace memfit
