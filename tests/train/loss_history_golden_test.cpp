// Loss histories of the training paths, recorded bit for bit (support/loss_histories.hpp):
// every precision, attention form, recompute policy, accumulation, optimizer, clipping, the
// ZeRO stages at one rank, update-in-backward, the llama family, and the run scripts/demo
// makes. A refactor that changes one bit of any training or validation loss fails here.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>

#include "support/loss_histories.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

struct GoldenRun {
  std::string name;
  std::function<void(RunConfig&)> set;
};

RunConfig base_config() {
  RunConfig c;
  c.model = "gpt2-tiny";
  c.policy.batch = 2;
  c.policy.seq = 32;
  c.steps = 12;
  c.lr = 2e-3;
  c.eval_every = 6;
  c.eval_batches = 2;
  c.log_every = 0;
  return c;
}

const std::vector<GoldenRun>& golden_runs() {
  static const std::vector<GoldenRun> runs = {
      {"gpt2_fp32_plain", [](RunConfig&) {}},
      {"gpt2_fp32_flash", [](RunConfig& c) { c.policy.attention = AttentionKind::flash; }},
      {"gpt2_bf16_plain", [](RunConfig& c) { c.policy.precision = Precision::bf16; }},
      {"gpt2_bf16_flash_bf16_grads",
       [](RunConfig& c) {
         c.policy.precision = Precision::bf16;
         c.policy.attention = AttentionKind::flash;
         c.policy.grad_dtype = DType::bf16;
       }},
      {"gpt2_fp16_plain", [](RunConfig& c) { c.policy.precision = Precision::fp16; }},
      {"gpt2_fp16_flash_deepspeed_scaler",
       [](RunConfig& c) {
         c.policy.precision = Precision::fp16;
         c.policy.attention = AttentionKind::flash;
         c.loss_scale.convention = LossScaleConvention::deepspeed;
         c.loss_scale.initial_scale = 1 << 20;
       }},
      {"gpt2_recompute_full", [](RunConfig& c) { c.policy.recompute = parse_recompute("full"); }},
      {"gpt2_recompute_every2_flash",
       [](RunConfig& c) {
         c.policy.recompute = parse_recompute("every:2");
         c.policy.attention = AttentionKind::flash;
       }},
      {"gpt2_recompute_selective_all",
       [](RunConfig& c) { c.policy.recompute = parse_recompute("selective:attention,mlp_activation,norms"); }},
      {"gpt2_accum3_cosine",
       [](RunConfig& c) {
         c.policy.grad_accum = 3;
         c.lr_schedule = LrScheduleKind::cosine;
         c.warmup_steps = 3;
       }},
      {"gpt2_adamw8bit_clip",
       [](RunConfig& c) {
         c.policy.optimizer = OptimizerKind::adamw8bit;
         c.policy.grad_clip = 0.5;
       }},
      {"gpt2_bf16_adamw8bit_clip_accum2",
       [](RunConfig& c) {
         c.policy.precision = Precision::bf16;
         c.policy.optimizer = OptimizerKind::adamw8bit;
         c.policy.grad_clip = 1.0;
         c.policy.grad_accum = 2;
       }},
      {"gpt2_update_in_backward", [](RunConfig& c) { c.policy.update_in_backward = true; }},
      {"gpt2_zero1", [](RunConfig& c) { c.policy.zero_stage = 1; }},
      {"gpt2_zero2_accum2", [](RunConfig& c) {
         c.policy.zero_stage = 2;
         c.policy.grad_accum = 2;
       }},
      {"gpt2_zero3_bf16",
       [](RunConfig& c) {
         c.policy.zero_stage = 3;
         c.policy.precision = Precision::bf16;
       }},
      {"llama_fp32_plain", [](RunConfig& c) { c.model = "llama-tiny"; }},
      {"llama_fp32_flash_clip",
       [](RunConfig& c) {
         c.model = "llama-tiny";
         c.policy.attention = AttentionKind::flash;
         c.policy.grad_clip = 1.0;
       }},
      {"llama_bf16_flash_recompute_full",
       [](RunConfig& c) {
         c.model = "llama-tiny";
         c.policy.precision = Precision::bf16;
         c.policy.attention = AttentionKind::flash;
         c.policy.recompute = parse_recompute("full");
       }},
      {"llama_fp16_flash",
       [](RunConfig& c) {
         c.model = "llama-tiny";
         c.policy.precision = Precision::fp16;
         c.policy.attention = AttentionKind::flash;
       }},
  };
  return runs;
}

std::vector<float> losses_of(const nlohmann::json& report) {
  std::vector<float> out;
  for (const auto& l : report["loss"]["history"]) out.push_back(l.get<float>());
  for (const auto& v : report["validation"]["history"]) out.push_back(float(v["loss"].get<double>()));
  return out;
}

void expect_unchanged(const std::string& suite, const std::vector<GoldenRun>& golden) {
  test::LossHistories runs;
  for (const GoldenRun& g : golden) {
    RunConfig c = base_config();
    g.set(c);
    std::ostringstream log;
    runs[g.name] = losses_of(run_training(c, log));
  }
  const std::vector<std::string> problems = test::check_loss_histories(suite, runs, 2e-2);
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

TEST(LossHistoryGolden, EveryTrainingPathIsBitwiseUnchanged) { expect_unchanged("single_rank", golden_runs()); }

// A suite of its own, so that CTest runs it beside the others.
TEST(LossHistoryGolden, TheDemoRunIsBitwiseUnchanged) {
  // scripts/demo: gpt2-tiny, batch 8 x 128 at lr 2e-3, validation every 100; its first 100
  // steps (the demo runs 200; the learning rate is constant, so the first 100 losses and the
  // first validation are the demo's own).
  expect_unchanged("demo", {{"demo", [](RunConfig& c) {
                               c.policy.batch = 8;
                               c.policy.seq = 128;
                               c.steps = 100;
                               c.eval_every = 100;
                               c.eval_batches = 4;
                             }}});
}

}  // namespace
}  // namespace memfit
