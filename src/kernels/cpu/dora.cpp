#include "kernels/cpu/dora.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/quant/blockwise.hpp"

namespace memfit {

namespace {

// Columns at a time: B A's piece of a row, and the column sums of dm, live on the stack.
constexpr int64_t kChunk = 256;

template <class T>
T* typed(void* p) {
  return static_cast<T*>(p);
}

}  // namespace

float AnyFloats::operator[](int64_t i) const {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return widen(static_cast<const bf16_t*>(data)[i]);
    case DType::f16: return widen(static_cast<const fp16_t*>(data)[i]);
    default: MEMFIT_ASSERT(false, "a DoRA vector of dtype {}", dtype_name(dtype)); return 0.0f;
  }
}

// (B A)[row, c] summed over the rank first, then scaled and added to W as PEFT's
// W + scale * (B @ A) does. load(c0, len, w) puts W's row elements [c0, c0 + len) in w.
template <class T, class Load>
static double row_sum_of_squares(const Load& load, const T* a, const T* b_row, int64_t k, int64_t rank, float scale) {
  float ba[kChunk], w_row[kChunk];
  double sum = 0.0;
  for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
    const int64_t len = std::min(kChunk, k - c0);
    load(c0, len, w_row);
    std::fill(ba, ba + len, 0.0f);
    for (int64_t r = 0; r < rank; ++r) {
      const float br = widen(b_row[r]);
      const T* ar = a + r * k + c0;
      for (int64_t c = 0; c < len; ++c) ba[c] += br * widen(ar[c]);
    }
    for (int64_t c = 0; c < len; ++c) {
      const float v = w_row[c] + scale * ba[c];
      sum += double(v) * double(v);
    }
  }
  return sum;
}

template <class W>
static auto row_of(const W* w_row) {
  return [w_row](int64_t c0, int64_t len, float* out) {
    for (int64_t c = 0; c < len; ++c) out[c] = widen(w_row[c0 + c]);
  };
}

template <class T>
double dora_row_sum_of_squares(const float* w_row, const T* a, const T* b_row, int64_t k, int64_t rank, float scale) {
  return row_sum_of_squares(row_of(w_row), a, b_row, k, rank, scale);
}

template <class T>
void dora_norm_rows_quantized(std::span<const QuantizedWeight> pieces, DType weight, const T* a, const T* b,
                              float* norm, int64_t k, int64_t row_begin, int64_t rows, int64_t rank, float scale) {
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(k * (rank + 1), 1));
  parallel_for(rows, grain, [=](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      size_t s = 0;
      int64_t local = row_begin + j;
      while (local >= pieces[s].rows) local -= pieces[s++].rows;
      const QuantizedWeight& w = pieces[s];
      const int64_t at = local * k;
      auto load = [&](int64_t c0, int64_t len, float* out) {
        if (weight == DType::bf16) {
          bf16_t tmp[kChunk];
          dequantize_range<bf16_t>(w, at + c0, at + c0 + len, std::span<bf16_t>(tmp, size_t(len)));
          for (int64_t c = 0; c < len; ++c) out[c] = widen(tmp[c]);
          return;
        }
        dequantize_range<float>(w, at + c0, at + c0 + len, std::span<float>(out, size_t(len)));
        if (weight == DType::f16)
          for (int64_t c = 0; c < len; ++c) out[c] = widen(narrow<fp16_t>(out[c]));
      };
      norm[j] = float(std::sqrt(row_sum_of_squares(load, a, b + j * rank, k, rank, scale)));
    }
  });
}

template <class T>
void dora_norm_rows(const T* w, const T* a, const T* b, float* norm, int64_t k, int64_t row_begin, int64_t rows,
                    int64_t rank, float scale) {
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(k * (rank + 1), 1));
  parallel_for(rows, grain, [=](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j)
      norm[j] = float(std::sqrt(row_sum_of_squares(row_of(w + (row_begin + j) * k), a, b + j * rank, k, rank, scale)));
  });
}

