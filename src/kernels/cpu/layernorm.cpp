// LayerNorm forward and backward. The subtle point is the parameter gradients dw and db: they
// sum over all N rows, and summing per-thread partial results would make the bits depend on
// the thread count (and need scratch). So the backward makes two passes: first threads own
// fixed column blocks and sum every row in order (in double), then threads own rows and
// write dx. The column pass goes first so that dx may overwrite dy.
#include "kernels/cpu/layernorm.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit {

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps) {
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const float* xr = x + n * C;
      float* yr = y + n * C;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < C; ++c) sum += xr[c];
      const float mu = sum / float(C);
      // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
      // badly when |mean| >> std.
      float sq = 0;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
      const float rs = 1.0f / std::sqrt(sq / float(C) + eps);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * w[c] + b[c];
      if (mean) mean[n] = mu;
      if (rstd) rstd[n] = rs;
    }
  });
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, int64_t N, int64_t C, bool acc_dx, bool acc_dw, bool acc_db) {
  if (dw || db) {
    const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
    parallel_for(blocks, 1, [=](int64_t first, int64_t last) {
      for (int64_t blk = first; blk < last; ++blk) {
        const int64_t c0 = blk * kColumnBlock, width = std::min(kColumnBlock, C - c0);
        double sw[kColumnBlock] = {}, sb[kColumnBlock] = {};
        for (int64_t n = 0; n < N; ++n) {
          const float* dyr = dy + n * C + c0;
          const float* xr = x + n * C + c0;
          const float mu = mean[n], rs = rstd[n];
#pragma omp simd
          for (int64_t c = 0; c < width; ++c) {
            sw[c] += double(dyr[c] * ((xr[c] - mu) * rs));
            sb[c] += double(dyr[c]);
          }
        }
        for (int64_t c = 0; c < width; ++c) {
          if (dw) dw[c0 + c] = acc_dw ? float(double(dw[c0 + c]) + sw[c]) : float(sw[c]);
          if (db) db[c0 + c] = acc_db ? float(double(db[c0 + c]) + sb[c]) : float(sb[c]);
        }
      }
    });
  }
  if (!dx) return;
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const float* dyr = dy + n * C;
      const float* xr = x + n * C;
      float* dxr = dx + n * C;
      const float mu = mean[n], rs = rstd[n];
      float sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dyr[c] * w[c];
        sg += g;
        sgx += g * ((xr[c] - mu) * rs);
      }
      const float mg = sg / float(C), mgx = sgx / float(C);
      if (acc_dx) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] += rs * (dyr[c] * w[c] - mg - (xr[c] - mu) * rs * mgx);
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) dxr[c] = rs * (dyr[c] * w[c] - mg - (xr[c] - mu) * rs * mgx);
      }
    }
  });
}

}  // namespace memfit
