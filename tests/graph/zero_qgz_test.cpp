// ZeRO++ qgZ (graph/zero_qgz.hpp), planned for every rank of a 4-rank world without launching it.
//
// Closed forms (E: the elements of a gradient bucket, S = E / 4 its shard, b the bits, B = 256;
// wire(n) = n b / 8 + 4 ceil(n / B) bytes, op.hpp's qgz_wire_bytes). With h data ranks per node:
//   one hop (h = 1 or 4): rank r codes part j = shard j for each of the 4 ranks, 4 wire(S)
//     bytes, and the all-to-all sends 3/4 of them;
//   two hops (h = 2, nodes of 2): the first codes, for each of its 2 node-local peers, the 2
//     shards that peer forwards (2 wire(2S) bytes, half sent, inside the node), the second the
//     node's fp32 partial of 2 shards, one for each node (2 wire(S) bytes, half sent, across).
// Plain stage 2/3 reduce-scatters 4E bytes of fp32 gradients, sending 3/4 of them: qgZ's one
// hop sends (b/8 + 4/256) / 4 of that, b/32 + 1/256.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "graph/training_program.hpp"
#include "graph/zero.hpp"
#include "kernels/backend.hpp"
#include "plan/memory_plan.hpp"
#include "support/run_cli.hpp"
#include "train/deepspeed_config.hpp"
#include "train/run_config.hpp"

