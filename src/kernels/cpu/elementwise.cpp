// Elementwise add / add_bias / accumulate / fill (see elementwise.hpp). These are bandwidth bound; each
// thread takes one contiguous block, and the acc branch sits outside the loops so each loop
// body is a plain vector load/add/store.
#include "kernels/cpu/elementwise.hpp"

#include <algorithm>

#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {

template <class T>
void add_forward(const T* a, const T* b, T* y, int64_t n, bool acc) {
  parallel_for(n, kParallelGrain, [=](int64_t lo, int64_t hi) {
    if (acc) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = narrow<T>(widen(y[i]) + (widen(a[i]) + widen(b[i])));
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = narrow<T>(widen(a[i]) + widen(b[i]));
    }
  });
}

template <class T>
void add_bias_forward(const T* x, const T* bias, T* y, int64_t rows, int64_t cols, bool acc) {
  parallel_for(rows, kParallelGrain / std::max<int64_t>(cols, 1), [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      if (acc) {
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) yr[c] = narrow<T>(widen(yr[c]) + (widen(xr[c]) + widen(bias[c])));
      } else {
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) yr[c] = narrow<T>(widen(xr[c]) + widen(bias[c]));
      }
    }
  });
}

template <class X, class Y>
void accumulate_forward(const X* x, Y* y, int64_t n, bool acc) {
  if (static_cast<const void*>(x) == static_cast<const void*>(y) && !acc) return;
  parallel_for(n, kParallelGrain, [=](int64_t lo, int64_t hi) {
    if (acc) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = narrow<Y>(widen(y[i]) + widen(x[i]));
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = narrow<Y>(widen(x[i]));
    }
  });
}

#define MEMFIT_INSTANTIATE(T)                                                      \
  template void add_forward<T>(const T*, const T*, T*, int64_t, bool);            \
  template void add_bias_forward<T>(const T*, const T*, T*, int64_t, int64_t, bool); \
  template void accumulate_forward<T, float>(const T*, float*, int64_t, bool);    \
  template void accumulate_forward<T, bf16_t>(const T*, bf16_t*, int64_t, bool);  \
  template void accumulate_forward<T, fp16_t>(const T*, fp16_t*, int64_t, bool);
MEMFIT_INSTANTIATE(float)
MEMFIT_INSTANTIATE(bf16_t)
MEMFIT_INSTANTIATE(fp16_t)
#undef MEMFIT_INSTANTIATE

void fill_forward(float* x, int64_t n, float value, bool acc) {
  parallel_for(n, kParallelGrain, [=](int64_t lo, int64_t hi) {
    if (acc) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) x[i] += value;
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) x[i] = value;
    }
  });
}

}  // namespace memfit
