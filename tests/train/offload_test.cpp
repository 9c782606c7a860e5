// Optimizer offload (--offload-optimizer host|disk), run on gpt2-tiny and llama-tiny:
// (a) the loss history (and the final validation loss) is bitwise that of the same run with
//     the optimizer resident, for fp32 and bf16, AdamW and 8-bit AdamW, with gradient
//     clipping, over 10 steps in one staging chunk per tensor on both tiers and 4 in chunks of
//     4096 elements on one tier per case (alternating host and disk);
// (b) planned == measured on every tier (the disk tier's file included), and the offload
//     tier holds exactly the optimizer state and masters, counted from the model's shapes
//     (AdamW: 8 bytes per element; 8-bit AdamW: 2 bytes plus two fp32 absmax per 256
//     elements for tensors of >= 4096 elements; masters 4 bytes), none of which is left on
//     the device tier;
// (c) steps allocate nothing (host offload, disk offload);
// (d) a checkpoint written during an offloaded run resumes bit for bit, and resuming it
//     without offload gives the same losses (the checkpoint does not depend on the layout);
// (e') `memfit plan` with the run's flags prints the per-tier figures `memfit train` measures;
// (e) bad input and faults end in one line: disk offload with no directory, a directory that
//     is a file, no room for the tier's file, the file truncated under a running job (and
//     the checkpoint saved before the fault still resumes).
// Parameter offload (--offload-params host|disk, ZeRO stage 3 on one rank):
// (f) the loss history is bitwise that of the same stage-3 run with the parameters resident,
//     for gpt2-tiny and llama-tiny, fp32 and bf16, AdamW and 8-bit AdamW, with the optimizer
//     resident or on disk, over 10 steps; planned == measured on every tier; the offload tier
//     holds exactly the parameter shards the resident run kept on the device, and the device
//     keeps none; steps 2.. allocate nothing;
// (g) a checkpoint of a parameter-offloaded run resumes bit for bit, with or without offload;
// (h) `memfit plan` with the run's flags prints the per-tier figures the run measures;
// (i) the tier's file truncated under a running job ends the run in one line;
// (k) `memfit profile` of a run with the parameters and the optimizer on disk puts the fetches
//     and write-backs on the transfer.in / transfer.out tracks;
// (j) over a budget at stage 3, the out-of-memory diagnosis proposes --offload-params disk
//     when that fits, and the run with it trains within the budget (below stage 3: never).
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"
#include "support/alloc_counter.hpp"
#include "support/mpi_test.hpp"
#include "support/run_cli.hpp"
#include "support/tiny_run.hpp"
#include "train/budget.hpp"
#include "train/candidates.hpp"
#include "train/run_config.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const std::string dir = fmt::format("{}/memfit-offload-test-{}/{}", fs::temp_directory_path().string(), getpid(), name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

class RemoveScratch : public ::testing::Environment {
  void TearDown() override {
    fs::remove_all(fmt::format("{}/memfit-offload-test-{}", fs::temp_directory_path().string(), getpid()));
  }
};
const ::testing::Environment* const remove_scratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

RunConfig tiny(const std::string& model, Precision precision, OptimizerKind optimizer, int64_t steps) {
  RunConfig c;
  c.model = model;
  c.steps = steps;
  c.policy.batch = 2;
  c.policy.seq = 32;
  c.policy.precision = precision;
  c.policy.optimizer = optimizer;
  c.policy.grad_clip = 1.0;
  c.policy.attention = AttentionKind::flash;  // llama-tiny's grouped-query attention in bf16 needs it
  c.val_fraction = 0.1;
  c.eval_batches = 1;
  c.log_every = 0;
  return c;
}

nlohmann::json train(const RunConfig& c) {
  std::ostringstream log;
  return run_training(c, log);
}

std::vector<uint32_t> loss_bits(const nlohmann::json& report) {
  std::vector<uint32_t> bits;
  for (const auto& v : report["loss"]["history"]) {
    bits.push_back(std::bit_cast<uint32_t>(v.get<float>()));
  }
  if (!report["validation"]["last"].is_null()) bits.push_back(std::bit_cast<uint32_t>(report["validation"]["last"].get<float>()));
  return bits;
}

