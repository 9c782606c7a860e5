// `memfit plan --world-size 2 --zero S` (the planned program, and the estimate with
// --hardware cpu, which plans rank 0's program through fit/) reports the device peak that
// `mpirun -np 2 memfit train --zero S` with the same settings plans and measures, byte for byte,
// for every ZeRO stage (with the same thread count: the backend's scratch depends on it). The train report's measured high-water mark is the independent side:
// it comes from the executed arena, not from a plan.
#include <gtest/gtest.h>

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

TEST(PlanMatchesTrain, TwoRanksEveryZeroStage) {
  // Accumulation 2 and clipping: the persistent gradient shard of stage 2/3, the sync section
  // and the global norm's collective are all part of the program.
  const std::string settings = "--model gpt2-tiny --batch 2 --seq 32 --grad-accum 2 --grad-clip 1 --precision bf16";
  // The backend's scratch (oneDNN's) depends on its thread count: plan with the ranks' count.
  setenv("OMP_NUM_THREADS", "1", 1);
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    const std::string report = fmt::format("{}/zero{}.json", test::temp_dir(), stage);
    const auto run = test::run_memfit_mpi(
        2, fmt::format("train {} --zero {} --steps 2 --log-every 0 --report-json {}", settings, stage, report));
    ASSERT_EQ(run.status, 0) << run.out << run.err;
    const auto trained = nlohmann::json::parse(test::read_file(report));
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
