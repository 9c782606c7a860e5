// The memfit binary end to end: a short training run whose report shows a falling loss and
// measured == planned device memory, `plan --json` agreeing with it, weights saved and
// loaded back, and bad input of every kind answered by one line on stderr and exit status 1
// (never a crash, never a saved file lost).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"
#include "support/paths.hpp"
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

void expect_one_line_error(const test::CliResult& r, const std::string& needle) {
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("memfit: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

TEST(Cli, TrainReportShowsFallingLossAndMeasuredEqualsPlanned) {
  const std::string report = temp_dir() + "/r.json";
  const auto r = run_memfit("train --model gpt2-tiny --steps 30 --batch 4 --seq 64 --lr 2e-3 --log-every 10 --report-json " + report);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = read_json(report);
  EXPECT_EQ(j["steps"], 30);
  EXPECT_LT(j["loss"]["last"].get<double>(), j["loss"]["first"].get<double>() - 1.0);
  EXPECT_EQ(j["loss"]["history"].size(), 30u);
  const auto& mem = j["memory"];
  EXPECT_EQ(mem["planned_peak_bytes"]["device"], mem["measured_peak_bytes"]["device"]);
  EXPECT_EQ(mem["planned_peak_bytes"]["host"], 0);
  EXPECT_GT(mem["max_rss_bytes"].get<uint64_t>(), mem["planned_peak_bytes"]["device"].get<uint64_t>());
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  EXPECT_EQ(j["model"]["parameters"], 858880);
  uint64_t sum = mem["planned_free_at_peak_bytes"];
  for (const auto& [cat, bytes] : mem["planned_by_category"].items()) sum += bytes.get<uint64_t>();
  EXPECT_EQ(sum, mem["planned_peak_bytes"]["device"].get<uint64_t>());

  // `plan` builds the same program: the same planned memory.
  const auto p = run_memfit("plan --json --model gpt2-tiny --batch 4 --seq 64");
  ASSERT_EQ(p.status, 0) << p.err;
  const auto pj = nlohmann::json::parse(p.out);
  EXPECT_EQ(pj["memory"]["planned_peak_bytes"], mem["planned_peak_bytes"]);
  EXPECT_EQ(pj["memory"]["planned_by_category"], mem["planned_by_category"]);
}

uint64_t planned_peak(const std::string& flags) {
  const auto p = run_memfit("plan --json --val-fraction 0 --model gpt2-tiny --batch 4 --seq 128 " + flags);
  EXPECT_EQ(p.status, 0) << p.err;
  return nlohmann::json::parse(p.out)["memory"]["planned_peak_bytes"]["device"].get<uint64_t>();
}

TEST(Cli, RecomputeAutoFitsTheBudgetAndTheRunMeasuresItsPlan) {
  // A budget half way between no recomputation and full recomputation.
  const uint64_t none = planned_peak(""), full = planned_peak("--recompute full");
  ASSERT_LT(full, none);
  const uint64_t budget = (none + full) / 2;
  const std::string report = temp_dir() + "/auto.json";
  const auto r = run_memfit("train --val-fraction 0 --model gpt2-tiny --steps 3 --batch 4 --seq 128 --recompute auto --memory-budget " +
                            std::to_string(budget) + " --report-json " + report);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("recompute auto: "), std::string::npos) << r.out;
  const auto j = read_json(report);
  EXPECT_EQ(j["policy"]["recompute"].get<std::string>().rfind("auto:", 0), 0u) << j["policy"]["recompute"];
  const uint64_t planned = j["memory"]["planned_peak_bytes"]["device"];
  EXPECT_LE(planned, budget);
  EXPECT_EQ(j["memory"]["measured_peak_bytes"]["device"], planned);
  // `plan` makes the same choice.
  const auto p = run_memfit("plan --json --val-fraction 0 --model gpt2-tiny --batch 4 --seq 128 --recompute auto --memory-budget " +
                            std::to_string(budget));
  ASSERT_EQ(p.status, 0) << p.err;
  const auto pj = nlohmann::json::parse(p.out);
  EXPECT_EQ(pj["policy"]["recompute"], j["policy"]["recompute"]);
  EXPECT_TRUE(pj["recompute_auto"]["fits"].get<bool>());
  EXPECT_EQ(pj["memory"]["planned_peak_bytes"]["device"], planned);
}

TEST(Cli, FlashAttentionWithRecomputationTrainsAndMeasuresItsPlan) {
  const std::string report = temp_dir() + "/flash.json";
  const auto r = run_memfit("train --val-fraction 0 --model gpt2-tiny --steps 3 --batch 2 --seq 200 --attention flash --recompute every:2 "
                            "--report-json " + report);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = read_json(report);
  EXPECT_EQ(j["policy"]["attention"], "flash");
  EXPECT_EQ(j["policy"]["recompute"], "every:2");
  EXPECT_EQ(j["memory"]["measured_peak_bytes"]["device"], j["memory"]["planned_peak_bytes"]["device"]);
}

TEST(Cli, SavedWeightsLoadBackAndResumeTheLoss) {
  const std::string dir = temp_dir() + "/saved";
  const auto a = run_memfit("train --steps 10 --batch 2 --seq 32 --save " + dir + " --report-json " + dir + ".json");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/config.json"));
  // Loading through the saved config.json gives the same model; the first loss of a run
  // starting from the saved weights is below the first loss from scratch.
  const auto b = run_memfit("train --model " + dir + " --load " + dir + " --steps 1 --batch 2 --seq 32 --report-json " +
                            dir + "2.json");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_LT(read_json(dir + "2.json")["loss"]["first"].get<double>(),
            read_json(dir + ".json")["loss"]["first"].get<double>() - 0.3);
}

// A llama model goes out in HF's layout (q, k and v projections apart, "model." names, the
// untied lm_head) and comes back as the same model: three AdamW steps from the PyTorch
// fixture's weights on its batch, saved, then loaded again, start at the loss PyTorch reached
// after the same three steps.
TEST(Cli, LlamaSavesHfTensorsAndLoadsBackAfterThreeSteps) {
  const std::string fixture = test::fixture_path("llama_tiny_torch"), d = temp_dir();
  const SafetensorsReader batch(fixture + "/batch.safetensors");
  std::vector<int32_t> tokens(64), targets(64);
  for (auto [name, dst] : {std::pair{"tokens", &tokens}, {"targets", &targets}}) {
    const SafetensorsEntry* e = batch.find(name);
    ASSERT_TRUE(e && e->end - e->begin == 64 * sizeof(int32_t)) << name;
    std::memcpy(dst->data(), batch.data(*e), 64 * sizeof(int32_t));
  }
  // The llm.c file of the batch: one flat sequence, targets shifted by one.
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = 65;
  std::vector<uint16_t> flat(tokens.begin(), tokens.end());
  flat.push_back(uint16_t(targets.back()));
  {
    std::ofstream out(d + "/batch.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(flat.data()), std::streamsize(flat.size() * 2));
  }
  const std::string common = " --data " + d + "/batch.bin --batch 2 --seq 32 --val-fraction 0 --lr 1e-3 "
                             "--weight-decay 0.1 --report-json " + d + "/r.json";
  auto r = run_memfit("train --model " + fixture + "/config.json --load " + fixture + " --steps 3 --save " + d +
                      "/saved" + common);
  ASSERT_EQ(r.status, 0) << r.err;
  const SafetensorsReader saved(d + "/saved/model.safetensors");
  const auto* q = saved.find("model.layers.1.self_attn.q_proj.weight");
  const auto* k = saved.find("model.layers.1.self_attn.k_proj.weight");
  const auto* head = saved.find("lm_head.weight");
  ASSERT_TRUE(q && k && head);
  EXPECT_EQ(q->shape, (Shape{64, 64}));
  EXPECT_EQ(k->shape, (Shape{32, 64}));  // 2 key/value heads of 16
  EXPECT_EQ(head->shape, (Shape{250, 64}));  // the real vocabulary, not memfit's padded 256 rows
  EXPECT_EQ(saved.entries().size(), SafetensorsReader(fixture + "/model.safetensors").entries().size());
  EXPECT_EQ(read_json(d + "/saved/config.json")["num_key_value_heads"], 2);

  r = run_memfit("train --model " + d + "/saved --load " + d + "/saved --steps 1" + common);
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<float> ref(4);
  SafetensorsReader(fixture + "/expected.safetensors").read_f32("losses_adamw", Shape{4}, ref.data());
  EXPECT_NEAR(read_json(d + "/r.json")["loss"]["first"].get<double>(), ref[3], 1e-4 * ref[3]);
}

// The ZeRO pass shards fp32 masters even in a world of one rank; a bf16 `--save` must still
// write the masters (gathered), not the bf16 parameters widened: the same file, byte for
// byte, as the unsharded run (on one rank every stage computes the same bits).
TEST(Cli, SaveUnderZeroOnOneRankWritesTheSameFile) {
  const std::string d = temp_dir();
  auto file_bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::string reference;
  for (int stage : {0, 1, 2, 3}) {
    const std::string path = d + "/zero" + std::to_string(stage) + ".safetensors";
    const auto r = run_memfit("train --steps 3 --batch 2 --seq 32 --precision bf16 --zero " + std::to_string(stage) +
                              " --save " + path);
    ASSERT_EQ(r.status, 0) << r.err;
    const std::string bytes = file_bytes(path);
    ASSERT_FALSE(bytes.empty());
    if (stage == 0) reference = bytes;
    else EXPECT_TRUE(bytes == reference) << "stage " << stage;
  }
}

TEST(Cli, BadInputGivesOneLineAndExitStatusOne) {
  const std::string d = temp_dir();
  expect_one_line_error(run_memfit("train --data " + d + "/missing.bin --steps 1"), "missing.bin");
  expect_one_line_error(run_memfit("train --model gpt2-nano --steps 1"), "unknown model 'gpt2-nano'");
  expect_one_line_error(run_memfit("train --seq 300 --steps 1"), "exceeds the context");
  expect_one_line_error(run_memfit("train --steps 1 --batch 64 --seq 256 --memory-budget 64MiB"), "budget");
  expect_one_line_error(run_memfit("plan --precision fp8"), "unknown precision");
  expect_one_line_error(run_memfit("train --steps 1 --precision bf16 --grad-dtype fp16"), "gradient dtype fp16");
  expect_one_line_error(run_memfit("plan --precision bf16 --fp32-ops no_such_op"), "no_such_op");
  expect_one_line_error(run_memfit("plan --recompute selective:softmax"), "unknown op 'softmax'");
  expect_one_line_error(run_memfit("plan --recompute every:zero"), "unknown recompute policy");
  expect_one_line_error(run_memfit("train --steps 1 --recompute auto --memory-budget 1MiB"), "budget");

  write_file(d + "/garbage.safetensors", "this is not a safetensors file at all");
  expect_one_line_error(run_memfit("train --steps 1 --load " + d + "/garbage.safetensors"), "safetensors");
  // A real checkpoint cut short.
  const std::string good = test::fixture_path("gpt2_tiny_torch/model.safetensors");
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_file(d + "/truncated.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_one_line_error(run_memfit("train --steps 1 --model " + test::fixture_path("gpt2_tiny_torch/config.json") +
                                   " --load " + d + "/truncated.safetensors"),
                        "safetensors");
  // Weights of another shape.
  expect_one_line_error(run_memfit("train --steps 1 --load " + good), "shape");

  write_file(d + "/bad.json", "{ \"batch\": 4, ");
  expect_one_line_error(run_memfit("train --steps 1 --config " + d + "/bad.json"), "not valid JSON");
  write_file(d + "/typo.json", "{ \"train_micro_batch_size_per_gpu\": 4, \"gradient_acumulation_steps\": 2 }");
  expect_one_line_error(run_memfit("train --steps 1 --config " + d + "/typo.json"), "gradient_acumulation_steps");

  write_file(d + "/short.txt", "too short");
  expect_one_line_error(run_memfit("train --steps 1 --data " + d + "/short.txt"), "tokens");
  // A token id outside the model's vocabulary (a uint16 file read by a 256-token model).
  std::string tokens;
  for (int i = 0; i < 20000; ++i) tokens += char(i % 256), tokens += char(i % 7 == 0 ? 1 : 0);
  write_file(d + "/wide.bin", tokens);
  expect_one_line_error(run_memfit("train --steps 1 --data " + d + "/wide.bin --data-format nanogpt"), "vocabulary");
}

// bf16: measured == planned, and `plan` shows what each category saves against fp32: the
// parameters exactly 2 bytes each, the masters cost 4 bytes each (858,880 parameters).
TEST(Cli, Bf16RunMeasuresItsPlanAndThePlanShowsTheSavings) {
  const std::string report = temp_dir() + "/bf16.json";
  const auto r = run_memfit("train --steps 5 --batch 2 --seq 32 --precision bf16 --report-json " + report);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = read_json(report);
  EXPECT_EQ(j["memory"]["planned_peak_bytes"]["device"], j["memory"]["measured_peak_bytes"]["device"]);
  EXPECT_EQ(j["policy"]["precision"], "bf16");
  EXPECT_FALSE(j.contains("loss_scaling"));  // bf16 needs none
  const auto p = run_memfit("plan --json --batch 2 --seq 32 --precision bf16 --grad-dtype bf16");
  ASSERT_EQ(p.status, 0) << p.err;
  const auto saved = nlohmann::json::parse(p.out)["compared_to_fp32"]["saved_bytes"];
  EXPECT_EQ(saved["parameters"], 2 * 858880);
  EXPECT_EQ(saved["master_weights"], -4 * 858880);
  EXPECT_EQ(saved["optimizer_state"], 0);
  EXPECT_GT(saved["activations"].get<int64_t>(), 0);
  const auto text = run_memfit("plan --batch 2 --seq 32 --precision bf16");
  EXPECT_NE(text.out.find("bf16 vs fp32"), std::string::npos) << text.out;
}

// fp16 with DeepSpeed's keys, starting at 2^32 (DeepSpeed's old default): the first steps
// overflow and are skipped while the scale comes down (hysteresis 2: the first overflow only
// uses up the hysteresis), then training proceeds; the report and the progress lines say so.
TEST(Cli, Fp16WithDeepSpeedKeysSkipsOverflowingSteps) {
  const std::string d = temp_dir();
  write_file(d + "/ds.json", R"({"train_micro_batch_size_per_gpu": 2, "seq": 32,
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 32, "loss_scale_window": 1000,
             "hysteresis": 2, "min_loss_scale": 1}})");
  const auto r = run_memfit("train --config " + d + "/ds.json --steps 30 --report-json " + d + "/r.json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("(overflow: step skipped)"), std::string::npos) << r.out;
  const auto j = read_json(d + "/r.json");
  const auto& ls = j["loss_scaling"];
  EXPECT_EQ(ls["convention"], "deepspeed");
  const int64_t skipped = ls["skipped_steps"];
  EXPECT_GE(skipped, 3);
  EXPECT_LT(skipped, 30);
  EXPECT_EQ(j["optimizer_steps_applied"], 30 - skipped);
  // The first steps overflow in a row; the first overflow only uses up the hysteresis, every
  // later one halves the scale (no growth within 30 steps restores the hysteresis).
  EXPECT_EQ(ls["skipped_at"][0], 1);
  EXPECT_EQ(ls["skipped_at"][1], 2);
  EXPECT_EQ(ls["skipped_at"][2], 3);
  EXPECT_EQ(ls["history"][0], 4294967296.0);
  EXPECT_EQ(ls["history"][1], 4294967296.0);
  EXPECT_EQ(ls["history"][2], 2147483648.0);
  EXPECT_EQ(ls["final_scale"].get<double>(), std::ldexp(1.0, 33 - int(skipped)));
  EXPECT_EQ(j["memory"]["planned_peak_bytes"]["device"], j["memory"]["measured_peak_bytes"]["device"]);
  EXPECT_LT(j["loss"]["last"].get<double>(), j["loss"]["first"].get<double>());

  write_file(d + "/bad.json", R"({"fp16": {"enabled": true, "loss_scale_windw": 10}})");
  expect_one_line_error(run_memfit("train --steps 1 --config " + d + "/bad.json"), "fp16.loss_scale_windw");
  write_file(d + "/bad2.json", R"({"bf16": {"enabled": true, "loss_scale": 10}})");
  expect_one_line_error(run_memfit("train --steps 1 --config " + d + "/bad2.json"), "bf16.loss_scale");
  write_file(d + "/grads.json", R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})");
  const auto g = run_memfit("plan --json --config " + d + "/grads.json");
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out)["policy"]["grad_dtype"], "bf16");
}

TEST(Cli, FailedSaveKeepsTheEarlierCheckpoint) {
  const std::string dir = temp_dir() + "/keep";
  ASSERT_EQ(run_memfit("train --steps 2 --batch 2 --seq 16 --save " + dir).status, 0);
  std::ifstream before_in(dir + "/model.safetensors", std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(before_in)), std::istreambuf_iterator<char>());
  // This run fails before it can save (bad data): the checkpoint must be untouched.
  const auto r = run_memfit("train --steps 2 --batch 2 --seq 16 --data /nonexistent --save " + dir);
  EXPECT_EQ(r.status, 1);
  // This one fails while saving (its temporary file cannot be created): same.
  std::filesystem::create_directories(dir + "/model.safetensors.tmp/blocker");
  const auto s = run_memfit("train --steps 2 --batch 2 --seq 16 --seed 99 --save " + dir);
  EXPECT_EQ(s.status, 1) << s.out << s.err;
  std::ifstream after_in(dir + "/model.safetensors", std::ios::binary);
  const std::string after((std::istreambuf_iterator<char>(after_in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(before, after);
}

}  // namespace
}  // namespace memfit
