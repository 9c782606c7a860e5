// `memfit eval` against PyTorch: the committed fixtures' batch written as a token file gives
// the fixture's loss; the plan holds parameters and activations only (no gradient, master
// weight or optimizer state) and is measured equal; bad input is one line.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"
#include "io/token_file.hpp"
#include "support/paths.hpp"
#include "support/run_cli.hpp"

namespace memfit {
namespace {

// The fixture's batch is one flat sequence of B*T+1 tokens (targets are tokens shifted by one).
std::string fixture_tokens_file(const std::string& fixture, int64_t* batch, int64_t* seq) {
  const SafetensorsReader b(test::fixture_path(fixture + "/batch.safetensors"));
  const SafetensorsEntry* tokens = b.find("tokens");
  const SafetensorsEntry* targets = b.find("targets");
  *batch = tokens->shape[0], *seq = tokens->shape[1];
  const int64_t n = tokens->shape.numel();
  std::vector<int32_t> t(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  std::memcpy(t.data(), b.data(*tokens), t.size() * 4);
  std::memcpy(y.data(), b.data(*targets), y.size() * 4);
  std::vector<uint16_t> flat(t.begin(), t.end());
  flat.push_back(uint16_t(y.back()));
  for (int64_t i = 0; i + 1 < n; ++i) EXPECT_EQ(y[size_t(i)], t[size_t(i + 1)]) << "not one flat sequence";
  const std::string path = test::temp_dir() + "/" + fixture + ".bin";
  write_llmc_tokens(path, flat);
  return path;
}

float fixture_loss(const std::string& fixture) {
  const SafetensorsReader e(test::fixture_path(fixture + "/expected.safetensors"));
  float loss = 0;
  e.read_f32("loss", Shape{}, &loss);
  return loss;
}

class EvalParity : public ::testing::TestWithParam<const char*> {};

TEST_P(EvalParity, GivesPyTorchsLossWithNoTrainingMemory) {
  const std::string fixture = GetParam(), dir = test::fixture_path(fixture);
  int64_t B = 0, T = 0;
  const std::string data = fixture_tokens_file(fixture, &B, &T);
  const std::string report = test::temp_dir() + "/" + fixture + ".json";
  const auto r = test::run_memfit(fmt::format("eval --model {}/config.json --load {} --data {} --batch {} --seq {} "
                                              "--report-json {}", dir, dir, data, B, T, report));
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  const double expected = fixture_loss(fixture);
  EXPECT_NEAR(j["loss"].get<double>(), expected, 1e-5 * expected);
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(expected), 1e-4 * std::exp(expected));
  EXPECT_EQ(j["batches"], 1);
  const auto& planned = j["memory"]["planned_by_category"];
  EXPECT_EQ(planned["parameters"].get<int64_t>(), 4 * j["parameters"].get<int64_t>());  // fp32, one copy
  for (const char* absent : {"gradients", "master_weights", "optimizer_state"}) EXPECT_EQ(planned[absent], 0) << absent;
  EXPECT_EQ(j["memory"]["measured_peak_bytes"], j["memory"]["planned_peak_bytes"]);
  EXPECT_NE(r.out.find("perplexity"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EvalParity,
                         ::testing::Values("gpt2_tiny_torch", "llama_tiny_torch", "qwen2_tiny_torch",
                                           "llama31_tiny_torch"));

TEST(Eval, MixedPrecisionHoldsSixteenBitParametersAndNoMasters) {
  const std::string dir = test::fixture_path("gpt2_tiny_torch");
  int64_t B = 0, T = 0;
  const std::string data = fixture_tokens_file("gpt2_tiny_torch", &B, &T);
  const std::string report = test::temp_dir() + "/bf16.json";
  const auto r = test::run_memfit(fmt::format("eval --model {}/config.json --load {} --data {} --batch {} --seq {} "
                                              "--precision bf16 --report-json {}", dir, dir, data, B, T, report));
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["memory"]["planned_by_category"]["parameters"].get<int64_t>(), 2 * j["parameters"].get<int64_t>());
  EXPECT_EQ(j["memory"]["planned_by_category"]["master_weights"], 0);
  const double expected = fixture_loss("gpt2_tiny_torch");
  EXPECT_NEAR(j["loss"].get<double>(), expected, 2e-2 * expected);  // bf16 weights and activations
}

TEST(Eval, BadInputIsOneLine) {
  const std::string dir = test::fixture_path("gpt2_tiny_torch");
  auto expect_one_line = [](const test::CliResult& r, const std::string& part) {
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find(part), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  expect_one_line(test::run_memfit("eval --model " + dir + "/config.json --load " + dir), "needs --data");
  const std::string tiny = test::temp_dir() + "/tiny.bin";
  write_llmc_tokens(tiny, std::vector<uint16_t>{1, 2, 3, 4, 5});
  expect_one_line(test::run_memfit("eval --model " + dir + "/config.json --data " + tiny + " --batch 2 --seq 8"),
                  "fewer than one batch");
  expect_one_line(test::run_memfit("eval --model " + dir + "/config.json --data " + tiny + " --batches -1"),
                  "--batches");
}

}  // namespace
}  // namespace memfit
