// classifier_combine (see classifier_parallel.hpp): a few flops per row, so rows go in
// parallel and each row's parts are summed in rank order (the same bits for any thread count).
#include "kernels/cpu/classifier_parallel.hpp"

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {

void classifier_combine(const float* stats, float* losses, float* lse, int parts, int64_t rows) {
  parallel_for(rows, kParallelGrain / (4 * parts), [=](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      // A part whose slice has no real column (s = 0, m = -inf) takes no part in the max.
      double mx = -std::numeric_limits<double>::infinity(), target = 0;
      for (int r = 0; r < parts; ++r) {
        const float* st = stats + (r * rows + n) * 3;
        if (st[1] > 0.0f && double(st[0]) > mx) mx = double(st[0]);
        target += double(st[2]);
      }
      double sum = 0;
      for (int r = 0; r < parts; ++r) {
        const float* st = stats + (r * rows + n) * 3;
        if (st[1] > 0.0f) sum += double(st[1]) * std::exp(double(st[0]) - mx);
      }
      MEMFIT_ASSERT(sum > 0, "classifier_combine: row {} has no real column in any of {} parts", n, parts);
      const double row_lse = mx + std::log(sum);
      if (lse) lse[n] = float(row_lse);
      if (losses) losses[n] = float(row_lse - target);
    }
  });
}

}  // namespace memfit
