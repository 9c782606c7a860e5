// `--load-adapter DIR` on the commands that only plan: the plan must be the one of the run
// that `train --load-adapter DIR` executes, so the adapter's LoRA (r, lora_alpha,
// target_modules) is planned even when no --lora-* flag is given.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/paths.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

using test::fixture_path;
using test::run_memfit;
using test::temp_dir;

const std::string kBase = fixture_path("llama_tiny_torch");
const std::string kAdapter = fixture_path("lora_llama_tiny_torch");

// An llm.c token file (magic 20240520, version 1, uint16 tokens) of seeded random ids.
std::string write_tokens(const std::string& dir, int64_t n, int vocab) {
  const std::string path = dir + "/tokens.bin";
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = int32_t(n);
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  std::mt19937 gen(7);
  for (auto& t : tokens) t = uint16_t(gen() % uint32_t(vocab));
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size() * 4));
  out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  return path;
}

double eval_loss(const std::string& args, const std::string& report) {
  const auto r = run_memfit("eval --batch 2 --seq 32 --report-json " + report + " " + args);
  EXPECT_EQ(r.status, 0) << r.err;
  if (r.status != 0) return NAN;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["memory"]["planned_peak_bytes"], j["memory"]["measured_peak_bytes"]);
  return j["loss"].get<double>();
}

nlohmann::json plan_json(const std::string& args) {
  const auto r = run_memfit("plan --json --batch 2 --seq 16 " + args);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

TEST(AdapterCli, PlanWithLoadAdapterPlansTheAdaptersLora) {
  const std::string model = "--model " + fixture_path("llama_tiny_torch/config.json");
  const std::string adapter = fixture_path("lora_llama_tiny_torch");
  const auto loaded = plan_json(model + " --load-adapter " + adapter);
  // The adapter's own settings (tests/fixtures/lora_llama_tiny_torch/adapter_config.json).
  const auto flags = plan_json(model + " --lora-rank 4 --lora-alpha 8 --lora-targets "
                                       "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj");
  const auto plain = plan_json(model);
  ASSERT_FALSE(loaded.is_null() || flags.is_null() || plain.is_null());
  EXPECT_EQ(loaded.dump(), flags.dump());
  EXPECT_NE(loaded.dump(), plain.dump());
}

TEST(AdapterCli, PlanRefusesAnAdapterThatDisagreesWithTheFlags) {
  const auto r = run_memfit("plan --model " + fixture_path("llama_tiny_torch/config.json") +
                            " --lora-rank 8 --load-adapter " + fixture_path("lora_llama_tiny_torch"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--lora-rank 8 but the adapter"), std::string::npos) << r.err;
}

// `eval --load-adapter` evaluates the model with its adapter: the LoRA branch computed beside
// the base equals the same adapter merged into the weights (merge-lora, whose output
// transformers loads: tests/train/lora_roundtrip), and differs from the base alone.
TEST(AdapterCli, EvalWithAdapterEqualsEvalOfTheMergedWeights) {
  const std::string dir = temp_dir();
  const std::string model = "--model " + kBase + "/config.json";
  const std::string data = " --data " + write_tokens(dir, 4 * 2 * 32 + 1, 250);
  const auto merged = run_memfit("merge-lora " + model + " --load " + kBase + "/model.safetensors --adapter " +
                                 kAdapter + " --out " + dir + "/merged");
  ASSERT_EQ(merged.status, 0) << merged.err;
  const double with_adapter =
      eval_loss(model + " --load " + kBase + "/model.safetensors --load-adapter " + kAdapter + data, dir + "/a.json");
  const double of_merged = eval_loss(model + " --load " + dir + "/merged" + data, dir + "/m.json");
  const double base = eval_loss(model + " --load " + kBase + "/model.safetensors" + data, dir + "/b.json");
  EXPECT_NEAR(with_adapter, of_merged, 1e-5 * of_merged);
  EXPECT_GT(std::fabs(with_adapter - base), 1e-3) << "the adapter changed nothing: was it evaluated?";
}

}  // namespace
}  // namespace memfit
