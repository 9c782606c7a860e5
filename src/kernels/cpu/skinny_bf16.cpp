// The skinny bf16 products (see skinny_bf16.hpp). Register blocks of fp32 sums, each step
// over a pair of k adding two products per lane with one vdpbf16ps; the narrow operand is
// the one packed, the wide one streams through once per block of rows.
#include "kernels/cpu/avx512_quiet.hpp"

#include "kernels/cpu/skinny_bf16.hpp"

#include <omp.h>

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
  if (a.trans_a && a.trans_b) return false;
  return a.trans_a ? (a.m <= kSkinnyMax || a.n <= kSkinnyMax) : (a.n <= kSkinnyMax || a.k <= kSkinnyMax);
#else
  (void)a, (void)ta, (void)tb, (void)tc, (void)has_bias;
  return false;
#endif
}

namespace {
constexpr int64_t kSumChunk = 32;  // columns of the wide operand per task of a weight gradient
constexpr int64_t kSumPairs = 32;  // pairs of its rows per pass
uint64_t packed_narrow_bytes(const MatmulAttrs& a) {
  // The packed narrow operand: K/2 pair words per column of it.
  const int64_t narrow = a.trans_a ? (a.m <= kSkinnyMax ? a.m : a.n) : a.n;
  return (uint64_t(a.k) * uint64_t(narrow) * 2 + 63) / 64 * 64;
}
}  // namespace

uint64_t skinny_bf16_scratch_bytes(const MatmulAttrs& a) {
  if (!a.trans_a) return packed_narrow_bytes(a);
  // A weight gradient also keeps fp32 sums of C (w x kSumChunk per chunk of the wide side)
  // and each chunk's paired rows of one pass (kSumPairs words per column).
  const int64_t narrow = a.m <= kSkinnyMax ? a.m : a.n, wide = a.m <= kSkinnyMax ? a.n : a.m;
  const uint64_t chunks = uint64_t((wide + kSumChunk - 1) / kSumChunk);
  return packed_narrow_bytes(a) + chunks * kSumChunk * (uint64_t(narrow) * 4 + kSumPairs * 4);
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

// The same, lane l going to element l * stride (C stored transposed).
inline void store_strided(void* c, bool c_bf16, __m512 r, bool accumulate, __mmask16 mask, int64_t stride) {
  if (!c_bf16) {
    const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(int(stride)));
    float* p = static_cast<float*>(c);
    if (accumulate) r = _mm512_add_ps(r, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, index, p, 4));
    _mm512_mask_i32scatter_ps(p, mask, index, r, 4);
    return;
  }
  // bf16 (a bf16 gradient of a weight stored transposed): through the lanes one by one.
  alignas(32) uint16_t rounded[16];
  uint16_t* p = static_cast<uint16_t*>(c);
  if (accumulate) {
    alignas(32) uint16_t old[16] = {};
    for (int l = 0; l < 16; ++l)
      if (mask >> l & 1) old[l] = p[l * stride];
    r = _mm512_add_ps(r, widen_bf16(_mm256_load_si256(reinterpret_cast<const __m256i*>(old))));
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(rounded), (__m256i)_mm512_cvtneps_pbh(r));
  for (int l = 0; l < 16; ++l)
    if (mask >> l & 1) p[l * stride] = rounded[l];
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
constexpr int rows_for(int) { return 6; }

template <int NV, int MR = 1>
RowsFn rows_fn(int rows) {
  if constexpr (MR == rows_for(NV))
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
  const int64_t block_rows = rows_for(nv_max), chunk = 16 * nv_max;
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

// ---- trans_a: C[M,N] (+)= alpha sum_k A[k,:]^T B[k,:], the narrow operand P packed as words
// pw[p * w + i], the wide one Q [K, W] paired in registers. Block: MR of P's columns by NV
// vectors of Q's; out(i, j) is C[i, j], or C[j, i] when transposed. ----

inline __m512i pair_rows(const uint16_t* r0, const uint16_t* r1, __mmask16 mask, __m512i interleave) {
  const bool whole = mask == __mmask16(0xFFFF);
  const __m256i lo = whole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0)) : _mm256_maskz_loadu_epi16(mask, r0);
  const __m256i hi = whole ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1)) : _mm256_maskz_loadu_epi16(mask, r1);
  return _mm512_permutexvar_epi16(interleave, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

// Adds pairs [0, kp) into the sums of an MR x NV block kept in `sums` (MR rows of
// kSumChunk floats, the block's row m at sums + m * kSumChunk).
template <int MR, int NV>
void sums_block(int64_t kp, const uint32_t* pw, int64_t w, const uint32_t* strip, float* sums) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_loadu_ps(sums + m * kSumChunk + 16 * v);
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh qv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) qv[v] = (__m512bh)_mm512_loadu_si512(strip + p * kSumChunk + 16 * v);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh pv = (__m512bh)_mm512_set1_epi32(int(pw[p * w + m]));
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], pv, qv[v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(sums + m * kSumChunk + 16 * v, acc[m][v]);
}

using SumsFn = void (*)(int64_t, const uint32_t*, int64_t, const uint32_t*, float*);
// Blocks of 8 rows by two vectors: 32 columns of the wide operand are one 64-byte line of
// each of its rows. (16 rows by one vector, a rank-16 operand in one pass, ran at half the
// speed: each row's line is then read in halves.)
constexpr int kSumRows = 8;

