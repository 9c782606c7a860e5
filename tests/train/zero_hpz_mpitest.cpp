// ZeRO++ hpZ under mpirun (CTest runs this with 2 and 4 ranks): a few steps of gpt2-tiny and
// llama-tiny at stage 3 with zero_hpz_partition_size 2, against the same run without hpZ on
// the same ranks. The secondary partition is an exact copy of the forward's gathered values,
// and the backward's gather over the hpZ group reassembles exactly what the data group's
// gather would (qwZ: what its decoder would write: the same codes of the same shard), so the
// loss trajectories must be BITWISE equal: with qwZ, with recomputation (whose forward ops read
// the backward's gather) and with gradient accumulation (each micro-step copies and gathers
// afresh). Also: planned == measured device bytes and no allocation in steps 2.. on every rank,
// and the bytes of the backward's gathers, which show that hpZ ran: a ring over N ranks sends
// (N-1)/N of the bucket per rank where the data group's sends (D-1)/D. With 2 ranks the
// partition is the whole data group, which DeepSpeed (and memfit) treat as plain stage 3.
#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "dist/communicator.hpp"
#include "support/mpi_test.hpp"
#include "train/trainer.hpp"

namespace memfit {
namespace {

constexpr int64_t kSteps = 4;
constexpr int kPartition = 2;

Communicator& comm() { return test::world(); }

struct Variant {
  const char* name;
  bool qwz = false;
  const char* recompute = "none";
  int accum = 1;
};

RunConfig config(const std::string& model, const Variant& v, int hpz) {
  RunConfig c;
  c.model = model;
  c.policy.seq = 32;
  c.policy.batch = 2;
  c.policy.zero_stage = 3;
  c.policy.precision = Precision::bf16;
  c.policy.grad_dtype = DType::bf16;
  if (model != "gpt2-tiny") c.policy.attention = AttentionKind::flash;
  c.policy.zero_quantized_weights = v.qwz;
  c.policy.recompute = parse_recompute(v.recompute);
  c.policy.grad_accum = v.accum;
  c.policy.zero_hpz_partition_size = hpz;
  c.steps = kSteps;
  c.lr = 1e-3;
  c.val_fraction = 0.05;
  c.eval_batches = 1;
  c.log_every = 0;
  return c;
}

using Run = test::WorldRun;
Run run(const RunConfig& c) { return test::run_on_world(c); }

double purpose(const Run& r, const char* name) { return test::bytes_sent_for(r, name); }

void expect_bitwise_equal_to_plain(const std::string& model, const Variant& v) {
  SCOPED_TRACE(fmt::format("{} {}, {} ranks, rank {}", model, v.name, comm().size(), comm().rank()));
  const Run plain = run(config(model, v, 1));
  const Run hpz = run(config(model, v, kPartition));
  ASSERT_EQ(plain.loss.size(), size_t(kSteps));
  EXPECT_EQ(hpz.loss, plain.loss);  // bitwise: an exact copy, gathered unquantised
  EXPECT_EQ(hpz.report["policy"]["zero_hpz_partition_size"], kPartition);
  for (const Run* r : {&plain, &hpz}) {
    EXPECT_EQ(r->report["memory"]["planned_peak_bytes"]["device"], r->report["memory"]["measured_peak_bytes"]["device"]);
    EXPECT_EQ(r->allocations, 0);
  }
  // The forward's gathers and the reduce-scatter are untouched; the backward's ring shrinks from
  // the data group to the partition (plain qwZ's backward gather is int8, hpZ's is bf16).
  const double D = comm().size(), N = comm().size() > kPartition ? kPartition : D;
  EXPECT_EQ(purpose(hpz, "param_gather_forward"), purpose(plain, "param_gather_forward"));
  EXPECT_EQ(purpose(hpz, "grad_reduce_scatter"), purpose(plain, "grad_reduce_scatter"));
  const double bwd_plain = purpose(plain, "param_gather_backward"), bwd_hpz = purpose(hpz, "param_gather_backward");
  if (!v.qwz) {
    EXPECT_DOUBLE_EQ(bwd_hpz / bwd_plain, ((N - 1) / N) / ((D - 1) / D));
  } else if (N < D) {
    EXPECT_NEAR(bwd_hpz / bwd_plain, 2.0 / (1.0 + 4.0 / 256) * ((N - 1) / N) / ((D - 1) / D), 0.03);
  }
  if (comm().rank() == 0)
    std::printf("  %s %s: %zu losses %s; backward gathers %.0f -> %.0f bytes per rank per step; device "
                "peak %.0f -> %.0f bytes\n",
                model.c_str(), v.name, hpz.loss.size(), hpz.loss == plain.loss ? "bitwise equal" : "DIFFER", bwd_plain,
                bwd_hpz,
                plain.report["memory"]["planned_peak_bytes"]["device"].get<double>(),
                hpz.report["memory"]["planned_peak_bytes"]["device"].get<double>());
}

TEST(ZeroHpz, Gpt2IsBitwiseStageThree) { expect_bitwise_equal_to_plain("gpt2-tiny", {"plain"}); }
TEST(ZeroHpz, Gpt2WithQwzIsBitwiseQwz) { expect_bitwise_equal_to_plain("gpt2-tiny", {"qwZ", true}); }
TEST(ZeroHpz, Gpt2WithRecomputeIsBitwiseStageThree) {
  expect_bitwise_equal_to_plain("gpt2-tiny", {"recompute full", false, "full"});
}
TEST(ZeroHpz, Gpt2WithAccumulationIsBitwiseStageThree) {
  expect_bitwise_equal_to_plain("gpt2-tiny", {"grad accumulation 2", false, "none", 2});
}
TEST(ZeroHpz, LlamaIsBitwiseStageThree) { expect_bitwise_equal_to_plain("llama-tiny", {"plain"}); }
TEST(ZeroHpz, LlamaWithQwzAndRecomputeIsBitwiseQwz) {
  expect_bitwise_equal_to_plain("llama-tiny", {"qwZ, recompute full", true, "full"});
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) { return memfit::test::run_mpi_tests(argc, argv); }
