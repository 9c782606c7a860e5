// The training job: resolve the model and data, build and plan the step program, refuse to
// start when the plan does not fit the memory budget, then run steps with validation,
// progress lines and a final report (the object written by --report-json).
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/system_memory.hpp"
#include "dist/communicator.hpp"
#include "kernels/backend.hpp"
#include "plan/recompute_search.hpp"
#include "runtime/compile.hpp"
#include "train/run_hooks.hpp"
#include "train/run_config.hpp"

namespace memfit {

struct PreparedRun {
  ModelSpec spec;
  Policy policy;  // as built (with_eval resolved, `--recompute auto` resolved to its choice)
  CompiledProgram compiled;
  std::optional<RecomputeChoice> recompute_choice;  // set when the policy asked for auto
};

// One line on what `--recompute auto` chose, for the logs of train and plan ("" otherwise).
std::string describe_recompute_choice(const PreparedRun& run, uint64_t budget);

// Shared by `memfit plan` and `memfit train`: the same program, the same plan. `--recompute
// auto` is resolved here against the run's budget (--memory-budget, else the available memory).
PreparedRun prepare_run(const RunConfig& config, const Backend& backend);

uint64_t run_budget(const RunConfig& config);  // --memory-budget, else available_memory_bytes()

// The resolved model and policy, as reported by `plan --json` and the run report.
nlohmann::json model_json(const ModelSpec& spec, int64_t parameters);
nlohmann::json policy_json(const Policy& policy);
// The bytes this rank's collectives send per step (graph/zero.hpp communication_volume), by
// purpose and split over nodes of ranks_per_node ranks: `plan --json` and the run report's
// "distributed", and the line `memfit plan` and the run log print.
nlohmann::json communication_json(const Program& program, const Topology& topo, int ranks_per_node);
std::string describe_communication(const Program& program, const Topology& topo, int ranks_per_node);

// Refuses to start when the plan exceeds the budget (train/budget.hpp). `hooks` (optional)
// watch the run: `memfit profile`, `--check-leaks`. `comm` is the world (not owned; the data
// and tensor groups are split from it by the topology); when null, MPI_COMM_WORLD if launched
// by mpirun with several ranks, else a world of one. Its waits time out after
// config.comm_timeout seconds. Every rank runs this; only rank 0 logs and writes the report
// file.
nlohmann::json run_training(const RunConfig& config, std::ostream& log, RunHooks* hooks = nullptr,
                            Communicator* comm = nullptr);

}  // namespace memfit
