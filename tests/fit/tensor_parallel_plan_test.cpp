// `memfit plan --hardware PRESET --world-size N --tensor-parallel T` plans one rank's share of a
// tensor-parallel run. Oracle: GPT-2 124M's parameter elements per rank at T = 4 in closed form
// (every split matrix and vocabulary a quarter, the positions, norms and row-parallel biases
// whole), and the same bytes for the gradients and twice for AdamW's two moments (fp32, stage 0);
// the step's tokens are those of world / T replicas.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

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

// --fit searches tensor parallelism within a node, for a run of every weight (llama-2-7b on 2
// nodes of 4 A100-40GB, where tensor 2 and 4 with sequence parallelism rank first) and for LoRA
// adapters (llama-2-13b on 4 A100-40GB at 4096 tokens, where tensor 2 ranks among the five). Oracle: each tensor-parallel candidate is what `plan --tensor-parallel T
// --sequence-parallel` with its settings plans and estimates, byte for byte and token for token.
void expect_tensor_parallel_candidates_replan_the_same(const std::string& cluster) {
  const auto r = test::run_memfit("plan " + cluster + " --fit --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto fit = nlohmann::json::parse(r.out)["fit"];
  int tensor_parallel = 0;
  for (const auto& c : fit["ranked"]) {
    const int t = c["tensor_parallel"].get<int>();
    if (t == 1) continue;
    ++tensor_parallel;
    // "bf16 flash recompute=R adamw zero=S offload=none [lora=r16:all-linear] tensor=T+sequence"
    std::istringstream words(c["family"].get<std::string>());
    std::string precision, attention, recompute, optimizer, zero, offload, tensor;
    words >> precision >> attention >> recompute >> optimizer >> zero >> offload >> tensor;
    if (tensor.starts_with("lora=")) words >> tensor;
    ASSERT_EQ(tensor, "tensor=" + std::to_string(t) + "+sequence") << c["family"];
    const std::string args = fmt::format(
        "plan {} --batch {} --grad-accum {} --precision {} --grad-dtype {} --attention {} --recompute {} --optimizer {} "
        "--zero {} --tensor-parallel {} --sequence-parallel --json",
        cluster, c["batch"].get<int64_t>(), c["grad_accum"].get<int64_t>(), precision,
        precision == "bf16" ? "bf16" : "fp32", attention, recompute.substr(10), optimizer, zero.substr(5), t);
    const auto again = test::run_memfit(args);
    ASSERT_EQ(again.status, 0) << args << "\n" << again.err;
    const auto plan = nlohmann::json::parse(again.out);
    EXPECT_EQ(plan["tensor_parallel"].get<int>(), t);
    EXPECT_EQ(plan["estimate"]["per_rank"]["device_bytes"], c["estimate"]["per_rank"]["device_bytes"]) << args;
    EXPECT_EQ(plan["estimate"]["step"]["tokens_per_second"], c["estimate"]["step"]["tokens_per_second"]) << args;
  }
  EXPECT_GT(tensor_parallel, 0) << r.out;
}

TEST(TensorParallelPlan, FitSearchesTheDegreeAndItsCandidatesReplanTheSame) {
  expect_tensor_parallel_candidates_replan_the_same(
      "--model llama-2-7b --seq 2048 --hardware a100-40gb --gpus-per-node 4 --nodes 2");
}

TEST(TensorParallelPlan, FitSearchesTheDegreeForLora) {
  expect_tensor_parallel_candidates_replan_the_same(
      "--model llama-2-13b --seq 4096 --hardware a100-40gb --gpus-per-node 4 --nodes 1 --lora-rank 16 "
      "--lora-targets all-linear");
}

TEST(TensorParallelPlan, RefusesWhatItDoesNotSearchYet) {
  auto r = test::run_memfit("plan --model gpt2 --hardware h100-80gb --world-size 8 --tensor-parallel 4 --fit");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--fit searches the degree itself"), std::string::npos) << r.err;
  r = test::run_memfit("plan --model gpt2 --hardware h100-80gb --world-size 8 --tensor-parallel 8");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("a tensor-parallel degree of 8 needs the attention heads of model 'gpt2' divisible by it "
                       "(got 12)"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace memfit
