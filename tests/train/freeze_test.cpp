// Frozen parameters (--freeze) and the low-rank test rewrite, run on gpt2-tiny:
// (a) frozen weights stay bitwise what they were after several steps while every other
//     parameter moves, under fp32/bf16/fp16, recomputation, flash attention, accumulation and
//     8-bit AdamW; steps allocate nothing and the measured high-water mark equals the plan;
// (b) the trainable parameters' gradients are bitwise those of the unfrozen program;
// (c) the persistent parameter, master, gradient and optimizer bytes of the plan fall by
//     frozen elements x (gradient + master + state bytes), counted from the model's shapes;
// (d) checkpoints resume bit for bit and --save / --load round-trips a frozen run's weights.
// (LoRA, the low-rank branch on frozen weights, is tested in lora_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "graph/training_program.hpp"
#include "io/safetensors.hpp"
#include "support/alloc_counter.hpp"
#include "support/run_cli.hpp"
#include "support/tiny_run.hpp"
#include "train/master_weights.hpp"
#include "train/run_config.hpp"
#include "train/trainer.hpp"
#include "support/tensor_values.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<char>;

// Checkpoints and saved weights go to the process's temporary directory, removed at exit.
class RemoveTemporaries : public ::testing::Environment {
  void TearDown() override { fs::remove_all(test::temp_dir()); }
};
const ::testing::Environment* const remove_temporaries = ::testing::AddGlobalTestEnvironment(new RemoveTemporaries);

Policy tiny_policy() {
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.with_eval = false;
  return p;
}

Bytes bytes_of(const Executor& ex, TensorId id) {
  const std::vector<std::byte> bytes = test::tensor_bytes(ex, id);
  const char* d = reinterpret_cast<const char*>(bytes.data());
  return Bytes(d, d + bytes.size());
}

std::map<std::string, Bytes> values(const Executor& ex) {
  std::map<std::string, Bytes> out;
  for (const ParamEntry& e : ex.program().params()) out[e.name] = bytes_of(ex, e.value);
  return out;
}

TEST(Freeze, FrozenWeightsStayBitwiseWhileTheRestTrains) {
  struct Case {
    Precision precision;
    const char* recompute;
    AttentionKind attention;
    int grad_accum;
    OptimizerKind optimizer;
  };
  for (const Case& k : {Case{Precision::fp32, "none", AttentionKind::plain, 1, OptimizerKind::adamw},
                        Case{Precision::bf16, "full", AttentionKind::flash, 1, OptimizerKind::adamw},
                        Case{Precision::fp16, "selective", AttentionKind::plain, 2, OptimizerKind::adamw},
                        Case{Precision::bf16, "every:2", AttentionKind::flash, 3, OptimizerKind::adamw8bit}}) {
    Policy pol = tiny_policy();
    pol.precision = k.precision;
    pol.recompute = parse_recompute(k.recompute);
    pol.attention = k.attention;
    pol.grad_accum = k.grad_accum;
    pol.optimizer = k.optimizer;
    pol.freeze = {"h.*.attn.*", "wte.weight", "ln_f.*"};
    SCOPED_TRACE(std::string(precision_name(k.precision)) + " recompute " + k.recompute);
    test::TinyRun run(pol);
    const std::map<std::string, Bytes> before = values(*run.ex);
    run.step(1);
    test::alloc_counter_start();
    for (int64_t s = 2; s <= 3; ++s) run.step(s);
    EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
    EXPECT_EQ(run.compiled.plan.tier(Tier::device).peak_bytes, run.ex->arena(Tier::device).measured_high_water());
    EXPECT_TRUE(std::isfinite(run.loss()));
    const std::map<std::string, Bytes> after = values(*run.ex);
    int frozen = 0;
    for (const ParamEntry& e : run.compiled.program.params()) {
      if (e.frozen()) {
        ++frozen;
        EXPECT_EQ(after.at(e.name), before.at(e.name)) << e.name << " moved";
      } else {
        EXPECT_NE(after.at(e.name), before.at(e.name)) << e.name << " did not train";
      }
    }
    EXPECT_EQ(frozen, 1 + 2 + 4 * int(model_preset("gpt2-tiny").n_layer));
  }
}

// Runs micro-step 0 of a step with persistent (accumulation) gradients, and returns the run.
std::unique_ptr<test::TinyRun> one_micro_step(const Policy& pol, const ForwardRewrites& extra = {},
                                              const std::function<void(test::TinyRun&)>& before = {}) {
  auto run = std::make_unique<test::TinyRun>(
      compile_program(build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities(), extra), *make_cpu_backend()));
  if (before) before(*run);
  StepContext ctx;
  ctx.micro_count = pol.grad_accum;
  run->ex->run_section(SectionKind::micro, ctx);
  return run;
}

