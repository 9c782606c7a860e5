// Register-blocked bf16 pair products (see tile_dot_bf16.hpp). Blocks of C are kRows x
// (16 * NV) as in tile_gemm: each step over a pair of k loads NV vectors of B's word row,
// broadcasts kRows words of A and issues kRows * NV vdpbf16ps, each of which adds two products
// per fp32 lane (twice tile_gemm's multiply-adds per instruction).
#include "kernels/cpu/avx512_quiet.hpp"

#include "kernels/cpu/tile_dot_bf16.hpp"
#include "kernels/cpu/tile_blocks.hpp"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "kernels/cpu/vec_math_avx512.hpp"

namespace memfit {
namespace {

constexpr int kRows = 6;     // rows of C per block
constexpr int kVectors = 4;  // 16-float vectors of C per block row (64 columns)

// One block: MR rows, NV vectors, the last vector limited to the lanes in `tail`, pairs
// [p0, p1). The sums start from zero and C is added at the store (see tile_gemm.cpp).
template <int MR, int NV>
void block(int64_t p0, int64_t p1, const uint32_t* a, int64_t a_rs, int64_t a_cs, const uint32_t* b, int64_t ldb,
           float* c, int64_t ldc, float alpha, bool accumulate, __mmask16 tail) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const uint32_t* bp = b + p * ldb + 16 * v;
      bv[v] = (__m512bh)(v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, bp) : _mm512_loadu_si512(bp));
    }
    const uint32_t* ap = a + p * a_cs;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[m * a_rs]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], av, bv[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 mask = v == NV - 1 ? tail : __mmask16(0xFFFF);
      __m512 r = _mm512_mul_ps(acc[m][v], scale);
      if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, c + m * ldc + 16 * v));
      _mm512_mask_storeu_ps(c + m * ldc + 16 * v, mask, r);
    }
}

using BlockFn = void (*)(int64_t, int64_t, const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, float*, int64_t,
                         float, bool, __mmask16);

BlockFn block_for(int rows, int nv) {
  return pick_block(rows, nv, []<int MR, int NV>() -> BlockFn { return &block<MR, NV>; });
}

}  // namespace

void tile_dot_bf16(int64_t M, int64_t N, int64_t KP, const uint32_t* a, int64_t a_rs, int64_t a_cs, const uint32_t* b,
                   int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate, TileCausal causal) {
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kVectors) {
    const int64_t width = N - n0 < 16 * kVectors ? N - n0 : 16 * kVectors;
    for (int64_t m0 = 0; m0 < M; m0 += kRows) {
      const int rows = int(M - m0 < kRows ? M - m0 : kRows);
      int64_t first = 0, last = width, p0 = 0, p1 = KP;  // columns [first, last) of this chunk, pairs [p0, p1)
      switch (causal) {
        case TileCausal::none: break;
        case TileCausal::cols_from_row: first = m0 / 16 * 16 - n0 > 0 ? m0 / 16 * 16 - n0 : 0; break;
        case TileCausal::cols_to_row: last = m0 + rows - n0 < width ? m0 + rows - n0 : width; break;
        case TileCausal::k_from_row: p0 = m0 / 2 < KP ? m0 / 2 : KP; break;
        case TileCausal::k_to_row: p1 = (m0 + rows + 1) / 2 < KP ? (m0 + rows + 1) / 2 : KP; break;
      }
      if (first >= last) continue;
      const int nv = int((last - first + 15) / 16);
      const __mmask16 tail = lanes_below(last - first - 16 * (nv - 1));
      block_for(rows, nv)(p0, p1, a + m0 * a_rs, a_rs, a_cs, b + n0 + first, ldb, c + m0 * ldc + n0 + first, ldc,
                          alpha, accumulate, tail);
    }
  }
}

}  // namespace memfit
#endif
