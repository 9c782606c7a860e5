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
//   * A step may leave sections out: fp16 loss scaling skips the optimizer section after an
//     overflow (train/step_runner.hpp), so buffers born in the micro-steps whose interval ends
//     in the optimizer never reach their last op and are never poisoned by DeadBufferFill.
//     The guard records which ops ran in the step, and after it poisons every transient
//     buffer whose interval began in ops that ran but whose last op did not: between steps
//     every transient tensor is dead, so this changes no result. The loss of a skipped step
//     may be inf or NaN (that is why it was skipped) and is not held against the arena.
//     Validation (the eval section, run between steps) is poisoned op by op like the step,
//     and checked with the next step.
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
#include <vector>

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
  int64_t skipped_steps = 0;       // steps whose optimizer section did not run (fp16 overflow)
  uint64_t unfinished_bytes = 0;   // bytes poisoned after steps because their last op did not run
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
  // Marks the ops that ran since before_step; allocates nothing.
  class RanOps : public OpObserver {
   public:
    explicit RanOps(size_t ops) : ran(ops, 0) {}
    void after_op(int op, const StepContext&) override { ran[size_t(op)] = 1; }
    std::vector<uint8_t> ran;
  };
  struct Transient {
    Tier tier;
    uint64_t offset, bytes;
    int first, last;  // the buffer's planned interval
  };
  // Poisons the transient buffers that the step began but did not finish; true when the
  // step left the optimizer section out.
  bool poison_unfinished();

  Executor& ex_;
  DeadBufferFill poison_;
  RanOps ran_;
  std::vector<Transient> transients_;
  std::vector<int32_t> ran_before_;  // ran_before_[i]: ops < i that ran (prefix count)
  int optimizer_begin_ = -1;         // first op of the optimizer section; -1 without one
  LeakReport report_;
  uint64_t rss_before_ = 0;
  int64_t steps_seen_ = 0;
};

}  // namespace memfit
