// The skinny bf16 products (see skinny_bf16.hpp). Register blocks of fp32 sums, each step
// over a pair of k adding two products per lane with one vdpbf16ps; the narrow operand is
// the one packed, the wide one streams through once per block of rows.
#include "kernels/cpu/avx512_quiet.hpp"

#include "kernels/cpu/skinny_bf16.hpp"

#include "core/error.hpp"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/vec_math_avx512.hpp"
#endif

namespace memfit {

bool runs_skinny_bf16(const MatmulAttrs& a, DType ta, DType tb, DType tc, bool has_bias) {
#if defined(__AVX512BF16__)
  if (ta != DType::bf16 || tb != DType::bf16 || has_bias || (tc != DType::bf16 && tc != DType::f32)) return false;
  if (a.k % 2 != 0 || a.m <= 0 || a.n <= 0 || a.k <= 0) return false;
  // Weight gradients (trans_a: sums over the tokens) stay on oneDNN: they are bound by reading
  // the activations, and a kernel of this kind measured no faster there (slower by ~15% with a
  // 5632-wide operand, caches flushed; bench/lora_products_bench).
  return !a.trans_a && (a.n <= kSkinnyMax || a.k <= kSkinnyMax);
#else
  (void)a, (void)ta, (void)tb, (void)tc, (void)has_bias;
  return false;
#endif
}

uint64_t skinny_bf16_scratch_bytes(const MatmulAttrs& a) {
  // op(B) packed: K/2 pair words per column.
  return (uint64_t(a.k) * uint64_t(a.n) * 2 + 63) / 64 * 64;
}

#if defined(__AVX512BF16__)
namespace {

inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// r = alpha * sums (+ C) into 16 (masked) lanes of C at c, contiguous.
inline void store_lanes(void* c, bool c_bf16, __m512 r, bool accumulate, __mmask16 mask) {
  if (c_bf16) {
    uint16_t* p = static_cast<uint16_t*>(c);
    if (accumulate) r = _mm512_add_ps(r, widen_bf16(_mm256_maskz_loadu_epi16(mask, p)));
    _mm256_mask_storeu_epi16(p, mask, (__m256i)_mm512_cvtneps_pbh(r));
  } else {
    float* p = static_cast<float*>(c);
    if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, p));
    _mm512_mask_storeu_ps(p, mask, r);
  }
}

// ---- !trans_a: C[M,N] (+)= alpha A[M,K] op(B), op(B) packed as words w[p * N + n] ----

template <int MR, int NV>
void rows_block(int64_t kp, const uint32_t* a, int64_t a_rs, const uint32_t* w, int64_t ldw, char* c, int64_t ldc_bytes,
                bool c_bf16, float alpha, bool accumulate, __mmask16 tail) {
  __m512 acc[MR][NV];
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const uint32_t* bp = w + p * ldw + 16 * v;
      bv[v] = (__m512bh)(v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, bp) : _mm512_loadu_si512(bp));
    }
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[m * a_rs + p]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], av, bv[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  const int64_t elem = c_bf16 ? 2 : 4;
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      store_lanes(c + m * ldc_bytes + 16 * v * elem, c_bf16, _mm512_mul_ps(acc[m][v], scale), accumulate,
                  v == NV - 1 ? tail : __mmask16(0xFFFF));
}

using RowsFn = void (*)(int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t, char*, int64_t, bool, float, bool,
                        __mmask16);

// Six rows, whatever the vectors: A's rows are read in place, and rows 4 KiB apart (K = 2048
// bf16) share an L1 set of 8 ways: with 12 rows per block the kernel ran at ~70% of the
// speed it has with 6.
constexpr int kRows = 6;

template <int NV, int MR = 1>
RowsFn rows_fn(int rows) {
  if constexpr (MR == kRows)
    return &rows_block<MR, NV>;
  else
    return rows == MR ? &rows_block<MR, NV> : rows_fn<NV, MR + 1>(rows);
}

RowsFn rows_fn_for(int nv, int rows) {
  switch (nv) {
    case 1: return rows_fn<1>(rows);
    case 2: return rows_fn<2>(rows);
    case 3: return rows_fn<3>(rows);
    default: return rows_fn<4>(rows);
  }
}

void pack_op_b(const MatmulAttrs& a, const uint16_t* B, uint32_t* w) {
  const int64_t kp = a.k / 2, n = a.n;
  if (a.trans_b) {  // B [N,K]: its row j's pair p is already a word
    const uint32_t* bw = reinterpret_cast<const uint32_t*>(B);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < kp; ++p) w[p * n + j] = bw[j * kp + p];
  } else {  // B [K,N]: rows 2p and 2p + 1 interleaved
    for (int64_t p = 0; p < kp; ++p)
      for (int64_t j = 0; j < n; ++j)
        w[p * n + j] = uint32_t(B[2 * p * n + j]) | uint32_t(B[(2 * p + 1) * n + j]) << 16;
  }
}

void forward_shape(const MatmulAttrs& a, const uint16_t* A, const uint16_t* B, void* C, bool c_bf16, bool accumulate,
                   uint32_t* w) {
  pack_op_b(a, B, w);
  const int64_t kp = a.k / 2, n = a.n, elem = c_bf16 ? 2 : 4;
  const int nv_max = n <= 16 ? 1 : n <= 32 ? 2 : 4;
  const int64_t block_rows = kRows, chunk = 16 * nv_max;
  const int64_t row_blocks = (a.m + block_rows - 1) / block_rows, chunks = (n + chunk - 1) / chunk;
  const uint32_t* aw = reinterpret_cast<const uint32_t*>(A);
  parallel_for(row_blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t m0 = t / chunks * block_rows, n0 = t % chunks * chunk;
      const int rows = int(a.m - m0 < block_rows ? a.m - m0 : block_rows);
      const int64_t width = n - n0 < chunk ? n - n0 : chunk;
      const int nv = int((width + 15) / 16);
      rows_fn_for(nv, rows)(kp, aw + m0 * kp, kp, w + n0, n, static_cast<char*>(C) + (m0 * n + n0) * elem, n * elem,
                            c_bf16, a.alpha, accumulate, lanes_below(width - 16 * (nv - 1)));
    }
  });
}

}  // namespace

void skinny_bf16_matmul(const MatmulAttrs& a, const uint16_t* A, const uint16_t* B, void* C, bool c_bf16,
                        bool accumulate, void* scratch) {
  forward_shape(a, A, B, C, c_bf16, accumulate, static_cast<uint32_t*>(scratch));
}
#else
void skinny_bf16_matmul(const MatmulAttrs&, const uint16_t*, const uint16_t*, void*, bool, bool, void*) {
  throw Error("kernels", "skinny bf16 products need AVX512-BF16");
}
#endif

}  // namespace memfit
