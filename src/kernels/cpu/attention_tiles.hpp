// The fp32 form of plain causal attention (attention.hpp), computed one (batch, head) at a
// time with register-blocked tile products (tile_gemm.hpp) on data that stays in the core's
// cache: a head's q, k, v are 3 x T x HS floats and its probabilities T x T, 64 KB + 256 KB at
// T = 256, HS = 64. oneDNN's batched strided products ran these at 30-200 GFLOP/s on 2 cores
// (64 x 64 .. 64 x 256 matrices per (b, h), with a fork per product); one thread per head
// with no fork inside a head keeps the products near the tile kernel's speed.
//
// Causality: queries are taken in blocks of kAttentionQueryBlock rows, and block [r0, r1)
// multiplies only against keys [0, r1); key block [j0, j1) receives gradient only from
// queries [j0, T). Entries above the diagonal are set to exactly 0 by the softmax passes.
//
// Grouped kv heads (attention.hpp): the forward runs one task per (batch, query head); the
// backward one per (batch, kv head), looping the group's query heads in order inside, so
// that the group sums of dk and dv need no scratch and no cross-thread reduction (and a
// multi-query shape, KV = 1, has only B backward tasks to spread over the threads).
//
// Scratch: per OpenMP thread, four head-sized operands copied contiguous: k^T and v in the
// forward; v^T, dy, k and q in the backward. Each head (each kv head in the backward) is
// summed by one thread in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.hpp"

namespace memfit {

inline constexpr int64_t kAttentionQueryBlock = 48;  // a multiple of tile_gemm's 6 rows

uint64_t attention_tiles_scratch_bytes(const AttentionShape& shape, int threads);

// probs (B, NH, T, T) overwritten; y (B, T, C) written or added to, or skipped when nullptr.
void attention_forward_tiles(const AttentionShape& shape, const float* qkv, float* y, float* probs, bool acc_y,
                             void* scratch, int threads);

// dprobs (B, NH, T, T) is a workspace; dqkv (the layout of qkv) written or added to.
void attention_backward_tiles(const AttentionShape& shape, const float* dy, const float* qkv, const float* probs,
                              float* dqkv, float* dprobs, bool acc_dqkv, void* scratch, int threads);

}  // namespace memfit
