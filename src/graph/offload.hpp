// Offload (ZeRO-Offload to the host tier, ZeRO-Infinity to disk) as two passes over the step
// program. The optimizer half (offload.cpp): the optimizer state and the fp32 master weights
// move to the offload tier. The parameter half (offload_params.cpp, below): stage 3's
// persistent parameter shards move there.
//
// host: the update ops run on the host tier where the state lives (ZeRO-Offload's CPU Adam);
//   nothing streams. On the CPU backend the host tier is RAM like the device tier, so this
//   moves bytes between two arenas and saves no memory; a backend whose device memory the
//   host cannot address would add the gradients' transfer down and the parameters' back up.
// disk: the optimizer section streams the state through staging chunks on the host tier
//   (4 KiB aligned, so the file moves with O_DIRECT), as ZeRO-Infinity swaps NVMe through
//   pinned host buffers:
//
//     in(chunk k+1) ... update(chunk k), narrow(chunk k) ... out(chunk k)
//
//   Transfers in are emitted one chunk ahead of the update that reads them and transfers out
//   right after it, so schedule_async (run after this pass) starts each early and waits just
//   before the bytes are needed: chunk k+1 is read while chunk k is updated and chunk k-1 is
//   written, and at most three chunks of staging are live (the planner places them: staging
//   is in the plan like any other transient tensor).
//
// Every update and narrowing cast is elementwise (8-bit AdamW's quantisation blocks never
// straddle a chunk), so the offloaded program computes the same bits as the resident one.
// Runs after ZeRO (whose update ops already name this rank's pieces) and before
// schedule_async. Gradients and the parameters stay on the device tier.
//
// Parameter offload (--offload-params host|disk, ZeRO stage 3 only): the persistent shards
// that stage 3's all-gathers read move to the offload tier.
// host: the gathers read the shards where they live and the optimizer writes them there; on the
//   CPU backend that tier is RAM the kernels address, so nothing streams.
// disk: each gather reads a device-tier copy of its shard, fetched by a transfer emitted one
//   gather ahead, so schedule_async starts it before the previous block's compute and waits
//   just before the gather:
//
//     fetch(g+1) gather(g) ... block g-1 ... fetch(g+2) gather(g+1) ... block g ...
//
//   Each fetch has its own transient staging tensor, exactly the shard's bytes, so the planner
//   bounds how many are live (about two per pass) and the transfer writes every byte of it.
//   In the optimizer section every op that writes a piece of a shard (the cast from the
//   master, or the fp32 update itself, split per parameter) writes a device staging copy of
//   that piece instead; a transfer reads the piece in first when the op reads it (the fp32
//   update) and writes it back out after, read one op ahead. Only pieces move, so the
//   shard's padding is never written from the device.
// Runs after optimizer offload (whose chunked updates may name pieces of the shards) and
// before schedule_async.
#pragma once

#include <cstdint>
#include <string>

#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

// Elements per staging chunk unless the policy names another size: 4M elements, 16 MiB per
// fp32 tensor (three chunks of master + m + v: 144 MiB in flight).
inline constexpr int64_t kDefaultOffloadChunk = int64_t(1) << 22;
// Chunk sizes are multiples of this (8-bit AdamW's blocks of 256, and 4 KiB of 8-bit codes so
// that every chunk of every state tensor starts on a disk-aligned offset).
inline constexpr int64_t kOffloadChunkGranule = 4096;

// Empty when the policy's offload settings can be built, else why not (one line).
std::string offload_refusal(const Policy& p);

// Moves the optimizer's tensors to policy.offload_optimizer and streams them (see above).
// No-op when the optimizer is not offloaded.
void apply_optimizer_offload(Program& p, const Policy& policy);

// Moves stage 3's parameter shards to policy.offload_params and fetches them (see above).
// No-op when the parameters are not offloaded.
void apply_param_offload(Program& p, const Policy& policy);

// An update op's per-parameter slots: inputs [grads x n (, norm when clipping)], outputs
// [target, state roles...] x n, role-major. Shared by both offload passes.
struct UpdateSlots {
  size_t n = 0, roles = 0;
  bool clips = false;
};
UpdateSlots update_slots(const Op& op);
bool is_update_op(const Op& op);
// A transfer op from src to dst, on the queue of its direction (towards slower tiers: out).
Op transfer_op(const Program& p, const std::string& name, TensorId src, TensorId dst, int layer);

}  // namespace memfit
