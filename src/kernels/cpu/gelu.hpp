// GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its backward.
#pragma once

#include <cstdint>

namespace memfit {

// y = gelu(x) (or y += when acc); y may be x.
void gelu_forward(const float* x, float* y, int64_t n, bool acc);
// dx = dy * gelu'(x) (or dx += when acc); dx may be dy (in place).
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, bool acc);

}  // namespace memfit
