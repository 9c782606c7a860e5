// `memfit max-batch` against an oracle that runs real steps: for every micro-batch from 1 up,
// gpt2-tiny is built, one training step and one validation pass run in a fresh arena, and
// the arena's measured high-water mark decides whether it fits the budget. The plan search
// must answer within one of the oracle's largest fitting batch (it answers it exactly), the
// CLI must agree and verify its answer with a real step, and with --seq auto every point of
// the frontier must fit while the next batch does not, the answer being the longest sequence.
#include <gtest/gtest.h>
#include <omp.h>

#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/bytes.hpp"
#include "support/run_cli.hpp"
#include "support/tiny_run.hpp"
#include "train/candidates.hpp"
#include "train/max_batch.hpp"

namespace memfit {
namespace {

constexpr uint64_t kBudget = 30 * MiB;
constexpr int64_t kSeq = 64;

// Largest batch whose real step (and validation pass) stays within the budget.
int64_t oracle_max_batch(uint64_t budget, int64_t seq) {
  int64_t best = 0;
  for (int64_t b = 1; b <= 64; ++b) {
    Policy pol;
    pol.batch = b;
    pol.seq = seq;
    test::TinyRun run(pol);
    run.step(1);
    run.eval();
    const uint64_t measured = run.ex->arena(Tier::device).measured_high_water();
    std::printf("oracle: batch %ld measured %s\n", long(b), format_bytes(measured).c_str());
    if (measured > budget) break;
    best = b;
  }
  return best;
}

TEST(MaxBatch, AnswersWithinOneOfRealSteps) {
  // One kernel thread throughout (many short runs stay fast when tests share the cores). The
  // thread count is part of the plan: oneDNN's scratch, which the plan counts, depends on it.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const int64_t truth = oracle_max_batch(kBudget, kSeq);
  ASSERT_GE(truth, 2);
  auto backend = make_cpu_backend();
  RunConfig c;
  c.policy.seq = kSeq;
  const MaxBatchAnswer a = search_max_batch(c, false, kBudget, *backend);
  EXPECT_LE(std::abs(a.batch - truth), 1) << "search " << a.batch << ", real steps " << truth;
  EXPECT_EQ(a.batch, truth);
  EXPECT_LE(a.peak, kBudget);
  EXPECT_GT(a.next_peak, kBudget);
  EXPECT_LE(a.plans, 12);

  const auto r = test::run_memfit("max-batch --threads 1 --json --seq 64 --memory-budget 30MiB");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["batch"], a.batch);
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["measured_peak_bytes"], j["peak_bytes"]);
  EXPECT_EQ(j["peak_bytes"], a.peak);
  omp_set_num_threads(threads);
}

TEST(MaxBatch, TextShowsThePlansAtTheAnswerAndOneMore) {
  const auto r = test::run_memfit("max-batch --seq 64 --memory-budget 30MiB --no-verify");
  ASSERT_EQ(r.status, 0) << r.err;
  auto backend = make_cpu_backend();
  RunConfig c;
  c.policy.seq = kSeq;
  const MaxBatchAnswer a = search_max_batch(c, false, kBudget, *backend);
  EXPECT_NE(r.out.find(fmt::format("largest micro-batch that fits: {} x 64", a.batch)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("plan at batch {} (fits)", a.batch)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("plan at batch {} (does not fit", a.batch + 1)), std::string::npos) << r.out;
}

TEST(MaxBatch, SeqAutoFrontierFitsAndIsTight) {
  const auto r = test::run_memfit("max-batch --json --seq auto --memory-budget 30MiB --no-verify");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  auto backend = make_cpu_backend();
  ASSERT_EQ(j["frontier"].size(), 5u);  // 256, 128, 64, 32, 16
  // The answer is the longest sequence with a fitting batch, at its largest batch.
  EXPECT_EQ(j["seq"], j["frontier"][0]["seq"]);
  EXPECT_EQ(j["batch"], j["frontier"][0]["batch"]);
  for (const auto& f : j["frontier"]) {
    RunConfig c;
    c.policy.seq = f["seq"];
    const int64_t b = f["batch"];
    ASSERT_GE(b, 1);
    EXPECT_LE(plan_candidate(with_batch(c, b), *backend).peak, kBudget) << f;
    EXPECT_GT(plan_candidate(with_batch(c, b + 1), *backend).peak, kBudget) << f;
  }
}

// When not even batch 1 fits, max-batch prints the out-of-memory diagnosis of batch 1 (single
// changes and pairs, each planned); the cheapest change appended to the command finds a batch,
// and one real step at it measures its plan.
TEST(MaxBatch, NothingFitsShowsTheChangesThatWouldAndTheyDo) {
  const std::string cmd = "max-batch --threads 1 --seq 64 --memory-budget 8MiB";
  const auto r = test::run_memfit(cmd);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not even batch 1"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("batch 1 x 64 tokens does not fit"), std::string::npos) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("append one to the command\\):\n    (--.*?) +peak"))) << r.out;
  const auto fixed = test::run_memfit(cmd + " --json " + std::string(m[1]));
  ASSERT_EQ(fixed.status, 0) << m[1] << "\n" << fixed.err;
  const auto j = nlohmann::json::parse(fixed.out);
  EXPECT_GE(j["batch"].get<int64_t>(), 1) << m[1];
  // Verified: the device tier measured its plan. The peak is device and host (disk offload
  // stages chunks on the host tier), so the device's share is at most that.
  EXPECT_EQ(j["verified"], true);
  EXPECT_LE(j["measured_peak_bytes"].get<uint64_t>(), j["peak_bytes"].get<uint64_t>());
  EXPECT_LE(j["peak_bytes"].get<uint64_t>(), 8 * MiB);
  std::printf("followed '%s': batch %ld fits 8 MiB\n", std::string(m[1]).c_str(), long(j["batch"].get<int64_t>()));
}

TEST(MaxBatch, RefusesNonsense) {
  const auto r = test::run_memfit("max-batch --seq 64 --memory-budget 1MiB --no-verify");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not even batch 1"), std::string::npos) << r.err;
  const auto t = test::run_memfit("train --seq auto --steps 1");
  EXPECT_EQ(t.status, 1);
  EXPECT_NE(t.err.find("only for max-batch"), std::string::npos) << t.err;
  const auto u = test::run_memfit("max-batch --seq 64 --recompute selective:softmax --no-verify");
  EXPECT_EQ(u.status, 1);
  EXPECT_EQ(std::count(u.err.begin(), u.err.end(), '\n'), 1) << u.err;
}

}  // namespace
}  // namespace memfit
