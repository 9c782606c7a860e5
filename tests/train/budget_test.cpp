// Out-of-memory before it happens. An over-budget run stops before step 1 with one line on
// stderr (budget, planned peak, overflow, op and category at the peak, the cheapest change
// that fits) and the full breakdown on stdout; following the suggested change makes the same
// run fit and train, with measured == planned. Every suggestion listed as fitting is checked
// by planning it again through `memfit plan`, independently of the diagnosis.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "support/run_cli.hpp"
#include "train/budget.hpp"
#include "train/candidates.hpp"

namespace memfit {
namespace {

using test::run_memfit;

const std::string kRun = "--model gpt2-tiny --batch 4 --seq 64";
constexpr uint64_t kBudget = 16 * MiB;

TEST(Budget, OverBudgetRunStopsBeforeStepOneAndTheSuggestionFits) {
  const std::string report = test::temp_dir() + "/budget.json";
  const auto r = run_memfit("train --steps 3 " + kRun + " --memory-budget 16MiB --report-json " + report);
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("memfit: error: [plan] ", 0), 0u) << r.err;
  EXPECT_FALSE(std::regex_search(r.out, std::regex("step +1/"))) << "a step ran:\n" << r.out;
  EXPECT_FALSE(std::ifstream(report).good());

  // The numbers, checked against the plan of the same run.
  auto backend = make_cpu_backend();
  RunConfig c;
  c.policy.batch = 4;
  c.policy.seq = 64;
  const PreparedRun run = prepare_run(c, *backend);
  const TierPlan& dev = run.compiled.plan.tier(Tier::device);
  const Op& peak_op = run.compiled.program.op(dev.peak_op);
  for (const std::string& needle :
       {format_bytes(dev.peak_bytes), std::string("budget is 16.00 MiB"), format_bytes(dev.peak_bytes - kBudget) + " over",
        "'" + peak_op.name + "'", std::string("activations is the largest category")})
    EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' missing from: " << r.err;
  for (const std::string& needle : {std::string("memory budget exceeded"), fmt::format("({} bytes) over", dev.peak_bytes - kBudget),
                                    std::string("largest tensors live at the peak"),
                                    std::string("changes that make it fit")})
    EXPECT_NE(r.out.find(needle), std::string::npos) << "'" << needle << "' missing from:\n" << r.out;

