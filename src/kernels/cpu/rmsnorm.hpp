// RMSNorm over the last dim of an (N, C) tensor, forward and backward (HF LlamaRMSNorm: no
// mean subtraction, no bias).
#pragma once

#include <cstdint>

namespace memfit {

// Templates over the storage type T of x, w, y, dy, dx and G of dw (float, bf16_t, fp16_t;
// half.hpp). rstd is fp32 whatever T is, and every sum runs in fp32 (double for dw).

// rstd = 1 / sqrt(mean(x^2) + eps) per row (saved for the backward; may be nullptr);
// y = narrow<T>(x * rstd) * w, the product rounded again: HF multiplies the weight by the
// normalised row after casting it back to the input dtype. For fp32, y = x * rstd * w.
// y may be x.
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, float* rstd, int64_t N, int64_t C, float eps);

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd;
// dw = sum over rows of dy * narrow<T>(xhat), the value the forward multiplied w by. Each
// output has its own accumulate flag and may be nullptr. dx may be dy. dx and dw are
// bit-identical for any thread count and buffer alignment.
template <class T, class G>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const float* rstd, T* dx, G* dw, int64_t N, int64_t C,
                      bool acc_dx, bool acc_dw);

}  // namespace memfit
