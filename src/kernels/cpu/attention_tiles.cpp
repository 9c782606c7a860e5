// Plain causal attention in fp32 (see attention_tiles.hpp): the forward one (batch, query
// head) per task, the backward one (batch, kv head) per task.
//
// Per head, with q, k, v rows of stride W = (NH + 2KV) HS in qkv (3C without grouping) and
// y, dy rows of stride C; query head h reads kv head h / G, G = NH / KV:
//   forward, per query block: S = q k^T (keys up to the block's end), softmax of scale * S
//     in place into probs, y (+)= P v;
//   backward: dV = P^T dy per key block; per query block dP = dy v^T, then in place
//     dS = scale * P * (dP - rowsum(P * dP)) and dQ (+)= dS k; finally dK = dS^T q per key
//     block.
// Grouped kv heads: the backward task of kv head j runs its G query heads in order, the
// first writing (or adding to) dk and dv as without grouping, the others adding to them, so
// the group sums have one fixed order whatever the thread count.
// The transposed operands P^T and dS^T cost no copy: tile_gemm reads A through two strides.
// The scale is applied to dS rather than after each product; for the usual power-of-two
// scales (HS = 64: 1/8) that is exact, otherwise it differs in the last bit.
#include "kernels/cpu/avx512_quiet.hpp"  // first: before any intrinsics header
#include "kernels/cpu/attention_tiles.hpp"

#include <omp.h>

#include <algorithm>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/error.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/tile_gemm.hpp"
#include "kernels/cpu/transpose.hpp"
#include "kernels/cpu/vec_math.hpp"
#include "kernels/cpu/vec_math_avx512.hpp"

namespace memfit {
namespace {

constexpr int64_t kQB = kAttentionQueryBlock;

// A head-sized operand (T x HS floats), rounded to whole cache lines.
int64_t operand_floats(const AttentionShape& s) { return (s.head_dim * s.seq + 15) / 16 * 16; }
// Per thread: the forward's k^T and v, the backward's v^T, dy, k and q.
constexpr int64_t kOperandsPerThread = 4;
int64_t slice_floats(const AttentionShape& s) { return kOperandsPerThread * operand_floats(s); }

float* thread_slice(void* scratch, const AttentionShape& s, int threads) {
  const int t = omp_get_thread_num();
  MEMFIT_ASSERT(t < threads, "attention runs on thread {} but has scratch for {}", t, threads);
  return static_cast<float*>(scratch) + int64_t(t) * slice_floats(s);
}

// dst[t * HS + d] = src[t * ld + d]: T rows of HS floats made contiguous. Read in place, the
// rows of q, k, v (3C floats apart) or dy (C apart) fall on a quarter of the L1 sets when C
// is a multiple of 256, so a product streaming T of them thrashed L1: packed, the products
// with them ran 13-34% faster (118 -> 133 and 158 GFLOP/s on one core).
void pack_rows(float* dst, const float* src, int64_t T, int64_t HS, int64_t ld) {
  for (int64_t t = 0; t < T; ++t) std::copy(src + t * ld, src + t * ld + HS, dst + t * HS);
}

// Rows [r0, r1) of one head's T x T scores, in place: probabilities of scale * S over the
// visible keys 0..t, exact zeros after them.
void softmax_rows(float* s, int64_t r0, int64_t r1, int64_t T, float scale) {
  for (int64_t t = r0; t < r1; ++t) {
    float* p = s + t * T;
#if defined(__AVX512F__)
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 mv = _mm512_set1_ps(-std::numeric_limits<float>::max());
    for (int64_t j = 0; j <= t; j += 16) {
      const __mmask16 m = lanes_below(t + 1 - j);
      mv = _mm512_mask_max_ps(mv, m, mv, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), sc));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512 sv = _mm512_setzero_ps();
    for (int64_t j = 0; j <= t; j += 16) {
      const __mmask16 m = lanes_below(t + 1 - j);
      const __m512 e = softmax_exp16(_mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), sc), mx));
      _mm512_mask_storeu_ps(p + j, m, e);
      sv = _mm512_mask_add_ps(sv, m, sv, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
    for (int64_t j = 0; j <= t; j += 16) {
      const __mmask16 m = lanes_below(t + 1 - j);
      _mm512_mask_storeu_ps(p + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), inv));
    }
#else
    float mx = p[0] * scale;
    for (int64_t j = 0; j <= t; ++j) mx = p[j] * scale > mx ? p[j] * scale : mx;
    float sum = 0;
    for (int64_t j = 0; j <= t; ++j) {
      p[j] = softmax_exp(p[j] * scale - mx);
      sum += p[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j <= t; ++j) p[j] *= inv;
#endif
    std::fill(p + t + 1, p + T, 0.0f);
  }
}

// Rows [r0, r1) in place over dP: dS = scale * P * (dP - sum(P * dP)), exact zeros after t.
void softmax_backward_rows(const float* p, float* d, int64_t r0, int64_t r1, int64_t T, float scale) {
  for (int64_t t = r0; t < r1; ++t) {
    const float* pr = p + t * T;
    float* dr = d + t * T;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j <= t; j += 16) {
      const __mmask16 m = lanes_below(t + 1 - j);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, pr + j), _mm512_maskz_loadu_ps(m, dr + j), acc);
    }
    const __m512 dot = _mm512_set1_ps(_mm512_reduce_add_ps(acc)), sc = _mm512_set1_ps(scale);
    for (int64_t j = 0; j <= t; j += 16) {
      const __mmask16 m = lanes_below(t + 1 - j);
      const __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pr + j),
                                     _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dr + j), dot));
      _mm512_mask_storeu_ps(dr + j, m, _mm512_mul_ps(sc, g));
    }
