#include "runtime/leak_guard.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "runtime/rss.hpp"

namespace memfit {

LeakGuard::LeakGuard(Executor& ex, int64_t warmup_steps, uint64_t rss_bound_bytes)
    : ex_(ex), poison_(ex, DeadBufferFill::kPoison), ran_(ex.program().ops().size()) {
  report_.warmup_steps = std::max<int64_t>(1, warmup_steps);  // the baseline is taken after a step
  report_.rss_bound = rss_bound_bytes;
  const Program& p = ex.program();
  for (const PlannedBuffer& b : planned_buffers(p, ex.plan()))
    if (!b.persistent && b.bytes > 0) transients_.push_back({b.tier, b.offset, b.bytes, b.live.first, b.live.last});
  ran_before_.resize(p.ops().size() + 1);
  if (const Section* opt = p.find_section(SectionKind::optimizer); opt && opt->end > opt->begin) optimizer_begin_ = opt->begin;
  ex.add_observer(&poison_);
  ex.add_observer(&ran_);
}

void LeakGuard::before_step() {
  std::fill(ran_.ran.begin(), ran_.ran.end(), uint8_t{0});
  rss_before_ = resident_set_bytes();
}

bool LeakGuard::poison_unfinished() {
  for (size_t i = 0; i < ran_.ran.size(); ++i) ran_before_[i + 1] = ran_before_[i] + ran_.ran[i];
  for (const Transient& t : transients_) {
    if (ran_.ran[size_t(t.last)] || ran_before_[size_t(t.last) + 1] == ran_before_[size_t(t.first)]) continue;
    if (!ex_.buffer(t.tier).host_data()) continue;  // a disk tier: only transfers touch it
    std::memset(ex_.arena(t.tier).data() + t.offset, poison_.fill(), t.bytes);
    report_.unfinished_bytes += t.bytes;
  }
  return optimizer_begin_ >= 0 && !ran_.ran[size_t(optimizer_begin_)];
}

void LeakGuard::after_step(int64_t step, float loss) {
  const uint64_t rss = resident_set_bytes();
  ++steps_seen_;
  const bool skipped = poison_unfinished();
  report_.skipped_steps += skipped ? 1 : 0;
  report_.poisoned_bytes = poison_.filled_bytes() + report_.unfinished_bytes;
  const std::string stray = poison_.find_stray_bytes();
  MEMFIT_CHECK(stray.empty(), "leak", "after step {}: {}", step, stray);
  ++report_.steps_checked;
  MEMFIT_CHECK(std::isfinite(loss) || skipped, "leak",
               "the loss is {} at step {} while dead buffers hold NaN: an op read a tensor after its planned interval "
               "ended (or the run diverged: compare with a run without --check-leaks)",
               loss, step);
  report_.rss_last = rss;
  if (steps_seen_ == report_.warmup_steps) {
    report_.rss_after_warmup = rss;
    return;
  }
  if (steps_seen_ < report_.warmup_steps) return;
  if (rss > report_.rss_after_warmup) report_.rss_growth = std::max(report_.rss_growth, rss - report_.rss_after_warmup);
  if (rss > rss_before_) report_.rss_growth_in_steps += rss - rss_before_;
  MEMFIT_CHECK(report_.rss_growth_in_steps <= report_.rss_bound, "leak",
               "resident memory grew by {} ({} bytes) inside steps {}..{}, more than the bound of {}",
               format_bytes(report_.rss_growth_in_steps), report_.rss_growth_in_steps, report_.warmup_steps + 1, step,
               format_bytes(report_.rss_bound));
}

std::string LeakGuard::summary() const {
  const LeakReport& r = report_;
  return fmt::format("leak check: {} steps ({} skipped by loss scaling), {} of dead buffers poisoned, arena clean "
                     "between steps; RSS after {} warm-up steps {}, then growth inside steps {} bytes (bound {}), "
                     "whole process {} bytes",
                     r.steps_checked, r.skipped_steps, format_bytes(r.poisoned_bytes), r.warmup_steps,
                     format_bytes(r.rss_after_warmup),
                     r.rss_growth_in_steps, r.rss_bound, r.rss_growth);
}

}  // namespace memfit
