// The leak-guard soak: `memfit train --check-leaks` for 1,000 steps of gpt2-tiny (batch 1 x
// 16). Every step the dead buffers are poisoned and the arena checked; resident memory may
// grow inside steps by at most the guard's bound (256 KiB, runtime/leak_guard.hpp says why it
// is not zero), and the losses are bitwise those of the same run without the guard.
// One kernel thread: 1,000 steps of ~100 tiny parallel regions each are at the mercy of the
// scheduler when ctest runs tests side by side on 2 cores; the guard does not depend on it.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/leak_guard.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(LeakSoak, ThousandStepsFlatAndBitwiseEqual) {
  const std::string d = test::temp_dir();
  const std::string args = "train --threads 1 --steps 1000 --batch 1 --seq 16 --val-fraction 0 --log-every 0 --report-json ";
  const auto guarded = test::run_memfit(args + d + "/guarded.json --check-leaks");
  ASSERT_EQ(guarded.status, 0) << guarded.out << guarded.err;
  const auto plain = test::run_memfit(args + d + "/plain.json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto g = read_json(d + "/guarded.json"), p = read_json(d + "/plain.json");
  const auto& leak = g["leak_check"];
  EXPECT_EQ(leak["steps_checked"], 1000);
  EXPECT_EQ(leak["rss_bound_bytes"], LeakGuard::kDefaultRssBound);
  EXPECT_LE(leak["rss_growth_in_steps_bytes"].get<uint64_t>(), LeakGuard::kDefaultRssBound);
  EXPECT_GT(leak["poisoned_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(g["loss"]["history"], p["loss"]["history"]);
  EXPECT_EQ(g["memory"]["measured_peak_bytes"], g["memory"]["planned_peak_bytes"]);
  std::printf("1,000 steps: RSS growth inside steps %llu bytes, whole process %llu bytes (bound %llu)\n",
              (unsigned long long)leak["rss_growth_in_steps_bytes"].get<uint64_t>(),
              (unsigned long long)leak["rss_growth_bytes"].get<uint64_t>(),
              (unsigned long long)LeakGuard::kDefaultRssBound);
  EXPECT_NE(guarded.out.find("leak check: 1000 steps"), std::string::npos) << guarded.out;
}

}  // namespace
}  // namespace memfit
