// RoPE forward and backward. The subtle point is matching HF's angles bit for bit: HF forms
// inv_freq = 1 / theta^(2i/HS) and t * inv_freq in float32, and at long positions those
// roundings move the angle away from the exact one by up to half an ulp of t * inv_freq
// (1.2e-4 rad for angles near 2048), far more than the rest of the arithmetic adds; so the
// angles are computed in float the same way, not in double. cos and sin are computed once per (t, i) into a stack table and
// applied to every batch row and head at that position.
#include "kernels/cpu/rope.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {
namespace {

constexpr int64_t kMaxHeadDim = 512;

// sign = +1 rotates by a (forward), -1 by -a (backward: the rotation's transpose).
template <class T>
void rope_apply(const T* x, T* y, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t hs, float theta,
                float sign) {
  MEMFIT_CHECK(hs > 0 && hs % 2 == 0 && hs <= kMaxHeadDim, "kernels", "rope: head_dim {} must be even and in [2, {}]",
               hs, kMaxHeadDim);
  MEMFIT_CHECK(B >= 0 && T_ >= 0 && heads >= 0 && kv_heads >= 0, "kernels", "rope: negative shape");
  const int64_t half = hs / 2, rotated = (heads + kv_heads) * hs, row = rotated + kv_heads * hs;
  if (B == 0 || T_ == 0 || row == 0) return;
  parallel_for(T_, kParallelGrain / (B * row), [=](int64_t first, int64_t last) {
    float inv_freq[kMaxHeadDim / 2], cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
    // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step in float32.
    for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0f / std::pow(theta, float(2 * i) / float(hs));
    for (int64_t t = first; t < last; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float a = float(t) * inv_freq[i];
        cs[i] = std::cos(a);
        sn[i] = sign * std::sin(a);
      }
      for (int64_t b = 0; b < B; ++b) {
        const T* xr = x + (b * T_ + t) * row;
        T* yr = y + (b * T_ + t) * row;
        for (int64_t h0 = 0; h0 < rotated; h0 += hs) {
          const T* xh = xr + h0;
          T* yh = yr + h0;
#pragma omp simd
          for (int64_t i = 0; i < half; ++i) {
            const float x0 = widen(xh[i]), x1 = widen(xh[i + half]);
            yh[i] = narrow<T>(x0 * cs[i] - x1 * sn[i]);
            yh[i + half] = narrow<T>(x1 * cs[i] + x0 * sn[i]);
          }
        }
        if (yr != xr)
          for (int64_t c = rotated; c < row; ++c) yr[c] = xr[c];
      }
    }
  });
}

}  // namespace

template <class T>
void rope_forward(const T* x, T* y, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  float theta) {
  rope_apply(x, y, B, T_, heads, kv_heads, head_dim, theta, 1.0f);
}

template <class T>
void rope_backward(const T* dy, T* dx, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   float theta) {
  rope_apply(dy, dx, B, T_, heads, kv_heads, head_dim, theta, -1.0f);
}

#define MEMFIT_INSTANTIATE(T)                                                                          \
  template void rope_forward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, float);    \
  template void rope_backward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, float);
MEMFIT_INSTANTIATE(float)
MEMFIT_INSTANTIATE(bf16_t)
MEMFIT_INSTANTIATE(fp16_t)
#undef MEMFIT_INSTANTIATE

}  // namespace memfit
