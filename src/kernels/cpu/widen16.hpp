// 16 consecutive fp32, bf16 or fp16 values widened to one fp32 AVX-512 vector: the load of
// the kernels that read gradients of any float type (AdamW, 8-bit AdamW). Full-mask maskz
// forms: GCC 12's plain forms start from an "undefined" vector that its -Wuninitialized
// then reports at every inlined call.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include "core/half.hpp"

namespace memfit {

inline __m512 widen16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 widen16(const bf16_t* x) {
  constexpr __mmask16 all = 0xFFFF;
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, h), 16));
}
inline __m512 widen16(const fp16_t* x) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}

}  // namespace memfit
#endif
