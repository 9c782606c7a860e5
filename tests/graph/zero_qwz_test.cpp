// ZeRO++ qwZ (graph/zero.hpp) and the communication volume of a program, planned for every rank
// of a 4-rank world without launching it (no MPI).
//
// Closed forms (E: the elements of the parameter buckets, Psi plus the layout's padding; N
// ranks; ring volumes send (N-1)/N of the gathered or reduced buffer per rank). Stage 3 with
// 16-bit weights and gradients sends per rank per step
//   forward gather 2E (N-1)/N + backward gather 2E (N-1)/N + reduce-scatter 2E (N-1)/N bytes,
// the ZeRO++ paper's 3 Psi elements of 2 bytes; qwZ sends each gather as int8 codes with one
// fp32 scale per 256 elements: (E + 4E/256) (N-1)/N bytes each, so 6E becomes 2E + 2.03E.
// The intra/inter-node split of a ring over nodes of K consecutive ranks: rank r's neighbour
// is r+1 (mod N), across a node boundary exactly when r is the last rank of its node.
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

Policy policy(bool qwz, int stage = 3) {
  Policy p;
  p.batch = 1;
  p.seq = 16;
  p.zero_stage = stage;
  p.precision = Precision::bf16;
  p.grad_dtype = DType::bf16;
  p.zero_quantized_weights = qwz;
  p.with_eval = false;
  return p;
}

// E for this policy: the layout ZeRO would give the unsharded program.
double padded_elements(const ModelSpec& spec, const Policy& pol) {
  Policy whole = pol;
  whole.zero_stage = 0;
  whole.zero_quantized_weights = false;
  const Program p = build_training_program(spec, whole, {}, cpu_capabilities());
  return double(zero_layout(p, pol, Topology{.data = kWorld, .rank = 0}).padded_elements());
}

void expect_closed_form(const std::string& model) {
  SCOPED_TRACE(model);
  const ModelSpec spec = model_preset(model);
  const double ring = double(kWorld - 1) / kWorld;
  for (bool qwz : {false, true}) {
    SCOPED_TRACE(qwz ? "qwZ" : "plain stage 3");
    const double E = padded_elements(spec, policy(qwz));
    const int64_t psi = build_training_program(spec, policy(false, 0), {}, cpu_capabilities()).parameter_count();
    EXPECT_LT(E, 1.05 * double(psi));  // the padding is small, so E is Psi for the paper's units
    const double gather = qwz ? (E + 4.0 * E / 256) * ring : 2.0 * E * ring;
    for (int rank = 0; rank < kWorld; ++rank) {
      const Topology topo{.data = kWorld, .rank = rank};
      const Program p = build_training_program(spec, policy(qwz), topo, cpu_capabilities());
      const CommVolume v = communication_volume(p, topo, kWorld);
      EXPECT_DOUBLE_EQ(v.by_purpose[size_t(CommPurpose::param_gather_forward)], gather);
      EXPECT_DOUBLE_EQ(v.by_purpose[size_t(CommPurpose::param_gather_backward)], gather);
      EXPECT_DOUBLE_EQ(v.by_purpose[size_t(CommPurpose::grad_reduce_scatter)], 2.0 * E * ring);
      EXPECT_EQ(v.by_purpose[size_t(CommPurpose::grad_all_reduce)], 0.0);
      EXPECT_EQ(v.by_purpose[size_t(CommPurpose::param_gather_update)], 0.0);
      EXPECT_LT(v.by_purpose[size_t(CommPurpose::scalars)], 64.0);  // the loss, in bf16 or fp32
      EXPECT_DOUBLE_EQ(v.total, communication_bytes_per_step(p));
      // One node: everything stays inside it.
      EXPECT_EQ(v.intra_node, v.total);
      EXPECT_EQ(v.inter_node, 0.0);
      EXPECT_EQ(v.node_link, 0.0);
      // In the paper's units: 3 Psi elements of 2 bytes, then 2 Psi + 2 x 1.016 Psi bytes.
      const double units = (v.total - v.by_purpose[size_t(CommPurpose::scalars)]) / (double(psi) * ring);
      if (qwz) EXPECT_NEAR(units, 2.0 + 2.0 * (1.0 + 4.0 / 256), 0.05 * 4.03);
      else EXPECT_NEAR(units, 6.0, 0.05 * 6.0);
    }
  }
}

TEST(ZeroQwz, BytesPerRankFollowTheZeroPlusPlusClosedForm) {
  expect_closed_form("gpt2-tiny");
  expect_closed_form("llama-tiny");
}

TEST(ZeroQwz, RingBytesSplitIntoIntraAndInterNode) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  for (int rank = 0; rank < kWorld; ++rank) {
    const Topology topo{.data = kWorld, .rank = rank};
    const Program p = build_training_program(spec, policy(true), topo, cpu_capabilities());
    const CommVolume two = communication_volume(p, topo, 2);
    EXPECT_EQ(two.nodes, 2);
    const bool last_of_node = rank % 2 == 1;
    EXPECT_EQ(two.inter_node, last_of_node ? two.total : 0.0) << "rank " << rank;
    EXPECT_EQ(two.intra_node, last_of_node ? 0.0 : two.total) << "rank " << rank;
    EXPECT_EQ(two.node_link, two.total);  // every collective spans both nodes
    const CommVolume one_each = communication_volume(p, topo, 1);
    EXPECT_EQ(one_each.inter_node, one_each.total);
    EXPECT_THROW(communication_volume(p, topo, 0), Error);
  }
}

