// RMSNorm forward and backward. The subtle point is dw: it sums over all N rows, and summing
// per-thread partial results would make its bits depend on the thread count. As in
// layernorm_backward, the backward makes two passes: threads own fixed column blocks and sum
// every row in order (groups of kRowGroup rows in float, then in double), then threads own
// rows and write dx. The column pass goes first so that dx may overwrite dy.
//
// dx's row sum spells its order out (row_dot) rather than leaving it to `omp simd
// reduction`, whose order is whatever the vectoriser manages: parallel_for runs the row loop
// inline for one thread and as an outlined copy for a team, GCC 12 vectorised only the inline
// copy, and dx depended on the thread count.
#include "kernels/cpu/rmsnorm.hpp"

#include <algorithm>
#include <cmath>

#include "core/half.hpp"
#include "kernels/cpu/column_sums.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit {
namespace {

// sum over c of (dy * w) * (x * rs) in a fixed order: L lanes, one 64-byte vector of T (16 for
// fp32, 32 for 16-bit types); lane j fuses in columns j, j + L, ... of the whole blocks, the
// tail is fused into lane 0, then the lanes are added in order. That is the order GCC 12 gave
// the inline copy for fp32 and bf16, so their results keep their bits; written out, it no
// longer depends on whether or how a copy vectorises. (The outlined copy read w through the
// lambda's closure inside the loop, which needs a gather, and GCC 12's generic tuning, which
// -march=native picks on a CPU it does not know, has gathers off: that copy summed serially.)
template <class T>
inline float row_dot(const T* dy, const T* w, const T* x, float rs, int64_t C) {
  constexpr int64_t L = 64 / int64_t(sizeof(T));
  float lane[L] = {};
  int64_t c = 0;
  for (; c + L <= C; c += L)
#pragma omp simd
    for (int64_t j = 0; j < L; ++j)
      lane[j] = std::fma(widen(dy[c + j]) * widen(w[c + j]), widen(x[c + j]) * rs, lane[j]);
  // std::fma, not +=: left to contraction, GCC vectorised the tail's products and added them
  // unfused.
  for (; c < C; ++c) lane[0] = std::fma(widen(dy[c]) * widen(w[c]), widen(x[c]) * rs, lane[0]);
  float s = 0;
  for (int64_t j = 0; j < L; ++j) s += lane[j];
  return s;
}

}  // namespace

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, float* rstd, int64_t N, int64_t C, float eps) {
  if (C <= 0) return;
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const T* xr = x + n * C;
      T* yr = y + n * C;
      float sq = 0;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += widen(xr[c]) * widen(xr[c]);
      const float rs = 1.0f / std::sqrt(sq / float(C) + eps);
      // Two roundings for 16-bit T, as HF does (normalise in fp32, cast, multiply in T);
      // narrow<float> is the identity, so fp32 is x * rstd * w.
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = narrow<T>(widen(narrow<T>(widen(xr[c]) * rs)) * widen(w[c]));
      if (rstd) rstd[n] = rs;
    }
  });
}

template <class T, class G>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const float* rstd, T* dx, G* dw, int64_t N, int64_t C,
                      bool acc_dx, bool acc_dw) {
  if (C <= 0) return;
  if (dw)
    column_sums<1>(N, C, std::array<G*, 1>{dw}, {acc_dw},
                   [=](int64_t n, int64_t c0, int64_t width, float (*part)[kColumnBlock]) {
                     const T* dyr = dy + n * C + c0;
                     const T* xr = x + n * C + c0;
                     const float rs = rstd[n];
#pragma omp simd
                     for (int64_t c = 0; c < width; ++c)
                       part[0][c] += widen(dyr[c]) * widen(narrow<T>(widen(xr[c]) * rs));
                   });
  if (!dx) return;
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const T* dyr = dy + n * C;
      const T* xr = x + n * C;
      T* dxr = dx + n * C;
      const float rs = rstd[n];
      const float sgx = row_dot(dyr, w, xr, rs, C);
      // rs * mean(g * xhat) folded into one factor of x: dx = rs * g - x * k.
      const float k = rs * rs * (sgx / float(C));
      if (acc_dx) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c)
          dxr[c] = narrow<T>(widen(dxr[c]) + (rs * widen(dyr[c]) * widen(w[c]) - widen(xr[c]) * k));
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] = narrow<T>(rs * widen(dyr[c]) * widen(w[c]) - widen(xr[c]) * k);
      }
    }
  });
}

#define MEMFIT_INSTANTIATE(T, G)                                                                                   \
  template void rmsnorm_backward<T, G>(const T*, const T*, const T*, const float*, T*, G*, int64_t, int64_t, bool, \
                                       bool);
template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t, float);
template void rmsnorm_forward<bf16_t>(const bf16_t*, const bf16_t*, bf16_t*, float*, int64_t, int64_t, float);
template void rmsnorm_forward<fp16_t>(const fp16_t*, const fp16_t*, fp16_t*, float*, int64_t, int64_t, float);
MEMFIT_INSTANTIATE(float, float)
MEMFIT_INSTANTIATE(bf16_t, float)
MEMFIT_INSTANTIATE(bf16_t, bf16_t)
MEMFIT_INSTANTIATE(fp16_t, float)
MEMFIT_INSTANTIATE(fp16_t, fp16_t)
#undef MEMFIT_INSTANTIATE

}  // namespace memfit
