// GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its backward.
#pragma once

#include <cstdint>

namespace memfit {

// Templates over float, bf16_t and fp16_t (half.hpp), computing in fp32.
// y = gelu(x) (or y += when acc); y may be x.
template <class T>
void gelu_forward(const T* x, T* y, int64_t n, bool acc);
// dx = dy * gelu'(x) (or dx += when acc); dx may be dy (in place).
template <class T>
void gelu_backward(const T* dy, const T* x, T* dx, int64_t n, bool acc);

}  // namespace memfit
