// Generation kernels over a KV cache (graph/op.hpp: embedding_at, cached_attention). A run
// covers T new tokens at positions p .. p+T-1 of their sequence, p read at run time
// (StepContext::position): prefill is one run with p = 0 and T = prompt, each decode step a run
// with T = 1. The caches are (B, KV, S, HS): one contiguous row of HS values per position, so a
// query's scores are dot products along consecutive rows.
#pragma once

#include <cstdint>

namespace memfit {

struct KvAttentionShape {
  int64_t batch = 0, tokens = 0, heads = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  float scale = 0;
};
inline constexpr int64_t kKvMaxHeadDim = 512;

// fp32 scratch the kernel needs: a row of `capacity` scores per thread.
uint64_t kv_attention_scratch_bytes(const KvAttentionShape& s, int threads);

// qkv (B, T, (NH + 2KV) HS) as rope.hpp lays it out; y (B, T, NH HS). Stores the tokens' k
// (rotated when inv_freq is given: HF's rotate_half at the token's position, angles in fp32)
// and v into rows [p, p+T) of the caches, then writes the causal attention of each (rotated)
// query over rows [0, p+t]; query head h reads kv head h / (NH / KV). Scores, softmax and the
// weighted sum in fp32, each output rounded once. `scratch` holds kv_attention_scratch_bytes
// for `threads` threads (at least the OpenMP threads that run it). Throws [kernels] when
// p + T > S. Templates over float, bf16_t and fp16_t.
template <class T>
void kv_attention(const T* qkv, T* y, T* k_cache, T* v_cache, const KvAttentionShape& s, int64_t position,
                  const float* inv_freq, float* scratch, int threads);

// x[b, t] = wte[tokens[b, t]] + wpe[p + t] (wpe may be null: rotary models). Throws [kernels]
// when p + T > max_positions or a token is outside [0, vocab_rows).
template <class T>
void embedding_at(const int32_t* tokens, const T* wte, const T* wpe, T* x, int64_t B, int64_t T_, int64_t C,
                  int64_t vocab_rows, int64_t max_positions, int64_t position);

}  // namespace memfit
