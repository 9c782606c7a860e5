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

}  // namespace

float AnyFloats::operator[](int64_t i) const {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::bf16: return widen(static_cast<const bf16_t*>(data)[i]);
    case DType::f16: return widen(static_cast<const fp16_t*>(data)[i]);
    default: MEMFIT_ASSERT(false, "a DoRA vector of dtype {}", dtype_name(dtype)); return 0.0f;
  }
}

// Squares of w + scale * ba summed into eight double lanes, element c of the row into lane c % 8
// (len is a multiple of 8 except at the row's end): one dependent add per lane instead of one
// chain over the row, and the same sums whatever the chunks (the tiled and row-by-row forms).
static void add_squares(const float* w, const float* ba, float scale, int64_t len, double* lanes) {
  int64_t c = 0;
  for (; c + 8 <= len; c += 8)
    for (int l = 0; l < 8; ++l) {
      const float v = w[c + l] + scale * ba[c + l];
      lanes[l] += double(v) * double(v);
    }
  for (; c < len; ++c) {
    const float v = w[c] + scale * ba[c];
    lanes[c % 8] += double(v) * double(v);
  }
}
static double lanes_sum(const double* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

// (B A)[row, c] summed over the rank first, then scaled and added to W as PEFT's
// W + scale * (B @ A) does. load(c0, len, w) puts W's row elements [c0, c0 + len) in w.
template <class T, class Load>
static double row_sum_of_squares(const Load& load, const T* a, const T* b_row, int64_t k, int64_t rank, float scale) {
  float ba[kChunk], w_row[kChunk];
  double lanes[8] = {};
  for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
    const int64_t len = std::min(kChunk, k - c0);
    load(c0, len, w_row);
    std::fill(ba, ba + len, 0.0f);
    for (int64_t r = 0; r < rank; ++r) {
      const float br = widen(b_row[r]);
      const T* ar = a + r * k + c0;
      for (int64_t c = 0; c < len; ++c) ba[c] += br * widen(ar[c]);
    }
    add_squares(w_row, ba, scale, len, lanes);
  }
  return lanes_sum(lanes);
}

// Rows [lo, hi) of ||W + scale B A||, kRowTile rows at a time so that each piece of A is
// widened once per tile rather than once per row; load(j, c0, len, out) puts W's row j,
// columns [c0, c0 + len), in out. The same sums, in the same order, as row_sum_of_squares.
constexpr int64_t kRowTile = 8, kWidenedA = 8192;
template <class T, class Load>
static void norm_rows_tiled(const Load& load, const T* a, const T* b, float* norm, int64_t k, int64_t rank,
                            float scale, int64_t lo, int64_t hi) {
  const int64_t cols = std::clamp<int64_t>(kWidenedA / rank / 8 * 8, 8, kChunk);  // whole lanes of add_squares
  if (rank * 8 > kWidenedA) {  // ranks above 1024: A read in place, row by row
    for (int64_t j = lo; j < hi; ++j)
      norm[j] = float(std::sqrt(row_sum_of_squares([&](int64_t c0, int64_t len, float* out) { load(j, c0, len, out); },
                                                   a, b + j * rank, k, rank, scale)));
    return;
  }
  float af[kWidenedA], w_row[kChunk], ba[kChunk];
  for (int64_t j0 = lo; j0 < hi; j0 += kRowTile) {
    const int64_t h = std::min(kRowTile, hi - j0);
    double lanes[kRowTile][8] = {};
    for (int64_t c0 = 0; c0 < k; c0 += cols) {
      const int64_t len = std::min(cols, k - c0);
      for (int64_t r = 0; r < rank; ++r)
        for (int64_t c = 0; c < len; ++c) af[r * len + c] = widen(a[r * k + c0 + c]);
      for (int64_t t = 0; t < h; ++t) {
        load(j0 + t, c0, len, w_row);
        std::fill(ba, ba + len, 0.0f);
        for (int64_t r = 0; r < rank; ++r) {
          const float br = widen(b[(j0 + t) * rank + r]);
          const float* ar = af + r * len;
          for (int64_t c = 0; c < len; ++c) ba[c] += br * ar[c];
        }
        add_squares(w_row, ba, scale, len, lanes[t]);
      }
    }
    for (int64_t t = 0; t < h; ++t) norm[j0 + t] = float(std::sqrt(lanes_sum(lanes[t])));
  }
}

