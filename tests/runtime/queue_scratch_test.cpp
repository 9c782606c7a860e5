// Scratch per queue (runtime/compile.hpp). A backend that asks for scratch on several queues
// gets one persistent scratch tensor per queue, sized for that queue's largest op, and the plan
// keeps them apart, so work on different queues may run at once. Real programs, whose only
// scratch is the compute queue's, plan exactly as under the former rule (one scratch shared by
// every op, rebuilt here as the oracle): same tensor, same bytes, same placement of everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "graph/training_program.hpp"
#include "core/error.hpp"
#include "plan/memory_plan.hpp"
#include "runtime/compile.hpp"
#include "kernels/backend.hpp"
#include "support/hand_built.hpp"

namespace memfit {
namespace {

// Scratch by op name; never prepares anything.
class ScratchOnlyBackend final : public Backend {
 public:
  explicit ScratchOnlyBackend(std::map<std::string, uint64_t> bytes) : bytes_(std::move(bytes)) {}
  std::string_view name() const override { return "scratch-only"; }
  const OpCapabilities& capabilities() const override { return cpu_capabilities(); }
  uint64_t scratch_bytes(const Program&, const Op& op) const override {
    const auto it = bytes_.find(op.name);
    return it == bytes_.end() ? 0 : it->second;
  }
  std::unique_ptr<PreparedOp> prepare(const Program&, const Op&, const OpBinding&) override { return nullptr; }

 private:
  std::map<std::string, uint64_t> bytes_;
};

Program queues_program() {
  Program p;
  auto tensor = [&](const std::string& name, Tier tier) {
    TensorDesc d;
    d.name = name;
    d.shape = Shape{64};
    d.tier = tier;
    d.lifetime = Lifetime::persistent;
    return p.add_tensor(std::move(d));
  };
  const TensorId host = tensor("host", Tier::host), dev = tensor("dev", Tier::device), g = tensor("g", Tier::device);
  const TensorId whole = tensor("whole", Tier::device);
  auto op = [&](OpKind kind, const std::string& name, std::vector<TensorId> in, std::vector<TensorId> out) {
    test::add_plain_op(p, kind, name, std::move(in), std::move(out));
  };
  p.begin_section(SectionKind::micro);
  op(OpKind::fill, "small", {}, {dev});
  op(OpKind::all_gather, "gather.1", {dev}, {whole});
  op(OpKind::fill, "large", {}, {g});
  op(OpKind::all_gather, "gather.2", {dev}, {whole});
  op(OpKind::transfer, "in", {host}, {dev});
  op(OpKind::all_reduce, "reduce", {}, {g});
  op(OpKind::transfer, "out", {dev}, {host});
  p.end_section();
  return p;
}

TEST(QueueScratch, EachQueueGetsItsOwnScratchSizedForItsOps) {
  const ScratchOnlyBackend backend({{"small", 1000}, {"large", 3000}, {"gather.1", 500}, {"gather.2", 700}, {"reduce", 200}});
  const CompiledProgram c = compile_program(queues_program(), backend);
  const Program& p = c.program;
  const std::map<std::string, uint64_t> expected = {
      {"library.scratch", 3000}, {"library.scratch.comm.gather", 700}, {"library.scratch.comm.reduce", 200}};
  std::map<std::string, uint64_t> got;
  for (const TensorDesc& t : p.tensors())
    if (t.name.starts_with("library.scratch")) {
      got[t.name] = t.bytes();
      EXPECT_EQ(t.lifetime, Lifetime::persistent) << t.name;
      EXPECT_EQ(t.category, Category::temporaries) << t.name;
    }
  EXPECT_EQ(got, expected);
  const std::map<std::string, std::string> scratch_of = {{"small", "library.scratch"},
                                                         {"large", "library.scratch"},
                                                         {"gather.1", "library.scratch.comm.gather"},
                                                         {"gather.2", "library.scratch.comm.gather"},
                                                         {"reduce", "library.scratch.comm.reduce"}};
  for (const Op& op : p.ops()) {
    SCOPED_TRACE(op.name);
    const auto it = scratch_of.find(op.name);
    if (it == scratch_of.end()) {
      EXPECT_TRUE(op.workspace.empty());
      continue;
    }
    ASSERT_EQ(op.workspace.size(), 1u);
    EXPECT_EQ(p.tensor(op.workspace.back()).name, it->second);
  }
  // Live at once, so never sharing a byte.
  EXPECT_EQ(find_overlap(p, c.plan), "");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, bytes] : expected) {
    const TensorPlacement& pl = c.plan.tensors[size_t(p.find_tensor(name))];
    ranges.push_back({pl.offset, pl.offset + pl.bytes});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
}

// Transfer queues keep several ops in flight (graph/op.hpp), so one scratch per queue would be
// shared by ops running at once: a backend asking for it is refused.
TEST(QueueScratch, ScratchOnADeepQueueIsRefused) {
  const ScratchOnlyBackend backend({{"in", 64}});
  try {
    compile_program(queues_program(), backend);
    FAIL() << "compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("queue transfer.in keeps 8 ops in flight"), std::string::npos) << e.what();
  }
}

TEST(QueueScratch, ProgramsWithComputeScratchOnlyPlanAsUnderOneSharedScratch) {
  const std::unique_ptr<Backend> backend = make_cpu_backend();
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  pol.zero_stage = 2;
  pol.attention = AttentionKind::flash;
  for (const Topology topo : {Topology{}, Topology{.data = 2, .rank = 1}}) {
    const Program built = build_training_program(model_preset("gpt2-tiny"), pol, topo, cpu_capabilities());
    const CompiledProgram c = compile_program(built, *backend);
    // The former rule: one persistent scratch of the largest request, on every op that asks.
    Program oracle = built;
    uint64_t largest = 0;
    std::vector<uint64_t> bytes;
    for (const Op& op : oracle.ops()) largest = std::max(largest, bytes.emplace_back(backend->scratch_bytes(oracle, op)));
    ASSERT_GT(largest, 0u);
    TensorDesc d;
    d.name = "library.scratch";
    d.shape = Shape{int64_t(largest)};
    d.dtype = DType::u8;
    d.category = Category::temporaries;
    d.lifetime = Lifetime::persistent;
    const TensorId id = oracle.add_tensor(d);
    for (size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] > 0) oracle.ops()[i].workspace.push_back(id);
    const MemoryPlan expected = plan_memory(oracle);
    ASSERT_EQ(c.program.tensors().size(), oracle.tensors().size());
    EXPECT_EQ(c.program.tensor(id).name, "library.scratch");
    EXPECT_EQ(c.program.tensor(id).bytes(), largest);
    for (Tier t : kAllTiers) EXPECT_EQ(c.plan.tier(t).peak_bytes, expected.tier(t).peak_bytes);
    for (size_t i = 0; i < expected.tensors.size(); ++i) {
      EXPECT_EQ(c.plan.tensors[i].offset, expected.tensors[i].offset) << oracle.tensor(TensorId(i)).name;
      EXPECT_EQ(c.plan.tensors[i].bytes, expected.tensors[i].bytes) << oracle.tensor(TensorId(i)).name;
    }
    for (size_t i = 0; i < oracle.ops().size(); ++i) EXPECT_EQ(c.program.op(int(i)).workspace, oracle.op(int(i)).workspace);
  }
}

}  // namespace
}  // namespace memfit
