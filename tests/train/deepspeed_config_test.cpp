// DeepSpeed configs as people write them: DeepSpeed's own schedulers (their learning rates per
// step recorded from deepspeed.runtime.lr_schedules by tools/make_deepspeed_schedule_fixture.py),
// the ZeRO examples of DeepSpeed's documentation, the HF Trainer's "auto" config, the batch-key
// rule, and the one-line refusals of everything memfit cannot honour.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"
#include "train/deepspeed_config.hpp"
#include "train/run_config.hpp"

namespace memfit {
namespace {

using nlohmann::json;

RunConfig config_of(const json& j) {
  static int counter = 0;
  const std::string path = test::temp_dir() + "/ds" + std::to_string(counter++) + ".json";
  test::write_file(path, j.dump(2));
  RunConfig c;
  apply_config_file(path, c);
  return c;
}

std::string config_error(const json& j) {
  try {
    (void)config_of(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(DeepSpeedConfig, SchedulersGiveDeepSpeedsLearningRateAtEveryStep) {
  std::ifstream in(test::fixture_path("deepspeed/schedules.json"));
  const json fixture = json::parse(in);
  ASSERT_GE(fixture["cases"].size(), 6u);
  for (const json& c : fixture["cases"]) {
    SCOPED_TRACE(c["scheduler"].dump());
    RunConfig config = config_of({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", c["optimizer_lr"]}}}}},
                                  {"scheduler", c["scheduler"]},
                                  {"train_iters", fixture["steps"]}});
    const LrSchedule s = lr_schedule_of(config);
    EXPECT_TRUE(s.deepspeed());
    const json& lrs = c["lrs"];
    for (size_t k = 0; k < lrs.size(); ++k)
      EXPECT_NEAR(s.at(int64_t(k) + 1), lrs[k].get<double>(), 1e-15 + 1e-12 * lrs[k].get<double>()) << "step " << k + 1;
  }
}

// DeepSpeed's ZeRO tutorial, stage 2 block as written there (bucket sizes as 5e8 floats).
const json kZero2 = json::parse(R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "zero_optimization": {
    "stage": 2,
    "allgather_partitions": true,
    "allgather_bucket_size": 5e8,
    "overlap_comm": true,
    "reduce_scatter": true,
    "reduce_bucket_size": 5e8,
    "contiguous_gradients": true
  }
})");

TEST(DeepSpeedConfig, DocumentedZeroExamplesAreReadAsDeepSpeedMeansThem) {
  const RunConfig c = config_of(kZero2);
  EXPECT_EQ(c.policy.zero_stage, 2);
  EXPECT_TRUE(c.policy.overlap_comm);
  EXPECT_EQ(c.zero_bounds.reduce_bucket, 500'000'000);
  EXPECT_EQ(c.zero_bounds.allgather_bucket, 500'000'000);
  // Stage 3 as DeepSpeed's tutorial writes it: refused at the one key memfit cannot honour.
  const json zero3 = json::parse(R"({"zero_optimization": {
    "stage": 3, "contiguous_gradients": true, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
    "stage3_prefetch_bucket_size": 1e7, "stage3_param_persistence_threshold": 1e5, "reduce_bucket_size": 1e7,
    "sub_group_size": 1e9, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})");
  const std::string error = config_error(zero3);
  EXPECT_NE(error.find("'zero_optimization.stage3_param_persistence_threshold'"), std::string::npos) << error;
  json zero3_whole = zero3;
  zero3_whole["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  const RunConfig c3 = config_of(zero3_whole);
  EXPECT_EQ(c3.policy.zero_stage, 3);
  EXPECT_EQ(c3.policy.offload_optimizer, Tier::host);
  EXPECT_EQ(c3.policy.offload_params, Tier::host);
  EXPECT_EQ(c3.zero_bounds.prefetch_bucket, 10'000'000);
}

// ZeRO-Infinity's optimizer offload to NVMe, as DeepSpeed's documentation writes it: the tier,
// the directory and the I/O settings, which memfit runs (tests/train/offload_test.cpp).
TEST(DeepSpeedConfig, NvmeOffloadAndAioKeysMeanWhatTheySayInDeepSpeed) {
  const RunConfig c = config_of(json::parse(R"({
    "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme",
                          "pin_memory": true, "buffer_count": 4, "fast_init": false}},
    "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 1, "single_submit": false,
            "overlap_events": true, "use_gds": false}})"));
  EXPECT_EQ(c.policy.offload_optimizer, Tier::disk);
  EXPECT_EQ(c.offload_dir, "/local_nvme");
  EXPECT_EQ(c.disk_io.block_size, 262144u);
  EXPECT_EQ(c.disk_io.queue_depth, 32);
  EXPECT_EQ(c.offload_optimizer_keys.buffer_count, 4);
  // Read, but memfit's plan sizes the staging: the run log says so rather than staying silent.
  EXPECT_NE(c.deepspeed_note.find("offload_optimizer.buffer_count is read but bounds nothing"), std::string::npos)
      << c.deepspeed_note;
  EXPECT_NE(config_error(json::parse(R"({"aio": {"block_size": 5000}})")).find("multiple of 4096"), std::string::npos);
  EXPECT_NE(config_error(json::parse(R"({"aio": {"use_gds": true}})")).find("GPU"), std::string::npos);
  EXPECT_NE(config_error(json::parse(R"({"aio": {"queue_deep": 8}})")).find("unknown key 'aio.queue_deep'"),
            std::string::npos);
}

TEST(DeepSpeedConfig, HfTrainersAutoConfigLeavesTheSettingsToMemfit) {
  const json hf = json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 2, "allgather_partitions": true, "allgather_bucket_size": 2e8,
                          "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 2e8,
                          "contiguous_gradients": true},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false})");
  RunConfig c = config_of(hf);
  const RunConfig defaults;
  EXPECT_EQ(c.policy.precision, defaults.policy.precision);
  EXPECT_EQ(c.lr, defaults.lr);
  EXPECT_EQ(c.policy.adamw.beta2, defaults.policy.adamw.beta2);
  EXPECT_EQ(c.policy.grad_clip, defaults.policy.grad_clip);
  EXPECT_EQ(c.log_every, 2000);
  EXPECT_EQ(c.lr_schedule, LrScheduleKind::deepspeed_warmup);
  std::string note;
  resolve_batch_keys(c, 1, note);
  EXPECT_EQ(c.policy.batch, defaults.policy.batch);
  EXPECT_TRUE(note.empty()) << note;
  // And it trains: memfit train with the file.
  const std::string path = test::temp_dir() + "/hf_auto.json";
  test::write_file(path, hf.dump());
  const auto r = test::run_memfit("train --config " + path + " --steps 2 --batch 2 --seq 32");
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(DeepSpeedConfig, AnyTwoBatchKeysDetermineTheThird) {
  auto resolved = [](std::optional<int64_t> global, std::optional<int64_t> micro, std::optional<int64_t> accum, int W) {
    RunConfig c;
    c.file_batch = {global, micro, accum};
    std::string note;
    resolve_batch_keys(c, W, note);
    return std::pair{c.policy.batch, int64_t(c.policy.grad_accum)};
  };
  EXPECT_EQ(resolved(64, 4, std::nullopt, 2), (std::pair<int64_t, int64_t>{4, 8}));
  EXPECT_EQ(resolved(64, std::nullopt, 4, 2), (std::pair<int64_t, int64_t>{8, 4}));
  EXPECT_EQ(resolved(64, std::nullopt, std::nullopt, 4), (std::pair<int64_t, int64_t>{16, 1}));
  EXPECT_EQ(resolved(std::nullopt, 4, 3, 2), (std::pair<int64_t, int64_t>{4, 3}));
  EXPECT_EQ(resolved(48, 4, 3, 4), (std::pair<int64_t, int64_t>{4, 3}));
  for (const auto& [global, micro, accum, W, part] :
       {std::tuple{int64_t(50), int64_t(4), int64_t(0), 2, "not divisible"},
        std::tuple{int64_t(48), int64_t(4), int64_t(3), 2, "does not equal"}}) {
    try {
      resolved(global, micro, accum > 0 ? std::optional<int64_t>(accum) : std::nullopt, W);
      ADD_FAILURE() << "no error for " << global;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("train_batch_size"), std::string::npos) << e.what();
    }
  }
  // --batch wins over the file and says so.
  RunConfig c;
  c.file_batch = {32, 4, std::nullopt};
  c.policy.batch = 8;
  c.batch_flag = true;
  std::string note;
  resolve_batch_keys(c, 1, note);
  EXPECT_EQ(c.policy.batch, 8);
  EXPECT_EQ(c.policy.grad_accum, 4);
  EXPECT_NE(note.find("--batch 8 replaces train_micro_batch_size_per_gpu 4"), std::string::npos) << note;
}

