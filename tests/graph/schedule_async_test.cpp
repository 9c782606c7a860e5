// The overlap pass on ZeRO programs of every stage (planned for rank 0 of 2 and 4 ranks,
// without MPI). Oracles, checked from the op list directly rather than through the pass's own
// helper: every started collective has exactly one wait, later in its section; no op between
// them touches the bytes the collective writes or writes the bytes it reads; no second
// collective of its class starts in between; the collectives that have something to overlap
// with (ZeRO-3's prefetched gathers, stage 2's bucket reduce-scatters) are indeed in flight
// across compute ops; and the memory plan keeps every in-flight buffer alive until its wait.
#include <gtest/gtest.h>

#include <map>

#include "graph/schedule_async.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {
namespace {

struct Bytes {
  TensorId root;
  uint64_t begin, end;
};
Bytes bytes_of(const Program& p, TensorId id) {
  const TensorDesc& t = p.tensor(id);
  const uint64_t b = t.is_view() ? t.view_offset : 0;
  return {p.root_of(id), b, b + t.bytes()};
}
bool overlap(const Bytes& a, const Bytes& b) { return a.root == b.root && a.begin < b.end && b.begin < a.end; }
bool any_overlap(const Program& p, const std::vector<TensorId>& xs, const std::vector<TensorId>& ys) {
  for (TensorId x : xs)
    for (TensorId y : ys)
      if (x != kNoTensor && y != kNoTensor && overlap(bytes_of(p, x), bytes_of(p, y))) return true;
  return false;
}

Program zero_program(int stage, int world, int accum, bool overlap_comm = true) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  pol.grad_accum = accum;
  pol.zero_stage = stage;
  pol.overlap_comm = overlap_comm;
  return build_training_program(model_preset("gpt2-tiny"), pol, Topology{.data = world, .rank = 0});
}

TEST(OverlapCollectives, EveryStartHasOneLaterWaitAndNothingTouchesItsBytesInBetween) {
  for (int stage : {0, 1, 2, 3})
    for (int world : {2, 4})
      for (int accum : {1, 2}) {
        SCOPED_TRACE(testing::Message() << "stage " << stage << ", world " << world << ", accumulation " << accum);
        const Program p = zero_program(stage, world, accum);
        std::map<int, int> start_of, wait_of;  // async id -> op index
        for (int i = 0; i < int(p.ops().size()); ++i) {
          const int id = p.op(i).async_id;
          if (id < 0) continue;
          auto& slot = p.op(i).kind == OpKind::wait ? wait_of : start_of;
          EXPECT_TRUE(slot.emplace(id, i).second) << "id " << id << " used twice";
        }
        ASSERT_EQ(start_of.size(), wait_of.size());
        int overlapped_ops = 0;
        for (const auto& [id, s] : start_of) {
          ASSERT_TRUE(wait_of.count(id));
          const int w = wait_of.at(id);
          const Op& start = p.op(s);
          ASSERT_LT(s, w);
          EXPECT_EQ(p.section_of_op(s), p.section_of_op(w)) << start.name;
          EXPECT_EQ(p.op(w).outputs, start.outputs);
          EXPECT_EQ(p.op(w).inputs, start.inputs);
          const bool reduces = start.kind == OpKind::all_reduce || start.kind == OpKind::reduce_scatter;
          for (int j = s + 1; j < w; ++j) {
            const Op& op = p.op(j);
            if (op.kind == OpKind::wait) continue;
            ++overlapped_ops;
            SCOPED_TRACE(start.name + " in flight across " + op.name);
            EXPECT_FALSE(any_overlap(p, op.inputs, start.outputs));
            EXPECT_FALSE(any_overlap(p, op.outputs, start.outputs));
            EXPECT_FALSE(any_overlap(p, op.workspace, start.outputs));
            EXPECT_FALSE(any_overlap(p, op.outputs, start.inputs));
            if (is_collective_kind(op.kind)) {
              EXPECT_NE(reduces, op.kind == OpKind::all_reduce || op.kind == OpKind::reduce_scatter);
            }
          }
        }
        // What must overlap does: ZeRO-3 prefetches every gather after the first of a pass;
        // stage 2 reduce-scatters a bucket while the next block's backward runs (k = 1).
        int gathers = 0, async_gathers = 0, scatters = 0, async_scatters = 0;
        for (const Op& op : p.ops()) {
          if (op.kind == OpKind::all_gather && op.name.ends_with(".forward")) ++gathers, async_gathers += op.async_id >= 0;
          if (op.kind == OpKind::reduce_scatter && op.phase == Phase::communication && op.name.starts_with("zero.reduce_scatter.h"))
            ++scatters, async_scatters += op.async_id >= 0;
        }
        if (stage == 3) {
          EXPECT_GT(gathers, 1);
          EXPECT_EQ(async_gathers, gathers - 1);
        }
        if (stage >= 2) { EXPECT_GT(scatters, 1); }
        if (stage >= 2 && accum == 1) { EXPECT_GE(async_scatters, scatters - 1); }
        if (stage >= 2 && accum == 1) { EXPECT_GT(overlapped_ops, 0); }
      }
}

TEST(OverlapCollectives, ThePlanKeepsInFlightBuffersAliveAndTheBlockingFormHasNoWaits) {
  for (int stage : {2, 3}) {
    const Program p = zero_program(stage, 2, 1);
    const MemoryPlan plan = plan_memory(p);
    for (const AsyncSpan& c : async_spans(p)) {
      std::vector<TensorId> ids = p.op(c.start).outputs;
      ids.insert(ids.end(), p.op(c.start).inputs.begin(), p.op(c.start).inputs.end());
      for (TensorId id : ids) {
        const TensorPlacement& pl = plan.tensors[size_t(id)];
        ASSERT_GE(pl.buffer, 0) << p.tensor(id).name;
        // Live from (at or before) the start through (at least) the wait.
        EXPECT_LE(pl.live.first, c.start) << p.op(c.start).name;
        EXPECT_GE(pl.live.last, c.wait) << p.op(c.start).name;
      }
    }
    EXPECT_EQ(find_overlap(p, plan), "");
    const Program blocking = zero_program(stage, 2, 1, false);
    for (const Op& op : blocking.ops()) {
      EXPECT_NE(op.kind, OpKind::wait);
      EXPECT_LT(op.async_id, 0);
    }
    EXPECT_EQ(blocking.ops().size() + async_spans(p).size(), p.ops().size());
  }
}

}  // namespace
}  // namespace memfit
