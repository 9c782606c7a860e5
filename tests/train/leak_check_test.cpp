// `memfit train --check-leaks` (train/leak_check.hpp, runtime/leak_guard.hpp) on every kind of
// run the suite trains, at the size of a unit test: precision {fp32, bf16, fp16} x optimizer
// {adamw, adamw8bit} x clipping {off, on} x validation {off, between every step}. The guard
// must pass each (no false leak: fp16 is started at a loss scale that overflows, so a skipped
// step, whose optimizer section never runs, comes first), and the losses must be bitwise
// those of the same run without the guard (the poison changes nothing a correct plan reads).
// The guard must also fail: faults planted through MEMFIT_TEST_FAULT (train/test_fault.hpp),
// a stray byte in the arena and resident memory that grows per step, are reported as leaks.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

const std::string kTiny = "train --threads 1 --batch 1 --seq 16 --log-every 0 ";

TEST(LeakCheck, NoFalseLeakOnAnyTrainedConfiguration) {
  const std::string d = test::temp_dir();
  int runs = 0;
  for (const std::string precision : {"fp32", "bf16", "fp16"})
    for (const std::string optimizer : {"adamw", "adamw8bit"})
      for (const std::string clip : {"0", "1"})
        for (const bool eval : {false, true}) {
          const std::string name = precision + "-" + optimizer + "-clip" + clip + (eval ? "-eval" : "");
          SCOPED_TRACE(name);
          std::string args = kTiny + "--steps 3 --precision " + precision + " --optimizer " + optimizer +
                             " --grad-clip " + clip +
                             (eval ? " --val-fraction 0.1 --eval-every 1 --eval-batches 1" : " --val-fraction 0");
          // 5e5 overflows gpt2-tiny's fp16 gradients at step 1, and half of it does not.
          if (precision == "fp16") args += " --initial-loss-scale 500000";
          const auto guarded = test::run_memfit(args + " --check-leaks --report-json " + d + "/" + name + ".json");
          ASSERT_EQ(guarded.status, 0) << guarded.out << guarded.err;
          const auto plain = test::run_memfit(args + " --report-json " + d + "/" + name + "-plain.json");
          ASSERT_EQ(plain.status, 0) << plain.err;
          const auto g = read_json(d + "/" + name + ".json"), p = read_json(d + "/" + name + "-plain.json");
          EXPECT_EQ(g["leak_check"]["steps_checked"], 3);
          EXPECT_EQ(g["loss"]["history"], p["loss"]["history"]);
          EXPECT_EQ(g["validation"]["history"], p["validation"]["history"]);
          if (precision == "fp16") {
            EXPECT_GE(g["leak_check"]["skipped_steps"].get<int>(), 1);  // the case that needs the guard's care
            EXPECT_EQ(g["leak_check"]["skipped_steps"], g["loss_scaling"]["skipped_steps"]);
            EXPECT_GE(g["optimizer_steps_applied"].get<int>(), 1);
            EXPECT_GT(g["leak_check"]["unfinished_bytes"].get<uint64_t>(), 0u);
          }
          ++runs;
        }
  EXPECT_EQ(runs, 24);
}

// The other shapes of step the suite trains: accumulation (buffers filled only after the last
// micro-step) and recomputation with flash attention, each with skipped fp16 steps, and Llama.
TEST(LeakCheck, NoFalseLeakWithAccumulationRecomputationAndLlama) {
  const std::string d = test::temp_dir();
  const std::string base = "train --threads 1 --batch 2 --seq 16 --log-every 0 --steps 3 --val-fraction 0.1 "
                           "--eval-every 1 --eval-batches 1 ";
  int index = 0;
  for (const std::string extra : {"--precision fp16 --grad-accum 2 --initial-loss-scale 5e6 --grad-clip 1",
                                  "--precision fp16 --recompute full --attention flash --initial-loss-scale 5e6",
                                  "--model llama-tiny --precision bf16 --attention flash --optimizer adamw8bit"}) {
    SCOPED_TRACE(extra);
    const std::string report = d + "/extra" + std::to_string(index++);
    const auto guarded = test::run_memfit(base + extra + " --check-leaks --report-json " + report + ".json");
    ASSERT_EQ(guarded.status, 0) << guarded.out << guarded.err;
    const auto plain = test::run_memfit(base + extra + " --report-json " + report + "-plain.json");
    ASSERT_EQ(plain.status, 0) << plain.err;
    const auto g = read_json(report + ".json"), p = read_json(report + "-plain.json");
    EXPECT_EQ(g["leak_check"]["steps_checked"], 3);
    EXPECT_EQ(g["loss"]["history"], p["loss"]["history"]);
    EXPECT_EQ(g["validation"]["history"], p["validation"]["history"]);
  }
}

TEST(LeakCheck, AStrayByteInTheArenaIsReported) {
  setenv("MEMFIT_TEST_FAULT", "0:2:stray", 1);
  const auto guarded = test::run_memfit(kTiny + "--steps 3 --val-fraction 0 --check-leaks");
  const auto plain = test::run_memfit(kTiny + "--steps 3 --val-fraction 0");
  unsetenv("MEMFIT_TEST_FAULT");
  EXPECT_EQ(guarded.status, 1) << guarded.out << guarded.err;
  EXPECT_NE(guarded.err.find("[leak] after step 2: byte"), std::string::npos) << guarded.err;
  EXPECT_NE(guarded.err.find("holds 0x42 between steps"), std::string::npos) << guarded.err;
  EXPECT_EQ(plain.status, 0) << plain.err;  // the fault alone breaks nothing the run itself sees
}

TEST(LeakCheck, ResidentMemoryGrowingPerStepIsReported) {
  setenv("MEMFIT_TEST_FAULT", "0:1:grow", 1);  // 1 MiB kept per step; the bound is 256 KiB
  const auto guarded = test::run_memfit(kTiny + "--steps 16 --val-fraction 0 --check-leaks");
  unsetenv("MEMFIT_TEST_FAULT");
  EXPECT_EQ(guarded.status, 1) << guarded.out << guarded.err;
  EXPECT_NE(guarded.err.find("[leak] resident memory grew by"), std::string::npos) << guarded.err;
}

}  // namespace
}  // namespace memfit
