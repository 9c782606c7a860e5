// `memfit plan --hardware PRESET --world-size N --tensor-parallel T` plans one rank's share of a
// tensor-parallel run. Oracle: GPT-2 124M's parameter elements per rank at T = 4 in closed form
// (every split matrix and vocabulary a quarter, the positions, norms and row-parallel biases
// whole), and the same bytes for the gradients and twice for AdamW's two moments (fp32, stage 0);
// the step's tokens are those of world / T replicas.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

TEST(TensorParallelPlan, HardwarePresetPlansTheRankSlice) {
  const auto r = test::run_memfit(
      "plan --model gpt2 --batch 4 --seq 64 --hardware h100-80gb --world-size 8 --tensor-parallel 4 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const int64_t C = 768, Vp = 50304, T = 1024, F = 3072, L = 12, t = 4;
  const int64_t per_layer = 4 * C                 // two layernorms
                            + 3 * C * C / t + 3 * C / t  // c_attn, split by heads
                            + C * C / t + C            // attn.c_proj: columns split, bias whole
                            + F * C / t + F / t        // mlp.c_fc
                            + C * F / t + C;           // mlp.c_proj
  const int64_t elements = Vp * C / t + T * C + L * per_layer + 2 * C;
  const auto& device = j["estimate"]["per_rank"]["by_tier"]["device"];
  EXPECT_EQ(device["parameters"].get<int64_t>(), 4 * elements);
  EXPECT_EQ(device["gradients"].get<int64_t>(), 4 * elements);
  EXPECT_EQ(device["optimizer_state"].get<int64_t>(), 8 * elements);
  EXPECT_EQ(j["model"]["parameters"].get<int64_t>(), 124475904) << "the model's count, not the rank's";
  // Throughput counts the tokens of the 2 model replicas (a tensor group's 4 ranks share theirs).
  const auto& step = j["estimate"]["step"];
  EXPECT_NEAR(step["tokens_per_second"].get<double>() * step["seconds"].get<double>(), 2.0 * 4 * 64, 1e-6);
}

TEST(TensorParallelPlan, RefusesWhatItDoesNotSearchYet) {
  auto r = test::run_memfit("plan --model gpt2 --hardware h100-80gb --world-size 8 --tensor-parallel 4 --fit");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--fit, --compare, --emit and --framework do not search"), std::string::npos) << r.err;
  r = test::run_memfit("plan --model gpt2 --hardware h100-80gb --world-size 8 --tensor-parallel 8");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("a tensor-parallel degree of 8 needs the attention heads of model 'gpt2' divisible by it "
                       "(got 12)"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace memfit
