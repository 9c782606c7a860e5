// The views of a plan used by the profiler, the leak guard and the out-of-memory report agree
// with the planner's own numbers: buffers rebuilt from the placements add up to the plan's
// timeline at every op (per category too), the highest live buffer at each op reaches the
// planned peak exactly at the peak op, and the tensors live at the peak (and their per-layer
// sums) add up to the live bytes there. Also the plan search: the largest fitting value of a
// monotone predicate, found with O(log) probes.
#include <gtest/gtest.h>

#include <random>

#include "graph/training_program.hpp"
#include "plan/breakdown.hpp"
#include "plan/search.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

void expect_views_agree(const Policy& pol) {
  const Program p = build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities());
  const MemoryPlan plan = plan_memory(p);
  const std::vector<PlannedBuffer> buffers = planned_buffers(p, plan);
  const TierPlan& dev = plan.tier(Tier::device);
  const int n = int(p.ops().size());
  for (int op = 0; op < n; ++op) {
    const std::vector<LiveTensor> live = live_tensors_at(p, plan, buffers, Tier::device, op);
    uint64_t total = 0;
    CategoryBytes by{};
    for (const LiveTensor& t : live) total += t.bytes, by[size_t(t.category)] += t.bytes;
    ASSERT_EQ(total, dev.live_bytes[size_t(op)]) << "op " << op;
    ASSERT_EQ(by, dev.live_by_category[size_t(op)]) << "op " << op;
    uint64_t layer_total = 0;
    for (const LayerBytes& l : bytes_by_layer(live)) layer_total += l.total;
    ASSERT_EQ(layer_total, total);
  }
  const std::vector<uint64_t> top = planned_arena_top(buffers, Tier::device, n);
  EXPECT_EQ(*std::max_element(top.begin(), top.end()), dev.peak_bytes);
  EXPECT_EQ(top[size_t(dev.peak_op)], dev.peak_bytes);
  // The peak op is the first op reaching the peak.
  for (int op = 0; op < dev.peak_op; ++op) EXPECT_LT(top[size_t(op)], dev.peak_bytes) << op;
  for (int op = 0; op < n; ++op) EXPECT_GE(top[size_t(op)], dev.live_bytes[size_t(op)]) << op;
}

TEST(PlanViews, AgreeWithThePlannerOnGpt2Tiny) {
  Policy pol;
  pol.batch = 4;
  pol.seq = 64;
  expect_views_agree(pol);
}

TEST(PlanViews, AgreeWithAccumulationAndChunks) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 48;
  pol.grad_accum = 3;
  pol.classifier_chunk_rows = 40;
  expect_views_agree(pol);
}

TEST(PlanViews, PeakTensorsNameTheirOps) {
  Policy pol;
  pol.batch = 4;
  pol.seq = 64;
  const Program p = build_training_program(model_preset("gpt2-tiny"), pol, {}, cpu_capabilities());
  const MemoryPlan plan = plan_memory(p);
  const auto live = live_tensors_at(p, plan, planned_buffers(p, plan), Tier::device, plan.tier(Tier::device).peak_op);
  ASSERT_FALSE(live.empty());
  for (size_t i = 1; i < live.size(); ++i) EXPECT_GE(live[i - 1].bytes, live[i].bytes);
  for (const LiveTensor& t : live) {
    const std::string d = describe_live_tensor(p, t);
    EXPECT_NE(d.find(p.tensor(t.tensor).name), std::string::npos);
    if (!t.persistent) {
      EXPECT_NE(d.find(p.op(t.born).name), std::string::npos) << d;
    }
  }
}

TEST(FitSearch, FindsTheThresholdWithFewProbes) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t hi = 1 + int64_t(rng() % 5000);
    const int64_t threshold = int64_t(rng() % uint32_t(hi + 2));  // 0: nothing fits; > hi: everything
    int calls = 0;
    FitSearch s([&](int64_t v) {
      ++calls;
      return v <= threshold;
    });
    const int64_t got = s.largest(1, hi);
    EXPECT_EQ(got, std::min(threshold, hi)) << "hi " << hi << " threshold " << threshold;
    EXPECT_LE(calls, 2 * 14 + 2);
    EXPECT_EQ(calls, s.probes());  // memoised: no value probed twice
  }
}

}  // namespace
}  // namespace memfit
