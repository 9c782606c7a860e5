// Hooks into a training run for tools that watch it (`memfit profile`, `--check-leaks`):
// called at fixed points of run_training, never inside a step. An observer that must see
// every op adds itself to the executor in before_steps (Executor::add_observer).
#pragma once

#include <cstdint>
#include <ostream>

#include <nlohmann/json.hpp>

namespace memfit {

class Executor;
struct PreparedRun;

class RunHooks {
 public:
  virtual ~RunHooks() = default;
  // The executor is built and initialised; step 1 comes next.
  virtual void before_steps(Executor& executor, const PreparedRun& run) {}
  virtual void before_step(int64_t step) {}
  virtual void after_step(int64_t step, float loss) {}
  // The steps and the final validation are done; the report is about to be written.
  virtual void after_run(Executor& executor, nlohmann::json& report, std::ostream& log) {}
};

}  // namespace memfit
