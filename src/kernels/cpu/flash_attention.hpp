// Flash attention on the CPU: causal attention over the fused qkv tensor (B, T, 3C), or
// (B, T, (NH + 2KV) HS) with grouped kv heads (the layouts of attention.hpp), tiled over
// blocks of kFlashBlock queries and keys with an online softmax. No T x T tensor ever exists:
// the forward keeps only y and the per-row log-sum-exp of the scaled scores, lse (B, NH, T)
// fp32; the backward recomputes each tile of probabilities from q, k and lse. Every tile
// lives in the kernel's per-thread scratch (the op's library scratch in the plan), which
// grows with T (one row of statistics and one dq accumulator per head), never with T^2.
//
// Work split: the forward runs one task per (batch, query head, query block); the backward one
// task per (batch, kv head), walking key blocks in order and, per key block, the kv head's
// group of query heads in order, so that dq, dk and dv (dk and dv summed over the group) are
// summed by one thread in a fixed order: results do not depend on the thread count. With
// grouping the backward's scratch holds D and a dq accumulator for each of the group's
// query heads (G x (T + T HS) floats per thread rather than T + T HS).
//
// Precision: the softmax, its statistics and every sum are fp32 whatever the storage type; the
// element type of qkv, y, dy and dqkv is a template parameter read and written only through
// rows_f32(), transpose_into() and store_row(), which widen fp16 and bf16 tiles to fp32 for
// tile_gemm. Built with AVX512-BF16, bf16 storage instead runs flash_attention_bf16.cpp's
// tasks (same split, same order of every sum): products on bf16 operands with fp32 sums, the
// probabilities and dS rounded to bf16 as they enter a product. The scratch slice of a thread
// fits either layout.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.hpp"

namespace memfit {

inline constexpr int64_t kFlashBlock = 64;  // queries and keys per tile

// Scratch for `threads` OpenMP threads (the kernels use one slice per thread number).
uint64_t flash_forward_scratch_bytes(const AttentionShape& shape, int threads);
uint64_t flash_backward_scratch_bytes(const AttentionShape& shape, int threads);

// in [qkv (B,T,(NH+2KV)HS)] out [y (B,T,C), lse (B,NH,T)]; both overwritten.
template <class T>
void flash_attention_forward(const AttentionShape& shape, const T* qkv, T* y, float* lse, void* scratch, int threads);

// in [dy, qkv, y, lse] out [dqkv (the layout of qkv)]: dqkv = d or dqkv += d.
template <class T>
void flash_attention_backward(const AttentionShape& shape, const T* dy, const T* qkv, const T* y, const float* lse,
                              T* dqkv, bool accumulate, void* scratch, int threads);

}  // namespace memfit