int first_op(const Program& p, const std::string& name) {
  for (int i = 0; i < int(p.ops().size()); ++i)
    if (p.op(i).name == name) return i;
  return -1;
}

TEST(ZeroQwz, EachGatherCodesTheShardAndDecodesBeforeFirstUse) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  const Program p = build_training_program(spec, policy(true), Topology{.data = kWorld, .rank = 2}, cpu_capabilities());
  for (int l = 0; l < spec.n_layer; ++l)
    for (const char* pass : {"forward", "backward"}) {
      const std::string g = fmt::format("zero.all_gather.h{}.{}", l, pass);
      const int q = first_op(p, g + ".quantize"), gather = first_op(p, g), dq = first_op(p, g + ".dequantize");
      ASSERT_GE(q, 0) << g;
      ASSERT_GE(dq, 0) << g;
      EXPECT_LT(q, gather);
      EXPECT_LT(gather, dq);
      const TensorDesc& wire = p.tensor(p.op(gather).outputs[0]);
      EXPECT_EQ(wire.dtype, DType::u8);
      EXPECT_EQ(wire.category, Category::communication);
      // The decoder writes the bucket's gather buffer, whose views the block's ops read.
      const TensorDesc& out = p.tensor(p.op(dq).outputs[0]);
      EXPECT_EQ(out.name, fmt::format("zero.gather.h{}.{}", l, pass));
      EXPECT_EQ(wire.bytes(), kWorld * comm_wire_bytes(out.numel() / kWorld, kQwzBlock));
    }
  // The first block's decode precedes its first op; the next block's gather is issued by then.
  const int ln = first_op(p, "h.0.ln_1");
  EXPECT_LT(first_op(p, "zero.all_gather.h0.forward.dequantize"), ln);
  EXPECT_LT(first_op(p, "zero.all_gather.h1.forward"), ln);
  EXPECT_GT(first_op(p, "zero.all_gather.h1.forward.dequantize"), ln);
  // The exact state is untouched: the shard is what plain stage 3 holds, and the plan is
  // complete (every wire byte placed).
  const MemoryPlan plan = plan_memory(p);
  EXPECT_GT(plan.tier(Tier::device).peak_bytes, 0u);
}

TEST(ZeroQwz, RefusedBelowStageThreeAndReadFromDeepSpeedsKey) {
  const ModelSpec spec = model_preset("gpt2-tiny");
  EXPECT_THROW(build_training_program(spec, policy(true, 2), Topology{.data = 2, .rank = 0}, cpu_capabilities()), Error);
  // One rank at stage 0 never runs the ZeRO pass: the flag must still not be ignored.
  EXPECT_THROW(build_training_program(spec, policy(true, 0), Topology{}, cpu_capabilities()), Error);
  const std::string path = test::temp_dir() + "/ds_qwz.json";
  test::write_file(path, R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})");
  RunConfig c;
  apply_config_file(path, c);
  EXPECT_TRUE(c.policy.zero_quantized_weights);
  EXPECT_EQ(c.policy.zero_stage, 3);
}

TEST(ZeroQwz, PlanPrintsTheBytesAndTheirNodeSplit) {
  const std::string base = "plan --model gpt2-tiny --batch 1 --seq 16 --precision bf16 --zero 3 --world-size 4";
  const test::CliResult plain = test::run_memfit(base + " --ranks-per-node 2 --json");
  const test::CliResult qwz = test::run_memfit(base + " --ranks-per-node 2 --zero-quantized-weights --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(qwz.status, 0) << qwz.err;
  const auto a = nlohmann::json::parse(plain.out)["distributed"]["communication"];
  const auto b = nlohmann::json::parse(qwz.out)["distributed"]["communication"];
  EXPECT_EQ(a["nodes"], 2);
  EXPECT_EQ(a["node_link_bytes"], a["bytes"]);
  // Rank 0 is not the last of its node: its bytes stay inside it.
  EXPECT_EQ(a["inter_node_bytes"], 0.0);
  const double fwd_a = a["by_purpose"]["param_gather_forward"], fwd_b = b["by_purpose"]["param_gather_forward"];
  EXPECT_NEAR(fwd_b / fwd_a, (1.0 + 4.0 / 256) / 2.0, 0.01);
  const test::CliResult text = test::run_memfit(base + " --zero-quantized-weights");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("communication: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("param_gather_backward"), std::string::npos) << text.out;
  const test::CliResult bad = test::run_memfit("plan --model gpt2-tiny --zero 2 --world-size 2 --zero-quantized-weights");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("needs ZeRO stage 3"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace memfit
