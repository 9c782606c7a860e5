// Flash attention forward and backward (see flash_attention.hpp).
//
// Forward, per query block Q_i and each key block K_j with j <= i, rows r of the tile:
//   s = scale q_r k^T;  m' = max(m, max s);  p = exp(s - m');  l = l e^{m - m'} + sum p;
//   acc = acc e^{m - m'} + p V_j;  and at the end y = acc / l, lse = m + log l.
// Backward, per head, D_t = dy_t . y_t, then per key block j and query blocks i >= j:
//   p = exp(s - lse);  dV_j += p^T dO_i;  dp = dO_i V_j^T;  ds = scale p (dp - D);
//   dQ_i += ds K_j;  dK_j += ds^T Q_i.
// Grouped kv heads: query head h reads kv head h / G (G = NH / KV); the backward task of kv
// head j walks, per key block, the G query heads in order before the query blocks, so dK_j
// and dV_j sum the group in one fixed order while each query head keeps its own dQ.
// The subtle point is the causal diagonal tile (i == j): key c is visible to query r only
// when c <= r, and the masked probabilities are set to exactly 0 before any product reads
// them, so the products may run over the whole tile. Probabilities below 2^-64 of the row
// maximum are flushed to 0 exactly as the plain kernel's softmax does (vec_math.hpp).
#include "kernels/cpu/flash_attention.hpp"

#include "core/half.hpp"
#include "kernels/cpu/flash_tiles.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace memfit {
namespace {

using flash::Carver;
using flash::Geometry;
using flash::kB;
using flash::round_up;
using flash::store_kv_grads;
using flash::store_q_grads;
using flash::store_row;

// Per-thread scratch in floats: what forward_task / backward_task carve (they assert it).
int64_t forward_floats(int64_t HS) {
  return round_up(HS * kB, 16) + round_up(kB * kB, 16) + round_up(kB * HS, 16) * 3 + round_up(kB, 16) * 5;
}
// D and dq for each of the group's G query heads, then the tiles.
int64_t backward_floats(int64_t T, int64_t HS, int64_t G) {
  return G * (round_up(T, 16) + round_up(T * HS, 16)) + round_up(HS * kB, 16) * 2 + round_up(kB * kB, 16) * 2 +
         round_up(kB * HS, 16) * 5;
}

float* thread_slice(void* scratch, int64_t floats, int threads) {
  const int t = omp_get_thread_num();
  MEMFIT_ASSERT(t < threads, "flash attention runs on thread {} but has scratch for {}", t, threads);
  return static_cast<float*>(scratch) + int64_t(t) * floats;
}

// Rows [0, rows) x [0, cols) of a strided tensor as fp32 rows: the tensor itself when it is
// fp32, else converted into `buffer` (the one place a 16-bit variant adds a conversion).
struct RowsF32 {
  const float* p;
  int64_t ld;
};
template <class T>
RowsF32 rows_f32(const T* src, int64_t ld, int64_t rows, int64_t cols, float* buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return {src, ld};
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) buffer[r * cols + c] = widen(src[r * ld + c]);
    return {buffer, cols};
  }
}

// dst[c][r] = src[r][c] for r < rows, c < cols: a (rows x cols) block of a strided tensor into
// a packed (cols x ld_dst) tile.
template <class T>
void transpose_into(const T* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * ld_src;
    for (int64_t c = 0; c < cols; ++c) {
      if constexpr (std::is_same_v<T, float>) dst[c * ld_dst + r] = s[c];
      else dst[c * ld_dst + r] = widen(s[c]);
    }
  }
}