template <class T>
void dora_scale_forward(const T* z, const std::vector<DoraBlock>& blocks, AnyFloats bias, T* y, int64_t m, int64_t n,
                        bool acc) {
  parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* zr = z + i * n;
      T* yr = y + i * n;
      auto put = [&](int64_t c, float v) { yr[c] = narrow<T>(acc ? widen(yr[c]) + v : v); };
      int64_t c = 0;
      for (const DoraBlock& blk : blocks) {
        for (; c < blk.begin; ++c) put(c, widen(zr[c]));
        for (int64_t j = 0; j < blk.width; ++j, ++c) {
          const float b = bias.data ? bias[c] : 0.0f;
          put(c, (widen(zr[c]) - b) * (blk.m[j] / blk.norm[j]) + b);
        }
      }
      for (; c < n; ++c) put(c, widen(zr[c]));
    }
  });
}

template <class T>
void dora_scale_backward(const T* dy, const T* z, const std::vector<DoraBlock>& blocks, AnyFloats bias, T* dz,
                         int64_t m, int64_t n, bool dz_acc) {
  // dm first: dz may overwrite dy.
  for (const DoraBlock& blk : blocks) {
    parallel_for(blk.width, kChunk, [&](int64_t lo, int64_t hi) {
      double sums[kChunk];
      for (int64_t c0 = lo; c0 < hi; c0 += kChunk) {
        const int64_t len = std::min(kChunk, hi - c0);
        std::fill(sums, sums + len, 0.0);
        for (int64_t i = 0; i < m; ++i) {
          const T* dyr = dy + i * n + blk.begin + c0;
          const T* zr = z + i * n + blk.begin + c0;
          for (int64_t c = 0; c < len; ++c) {
            const float b = bias.data ? bias[blk.begin + c0 + c] : 0.0f;
            sums[c] += double(widen(dyr[c])) * double(widen(zr[c]) - b);
          }
        }
        for (int64_t c = 0; c < len; ++c) {
          const float g = float(sums[c] / double(blk.norm[c0 + c]));
          visit_float_type(blk.dm_dtype, [&](auto t) {
            using G = decltype(t);
            G* dm = typed<G>(blk.dm) + c0 + c;
            *dm = narrow<G>(blk.dm_accumulate ? widen(*dm) + g : g);
          });
        }
      }
    });
  }
  parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* dyr = dy + i * n;
      T* dzr = dz + i * n;
      auto put = [&](int64_t c, float v) { dzr[c] = narrow<T>(dz_acc ? widen(dzr[c]) + v : v); };
      int64_t c = 0;
      for (const DoraBlock& blk : blocks) {
        for (; c < blk.begin; ++c) put(c, widen(dyr[c]));
        for (int64_t j = 0; j < blk.width; ++j, ++c) put(c, widen(dyr[c]) * (blk.m[j] / blk.norm[j]));
      }
      for (; c < n; ++c) put(c, widen(dyr[c]));
    }
  });
}

#define MEMFIT_DORA(T)                                                                                              \
  template double dora_row_sum_of_squares<T>(const float*, const T*, const T*, int64_t, int64_t, float);           \
  template void dora_norm_rows<T>(const T*, const T*, const T*, float*, int64_t, int64_t, int64_t, int64_t, float); \
  template void dora_norm_rows_quantized<T>(std::span<const QuantizedWeight>, DType, const T*, const T*, float*,    \
                                            int64_t, int64_t, int64_t, int64_t, float);                           \
  template void dora_scale_forward<T>(const T*, const std::vector<DoraBlock>&, AnyFloats, T*, int64_t, int64_t,    \
                                      bool);                                                                       \
  template void dora_scale_backward<T>(const T*, const T*, const std::vector<DoraBlock>&, AnyFloats, T*, int64_t,  \
                                       int64_t, bool);
MEMFIT_DORA(float)
MEMFIT_DORA(bf16_t)
MEMFIT_DORA(fp16_t)

}  // namespace memfit