// The optimizer's own bytes, from the model's shapes (see (b) above).
uint64_t optimizer_bytes(const std::string& model, Precision precision, OptimizerKind optimizer) {
  const Program p = build_training_program(resolve_model(model), Policy{}, {}, cpu_capabilities());
  uint64_t total = 0;
  for (const ParamEntry& e : p.params()) {
    const uint64_t n = uint64_t(p.param_numel(e));
    if (optimizer == OptimizerKind::adamw8bit && n >= 4096) total += 2 * n + 2 * 4 * ((n + 255) / 256);
    else total += 8 * n;
    if (precision != Precision::fp32) total += 4 * n;
  }
  return total;
}

uint64_t category_bytes(const nlohmann::json& report, Tier tier, const char* category) {
  const auto& by = report["memory"]["tiers"][std::string(tier_name(tier))]["by_category"];
  return by.contains(category) ? by[category].get<uint64_t>() : 0;
}

void expect_every_tier_measured(const nlohmann::json& report) {
  for (Tier t : kAllTiers) {
    const std::string name(tier_name(t));
    EXPECT_EQ(report["memory"]["planned_peak_bytes"][name], report["memory"]["measured_peak_bytes"][name]) << name;
  }
  EXPECT_TRUE(report["memory"]["all_ranks_equal"].get<bool>());
}

void expect_offload_bitwise_resident(const std::string& model) {
  const std::string dir = scratch("bitwise-" + model);
  for (Precision precision : {Precision::fp32, Precision::bf16})
      for (OptimizerKind optimizer : {OptimizerKind::adamw, OptimizerKind::adamw8bit}) {
        for (int64_t chunk : {int64_t(0), int64_t(4096)}) {
          // 10 steps in whole-tensor chunks, every tier; 4 in small chunks (a thousand transfers
          // a step, each a thread hand-off, which a loaded machine makes slow) on one tier per
          // case, alternating, so that each model, precision, optimizer and tier meets small
          // chunks at least once.
          const RunConfig base = tiny(model, precision, optimizer, chunk == 0 ? 10 : 4);
          const nlohmann::json resident = train(base);
          const bool disk_turn =
              ((model == "llama-tiny") != (precision == Precision::bf16)) != (optimizer == OptimizerKind::adamw8bit);
          for (Tier tier : {Tier::host, Tier::disk}) {
            if (chunk != 0 && (tier == Tier::disk) != disk_turn) continue;
            SCOPED_TRACE(fmt::format("{} {} {} {} chunk {}", model, precision_name(precision),
                                     optimizer == OptimizerKind::adamw ? "adamw" : "adamw8bit", tier_name(tier), chunk));
            RunConfig c = base;
            c.policy.offload_optimizer = tier;
            c.policy.offload_chunk_elements = chunk;
            c.offload_dir = dir;
            const nlohmann::json offloaded = train(c);
            EXPECT_EQ(loss_bits(offloaded), loss_bits(resident));
            expect_every_tier_measured(offloaded);
            const uint64_t expected = optimizer_bytes(model, precision, optimizer);
            EXPECT_EQ(category_bytes(offloaded, tier, "optimizer_state") + category_bytes(offloaded, tier, "master_weights"),
                      expected);
            EXPECT_EQ(category_bytes(offloaded, Tier::device, "optimizer_state"), 0u);
            EXPECT_EQ(category_bytes(offloaded, Tier::device, "master_weights"), 0u);
            // The device tier drops by the optimizer's bytes less the staging chunks in flight.
            EXPECT_LT(offloaded["memory"]["planned_peak_bytes"]["device"].get<uint64_t>(),
                      resident["memory"]["planned_peak_bytes"]["device"].get<uint64_t>());
            EXPECT_TRUE(fs::is_empty(dir)) << "the tier's file outlived the run";
          }
        }
      }
}

