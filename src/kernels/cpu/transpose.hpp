// transpose: dst[cols, rows] = src[rows, cols]^T for packed row-major fp32, in cache-sized
// tiles split over threads. Used to stage a matmul operand in the layout oneDNN multiplies
// fastest (see matmul.cpp).
#pragma once

#include <cstdint>

namespace memfit {

// accumulate: dst += src^T instead of dst = src^T.
void transpose(float* dst, const float* src, int64_t rows, int64_t cols, bool accumulate = false);

}  // namespace memfit
