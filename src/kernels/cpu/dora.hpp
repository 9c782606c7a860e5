// DoRA's kernels (graph/op.hpp dora_norm, dora_scale, dora_scale_backward): storage of any
// float type, arithmetic in fp32 per element and sums in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.hpp"
#include "kernels/quant/quant_format.hpp"

namespace memfit {

// A vector of any float type read element by element: DoRA's per-column magnitudes, norms and
// biases, next to [rows, cols] tensors of another type.
struct AnyFloats {
  const void* data = nullptr;
  DType dtype = DType::f32;
  float operator[](int64_t i) const;
};

// One adapter's column block of the scaled product: its magnitude m and norm, and (backward)
// where its gradient dm goes.
struct DoraBlock {
  int64_t begin = 0, width = 0;
  AnyFloats m, norm;
  void* dm = nullptr;
  DType dm_dtype = DType::f32;
  bool dm_accumulate = false;
  // dora_blend: the block's p and q [rows, width] (the op's T); z = p + q, which the forward
  // writes (maybe over p) and the backward reads; the backward's gradients of p and q.
  const void* p = nullptr;
  const void* q = nullptr;
  void* z_out = nullptr;
  const void* z = nullptr;
  void* dp = nullptr;
  void* dq = nullptr;
  bool dp_accumulate = false, dq_accumulate = false;
};

// norm[j] = || W[row_begin + j, :] + scale (B A)[j, :] ||, W [*, k], A [rank, k], B [rows, rank].
template <class T>
void dora_norm_rows(const T* w, const T* a, const T* b, float* norm, int64_t k, int64_t row_begin, int64_t rows,
                    int64_t rank, float scale);

// The same over a quantised W given as its pieces (QDoRA): each row dequantised a piece at a
// time, rounded to `weight` (f32, bf16 or f16: what the quantised product multiplies by).
template <class T>
void dora_norm_rows_quantized(std::span<const QuantizedWeight> pieces, DType weight, const T* a, const T* b,
                              float* norm, int64_t k, int64_t row_begin, int64_t rows, int64_t rank, float scale);

template <class T>
void dora_scale_forward(const T* z, const std::vector<DoraBlock>& blocks, AnyFloats bias, T* y, int64_t m, int64_t n,
                        bool acc);

// A trained bias's gradient, dora_scale_backward's last output (no data: the bias is frozen).
struct BiasGradient {
  void* data = nullptr;
  DType dtype = DType::f32;
  bool accumulate = false;
};

// dz (+)= dy scaled in the blocks; dm per block; db (+)= column sums of dy (1 - m / norm) in the
// blocks, 0 elsewhere.
template <class T>
void dora_scale_backward(const T* dy, const T* z, const std::vector<DoraBlock>& blocks, AnyFloats bias, T* dz,
                         int64_t m, int64_t n, bool dz_acc, const BiasGradient& db);

// DoRA with dropout: y (+)= y0, and in each block (m / norm - 1) p + (m / norm) q as well;
// z = p + q (z may be p).
template <class T>
void dora_blend_forward(const T* y0, const std::vector<DoraBlock>& blocks, T* y, int64_t m, int64_t n, bool acc);

// dp (+)= dy (m / norm - 1), dq (+)= dy m / norm, dm (+)= column sums of dy z / norm, per block;
// a null dp or dq is not wanted.
template <class T>
void dora_blend_backward(const T* dy, const std::vector<DoraBlock>& blocks, int64_t m, int64_t n);

}  // namespace memfit
