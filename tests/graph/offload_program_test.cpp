// The optimizer-offload pass (graph/offload.hpp) on gpt2-tiny, without running it:
// (a) the optimizer state and the masters, and nothing else, move to the offload tier; disk
//     offload stages them on the host tier, host offload updates them in place;
// (b) disk offload splits every update into chunks of at most the chunk size, one per
//     parameter piece, covering each parameter once;
// (c) after scheduling, every chunk's update but the last runs while the next chunk's reads are
//     in flight, and every one but the first while an earlier chunk's writes are;
// (d) the staging the plan holds is a few chunks, not the state: the host tier's peak is at most
//     four chunks' staging (the one updated, the one read ahead, the ones written behind);
// (e) the policy's refusals: parameter offload below stage 3 or with the update in backward,
//     optimizer offload with the update in backward, a chunk that is not a multiple of 4096
//     elements (a quantised base offloads: tests/train/qlora_zero_mpitest.cpp).
// Parameter offload (stage 3, one rank and rank 1 of two):
// (f) the parameter shards, and no other tensor, move to the offload tier; with disk, every
//     gather of a shard reads a device-tier staging copy written by a transfer from the shard;
// (g) every gather's fetch is started before the previous gather, and every one from the third
//     on is in flight across compute ops (the previous block's);
// (h) the device's largest live total falls by the shard bytes (closed form: each parameter
//     rounded up to 32 elements, each bucket to the ranks times 32, divided by the ranks) less
//     at most two shards of staging, and the peak likewise up to its packing.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.hpp"
#include "graph/offload.hpp"
#include "graph/training_program.hpp"
#include "kernels/backend.hpp"
#include "runtime/compile.hpp"