template <int NV, int MR = 1>
SumsFn sums_fn(int rows) {
  if constexpr (MR == kSumRows)
    return &sums_block<MR, NV>;
  else
    return rows == MR ? &sums_block<MR, NV> : sums_fn<NV, MR + 1>(rows);
}

__m512i pair_interleave() {
  alignas(64) int16_t idx[32];
  for (int l = 0; l < 16; ++l) idx[2 * l] = int16_t(l), idx[2 * l + 1] = int16_t(16 + l);
  return _mm512_load_si512(idx);
}

// Each thread owns a range of kSumChunk-column chunks of the wide operand Q and passes over
// Q's rows kSumPairs pairs at a time: it pairs its columns of those rows into `strip` (row by
// row, so Q is read in order: taking one chunk's 64 bytes from each of K rows 2 x W bytes
// apart ran at half the speed once Q was out of cache) and adds them into fp32 sums kept in
// `sums` (w x kSumChunk floats per chunk); C is written once at the end.
void weight_gradient_shape(const MatmulAttrs& a, const uint16_t* A, const uint16_t* B, void* C, bool c_bf16,
                           bool accumulate, uint32_t* pw) {
  // P narrow (width w), Q wide (width W); transposed when P is B (C's columns are P's).
  const bool transposed = !(a.m <= kSkinnyMax);
  const uint16_t* P = transposed ? B : A;
  const uint16_t* Q = transposed ? A : B;
  const int64_t w = transposed ? a.n : a.m, W = transposed ? a.m : a.n, kp = a.k / 2;
  for (int64_t p = 0; p < kp; ++p)
    for (int64_t i = 0; i < w; ++i) pw[p * w + i] = uint32_t(P[2 * p * w + i]) | uint32_t(P[(2 * p + 1) * w + i]) << 16;
  const int64_t elem = c_bf16 ? 2 : 4;
  // C element (i, j): C[i * N + j], or C[j * N + i] transposed (C is [M, N] either way).
  const int64_t ci = transposed ? 1 : a.n, cj = transposed ? a.n : 1;
  const int64_t chunks = (W + kSumChunk - 1) / kSumChunk;
  float* sums = reinterpret_cast<float*>(pw + packed_narrow_bytes(a) / 4);
  uint32_t* strips = reinterpret_cast<uint32_t*>(sums + chunks * w * kSumChunk);
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    const __m512i interleave = pair_interleave();
    for (int64_t i = begin * w * kSumChunk; i < end * w * kSumChunk; ++i) sums[i] = 0.0f;
    for (int64_t p0 = 0; p0 < kp; p0 += kSumPairs) {
      const int64_t pairs = kp - p0 < kSumPairs ? kp - p0 : kSumPairs;
      for (int64_t p = 0; p < pairs; ++p) {
        const uint16_t* r0 = Q + 2 * (p0 + p) * W;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t j0 = t * kSumChunk, width = W - j0 < kSumChunk ? W - j0 : kSumChunk;
          for (int v = 0; v < 2; ++v) {
            const int64_t lanes = width - 16 * v;
            const __m512i words = lanes <= 0 ? _mm512_setzero_si512()
                                             : pair_rows(r0 + j0 + 16 * v, r0 + W + j0 + 16 * v,
                                                         lanes >= 16 ? __mmask16(0xFFFF) : lanes_below(lanes), interleave);
            _mm512_storeu_si512(strips + (t * kSumPairs + p) * kSumChunk + 16 * v, words);
          }
        }
      }
      for (int64_t t = begin; t < end; ++t)
        for (int64_t i0 = 0; i0 < w; i0 += kSumRows) {
          const int rows = int(w - i0 < kSumRows ? w - i0 : kSumRows);
          const bool one = W - t * kSumChunk <= 16;  // the last chunk may hold one vector
          (one ? sums_fn<1>(rows) : sums_fn<2>(rows))(pairs, pw + p0 * w + i0, w, strips + t * kSumPairs * kSumChunk,
                                                      sums + (t * w + i0) * kSumChunk);
        }
    }
    const __m512 scale = _mm512_set1_ps(a.alpha);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t j0 = t * kSumChunk, width = W - j0 < kSumChunk ? W - j0 : kSumChunk;
      for (int64_t i = 0; i < w; ++i)
        for (int v = 0; v * 16 < width; ++v) {
          const int64_t lanes = width - 16 * v;
          const __mmask16 mask = lanes >= 16 ? __mmask16(0xFFFF) : lanes_below(lanes);
          char* at = static_cast<char*>(C) + (i * ci + (j0 + 16 * v) * cj) * elem;
          const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(sums + (t * w + i) * kSumChunk + 16 * v), scale);
          if (transposed)
            store_strided(at, c_bf16, r, accumulate, mask, cj);
          else
            store_lanes(at, c_bf16, r, accumulate, mask);
        }
    }
  });
}

}  // namespace

void skinny_bf16_matmul(const MatmulAttrs& a, const uint16_t* A, const uint16_t* B, void* C, bool c_bf16,
                        bool accumulate, void* scratch) {
  uint32_t* packed = static_cast<uint32_t*>(scratch);
  if (a.trans_a)
    weight_gradient_shape(a, A, B, C, c_bf16, accumulate, packed);
  else
    forward_shape(a, A, B, C, c_bf16, accumulate, packed);
}
#else
void skinny_bf16_matmul(const MatmulAttrs&, const uint16_t*, const uint16_t*, void*, bool, bool, void*) {
  throw Error("kernels", "skinny bf16 products need AVX512-BF16");
}
#endif

}  // namespace memfit
