// Loss histories of data-parallel runs (CTest runs this with 2 and 4 ranks), recorded bit for
// bit per world size (support/loss_histories.hpp): ZeRO stages 0..3 with and without overlap,
// 16-bit, clipping, accumulation and the llama family. Rank 0 compares; every rank runs.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>

#include <fmt/format.h>

#include "dist/communicator.hpp"
#include "support/loss_histories.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

Communicator& comm() {
  static std::unique_ptr<Communicator> c = make_mpi_communicator();
  return *c;
}

struct GoldenRun {
  std::string name;
  std::function<void(RunConfig&)> set;
};

TEST(LossHistoryGoldenRanks, EveryZeroStageIsBitwiseUnchanged) {
  const std::vector<GoldenRun> golden = {
      {"zero0", [](RunConfig& c) { c.policy.zero_stage = 0; }},
      {"zero0_blocking", [](RunConfig& c) { c.policy.overlap_comm = false; }},
      {"zero1_clip", [](RunConfig& c) {
         c.policy.zero_stage = 1;
         c.policy.grad_clip = 0.5;
       }},
      {"zero2_accum2", [](RunConfig& c) {
         c.policy.zero_stage = 2;
         c.policy.grad_accum = 2;
       }},
      {"zero3", [](RunConfig& c) { c.policy.zero_stage = 3; }},
      {"zero3_bf16_adamw8bit", [](RunConfig& c) {
         c.policy.zero_stage = 3;
         c.policy.precision = Precision::bf16;
         c.policy.optimizer = OptimizerKind::adamw8bit;
       }},
      {"zero2_fp16_flash", [](RunConfig& c) {
         c.policy.zero_stage = 2;
         c.policy.precision = Precision::fp16;
         c.policy.attention = AttentionKind::flash;
       }},
      {"llama_zero3_flash", [](RunConfig& c) {
         c.model = "llama-tiny";
         c.policy.zero_stage = 3;
         c.policy.attention = AttentionKind::flash;
       }},
  };
  test::LossHistories runs;
  for (const GoldenRun& g : golden) {
    RunConfig c;
    c.model = "gpt2-tiny";
    c.policy.batch = 2;
    c.policy.seq = 32;
    c.steps = 10;
    c.lr = 2e-3;
    c.eval_every = 5;
    c.eval_batches = 1;
    c.log_every = 0;
    g.set(c);
    std::ostringstream log;
    const nlohmann::json report = run_training(c, log, nullptr, &comm());
    std::vector<float>& losses = runs[g.name];
    for (const auto& l : report["loss"]["history"]) losses.push_back(l.get<float>());
    for (const auto& v : report["validation"]["history"]) losses.push_back(float(v["loss"].get<double>()));
  }
  if (comm().rank() != 0) return;
  const std::vector<std::string> problems =
      test::check_loss_histories(fmt::format("ranks_{}", comm().size()), runs, 2e-2);
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (memfit::comm().rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