namespace memfit {
namespace {

constexpr int64_t kChunk = 8192;

CompiledProgram offloaded(Tier tier, OptimizerKind optimizer, Precision precision) {
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.precision = precision;
  p.optimizer = optimizer;
  p.grad_clip = 1.0;
  p.offload_optimizer = tier;
  p.offload_chunk_elements = kChunk;
  return compile_program(build_training_program(model_preset("gpt2-tiny"), p, {}, cpu_capabilities()),
                         *make_cpu_backend());
}

bool is_update(const Op& op) { return op.kind == OpKind::adamw || op.kind == OpKind::adamw8bit; }

TEST(OffloadProgram, OnlyTheOptimizersTensorsMoveAndDiskIsStagedOnTheHost) {
  for (Tier tier : {Tier::host, Tier::disk}) {
    const CompiledProgram c = offloaded(tier, OptimizerKind::adamw, Precision::bf16);
    const Program& p = c.program;
    for (const TensorDesc& t : p.tensors()) {
      SCOPED_TRACE(t.name);
      const bool optimizers = t.category == Category::optimizer_state || t.category == Category::master_weights;
      if (optimizers) EXPECT_EQ(t.tier, tier);
      else if (t.category == Category::offload_staging) EXPECT_EQ(t.tier, Tier::host);
      else EXPECT_EQ(t.tier, Tier::device);
    }
    int transfers = 0, staging = 0;
    for (const Op& op : p.ops()) transfers += op.kind == OpKind::transfer;
    for (const TensorDesc& t : p.tensors()) staging += t.category == Category::offload_staging;
    if (tier == Tier::host) {
      EXPECT_EQ(transfers, 0);
      EXPECT_EQ(staging, 0);
    } else {
      EXPECT_GT(transfers, 0);
      EXPECT_GT(staging, 0);
    }
  }
}

TEST(OffloadProgram, ChunksCoverEveryParameterOnceAndOverlapTheirNeighbours) {
  for (OptimizerKind optimizer : {OptimizerKind::adamw, OptimizerKind::adamw8bit})
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(std::string(precision_name(precision)) + (optimizer == OptimizerKind::adamw ? " adamw" : " adamw8bit"));
      const CompiledProgram c = offloaded(Tier::disk, optimizer, precision);
      const Program& p = c.program;
      // (b): elements updated per parameter, by the gradient each chunk's first input views.
      std::map<TensorId, int64_t> covered;
      int64_t expected_chunks = 0;
      for (const ParamEntry& e : p.params()) {
        covered[p.root_of(e.grad)] = 0;
        expected_chunks += (p.tensor(e.grad).numel() + kChunk - 1) / kChunk;
      }
      std::vector<int> updates;
      for (int i = 0; i < int(p.ops().size()); ++i)
        if (is_update(p.op(i))) updates.push_back(i);
      EXPECT_EQ(int64_t(updates.size()), expected_chunks);
      for (int i : updates) {
        const TensorDesc& g = p.tensor(p.op(i).inputs[0]);
        EXPECT_LE(g.numel(), kChunk) << p.op(i).name;
        covered[p.root_of(p.op(i).inputs[0])] += g.numel();
      }
      for (const ParamEntry& e : p.params()) EXPECT_EQ(covered[p.root_of(e.grad)], p.tensor(e.grad).numel()) << e.name;

      // (c): transfers in flight at each update, by queue.
      std::map<int, Queue> started;  // async id -> queue
      int in_flight[2] = {0, 0};     // transfer_in, transfer_out
      int with_reads = 0, with_writes = 0;
      for (int i = 0; i < int(p.ops().size()); ++i) {
        const Op& op = p.op(i);
        if (op.kind == OpKind::transfer && op.async_id >= 0) {
          started[op.async_id] = op.queue;
          ++in_flight[op.queue == Queue::transfer_in ? 0 : 1];
        } else if (op.kind == OpKind::wait && started.count(op.async_id)) {
          --in_flight[started.at(op.async_id) == Queue::transfer_in ? 0 : 1];
        } else if (is_update(op)) {
          with_reads += in_flight[0] > 0;
          with_writes += in_flight[1] > 0;
        }
      }
      EXPECT_EQ(with_reads, int(updates.size()) - 1) << "every update but the last overlaps the next chunk's reads";
      EXPECT_EQ(with_writes, int(updates.size()) - 1) << "every update but the first overlaps earlier writes";

      // (d): staging per chunk is the state and master bytes of kChunk elements.
      uint64_t largest_chunk = 0;
      for (int i : updates) {
        uint64_t bytes = 0;
        for (TensorId out : p.op(i).outputs)
          if (p.tensor(out).category == Category::offload_staging) bytes += p.tensor(out).bytes();
        largest_chunk = std::max(largest_chunk, bytes);
      }
      const uint64_t host_peak = c.plan.tier(Tier::host).peak_bytes;
      EXPECT_GT(host_peak, largest_chunk);
      EXPECT_LE(host_peak, 4 * (largest_chunk + 5 * 4096)) << "largest chunk " << largest_chunk;
    }
}

TEST(OffloadProgram, RefusalsSayWhy) {
  Policy p;
  p.offload_params = Tier::host;
  EXPECT_NE(offload_refusal(p).find("--offload-params host) needs ZeRO stage 3"), std::string::npos) << offload_refusal(p);
  p.zero_stage = 3;
  EXPECT_EQ(offload_refusal(p), "");
  p.update_in_backward = true;
  EXPECT_NE(offload_refusal(p).find("--optimizer-in-backward"), std::string::npos);
  p.update_in_backward = false;
  p.quantize_base.kind = BaseQuant::nf4;  // ZeRO-3 shards a quantised base's bytes: they offload too
  EXPECT_EQ(offload_refusal(p), "");
  p = Policy{};
  p.offload_optimizer = Tier::disk;
  p.update_in_backward = true;
  EXPECT_NE(offload_refusal(p).find("backward"), std::string::npos);
  p = Policy{};
  p.offload_optimizer = Tier::disk;
  p.offload_chunk_elements = 5000;
  EXPECT_NE(offload_refusal(p).find("multiple of 4096"), std::string::npos);
  p.offload_chunk_elements = 8192;
  EXPECT_EQ(offload_refusal(p), "");
}

Policy stage3(Precision precision, Tier params) {
  Policy p;
  p.batch = 2;
  p.seq = 32;
  p.precision = precision;
  p.grad_clip = 1.0;
  p.zero_stage = 3;
  p.offload_params = params;
  return p;
}

CompiledProgram compiled(const Policy& p, Topology topo = {}) {
  return compile_program(build_training_program(model_preset("gpt2-tiny"), p, topo, cpu_capabilities()),
                         *make_cpu_backend());
}

bool is_shard(const Program& p, TensorId id) {
  const TensorDesc& t = p.tensor(p.root_of(id));
  return t.category == Category::parameters && t.lifetime == Lifetime::persistent;
}

TEST(ParamOffloadProgram, ShardsMoveAndEveryGatherReadsAFetchedCopy) {
  for (Tier tier : {Tier::host, Tier::disk}) {
    SCOPED_TRACE(tier_name(tier));
    const CompiledProgram c = compiled(stage3(Precision::bf16, tier));
    const Program& p = c.program;
    for (TensorId id = 0; id < TensorId(p.tensors().size()); ++id) {
      const TensorDesc& t = p.tensor(id);
      SCOPED_TRACE(t.name);
      EXPECT_EQ(t.tier, is_shard(p, id) ? tier : Tier::device);
    }
    std::map<TensorId, int> fetched;  // staging -> transfers writing it
    for (const Op& op : p.ops())
      if (op.kind == OpKind::transfer && op.async_id >= 0) {
        EXPECT_TRUE(is_shard(p, op.inputs[0]) || is_shard(p, op.outputs[0])) << op.name;
        if (is_shard(p, op.inputs[0])) ++fetched[op.outputs[0]];
      }
    int gathers = 0;
    for (const Op& op : p.ops()) {
      if (op.kind != OpKind::all_gather) continue;
      ++gathers;
      if (tier == Tier::host) {
        EXPECT_TRUE(is_shard(p, op.inputs[0])) << op.name;
      } else {
        EXPECT_EQ(p.tensor(op.inputs[0]).category, Category::offload_staging) << op.name;
        EXPECT_EQ(fetched[op.inputs[0]], 1) << op.name;
      }
    }
    EXPECT_GT(gathers, 0);
    if (tier == Tier::host) {
      EXPECT_TRUE(fetched.empty());
    }
  }
}

TEST(ParamOffloadProgram, FetchesRunAheadOfTheirGathersAcrossCompute) {
  for (Topology topo : {Topology{}, Topology{2, 1, 1}}) {
    SCOPED_TRACE(topo.data);
    const CompiledProgram c = compiled(stage3(Precision::fp32, Tier::disk), topo);
    const Program& p = c.program;
    std::map<int, int> start_of, wait_of;  // async id -> op index
    std::map<TensorId, int> fetch_of;      // staging -> async id of its fetch
    for (int i = 0; i < int(p.ops().size()); ++i) {
      const Op& op = p.op(i);
      if (op.async_id < 0) continue;
      (op.kind == OpKind::wait ? wait_of : start_of)[op.async_id] = i;
      if (op.kind == OpKind::transfer && is_shard(p, op.inputs[0])) fetch_of[op.outputs[0]] = op.async_id;
    }
    for (const Section& sec : p.sections()) {
      std::vector<int> gathers;
      for (int i = sec.begin; i < sec.end; ++i)
        if (p.op(i).kind == OpKind::all_gather) gathers.push_back(i);
      for (size_t j = 0; j < gathers.size(); ++j) {
        const Op& g = p.op(gathers[j]);
        SCOPED_TRACE(g.name);
        ASSERT_TRUE(fetch_of.count(g.inputs[0]));
        const int id = fetch_of.at(g.inputs[0]);
        ASSERT_TRUE(start_of.count(id) && wait_of.count(id)) << "the fetch is asynchronous";
        EXPECT_LT(wait_of.at(id), gathers[j]);
        if (j == 0) continue;
        EXPECT_LT(start_of.at(id), gathers[j - 1]) << "fetched one gather ahead";
        if (j == 1) continue;
        int compute = 0;
        for (int i = start_of.at(id); i < wait_of.at(id); ++i) compute += p.op(i).queue == Queue::compute;
        EXPECT_GT(compute, 0) << "in flight while the previous block computes";
      }
    }
  }
}

TEST(ParamOffloadProgram, DevicePeakFallsByTheShardBytes) {
  for (int ranks : {1, 2})
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(fmt::format("{} ranks {}", ranks, precision_name(precision)));
      const Topology topo{ranks, 1, 0};
      const CompiledProgram resident = compiled(stage3(precision, Tier::device), topo);
      const CompiledProgram offloaded = compiled(stage3(precision, Tier::disk), topo);
      // Closed form of the rank's shards, from the model's parameters alone.
      const Program whole = build_training_program(model_preset("gpt2-tiny"), Policy{}, {}, cpu_capabilities());
      std::map<int, int64_t> bucket;  // layer -> padded elements
      for (const ParamEntry& e : whole.params()) bucket[whole.tensor(e.value).layer] += (whole.param_numel(e) + 31) / 32 * 32;
      const uint64_t bytes = precision == Precision::fp32 ? 4 : 2;
      uint64_t shards = 0, largest = 0;
      for (const auto& [layer, n] : bucket) {
        const uint64_t shard = uint64_t((n + 32 * ranks - 1) / (32 * ranks) * 32) * bytes;
        shards += shard;
        largest = std::max(largest, shard);
      }
      // The disk tier is the shards, each starting 4 KiB aligned.
      const uint64_t disk = offloaded.plan.tier(Tier::disk).peak_bytes;
      EXPECT_GE(disk, shards);
      EXPECT_LT(disk, shards + 4096 * bucket.size());
      // Live bytes (the planner's lower bound): the shards leave the device, and at most two
      // shards of staging (the one a gather in flight reads, the next one fetched) join.
      const TierPlan& before = resident.plan.tier(Tier::device);
      const TierPlan& after = offloaded.plan.tier(Tier::device);
      std::cout << fmt::format("[{} ranks {}] device peak {} -> {} bytes, live {} -> {}; shards {} (largest {})\n", ranks,
                               precision_name(precision), before.peak_bytes, after.peak_bytes, before.max_live_bytes,
                               after.max_live_bytes, shards, largest);
      ASSERT_LT(after.max_live_bytes, before.max_live_bytes);
      EXPECT_LE(before.max_live_bytes - after.max_live_bytes, shards);
      EXPECT_GE(before.max_live_bytes - after.max_live_bytes + 2 * largest, shards);
      // The peak likewise, up to the offloaded plan's own packing (holes at its peak).
      ASSERT_LT(after.peak_bytes, before.peak_bytes);
      EXPECT_LE(after.peak_bytes + shards, before.peak_bytes + 2 * largest + (after.peak_bytes - after.max_live_bytes));
    }
}

}  // namespace
}  // namespace memfit
