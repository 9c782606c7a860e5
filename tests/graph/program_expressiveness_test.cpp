// The step program describes what later techniques need before any of them executes:
// 16-bit tensors and casts, fp32 master weights, recomputed ops, collectives on shard-sized
// views of flat buffers, and transfers between tiers. The planner plans all of it per tier,
// with exact byte counts checked here by hand.
#include <gtest/gtest.h>

#include "graph/builder.hpp"
#include "plan/memory_plan.hpp"

namespace memfit {
namespace {

TEST(ProgramExpressiveness, MixedPrecisionShardsRecomputeAndTransfersArePlannedPerTier) {
  Program p;
  GraphBuilder b(p);
  const int world = 4;
  const int64_t n = 4096;  // parameters in one flat buffer
  // bf16 parameters (flat), an fp32 master shard, fp32 optimizer state offloaded to host,
  // a bf16 gradient buffer reduce-scattered into a shard.
  const TensorId params = b.persistent("flat.params", Shape{n}, Category::parameters, DType::bf16);
  const TensorId master = b.persistent("flat.master.shard", Shape{n / world}, Category::master_weights, DType::f32);
  const TensorId m = b.persistent("adam.m.shard", Shape{n / world}, Category::optimizer_state, DType::f32);
  p.tensor(m).tier = Tier::host;
  const TensorId v_disk = b.persistent("adam.v.shard", Shape{n / world}, Category::optimizer_state, DType::f32);
  p.tensor(v_disk).tier = Tier::disk;

  p.begin_section("micro");
  b.set_phase(Phase::forward);
  const TensorId x16 = b.transient("x", Shape{64, 64}, Category::activations, DType::bf16);
  b.emit({OpKind::fill, "x.init", {}, {x16}});
  const TensorId x32 = b.transient("x.fp32", Shape{64, 64}, Category::temporaries, DType::f32);
  b.emit({OpKind::cast, "x.cast", {x16}, {x32}});
  const TensorId y = b.transient("y", Shape{64, 64}, Category::activations, DType::bf16);
  const int fwd = b.emit({OpKind::gelu_forward, "gelu", {x16}, {y}});
  b.set_phase(Phase::recompute);
  const TensorId y2 = b.transient("y.recomputed", Shape{64, 64}, Category::temporaries, DType::bf16);
  const int re = b.emit({OpKind::gelu_forward, "gelu.recompute", {x16}, {y2}});
  p.ops()[size_t(re)].replays = fwd;
  b.set_phase(Phase::communication);
  const TensorId grads = b.transient("flat.grads", Shape{n}, Category::gradients, DType::bf16);
  b.emit({OpKind::fill, "grads.fill", {y2, y, x32}, {grads}});
  const TensorId shard = p.add_view(grads, "flat.grads.shard1", Shape{n / world}, DType::bf16, 2 * n / world);
  b.emit({OpKind::reduce_scatter, "grads.reduce_scatter", {grads}, {shard}, CollectiveAttrs{CommGroup::data, world}});
  p.end_section();

  p.begin_section("optimizer");
  b.set_phase(Phase::transfer);
  const TensorId staging = b.transient("adam.m.staging", Shape{n / world}, Category::offload_staging, DType::f32);
  b.emit({OpKind::transfer, "m.to_device", {m}, {staging}});
  b.set_phase(Phase::optimizer);
  b.emit({OpKind::adamw, "adamw", {shard}, {master, staging, v_disk},
          AdamWAttrs{}, 0, {WriteMode::update, WriteMode::update, WriteMode::update}});
  b.set_phase(Phase::transfer);
  b.emit({OpKind::transfer, "m.to_host", {staging}, {m}});
  b.set_phase(Phase::communication);
  b.emit({OpKind::cast, "master.cast", {master}, {shard}});
  b.emit({OpKind::all_gather, "params.all_gather", {shard}, {params}, CollectiveAttrs{CommGroup::data, world}});
  p.end_section();
  p.validate();

  const MemoryPlan plan = plan_memory(p);
  EXPECT_EQ(find_overlap(p, plan), "");
  EXPECT_EQ(plan.tier(Tier::host).peak_bytes, uint64_t(n / world * 4));  // m shard
  EXPECT_EQ(plan.tier(Tier::disk).peak_bytes, uint64_t(n / world * 4));  // v shard
  // Device: bf16 params (8192 B) + fp32 master shard (4096) persistent; the largest moments are
  // the recompute (x 8192 B bf16, x.fp32 16384, y 8192, y.recomputed 8192) and the grads fill
  // (x has died; grads 8192 instead): both 53248 B.
  const TierPlan& dev = plan.tier(Tier::device);
  EXPECT_EQ(dev.max_live_bytes, 8192u + 4096u + 16384u + 8192u + 8192u + 8192u);
  EXPECT_EQ(dev.at_peak[size_t(Category::master_weights)], 4096u);
  // The shard view lives inside the gradient buffer's bytes.
  EXPECT_EQ(plan.tensors[size_t(shard)].offset, plan.tensors[size_t(grads)].offset + 2 * n / world);
  EXPECT_EQ(p.op(re).phase, Phase::recompute);
}

}  // namespace
}  // namespace memfit
