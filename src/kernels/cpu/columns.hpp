// Column-block and dropout kernels (graph/op.hpp add_columns, slice_columns, dropout_*), over
// the storage types of half.hpp, arithmetic in fp32 with one rounding per stored element.
// Rows are split over threads; no pointer is __restrict, since y may be a (add_columns) and
// dx may be dy (dropout_backward): each element is read before it is written.
#pragma once

#include <cstdint>

#include "core/dropout_mask.hpp"

namespace memfit {

// y = a (y += a when acc), then y[:, begin:begin+width] += d.
template <class T>
void add_columns_forward(const T* a, const T* d, T* y, int64_t rows, int64_t cols, int64_t begin, int64_t width,
                         bool acc);
// y = x[:, begin:begin+width], or y += it when acc.
template <class T>
void slice_columns_forward(const T* x, T* y, int64_t rows, int64_t cols, int64_t begin, int64_t width, bool acc);
// y = x * keep / (1 - p) (y += that when acc); key from core/dropout_mask.hpp.
template <class T>
void dropout_apply(const T* x, T* y, int64_t n, float p, uint64_t key, const DropoutLayout& layout, bool acc);

}  // namespace memfit
