// Elementwise kernels: add, accumulate, fill. Each output may alias an input (y = a + b with
// y == a), which is why no pointer is __restrict: every element is read before the same
// index is written, so aliasing is harmless.
#pragma once

#include <cstdint>

namespace memfit {

// y = a + b, or y += a + b when acc.
void add_forward(const float* a, const float* b, float* y, int64_t n, bool acc);
// y = x, or y += x when acc.
void accumulate_forward(const float* x, float* y, int64_t n, bool acc);
// x = value, or x += value when acc.
void fill_forward(float* x, int64_t n, float value, bool acc);

}  // namespace memfit