template <class T>
void dora_norm_rows_quantized(std::span<const QuantizedWeight> pieces, DType weight, const T* a, const T* b,
                              float* norm, int64_t k, int64_t row_begin, int64_t rows, int64_t rank, float scale) {
  const int64_t grain = std::max<int64_t>(kRowTile, kParallelGrain / std::max<int64_t>(k * (rank + 1), 1));
  parallel_for(rows, grain, [=](int64_t lo, int64_t hi) {
    auto load = [&](int64_t j, int64_t c0, int64_t len, float* out) {
      size_t s = 0;
      int64_t local = row_begin + j;
      while (local >= pieces[s].rows) local -= pieces[s++].rows;
      bf16_t scratch[kChunk];
      dequantize_as_weight(pieces[s], local * k + c0, local * k + c0 + len, weight, scratch,
                           std::span<float>(out, size_t(len)));
    };
    norm_rows_tiled(load, a, b, norm, k, rank, scale, lo, hi);
  });
}

template <class T>
void dora_norm_rows(const T* w, const T* a, const T* b, float* norm, int64_t k, int64_t row_begin, int64_t rows,
                    int64_t rank, float scale) {
  const int64_t grain = std::max<int64_t>(kRowTile, kParallelGrain / std::max<int64_t>(k * (rank + 1), 1));
  parallel_for(rows, grain, [=](int64_t lo, int64_t hi) {
    auto load = [&](int64_t j, int64_t c0, int64_t len, float* out) {
      const T* row = w + (row_begin + j) * k + c0;
      for (int64_t c = 0; c < len; ++c) out[c] = widen(row[c]);
    };
    norm_rows_tiled(load, a, b, norm, k, rank, scale, lo, hi);
  });
}

// A block's factors m / norm and biases for columns [c0, c0 + len) of it, once per chunk of
// columns and range of rows rather than per element.
static void chunk_factors(const DoraBlock& blk, AnyFloats bias, int64_t c0, int64_t len, float* f, float* b) {
  for (int64_t c = 0; c < len; ++c) {
    f[c] = blk.m[c0 + c] / blk.norm[c0 + c];
    b[c] = bias.data ? bias[blk.begin + c0 + c] : 0.0f;
  }
}

// Rows [lo, hi) of out (+)= in, in the columns outside every block (sorted, disjoint).
template <class T>
static void copy_outside_blocks(const T* in, const std::vector<DoraBlock>& blocks, T* out, int64_t n, int64_t lo,
                                int64_t hi, bool acc) {
  int64_t c = 0;
  auto copy_to = [&](int64_t stop) {
    for (int64_t i = lo; i < hi; ++i)
      for (int64_t k = c; k < stop; ++k) {
        const float v = widen(in[i * n + k]);
        out[i * n + k] = narrow<T>(acc ? widen(out[i * n + k]) + v : v);
      }
    c = stop;
  };
  for (const DoraBlock& blk : blocks) {
    copy_to(blk.begin);
    c = blk.begin + blk.width;
  }
  copy_to(n);
}

// Rows [lo, hi): out = in outside the blocks; inside, out = apply(in, factor, bias) per element
// (the forward's (z - b) f + b, the backward's dy f); out (+)= when acc.
template <class T, class Apply>
static void scale_rows(const T* in, const std::vector<DoraBlock>& blocks, AnyFloats bias, T* out, int64_t n,
                       int64_t lo, int64_t hi, bool acc, const Apply& apply) {
  auto put = [acc](T& o, float v) { o = narrow<T>(acc ? widen(o) + v : v); };
  copy_outside_blocks(in, blocks, out, n, lo, hi, acc);
  float f[kChunk], b[kChunk];
  for (const DoraBlock& blk : blocks) {
    for (int64_t c0 = 0; c0 < blk.width; c0 += kChunk) {
      const int64_t len = std::min(kChunk, blk.width - c0);
      chunk_factors(blk, bias, c0, len, f, b);
      for (int64_t i = lo; i < hi; ++i) {
        const T* x = in + i * n + blk.begin + c0;
        T* o = out + i * n + blk.begin + c0;
        for (int64_t k = 0; k < len; ++k) put(o[k], apply(widen(x[k]), f[k], b[k]));
      }
    }
  }
}

