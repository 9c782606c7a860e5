// LayerNorm over the last dim of an (N, C) tensor, forward and backward (PyTorch formulas,
// biased variance).
#pragma once

#include <cstdint>

namespace memfit {

// Templates over the storage type T of x, w, b, y, dy, dx and G of dw, db (float, bf16_t,
// fp16_t; half.hpp). The statistics mean and rstd are fp32 whatever T is, and every sum runs
// in fp32 (double for dw, db).

// y = (x - mean) * rstd * w + b per row; mean and rstd (N each) are saved for the backward
// and may be nullptr. y may be x.
template <class T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t N, int64_t C,
                       float eps);

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, xhat = (x - mean) * rstd;
// dw = sum over rows of dy * xhat; db = sum over rows of dy. Each output has its own
// accumulate flag and may be nullptr. dx may be dy. dw and db are bit-identical for any
// thread count.
template <class T, class G>
void layernorm_backward(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, G* dw, G* db,
                        int64_t N, int64_t C, bool acc_dx, bool acc_dw, bool acc_db);

}  // namespace memfit
