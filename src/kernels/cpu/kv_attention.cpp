// Attention over a KV cache. Subtle point: the rotation must give the bits rope_forward gives
// (kernels/cpu/rope.cpp), so that a prefill and a training forward agree: the angle is
// float(position) * inv_freq in fp32 and cos/sin are taken of that float, as HF does.
#include "kernels/cpu/kv_attention.hpp"

#include <omp.h>

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {
namespace {

// x rotated at `pos` into out (fp32); x copied when inv_freq is null.
template <class T>
void rotate_row(const T* x, float* out, int64_t hs, int64_t pos, const float* inv_freq) {
  if (!inv_freq) {
    for (int64_t i = 0; i < hs; ++i) out[i] = widen(x[i]);
    return;
  }
  const int64_t half = hs / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = float(pos) * inv_freq[i];
    const float c = std::cos(a), s = std::sin(a);
    const float x0 = widen(x[i]), x1 = widen(x[i + half]);
    out[i] = x0 * c - x1 * s;
    out[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace

uint64_t kv_attention_scratch_bytes(const KvAttentionShape& s, int threads) {
  return uint64_t(std::max(threads, 1)) * uint64_t(std::max<int64_t>(s.capacity, 1)) * sizeof(float);
}

template <class T>
void kv_attention(const T* qkv, T* y, T* k_cache, T* v_cache, const KvAttentionShape& s, int64_t position,
                  const float* inv_freq, float* scratch, int threads) {
  const int64_t B = s.batch, Tn = s.tokens, NH = s.heads, KV = s.kv_heads, HS = s.head_dim, S = s.capacity;
  MEMFIT_CHECK(position >= 0 && position + Tn <= S, "kernels",
               "cached attention: positions [{}, {}) do not fit a cache of {} positions", position, position + Tn, S);
  MEMFIT_CHECK(HS > 0 && HS <= kKvMaxHeadDim && KV > 0 && NH % KV == 0, "kernels",
               "cached attention: head_dim {} (at most {}), heads {} over kv heads {}", HS, kKvMaxHeadDim, NH, KV);
  const int64_t row = (NH + 2 * KV) * HS, group = NH / KV;
  // 1. The new tokens' keys (rotated) and values into their cache rows.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t) {
      const T* r = qkv + (b * Tn + t) * row;
      const int64_t pos = position + t;
      for (int64_t g = 0; g < KV; ++g) {
        float k[kKvMaxHeadDim];
        rotate_row(r + (NH + g) * HS, k, HS, pos, inv_freq);
        T* kd = k_cache + ((b * KV + g) * S + pos) * HS;
        T* vd = v_cache + ((b * KV + g) * S + pos) * HS;
        const T* v = r + (NH + KV + g) * HS;
        for (int64_t i = 0; i < HS; ++i) kd[i] = narrow<T>(k[i]), vd[i] = v[i];
      }
    }
  // 2. One (batch, head, token) query per work item, each summed on one thread in a fixed order.
  const int64_t items = B * NH * Tn;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, (position + Tn) * HS));
  parallel_for(items, grain, [=](int64_t first, int64_t last) {
    const int thread = omp_get_thread_num();
    MEMFIT_CHECK(thread < threads, "kernels", "cached attention: thread {} beyond the {} its scratch was sized for",
                 thread, threads);
    float* scores = scratch + int64_t(thread) * S;
    for (int64_t it = first; it < last; ++it) {
      const int64_t t = it % Tn, h = (it / Tn) % NH, b = it / (Tn * NH), g = h / group;
      const int64_t pos = position + t;
      float q[kKvMaxHeadDim], acc[kKvMaxHeadDim];
      rotate_row(qkv + (b * Tn + t) * row + h * HS, q, HS, pos, inv_freq);
      const T* kc = k_cache + (b * KV + g) * S * HS;
      const T* vc = v_cache + (b * KV + g) * S * HS;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= pos; ++j) {
        const T* kj = kc + j * HS;
        float d = 0;
#pragma omp simd reduction(+ : d)
        for (int64_t i = 0; i < HS; ++i) d += q[i] * widen(kj[i]);
        scores[j] = d * s.scale;
        mx = std::max(mx, scores[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j <= pos; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
      for (int64_t i = 0; i < HS; ++i) acc[i] = 0;
      for (int64_t j = 0; j <= pos; ++j) {
        const T* vj = vc + j * HS;
        const float pj = scores[j];
#pragma omp simd
        for (int64_t i = 0; i < HS; ++i) acc[i] += pj * widen(vj[i]);
      }
      T* out = y + (b * Tn + t) * NH * HS + h * HS;
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < HS; ++i) out[i] = narrow<T>(acc[i] * inv);
    }
  });
}

template <class T>
void embedding_at(const int32_t* tokens, const T* wte, const T* wpe, T* x, int64_t B, int64_t T_, int64_t C,
                  int64_t vocab_rows, int64_t max_positions, int64_t position) {
  MEMFIT_CHECK(position >= 0 && position + T_ <= max_positions, "kernels",
               "embedding: positions [{}, {}) beyond the model's {} positions", position, position + T_, max_positions);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      const int32_t tok = tokens[b * T_ + t];
      MEMFIT_CHECK(tok >= 0 && tok < vocab_rows, "kernels", "embedding: token id {} outside [0, {})", tok, vocab_rows);
      const T* e = wte + int64_t(tok) * C;
      const T* w = wpe ? wpe + (position + t) * C : nullptr;
      T* out = x + (b * T_ + t) * C;
      for (int64_t c = 0; c < C; ++c) out[c] = w ? narrow<T>(widen(e[c]) + widen(w[c])) : e[c];
    }
}

#define MEMFIT_INSTANTIATE(T)                                                                               \
  template void kv_attention<T>(const T*, T*, T*, T*, const KvAttentionShape&, int64_t, const float*, float*, \
                                int);                                                                      \
  template void embedding_at<T>(const int32_t*, const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t,  \
                                int64_t, int64_t);
MEMFIT_INSTANTIATE(float)
MEMFIT_INSTANTIATE(bf16_t)
MEMFIT_INSTANTIATE(fp16_t)
#undef MEMFIT_INSTANTIATE

}  // namespace memfit
