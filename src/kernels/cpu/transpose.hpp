// transpose: dst = src^T for fp32 matrices, with AVX-512 16 x 16 register transposes where
// whole blocks fit and element copies at the edges. Used to stage a matmul operand in the
// layout oneDNN multiplies fastest (matmul.cpp) and to lay out attention's k^T and v^T per
// head (attention_tiles.cpp).
#pragma once

#include <cstdint>

namespace memfit {

// On the calling thread: dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols.
void transpose_serial(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols);

// dst[cols, rows] = src[rows, cols]^T for packed matrices, tiles split over the OpenMP threads.
void transpose(float* dst, const float* src, int64_t rows, int64_t cols);

}  // namespace memfit
