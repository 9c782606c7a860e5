// `memfit plan --world-size 2 --zero S` (the planned program, and the estimate with
// --hardware cpu, which plans rank 0's program through fit/) reports the device peak that
// `mpirun -np 2 memfit train --zero S` with the same settings plans and measures, byte for byte,
// for every ZeRO stage (with the same thread count: the backend's scratch depends on it). The train report's measured high-water mark is the independent side:
// it comes from the executed arena, not from a plan.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "support/paths.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(PlanMatchesTrain, TwoRanksEveryZeroStage) {
  // Accumulation 2 and clipping: the persistent gradient shard of stage 2/3, the sync section
  // and the global norm's collective are all part of the program.
  const std::string settings = "--model gpt2-tiny --batch 2 --seq 32 --grad-accum 2 --grad-clip 1 --precision bf16";
  // The backend's scratch (oneDNN's) depends on its thread count: plan with the ranks' count.
  setenv("OMP_NUM_THREADS", "1", 1);
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    const std::string dir = test::temp_dir(), report = fmt::format("{}/zero{}.json", dir, stage);
    const std::string log = fmt::format("{}/zero{}.log", dir, stage);
    const std::string cmd = fmt::format(
        "OMP_NUM_THREADS=1 timeout -k 10 240 {} --allow-run-as-root --oversubscribe -np 2 {} train {} --zero {} "
        "--steps 2 --log-every 0 --report-json {} >{} 2>&1",
        test::mpiexec(), test::memfit_binary(), settings, stage, report, log);
    const int raw = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 0) << read_all(log);
    const auto trained = nlohmann::json::parse(read_all(report));
    const uint64_t planned = trained["memory"]["planned_peak_bytes"]["device"].get<uint64_t>();
    EXPECT_EQ(trained["memory"]["measured_peak_bytes"]["device"].get<uint64_t>(), planned);
    EXPECT_TRUE(trained["memory"]["all_ranks_equal"].get<bool>());
    EXPECT_EQ(trained["distributed"]["world_size"].get<int>(), 2);

    auto r = test::run_memfit(fmt::format("plan {} --world-size 2 --zero {} --json", settings, stage));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["memory"]["planned_peak_bytes"]["device"].get<uint64_t>(), planned);

    r = test::run_memfit(fmt::format("plan {} --hardware cpu --world-size 2 --zero {} --json", settings, stage));
    ASSERT_EQ(r.status, 0) << r.err;
    const auto estimate = nlohmann::json::parse(r.out)["estimate"];
    EXPECT_EQ(estimate["per_rank"]["device_bytes"].get<uint64_t>(), planned);
    EXPECT_FALSE(estimate["sharding_is_estimate"].get<bool>());
    EXPECT_EQ(estimate["per_rank"]["packing_overhead_bytes"].get<uint64_t>(),
              planned - trained["memory"]["max_live_bytes"].get<uint64_t>());
  }
}

}  // namespace
}  // namespace memfit
