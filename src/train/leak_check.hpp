// `memfit train --check-leaks`: the run with the leak guard (runtime/leak_guard.hpp) watching
// it. Dead buffers are poisoned after their last op, the arena is checked between steps, and
// resident memory must stay flat after warm-up; the result goes into the log and into the
// report's "leak_check" object.
#pragma once

#include <memory>

#include "runtime/leak_guard.hpp"
#include "train/run_hooks.hpp"

namespace memfit {

class LeakCheckHooks : public RunHooks {
 public:
  explicit LeakCheckHooks(int64_t warmup_steps = LeakGuard::kDefaultWarmupSteps,
                          uint64_t rss_bound_bytes = LeakGuard::kDefaultRssBound)
      : warmup_(warmup_steps), bound_(rss_bound_bytes) {}

  void before_steps(Executor& executor, const PreparedRun& run) override;
  void before_step(int64_t step) override { guard_->before_step(); }
  void after_step(int64_t step, float loss) override { guard_->after_step(step, loss); }
  void after_run(Executor& executor, nlohmann::json& report, std::ostream& log) override;

 private:
  int64_t warmup_;
  uint64_t bound_;
  std::unique_ptr<LeakGuard> guard_;
};

}  // namespace memfit
