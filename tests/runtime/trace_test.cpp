// The profiler's recording on real steps of gpt2-tiny: with the trace recorder and the
// sentinel fill watching every op, a step still allocates nothing; every op execution is
// recorded once in order; the measured arena top (a scan of the real memory after each op)
// never exceeds the planned top and equals it at every op; its maximum is the planned peak,
// which the arena still reports as its high-water mark although dead buffers were returned
// to the sentinel; the measured live bytes per category equal the plan's at every op; and the
// training results are bitwise those of a run without the observers (the fill only touches
// bytes the plan says are dead).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "plan/buffers.hpp"
#include "runtime/dead_buffers.hpp"
#include "runtime/trace.hpp"
#include "support/alloc_counter.hpp"
#include "support/run_cli.hpp"
#include "support/tiny_run.hpp"
#include "support/tensor_values.hpp"

namespace memfit {
namespace {

using test::TinyRun;

size_t ops_per_step(const Program& p) {
  size_t n = 0;
  for (const Section& s : p.sections())
    if (s.kind != SectionKind::eval) n += size_t(s.end - s.begin) * size_t(s.repeat);
  return n;
}

void expect_trace_matches_plan(const Policy& pol) {
  constexpr int kSteps = 3;
  TinyRun run(pol);
  TinyRun plain(pol);
  const Program& p = run.compiled.program;
  const size_t per_step = ops_per_step(p);
  const Section* eval = p.find_section(SectionKind::eval);
  TraceRecorder rec(per_step * kSteps + size_t(eval->end - eval->begin), run.ex.get());
  DeadBufferFill fill(*run.ex, Arena::kSentinel);
  run.ex->add_observer(&rec);
  run.ex->add_observer(&fill);

  run.step(1);
  plain.step(1);
  test::alloc_counter_start();
  for (int s = 2; s <= kSteps; ++s) run.step(s);
  run.eval();
  const test::AllocCounts counts = test::alloc_counter_stop();
  EXPECT_EQ(counts.memfit_allocations, 0);
  EXPECT_EQ(counts.library_bytes_outstanding, 0);
  for (int s = 2; s <= kSteps; ++s) plain.step(s);
  plain.eval();

  // Results are bitwise those of the run without observers.
  const float a = run.loss(), b = plain.loss();
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << a << " vs " << b;
  for (const ParamEntry& e : p.params())
    EXPECT_EQ(test::tensor_bytes(*run.ex, e.value), test::tensor_bytes(*plain.ex, e.value)) << e.name;

  // Every execution recorded once, in program order per step.
  ASSERT_EQ(rec.dropped(), 0u);
  const auto events = rec.events();
  ASSERT_EQ(events.size(), per_step * kSteps + size_t(eval->end - eval->begin));
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GE(events[i].begin, events[i - 1].end);
    EXPECT_GE(events[i].end, events[i].begin);
  }

  const MemoryPlan& plan = run.compiled.plan;
  const std::vector<uint64_t> top = planned_arena_top(planned_buffers(p, plan), Tier::device, int(p.ops().size()));
  uint64_t measured_max = 0;
  int equal = 0, live_equal = 0;
  for (const TraceEvent& e : events) {
    // Live bytes per category: every buffer the plan says is live holds data (a buffer born
    // at an op is written by it), and dead ones were returned to the sentinel.
    const CategoryBytes& planned = plan.tier(Tier::device).live_by_category[size_t(e.op)];
    for (Category c : kAllCategories) EXPECT_LE(e.measured_live[size_t(c)], planned[size_t(c)]);
    live_equal += e.measured_live == planned;
    const uint64_t m = e.measured_top[size_t(Tier::device)];
    EXPECT_LE(m, top[size_t(e.op)]) << "op " << e.op << " '" << p.op(e.op).name << "' step " << e.step;
    equal += m == top[size_t(e.op)];
    measured_max = std::max(measured_max, m);
  }
  EXPECT_EQ(equal, int(events.size()));
  EXPECT_EQ(live_equal, int(events.size()));
  EXPECT_EQ(measured_max, plan.tier(Tier::device).peak_bytes);
  EXPECT_EQ(run.ex->arena(Tier::device).measured_high_water(), plan.tier(Tier::device).peak_bytes);
  EXPECT_LT(run.ex->arena(Tier::device).scan_top(), plan.tier(Tier::device).peak_bytes);  // dead bytes were returned
  std::printf("%zu op executions; measured arena top equal to the planned top at %d, live bytes per category at %d\n",
              events.size(), equal, live_equal);
}

TEST(Trace, MeasuredTopsMatchThePlanAndStepsAllocateNothing) {
  Policy pol;
  pol.batch = 4;
  pol.seq = 64;
  expect_trace_matches_plan(pol);
}

TEST(Trace, SameWithAccumulation) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  pol.grad_accum = 3;
  expect_trace_matches_plan(pol);
}

