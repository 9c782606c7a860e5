// Deterministic reductions: bias gradients (column sums) and the mean loss.
#pragma once

#include <cstdint>

namespace memfit {

// db[j] = sum over rows i of dy[i, j] (db += when acc), summed in double and rounded once.
// The result is bit-identical for any number of threads. T, G: float, bf16_t or fp16_t.
template <class T, class G>
void bias_grad(const T* dy, G* db, int64_t M, int64_t N, bool acc);
// loss = scale * sum(losses), summed in double (loss += when acc).
void loss_mean(const float* losses, float* loss, int64_t n, float scale, bool acc);

// Column-block width of the deterministic column reductions (bias_grad, layernorm and
// embedding backward): 64 floats, four cache lines per row, so each block is a handful of
// vector registers and blocks are independent of the thread count.
inline constexpr int64_t kColumnBlock = 64;
// Rows summed in float before their sum joins the double total.
inline constexpr int64_t kRowGroup = 16;

}  // namespace memfit
