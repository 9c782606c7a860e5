#include "train/test_fault.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "runtime/executor.hpp"

namespace memfit {

TestFault TestFault::from_environment(int rank) {
  TestFault f;
  const char* spec = std::getenv("MEMFIT_TEST_FAULT");
  if (!spec || !*spec) return f;
  int fault_rank = -1;
  long long step = 0;
  char kind[16] = {};
  MEMFIT_CHECK(std::sscanf(spec, "%d:%lld:%15s", &fault_rank, &step, kind) == 3 &&
                   (std::string(kind) == "throw" || std::string(kind) == "stall" || std::string(kind) == "kill" ||
                    std::string(kind) == "stray" || std::string(kind) == "grow"),
               "test", "MEMFIT_TEST_FAULT='{}' is not RANK:STEP:KIND with KIND throw, stall, kill, stray or grow",
               spec);
  if (fault_rank != rank) return f;
  const std::string k(kind);
  f.kind_ = k == "throw"   ? Kind::raise
            : k == "stall" ? Kind::stall
            : k == "kill"  ? Kind::kill
            : k == "stray" ? Kind::stray
                           : Kind::grow;
  f.rank_ = fault_rank;
  f.step_ = step;
  return f;
}

void TestFault::before_step(int64_t step) const {
  if ((kind_ != Kind::raise && kind_ != Kind::stall && kind_ != Kind::kill) || step != step_) return;
  std::fprintf(stderr, "memfit: test fault: rank %d %s before step %lld\n", rank_,
               kind_ == Kind::raise ? "throws" : kind_ == Kind::kill ? "is killed" : "stalls",
               static_cast<long long>(step));
  std::fflush(stderr);
  if (kind_ == Kind::raise) throw Error("test", fmt::format("fault injected on rank {} before step {}", rank_, step));
  if (kind_ == Kind::kill) std::raise(SIGKILL);  // as kill -9 or the OOM killer: no handler, no MPI_Abort
  std::this_thread::sleep_for(std::chrono::hours(1));  // ended by the other ranks' timeout
}

void TestFault::after_step_ops(int64_t step, Executor& ex) const {
  if (kind_ == Kind::stray && step == step_) {
    Arena& arena = ex.arena(Tier::device);  // the arena's last byte, which no tensor holds
    const std::byte stray{0x42};
    arena.write(arena.size() - 1, std::span<const std::byte>(&stray, 1));
  }
  if (kind_ == Kind::grow && step >= step_) {
    // Kept reachable, so that a leak sanitizer does not report the planted leak itself.
    static std::vector<std::unique_ptr<char[]>> kept;
    constexpr size_t kBytes = 1 << 20;
    kept.push_back(std::make_unique<char[]>(kBytes));
    std::memset(kept.back().get(), 1, kBytes);
  }
}

}  // namespace memfit
