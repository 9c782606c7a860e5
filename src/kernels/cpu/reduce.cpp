// Column sums and the loss sum. The one subtle point is determinism: threads split the
// columns into fixed blocks, never the rows, and each block sums its rows in order, so the
// result does not depend on how many threads run (and no atomics or per-thread buffers are
// needed). Each group of kRowGroup rows is summed in float, the group sums in double: a
// gradient over B*T rows loses no digits that way, and the float lanes run at twice the
// width of a double accumulation.
#include "kernels/cpu/reduce.hpp"

#include <algorithm>

#include "core/half.hpp"
#include "kernels/cpu/column_sums.hpp"
#include "kernels/cpu/parallel.hpp"

namespace memfit {

template <class T, class G>
void bias_grad(const T* dy, G* db, int64_t M, int64_t N, bool acc) {
  column_sums<1>(M, N, std::array<G*, 1>{db}, {acc}, [=](int64_t i, int64_t c0, int64_t w, float (*part)[kColumnBlock]) {
    const T* row = dy + i * N + c0;
#pragma omp simd
    for (int64_t c = 0; c < w; ++c) part[0][c] += widen(row[c]);
  });
}

template void bias_grad<float, float>(const float*, float*, int64_t, int64_t, bool);
template void bias_grad<bf16_t, float>(const bf16_t*, float*, int64_t, int64_t, bool);
template void bias_grad<bf16_t, bf16_t>(const bf16_t*, bf16_t*, int64_t, int64_t, bool);
template void bias_grad<fp16_t, float>(const fp16_t*, float*, int64_t, int64_t, bool);
template void bias_grad<fp16_t, fp16_t>(const fp16_t*, fp16_t*, int64_t, int64_t, bool);

void loss_mean(const float* losses, float* loss, int64_t n, float scale, bool acc) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(losses[i]);
  const double value = double(scale) * sum;
  *loss = acc ? float(double(*loss) + value) : float(value);
}

}  // namespace memfit
