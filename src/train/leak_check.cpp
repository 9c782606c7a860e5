#include "train/leak_check.hpp"

namespace memfit {

void LeakCheckHooks::before_steps(Executor& ex, const PreparedRun&) {
  guard_ = std::make_unique<LeakGuard>(ex, warmup_, bound_);
}

void LeakCheckHooks::after_run(Executor&, nlohmann::json& report, std::ostream& log) {
  const LeakReport& r = guard_->report();
  log << guard_->summary() << "\n";
  report["leak_check"] = {{"steps_checked", r.steps_checked},
                          {"warmup_steps", r.warmup_steps},
                          {"rss_after_warmup_bytes", r.rss_after_warmup},
                          {"rss_last_bytes", r.rss_last},
                          {"rss_growth_bytes", r.rss_growth},
                          {"rss_growth_in_steps_bytes", r.rss_growth_in_steps},
                          {"rss_bound_bytes", r.rss_bound},
                          {"poisoned_bytes", r.poisoned_bytes},
                          {"skipped_steps", r.skipped_steps},
                          {"unfinished_bytes", r.unfinished_bytes}};
}

}  // namespace memfit
