// Naive reference kernels for the LLaMA ops (RMSNorm, SwiGLU, RoPE): the oracle the CPU
// kernels in kernels/cpu/{rmsnorm,swiglu,rope} are tested against. Same conventions as
// reference.hpp: plain loops, double arithmetic whatever F is, no OpenMP, instantiated for
// float and double (the double instances feed the finite-difference checks).
//
// Subtle point: these compute the exact functions, with no intermediate rounding to the
// storage type and RoPE's angles in double; the kernels' deliberate roundings (HF's fp32
// angles, its cast of the normalised row before the weight product) are what the tests'
// tolerances account for.
#pragma once

#include <cstdint>

#include "graph/op.hpp"

namespace memfit::ref {

// y = x * rstd * w per row with rstd = 1 / sqrt(mean(x^2) + eps); rstd may be nullptr.
template <class F>
void rmsnorm_forward(const F* x, const F* w, F* y, F* rstd, int64_t N, int64_t C, double eps);
// dx = rstd * (dy*w - xhat * mean(dy*w*xhat)), xhat = x * rstd; dw = sum over rows of
// dy * xhat. dx or dw may be nullptr.
template <class F>
void rmsnorm_backward(const F* dy, const F* x, const F* w, const F* rstd, F* dx, F* dw, int64_t N, int64_t C,
                      bool acc_dx, bool acc_dw);

// y = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
template <class F>
void swiglu_forward(const F* gate, const F* up, F* y, int64_t n);
// dgate = dy * up * silu'(gate), dup = dy * silu(gate); either may be nullptr.
template <class F>
void swiglu_backward(const F* dy, const F* gate, const F* up, F* dgate, F* dup, int64_t n, bool acc_dgate,
                     bool acc_dup);

// RoPE over qkv (B, T, (H + 2*KV) * HS) as in kernels/cpu/rope.hpp, angles
// a = t * theta^(-2i/HS) in double, scaled as Meta's Llama 3.1 code scales it; backward rotates by -a. Out of place only.
template <class F>
void rope_forward(const F* x, F* y, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  double theta, const RopeScaling& scaling = {});
template <class F>
void rope_backward(const F* dy, F* dx, int64_t B, int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   double theta, const RopeScaling& scaling = {});

}  // namespace memfit::ref
