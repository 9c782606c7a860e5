// The ops the LLaMA family adds to GraphBuilder's vocabulary (declared in builder.hpp):
// token embedding without a position table, RMSNorm, rotary embedding and SwiGLU (the CPU
// kernels: kernels/cpu/rmsnorm, rope, swiglu, embedding).
//
// Subtle point: rope writes its output over its input (Op::inplace). The rotation is linear,
// so the backward needs no saved input, and the un-rotated qkv dies at rope: the pair is one
// buffer, as in implementations that rotate q and k in place.
#include "core/error.hpp"
#include "graph/builder.hpp"

namespace memfit {

TensorId GraphBuilder::token_embedding(const std::string& name, TensorId tokens, TensorId wte) {
  const Shape ts = p_.tensor(tokens).shape;  // copies: adding tensors may reallocate the table
  const int64_t C = p_.tensor(wte).shape[1];
  const TensorId x = activation_like(name, Shape{ts[0], ts[1], C}, {wte});
  if (!tp_.on()) {
    emit({OpKind::embedding_forward, name, {tokens, wte}, {x}, NoAttrs{}, double(ts.numel() * C)});
    return x;
  }
  const EmbeddingAttrs a{.vocab_begin = int64_t(tp_.index) * p_.tensor(wte).shape[0], .add_positions = false};
  emit({OpKind::embedding_forward, name + ".slice", {tokens, wte}, {x}, a, double(ts.numel() * C)});
  return tp_.sequence_on() ? scatter_rows(name + ".reduce_scatter", x) : tensor_all_reduce(name + ".all_reduce", x);
}

GraphBuilder::NormOut GraphBuilder::rmsnorm(const std::string& name, TensorId x, TensorId w, float eps) {
  const Shape s = p_.tensor(x).shape;
  NormOut out;
  out.y = activation_like(name + ".y", s, {x, w});
  out.rstd = activation_like(name + ".rstd", Shape{s.rows()}, {x});
  emit({OpKind::rmsnorm_forward, name, {x, w}, {out.y, out.rstd}, NormAttrs{eps}, 5.0 * double(s.numel())});
  return out;
}

TensorId GraphBuilder::rope(const std::string& name, TensorId qkv, const AttentionAttrs& a) {
  const Shape s = p_.tensor(qkv).shape;
  MEMFIT_ASSERT(s.last() == (a.heads + 2 * a.kv_heads) * a.head_dim, "rope {}: qkv {} does not hold {} + 2 x {} heads",
                name, s.to_string(), a.heads, a.kv_heads);
  const TensorId y = activation_like(name + ".y", s, {qkv});
  // Two products and a sum per rotated element (q and k heads).
  const double rotated = double(a.batch * a.seq) * double((a.heads + a.kv_heads) * a.head_dim);
  emit({OpKind::rope_forward, name, {qkv}, {y}, a, 3.0 * rotated, {}, {}, {{0, 0}}});
  return y;
}

TensorId GraphBuilder::swiglu(const std::string& name, TensorId gate, TensorId up) {
  const TensorId y = activation_like(name + ".y", p_.tensor(gate).shape, {gate, up});
  emit({OpKind::swiglu_forward, name, {gate, up}, {y}, NoAttrs{}, 6.0 * double(p_.tensor(gate).numel())});
  return y;
}

}  // namespace memfit
