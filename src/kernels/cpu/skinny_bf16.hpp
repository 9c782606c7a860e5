// skinny_bf16: products of bf16 operands in which one dimension is at most kSkinnyMax (64),
// with fp32 sums (AVX512-BF16 vdpbf16ps): LoRA's adapter products, whose rank is that
// dimension. oneDNN runs them at a quarter to a half of its large-product speed (the forward
// x A^T, N = 1024 rows by K = 2048 into 16 columns, took 0.65 ms: ~100 GFLOP/s), because its
// blocking is made for wide operands; here the narrow side sits in registers.
//
// C (+)= alpha * A[M,K] op(B), the MatmulAttrs conventions (B [K,N] or, trans_b, [N,K]), all
// row-major and packed, with N or K narrow (the forward and the input gradients): op(B) is
// packed into pair words (VNNI: word (p, n) holds B(2p, n), B(2p+1, n)) in the scratch, A's
// rows are read as words in place, and register blocks of 6 rows x 16-column vectors sum the
// pairs. K must be even (a pair never straddles a row's end); other shapes, and the weight
// gradients (trans_a), run oneDNN.
// C is bf16 (rounded to nearest even once, after the sum and the C it adds to) or fp32.
// Only built with AVX512-BF16 (__AVX512BF16__); otherwise runs_skinny_bf16 is always false.
#pragma once

#include <cstdint>

#include "core/dtype.hpp"
#include "graph/op.hpp"

namespace memfit {

inline constexpr int64_t kSkinnyMax = 64;

// Whether the product runs here: bf16 A and B, no bias, bf16 or fp32 C, A not transposed, K
// even, N or K at most kSkinnyMax, and the CPU has AVX512-BF16.
bool runs_skinny_bf16(const MatmulAttrs& a, DType ta, DType tb, DType tc, bool has_bias);

// Bytes of scratch the product packs its narrow operand into.
uint64_t skinny_bf16_scratch_bytes(const MatmulAttrs& a);

// Runs on the calling thread's OpenMP team (parallel_for). A, B are bf16; C is bf16 when
// c_bf16, else fp32.
void skinny_bf16_matmul(const MatmulAttrs& a, const uint16_t* A, const uint16_t* B, void* C, bool c_bf16,
                        bool accumulate, void* scratch);

}  // namespace memfit
