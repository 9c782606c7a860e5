// Issue 19, must-show 4: under `mpirun -np 2`, a GPT-2-wide model at every ZeRO stage (and one
// process without mpirun) peaks at the RSS its process plan says, within 2% + 25 MiB. The
// plan (train/process_plan.hpp) is what the process held before the tiers, plus the tiers'
// exact plans, plus the staging buffers. The model's outer bucket (GPT-2's vocabulary at
// width 384: 19 M elements, 78 MB of fp32 gradients) is what OpenMPI's own non-blocking
// reductions used to copy on every step: 78-156 MB above the plan, outside the tolerance
// (about 32 MiB here; the communicator of commit 98c4af6 ended 79 MiB above this plan at ZeRO 0),
// so this test
// fails if a reduction allocates in proportion to its data again. The report's max RSS is
// getrusage's high-water mark, independent of the plan.
#include <gtest/gtest.h>

#include <cmath>
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

void expect_rss_within_plan(const nlohmann::json& report, int ranks) {
  const auto& p = report["memory"]["process"];
  const uint64_t planned = p["planned_peak_rss_bytes"].get<uint64_t>(), rss = p["max_rss_bytes"].get<uint64_t>();
  const double tolerance = 0.02 * double(planned) + double(25 << 20);
  std::printf("  ranks %d zero %d: planned %.1f MiB, max RSS %.1f MiB (%+.2f%%)\n", ranks,
              report["distributed"]["zero_stage"].get<int>(), double(planned) / (1 << 20), double(rss) / (1 << 20),
              100.0 * (double(rss) - double(planned)) / double(planned));
  EXPECT_LE(std::abs(double(rss) - double(planned)), tolerance) << "RSS " << rss << " against the plan " << planned;
  EXPECT_EQ(p["within_tolerance"].get<bool>(), std::abs(double(rss) - double(planned)) <= tolerance);
  // The plan's parts: the tiers are the executed arenas' plans (the CPU backend keeps both in
  // process memory), and every communicator of a multi-rank run holds its 2 MiB ring scratch.
  const auto& peaks = report["memory"]["planned_peak_bytes"];
  EXPECT_EQ(p["tiers_bytes"].get<uint64_t>(), peaks["device"].get<uint64_t>() + peaks["host"].get<uint64_t>());
  EXPECT_EQ(p["communication_bytes"].get<uint64_t>() % (2u << 20), 0u);
  EXPECT_EQ(p["communication_bytes"].get<uint64_t>() > 0, ranks > 1);
  EXPECT_EQ(p["planned_peak_rss_bytes"].get<uint64_t>(),
            p["before_tiers_bytes"].get<uint64_t>() + p["tiers_bytes"].get<uint64_t>() + p["staging_bytes"].get<uint64_t>());
}

TEST(ProcessMemory, RssWithinThePlanOnTwoRanksAtEveryZeroStage) {
  const std::string dir = test::temp_dir(), config = dir + "/gpt2_wide.json";
  test::write_file(config, R"({"model_type": "gpt2", "n_layer": 1, "n_head": 6, "n_embd": 384, "vocab_size": 50257,
                               "n_positions": 64})");
  const std::string settings = fmt::format("--model {} --batch 1 --seq 16 --steps 2 --val-fraction 0 --log-every 0", config);
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    const std::string report = fmt::format("{}/zero{}.json", dir, stage);
    const auto r = test::run_memfit_mpi(2, fmt::format("train {} --zero {} --report-json {}", settings, stage, report));
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("within 2% + 25 MiB"), std::string::npos) << r.out;
    expect_rss_within_plan(nlohmann::json::parse(test::read_file(report)), 2);
  }
  const std::string report = dir + "/single.json";
  const auto r = test::run_memfit(fmt::format("train {} --report-json {}", settings, report));
  ASSERT_EQ(r.status, 0) << r.err;
  expect_rss_within_plan(nlohmann::json::parse(test::read_file(report)), 1);
}

// A quantised base initialised at start-up: each weight is drawn and quantised a chunk at a
// time through the staging. Drawing a weight whole first (as memfit once did) put an fp32 copy
// of the largest one beside the plan: this model's gate_proj is 11264 x 1024, 44 MiB of fp32,
// and its run ended 50 MiB above its 80 MiB plan, outside the tolerance (about 26.6 MiB).
TEST(ProcessMemory, AQuantisedBaseIsQuantisedWithoutAWholeCopy) {
  const std::string dir = test::temp_dir(), config = dir + "/llama_wide_mlp.json";
  test::write_file(config, R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 8,
                               "num_key_value_heads": 8, "hidden_size": 1024, "intermediate_size": 11264,
                               "vocab_size": 256, "max_position_embeddings": 128, "rms_norm_eps": 1e-05,
                               "tie_word_embeddings": false})");
  const std::string report = dir + "/qlora.json";
  const auto r = test::run_memfit(fmt::format(
      "train --model {} --precision bf16 --attention flash --lora-rank 8 --lora-targets all-linear --quantize-base nf4 "
      "--double-quant --batch 2 --seq 64 --steps 2 --val-fraction 0 --log-every 0 --report-json {}",
      config, report));
  ASSERT_EQ(r.status, 0) << r.err;
  expect_rss_within_plan(nlohmann::json::parse(test::read_file(report)), 1);
}

}  // namespace
}  // namespace memfit
