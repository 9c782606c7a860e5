#include "train/test_fault.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.hpp"

namespace memfit {

TestFault TestFault::from_environment(int rank) {
  TestFault f;
  const char* spec = std::getenv("MEMFIT_TEST_FAULT");
  if (!spec || !*spec) return f;
  int fault_rank = -1;
  long long step = 0;
  char kind[16] = {};
  MEMFIT_CHECK(std::sscanf(spec, "%d:%lld:%15s", &fault_rank, &step, kind) == 3 &&
                   (std::string(kind) == "throw" || std::string(kind) == "stall"),
               "test", "MEMFIT_TEST_FAULT='{}' is not RANK:STEP:throw or RANK:STEP:stall", spec);
  if (fault_rank != rank) return f;
  f.kind_ = std::string(kind) == "throw" ? Kind::raise : Kind::stall;
  f.rank_ = fault_rank;
  f.step_ = step;
  return f;
}

void TestFault::before_step(int64_t step) const {
  if (kind_ == Kind::none || step != step_) return;
  std::fprintf(stderr, "memfit: test fault: rank %d %s before step %lld\n", rank_,
               kind_ == Kind::raise ? "throws" : "stalls", static_cast<long long>(step));
  std::fflush(stderr);
  if (kind_ == Kind::raise) throw Error("test", fmt::format("fault injected on rank {} before step {}", rank_, step));
  std::this_thread::sleep_for(std::chrono::hours(1));  // ended by the other ranks' timeout
}

}  // namespace memfit
