// What the flash attention kernels share (flash_attention.cpp: any storage type, fp32 tiles;
// flash_attention_bf16.cpp: bf16 storage, bf16 tile operands with fp32 sums): the geometry of
// a call, the carving of a thread's scratch, and the bf16 tasks' entry points and scratch
// sizes. Internal to the two files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/half.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/flash_attention.hpp"

namespace memfit::flash {

inline constexpr int64_t kB = kFlashBlock;

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Carves one thread's scratch into arrays of fp32 (or 32-bit words), each 64-byte aligned.
class Carver {
 public:
  explicit Carver(float* base) : p_(base) {}
  float* take(int64_t n) {
    float* out = p_;
    p_ += round_up(n, 16);
    return out;
  }
  uint32_t* take_words(int64_t n) { return reinterpret_cast<uint32_t*>(take(n)); }
  int64_t used(const float* base) const { return p_ - base; }

 private:
  float* p_;
};

// C: the channels of y and dy. W: the row of qkv and dqkv, (NH + 2KV) HS; the columns of the
// heads within it come from the shape (AttentionShape::q_col, k_col, v_col).
struct Geometry {
  AttentionShape shape;
  int64_t B, T, NH, KV, G, HS, C, W, blocks;
  float scale;
  explicit Geometry(const AttentionShape& s)
      : shape(s), B(s.batch), T(s.seq), NH(s.heads), KV(s.kv()), G(s.group()), HS(s.head_dim), C(s.channels()),
        W(s.qkv_channels()), blocks((s.seq + kB - 1) / kB), scale(s.scale) {}
  int64_t size(int64_t block) const { return std::min(kB, T - block * kB); }
};

// dst = scale src (or dst += scale src), n values, rounded once to the storage type.
template <class T>
void store_row(T* dst, const float* src, int64_t n, float scale, bool accumulate) {
  if constexpr (std::is_same_v<T, float>) {
    if (accumulate) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i] * scale;
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = narrow<T>(accumulate ? widen(dst[i]) + src[i] * scale : src[i] * scale);
  }
}

// The backward's stores: key block k0's dk and dv (bc rows) of kv head j of batch b, and each
// query head of its group's dq (rows of dq_stride floats apart in dq_all).
template <class T>
void store_kv_grads(const Geometry& g, T* dqkv, int64_t b, int64_t j, int64_t k0, int64_t bc, const float* dk,
                    const float* dv, bool accumulate) {
  T* dkb = dqkv + (b * g.T + k0) * g.W + g.shape.k_col(j);
  T* dvb = dqkv + (b * g.T + k0) * g.W + g.shape.v_col(j);
  for (int64_t r = 0; r < bc; ++r) {
    store_row(dkb + r * g.W, dk + r * g.HS, g.HS, 1.0f, accumulate);
    store_row(dvb + r * g.W, dv + r * g.HS, g.HS, 1.0f, accumulate);
  }
}
template <class T>
void store_q_grads(const Geometry& g, T* dqkv, int64_t b, int64_t j, const float* dq_all, int64_t dq_stride,
                   bool accumulate) {
  for (int64_t i = 0; i < g.G; ++i) {
    T* dqb = dqkv + b * g.T * g.W + g.shape.q_col(j * g.G + i);
    const float* dq = dq_all + i * dq_stride;
    for (int64_t t = 0; t < g.T; ++t) store_row(dqb + t * g.W, dq + t * g.HS, g.HS, 1.0f, accumulate);
  }
}

#if defined(__AVX512BF16__)
// Per-thread scratch in floats of the bf16 tasks (they assert it).
int64_t bf16_forward_floats(int64_t HS);
int64_t bf16_backward_floats(int64_t T, int64_t HS, int64_t G);

// The tasks of flash_attention.cpp's split (one query block of one head; one kv head with its
// group of query heads), on bf16 operands.
void bf16_forward_task(const Geometry& g, const bf16_t* qkv, bf16_t* y, float* lse, int64_t bh, int64_t qi, float* ws);
void bf16_backward_task(const Geometry& g, const bf16_t* dy, const bf16_t* qkv, const bf16_t* y, const float* lse,
                        bf16_t* dqkv, bool accumulate, int64_t bkv, float* ws);
#endif

}  // namespace memfit::flash
