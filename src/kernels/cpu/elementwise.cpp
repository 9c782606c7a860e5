// Elementwise add / accumulate / fill (see elementwise.hpp). These are bandwidth bound; each
// thread takes one contiguous block, and the acc branch sits outside the loops so each loop
// body is a plain vector load/add/store.
#include "kernels/cpu/elementwise.hpp"

#include "kernels/cpu/parallel.hpp"

namespace memfit {

void add_forward(const float* a, const float* b, float* y, int64_t n, bool acc) {
  parallel_for(n, kParallelGrain, [=](int64_t lo, int64_t hi) {
    if (acc) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] += a[i] + b[i];
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = a[i] + b[i];
    }
  });
}

void accumulate_forward(const float* x, float* y, int64_t n, bool acc) {
  if (x == y && !acc) return;
  parallel_for(n, kParallelGrain, [=](int64_t lo, int64_t hi) {
    if (acc) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] += x[i];
    } else {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = x[i];
    }
  });
}

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
