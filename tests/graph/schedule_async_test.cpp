// The scheduling pass for asynchronous work (graph/schedule_async.hpp).
// On ZeRO programs of every stage (planned for rank 0 of 2 and 4 ranks, without MPI), oracles
// checked from the op list directly rather than through the pass's own helper: every started
// collective has exactly one wait, later in its section; no op between them touches the bytes
// the collective writes or writes the bytes it reads; no second collective of its class starts
// in between; the collectives that have something to overlap with (ZeRO-3's prefetched
// gathers, stage 2's bucket reduce-scatters) are indeed in flight across compute ops; and the
// memory plan keeps every in-flight buffer alive until its wait.
// On a hand-made program with transfers between the host and device tiers (no builder emits
// them yet), the whole scheduled op list against one worked out by hand from the rules, with
// --overlap-comm on and off (transfers are scheduled either way).
#include <gtest/gtest.h>

#include <map>

#include "graph/schedule_async.hpp"
#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "kernels/backend.hpp"
#include "support/hand_built.hpp"

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
  return build_training_program(model_preset("gpt2-tiny"), pol, Topology{.data = world, .rank = 0}, cpu_capabilities());
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

// Transfers between tiers and one collective, by hand. Op names say what each does.
struct TransferProgram {
  Program p;
  TensorId tensor(const std::string& name, Tier tier, Lifetime life = Lifetime::transient) {
    TensorDesc d;
    d.name = name;
    d.shape = Shape{256};
    d.tier = tier;
    d.lifetime = life;
    return p.add_tensor(std::move(d));
  }
  void op(OpKind kind, const std::string& name, std::vector<TensorId> in, std::vector<TensorId> out) {
    test::add_plain_op(p, kind, name, std::move(in), std::move(out));
  }

  TransferProgram() {
    const TensorId w_host = tensor("w_host", Tier::host, Lifetime::persistent), w = tensor("w", Tier::device);
    const TensorId v_host = tensor("v_host", Tier::host, Lifetime::persistent), v = tensor("v", Tier::device);
    const TensorId a_host = tensor("a_host", Tier::host, Lifetime::persistent);
    const TensorId b_host = tensor("b_host", Tier::host, Lifetime::persistent);
    const TensorId c_host = tensor("c_host", Tier::host, Lifetime::persistent);
    const TensorId x = tensor("x", Tier::device), y = tensor("y", Tier::device), z = tensor("z", Tier::device);
    const TensorId a = tensor("a", Tier::device, Lifetime::persistent), b = tensor("b", Tier::device);
    const TensorId c = tensor("c", Tier::device), e = tensor("e", Tier::device);
    const TensorId g = tensor("g", Tier::device, Lifetime::persistent), h = tensor("h", Tier::device);
    p.begin_section(SectionKind::micro);
    op(OpKind::fill, "fill_x", {}, {x});
    op(OpKind::transfer, "w.in", {w_host}, {w});  // read 3 ops later: prefetched
    op(OpKind::fill, "fill_y", {}, {y});
    op(OpKind::add, "z=x+y", {x, y}, {z});
    op(OpKind::add, "a=z+w", {z, w}, {a});
    op(OpKind::transfer, "a.out", {a}, {a_host});  // in flight until `a` is written again
    op(OpKind::fill, "fill_b", {}, {b});
    op(OpKind::fill, "fill_a", {}, {a});
    op(OpKind::transfer, "b.out", {b}, {b_host});  // in flight to the section's end (queue depth 8)
    op(OpKind::fill, "fill_c", {}, {c});
    op(OpKind::transfer, "c.out", {c}, {c_host});  // in flight to the section's end
    op(OpKind::transfer, "v.in", {v_host}, {v});   // read at once: blocking
    op(OpKind::add, "e=v+v", {v, v}, {e});
    p.end_section();
    p.begin_section(SectionKind::optimizer);
    op(OpKind::all_reduce, "g.all_reduce", {}, {g});  // read 2 ops later
    op(OpKind::fill, "fill_h", {}, {h});
    op(OpKind::add, "h=g+h", {g, h}, {h});
    p.end_section();
    p.validate();
  }
};

