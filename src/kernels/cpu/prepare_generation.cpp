// CPU prepare functions of the generation kinds (embedding_at, cached_attention): any float
// storage, fp32 arithmetic; the position comes from StepContext at run time.
#include <omp.h>

#include <array>
#include <limits>

#include "kernels/cpu/cpu_prepare.hpp"
#include "kernels/cpu/kv_attention.hpp"
#include "kernels/cpu/rope.hpp"

namespace memfit::cpu {
namespace {

KvAttentionShape kv_shape(const CachedAttentionAttrs& a) {
  const AttentionAttrs& at = a.attn;
  return {at.batch, at.seq, at.heads, at.kv_heads > 0 ? at.kv_heads : at.heads, at.head_dim, a.capacity, at.scale};
}

}  // namespace

uint64_t cached_attention_scratch_bytes(const Op& op) {
  return kv_attention_scratch_bytes(kv_shape(attrs_of<CachedAttentionAttrs>(op)), omp_get_max_threads());
}

Prepared prepare_cached_attention(const Program& p, const Op& op, const OpBinding& b) {
  const CachedAttentionAttrs a = attrs_of<CachedAttentionAttrs>(op);
  const KvAttentionShape s = kv_shape(a);
  const int threads = omp_get_max_threads();
  std::array<float, kKvMaxHeadDim / 2> inv_freq{};
  if (a.rope) rope_inv_freq(a.attn.rope_theta, a.attn.head_dim, a.attn.rope_scaling, inv_freq.data());
  float* scratch = static_cast<float*>(scratch_of(p, op, b));
  MEMFIT_CHECK(scratch, "kernels", "op '{}' needs its library scratch", op.name);
  Prepared out;
  dispatch_t(op, p.tensor(op.inputs[0]).dtype, [&](auto t) {
    using T = decltype(t);
    out = make_op([=, qkv = in_t<T>(b, 0), y = out_t<T>(b, 0), kc = out_t<T>(b, 1), vc = out_t<T>(b, 2),
                   rope = a.rope](const StepContext& ctx) {
      kv_attention(qkv, y, kc, vc, s, ctx.position, rope ? inv_freq.data() : nullptr, scratch, threads);
    });
  });
  return out;
}

Prepared prepare_embedding_at(const Program& p, const Op& op, const OpBinding& b) {
  const TensorDesc& tokens = p.tensor(op.inputs[0]);
  const TensorDesc& wte = p.tensor(op.inputs[1]);
  const int64_t B = tokens.numel() / tokens.shape.last(), T = tokens.shape.last(), C = wte.shape.last();
  const int64_t rows = wte.shape.rows();
  const bool has_wpe = op.inputs.size() == 3;
  const int64_t max_positions = has_wpe ? p.tensor(op.inputs[2]).shape.rows() : std::numeric_limits<int64_t>::max() / 2;
  Prepared out;
  dispatch_t(op, wte.dtype, [&](auto t) {
    using T_ = decltype(t);
    out = make_op([=, tok = in_i(b, 0), e = in_t<T_>(b, 1), w = has_wpe ? in_t<T_>(b, 2) : nullptr,
                   x = out_t<T_>(b, 0)](const StepContext& ctx) {
      embedding_at(tok, e, w, x, B, T, C, rows, max_positions, ctx.position);
    });
  });
  return out;
}

}  // namespace memfit::cpu
