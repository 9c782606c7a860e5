// The training job: resolve the model and data, build and plan the step program, refuse to
// start when the plan does not fit the memory budget, then run steps with validation,
// progress lines and a final report (the object written by --report-json).
#pragma once

#include <ostream>

#include <nlohmann/json.hpp>

#include "kernels/backend.hpp"
#include "runtime/compile.hpp"
#include "train/run_hooks.hpp"
#include "train/run_config.hpp"

namespace memfit {

struct PreparedRun {
  ModelSpec spec;
  Policy policy;  // as built (with_eval resolved)
  CompiledProgram compiled;
};

// Shared by `memfit plan` and `memfit train`: the same program, the same plan.
PreparedRun prepare_run(const RunConfig& config, const Backend& backend);

uint64_t available_memory_bytes();  // MemAvailable of /proc/meminfo

// The resolved model and policy, as reported by `plan --json` and the run report.
nlohmann::json model_json(const ModelSpec& spec, int64_t parameters);
nlohmann::json policy_json(const Policy& policy);

// Refuses to start when the plan exceeds the budget (train/budget.hpp). `hooks` (optional)
// watch the run: `memfit profile`, `--check-leaks`.
nlohmann::json run_training(const RunConfig& config, std::ostream& log, RunHooks* hooks = nullptr);

}  // namespace memfit
