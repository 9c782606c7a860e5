// Test-only fault injection, for the tests that check that an error on one rank ends every rank
// (tests/dist/fatal_error_test.cpp). Read once from the environment before the first step:
//   MEMFIT_TEST_FAULT=RANK:STEP:throw   rank RANK throws [test] before optimizer step STEP
//   MEMFIT_TEST_FAULT=RANK:STEP:stall   rank RANK sleeps (outside MPI) before step STEP, so the
//                                       others wait in a collective until --comm-timeout
// Unset (always, outside those tests): nothing happens. Each fault prints one line to stderr
// first, so a test can time how long the job takes to end after it.
#pragma once

#include <cstdint>

namespace memfit {

class TestFault {
 public:
  // Throws [test] when MEMFIT_TEST_FAULT is set but malformed.
  static TestFault from_environment(int rank);
  // Before optimizer step `step` (1-based); allocates nothing unless the fault fires.
  void before_step(int64_t step) const;

 private:
  enum class Kind : uint8_t { none, raise, stall };
  Kind kind_ = Kind::none;
  int rank_ = -1;
  int64_t step_ = 0;
};

}  // namespace memfit
