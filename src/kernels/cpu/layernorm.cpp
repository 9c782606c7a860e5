// LayerNorm forward and backward. The subtle point is the parameter gradients dw and db: they
// sum over all N rows, and summing per-thread partial results would make the bits depend on
// the thread count (and need scratch). So the backward makes two passes: first threads own
// fixed column blocks and sum every row in order (groups of rows in float, then in double), then threads own rows and
// write dx. The column pass goes first so that dx may overwrite dy.
#include "kernels/cpu/layernorm.hpp"

#include <algorithm>
#include <cmath>

#include "core/half.hpp"
#include "kernels/cpu/column_sums.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit {

template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t N, int64_t C,
                       float eps) {
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const T* xr = x + n * C;
      T* yr = y + n * C;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < C; ++c) sum += widen(xr[c]);
      const float mu = sum / float(C);
      // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
      // badly when |mean| >> std.
      float sq = 0;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += (widen(xr[c]) - mu) * (widen(xr[c]) - mu);
      const float rs = 1.0f / std::sqrt(sq / float(C) + eps);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = narrow<T>((widen(xr[c]) - mu) * rs * widen(w[c]) + widen(b[c]));
      if (mean) mean[n] = mu;
      if (rstd) rstd[n] = rs;
    }
  });
}

template <class T, class G>
void layernorm_backward(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, G* dw, G* db,
                        int64_t N, int64_t C, bool acc_dx, bool acc_dw, bool acc_db) {
  if (dw || db)
    column_sums<2>(N, C, std::array<G*, 2>{dw, db}, {acc_dw, acc_db},
                   [=](int64_t n, int64_t c0, int64_t width, float (*part)[kColumnBlock]) {
                     const T* dyr = dy + n * C + c0;
                     const T* xr = x + n * C + c0;
                     const float mu = mean[n], rs = rstd[n];
#pragma omp simd
                     for (int64_t c = 0; c < width; ++c) {
                       part[0][c] += widen(dyr[c]) * ((widen(xr[c]) - mu) * rs);
                       part[1][c] += widen(dyr[c]);
                     }
                   });
  if (!dx) return;
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const T* dyr = dy + n * C;
      const T* xr = x + n * C;
      T* dxr = dx + n * C;
      const float mu = mean[n], rs = rstd[n];
      float sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < C; ++c) {
        const float g = widen(dyr[c]) * widen(w[c]);
        sg += g;
        sgx += g * ((widen(xr[c]) - mu) * rs);
      }
      const float mg = sg / float(C), mgx = sgx / float(C);
      if (acc_dx) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c)
          dxr[c] = narrow<T>(widen(dxr[c]) +
                             rs * (widen(dyr[c]) * widen(w[c]) - mg - (widen(xr[c]) - mu) * rs * mgx));
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c)
          dxr[c] = narrow<T>(rs * (widen(dyr[c]) * widen(w[c]) - mg - (widen(xr[c]) - mu) * rs * mgx));
      }
    }
  });
}

#define MEMFIT_INSTANTIATE(T, G)                                                                                  \
  template void layernorm_backward<T, G>(const T*, const T*, const T*, const float*, const float*, T*, G*, G*,     \
                                         int64_t, int64_t, bool, bool, bool);
template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*, float*, int64_t,
                                       int64_t, float);
template void layernorm_forward<bf16_t>(const bf16_t*, const bf16_t*, const bf16_t*, bf16_t*, float*, float*, int64_t,
                                        int64_t, float);
template void layernorm_forward<fp16_t>(const fp16_t*, const fp16_t*, const fp16_t*, fp16_t*, float*, float*, int64_t,
                                        int64_t, float);
MEMFIT_INSTANTIATE(float, float)
MEMFIT_INSTANTIATE(bf16_t, float)
MEMFIT_INSTANTIATE(bf16_t, bf16_t)
MEMFIT_INSTANTIATE(fp16_t, float)
MEMFIT_INSTANTIATE(fp16_t, fp16_t)
#undef MEMFIT_INSTANTIATE

}  // namespace memfit
