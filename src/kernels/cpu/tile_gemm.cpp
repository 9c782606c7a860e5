// Register-blocked tile products (see tile_gemm.hpp). Blocks of C are kRows x (16 * NV): each
// step over k loads NV vectors of one row of B, broadcasts kRows elements of A and issues
// kRows * NV fused multiply-adds, all accumulators staying in registers until the block is
// stored once (measured: ~175 GFLOP/s on one core for 64 x 64 x 64 tiles in L1).
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/cpu/tile_blocks.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace memfit {
namespace {

#if defined(__AVX512F__)

constexpr int kRows = 6;     // rows of C per block
constexpr int kVectors = 4;  // 16-float vectors of C per block row (64 columns)

// One block: MR rows, NV vectors, the last vector limited to the lanes in `tail`. The sums
// start from zero and C is added at the store: initialising the accumulators from C instead
// made GCC 12 keep a copy of all 24 of them on the stack and store it on every k (2.6x slower).
template <int MR, int NV>
void block(int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c, int64_t ldc,
           bool accumulate, __mmask16 tail) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, b + k * ldb + 16 * v) : _mm512_loadu_ps(b + k * ldb + 16 * v);
    const float* ak = a + k * a_cs;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 av = _mm512_set1_ps(ak[m * a_rs]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(av, bv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mask = v == NV - 1 ? tail : __mmask16(0xFFFF);
      __m512 r = acc[m][v];
      if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, c + m * ldc + 16 * v));
      _mm512_mask_storeu_ps(c + m * ldc + 16 * v, mask, r);
    }
}

using BlockFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, bool,
                         __mmask16);

BlockFn block_for(int rows, int nv) {
  return pick_block(rows, nv, []<int MR, int NV>() -> BlockFn { return &block<MR, NV>; });
}

#endif

}  // namespace

void tile_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate) {
#if defined(__AVX512F__)
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kVectors) {
    const int64_t width = N - n0 < 16 * kVectors ? N - n0 : 16 * kVectors;
    const int nv = int((width + 15) / 16);
    const int lanes = int(width - 16 * (nv - 1));
    const __mmask16 tail = __mmask16((1u << lanes) - 1u);
    const BlockFn full = block_for(kRows, nv);
    int64_t m0 = 0;
    for (; m0 + kRows <= M; m0 += kRows)
      full(K, a + m0 * a_rs, a_rs, a_cs, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate, tail);
    if (m0 < M) block_for(int(M - m0), nv)(K, a + m0 * a_rs, a_rs, a_cs, b + n0, ldb, c + m0 * ldc + n0, ldc, accumulate, tail);
  }
#else
  for (int64_t m = 0; m < M; ++m) {
    float* cr = c + m * ldc;
    for (int64_t n = 0; n < N; ++n) {
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += a[m * a_rs + k * a_cs] * b[k * ldb + n];
      cr[n] = accumulate ? cr[n] + sum : sum;
    }
  }
#endif
}

}  // namespace memfit