TEST(DeepSpeedConfig, NothingIsSilentlyIgnored) {
  const struct {
    json config;
    const char* part;
  } cases[] = {
      {{{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}, {"pin_memroy", true}}}}}},
       "unknown key 'zero_optimization.offload_optimizer.pin_memroy'"},
      {{{"zero_optimization", {{"reduce_scatter", false}}}}, "'zero_optimization.reduce_scatter'"},
      {{{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.3}}}}}}, "ratio below 1"},
      {{{"activation_checkpointing", {{"cpu_checkpointing", true}}}}, "'activation_checkpointing.cpu_checkpointing'"},
      {{{"activation_checkpointing", {{"partition_activation", false}}}}, "unknown key 'activation_checkpointing"},
      {{{"scheduler", {{"type", "OneCycle"}}}}, "scheduler 'OneCycle' is not supported"},
      {{{"scheduler", {{"type", "WarmupLR"}, {"params", {{"total_num_steps", 10}}}}}}, "scheduler.params.total_num_steps"},
      {{{"amp", {{"enabled", true}}}}, "key 'amp'"},
      {{{"tensorboard", {{"enabled", true}}}}, "key 'tensorboard'"},
      {{{"optimizer", {{"type", "Lamb"}}}}, "optimizer 'Lamb'"},
      {{{"fp16", {{"enabled", true}, {"loss_scale_windows", 100}}}}, "unknown key 'fp16.loss_scale_windows'"},
  };
  for (const auto& c : cases) {
    const std::string error = config_error(c.config);
    EXPECT_NE(error.find(c.part), std::string::npos) << c.config.dump() << " -> " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  // activation_checkpointing alone turns on memfit's full recomputation.
  EXPECT_EQ(config_of({{"activation_checkpointing", {{"partition_activations", false}, {"number_checkpoints", 4}}}})
                .policy.recompute.mode,
            RecomputeMode::full);
}

TEST(DeepSpeedConfig, BucketBoundsBelowALayerAreRefusedWithBothSizes) {
  // gpt2-tiny's largest layer bucket is the embeddings' (256 + 256 positions) x 128, far above 1000.
  const std::string path = test::temp_dir() + "/small_bucket.json";
  test::write_file(path, R"({"zero_optimization": {"stage": 1, "reduce_bucket_size": 1000}})");
  const auto r = test::run_memfit("plan --config " + path);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("zero_optimization.reduce_bucket_size"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not 1000"), std::string::npos) << r.err;
  test::write_file(path, kZero2.dump());
  EXPECT_EQ(test::run_memfit("plan --config " + path).status, 0);
}

}  // namespace
}  // namespace memfit
