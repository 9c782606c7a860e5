// Rotary position embedding (RoPE) over a fused qkv tensor (B, T, (H + 2*KV) * HS),
// row-major: each token row holds H query heads of HS values, then KV key heads, then KV
// value heads. Query and key heads are rotated, value heads copied unchanged.
#pragma once

#include <cstdint>

#include "graph/op.hpp"

namespace memfit {

// HF's inverse frequencies, inv_freq[i] for i < head_dim / 2, every step in float32 as
// transformers computes them: 1 / theta^(2i/HS), then the rope type's scaling (linear: / factor;
// llama3: wavelengths 2 pi / inv_freq above original/low_freq_factor divided by factor, below
// original/high_freq_factor kept, blended in between). Bit-equal to transformers' table.
void rope_inv_freq(float theta, int64_t head_dim, const RopeScaling& scaling, float* inv_freq);

// HF's rotate_half convention (Llama): for i < HS/2 the pair (x[i], x[i + HS/2]) of a head at
// position t (the token's index within its sequence, 0..T-1) becomes
//   (x[i] cos a - x[i + HS/2] sin a,  x[i + HS/2] cos a + x[i] sin a),  a = t * inv_freq[i],
// with the angle, cos and sin in fp32 as HF computes them. HS must be even and at most 512.
// Templates over float, bf16_t and fp16_t (half.hpp), computing in fp32 and rounding once.
// y may be x.
template <class T>
void rope_forward(const T* x, T* y, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  float theta, const RopeScaling& scaling = {});
// The inverse rotation (angle -a) of dy, the transpose of the forward; value heads pass
// through. dx may be dy.
template <class T>
void rope_backward(const T* dy, T* dx, int64_t B, int64_t T_, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   float theta, const RopeScaling& scaling = {});

}  // namespace memfit