TEST(Freeze, TrainableGradientsAreThoseOfTheUnfrozenProgram) {
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    Policy pol = tiny_policy();
    pol.grad_accum = 2;  // persistent gradients, readable after the micro-step
    pol.precision = precision;
    const auto full = one_micro_step(pol);
    pol.freeze = {"h.0.*", "h.1.mlp.c_fc.*", "wpe.weight"};
    const auto part = one_micro_step(pol);
    SCOPED_TRACE(precision_name(precision));
    EXPECT_EQ(bytes_of(*full->ex, full->compiled.program.find_tensor(kLoss)),
              bytes_of(*part->ex, part->compiled.program.find_tensor(kLoss)));
    const auto& fp = full->compiled.program.params();
    const auto& pp = part->compiled.program.params();
    ASSERT_EQ(fp.size(), pp.size());
    int compared = 0;
    for (size_t i = 0; i < fp.size(); ++i) {
      ASSERT_EQ(fp[i].name, pp[i].name);
      if (pp[i].frozen()) {
        EXPECT_EQ(pp[i].grad, kNoTensor);
        continue;
      }
      EXPECT_EQ(bytes_of(*full->ex, fp[i].grad), bytes_of(*part->ex, pp[i].grad)) << fp[i].name;
      ++compared;
    }
    EXPECT_GT(compared, 10);
  }
}

TEST(Freeze, PlanDropsByTheClosedFormAndMatchesTheMeasurement) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  const int64_t C = spec.n_embd;
  // h.*.attn.* (c_attn 3C x C + 3C, c_proj C x C + C) and the tied embedding.
  const int64_t frozen = spec.n_layer * (3 * C * C + 3 * C + C * C + C) + spec.padded_vocab * C;
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    Policy pol = tiny_policy();
    pol.grad_accum = 2;  // every model state persistent, so all live at op 0
    pol.precision = precision;
    const CompiledProgram full = test::compile_tiny(pol);
    pol.freeze = {"h.*.attn.*", "wte.weight"};
    test::TinyRun run(pol);
    const CompiledProgram& part = run.compiled;
    SCOPED_TRACE(precision_name(precision));
    const bool mixed = precision != Precision::fp32;
    auto drop = [&](Category c) {
      return int64_t(full.plan.tier(Tier::device).live_by_category[0][size_t(c)]) -
             int64_t(part.plan.tier(Tier::device).live_by_category[0][size_t(c)]);
    };
    EXPECT_EQ(drop(Category::parameters), 0);
    EXPECT_EQ(drop(Category::gradients), frozen * 4);  // fp32 gradients
    EXPECT_EQ(drop(Category::master_weights), mixed ? frozen * 4 : 0);
    EXPECT_EQ(drop(Category::optimizer_state), frozen * 8);
    const FrozenSummary s = summarize_frozen(part.program, pol);
    EXPECT_EQ(s.elements, frozen);
    EXPECT_EQ(s.total_bytes(), frozen * (mixed ? 16 : 12));
    run.step(1);
    run.step(2);
    EXPECT_EQ(part.plan.tier(Tier::device).peak_bytes, run.ex->arena(Tier::device).measured_high_water());
    EXPECT_LT(part.plan.tier(Tier::device).peak_bytes, full.plan.tier(Tier::device).peak_bytes);
  }
}

