// Estimates per rank (fit/estimate.hpp): with one rank, no sharding and no offload they are
// the plan's peak exactly, and on this machine's hardware the peak an executed step measures;
// sharding only lowers the device peak, offload moves bytes to the host; the step time adds
// up its parts and communication vanishes on one rank.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "fit/estimate.hpp"
#include "graph/training_program.hpp"
#include "graph/zero.hpp"
#include "kernels/backend.hpp"
#include "runtime/compile.hpp"
#include "support/tiny_run.hpp"

namespace memfit {
namespace {

Cluster one(const std::string& hw) {
  Cluster c;
  c.hw = hardware_preset(hw);
  if (c.hw.executes_here) c.hw.capabilities = cpu_capabilities();  // the backend that runs here
  return c;
}

TEST(Estimate, OneRankEqualsThePlanAndTheExecutedPeak) {
  auto backend = make_cpu_backend();
  const ModelSpec spec = model_preset("gpt2-tiny");
  for (const char* rec : {"none", "full"})
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      Policy pol;
      pol.batch = 2;
      pol.seq = 32;
      pol.precision = prec;
      pol.recompute = parse_recompute(rec);
      EstimateOptions eo;
      eo.prepare = [&](Program& p) { attach_backend_scratch(p, *backend); };
      const RankEstimate e = estimate_run(spec, pol, one("cpu"), eo);
      test::TinyRun run(compile_program(build_training_program(spec, planning_policy(pol), {}, cpu_capabilities()), *backend));
      EXPECT_EQ(e.device_bytes, run.compiled.plan.tier(Tier::device).peak_bytes) << rec;
      run.step(0);
      run.step(1);
      EXPECT_EQ(run.ex->arena(Tier::device).measured_high_water(), e.device_bytes) << rec;
      EXPECT_EQ(e.host_bytes, 0u);
      EXPECT_EQ(e.comm_seconds, 0);
    }
}

// ZeRO 0-3 on 2 to 5 ranks: the estimate is rank 0's planned program (built and compiled here
// through the runtime's path), not a model of it: its peak, packing and collective bytes; and
// plan_every_rank finds the largest of every rank's planned peak.
TEST(Estimate, ZeroStagesAreRankZerosPlannedProgramAndEveryRankIsPlanned) {
  auto backend = make_cpu_backend();
  EstimateOptions eo;
  eo.prepare = [&](Program& p) { attach_backend_scratch(p, *backend); };
  struct Case {
    const char* model;
    int world, accum;
    OptimizerKind optimizer;
  };
  // 8-bit AdamW aligns pieces to its 256-element blocks; 5 ranks leave uneven padding.
  for (const Case& k : {Case{"gpt2-tiny", 2, 1, OptimizerKind::adamw}, Case{"gpt2-tiny", 3, 2, OptimizerKind::adamw},
                        Case{"gpt2-tiny", 5, 1, OptimizerKind::adamw8bit}, Case{"llama-tiny", 4, 2, OptimizerKind::adamw},
                        Case{"llama-tiny", 3, 1, OptimizerKind::adamw8bit}})
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE(testing::Message() << k.model << " world " << k.world << " accumulation " << k.accum << " "
                                      << optimizer_name(k.optimizer) << " stage " << stage);
      const ModelSpec spec = model_preset(k.model);
      Policy pol;
      pol.batch = 2;
      pol.seq = 32;
      pol.grad_accum = k.accum;
      pol.optimizer = k.optimizer;
      pol.zero_stage = stage;
      Cluster c = one("cpu");
      c.gpus_per_node = k.world;
      RankEstimate e = estimate_run(spec, pol, c, eo);
      EXPECT_TRUE(e.from_program);
      plan_every_rank(spec, pol, c, eo, e);
      EXPECT_EQ(e.ranks_planned, k.world);
      uint64_t largest = 0;
      int largest_rank = 0;
      for (int rank = 0; rank < k.world; ++rank) {
        const CompiledProgram run =
            compile_program(build_training_program(spec, pol, Topology{k.world, 1, rank}, cpu_capabilities()), *backend);
        const TierPlan& dev = run.plan.tier(Tier::device);
        if (dev.peak_bytes > largest) {
          largest = dev.peak_bytes;
          largest_rank = rank;
        }
        if (rank > 0) continue;
        EXPECT_EQ(e.device_bytes, dev.peak_bytes);
        EXPECT_EQ(e.packing_overhead, dev.peak_bytes - dev.max_live_bytes);
        EXPECT_NEAR(e.comm_bytes, communication_bytes_per_step(run.program), 1e-9 * e.comm_bytes);
        EXPECT_EQ(e.by_tier[size_t(Tier::device)], dev.live_by_category[size_t(e.peak_op)]);
      }
      EXPECT_EQ(e.device_bytes_of_largest_rank(), largest);
      EXPECT_EQ(e.largest_rank, largest_rank);
    }
  // The pieces differ by rank: with 8-bit state on 5 ranks another rank plans more than rank 0
  // (more piece tensors and scale blocks), which is why every rank is planned.
  Policy pol;
  pol.batch = 2;
  pol.seq = 32;
  pol.optimizer = OptimizerKind::adamw8bit;
  pol.zero_stage = 2;
  Cluster c = one("cpu");
  c.gpus_per_node = 5;
  RankEstimate e = estimate_run(model_preset("gpt2-tiny"), pol, c, eo);
  plan_every_rank(model_preset("gpt2-tiny"), pol, c, eo, e);
  EXPECT_GT(e.largest_rank_device_bytes, e.device_bytes);
  EXPECT_NE(e.largest_rank, 0);
}

