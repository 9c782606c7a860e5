// Leak guard: checks between steps that no tensor outlives its planned interval and that the
// process's resident memory stays flat once warmed up.
//   * Dead buffers are poisoned after their last op (DeadBufferFill with kPoison: NaN in
//     every float format), so an op that reads a tensor after the plan says it is dead turns
//     the loss into NaN, and a run with the guard gives bitwise the results of one without
//     (tests/runtime/leak_guard_test.cpp compares them).
//   * After each step every byte above the persistent tensors must hold the poison or the
//     start-up sentinel: no op wrote memory that no live tensor owned.
//   * Resident memory (/proc/self/statm) is sampled around every step. After `warmup_steps`
//     (OpenMP's threads, oneDNN's kernels and the C library's heap settle in the first steps)
//     the RSS increases measured across steps must add up to at most `rss_bound_bytes`. The
//     growth of the whole process since warm-up is reported too, but not bounded: the trainer
//     legitimately keeps 16 bytes of loss history per step.
// The bound, and why it is not zero: steps allocate nothing of memfit's, and what oneDNN
// allocates inside a call is freed before it returns, so a loop of bare steps shows exactly
// zero growth (tests/runtime/leak_guard_test.cpp: 0 bytes over 1,000 steps after warm-up).
// When the caller allocates between steps (the trainer's growing loss history), the C
// library's heap moves its free chunks, and oneDNN's short-lived allocations inside a step
// can then land on a page not touched before: a page now and then, a few KiB per doubling of
// the history (measured: 28 KiB over 1,000 steps). The default bound, 256 KiB, is ten times
// that and far below any real leak of a step (one forgotten tensor of gpt2-tiny is 64 KiB
// per step, 64 MiB after 1,000 steps).

#pragma once

#include <cstdint>
#include <string>

#include "runtime/dead_buffers.hpp"

namespace memfit {

struct LeakReport {
  int64_t steps_checked = 0;       // steps after which the arena was checked
  int64_t warmup_steps = 0;
  uint64_t rss_after_warmup = 0;   // bytes
  uint64_t rss_last = 0;
  uint64_t rss_growth = 0;         // largest (RSS - RSS after warm-up) seen since (reported)
  uint64_t rss_growth_in_steps = 0;  // sum of RSS increases measured across steps (bounded)
  uint64_t rss_bound = 0;
  uint64_t poisoned_bytes = 0;     // bytes of dead buffers filled with poison
};

class LeakGuard {
 public:
  static constexpr int64_t kDefaultWarmupSteps = 10;
  static constexpr uint64_t kDefaultRssBound = 256 * 1024;

  // Adds the poisoning observer to the executor; the guard must outlive the steps it checks.
  explicit LeakGuard(Executor& executor, int64_t warmup_steps = kDefaultWarmupSteps,
                     uint64_t rss_bound_bytes = kDefaultRssBound);

  void before_step();
  // Throws [leak] when a byte above the persistent tensors was written while dead, when the
  // loss is not finite, or when RSS grew inside steps by more than the bound after warm-up.
  void after_step(int64_t step, float loss);
  const LeakReport& report() const { return report_; }
  std::string summary() const;  // one line for the run log

 private:
  DeadBufferFill poison_;
  LeakReport report_;
  uint64_t rss_before_ = 0;
  int64_t steps_seen_ = 0;
};

}  // namespace memfit
