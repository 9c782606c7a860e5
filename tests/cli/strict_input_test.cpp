// Strict inputs through the memfit binary: every value of the wrong type or out of range, as a
// flag, a memfit config key or a DeepSpeed key, is refused with one line on stderr that names
// the field, and exit status 1 (never 0, never a signal); command-line parse errors look the
// same; --help still exits 0. The values are the ones a fuzzing campaign found accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_cli.hpp"

namespace memfit {
namespace {

using test::run_memfit;
using test::temp_dir;
using test::write_file;

void expect_refused(const std::string& args, const std::string& field) {
  SCOPED_TRACE(args);
  const test::CliResult r = run_memfit(args);
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("memfit: error: [", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(field), std::string::npos) << "expected '" << field << "' in: " << r.err;
}

// A config file holding `json`, refused naming `field`, under `train` (which reads every key).
void expect_config_refused(const std::string& json, const std::string& field) {
  static int n = 0;
  const std::string path = temp_dir() + "/strict" + std::to_string(n++) + ".json";
  write_file(path, json);
  expect_refused("train --steps 1 --batch 2 --seq 16 --config " + path, field);
}

TEST(StrictInput, FlagsOfTheWrongTypeOrRangeAreRefusedNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plan --batch 99999999999999999999999", "--batch"},
      {"plan --batch 2.5", "--batch"},
      {"plan --batch 2.0", "--batch"},
      {"plan --batch 0", "--batch"},
      {"plan --batch -4", "--batch"},
      {"plan --seq 1e3", "--seq"},
      {"plan --grad-accum 4294967297", "--grad-accum"},
      {"plan --grad-accum 0", "--grad-accum"},
      {"plan --zero 4", "--zero"},
      {"plan --threads 0", "--threads"},
      {"plan --threads 100000", "--threads"},
      {"plan --memory-budget 1e30GiB", "--memory-budget"},
      {"plan --memory-budget 0", "--memory-budget"},
      {"plan --memory-budget 2PiB", "--memory-budget"},
      {"plan --memory-budget 12XB", "--memory-budget"},
      {"plan --beta1 1.5", "--beta1"},
      {"plan --beta1 -0.1", "--beta1"},
      {"plan --beta2 1.0", "--beta2"},
      {"plan --adam-eps -1", "--adam-eps"},
      {"plan --weight-decay -0.1", "--weight-decay"},
      {"plan --grad-clip -1", "--grad-clip"},
      {"plan --classifier-chunk -1", "--classifier-chunk"},
      {"plan --val-fraction 1", "--val-fraction"},
      {"train --steps 1.9", "--steps"},
      {"train --steps 0", "--steps"},
      {"train --steps 1000000000000000000", "--steps"},
      {"train --steps 1e18", "--steps"},
      {"train --lr -1", "--lr"},
      {"train --lr nan", "--lr"},
      {"train --lr inf", "--lr"},
      {"train --min-lr -1", "--min-lr"},
      {"train --warmup -1", "--warmup"},
      {"train --seed -1", "--seed"},
      {"train --seed 18446744073709551616", "--seed"},
      {"train --eval-every -1", "--eval-every"},
      {"train --eval-batches 0", "--eval-batches"},
      {"train --checkpoint-every -1", "--checkpoint-every"},
      {"train --log-every -1", "--log-every"},
      {"train --loss-scale -1", "--loss-scale"},
      {"train --initial-loss-scale 0", "--initial-loss-scale"},
      {"train --min-loss-scale 0", "--min-loss-scale"},
      {"train --keep-checkpoints 0", "--keep-checkpoints"},
      {"train --keep-checkpoints 1.5", "--keep-checkpoints"},
      {"train --comm-timeout -1", "--comm-timeout"},
      {"train --comm-timeout 1e300", "--comm-timeout"},
      {"train --comm-timeout nan", "--comm-timeout"},
      // `plan` on other hardware.
      {"plan --world-size 0", "--world-size"},
      {"plan --world-size -3", "--world-size"},
      {"plan --world-size 99999999999", "--world-size"},
      {"plan --hardware h100-80gb --nodes -1", "--nodes"},
      {"plan --hardware h100-80gb --gpus-per-node 0", "--gpus-per-node"},
      {"plan --hardware h100-80gb --fit --max-batch 0", "--max-batch"},
      {"plan --hardware h100-80gb --fit --global-batch 2.5", "--global-batch"},
      {"plan --hardware h100-80gb --device-memory 0", "--device-memory"},
      {"plan --hardware h100-80gb --device-memory 1e30GiB", "--device-memory"},
      {"plan --hardware h100-80gb --hardware-set memory_bytes=1e30", "memory_bytes"},
      {"plan --hardware h100-80gb --hardware-set memory_bytes=-1", "memory_bytes"},
      {"plan --hardware h100-80gb --hardware-set memory_bytes=3PiB", "memory_bytes"},
  };
  for (const auto& [args, field] : cases) expect_refused(args, field);
}

TEST(StrictInput, ConfigKeysOfTheWrongTypeOrRangeAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"steps": 1.9})", "'steps'"},
      {R"({"steps": 1e18})", "'steps'"},
      {R"({"steps": 1000000000000000000})", "'steps'"},
      {R"({"train_iters": 0})", "'train_iters'"},
      {R"({"batch": 2.5})", "'batch'"},
      {R"({"batch": 2.0})", "'batch'"},
      {R"({"train_micro_batch_size_per_gpu": 2.0})", "'train_micro_batch_size_per_gpu'"},
      {R"({"train_micro_batch_size_per_gpu": true})", "'train_micro_batch_size_per_gpu'"},
      {R"({"grad_accum": 4294967297})", "'grad_accum'"},
      {R"({"gradient_accumulation_steps": 0})", "'gradient_accumulation_steps'"},
      {R"({"seq": "16"})", "'seq'"},
      {R"({"lr": -1})", "'lr'"},
      {R"({"seed": -1})", "'seed'"},
      {R"({"seed": 18446744073709551616})", "'seed'"},
      {R"({"val_fraction": 1.5})", "'val_fraction'"},
      {R"({"eval_every": -1})", "'eval_every'"},
      {R"({"eval_batches": 0})", "'eval_batches'"},
      {R"({"warmup_steps": -5})", "'warmup_steps'"},
      {R"({"min_lr": -1})", "'min_lr'"},
      {R"({"gradient_clipping": -1})", "'gradient_clipping'"},
      {R"({"zero_optimization": {"stage": 4}})", "'zero_optimization.stage'"},
      {R"({"zero_optimization": {"stage": 1.5}})", "'zero_optimization.stage'"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}})", "'optimizer.params.betas[1]'"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [1.5, 0.999]}}})", "'optimizer.params.betas[0]'"},
      {R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})", "'optimizer.params.betas'"},
      {R"({"optimizer": {"type": "AdamW", "params": {"eps": -1}}})", "'optimizer.params.eps'"},
      {R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": -0.1}}})", "'optimizer.params.weight_decay'"},
      {R"({"optimizer": {"type": "AdamW", "params": {"lr": -0.001}}})", "'optimizer.params.lr'"},
      {R"({"optimizer": {"type": 7}})", "'optimizer.type'"},
      {R"({"optimizer": {"type": "AdamW", "param": {}}})", "'optimizer.param'"},
      {R"({"fp16": {"enabled": true, "loss_scale_window": 0}})", "'fp16.loss_scale_window'"},
      {R"({"fp16": {"enabled": true, "hysteresis": 2.5}})", "'fp16.hysteresis'"},
      {R"({"fp16": {"enabled": true, "initial_scale_power": 1000}})", "'fp16.initial_scale_power'"},
      {R"({"fp16": {"enabled": true, "min_loss_scale": 0}})", "'fp16.min_loss_scale'"},
      {R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_batch_size": 5})",
       "'train_batch_size'"},
      {R"({"train_batch_size": 2.5})", "'train_batch_size'"},
      {R"({"keep_checkpoints": 0})", "'keep_checkpoints'"},
      {R"({"keep_checkpoints": 2.5})", "'keep_checkpoints'"},
      {R"({"comm_timeout": -1})", "'comm_timeout'"},
      {R"({"comm_timeout": 1e300})", "'comm_timeout'"},
      {R"({"comm_timeout": "300"})", "'comm_timeout'"},
  };
  for (const auto& [json, field] : cases) expect_config_refused(json, field);
}