TEST(Estimate, ShardingLowersTheDevicePeakAndOffloadMovesItToTheHost) {
  const ModelSpec spec = model_preset("gpt2");
  Policy pol;
  pol.batch = 4;
  pol.seq = 256;
  pol.precision = Precision::bf16;
  pol.grad_dtype = DType::bf16;
  Cluster c = one("a100-40gb");
  c.gpus_per_node = 8;
  const ProgramSummary s = plan_summary(spec, pol, c.hw, {});
  uint64_t previous = UINT64_MAX;
  for (int stage = 0; stage <= 3; ++stage) {
    pol.zero_stage = stage;
    const RankEstimate e = estimate_from_summary(s, pol, c, {});
    const uint64_t states = e.states.device_total();
    EXPECT_LT(states, previous) << "stage " << stage;
    previous = states;
    EXPECT_GT(e.comm_bytes, 0);
    EXPECT_NEAR(e.step_seconds, e.compute_seconds + e.recompute_seconds + e.comm_seconds + e.offload_seconds, 1e-9);
  }
  pol.offload_optimizer = Tier::host;
  pol.offload_params = Tier::host;
  const RankEstimate off = estimate_from_summary(s, pol, c, {});
  EXPECT_EQ(off.by_tier[0][size_t(Category::optimizer_state)], 0u);
  EXPECT_EQ(off.by_tier[0][size_t(Category::parameters)], 0u);
  EXPECT_GT(off.host_bytes, 0u);
  EXPECT_GT(off.offload_seconds, 0);
  // Offloaded optimizer from stage 2 on: gradients stream out through the reduce bucket, also
  // on one rank; the host holds this rank's fp32 gradient shard.
  Cluster single = one("a100-40gb");
  pol.offload_params = Tier::device;
  pol.zero_stage = 2;
  const RankEstimate streamed = estimate_from_summary(s, pol, single, {});
  EXPECT_EQ(streamed.by_tier[0][size_t(Category::gradients)], 0u);
  EXPECT_GT(streamed.by_tier[0][size_t(Category::communication)], 0u);
  EXPECT_EQ(streamed.by_tier[1][size_t(Category::gradients)], uint64_t(4 * s.parameters));
  pol.offload_params = Tier::host;
  pol.zero_stage = 2;
  EXPECT_THROW(estimate_from_summary(s, pol, c, {}), Error);  // parameter offload needs stage 3
}

TEST(Estimate, ComputeTimeFollowsTheStatedEfficiency) {
  const ModelSpec spec = model_preset("gpt2");
  Policy pol;
  pol.batch = 8;
  pol.seq = 1024;
  pol.precision = Precision::bf16;
  EstimateOptions half, full;
  half.efficiency = 0.25;
  full.efficiency = 0.5;
  const Cluster c = one("h100-80gb");
  const RankEstimate a = estimate_run(spec, pol, c, half), b = estimate_run(spec, pol, c, full);
  // Compute-bound ops take twice as long at half the efficiency; bandwidth-bound ones do not.
  EXPECT_GT(a.compute_seconds, 1.5 * b.compute_seconds);
  EXPECT_LE(a.compute_seconds, 2.0 * b.compute_seconds + 1e-12);
  EXPECT_GT(b.tokens_per_second, a.tokens_per_second);
}

TEST(Hardware, PresetsValidateAndJsonOverrides) {
  for (const std::string& n : hardware_preset_names()) EXPECT_NO_THROW(hardware_preset(n).validate()) << n;
  Hardware h = hardware_preset("h100-80gb");
  apply_hardware_json(nlohmann::json{{"base", "a100-40gb"}, {"memory_bytes", "20GiB"}}, h, "test");
  EXPECT_EQ(h.memory_bytes, 20ull << 30);
  EXPECT_EQ(h.peak_bf16_flops, 312e12);
  EXPECT_THROW(apply_hardware_json(nlohmann::json{{"memory", 1}}, h, "test"), Error);
  EXPECT_THROW(hardware_preset("tpu"), Error);
  // What `plan --json` writes reads back as a hardware file, field for field.
  Hardware measured = hardware_preset("cpu");
  measured.peak_fp32_flops = 4.2e11;
  measured.speeds_measured = true;
  Hardware read = hardware_preset("l4-24gb");
  apply_hardware_json(hardware_json(measured), read, "test");
  EXPECT_EQ(hardware_json(read), hardware_json(measured));
}

}  // namespace
}  // namespace memfit