namespace memfit {
namespace {

constexpr int kWorld = 4;
constexpr int64_t kB = 256;

Policy policy(bool qgz, int stage = 3, int bits = 4) {
  Policy p;
  p.batch = 1;
  p.seq = 16;
  p.zero_stage = stage;
  p.zero_quantized_gradients = qgz;
  p.zero_quantized_gradient_bits = bits;
  p.with_eval = false;
  return p;
}

Topology topo(int rank, int ranks_per_node) {
  Topology t{.data = kWorld, .rank = rank};
  t.ranks_per_node = ranks_per_node;
  return t;
}

ZeroLayout layout(const ModelSpec& spec, const Policy& pol) {
  Policy whole = pol;
  whole.zero_stage = 0;
  whole.zero_quantized_gradients = false;
  const Program p = build_training_program(spec, whole, {}, cpu_capabilities());
  return zero_layout(p, pol, Topology{.data = kWorld, .rank = 0});
}

const Op* find_op(const Program& p, const std::string& name) {
  for (const Op& op : p.ops())
    if (op.name == name && op.kind != OpKind::wait) return &op;
  return nullptr;
}

double wire(int64_t n, int bits) { return double(qgz_wire_bytes(n, kB, bits)); }

void expect_hops(int stage, int bits, int ranks_per_node) {
  SCOPED_TRACE(fmt::format("stage {}, int{}, {} ranks per node", stage, bits, ranks_per_node));
  const ModelSpec spec = model_preset("gpt2-tiny");
  const ZeroLayout L = layout(spec, policy(true, stage, bits));
  const bool two = ranks_per_node == 2;
  for (int rank = 0; rank < kWorld; ++rank) {
    const Topology t = topo(rank, ranks_per_node);
    const Program p = build_training_program(spec, policy(true, stage, bits), t, cpu_capabilities());
    double sent = 0;
    for (const Op& op : p.ops()) EXPECT_NE(op.kind, OpKind::reduce_scatter) << op.name;
    for (const ZeroBucket& b : L.buckets) {
      const std::string rs = "zero.reduce_scatter." + b.tag;
      const int64_t S = b.elements / kWorld;
      EXPECT_EQ(S % kB, 0) << b.tag;  // the layout aligns shards to whole blocks
      if (!two) {
        const Op* a = find_op(p, rs);
        ASSERT_NE(a, nullptr) << rs;
        EXPECT_EQ(a->kind, OpKind::all_to_all);
        const auto& c = std::get<CollectiveAttrs>(a->attrs);
        EXPECT_EQ(c.group, CommGroup::data);
        EXPECT_EQ(c.size, 4);
        EXPECT_EQ(double(p.tensor(a->inputs[0]).bytes()), 4 * wire(S, bits));
        EXPECT_EQ(find_op(p, rs + ".node"), nullptr);
        sent += 0.75 * 4 * wire(S, bits);
        continue;
      }
      const Op* a = find_op(p, rs + ".node");
      const Op* x = find_op(p, rs + ".across_nodes");
      ASSERT_NE(a, nullptr) << rs;
      ASSERT_NE(x, nullptr) << rs;
      EXPECT_EQ(find_op(p, rs), nullptr);
      EXPECT_EQ(std::get<CollectiveAttrs>(a->attrs).group, CommGroup::node);
      EXPECT_EQ(std::get<CollectiveAttrs>(a->attrs).size, 2);
      EXPECT_EQ(std::get<CollectiveAttrs>(x->attrs).group, CommGroup::across_nodes);
      EXPECT_EQ(std::get<CollectiveAttrs>(x->attrs).size, 2);
      EXPECT_EQ(double(p.tensor(a->inputs[0]).bytes()), 2 * wire(2 * S, bits));
      EXPECT_EQ(double(p.tensor(x->inputs[0]).bytes()), 2 * wire(S, bits));
      // Between the hops, the node's partial of 2 shards in fp32; the last sum writes the shard.
      const Op* mid = find_op(p, rs + ".node.dequantize_sum");
      ASSERT_NE(mid, nullptr);
      EXPECT_EQ(p.tensor(mid->outputs[0]).dtype, DType::f32);
      EXPECT_EQ(p.tensor(mid->outputs[0]).numel(), 2 * S);
      EXPECT_EQ(p.tensor(mid->outputs[0]).category, Category::communication);
      const Op* last = find_op(p, rs + ".across_nodes.dequantize_sum");
      ASSERT_NE(last, nullptr);
      EXPECT_EQ(p.tensor(last->outputs[0]).name, "zero.grad_shard." + b.tag);
      sent += 0.5 * 2 * wire(2 * S, bits) + 0.5 * 2 * wire(S, bits);
    }
    const CommVolume v = communication_volume(p, t, two ? 2 : kWorld);
    EXPECT_DOUBLE_EQ(v.by_purpose[size_t(CommPurpose::grad_reduce_scatter)], sent);
    EXPECT_DOUBLE_EQ(v.total, communication_bytes_per_step(p));
    if (two) {
      // The first hop stays in the node, the second leaves it.
      double across = 0;
      for (const ZeroBucket& b : L.buckets) across += 0.5 * 2 * wire(b.elements / kWorld, bits);
      // Ranks 0 and 2 are not the last of their node: their rings (the loss) stay inside it.
      if (rank % 2 == 0) EXPECT_DOUBLE_EQ(v.inter_node, across);
      else EXPECT_GT(v.inter_node, across);
    }
    EXPECT_GT(plan_memory(p).tier(Tier::device).peak_bytes, 0u);
  }
}

TEST(ZeroQgz, TwoHopsWithTwoRanksPerNode) {
  for (int stage : {3, 2})
    for (int bits : {4, 8}) expect_hops(stage, bits, 2);
}

TEST(ZeroQgz, OneHopOnOneNodeOrOneRankPerNode) {
  for (int rpn : {1, 4}) expect_hops(3, 4, rpn);
  expect_hops(2, 8, 0);  // 0: the topology says nothing, every rank on one node
}

TEST(ZeroQgz, GradientBytesFallToBitsOver32OfFp32) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  const Topology t = topo(1, 4);
  const Program plain = build_training_program(spec, policy(false), t, cpu_capabilities());
  const double E_plain = double(layout(spec, policy(false)).padded_elements());
  const double fp32 = communication_volume(plain, t, 4).by_purpose[size_t(CommPurpose::grad_reduce_scatter)];
  EXPECT_DOUBLE_EQ(fp32, 0.75 * 4 * E_plain);
  for (int bits : {4, 8}) {
    const Program q = build_training_program(spec, policy(true, 3, bits), t, cpu_capabilities());
    const double E = double(layout(spec, policy(true, 3, bits)).padded_elements());
    const double got = communication_volume(q, t, 4).by_purpose[size_t(CommPurpose::grad_reduce_scatter)];
    EXPECT_DOUBLE_EQ(got, 0.75 * (E * bits / 8 + 4 * E / 256));  // every shard is whole blocks
    EXPECT_NEAR(got / fp32, bits / 32.0 + 1.0 / 256, 0.05 * (bits / 32.0));  // E differs by padding only
  }
}

// The last hop's all-to-all is started and waited for later (graph/schedule_async.hpp): its
// decode waits for the next bucket's gradients, so the exchange overlaps that bucket's backward.
TEST(ZeroQgz, TheLastHopOverlapsTheNextBucketsBackward) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  const Program p = build_training_program(spec, policy(true, 3, 4), topo(0, 2), cpu_capabilities());
  int start = -1, wait = -1, sum = -1, backward_between = 0;
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    if (op.name == "zero.reduce_scatter.h1.across_nodes" && op.kind == OpKind::all_to_all) start = i;
    if (op.name == "zero.reduce_scatter.h1.across_nodes.wait") wait = i;
    if (op.name == "zero.reduce_scatter.h1.across_nodes.dequantize_sum") sum = i;
    if (start >= 0 && wait < 0 && op.phase == Phase::backward) ++backward_between;
  }
  ASSERT_GE(start, 0);
  EXPECT_GE(p.op(start).async_id, 0);
  EXPECT_GT(wait, start);
  EXPECT_EQ(sum, wait + 1);
  EXPECT_GT(backward_between, 3) << "the block before h1 runs its backward while h1's gradients travel";
}

