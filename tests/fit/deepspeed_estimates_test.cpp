// The --compare row "deepspeed" against DeepSpeed 0.19.8's estimator functions, called by
// tools/make_deepspeed_estimates.py (tests/fixtures/deepspeed/estimates.json): the parameter
// counts DeepSpeed takes for gpt2, llama-2-7b and llama-2-70b (HF's, from transformers on the
// meta device), and estimate_zero2/zero3_model_states_mem_needs at 1, 8 and 64 GPUs with and
// without optimizer and parameter offload; then the same numbers through `memfit plan
// --hardware h100-80gb --world-size N --compare --json`.
#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fit/compare.hpp"
#include "graph/model_spec.hpp"
#include "support/paths.hpp"
#include "train/run_config.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

const nlohmann::json& fixture() {
  static const nlohmann::json j = [] {
    std::ifstream in(test::fixture_path("deepspeed/estimates.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

TEST(DeepSpeedEstimates, CountsAreThoseDeepSpeedTakesForTheHfModel) {
  for (const auto& [name, m] : fixture()["models"].items()) {
    const DeepSpeedCounts d = deepspeed_counts(resolve_model(name));
    EXPECT_EQ(d.params, m["params"].get<int64_t>()) << name;
    EXPECT_EQ(d.largest_layer, m["largest_layer_params"].get<int64_t>()) << name;
  }
}

TEST(DeepSpeedEstimates, FormulasEqualDeepSpeeds) {
  int rows = 0;
  for (const auto& [name, m] : fixture()["models"].items()) {
    const int64_t P = m["params"], L = m["largest_layer_params"];
    for (const auto& e : m["estimates"]) {
      const int per_node = e["gpus_per_node"], nodes = e["nodes"];
      const bool opt = e["offload_optimizer"], params = e["offload_params"];
      const HostDeviceBytes got = e["stage"] == 3 ? deepspeed_zero3_estimate(P, L, per_node, nodes, opt, params)
                                                  : deepspeed_zero2_estimate(P, per_node, nodes, opt);
      EXPECT_EQ(got.device, e["device"].get<uint64_t>()) << name << " " << e.dump();
      EXPECT_EQ(got.host, e["host"].get<uint64_t>()) << name << " " << e.dump();
      ++rows;
    }
  }
  EXPECT_EQ(rows, 3 * 3 * 5);
}

nlohmann::json deepspeed_row(const std::string& args) {
  const auto r = test::run_memfit("plan --hardware h100-80gb --precision bf16 --compare --json " + args);
  EXPECT_EQ(r.status, 0) << r.err;
  if (r.status != 0) return {};
  const nlohmann::json plan = nlohmann::json::parse(r.out);
  for (const auto& row : plan["compare"])
    if (row["tool"] == "deepspeed") return row;
  return {};
}

TEST(DeepSpeedEstimates, PlanCompareRowIsDeepSpeeds) {
  for (const auto& [name, m] : fixture()["models"].items())
    for (const auto& e : m["estimates"]) {
      if (e["offload_params"] && name != "gpt2") continue;  // one model covers the third variant
      const int gpus = e["gpus"], stage = e["stage"];
      std::string args = fmt::format("--model {} --world-size {} --zero {}", name, gpus, stage);
      if (e["offload_optimizer"]) args += " --offload-optimizer host";
      if (e["offload_params"]) args += " --offload-params host";
      const nlohmann::json row = deepspeed_row(args);
      ASSERT_FALSE(row.is_null()) << args;
      EXPECT_EQ(row["device_bytes"], e["device"]) << args;
      EXPECT_EQ(row["host_bytes"], e["host"]) << args;
    }
}

TEST(DeepSpeedEstimates, NoStageTwoFigureUnderAnotherStagesName) {
  EXPECT_TRUE(deepspeed_row("--model gpt2 --world-size 8 --zero 0").is_null());
  const nlohmann::json one = deepspeed_row("--model gpt2 --world-size 8 --zero 1");
  ASSERT_FALSE(one.is_null());
  EXPECT_NE(one["what"].get<std::string>().find("stages 1 and 2"), std::string::npos) << one.dump();
}

}  // namespace
}  // namespace memfit