std::vector<std::string> schedule_of(const Program& p) {
  std::vector<std::string> out;
  for (const Op& op : p.ops())
    out.push_back(op.kind == OpKind::wait ? op.name : op.async_id >= 0 ? op.name + " (start)" : op.name);
  return out;
}

TEST(ScheduleAsync, TransfersStartEarlyAndWaitWhereTheRulesSay) {
  for (bool overlap_comm : {true, false}) {
    SCOPED_TRACE(overlap_comm ? "--overlap-comm on" : "--overlap-comm off");
    TransferProgram t;
    EXPECT_EQ(t.p.op(1).queue, Queue::transfer_in);
    EXPECT_EQ(t.p.op(5).queue, Queue::transfer_out);
    schedule_async(t.p, AsyncOptions{.overlap_comm = overlap_comm});
    t.p.validate();
    std::vector<std::string> expected = {
        "fill_x", "w.in (start)", "fill_y", "z=x+y", "w.in.wait",                // before the first reader of w
        "a=z+w", "a.out (start)", "fill_b", "a.out.wait", "fill_a",              // before `a` is overwritten
        "b.out (start)", "fill_c",                                               // still in flight at c.out's start
        "c.out (start)", "v.in", "e=v+v", "b.out.wait", "c.out.wait",            // at the end of its section
    };
    if (overlap_comm) expected.insert(expected.end(), {"g.all_reduce (start)", "fill_h", "g.all_reduce.wait", "h=g+h"});
    else expected.insert(expected.end(), {"g.all_reduce", "fill_h", "h=g+h"});
    EXPECT_EQ(schedule_of(t.p), expected);
    for (const Op& op : t.p.ops())
      if (op.kind == OpKind::wait) {
        EXPECT_EQ(op.phase, queue_engine(op.queue) == Engine::transfer ? Phase::transfer : Phase::communication) << op.name;
      }
    // Each section keeps its ops: the micro section's last op is its last wait.
    EXPECT_EQ(t.p.op(t.p.find_section(SectionKind::micro)->end - 1).name, "c.out.wait");
    // In-flight buffers stay alive until their waits, and nothing shares their bytes meanwhile.
    const MemoryPlan plan = plan_memory(t.p);
    EXPECT_EQ(find_overlap(t.p, plan), "");
    for (const AsyncSpan& span : async_spans(t.p)) {
      for (TensorId id : t.p.op(span.start).outputs) EXPECT_GE(plan.tensors[size_t(id)].live.last, span.wait);
      for (TensorId id : t.p.op(span.start).inputs) EXPECT_GE(plan.tensors[size_t(id)].live.last, span.wait);
    }
  }
}

TEST(ScheduleAsync, EachQueueKeepsAtMostItsDepthInFlight) {
  TransferProgram t;
  schedule_async(t.p, AsyncOptions{});
  for (const Program& p : {t.p, zero_program(3, 2, 1), zero_program(1, 4, 1)}) {
    std::map<Queue, int> in_flight;
    EXPECT_GT(async_spans(p).size(), 2u);
    for (const Op& op : p.ops()) {
      if (op.queue == Queue::compute) continue;
      if (op.kind == OpKind::wait) --in_flight[op.queue];
      else ++in_flight[op.queue];
      EXPECT_LE(in_flight[op.queue], queue_depth(op.queue)) << op.name;
      if (op.kind != OpKind::wait && op.async_id < 0) --in_flight[op.queue];  // blocking: done at once
    }
    for (const auto& [queue, n] : in_flight) EXPECT_EQ(n, 0) << queue_name(queue);
  }
}

}  // namespace
}  // namespace memfit
