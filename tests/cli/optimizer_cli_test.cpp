// The optimizer flags end to end through the memfit binary: a run with 8-bit AdamW, gradient
// clipping, accumulation and a cosine schedule reports measured == planned memory, the
// learning rate of every step (against the closed form), the gradient norm of every step,
// and the optimizer state that `plan` reports too; the config-file keys of DeepSpeed
// (gradient_clipping, optimizer.type) mean the same as the flags; bad values are one line.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>

#include <nlohmann/json.hpp>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

using test::run_memfit;
using test::temp_dir;
using test::write_file;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(OptimizerCli, EightBitClippedAccumulatedCosineRun) {
  const std::string report = temp_dir() + "/r.json";
  const std::string flags =
      "--model gpt2-tiny --batch 2 --seq 32 --grad-accum 2 --optimizer adamw8bit --grad-clip 1.0";
  const auto r = run_memfit("train " + flags +
                            " --steps 12 --lr 3e-3 --lr-schedule cosine --warmup 2 --min-lr 3e-4 --decay-steps 10"
                            " --log-every 4 --report-json " + report);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = read_json(report);
  const auto& mem = j["memory"];
  EXPECT_EQ(mem["planned_peak_bytes"]["device"], mem["measured_peak_bytes"]["device"]);
  EXPECT_EQ(j["policy"]["optimizer"], "adamw8bit");
  EXPECT_EQ(j["policy"]["grad_clip"], 1.0);
  EXPECT_LT(j["loss"]["last"].get<double>(), j["loss"]["first"].get<double>() - 0.5);

  const auto& lrs = j["lr_history"];
  ASSERT_EQ(lrs.size(), 12u);
  for (int step = 1; step <= 12; ++step) {
    const double progress = std::min(1.0, double(step - 2) / 8.0);
    const double want = step <= 2 ? 3e-3 * step / 2 : 3e-4 + 2.7e-3 * 0.5 * (1 + std::cos(std::numbers::pi * progress));
    EXPECT_NEAR(lrs[size_t(step - 1)].get<double>(), want, 1e-12) << "step " << step;
  }
  const auto& norms = j["grad_norm_history"];
  ASSERT_EQ(norms.size(), 12u);
  for (const auto& n : norms) EXPECT_GT(n.get<double>(), 0.0);
  EXPECT_NE(r.out.find("| norm "), std::string::npos) << r.out;

  const auto p = run_memfit("plan --json " + flags);
  ASSERT_EQ(p.status, 0) << p.err;
  const auto pj = nlohmann::json::parse(p.out);
  EXPECT_EQ(pj["memory"]["planned_peak_bytes"], mem["planned_peak_bytes"]);
  EXPECT_EQ(pj["memory"]["optimizer_state_bytes"], mem["optimizer_state_bytes"]);
  EXPECT_GT(mem["optimizer_state_bytes_per_parameter"].get<double>(), 2.03);
  EXPECT_LT(mem["optimizer_state_bytes_per_parameter"].get<double>(), 2.1);
}

TEST(OptimizerCli, DeepSpeedKeysMeanTheFlags) {
  const std::string config = temp_dir() + "/ds.json";
  write_file(config, R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                         "gradient_clipping": 0.5, "optimizer": {"type": "AdamW8bit", "params": {"lr": 1e-3}}})");
  const auto from_file = run_memfit("plan --json --seq 32 --config " + config);
  const auto from_flags = run_memfit("plan --json --seq 32 --batch 2 --grad-accum 2 --grad-clip 0.5 --optimizer adamw8bit");
  ASSERT_EQ(from_file.status, 0) << from_file.err;
  ASSERT_EQ(from_flags.status, 0) << from_flags.err;
  const auto a = nlohmann::json::parse(from_file.out), b = nlohmann::json::parse(from_flags.out);
  EXPECT_EQ(a["policy"], b["policy"]);
  EXPECT_EQ(a["memory"], b["memory"]);
  EXPECT_EQ(a["policy"]["grad_clip"], 0.5);
}

TEST(OptimizerCli, BadValuesGiveOneLine) {
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"train --steps 2 --lr-schedule linear", "schedule 'linear'"},
           {"train --steps 2 --lr-schedule cosine --min-lr 1", "--min-lr"},
           {"train --steps 2 --lr-schedule cosine --warmup 5", "--decay-steps"},
           {"train --steps 2 --grad-clip -1", "--grad-clip must be a number >= 0"},
           {"plan --optimizer sgd", "optimizer 'sgd'"}}) {
    const auto r = run_memfit(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.out << r.err;
    EXPECT_EQ(r.err.rfind("memfit: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace memfit