#else
    float dot = 0;
    for (int64_t j = 0; j <= t; ++j) dot += pr[j] * dr[j];
    for (int64_t j = 0; j <= t; ++j) dr[j] = scale * (pr[j] * (dr[j] - dot));
#endif
    std::fill(dr + t + 1, dr + T, 0.0f);
  }
}

}  // namespace

uint64_t attention_tiles_scratch_bytes(const AttentionShape& shape, int threads) {
  return uint64_t(threads) * uint64_t(slice_floats(shape)) * sizeof(float);
}

void attention_forward_tiles(const AttentionShape& s, const float* qkv, float* y, float* probs, bool acc_y,
                             void* scratch, int threads) {
  const int64_t T = s.seq, HS = s.head_dim, C = s.channels(), G = s.group();
  const int64_t ld = s.qkv_channels();
  parallel_for(s.batch * s.heads, 0, [&](int64_t first, int64_t last) {
    float* kt = thread_slice(scratch, s, threads);
    float* vp = kt + operand_floats(s);
    for (int64_t i = first; i < last; ++i) {
      const int64_t b = i / s.heads, h = i % s.heads;
      const float* row0 = qkv + b * T * ld;
      const float *q = row0 + s.q_col(h), *k = row0 + s.k_col(h / G), *v = row0 + s.v_col(h / G);
      float* p = probs + i * T * T;
      float* yh = y ? y + b * T * C + h * HS : nullptr;
      transpose_serial(kt, T, k, ld, T, HS);
      if (yh) pack_rows(vp, v, T, HS, ld);
      for (int64_t r0 = 0; r0 < T; r0 += kQB) {
        const int64_t r1 = std::min(T, r0 + kQB);
        tile_gemm(r1 - r0, r1, HS, q + r0 * ld, ld, 1, kt, T, p + r0 * T, T, false);
        softmax_rows(p, r0, r1, T, s.scale);
        if (yh) tile_gemm(r1 - r0, HS, r1, p + r0 * T, T, 1, vp, HS, yh + r0 * C, C, acc_y);
      }
    }
  });
}

void attention_backward_tiles(const AttentionShape& s, const float* dy, const float* qkv, const float* probs,
                              float* dqkv, float* dprobs, bool acc, void* scratch, int threads) {
  const int64_t T = s.seq, HS = s.head_dim, C = s.channels(), G = s.group();
  const int64_t ld = s.qkv_channels();
  parallel_for(s.batch * s.kv(), 0, [&](int64_t first, int64_t last) {
    float* vt = thread_slice(scratch, s, threads);
    float *dyp = vt + operand_floats(s), *kp = dyp + operand_floats(s), *qp = kp + operand_floats(s);
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / s.kv(), j = task % s.kv();
      const float* row0 = qkv + b * T * ld;
      float* drow0 = dqkv + b * T * ld;
      float *dk = drow0 + s.k_col(j), *dv = drow0 + s.v_col(j);
      // k and v^T serve the whole group.
      pack_rows(kp, row0 + s.k_col(j), T, HS, ld);
      transpose_serial(vt, T, row0 + s.v_col(j), ld, T, HS);
      for (int64_t h = j * G; h < (j + 1) * G; ++h) {
        const int64_t i = b * s.heads + h;
        const float* p = probs + i * T * T;
        float* d = dprobs + i * T * T;
        float* dq = drow0 + s.q_col(h);
        // The group's first query head writes dk, dv as the mode says; the others add to them.
        const bool acc_kv = acc || h > j * G;
        pack_rows(dyp, dy + b * T * C + h * HS, T, HS, C);
        pack_rows(qp, row0 + s.q_col(h), T, HS, ld);
        // dV rows [j0, j1) = sum over queries t >= j0 of P[t][j] dy[t].
        for (int64_t j0 = 0; j0 < T; j0 += kQB) {
          const int64_t j1 = std::min(T, j0 + kQB);
          tile_gemm(j1 - j0, HS, T - j0, p + j0 * T + j0, 1, T, dyp + j0 * HS, HS, dv + j0 * ld, ld, acc_kv);
        }
        for (int64_t r0 = 0; r0 < T; r0 += kQB) {
          const int64_t r1 = std::min(T, r0 + kQB);
          tile_gemm(r1 - r0, r1, HS, dyp + r0 * HS, HS, 1, vt, T, d + r0 * T, T, false);
          softmax_backward_rows(p, d, r0, r1, T, s.scale);
          tile_gemm(r1 - r0, HS, r1, d + r0 * T, T, 1, kp, HS, dq + r0 * ld, ld, acc);
        }
        for (int64_t j0 = 0; j0 < T; j0 += kQB) {
          const int64_t j1 = std::min(T, j0 + kQB);
          tile_gemm(j1 - j0, HS, T - j0, d + j0 * T + j0, 1, T, qp + j0 * HS, HS, dk + j0 * ld, ld, acc_kv);
        }
      }
    }
  });
}

}  // namespace memfit
