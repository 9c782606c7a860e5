// The optimizer-offload pass (graph/offload.hpp) on gpt2-tiny, without running it:
// (a) the optimizer state and the masters, and nothing else, move to the offload tier; disk
//     offload stages them on the host tier, host offload updates them in place;
// (b) disk offload splits every update into chunks of at most the chunk size, one per
//     parameter piece, covering each parameter once;
// (c) after scheduling, every chunk's update but the last runs while the next chunk's reads are
//     in flight, and every one but the first while an earlier chunk's writes are;
// (d) the staging the plan holds is a few chunks, not the state: the host tier's peak is at most
//     four chunks' staging (the one updated, the one read ahead, the ones written behind);
// (e) the policy's refusals: parameter offload, the update in backward, a chunk that is not a
//     multiple of 4096 elements.
#include <gtest/gtest.h>

#include <map>
#include <set>

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
  EXPECT_NE(offload_refusal(p).find("--offload-params"), std::string::npos);
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

}  // namespace
}  // namespace memfit
