// Naive reference kernels of the generation kinds (graph/op.hpp: embedding_at,
// cached_attention), same conventions as reference.hpp: plain loops, double arithmetic,
// allocation allowed. The rotation is reference_llama's rope (angles in double), applied to a
// sequence holding the token at its position, so it shares nothing with the CPU kernel.
#pragma once

#include <cstdint>

#include "graph/op.hpp"

namespace memfit::ref {

// x[b, t] = wte[tokens[b, t]] + wpe[position + t] (wpe may be nullptr).
template <class F>
void embedding_at(const int32_t* tokens, const F* wte, const F* wpe, F* x, int64_t B, int64_t T, int64_t C,
                  int64_t position);

// As kernels/cpu/kv_attention.hpp's kv_attention: caches (B, KV, S, HS), the T tokens at
// positions [position, position + T), rope when `rope` (attrs.attn's theta and scaling).
template <class F>
void cached_attention(const F* qkv, F* y, F* k_cache, F* v_cache, const CachedAttentionAttrs& attrs, bool rope,
                      int64_t position);

}  // namespace memfit::ref
