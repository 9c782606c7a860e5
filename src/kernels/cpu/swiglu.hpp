// SwiGLU, the gated activation of the LLaMA MLP: y = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)), elementwise, and its backward.
#pragma once

#include <cstdint>

namespace memfit {

// Templates over float, bf16_t and fp16_t (half.hpp), computing in fp32 and rounding once.
// y may be gate or up.
template <class T>
void swiglu_forward(const T* gate, const T* up, T* y, int64_t n);
// dgate = dy * up * silu'(gate), dup = dy * silu(gate) (or += when the output's acc flag is
// set); either may be nullptr. dgate may be dy (in place): both outputs of an element are
// computed before either is written.
template <class T>
void swiglu_backward(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n, bool acc_dgate,
                     bool acc_dup);

}  // namespace memfit
