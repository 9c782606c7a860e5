// What the tests run under mpirun (tests/**/*_mpitest.cpp) share: the world communicator, a
// main that prints one report (rank 0's; every rank's failures still fail the run), and a run
// hook that counts memfit's allocations in steps 2.. (step 1 may touch lazily initialised
// library state).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "dist/communicator.hpp"
#include "support/alloc_counter.hpp"
#include "train/run_hooks.hpp"

namespace memfit::test {

inline Communicator& world() {
  static std::unique_ptr<Communicator> c = make_mpi_communicator();
  return *c;
}

class StepAllocations final : public RunHooks {
 public:
  void before_step(int64_t step) override {
    if (step >= 2) alloc_counter_start();
  }
  void after_step(int64_t step, float) override {
    if (step >= 2) allocations += alloc_counter_stop().memfit_allocations;
  }
  int64_t allocations = 0;
};

inline int run_mpi_tests(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (world().rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}

}  // namespace memfit::test