// The block's column sums of dy (z - bias), or of dy alone when z is null, in double: columns
// over threads, each walking all rows in order (as kernels/cpu/column_sums.hpp, whose
// per-column work is fixed per element; here a chunk's factors are read once). dy is [m, n]
// with the block from column blk.begin; z the block's first column, rows z_stride apart.
// write(c0, len, sums, f) takes each chunk's sums and its factors m / norm.
template <class T, class Write>
static void block_column_sums(const T* dy, int64_t n, const T* z, int64_t z_stride, const DoraBlock& blk,
                              AnyFloats bias, int64_t m, const Write& write) {
  parallel_for(blk.width, kChunk / 4, [&](int64_t lo, int64_t hi) {
    double sums[kChunk];
    float f[kChunk], b[kChunk];
    for (int64_t c0 = lo; c0 < hi; c0 += kChunk) {
      const int64_t len = std::min(kChunk, hi - c0);
      chunk_factors(blk, bias, c0, len, f, b);
      std::fill(sums, sums + len, 0.0);
      for (int64_t i = 0; i < m; ++i) {
        const T* dyr = dy + i * n + blk.begin + c0;
        if (!z) {
          for (int64_t c = 0; c < len; ++c) sums[c] += double(widen(dyr[c]));
          continue;
        }
        const T* zr = z + i * z_stride + c0;
        for (int64_t c = 0; c < len; ++c) sums[c] += double(widen(dyr[c]) * (widen(zr[c]) - b[c]));
      }
      write(c0, len, sums, f);
    }
  });
}

// dm (+)= column sums of dy (z - bias) / norm over the block.
template <class T>
static void magnitude_gradient(const T* dy, int64_t n, const T* z, int64_t z_stride, const DoraBlock& blk,
                               AnyFloats bias, int64_t m) {
  block_column_sums(dy, n, z, z_stride, blk, bias, m, [&](int64_t c0, int64_t len, const double* sums, const float*) {
    visit_float_type(blk.dm_dtype, [&](auto t) {
      using G = decltype(t);
      G* dm = static_cast<G*>(blk.dm) + c0;
      for (int64_t c = 0; c < len; ++c) {
        const float g = float(sums[c] / double(blk.norm[c0 + c]));
        dm[c] = narrow<G>(blk.dm_accumulate ? widen(dm[c]) + g : g);
      }
    });
  });
}

// db (+)= column sums of dy (1 - m / norm) in the blocks, 0 elsewhere: the part of a trained
// bias's gradient that does not come through z.
template <class T>
static void bias_gradient(const T* dy, const std::vector<DoraBlock>& blocks, const BiasGradient& db, int64_t m,
                          int64_t n) {
  visit_float_type(db.dtype, [&](auto t) {
    using G = decltype(t);
    G* out = static_cast<G*>(db.data);
    if (!db.accumulate) std::fill(out, out + n, narrow<G>(0.0f));
    for (const DoraBlock& blk : blocks)
      block_column_sums<T>(dy, n, nullptr, 0, blk, AnyFloats{}, m,
                           [&](int64_t c0, int64_t len, const double* sums, const float* f) {
                             for (int64_t c = 0; c < len; ++c) {
                               G& o = out[blk.begin + c0 + c];
                               const float v = float(sums[c] * (1.0 - double(f[c])));
                               o = narrow<G>(db.accumulate ? widen(o) + v : v);
                             }
                           });
  });
}

template <class T>
void dora_scale_forward(const T* z, const std::vector<DoraBlock>& blocks, AnyFloats bias, T* y, int64_t m, int64_t n,
                        bool acc) {
  parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
    scale_rows(z, blocks, bias, y, n, lo, hi, acc, [](float x, float f, float b) { return (x - b) * f + b; });
  });
}

template <class T>
void dora_scale_backward(const T* dy, const T* z, const std::vector<DoraBlock>& blocks, AnyFloats bias, T* dz,
                         int64_t m, int64_t n, bool dz_acc, const BiasGradient& db) {
  // dm and db first: dz may overwrite dy.
  for (const DoraBlock& blk : blocks) magnitude_gradient(dy, n, z + blk.begin, n, blk, bias, m);
  if (db.data) bias_gradient(dy, blocks, db, m, n);
  parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
    scale_rows(dy, blocks, AnyFloats{}, dz, n, lo, hi, dz_acc, [](float g, float f, float) { return g * f; });
  });
}

