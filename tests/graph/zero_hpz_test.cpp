// ZeRO++ hpZ (graph/zero.hpp, graph/zero_hpz.hpp) planned for every rank of a 4-rank world with
// partitions of 2 ranks, without launching it (no MPI).
//
// Closed forms. A bucket of E_b elements (the layout's padded size; bf16: 2 E_b bytes) is
// gathered before its forward over the data group of D ranks, ring volume 2 E_b (D-1)/D bytes
// per rank, and before its backward: plain stage 3 over the data group again, hpZ over its
// partition of N ranks, 2 E_b (N-1)/N bytes. With nodes of N consecutive ranks a partition lies
// on one node, so hpZ's backward bytes are all intra-node: the inter-node bytes of the last
// rank of each node (whose ring neighbour is on the next node) drop by exactly plain stage 3's
// backward bytes, 2 E (D-1)/D (E: the sum of the backward-read buckets), and what crosses each
// node boundary (node_link) drops by the same.
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

constexpr int kData = 4, kPartition = 2;

Policy policy(int hpz, int stage = 3, bool qwz = false) {
  Policy p;
  p.batch = 1;
  p.seq = 16;
  p.zero_stage = stage;
  p.precision = Precision::bf16;
  p.grad_dtype = DType::bf16;
  p.zero_quantized_weights = qwz;
  p.zero_hpz_partition_size = hpz;
  p.with_eval = true;  // eval's gathers stay over the data group
  return p;
}

Program build(const Policy& pol, int rank, int data = kData) {
  return build_training_program(model_preset("gpt2-tiny"), pol, Topology{.data = data, .rank = rank},
                                cpu_capabilities());
}

const Op* find_op(const Program& p, const std::string& name) {
  for (const Op& op : p.ops())
    if (op.name == name) return &op;
  return nullptr;
}

std::vector<const Op*> gathers(const Program& p, const std::string& suffix) {
  std::vector<const Op*> out;
  for (const Op& op : p.ops())
    if (op.kind == OpKind::all_gather && op.name.starts_with("zero.all_gather.") && op.name.ends_with(suffix))
      out.push_back(&op);
  return out;
}