TEST(Freeze, PlanCommandAndConfigKeyAndZero) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  const int64_t C = spec.n_embd;
  const int64_t frozen = spec.n_layer * (3 * C * C + 3 * C + C * C + C) + spec.padded_vocab * C;
  const test::CliResult plan = test::run_memfit("plan --model gpt2-tiny --batch 2 --seq 32 --freeze 'h.*.attn.*,wte.weight'");
  EXPECT_EQ(plan.status, 0) << plan.err;
  EXPECT_NE(plan.out.find(fmt::format("frozen: {} parameters ({} elements)", 1 + 4 * spec.n_layer, frozen)),
            std::string::npos)
      << plan.out;
  const test::CliResult json = test::run_memfit("plan --json --model gpt2-tiny --batch 2 --seq 32 --freeze 'h.*'");
  ASSERT_EQ(json.status, 0) << json.err;
  EXPECT_GT(nlohmann::json::parse(json.out)["frozen"]["bytes_saved"].get<int64_t>(), 0);
  // With ZeRO (graph/zero.hpp; several ranks: tests/train/freeze_zero_mpitest.cpp): the plan
  // shows one rank's share, fp32 gradients (4 bytes) and AdamW moments (8) over 4 ranks.
  const test::CliResult sharded = test::run_memfit(
      "plan --json --model gpt2-tiny --batch 2 --seq 32 --zero 3 --world-size 4 --freeze 'h.*.attn.*,wte.weight'");
  ASSERT_EQ(sharded.status, 0) << sharded.err;
  const nlohmann::json fj = nlohmann::json::parse(sharded.out)["frozen"];
  EXPECT_EQ(fj["bytes_saved"].get<int64_t>(), frozen * 12);
  EXPECT_EQ(fj["bytes_saved_per_rank"].get<int64_t>(), frozen * 12 / 4);
  const test::CliResult text = test::run_memfit(
      "plan --model gpt2-tiny --batch 2 --seq 32 --zero 1 --world-size 2 --freeze 'h.*.attn.*,wte.weight'");
  EXPECT_NE(text.out.find("frozen, per rank (ZeRO stage 1 over 2 ranks)"), std::string::npos) << text.out;
  const test::CliResult zero = test::run_memfit("train --model gpt2-tiny --batch 2 --seq 32 --steps 2 --freeze 'h.0.*' --zero 2");
  EXPECT_EQ(zero.status, 0) << zero.err;

  const std::string dir = test::temp_dir();
  for (const char* value : {"\"h.0.*,wte.weight\"", "[\"h.0.*\", \"wte.weight\"]"}) {
    test::write_file(dir + "/freeze.json", std::string("{\"freeze\": ") + value + "}");
    RunConfig c;
    apply_config_file(dir + "/freeze.json", c);
    EXPECT_EQ(c.policy.freeze, (std::vector<std::string>{"h.0.*", "wte.weight"})) << value;
  }
}

// --- (d) checkpoints and whole-weight files ---

struct Finished {
  nlohmann::json report;
};

Finished train(const RunConfig& c) {
  std::ostringstream log;
  return {run_training(c, log)};
}

RunConfig tiny_run(int64_t steps, Precision precision) {
  RunConfig c;
  c.steps = steps;
  c.policy.batch = 2;
  c.policy.seq = 16;
  c.policy.precision = precision;
  c.policy.freeze = {"h.0.*", "wte.weight"};
  c.val_fraction = 0;
  return c;
}

std::vector<float> history(const Finished& f, size_t from = 0) {
  std::vector<float> v;
  for (size_t i = from; i < f.report["loss"]["history"].size(); ++i) v.push_back(f.report["loss"]["history"][i].get<float>());
  return v;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(FreezeFiles, CheckpointsResumeBitForBitAndSavedWeightsRoundTrip) {
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    const std::string root = test::temp_dir() + "/freeze-" + std::string(precision_name(precision));
    fs::remove_all(root);
    const Finished whole = train(tiny_run(6, precision));
    RunConfig saving = tiny_run(6, precision);
    saving.checkpoint_dir = root + "/ckpt";
    saving.checkpoint_every = 3;
    saving.save = root + "/saved";
    const Finished saved = train(saving);
    EXPECT_EQ(history(saved), history(whole));
    RunConfig resumed = tiny_run(6, precision);
    resumed.resume = root + "/ckpt/step-000003";
    EXPECT_EQ(history(train(resumed)), history(whole, 3));

    // Load the saved weights and save them again after a step at learning rate 0 (AdamW then
    // leaves every weight as it is): the same file, bit for bit; and the frozen tensors are
    // those of a run that never moved.
    RunConfig again = tiny_run(1, precision);
    again.lr = 0;
    again.load = root + "/saved";
    again.save = root + "/again";
    train(again);
    EXPECT_EQ(read_file(root + "/saved/model.safetensors"), read_file(root + "/again/model.safetensors"));
    RunConfig untrained = tiny_run(1, precision);
    untrained.lr = 0;
    untrained.save = root + "/untrained";
    train(untrained);
    const SafetensorsReader a(root + "/saved/model.safetensors"), b(root + "/untrained/model.safetensors");
    auto same = [&](const std::string& name) {
      const SafetensorsEntry *ea = a.find(name), *eb = b.find(name);
      if (!ea || !eb || ea->bytes() != eb->bytes()) return false;
      return std::memcmp(a.data(*ea), b.data(*eb), ea->bytes()) == 0;
    };
    for (const std::string name : {"wte.weight", "h.0.attn.c_attn.weight", "h.0.ln_1.bias"}) {
      ASSERT_TRUE(a.find(name) || a.find("transformer." + name)) << name;
      EXPECT_TRUE(same(name) || same("transformer." + name)) << name << " moved";
    }
    EXPECT_FALSE(same("h.1.attn.c_attn.weight") || same("transformer.h.1.attn.c_attn.weight")) << "h.1 did not train";
  }
}

}  // namespace
}  // namespace memfit
