// RoPE forward and backward. The subtle point is matching HF's angles bit for bit: HF forms
// inv_freq = 1 / theta^(2i/HS) (then scales it: rope_inv_freq) and t * inv_freq in float32, and at long positions those
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

// transformers' llama3 rule, operation by operation as torch evaluates it on float32 tensors:
// a Python number divided by a tensor is reciprocal-then-multiply, every scalar is rounded to
// float where it meets the tensor, and the thresholds are divided in double first. Every product
// and sum rounds on its own, as torch's separate tensor ops do: no fused multiply-add.
[[gnu::optimize("fp-contract=off")]] float llama3_inv_freq(float inv, const RopeScaling& s) {
  const auto f = [](double v) { return float(v); };
  const float wavelen = (1.0f / inv) * f(2.0 * 3.14159265358979323846);
  const float low_wavelen = f(s.original_max_positions / s.low_freq_factor);
  const float high_wavelen = f(s.original_max_positions / s.high_freq_factor);
  const float scaled = wavelen > low_wavelen ? inv / f(s.factor) : inv;
  if (wavelen < high_wavelen || wavelen > low_wavelen) return scaled;
  const float smooth =
      ((1.0f / wavelen) * f(s.original_max_positions) - f(s.low_freq_factor)) / f(s.high_freq_factor - s.low_freq_factor);
  return (1.0f - smooth) * scaled / f(s.factor) + smooth * scaled;
}

// sign = +1 rotates by a (forward), -1 by -a (backward: the rotation's transpose).
template <class T>
void rope_apply(const T* x, T* y, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t hs, float theta,
                const RopeScaling& scaling, float sign) {
  MEMFIT_CHECK(hs > 0 && hs % 2 == 0 && hs <= kMaxHeadDim, "kernels", "rope: head_dim {} must be even and in [2, {}]",
               hs, kMaxHeadDim);
  MEMFIT_CHECK(B >= 0 && T_ >= 0 && heads >= 0 && kv_heads >= 0, "kernels", "rope: negative shape");
  const int64_t half = hs / 2, rotated = (heads + kv_heads) * hs, row = rotated + kv_heads * hs;
  if (B == 0 || T_ == 0 || row == 0) return;
  float inv_freq[kMaxHeadDim / 2];
  rope_inv_freq(theta, hs, scaling, inv_freq);
  parallel_for(T_, kParallelGrain / (B * row), [=, &inv_freq](int64_t first, int64_t last) {
    float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
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

void rope_inv_freq(float theta, int64_t head_dim, const RopeScaling& scaling, float* inv_freq) {
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step in float32.
    const float inv = 1.0f / std::pow(theta, float(2 * i) / float(head_dim));
    switch (scaling.kind) {
      case RopeScaling::Kind::none: inv_freq[i] = inv; break;
      case RopeScaling::Kind::linear: inv_freq[i] = inv / float(scaling.factor); break;
      case RopeScaling::Kind::llama3: inv_freq[i] = llama3_inv_freq(inv, scaling); break;
    }
  }
}

template <class T>
void rope_forward(const T* x, T* y, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  float theta, const RopeScaling& scaling) {
  rope_apply(x, y, B, T_, heads, kv_heads, head_dim, theta, scaling, 1.0f);
}

template <class T>
void rope_backward(const T* dy, T* dx, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   float theta, const RopeScaling& scaling) {
  rope_apply(dy, dx, B, T_, heads, kv_heads, head_dim, theta, scaling, -1.0f);
}

#define MEMFIT_INSTANTIATE(T)                                                                                  \
  template void rope_forward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, float,             \
                                const RopeScaling&);                                                          \
  template void rope_backward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, float,            \
                                 const RopeScaling&);
MEMFIT_INSTANTIATE(float)
MEMFIT_INSTANTIATE(bf16_t)
MEMFIT_INSTANTIATE(fp16_t)
#undef MEMFIT_INSTANTIATE

}  // namespace memfit