TEST(ZeroHpz, EachBackwardBucketHasASecondaryGatheredInsideThePartition) {
  Policy pol = policy(kPartition);
  pol.freeze = {"wpe.weight"};  // a bucket ("outer.frozen") that only the forward reads
  Policy plain_pol = pol;
  plain_pol.zero_hpz_partition_size = 1;
  for (int rank = 0; rank < kData; ++rank) {
    SCOPED_TRACE(fmt::format("rank {}", rank));
    const Program p = build(pol, rank), plain = build(plain_pol, rank);
    // The forward's and eval's gathers are plain stage 3's.
    for (const char* pass : {".forward", ".eval"}) {
      const auto a = gathers(p, pass), b = gathers(plain, pass);
      ASSERT_EQ(a.size(), b.size());
      ASSERT_FALSE(a.empty());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i]->name, b[i]->name);
        EXPECT_EQ(std::get<CollectiveAttrs>(a[i]->attrs).group, CommGroup::data);
        EXPECT_EQ(std::get<CollectiveAttrs>(a[i]->attrs).size, kData);
        EXPECT_EQ(a[i]->comm_bytes, b[i]->comm_bytes);
      }
    }
    const auto bwd = gathers(p, ".backward");
    EXPECT_EQ(bwd.size(), gathers(plain, ".backward").size());
    EXPECT_EQ(find_op(p, "zero.all_gather.outer.frozen.backward"), nullptr);
    EXPECT_EQ(p.find_tensor("zero.params.outer.frozen.secondary"), kNoTensor);
    ASSERT_GE(bwd.size(), 3u);  // outer and the blocks
    for (const Op* g : bwd) {
      const std::string tag = g->name.substr(16, g->name.size() - 16 - 9);
      SCOPED_TRACE(tag);
      const auto& a = std::get<CollectiveAttrs>(g->attrs);
      EXPECT_EQ(a.group, CommGroup::hpz);
      EXPECT_EQ(a.size, kPartition);
      const TensorId sec = p.find_tensor("zero.params." + tag + ".secondary");
      ASSERT_NE(sec, kNoTensor);
      EXPECT_EQ(g->inputs, std::vector<TensorId>{sec});
      const TensorDesc& s = p.tensor(sec);
      const TensorDesc& full = p.tensor(g->outputs[0]);
      EXPECT_EQ(full.name, "zero.gather." + tag + ".backward");
      EXPECT_EQ(s.numel() * kPartition, full.numel());  // E / N elements
      EXPECT_EQ(s.dtype, full.dtype);
      EXPECT_EQ(s.category, Category::communication);
      EXPECT_EQ(s.lifetime, Lifetime::transient);
      EXPECT_EQ(g->comm_bytes, double(full.bytes()) * (kPartition - 1) / kPartition);
      // The copy: this member's piece of the forward's gather, before the backward's gather.
      const Op* copy = find_op(p, "zero.hpz_copy." + tag);
      ASSERT_NE(copy, nullptr);
      EXPECT_EQ(copy->kind, OpKind::accumulate);
      EXPECT_EQ(copy->modes, std::vector<WriteMode>{WriteMode::overwrite});
      EXPECT_EQ(copy->outputs, std::vector<TensorId>{sec});
      const TensorDesc& piece = p.tensor(copy->inputs[0]);
      EXPECT_EQ(p.tensor(piece.view_of).name, "zero.gather." + tag + ".forward");
      EXPECT_EQ(piece.view_offset, uint64_t(rank % kPartition) * s.bytes());
      EXPECT_LT(copy - p.ops().data(), g - p.ops().data());
      // ...after the forward's gather of the bucket (the wait of the asynchronous gather).
      EXPECT_GT(copy - p.ops().data(), find_op(p, "zero.all_gather." + tag + ".forward") - p.ops().data());
    }
    // The plan places every secondary (the run's measured == planned is in zero_hpz_mpitest).
    EXPECT_GT(plan_memory(p).tier(Tier::device).peak_bytes, 0u);
  }
}

TEST(ZeroHpz, OffWhenThePartitionIsTheDataGroupAndRefusedOtherwise) {
  // N == D is plain stage 3 (DeepSpeed's reading): the same program.
  const Program whole = build(policy(kData), 1), plain = build(policy(1), 1);
  ASSERT_EQ(whole.ops().size(), plain.ops().size());
  for (size_t i = 0; i < whole.ops().size(); ++i) EXPECT_EQ(whole.ops()[i].name, plain.ops()[i].name);
  EXPECT_EQ(whole.tensors().size(), plain.tensors().size());
  EXPECT_THROW(build(policy(kPartition, 2), 0), Error);  // needs stage 3
  EXPECT_THROW(build(policy(kPartition, 0), 0, 1), Error);  // one rank: the pass never runs, still refused
  EXPECT_THROW(build(policy(3), 0), Error);                 // 3 does not divide 4
  EXPECT_THROW(build(policy(8), 0), Error);                 // larger than the data group
  EXPECT_THROW(build(policy(0), 0), Error);
  try {
    build(policy(3), 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must divide the data-parallel degree 4"), std::string::npos) << e.what();
  }
  const std::string path = test::temp_dir() + "/ds_hpz.json";
  test::write_file(path, R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})");
  RunConfig c;
  apply_config_file(path, c);
  EXPECT_EQ(c.policy.zero_hpz_partition_size, 8);
  EXPECT_EQ(c.policy.zero_stage, 3);
}

