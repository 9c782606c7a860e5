// LayerNorm over the last dim of an (N, C) tensor, forward and backward (PyTorch formulas,
// biased variance).
#pragma once

#include <cstdint>

namespace memfit {

// y = (x - mean) * rstd * w + b per row; mean and rstd (N each) are saved for the backward
// and may be nullptr. y may be x.
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps);

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, xhat = (x - mean) * rstd;
// dw = sum over rows of dy * xhat; db = sum over rows of dy. Each output has its own
// accumulate flag and may be nullptr. dx may be dy. dw and db are bit-identical for any
// thread count.
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, int64_t N, int64_t C, bool acc_dx, bool acc_dw, bool acc_db);

}  // namespace memfit
