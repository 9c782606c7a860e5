// Embedding forward (gather two rows and add) and backward (scatter-add into the tables).
// The one subtle point is the scatter: two rows of dx may carry the same token, so splitting
// the rows across threads would race. Threads split the channels instead, in fixed blocks,
// and every block walks all rows in order, which is race-free and gives the same bits for
// any thread count.
#include "kernels/cpu/embedding.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit {

void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* x, int64_t N, int64_t seq,
                       int64_t C, int64_t vocab_rows, bool acc) {
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const int64_t tok = tokens[n];
      MEMFIT_ASSERT(tok >= 0 && tok < vocab_rows, "token {} at row {} outside [0, {})", tok, n, vocab_rows);
      const float* te = wte + tok * C;
      const float* pe = wpe + (n % seq) * C;
      float* xr = x + n * C;
      if (acc) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) xr[c] += te[c] + pe[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) xr[c] = te[c] + pe[c];
      }
    }
  });
}

void embedding_backward(const float* dx, const int32_t* tokens, float* dwte, float* dwpe, int64_t N, int64_t seq,
                        int64_t C, int64_t vocab_rows, int64_t max_seq, bool acc_wte, bool acc_wpe) {
  for (int64_t n = 0; n < N; ++n)
    MEMFIT_ASSERT(tokens[n] >= 0 && tokens[n] < vocab_rows, "token {} at row {} outside [0, {})", tokens[n], n,
                  vocab_rows);
  const size_t row_bytes = size_t(C) * sizeof(float);
  if (dwte) {
    if (!acc_wte)
      parallel_for(vocab_rows, kParallelGrain / C, [=](int64_t first, int64_t last) {
        std::memset(dwte + first * C, 0, size_t(last - first) * row_bytes);
      });
    const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
    parallel_for(blocks, 1, [=](int64_t first, int64_t last) {
      for (int64_t blk = first; blk < last; ++blk) {
        const int64_t c0 = blk * kColumnBlock, w = std::min(kColumnBlock, C - c0);
        for (int64_t n = 0; n < N; ++n) {
          float* dst = dwte + int64_t(tokens[n]) * C + c0;
          const float* src = dx + n * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) dst[c] += src[c];
        }
      }
    });
  }
  if (dwpe) {
    if (!acc_wpe && max_seq > seq) std::memset(dwpe + seq * C, 0, size_t(max_seq - seq) * row_bytes);
    // Each position's row is owned by one thread; the batch is summed in order.
    const int64_t batch = N / seq;
    parallel_for(seq, kParallelGrain / (C * batch), [=](int64_t first, int64_t last) {
      for (int64_t t = first; t < last; ++t) {
        float* dst = dwpe + t * C;
        if (!acc_wpe) std::memset(dst, 0, row_bytes);
        for (int64_t b = 0; b < batch; ++b) {
          const float* src = dx + (b * seq + t) * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
        }
      }
    });
  }
}

}  // namespace memfit
