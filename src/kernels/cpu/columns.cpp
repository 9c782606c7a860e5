#include "kernels/cpu/columns.hpp"

#include <algorithm>
#include <cstring>

#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"
#include "core/dropout_mask.hpp"

namespace memfit {

// Rows split over threads through parallel_for: a raw `omp parallel` region on one thread
// mallocs libgomp's team on every call, inside the step.
inline int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)); }

template <class T>
void add_columns_forward(const T* a, const T* d, T* y, int64_t rows, int64_t cols, int64_t begin, int64_t width,
                         bool acc) {
  parallel_for(rows, row_grain(cols), [=](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* ar = a + r * cols;
      T* yr = y + r * cols;
      const T* dr = d + r * width - begin;  // dr[c] for c in the column block
      auto put = [&](int64_t c, float v) { yr[c] = narrow<T>(acc ? widen(yr[c]) + v : v); };
      for (int64_t c = 0; c < begin; ++c) put(c, widen(ar[c]));
      for (int64_t c = begin; c < begin + width; ++c) put(c, widen(ar[c]) + widen(dr[c]));
      for (int64_t c = begin + width; c < cols; ++c) put(c, widen(ar[c]));
    }
  });
}

template <class T>
void slice_columns_forward(const T* x, T* y, int64_t rows, int64_t cols, int64_t begin, int64_t width, bool acc) {
  parallel_for(rows, row_grain(width), [=](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols + begin;
      T* yr = y + r * width;
      if (!acc) {
        std::memcpy(static_cast<void*>(yr), xr, sizeof(T) * size_t(width));
        continue;
      }
      for (int64_t c = 0; c < width; ++c) yr[c] = narrow<T>(widen(yr[c]) + widen(xr[c]));
    }
  });
}

template <class T>
void dropout_apply(const T* x, T* y, int64_t n, float p, uint64_t key, const DropoutLayout& layout, bool acc) {
  const uint32_t threshold = dropout_threshold(p);
  const float scale = float(1.0 / (1.0 - double(p)));
  parallel_for(n, kParallelGrain, [=](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = dropout_keeps(key, layout.index(i), threshold) ? widen(x[i]) * scale : 0.0f;
      y[i] = narrow<T>(acc ? widen(y[i]) + v : v);
    }
  });
}

#define MEMFIT_COLUMNS(T)                                                                                   \
  template void add_columns_forward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, bool); \
  template void slice_columns_forward<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, bool);         \
  template void dropout_apply<T>(const T*, T*, int64_t, float, uint64_t, const DropoutLayout&, bool);
MEMFIT_COLUMNS(float)
MEMFIT_COLUMNS(bf16_t)
MEMFIT_COLUMNS(fp16_t)
#undef MEMFIT_COLUMNS

}  // namespace memfit
