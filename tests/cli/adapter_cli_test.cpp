// `--load-adapter DIR` on the commands that only plan: the plan must be the one of the run
// that `train --load-adapter DIR` executes, so the adapter's LoRA (r, lora_alpha,
// target_modules) is planned even when no --lora-* flag is given.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <set>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"
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

std::string generated_tokens(const std::string& args) {
  const auto r = run_memfit("generate --prompt-ids 1,2,3 --max-new-tokens 16 --ignore-eos " + args);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("), equal"), std::string::npos) << "planned != measured:\n" << r.out;
  const size_t at = r.out.find("\ntokens: ");
  return at == std::string::npos ? "" : r.out.substr(at + 9, r.out.find('\n', at + 1) - at - 9);
}

// `generate --load-adapter` decodes with the adapter: greedily, the same tokens as the merged
// weights, and not those of the base; with the base quantised (QLoRA) it runs, planned ==
// measured.
TEST(AdapterCli, GenerateWithAdapterEqualsTheMergedWeights) {
  const std::string dir = temp_dir();
  const std::string model = "--model " + kBase + "/config.json";
  ASSERT_EQ(run_memfit("merge-lora " + model + " --load " + kBase + "/model.safetensors --adapter " + kAdapter +
                       " --out " + dir + "/merged").status, 0);
  const std::string with = generated_tokens(model + " --load " + kBase + "/model.safetensors --load-adapter " + kAdapter);
  const std::string merged = generated_tokens(model + " --load " + dir + "/merged");
  const std::string base = generated_tokens(model + " --load " + kBase + "/model.safetensors");
  ASSERT_FALSE(with.empty());
  EXPECT_EQ(with, merged);
  EXPECT_NE(with, base);
  EXPECT_FALSE(generated_tokens(model + " --load " + kBase + "/model.safetensors --load-adapter " + kAdapter +
                                " --quantize-base nf4 --double-quant").empty());
}

// bias all | lora_only: the trained biases go into the adapter under PEFT's names (the names
// below are those PEFT 0.21's save_pretrained writes for GPT-2 with target c_attn), and
// --load-adapter reads them back, into training (a step at lr 0 saves the same bytes) and
// into eval, and merge-lora writes them in place of the base's. By hand (2026-11-26): PeftModel.from_pretrained of these files on the HF base
// gave memfit eval's loss to 1e-7 for both settings.
TEST(AdapterCli, TrainedBiasesRoundTripUnderPeftNames) {
  const std::string dir = temp_dir();
  const std::string data = " --batch 2 --seq 32 --data " + write_tokens(dir, 2049, 256) + " --val-fraction 0";
  ASSERT_EQ(run_memfit("train --model gpt2-tiny --steps 1" + data + " --save " + dir + "/base").status, 0);
  for (const std::string bias : {"all", "lora_only"}) {
    const std::string lora = " --lora-rank 4 --lora-targets c_attn --lora-bias " + bias;
    const std::string ad = dir + "/ad-" + bias, again = dir + "/again-" + bias;
    const auto r = run_memfit("train --model gpt2-tiny --load " + dir + "/base --steps 4 --lr 1e-2" + lora + data +
                              " --save " + ad);
    ASSERT_EQ(r.status, 0) << r.err;
    std::set<std::string> expected;
    for (int layer = 0; layer < 4; ++layer) {
      const std::string h = "base_model.model.transformer.h." + std::to_string(layer) + ".";
      for (const char* t : {"lora_A.weight", "lora_B.weight", "base_layer.bias"}) expected.insert(h + "attn.c_attn." + t);
      if (bias == "all")
        for (const char* m : {"attn.c_proj", "ln_1", "ln_2", "mlp.c_fc", "mlp.c_proj"}) expected.insert(h + m + ".bias");
    }
    if (bias == "all") expected.insert("base_model.model.transformer.ln_f.bias");
    const SafetensorsReader saved(ad + "/adapter_model.safetensors");
    std::set<std::string> names;
    for (const SafetensorsEntry& e : saved.entries()) names.insert(e.name);
    EXPECT_EQ(names, expected);

    const auto step = run_memfit("train --model gpt2-tiny --load " + dir + "/base --load-adapter " + ad +
                                 " --steps 1 --lr 0" + data + " --save " + again);
    ASSERT_EQ(step.status, 0) << step.err;
    const SafetensorsReader back(again + "/adapter_model.safetensors");
    for (const SafetensorsEntry& e : saved.entries()) {
      const SafetensorsEntry* b = back.find(e.name);
      ASSERT_NE(b, nullptr) << e.name;
      ASSERT_EQ(e.shape, b->shape);
      EXPECT_EQ(0, std::memcmp(saved.data(e), back.data(*b), size_t(e.shape.numel()) * 4)) << e.name;
    }
    const double with = eval_loss("--model gpt2-tiny --load " + dir + "/base --load-adapter " + ad + data, dir + "/e.json");
    const double without = eval_loss("--model gpt2-tiny --load " + dir + "/base" + data, dir + "/e0.json");
    EXPECT_GT(std::fabs(with - without), 1e-4) << bias;
    // merge-lora writes the trained biases in place of the base's.
    ASSERT_EQ(run_memfit("merge-lora --model gpt2-tiny --load " + dir + "/base --adapter " + ad + " --out " + dir +
                         "/merged-" + bias).status, 0);
    const double merged = eval_loss("--model gpt2-tiny --load " + dir + "/merged-" + bias + data, dir + "/em.json");
    EXPECT_NEAR(merged, with, 1e-5 * with) << bias;
  }
}

}  // namespace
}  // namespace memfit
