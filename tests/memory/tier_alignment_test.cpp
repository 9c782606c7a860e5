// The planner aligns each tier to what its buffer type asks: gpt2-tiny planned and run with a
// device tier served by a 4 KiB-aligned host arena puts every tensor at a multiple of 4 KiB,
// and the arena's measured high-water mark still equals the planned peak byte for byte. The
// oracle for the numbers is the same program at the default 64-byte alignment: alignment
// moves bytes, never values, so the losses agree bitwise.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.hpp"
#include "graph/model_spec.hpp"
#include "graph/training_program.hpp"
#include "memory/arena.hpp"
#include "runtime/executor.hpp"
#include "support/alloc_counter.hpp"
#include "support/tiny_run.hpp"

namespace memfit {
namespace {

constexpr uint64_t kPage = 4096;

class PageAlignedArenaType final : public BufferType {
 public:
  std::string_view name() const override { return "page-aligned-arena"; }
  uint64_t alignment() const override { return kPage; }
  bool host_readable() const override { return true; }
  HighWaterMethod high_water_method() const override { return HighWaterMethod::sentinel_scan; }
  std::unique_ptr<Buffer> allocate(Tier tier, uint64_t bytes, const BufferSite&) const override {
    return std::make_unique<Arena>(tier, bytes);
  }
};

// The CPU backend's kernels with the device tier served by page-aligned arenas.
class PageAlignedBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu-page-aligned"; }
  uint64_t scratch_bytes(const Program& p, const Op& op) const override { return cpu_->scratch_bytes(p, op); }
  std::unique_ptr<PreparedOp> prepare(const Program& p, const Op& op, const OpBinding& b) override {
    return cpu_->prepare(p, op, b);
  }
  const BufferType& buffer_type(Tier tier) const override {
    return tier == Tier::device ? page_type_ : cpu_->buffer_type(tier);
  }
  const OpCapabilities& capabilities() const override { return cpu_->capabilities(); }

 private:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  PageAlignedArenaType page_type_;
};

Policy tiny_policy() {
  Policy pol;
  pol.batch = 2;
  pol.seq = 64;
  return pol;
}

TEST(TierAlignment, PageAlignedDeviceTierPlansAndMeasuresExactly) {
  PageAlignedBackend backend;
  CompiledProgram paged =
      compile_program(build_training_program(model_preset("gpt2-tiny"), tiny_policy(), {}, cpu_capabilities()), backend);
  EXPECT_EQ(paged.plan.alignments[size_t(Tier::device)], kPage);
  int placed = 0;
  for (size_t id = 0; id < paged.plan.tensors.size(); ++id) {
    const TensorPlacement& pl = paged.plan.tensors[id];
    if (pl.buffer < 0 || paged.program.tensors()[id].is_view()) continue;
    EXPECT_EQ(pl.offset % kPage, 0u) << paged.program.tensors()[id].name;
    ++placed;
  }
  EXPECT_GT(placed, 10);
  EXPECT_EQ(find_overlap(paged.program, paged.plan), "");

  const CompiledProgram fine = test::compile_tiny(tiny_policy());
  EXPECT_GT(paged.plan.tier(Tier::device).peak_bytes, fine.plan.tier(Tier::device).peak_bytes);

  test::TinyRun run(std::move(paged));  // runs on the CPU backend's kernels at the paged offsets
  test::TinyRun oracle(test::compile_tiny(tiny_policy()));
  run.step(1);
  oracle.step(1);
  test::alloc_counter_start();
  for (int64_t s = 2; s <= 3; ++s) {
    run.step(s);
    oracle.step(s);
  }
  const test::AllocCounts counts = test::alloc_counter_stop();
  EXPECT_EQ(counts.memfit_allocations, 0);
  const float a = run.loss(), b = oracle.loss();
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << a << " vs " << b;
  EXPECT_EQ(run.ex->arena(Tier::device).measured_high_water(), run.compiled.plan.tier(Tier::device).peak_bytes);
}

TEST(TierAlignment, ExecutorRefusesAPlanAlignedLessThanItsBufferType) {
  PageAlignedBackend backend;
  const CompiledProgram fine = test::compile_tiny(tiny_policy());  // 64-byte aligned
  EXPECT_THROW(Executor(fine, backend), Error);
}

TEST(TierAlignment, PlannerRefusesAnAlignmentThatIsNotAPowerOfTwo) {
  const CompiledProgram fine = test::compile_tiny(tiny_policy());
  TierAlignments bad = kDefaultTierAlignments;
  bad[size_t(Tier::device)] = 96;
  EXPECT_THROW(plan_memory(fine.program, bad), Error);
}

}  // namespace
}  // namespace memfit
