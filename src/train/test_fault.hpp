// Test-only fault injection, for the tests that check that an error on one rank ends every rank
// (tests/dist/fatal_error_test.cpp). Read once from the environment before the first step:
//   MEMFIT_TEST_FAULT=RANK:STEP:throw   rank RANK throws [test] before optimizer step STEP
//   MEMFIT_TEST_FAULT=RANK:STEP:stall   rank RANK sleeps (outside MPI) before step STEP, so the
//                                       others wait in a collective until --comm-timeout
//   MEMFIT_TEST_FAULT=RANK:STEP:kill    rank RANK sends itself SIGKILL before step STEP (a dead
//                                       rank: no handler runs, nothing reaches MPI)
//   MEMFIT_TEST_FAULT=RANK:STEP:stray   after step STEP's ops, rank RANK writes one byte into
//                                       the top of its device arena, where no tensor is live
//                                       between steps: what an op writing past its outputs
//                                       does (tests/train/leak_check_test.cpp: the guard fails)
//   MEMFIT_TEST_FAULT=RANK:STEP:grow    from step STEP on, rank RANK keeps 1 MiB of touched
//                                       heap per step: a leak that resident memory shows
// Unset (always, outside those tests): nothing happens. Each fault prints one line to stderr
// first, so a test can time how long the job takes to end after it.
#pragma once

#include <cstdint>

namespace memfit {

class Executor;

class TestFault {
 public:
  // Throws [test] when MEMFIT_TEST_FAULT is set but malformed.
  static TestFault from_environment(int rank);
  // Before optimizer step `step` (1-based); allocates nothing unless the fault fires.
  void before_step(int64_t step) const;
  // After step `step`'s ops, before the hooks check it (stray, grow).
  void after_step_ops(int64_t step, Executor& executor) const;

 private:
  enum class Kind : uint8_t { none, raise, stall, kill, stray, grow };
  Kind kind_ = Kind::none;
  int rank_ = -1;
  int64_t step_ = 0;
};

}  // namespace memfit
