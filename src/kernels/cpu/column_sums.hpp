// column_sums: the one deterministic column reduction of the CPU kernels (bias gradients,
// layernorm's and RMSNorm's parameter gradients). out_k[c] (+)= sum over rows n of a value
// the kernel computes per (row, column), for K outputs at once.
//
// Why this shape: a parameter gradient must not depend on the thread count, so threads own
// whole blocks of kColumnBlock columns (never rows) and every block walks all rows in order.
// Each group of kRowGroup rows is summed in float, the group sums in double: a double
// reduction over a whole column halves the vector width, and float over a long column loses
// digits. A header, because add_row is a lambda the compiler must inline and vectorize.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/half.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/reduce.hpp"

namespace memfit {

// add_row(n, c0, width, part) adds row n's values for columns [c0, c0 + width) into
// part[k][0 .. width) for each output k. A null out[k] is skipped (its sums are still made).
template <int K, class G, class AddRow>
void column_sums(int64_t rows, int64_t cols, const std::array<G*, K>& out, const std::array<bool, K>& acc,
                 const AddRow& add_row) {
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  parallel_for(blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t blk = first; blk < last; ++blk) {
      const int64_t c0 = blk * kColumnBlock, width = std::min(kColumnBlock, cols - c0);
      double sum[K][kColumnBlock] = {};
      for (int64_t n0 = 0; n0 < rows; n0 += kRowGroup) {
        const int64_t n1 = std::min(rows, n0 + kRowGroup);
        float part[K][kColumnBlock] = {};
        for (int64_t n = n0; n < n1; ++n) add_row(n, c0, width, part);
        for (int k = 0; k < K; ++k)
#pragma omp simd
          for (int64_t c = 0; c < width; ++c) sum[k][c] += double(part[k][c]);
      }
      for (int k = 0; k < K; ++k) {
        G* o = out[size_t(k)];
        if (!o) continue;
        for (int64_t c = 0; c < width; ++c)
          o[c0 + c] = narrow<G>(acc[size_t(k)] ? float(double(widen(o[c0 + c])) + sum[k][c]) : float(sum[k][c]));
      }
    }
  });
}

}  // namespace memfit