// The rule for integers: written as integers. Reals may be written as integers (eps 1 here: a
// training run with eps 0 divides 0 by 0 where a gradient is zero, which the run stops on; the
// plan below accepts eps 0, as PyTorch does).
TEST(StrictInput, IntegersAndRealsThatAreRightAreAccepted) {
  const std::string d = temp_dir();
  write_file(d + "/ok.json", R"({"train_micro_batch_size_per_gpu": 2, "seq": 16, "gradient_accumulation_steps": 1,
    "train_batch_size": 2, "lr": 1, "seed": 18446744073709551615, "steps": 2,
    "optimizer": {"type": "AdamW", "params": {"betas": [0, 0.999], "eps": 1, "weight_decay": 0}}})");
  const test::CliResult r = run_memfit("train --config " + d + "/ok.json --val-fraction 0 --report-json " + d + "/r.json");
  ASSERT_EQ(r.status, 0) << r.err;
  const test::CliResult p = run_memfit("plan --json --config " + d + "/ok.json --beta1 0 --adam-eps 0 --threads 1");
  ASSERT_EQ(p.status, 0) << p.err;
  const auto j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["policy"]["batch"], 2);
  EXPECT_EQ(j["policy"]["adamw"]["beta1"], 0.0);
}

// Memory sizes as people write them; the parsed budget is what `plan --recompute auto` reports.
TEST(StrictInput, MemoryBudgetsParseAsWritten) {
  const std::vector<std::pair<std::string, uint64_t>> cases = {
      {"12GiB", uint64_t(12) << 30}, {"'12 GiB'", uint64_t(12) << 30}, {"12Gi", uint64_t(12) << 30},
      {"12G", 12'000'000'000u},      {"12GB", 12'000'000'000u},        {"12884901888", uint64_t(12) << 30},
  };
  for (const auto& [text, bytes] : cases) {
    const test::CliResult r = run_memfit("plan --json --batch 2 --seq 16 --recompute auto --memory-budget " + text);
    ASSERT_EQ(r.status, 0) << text << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["recompute_auto"]["budget_bytes"].get<uint64_t>(), bytes) << text;
  }
}

TEST(StrictInput, ParseErrorsAreOneLineWithStatusOneAndHelpIsZero) {
  expect_refused("plan --no-such-flag", "--no-such-flag");
  expect_refused("plan --batch", "--batch");  // a flag without its value
  expect_refused("", "subcommand");
  expect_refused("frobnicate", "subcommand");
  expect_refused("plan --world-size abc", "--world-size");
  for (const char* help : {"--help", "plan --help", "train --help"}) {
    const test::CliResult r = run_memfit(help);
    EXPECT_EQ(r.status, 0) << help << r.err;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << help;
  }
}

}  // namespace
}  // namespace memfit