// One test per model, so that CTest runs them side by side.
TEST(OptimizerOffload, LossesBitwiseThoseOfTheResidentOptimizerAndEveryTierMeasuredGpt2) {
  expect_offload_bitwise_resident("gpt2-tiny");
}
TEST(OptimizerOffload, LossesBitwiseThoseOfTheResidentOptimizerAndEveryTierMeasuredLlama) {
  expect_offload_bitwise_resident("llama-tiny");
}

TEST(OptimizerOffload, StepsAllocateNothing) {
  for (Tier tier : {Tier::host, Tier::disk}) {
    SCOPED_TRACE(tier_name(tier));
    Policy p;
    p.batch = 2;
    p.seq = 32;
    p.precision = Precision::bf16;
    p.offload_optimizer = tier;
    p.offload_chunk_elements = 4096;
    test::TinyRun run(test::compile_tiny(p), 7, ExecutorOptions{BufferSite{scratch("alloc"), 0}});
    run.step(1);
    test::alloc_counter_start();
    for (int64_t s = 2; s <= 4; ++s) run.step(s);
    EXPECT_EQ(test::alloc_counter_stop().memfit_allocations, 0);
    EXPECT_EQ(run.ex->buffer(tier).measured_high_water(), run.compiled.plan.tier(tier).peak_bytes);
  }
}

TEST(OptimizerOffload, CheckpointsResumeBitForBitWithAndWithoutOffload) {
  const std::string root = scratch("resume");
  RunConfig whole = tiny("gpt2-tiny", Precision::bf16, OptimizerKind::adamw, 8);
  whole.val_fraction = 0;
  const std::vector<uint32_t> reference = loss_bits(train(whole));
  RunConfig saving = whole;
  saving.policy.offload_optimizer = Tier::disk;
  saving.offload_dir = root + "/tier";
  fs::create_directories(saving.offload_dir);
  saving.checkpoint_dir = root + "/ckpt";
  saving.checkpoint_every = 4;
  EXPECT_EQ(loss_bits(train(saving)), reference);
  const std::vector<uint32_t> tail(reference.begin() + 4, reference.end());
  for (Tier tier : {Tier::disk, Tier::host, Tier::device}) {
    SCOPED_TRACE(tier_name(tier));
    RunConfig resumed = saving;
    resumed.checkpoint_dir.clear();
    resumed.policy.offload_optimizer = tier;
    resumed.resume = root + "/ckpt/step-000004";
    EXPECT_EQ(loss_bits(train(resumed)), tail);
  }
}

TEST(OptimizerOffload, PlanGivesTheFiguresTheRunMeasures) {
  const std::string dir = scratch("plan");
  const std::string flags = "--model gpt2-tiny --batch 2 --seq 32 --precision bf16 --val-fraction 0 "
                            "--offload-optimizer disk --offload-chunk-elements 8192 --offload-dir " + dir;
  const auto plan = test::run_memfit("plan --json " + flags);
  ASSERT_EQ(plan.status, 0) << plan.err;
  const std::string report = dir + "/report.json";
  const auto train = test::run_memfit("train --steps 2 " + flags + " --report-json " + report);
  ASSERT_EQ(train.status, 0) << train.err;
  std::ifstream in(report);
  const nlohmann::json measured = nlohmann::json::parse(in)["memory"]["measured_peak_bytes"];
  const nlohmann::json planned = nlohmann::json::parse(plan.out)["memory"]["planned_peak_bytes"];
  for (const char* t : {"device", "host", "disk"}) EXPECT_EQ(planned[t], measured[t]) << t;
  EXPECT_GT(planned["disk"].get<uint64_t>(), 0u);
  EXPECT_GT(planned["host"].get<uint64_t>(), 0u);
}