TEST(Trace, FullBufferDropsRecordsWithoutAllocating) {
  Policy pol;
  pol.batch = 1;
  pol.seq = 16;
  TinyRun run(pol);
  TraceRecorder rec(10, nullptr);
  run.ex->add_observer(&rec);
  run.step(1);
  EXPECT_EQ(rec.events().size(), 10u);
  EXPECT_EQ(rec.dropped(), ops_per_step(run.compiled.program) - 10);
}

// Disk offload's transfers on their own tracks: one slice per started transfer and step, on
// the track of its queue, carrying its bytes; per step they move the offloaded tensors' bytes
// once each way.
TEST(Trace, DiskOffloadTransfersGetATrackPerQueue) {
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  pol.offload_optimizer = Tier::disk;
  pol.offload_chunk_elements = 4096;
  const std::string dir = test::temp_dir() + "/trace-offload";
  std::filesystem::create_directories(dir);
  TinyRun run(test::compile_tiny(pol), 7, ExecutorOptions{BufferSite{dir, 0}});
  const Program& p = run.compiled.program;
  TraceRecorder rec(ops_per_step(p) * 2, nullptr);
  run.ex->add_observer(&rec);
  run.step(1);
  run.step(2);
  const nlohmann::json trace = chrome_trace(p, run.compiled.plan, rec.events(), false, {});
  uint64_t offloaded = 0;
  for (const TensorDesc& t : p.tensors())
    if (!t.is_view() && t.tier == Tier::disk) offloaded += t.bytes();
  std::map<std::string, uint64_t> bytes;  // track name -> bytes over both steps
  std::map<int, std::string> track_name;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") track_name[e.value("tid", 0)] = e["args"]["name"];
  int slices = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] != "in flight") continue;
    ++slices;
    ASSERT_TRUE(e.contains("tid") && e["args"].contains("bytes")) << e.dump();
    bytes[track_name.at(e["tid"].get<int>())] += e["args"]["bytes"].get<uint64_t>();
  }
  // Every transfer of the program moves its bytes once per step, both ways in all; the started
  // ones (all but those whose result the very next op needs) are the slices.
  int started = 0;
  std::map<std::string, uint64_t> all, async;
  for (const Op& op : p.ops()) {
    if (op.kind != OpKind::transfer) continue;
    const std::string queue(queue_name(op.queue));
    all[queue] += p.tensor(op.inputs[0]).bytes();
    if (op.async_id >= 0) async[queue] += p.tensor(op.inputs[0]).bytes(), ++started;
  }
  EXPECT_EQ(all["transfer.in"], offloaded);
  EXPECT_EQ(all["transfer.out"], offloaded);
  EXPECT_EQ(slices, 2 * started);
  EXPECT_GT(async["transfer.out"], offloaded * 9 / 10);
  EXPECT_EQ(bytes["transfer.in"], 2 * async["transfer.in"]);
  EXPECT_EQ(bytes["transfer.out"], 2 * async["transfer.out"]);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace memfit
