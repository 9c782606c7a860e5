// Optimizer offload (ZeRO-Offload to the host tier, ZeRO-Infinity to disk) as a pass over the
// step program: the optimizer state and the fp32 master weights move to the offload tier.
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
// schedule_async. Gradients and the parameters stay on the device tier (parameter offload is
// refused by offload_refusal).
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

}  // namespace memfit