// The run's error as one line, and that it is not a crash.
std::string failure(const RunConfig& c) {
  try {
    train(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(OptimizerOffload, BadDirectoriesAndFullDisksEndInOneLine) {
  RunConfig c = tiny("gpt2-tiny", Precision::fp32, OptimizerKind::adamw, 2);
  c.policy.offload_optimizer = Tier::disk;
  EXPECT_NE(failure(c).find("--offload-dir"), std::string::npos) << failure(c);

  const std::string dir = scratch("bad");
  const std::string file = dir + "/a-file";
  std::ofstream(file) << "x";
  c.offload_dir = file;
  EXPECT_NE(failure(c).find("cannot create " + file + "/memfit-rank0.tier"), std::string::npos) << failure(c);

  // No room: the file size limit stands in for a full filesystem (posix_fallocate fails the
  // same way before step 1, and SIGXFSZ is ignored so the failure is an error, not a signal).
  c.offload_dir = dir;
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  setrlimit(RLIMIT_FSIZE, &small);
  const std::string full = failure(c);
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(full.find("cannot reserve"), std::string::npos) << full;
  EXPECT_EQ(full.find('\n'), std::string::npos) << full;
}

// A filesystem without room: a 1 MiB tmpfs (mounting needs root, as in CI; skipped otherwise).
TEST(OptimizerOffload, AFullFilesystemIsNamedBeforeStepOne) {
  const std::string mnt = scratch("small-fs");
  if (std::system(("mount -t tmpfs -o size=1m tmpfs " + mnt + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (not root)";
  RunConfig c = tiny("gpt2-tiny", Precision::fp32, OptimizerKind::adamw, 2);
  c.policy.offload_optimizer = Tier::disk;
  c.offload_dir = mnt;
  const std::string error = failure(c);
  std::system(("umount " + mnt).c_str());
  EXPECT_NE(error.find("[memory] the disk tier needs 6.76 MiB in " + mnt + ", whose filesystem has 1.00 MiB free"),
            std::string::npos)
      << error;
}

// Truncates the disk tier's file before a step, as a user or a full /tmp cleaner might.
class TruncateTierFile : public RunHooks {
 public:
  TruncateTierFile(std::string path, int64_t at) : path_(std::move(path)), at_(at) {}
  void before_step(int64_t step) override {
    if (step == at_) fs::resize_file(path_, 0);
  }

 private:
  std::string path_;
  int64_t at_;
};

TEST(OptimizerOffload, TruncatedTierFileFailsTheRunAndKeepsTheCheckpoint) {
  const std::string root = scratch("truncate");
  RunConfig c = tiny("gpt2-tiny", Precision::fp32, OptimizerKind::adamw, 6);
  c.val_fraction = 0;
  c.policy.offload_optimizer = Tier::disk;
  c.offload_dir = root + "/tier";
  fs::create_directories(c.offload_dir);
  c.checkpoint_dir = root + "/ckpt";
  c.checkpoint_every = 2;
  TruncateTierFile hook(c.offload_dir + "/memfit-rank0.tier", 4);
  std::ostringstream log;
  std::string what = "(no error)";
  try {
    run_training(c, log, &hook);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("[io] transfer"), std::string::npos) << what;
  EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  RunConfig resumed = c;
  resumed.checkpoint_dir.clear();
  resumed.resume = root + "/ckpt/step-000002";
  RunConfig straight = c;
  straight.checkpoint_dir.clear();
  const std::vector<uint32_t> all = loss_bits(train(straight));
  EXPECT_EQ(loss_bits(train(resumed)), std::vector<uint32_t>(all.begin() + 2, all.end()));
}

// --- Parameter offload (f)-(i) ---

RunConfig stage3(const std::string& model, Precision precision, OptimizerKind optimizer, int64_t steps) {
  RunConfig c = tiny(model, precision, optimizer, steps);
  c.policy.zero_stage = 3;
  return c;
}

TEST(ParamOffload, LossesBitwiseThoseOfResidentParametersAndEveryTierMeasured) {
  const std::string dir = scratch("params-bitwise");
  for (const std::string model : {"gpt2-tiny", "llama-tiny"})
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (OptimizerKind optimizer : {OptimizerKind::adamw, OptimizerKind::adamw8bit}) {
        const RunConfig base = stage3(model, precision, optimizer, 10);
        const nlohmann::json resident = train(base);
        const uint64_t shards = category_bytes(resident, Tier::device, "parameters");
        ASSERT_GT(shards, 0u);
        for (Tier optimizer_tier : {Tier::device, Tier::disk})
          for (Tier tier : {Tier::host, Tier::disk}) {
            SCOPED_TRACE(fmt::format("{} {} {} params {} optimizer {}", model, precision_name(precision),
                                     optimizer == OptimizerKind::adamw ? "adamw" : "adamw8bit", tier_name(tier),
                                     tier_name(optimizer_tier)));
            RunConfig c = base;
            c.policy.offload_params = tier;
            c.policy.offload_optimizer = optimizer_tier;
            c.policy.offload_chunk_elements = optimizer_tier == Tier::disk ? 8192 : 0;
            c.offload_dir = dir;
            std::ostringstream log;
            test::StepAllocations count;
            const nlohmann::json offloaded = run_training(c, log, &count);
            EXPECT_EQ(loss_bits(offloaded), loss_bits(resident));
            expect_every_tier_measured(offloaded);
            EXPECT_EQ(count.allocations, 0);
            EXPECT_EQ(category_bytes(offloaded, tier, "parameters"), shards);
            EXPECT_EQ(category_bytes(offloaded, Tier::device, "parameters"), 0u);
            EXPECT_TRUE(fs::is_empty(dir)) << "the tier's file outlived the run";
          }
      }
}

TEST(ParamOffload, CheckpointsResumeBitForBitWithAndWithoutOffload) {
  const std::string root = scratch("params-resume");
  RunConfig whole = stage3("gpt2-tiny", Precision::bf16, OptimizerKind::adamw, 8);
  whole.val_fraction = 0;
  const std::vector<uint32_t> reference = loss_bits(train(whole));
  RunConfig saving = whole;
  saving.policy.offload_params = Tier::disk;
  saving.policy.offload_optimizer = Tier::disk;
  saving.offload_dir = root + "/tier";
  fs::create_directories(saving.offload_dir);
  saving.checkpoint_dir = root + "/ckpt";
  saving.checkpoint_every = 4;
  EXPECT_EQ(loss_bits(train(saving)), reference);
  const std::vector<uint32_t> tail(reference.begin() + 4, reference.end());
  for (Tier tier : {Tier::disk, Tier::host, Tier::device}) {
    SCOPED_TRACE(tier_name(tier));
    RunConfig resumed = saving;
    resumed.checkpoint_dir.clear();
    resumed.policy.offload_params = tier;
    resumed.resume = root + "/ckpt/step-000004";
    EXPECT_EQ(loss_bits(train(resumed)), tail);
  }
}

TEST(ParamOffload, PlanGivesTheFiguresTheRunMeasures) {
  const std::string dir = scratch("params-plan");
  for (const char* optimizer : {"device", "disk"}) {
    SCOPED_TRACE(optimizer);
    const std::string flags = fmt::format("--model gpt2-tiny --batch 2 --seq 32 --precision bf16 --val-fraction 0 "
                                          "--zero 3 --offload-params disk --offload-optimizer {} --offload-dir {}",
                                          optimizer, dir);
    const auto plan = test::run_memfit("plan --json " + flags);
    ASSERT_EQ(plan.status, 0) << plan.err;
    const std::string report = dir + "/report.json";
    const auto train = test::run_memfit("train --steps 2 " + flags + " --report-json " + report);
    ASSERT_EQ(train.status, 0) << train.err;
    std::ifstream in(report);
    const nlohmann::json measured = nlohmann::json::parse(in)["memory"]["measured_peak_bytes"];
    const nlohmann::json planned = nlohmann::json::parse(plan.out)["memory"]["planned_peak_bytes"];
    for (const char* t : {"device", "host", "disk"}) EXPECT_EQ(planned[t], measured[t]) << t;
    EXPECT_GT(planned["disk"].get<uint64_t>(), 0u);
  }
}

TEST(ParamOffload, TruncatedTierFileFailsTheRunAndKeepsTheCheckpoint) {
  const std::string root = scratch("params-truncate");
  RunConfig c = stage3("gpt2-tiny", Precision::fp32, OptimizerKind::adamw, 6);
  c.val_fraction = 0;
  c.policy.offload_params = Tier::disk;
  c.offload_dir = root + "/tier";
  fs::create_directories(c.offload_dir);
  c.checkpoint_dir = root + "/ckpt";
  c.checkpoint_every = 2;
  TruncateTierFile hook(c.offload_dir + "/memfit-rank0.tier", 4);
  std::ostringstream log;
  std::string what = "(no error)";
  try {
    run_training(c, log, &hook);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("[io] transfer 'offload.in.params."), std::string::npos) << what;
  EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  RunConfig resumed = c;
  resumed.checkpoint_dir.clear();
  resumed.resume = root + "/ckpt/step-000002";
  RunConfig straight = c;
  straight.checkpoint_dir.clear();
  const std::vector<uint32_t> all = loss_bits(train(straight));
  EXPECT_EQ(loss_bits(train(resumed)), std::vector<uint32_t>(all.begin() + 2, all.end()));
}

TEST(ParamOffload, RefusedBelowStageThreeInOneLine) {
  RunConfig c = tiny("gpt2-tiny", Precision::fp32, OptimizerKind::adamw, 2);
  c.policy.zero_stage = 2;
  c.policy.offload_params = Tier::host;
  const std::string what = failure(c);
  EXPECT_NE(what.find("needs ZeRO stage 3"), std::string::npos) << what;
  EXPECT_NE(what.find("--zero 3"), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
}

TEST(ParamOffload, DiagnosisProposesItAtStageThreeWhenItFits) {
  auto backend = make_cpu_backend();
  RunConfig c = stage3("gpt2-tiny", Precision::fp32, OptimizerKind::adamw, 2);
  c.val_fraction = 0;
  const uint64_t budget = 15 * MiB;
  const PreparedRun run = prepare_run(c, *backend);
  ASSERT_GT(memory_peak(run.compiled.plan), budget);
  const BudgetDiagnosis d = diagnose_budget(c, run, budget, *backend);
  const FitSuggestion* offload = nullptr;
  for (const FitSuggestion& s : d.suggestions)
    if (s.flags == "--offload-params disk --offload-dir .") offload = &s;
  ASSERT_NE(offload, nullptr) << d.report;
  EXPECT_TRUE(offload->fits) << d.report;
  EXPECT_EQ(offload->cost, ChangeCost::more_io);
  // Followed: the run trains within the budget, measuring what the diagnosis planned.
  RunConfig fixed = c;
  fixed.policy.offload_params = Tier::disk;
  fixed.offload_dir = scratch("params-budget");
  fixed.memory_budget = budget;
  const nlohmann::json r = train(fixed);
  const auto& planned = r["memory"]["planned_peak_bytes"];
  EXPECT_EQ(planned["device"].get<uint64_t>() + planned["host"].get<uint64_t>(), offload->peak);
  EXPECT_LE(offload->peak, budget);
  expect_every_tier_measured(r);
  // Below stage 3 DeepSpeed's rule holds: parameter offload is not offered.
  c.policy.zero_stage = 2;
  const PreparedRun two = prepare_run(c, *backend);
  if (memory_peak(two.compiled.plan) > budget) {
    for (const FitSuggestion& s : diagnose_budget(c, two, budget, *backend).suggestions) {
      EXPECT_EQ(s.flags.find("--offload-params"), std::string::npos) << s.flags;
    }
  }
}

TEST(ParamOffload, ProfileShowsTheFetchesOnTheTransferTracks) {
  const std::string dir = scratch("params-profile");
  const auto r = test::run_memfit("profile --steps 2 --model gpt2-tiny --batch 2 --seq 32 --val-fraction 0 --zero 3 "
                                  "--offload-params disk --offload-optimizer disk --offload-dir " + dir + " --out " +
                                  dir + "/profile");
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(dir + "/profile/trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, std::string> track;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e.contains("tid")) track[e["tid"].get<int>()] = e["args"]["name"];
  int fetches = 0, writes = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || !e.contains("tid")) continue;
    const std::string name = e["name"], on = track[e["tid"].get<int>()];
    fetches += on == "transfer.in" && name.starts_with("offload.in.params.");
    writes += on == "transfer.out" && name.starts_with("offload.out.params.");
  }
  EXPECT_GT(fetches, 0);
  EXPECT_GT(writes, 0);
  EXPECT_NE(r.out.find("transfers transfer.in"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace memfit
