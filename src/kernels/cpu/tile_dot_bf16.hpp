// tile_dot_bf16: small dense products on bf16 tiles with fp32 sums (AVX512-BF16 vdpbf16ps),
// for the bf16 flash attention kernel: C[M,N] (+)= alpha * A[M,K] B[K,N].
//
// Operands are 32-bit words, each holding two bf16 values adjacent in k (the low half first):
// A's word (m, p) at a[m*a_rs + p*a_cs] holds (A(m, 2p), A(m, 2p+1)), B's word (p, n) at
// b[p*ldb + n] holds (B(2p, n), B(2p+1, n)) ("VNNI" layout); KP counts the pairs, and an odd K
// pads its last pair with a zero. A is broadcast one word at a time, so its two strides make a
// transposed tile cost no copy. C is fp32, row-major.
//
// Causal tiles (the diagonal tile of causal attention, M and N at most 64) skip work whose
// result nobody reads or whose terms are exact zeros, per register block of rows
// [m0, m0 + rows):
//   cols_from_row: only columns n >= m0 are wanted (16-column vectors wholly left of it are
//                  neither computed nor stored: whatever C held there stays);
//   cols_to_row:   only columns n < m0 + rows are wanted (likewise right of it);
//   k_from_row:    A(m, k) == 0 for k < m (pairs below m0 are skipped: the same sums);
//   k_to_row:      A(m, k) == 0 for k > m (pairs from m0 + rows on are skipped).
// Skipping exact zero terms leaves every sum's bits as they were (zero products add nothing).
//
// Only built with AVX512-BF16 (__AVX512BF16__); the flash kernel otherwise widens bf16 tiles to
// fp32 and runs tile_gemm.
#pragma once

#include <cstdint>

namespace memfit {

enum class TileCausal { none, cols_from_row, cols_to_row, k_from_row, k_to_row };

#if defined(__AVX512BF16__)
void tile_dot_bf16(int64_t M, int64_t N, int64_t KP, const uint32_t* a, int64_t a_rs, int64_t a_cs, const uint32_t* b,
                   int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate,
                   TileCausal causal = TileCausal::none);
#endif

}  // namespace memfit