  // Follow the cheapest suggestion: the same run with it trains within the same budget.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("cheapest change that fits: (.*) \\(peak"))) << r.err;
  const std::string flags = m[1];
  const auto fixed =
      run_memfit("train --threads 1 --steps 2 " + kRun + " --memory-budget 16MiB " + flags + " --report-json " + report);
  ASSERT_EQ(fixed.status, 0) << flags << "\n" << fixed.out << fixed.err;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  const uint64_t planned = j["memory"]["planned_peak_bytes"]["device"];
  EXPECT_LE(planned, kBudget);
  EXPECT_EQ(j["memory"]["measured_peak_bytes"]["device"], planned);
  EXPECT_LT(j["loss"]["last"].get<double>(), j["loss"]["first"].get<double>());
  std::printf("followed '%s': planned peak %s within 16 MiB\n", flags.c_str(), format_bytes(planned).c_str());
}

TEST(Budget, EverySuggestionMarkedFittingFitsWhenPlannedAgain) {
  auto backend = make_cpu_backend();
  RunConfig c;
  c.policy.batch = 8;
  c.policy.seq = 64;
  c.policy.grad_accum = 2;
  const PreparedRun run = prepare_run(c, *backend);
  const uint64_t budget = 24 * MiB;
  ASSERT_GT(run.compiled.plan.tier(Tier::device).peak_bytes, budget);
  const BudgetDiagnosis d = diagnose_budget(c, run, budget, *backend);
  EXPECT_EQ(d.peak, run.compiled.plan.tier(Tier::device).peak_bytes);
  ASSERT_FALSE(d.suggestions.empty());
  int fitting = 0;
  for (size_t i = 0; i < d.suggestions.size(); ++i) {
    const FitSuggestion& s = d.suggestions[i];
    if (i > 0) {
      EXPECT_LE(d.suggestions[i].fits, d.suggestions[i - 1].fits) << "fitting suggestions come first";
    }
    EXPECT_EQ(s.fits, s.peak <= budget) << s.flags;
    const auto p = run_memfit("plan --json --model gpt2-tiny --batch 8 --seq 64 --grad-accum 2 " + s.flags);
    ASSERT_EQ(p.status, 0) << s.flags << p.err;
    // The budget bounds this machine's memory: the device and host tiers (disk offload stages
    // chunks on the host tier).
    const auto planned = nlohmann::json::parse(p.out)["memory"]["planned_peak_bytes"];
    const uint64_t peak = planned["device"].get<uint64_t>() + planned["host"].get<uint64_t>();
    EXPECT_EQ(peak, s.peak) << s.flags;
    fitting += s.fits;
  }
  EXPECT_GT(fitting, 0);
  // Accumulation keeping the global batch of 16 sequences is among them and costs no math.
  bool keeps_global = false;
  for (const FitSuggestion& s : d.suggestions) {
    std::smatch m;
    if (s.fits && std::regex_search(s.flags, m, std::regex("--batch (\\d+) --grad-accum (\\d+)"))) {
      EXPECT_EQ(std::stoi(m[1]) * std::stoi(m[2]), 16) << s.flags;
      // Alone it is the same math; with a technique it costs what the technique costs.
      if (m.prefix().length() == 0) {
        EXPECT_EQ(s.cost, ChangeCost::same_math);
        keeps_global = true;
      } else {
        EXPECT_EQ(s.parts, 2) << s.flags;
      }
    }
  }
  EXPECT_TRUE(keeps_global);
  std::printf("%s", d.report.c_str());
}

TEST(Budget, PlanWithABudgetShowsTheSameDiagnosis) {
  const auto p = run_memfit("plan " + kRun + " --memory-budget 16MiB");
  EXPECT_EQ(p.status, 0) << p.err;
  EXPECT_NE(p.out.find("memory budget exceeded"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("--batch 1 --grad-accum 4"), std::string::npos) << p.out;
  const auto fits = run_memfit("plan " + kRun + " --memory-budget 1GiB");
  EXPECT_EQ(fits.out.find("memory budget exceeded"), std::string::npos) << fits.out;
}

// Below even QLoRA's state (2.98 MiB at batch 1, in bf16): nothing fits.
TEST(Budget, NothingFitsBelowThePersistentState) {
  const auto r = run_memfit("train --steps 1 " + kRun + " --memory-budget 2MiB");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no single change or pair of changes fits"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("the persistent tensors alone"), std::string::npos) << r.out;
}


// gpt2-tiny, batch 1 x 64: its persistent state (weights, gradients, AdamW state) alone
// exceeds 8 MiB, and no single change that still trains every weight (8-bit state, disk
// offload, ...) brings it under; 8-bit state with disk offload does at 8 MiB but not at 7 MiB;
// LoRA does, and with an NF4 base so does 6 MiB. The peaks are checked
// against `memfit plan` of the changed run, and the cheapest proposal is followed.
const std::string kSmallRun = "--model gpt2-tiny --batch 1 --seq 64";
const std::string kLora = "--lora-rank 8 --lora-alpha 16 --lora-targets all-linear";
const std::string kNf4 = "--quantize-base nf4 --double-quant";

uint64_t planned_memory(const std::string& flags) {
  const auto p = run_memfit("plan --json " + flags);
  EXPECT_EQ(p.status, 0) << flags << p.err;
  const auto planned = nlohmann::json::parse(p.out)["memory"]["planned_peak_bytes"];
  return planned["device"].get<uint64_t>() + planned["host"].get<uint64_t>();
}

BudgetDiagnosis diagnose(const std::string& flags, uint64_t budget) {
  auto backend = make_cpu_backend();
  RunConfig c;
  c.policy.batch = 1;
  c.policy.seq = 64;
  if (flags.find("--lora-rank") != std::string::npos) {
    c.policy.lora.rank = 8;
    c.policy.lora.alpha = 16;
    c.policy.lora.targets = {"all-linear"};
  }
  const PreparedRun run = prepare_run(c, *backend);
  EXPECT_GT(memory_peak(run.compiled.plan), budget);
  return diagnose_budget(c, run, budget, *backend);
}

TEST(Budget, LoraIsProposedLastWhenNothingThatTrainsEveryWeightFits) {
  const uint64_t lora = planned_memory(kSmallRun + " " + kLora);
  const uint64_t qlora = planned_memory(kSmallRun + " " + kLora + " " + kNf4);
  ASSERT_LT(qlora, 6 * MiB);
  ASSERT_LT(6 * MiB, lora);
  ASSERT_LT(lora, 7 * MiB);

  // At 8 MiB a pair of changes that train every weight fits: nothing changes what trains.
  const BudgetDiagnosis pair = diagnose(kSmallRun, 8 * MiB);
  ASSERT_TRUE(pair.suggestions.at(0).fits) << pair.report;
  EXPECT_EQ(pair.suggestions[0].flags, "--optimizer adamw8bit --offload-optimizer disk --offload-dir .");
  EXPECT_EQ(pair.suggestions[0].parts, 2);
  EXPECT_EQ(pair.suggestions[0].peak,
            planned_memory(kSmallRun + " --optimizer adamw8bit --offload-optimizer disk --offload-dir ."));
  for (const FitSuggestion& s : pair.suggestions) {
    EXPECT_NE(s.cost, ChangeCost::changes_what_trains) << s.flags;
    EXPECT_TRUE(!s.fits || s.parts == 2) << s.flags << " fits alone";
  }

  // Both fit at 7 MiB; within a cost class the smaller peak comes first (QLoRA computes in bf16).
  const BudgetDiagnosis d7 = diagnose(kSmallRun, 7 * MiB);
  ASSERT_GE(d7.suggestions.size(), 2u);
  EXPECT_EQ(d7.suggestions[0].flags, kLora + " " + kNf4);
  EXPECT_EQ(d7.suggestions[0].peak, qlora);
  EXPECT_EQ(d7.suggestions[1].flags, kLora);
  EXPECT_EQ(d7.suggestions[1].peak, lora);
  for (const FitSuggestion& s : d7.suggestions) {
    EXPECT_EQ(s.fits, s.cost == ChangeCost::changes_what_trains) << s.flags;
    EXPECT_EQ(s.fits, s.peak <= 7 * MiB) << s.flags;
  }
  const BudgetDiagnosis d6 = diagnose(kSmallRun, 6 * MiB);
  ASSERT_FALSE(d6.suggestions.empty());
  EXPECT_EQ(d6.suggestions[0].flags, kLora + " " + kNf4);
  EXPECT_TRUE(d6.suggestions[0].fits);
  EXPECT_EQ(std::count_if(d6.suggestions.begin(), d6.suggestions.end(), [](const FitSuggestion& s) { return s.fits; }),
            1);
  EXPECT_NE(d6.report.find(kLora + " "), std::string::npos) << "LoRA alone helps: " << d6.report;

  // Where 8-bit AdamW alone fits, nothing that changes what trains is offered.
  const BudgetDiagnosis d10 = diagnose(kSmallRun, 10 * MiB);
  ASSERT_TRUE(d10.suggestions.at(0).fits);
  for (const FitSuggestion& s : d10.suggestions) EXPECT_NE(s.cost, ChangeCost::changes_what_trains) << s.flags;

  // A LoRA run is offered the quantised base as lower precision, tried with the others.
  const BudgetDiagnosis dl = diagnose(kSmallRun + " " + kLora, 5 * MiB);
  const auto nf4 = std::find_if(dl.suggestions.begin(), dl.suggestions.end(),
                                [](const FitSuggestion& s) { return s.flags == kNf4; });
  ASSERT_NE(nf4, dl.suggestions.end()) << dl.report;
  EXPECT_TRUE(nf4->fits);
  EXPECT_EQ(nf4->cost, ChangeCost::lower_precision);
  EXPECT_EQ(nf4->peak, qlora);
  for (const FitSuggestion& s : dl.suggestions) EXPECT_NE(s.cost, ChangeCost::changes_what_trains) << s.flags;
  std::printf("%s", d6.report.c_str());
}

TEST(Budget, FollowingTheLoraProposalTrainsWithinTheBudget) {
  const std::string report = test::temp_dir() + "/budget_lora.json";
  const auto r = run_memfit("train --steps 2 " + kSmallRun + " --memory-budget 6MiB");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("cheapest change that fits: (.*) \\(peak"))) << r.err;
  EXPECT_EQ(m[1], kLora + " " + kNf4);
  const auto fixed = run_memfit("train --threads 1 --steps 3 " + kSmallRun + " --memory-budget 6MiB " +
                                std::string(m[1]) + " --report-json " + report);
  ASSERT_EQ(fixed.status, 0) << fixed.out << fixed.err;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  const uint64_t planned = j["memory"]["planned_peak_bytes"]["device"];
  EXPECT_LE(planned, 6 * MiB);
  EXPECT_EQ(j["memory"]["measured_peak_bytes"]["device"], planned);
}

}  // namespace
}  // namespace memfit