TEST(ZeroQgz, AccumulationDecodesIntoTheBufferThenAdds) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  Policy pol = policy(true, 2, 8);
  pol.grad_accum = 2;
  const Program p = build_training_program(spec, pol, topo(0, 2), cpu_capabilities());
  const Op* last = find_op(p, "zero.reduce_scatter.h0.across_nodes.dequantize_sum");
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(p.tensor(last->outputs[0]).name, "zero.reduce_scatter.h0.buffer");
  const Op* acc = find_op(p, "zero.accumulate.h0");
  ASSERT_NE(acc, nullptr);
  EXPECT_EQ(acc->inputs[0], last->outputs[0]);
  EXPECT_GT(acc - last, 0);  // after the sum
}

TEST(ZeroQgz, BadSettingsAreRefused) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  EXPECT_THROW(build_training_program(spec, policy(true, 1), topo(0, 2), cpu_capabilities()), Error);
  EXPECT_THROW(build_training_program(spec, policy(true, 0), Topology{}, cpu_capabilities()), Error);
  EXPECT_THROW(build_training_program(spec, policy(true, 3), Topology{}, cpu_capabilities()), Error);  // data 1
  EXPECT_THROW(build_training_program(spec, policy(true, 3, 6), topo(0, 2), cpu_capabilities()), Error);
  EXPECT_THROW(build_training_program(spec, policy(true, 3), topo(0, 3), cpu_capabilities()), Error);  // 3 into 4
  try {
    build_training_program(spec, policy(true, 1), topo(0, 2), cpu_capabilities());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stages 2 and 3"), std::string::npos) << e.what();
  }
  const std::string path = test::temp_dir() + "/ds_qgz.json";
  test::write_file(path, R"({"zero_optimization": {"stage": 2, "zero_quantized_gradients": true}})");
  RunConfig c;
  apply_config_file(path, c);
  EXPECT_TRUE(c.policy.zero_quantized_gradients);
  EXPECT_EQ(c.policy.zero_quantized_gradient_bits, 4);
}

TEST(ZeroQgz, PlanTakesTheNodeSizeFromRanksPerNode) {
  const std::string base = "plan --model gpt2-tiny --batch 1 --seq 16 --zero 3 --world-size 4 --json";
  const test::CliResult one = test::run_memfit(base + " --zero-quantized-gradients");
  const test::CliResult two = test::run_memfit(base + " --zero-quantized-gradients --ranks-per-node 2");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  const auto a = nlohmann::json::parse(one.out)["distributed"]["communication"];
  const auto b = nlohmann::json::parse(two.out)["distributed"]["communication"];
  EXPECT_EQ(a["inter_node_bytes"], 0.0);
  EXPECT_GT(b["inter_node_bytes"].get<double>(), 0.0);
  EXPECT_GT(b["intra_node_bytes"].get<double>(), 0.0);
  const test::CliResult bad = test::run_memfit(base + " --zero-quantized-gradients --zero-quantized-gradient-bits 5");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("4 or 8"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace memfit
