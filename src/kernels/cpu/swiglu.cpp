// SwiGLU forward and backward. The subtle point is the sigmoid's complement: silu'(g) =
// s (1 + g (1 - s)) with s = 1 / (1 + e), e = exp(-g), and 1 - s is taken as e * s rather
// than subtracted, which would cancel for large g. exp_approx (vec_math.hpp) keeps the loops
// vectorized and saturates instead of overflowing, so large |g| gives silu = g or ~0, never
// NaN. Outputs may alias inputs element for element, so the pointers are not __restrict.
#include "kernels/cpu/swiglu.hpp"

#include <algorithm>

#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace memfit {

template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n) {
  parallel_for(n, kParallelGrain / 8, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float g = widen(gate[i]);
      y[i] = narrow<T>(g / (1.0f + exp_approx(-g)) * widen(up[i]));
    }
  });
}

namespace {

// out = v (or out += v) over m elements; the flag is tested outside the vector loop.
template <class T>
inline void store_tile(T* out, const float* v, int64_t m, bool acc) {
  if (acc) {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) out[i] = narrow<T>(widen(out[i]) + v[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) out[i] = narrow<T>(v[i]);
  }
}

}  // namespace

// In tiles of 128 on the stack: both gradients of a tile are computed (every read of dy done)
// before either output is written, which is what makes dgate == dy safe, and the stores
// then run as plain loops without per-element tests of the null pointers and flags.
template <class T>
void swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n, bool acc_dgate,
                     bool acc_dup) {
  if (!dgate && !dup) return;
  parallel_for(n, kParallelGrain / 8, [=](int64_t lo, int64_t hi) {
    constexpr int64_t kTile = 128;
    alignas(64) float vg[kTile];
    alignas(64) float vu[kTile];
    for (int64_t t0 = lo; t0 < hi; t0 += kTile) {
      const int64_t m = std::min(kTile, hi - t0);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) {
        const float g = widen(gate[t0 + i]), d = widen(dy[t0 + i]);
        const float e = exp_approx(-g);
        const float s = 1.0f / (1.0f + e);
        const float c = e * s;  // 1 - s, formed before g multiplies it: g * e overflows for g < -88
        vg[i] = d * widen(up[t0 + i]) * s * (1.0f + g * c);
        vu[i] = d * g * s;
      }
      if (dgate) store_tile(dgate + t0, vg, m, acc_dgate);
      if (dup) store_tile(dup + t0, vu, m, acc_dup);
    }
  });
}

#define MEMFIT_INSTANTIATE(T)                                                  \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);            \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, bool, bool);
MEMFIT_INSTANTIATE(float)
MEMFIT_INSTANTIATE(bf16_t)
MEMFIT_INSTANTIATE(fp16_t)
#undef MEMFIT_INSTANTIATE

}  // namespace memfit