// One query block of one head. The scores are computed transposed, s^T = K_j Q_i^T (keys in
// rows, queries in columns), so that Q_i is transposed once per task rather than every K_j
// once per query block, and the online softmax runs down the columns with the queries in
// the vector lanes.
template <class T>
void forward_task(const Geometry& g, const T* qkv, T* y, float* lse, int64_t bh, int64_t qi, float* ws) {
  const int64_t b = bh / g.NH, h = bh % g.NH, HS = g.HS, ld = g.W;
  const int64_t q0 = qi * kB, br = g.size(qi);
  const T* row0 = qkv + b * g.T * ld;
  const T* base = row0 + g.shape.q_col(h);
  const T *kbase = row0 + g.shape.k_col(h / g.G), *vbase = row0 + g.shape.v_col(h / g.G);
  Carver carve(ws);
  float* qt = carve.take(HS * kB);
  float* st = carve.take(kB * kB);
  float* kbuf = carve.take(kB * HS);
  float* vbuf = carve.take(kB * HS);
  float* acc = carve.take(kB * HS);
  float* m = carve.take(kB);
  float* l = carve.take(kB);
  float* mx = carve.take(kB);
  float* corr = carve.take(kB);
  float* sum = carve.take(kB);
  MEMFIT_ASSERT(carve.used(ws) <= forward_floats(HS), "flash forward scratch overrun");
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  transpose_into(base + q0 * ld, ld, br, HS, qt, kB);
  for (int64_t kj = 0; kj <= qi; ++kj) {
    const int64_t k0 = kj * kB, bc = g.size(kj);
    const bool diagonal = kj == qi;
    const RowsF32 k = rows_f32(kbase + k0 * ld, ld, bc, HS, kbuf);
    tile_gemm(bc, br, HS, k.p, k.ld, 1, qt, kB, st, kB, false);
    std::fill(mx, mx + br, kMasked);
    for (int64_t c = 0; c < bc; ++c) {
      float* row = st + c * kB;
      // Key c is visible to query r when c <= r on the diagonal tile, always below it.
      const int64_t first_visible = diagonal ? c : 0;
#pragma omp simd
      for (int64_t r = 0; r < br; ++r) {
        const float v = r < first_visible ? kMasked : row[r] * g.scale;
        row[r] = v;
        mx[r] = v > mx[r] ? v : mx[r];
      }
    }
#pragma omp simd
    for (int64_t r = 0; r < br; ++r) {
      const float m_new = kj == 0 || mx[r] > m[r] ? mx[r] : m[r];
      corr[r] = kj == 0 ? 0.0f : softmax_exp(m[r] - m_new);
      m[r] = m_new;
      sum[r] = 0.0f;
    }
    for (int64_t c = 0; c < bc; ++c) {
      float* row = st + c * kB;
#pragma omp simd
      for (int64_t r = 0; r < br; ++r) {
        row[r] = softmax_exp(row[r] - m[r]);  // masked: -inf - m[r] is below the cutoff: exactly 0
        sum[r] += row[r];
      }
    }
    for (int64_t r = 0; r < br; ++r) {
      // The first key block sets l: the scratch holds the last op's bytes (0 x NaN is NaN).
      l[r] = kj == 0 ? sum[r] : l[r] * corr[r] + sum[r];
      if (kj > 0 && corr[r] != 1.0f) {
        float* a = acc + r * HS;
#pragma omp simd
        for (int64_t d = 0; d < HS; ++d) a[d] *= corr[r];
      }
    }
    // acc[r] += sum_c p[r][c] V[c]: p is s^T read column-wise (row stride 1, column stride kB).
    const RowsF32 v = rows_f32(vbase + k0 * ld, ld, bc, HS, vbuf);
    tile_gemm(br, HS, bc, st, 1, kB, v.p, v.ld, acc, HS, kj > 0);
  }
  T* yb = y + (b * g.T + q0) * g.C + h * HS;
  float* lb = lse + bh * g.T + q0;
  for (int64_t r = 0; r < br; ++r) {
    store_row(yb + r * g.C, acc + r * HS, HS, 1.0f / l[r], false);
    lb[r] = m[r] + std::log(l[r]);
  }
}

