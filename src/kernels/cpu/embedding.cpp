// Embedding forward (gather two rows and add) and backward (scatter-add into the tables).
// The one subtle point is the scatter: two rows of dx may carry the same token, so splitting
// the rows across threads would race. Threads split the channels instead, in fixed blocks,
// and every block walks all rows in order, which is race-free and gives the same bits for
// any thread count.
#include "kernels/cpu/embedding.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit {

namespace {

// The table row of token `tok`, or -1 when a sliced table does not hold it (see embedding.hpp).
inline int64_t table_row(int64_t tok, int64_t n, int64_t vocab_rows, int64_t vocab_begin, bool sliced) {
  MEMFIT_ASSERT(tok >= 0, "token {} at row {} is negative", tok, n);
  const int64_t row = tok - vocab_begin;
  if (sliced) return row >= 0 && row < vocab_rows ? row : -1;
  MEMFIT_ASSERT(row < vocab_rows, "token {} at row {} outside [0, {})", tok, n, vocab_rows);
  return row;
}

// x (+)= wpe's row alone: a token of another rank's slice.
template <class T>
void add_position_only(const T* pe, T* xr, int64_t C, bool acc) {
  if (acc) {
    if (!pe) return;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) xr[c] = narrow<T>(widen(xr[c]) + widen(pe[c]));
  } else if (pe) {
    std::memcpy(xr, pe, size_t(C) * sizeof(T));
  } else {
    std::memset(xr, 0, size_t(C) * sizeof(T));  // all-zero bits are +0 in every float type
  }
}

}  // namespace

template <class T>
void embedding_forward(const int32_t* tokens, const T* wte, const T* wpe, T* x, int64_t N, int64_t seq, int64_t C,
                       int64_t vocab_rows, bool acc, int64_t vocab_begin, bool sliced) {
  parallel_for(N, kParallelGrain / C, [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const int64_t row = table_row(tokens[n], n, vocab_rows, vocab_begin, sliced);
      T* xr = x + n * C;
      if (row < 0) {
        add_position_only(wpe ? wpe + (n % seq) * C : nullptr, xr, C, acc);
        continue;
      }
      const T* te = wte + row * C;
      if (!wpe) {  // rotary models: no position table
        if (acc) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) xr[c] = narrow<T>(widen(xr[c]) + widen(te[c]));
        } else {
          std::memcpy(xr, te, size_t(C) * sizeof(T));
        }
        continue;
      }
      const T* pe = wpe + (n % seq) * C;
      if (acc) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) xr[c] = narrow<T>(widen(xr[c]) + (widen(te[c]) + widen(pe[c])));
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) xr[c] = narrow<T>(widen(te[c]) + widen(pe[c]));
      }
    }
  });
}

template <class T, class G>
void embedding_backward(const T* dx, const int32_t* tokens, G* dwte, G* dwpe, int64_t N, int64_t seq, int64_t C,
                        int64_t vocab_rows, int64_t max_seq, bool acc_wte, bool acc_wpe, int64_t vocab_begin,
                        bool sliced) {
  for (int64_t n = 0; dwte && n < N; ++n)  // no dwte (a frozen table): no rows to index
    (void)table_row(tokens[n], n, vocab_rows, vocab_begin, sliced);
  const size_t row_bytes = size_t(C) * sizeof(G);  // all-zero bits are +0 in every float type
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
          const int64_t row = int64_t(tokens[n]) - vocab_begin;
          if (row < 0 || row >= vocab_rows) continue;  // another rank's token (checked above when not sliced)
          G* dst = dwte + row * C + c0;
          const T* src = dx + n * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) dst[c] = narrow<G>(widen(dst[c]) + widen(src[c]));
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
        G* dst = dwpe + t * C;
        if constexpr (std::is_same_v<G, float>) {
          if (!acc_wpe) std::memset(dst, 0, row_bytes);
          for (int64_t b = 0; b < batch; ++b) {
            const T* src = dx + (b * seq + t) * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) dst[c] += widen(src[c]);
          }
        } else {
          // A 16-bit row is summed over the batch in fp32 and rounded once, in column blocks.
          for (int64_t c0 = 0; c0 < C; c0 += kColumnBlock) {
            const int64_t w = std::min(kColumnBlock, C - c0);
            float sum[kColumnBlock];
            for (int64_t c = 0; c < w; ++c) sum[c] = acc_wpe ? widen(dst[c0 + c]) : 0.0f;
            for (int64_t b = 0; b < batch; ++b) {
              const T* src = dx + (b * seq + t) * C + c0;
#pragma omp simd
              for (int64_t c = 0; c < w; ++c) sum[c] += widen(src[c]);
            }
            for (int64_t c = 0; c < w; ++c) dst[c0 + c] = narrow<G>(sum[c]);
          }
        }
      }
    });
  }
}

template void embedding_forward<float>(const int32_t*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                                       int64_t, bool, int64_t, bool);
template void embedding_forward<bf16_t>(const int32_t*, const bf16_t*, const bf16_t*, bf16_t*, int64_t, int64_t,
                                        int64_t, int64_t, bool, int64_t, bool);
template void embedding_forward<fp16_t>(const int32_t*, const fp16_t*, const fp16_t*, fp16_t*, int64_t, int64_t,
                                        int64_t, int64_t, bool, int64_t, bool);
#define MEMFIT_INSTANTIATE(T, G)                                                                                 \
  template void embedding_backward<T, G>(const T*, const int32_t*, G*, G*, int64_t, int64_t, int64_t, int64_t,   \
                                         int64_t, bool, bool, int64_t, bool);
MEMFIT_INSTANTIATE(float, float)
MEMFIT_INSTANTIATE(bf16_t, float)
MEMFIT_INSTANTIATE(bf16_t, bf16_t)
MEMFIT_INSTANTIATE(fp16_t, float)
MEMFIT_INSTANTIATE(fp16_t, fp16_t)
#undef MEMFIT_INSTANTIATE

}  // namespace memfit