template <class T>
void dora_blend_forward(const T* y0, const std::vector<DoraBlock>& blocks, T* y, int64_t m, int64_t n, bool acc) {
  parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)), [&](int64_t lo, int64_t hi) {
    auto put = [acc](T& o, float v) { o = narrow<T>(acc ? widen(o) + v : v); };
    if (y != y0 || acc) copy_outside_blocks(y0, blocks, y, n, lo, hi, acc);  // nothing to do in place
    float f[kChunk], unused[kChunk];
    for (const DoraBlock& blk : blocks) {
      const T* p = static_cast<const T*>(blk.p);
      const T* q = static_cast<const T*>(blk.q);
      for (int64_t c0 = 0; c0 < blk.width; c0 += kChunk) {
        const int64_t len = std::min(kChunk, blk.width - c0);
        chunk_factors(blk, AnyFloats{}, c0, len, f, unused);
        for (int64_t i = lo; i < hi; ++i) {
          const T* base = y0 + i * n + blk.begin + c0;
          const T* pr = p + i * blk.width + c0;
          const T* qr = q + i * blk.width + c0;
          T* o = y + i * n + blk.begin + c0;
          T* zr = static_cast<T*>(blk.z_out) + i * blk.width + c0;  // may be pr
          for (int64_t k = 0; k < len; ++k) {
            const float pv = widen(pr[k]), qv = widen(qr[k]);
            put(o[k], widen(base[k]) + (f[k] - 1.0f) * pv + f[k] * qv);
            zr[k] = narrow<T>(pv + qv);
          }
        }
      }
    }
  });
}

template <class T>
void dora_blend_backward(const T* dy, const std::vector<DoraBlock>& blocks, int64_t m, int64_t n) {
  for (const DoraBlock& blk : blocks) {
    magnitude_gradient(dy, n, static_cast<const T*>(blk.z), blk.width, blk, AnyFloats{}, m);
    parallel_for(m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(blk.width, 1)), [&](int64_t lo, int64_t hi) {
      float f[kChunk], unused[kChunk];
      T* dp = static_cast<T*>(blk.dp);
      T* dq = static_cast<T*>(blk.dq);
      for (int64_t c0 = 0; c0 < blk.width; c0 += kChunk) {
        const int64_t len = std::min(kChunk, blk.width - c0);
        chunk_factors(blk, AnyFloats{}, c0, len, f, unused);
        for (int64_t i = lo; i < hi; ++i) {
          const T* g = dy + i * n + blk.begin + c0;
          const int64_t at = i * blk.width + c0;
          if (dp)
            for (int64_t k = 0; k < len; ++k) {
              const float v = (f[k] - 1.0f) * widen(g[k]);
              dp[at + k] = narrow<T>(blk.dp_accumulate ? widen(dp[at + k]) + v : v);
            }
          if (dq)
            for (int64_t k = 0; k < len; ++k) {
              const float v = f[k] * widen(g[k]);
              dq[at + k] = narrow<T>(blk.dq_accumulate ? widen(dq[at + k]) + v : v);
            }
        }
      }
    });
  }
}

#define MEMFIT_DORA(T)                                                                                              \
  template void dora_norm_rows<T>(const T*, const T*, const T*, float*, int64_t, int64_t, int64_t, int64_t, float); \
  template void dora_norm_rows_quantized<T>(std::span<const QuantizedWeight>, DType, const T*, const T*, float*,    \
                                            int64_t, int64_t, int64_t, int64_t, float);                           \
  template void dora_scale_forward<T>(const T*, const std::vector<DoraBlock>&, AnyFloats, T*, int64_t, int64_t,    \
                                      bool);                                                                       \
  template void dora_scale_backward<T>(const T*, const T*, const std::vector<DoraBlock>&, AnyFloats, T*, int64_t,  \
                                       int64_t, bool, const BiasGradient&);                                                      \
  template void dora_blend_forward<T>(const T*, const std::vector<DoraBlock>&, T*, int64_t, int64_t, bool);       \
  template void dora_blend_backward<T>(const T*, const std::vector<DoraBlock>&, int64_t, int64_t);
MEMFIT_DORA(float)
MEMFIT_DORA(bf16_t)
MEMFIT_DORA(fp16_t)

}  // namespace memfit