// One kv head and its group of query heads, all of its key blocks.
template <class T>
void backward_task(const Geometry& g, const T* dy, const T* qkv, const T* y, const float* lse, T* dqkv,
                   bool accumulate, int64_t bkv, float* ws) {
  const int64_t b = bkv / g.KV, j = bkv % g.KV, HS = g.HS, ld = g.W, T_ = g.T, G = g.G;
  const T* row0 = qkv + b * T_ * ld;
  const T *kbase = row0 + g.shape.k_col(j), *vbase = row0 + g.shape.v_col(j);
  // Query head j G + i of the group: its rows of dy, y, lse, and its own D and dq.
  auto dy_of = [&](int64_t i) { return dy + b * T_ * g.C + (j * G + i) * HS; };
  auto lse_of = [&](int64_t i) { return lse + (b * g.NH + j * G + i) * T_; };
  const int64_t d_stride = round_up(T_, 16), dq_stride = round_up(T_ * HS, 16);
  Carver carve(ws);
  float* D_all = carve.take(G * d_stride);
  float* dq_all = carve.take(G * dq_stride);
  float* kt = carve.take(HS * kB);
  float* vt = carve.take(HS * kB);
  float* p = carve.take(kB * kB);
  float* ds = carve.take(kB * kB);
  float* dk = carve.take(kB * HS);
  float* dv = carve.take(kB * HS);
  float* qbuf = carve.take(kB * HS);
  float* dobuf = carve.take(kB * HS);
  float* kbuf = carve.take(kB * HS);
  MEMFIT_ASSERT(carve.used(ws) <= backward_floats(T_, HS, G), "flash backward scratch overrun");

  for (int64_t i = 0; i < G; ++i) {
    const T *dyb = dy_of(i), *yb = y + b * T_ * g.C + (j * G + i) * HS;
    float* D = D_all + i * d_stride;
    for (int64_t t = 0; t < T_; t += kB) {
      const int64_t rows = std::min(kB, T_ - t);
      const RowsF32 o = rows_f32(yb + t * g.C, g.C, rows, HS, qbuf);
      const RowsF32 d = rows_f32(dyb + t * g.C, g.C, rows, HS, dobuf);
      for (int64_t r = 0; r < rows; ++r) {
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < HS; ++c) dot += o.p[r * o.ld + c] * d.p[r * d.ld + c];
        D[t + r] = dot;
      }
    }
  }
  std::fill(dq_all, dq_all + G * dq_stride, 0.0f);

  for (int64_t kj = 0; kj < g.blocks; ++kj) {
    const int64_t k0 = kj * kB, bc = g.size(kj);
    transpose_into(kbase + k0 * ld, ld, bc, HS, kt, kB);
    transpose_into(vbase + k0 * ld, ld, bc, HS, vt, kB);
    const RowsF32 k = rows_f32(kbase + k0 * ld, ld, bc, HS, kbuf);
    for (int64_t i = 0; i < G; ++i) {
      const T* base = row0 + g.shape.q_col(j * G + i);
      const T* dyb = dy_of(i);
      const float* lb = lse_of(i);
      const float* D = D_all + i * d_stride;
      float* dq = dq_all + i * dq_stride;
      for (int64_t qi = kj; qi < g.blocks; ++qi) {
        const int64_t q0 = qi * kB, br = g.size(qi);
        const bool first = i == 0 && qi == kj;  // the first product into this key block's dk, dv
        const RowsF32 q = rows_f32(base + q0 * ld, ld, br, HS, qbuf);
        const RowsF32 dO = rows_f32(dyb + q0 * g.C, g.C, br, HS, dobuf);
        tile_gemm(br, bc, HS, q.p, q.ld, 1, kt, kB, p, kB, false);
        for (int64_t r = 0; r < br; ++r) {
          float* row = p + r * kB;
          const int64_t visible = std::min(bc, q0 + r - k0 + 1);
          const float shift = lb[q0 + r];
#pragma omp simd
          for (int64_t c = 0; c < visible; ++c) row[c] = softmax_exp(row[c] * g.scale - shift);
          std::fill(row + visible, row + bc, 0.0f);
        }
        tile_gemm(bc, HS, br, p, 1, kB, dO.p, dO.ld, dv, HS, !first);
        tile_gemm(br, bc, HS, dO.p, dO.ld, 1, vt, kB, ds, kB, false);
        for (int64_t r = 0; r < br; ++r) {
          const float* prow = p + r * kB;
          float* drow = ds + r * kB;
          const float Dr = D[q0 + r];
#pragma omp simd
          for (int64_t c = 0; c < bc; ++c) drow[c] = g.scale * prow[c] * (drow[c] - Dr);
        }
        tile_gemm(br, HS, bc, ds, kB, 1, k.p, k.ld, dq + q0 * HS, HS, true);
        tile_gemm(bc, HS, br, ds, 1, kB, q.p, q.ld, dk, HS, !first);
      }
    }
    store_kv_grads(g, dqkv, b, j, k0, bc, dk, dv, accumulate);
  }
  store_q_grads(g, dqkv, b, j, dq_all, dq_stride, accumulate);
}

