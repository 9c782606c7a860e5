// vec_math.hpp's softmax exponential on 16 AVX-512 lanes, and the lane mask of a row's first n
// lanes, for the hand-vectorised attention kernels (attention_tiles.cpp, the bf16 flash tasks).
// Include it after avx512_quiet.hpp, in a file built with AVX-512.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>
#include <initializer_list>

namespace memfit {

// softmax_exp (exp_approx flushed to exactly 0 below 2^-64) on 16 lanes: the same operations
// in the same order, so the same bits. Lanes outside `keep` are 0. GCC's `omp simd` form of
// the attention row loops spent most of its time in scalar remainders and in reducing its
// per-lane arrays, 1.1 ms per 24 heads of T = 256.
inline __m512 softmax_exp16(__m512 x, __mmask16 keep = 0xFFFF) {
  const __m512 clamped = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  const __m512 round = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_add_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)), round);
  const __m512 n = _mm512_sub_ps(t, round);
  const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(round));
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.4286068203094172e-06f),
                                   _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), clamped));
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
  const __mmask16 kept = _mm512_mask_cmp_ps_mask(keep, x, _mm512_set1_ps(-44.3614195558365f), _CMP_GE_OQ);
  return _mm512_maskz_mul_ps(kept, p, scale);
}

// The first n of 16 lanes (all for n >= 16, none for n <= 0).
inline __mmask16 lanes_below(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}

}  // namespace memfit
#endif
