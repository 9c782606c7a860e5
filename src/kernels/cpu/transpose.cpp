#include "kernels/cpu/transpose.hpp"

#include <algorithm>

#include "kernels/cpu/parallel.hpp"

namespace memfit {

void transpose(float* dst, const float* src, int64_t rows, int64_t cols, bool accumulate) {
  // Tiles of 32 x 32 floats: each reads 32 cache lines and writes 32, all resident in L1.
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  parallel_for(row_tiles * col_tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = (t / col_tiles) * kTile, c0 = (t % col_tiles) * kTile;
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      if (accumulate) {
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] += src[r * cols + c];
      } else {
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
      }
    }
  });
}

}  // namespace memfit