// With AVX512-BF16 the bf16 tasks carve their own layout: a slice holds either (the plan does
// not know the storage type here).
int64_t forward_slice_floats(int64_t HS) {
#if defined(__AVX512BF16__)
  return std::max(forward_floats(HS), flash::bf16_forward_floats(HS));
#else
  return forward_floats(HS);
#endif
}
int64_t backward_slice_floats(int64_t T, int64_t HS, int64_t G) {
#if defined(__AVX512BF16__)
  return std::max(backward_floats(T, HS, G), flash::bf16_backward_floats(T, HS, G));
#else
  return backward_floats(T, HS, G);
#endif
}

}  // namespace

uint64_t flash_forward_scratch_bytes(const AttentionShape& shape, int threads) {
  return uint64_t(forward_slice_floats(shape.head_dim)) * sizeof(float) * uint64_t(threads);
}

uint64_t flash_backward_scratch_bytes(const AttentionShape& shape, int threads) {
  return uint64_t(backward_slice_floats(shape.seq, shape.head_dim, shape.group())) * sizeof(float) * uint64_t(threads);
}

template <class T>
void flash_attention_forward(const AttentionShape& shape, const T* qkv, T* y, float* lse, void* scratch, int threads) {
  const Geometry g(shape);
  const int64_t floats = forward_slice_floats(shape.head_dim);
  parallel_for(g.B * g.NH * g.blocks, 1, [&](int64_t first, int64_t last) {
    float* ws = thread_slice(scratch, floats, threads);
    for (int64_t task = first; task < last; ++task) {
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, bf16_t>) {
        flash::bf16_forward_task(g, qkv, y, lse, task / g.blocks, task % g.blocks, ws);
        continue;
      }
#endif
      forward_task(g, qkv, y, lse, task / g.blocks, task % g.blocks, ws);
    }
  });
}

template <class T>
void flash_attention_backward(const AttentionShape& shape, const T* dy, const T* qkv, const T* y, const float* lse,
                              T* dqkv, bool accumulate, void* scratch, int threads) {
  const Geometry g(shape);
  const int64_t floats = backward_slice_floats(shape.seq, shape.head_dim, g.G);
  parallel_for(g.B * g.KV, 1, [&](int64_t first, int64_t last) {
    float* ws = thread_slice(scratch, floats, threads);
    for (int64_t bkv = first; bkv < last; ++bkv) {
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, bf16_t>) {
        flash::bf16_backward_task(g, dy, qkv, y, lse, dqkv, accumulate, bkv, ws);
        continue;
      }
#endif
      backward_task(g, dy, qkv, y, lse, dqkv, accumulate, bkv, ws);
    }
  });
}

#define MEMFIT_FLASH_INSTANTIATE(T)                                                                      \
  template void flash_attention_forward<T>(const AttentionShape&, const T*, T*, float*, void*, int);           \
  template void flash_attention_backward<T>(const AttentionShape&, const T*, const T*, const T*, const float*, \
                                            T*, bool, void*, int);
MEMFIT_FLASH_INSTANTIATE(float)
MEMFIT_FLASH_INSTANTIATE(bf16_t)
MEMFIT_FLASH_INSTANTIATE(fp16_t)
#undef MEMFIT_FLASH_INSTANTIATE

}  // namespace memfit
