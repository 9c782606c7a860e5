// Elementwise kernels: add, add_bias, accumulate, fill. Each output may alias an input (y = a + b with
// y == a), which is why no pointer is __restrict: every element is read before the same
// index is written, so aliasing is harmless.
#pragma once

#include <cstdint>

namespace memfit {

// Templates over the storage types of half.hpp (float, bf16_t, fp16_t), instantiated in
// elementwise.cpp; arithmetic in fp32, one rounding per stored element.
// y = a + b, or y += a + b when acc.
template <class T>
void add_forward(const T* a, const T* b, T* y, int64_t n, bool acc);
// y[r] = x[r] + bias for each of the rows (y += that when acc); y may be x.
template <class T>
void add_bias_forward(const T* x, const T* bias, T* y, int64_t rows, int64_t cols, bool acc);
// y = x, or y += x when acc. x and y may have different types: this is also the cast op's
// kernel (every pair of float, bf16_t and fp16_t is instantiated).
template <class X, class Y>
void accumulate_forward(const X* x, Y* y, int64_t n, bool acc);
// x = value, or x += value when acc.
void fill_forward(float* x, int64_t n, float value, bool acc);

}  // namespace memfit