// Closed form of the node split (see the top): nodes of 2 ranks, with and without qwZ (whose
// forward gather is int8; hpZ's backward gather stays bf16).
TEST(ZeroHpz, BackwardGathersStayInsideTheNode) {
  for (bool qwz : {false, true}) {
    SCOPED_TRACE(qwz ? "qwZ" : "bf16");
    for (int rank = 0; rank < kData; ++rank) {
      SCOPED_TRACE(fmt::format("rank {}", rank));
      const Topology topo{.data = kData, .rank = rank};
      const Program p = build(policy(kPartition, 3, qwz), rank), plain = build(policy(1, 3, qwz), rank);
      double E = 0;  // elements of the backward-read buckets
      for (const Op* g : gathers(p, ".backward")) E += double(p.tensor(g->outputs[0]).numel());
      const CommVolume v = communication_volume(p, topo, kPartition), w = communication_volume(plain, topo, kPartition);
      const double hpz_bwd = 2.0 * E * (kPartition - 1) / kPartition;
      const double plain_bwd = qwz ? (E + 4.0 * E / 256) * (kData - 1) / kData : 2.0 * E * (kData - 1) / kData;
      EXPECT_DOUBLE_EQ(v.by_purpose[size_t(CommPurpose::param_gather_backward)], hpz_bwd);
      EXPECT_DOUBLE_EQ(w.by_purpose[size_t(CommPurpose::param_gather_backward)], plain_bwd);
      for (CommPurpose c : {CommPurpose::param_gather_forward, CommPurpose::grad_reduce_scatter, CommPurpose::scalars})
        EXPECT_EQ(v.by_purpose[size_t(c)], w.by_purpose[size_t(c)]);
      EXPECT_DOUBLE_EQ(v.total, communication_bytes_per_step(p));
      const bool last_of_node = rank % kPartition == kPartition - 1;
      EXPECT_DOUBLE_EQ(v.inter_node, last_of_node ? w.inter_node - plain_bwd : 0.0);
      EXPECT_DOUBLE_EQ(v.intra_node, last_of_node ? hpz_bwd : w.intra_node - plain_bwd + hpz_bwd);
      EXPECT_DOUBLE_EQ(v.node_link, w.node_link - plain_bwd);
      // On one node everything stays inside it, as before.
      EXPECT_EQ(communication_volume(p, topo, kData).inter_node, 0.0);
    }
  }
}

TEST(ZeroHpz, PlanPrintsTheSecondariesAndTheNodeSplit) {
  const std::string base =
      "plan --model gpt2-tiny --batch 1 --seq 16 --precision bf16 --zero 3 --world-size 8 --ranks-per-node 4";
  const test::CliResult plain = test::run_memfit(base + " --json");
  const test::CliResult hpz = test::run_memfit(base + " --zero-hpz-partition-size 4 --json");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(hpz.status, 0) << hpz.err;
  const auto a = nlohmann::json::parse(plain.out)["distributed"]["communication"];
  const auto b = nlohmann::json::parse(hpz.out)["distributed"]["communication"];
  const double bwd_a = a["by_purpose"]["param_gather_backward"], bwd_b = b["by_purpose"]["param_gather_backward"];
  EXPECT_DOUBLE_EQ(bwd_b / bwd_a, (3.0 / 4) / (7.0 / 8));
  EXPECT_DOUBLE_EQ(b["node_link_bytes"].get<double>(), a["node_link_bytes"].get<double>() - bwd_a);
  // The secondaries' line: the sum of E_b / 4 bf16 elements over the backward-read buckets,
  // E / 4 x 2 bytes, where the backward gather sends 2 E x 3/4 bytes per rank.
  const auto h = nlohmann::json::parse(hpz.out)["distributed"]["hpz"];
  EXPECT_EQ(h["partition_size"], 4);
  EXPECT_DOUBLE_EQ(h["secondary_bytes"].get<double>(), bwd_b / 3.0);
  EXPECT_LE(h["secondary_bytes_at_device_peak"].get<double>(), h["secondary_bytes"].get<double>());
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["distributed"].contains("hpz"));
  const test::CliResult text = test::run_memfit(base + " --zero-hpz-partition-size 4");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("hpZ: secondary partitions over 4 ranks"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("param_gather_backward"), std::string::npos) << text.out;
  const test::CliResult bad = test::run_memfit(base + " --zero-hpz-partition-size 3");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("must divide the data-parallel degree 8"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace memfit
