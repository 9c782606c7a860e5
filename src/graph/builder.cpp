#include "graph/builder.hpp"

#include "core/error.hpp"

namespace memfit {

TensorId GraphBuilder::parameter(std::string name, Shape shape, ParamInit init, float init_std, bool decay,
                                 TensorSplit split) {
  TensorDesc d;
  d.name = name;
  if (split.split()) {
    MEMFIT_ASSERT(split.global == shape, "parameter {}: split of {} for shape {}", name, split.global.to_string(),
                  shape.to_string());
    shape = local_shape(split);
  }
  d.shape = std::move(shape);
  d.category = Category::parameters;
  d.lifetime = Lifetime::persistent;
  d.requires_grad = true;
  d.layer = layer_;
  const TensorId id = p_.add_tensor(std::move(d));
  ParamEntry e;
  e.name = std::move(name);
  e.value = id;
  e.storage = {{ParamRole::value, id}};
  e.init = init;
  e.init_std = init_std;
  e.decay = decay;
  e.split = std::move(split);
  p_.params().push_back(std::move(e));
  return id;
}

TensorId GraphBuilder::persistent(std::string name, Shape shape, Category category, DType dtype) {
  TensorDesc d;
  d.name = std::move(name);
  d.shape = std::move(shape);
  d.dtype = dtype;
  d.category = category;
  d.lifetime = Lifetime::persistent;
  d.layer = layer_;
  return p_.add_tensor(std::move(d));
}

TensorId GraphBuilder::transient(std::string name, Shape shape, Category category, DType dtype) {
  TensorDesc d;
  d.name = std::move(name);
  d.shape = std::move(shape);
  d.dtype = dtype;
  d.category = category;
  d.lifetime = Lifetime::transient;
  d.layer = layer_;
  return p_.add_tensor(std::move(d));
}

int GraphBuilder::emit(OpSpec spec) {
  Op op;
  op.kind = spec.kind;
  op.phase = phase_;
  op.name = std::move(spec.name);
  op.layer = layer_;
  op.inputs = std::move(spec.inputs);
  op.outputs = std::move(spec.outputs);
  op.modes = std::move(spec.modes);
  op.workspace = std::move(spec.workspace);
  op.inplace = std::move(spec.inplace);
  op.attrs = std::move(spec.attrs);
  op.flops = spec.flops;
  op.comm_bytes = spec.comm_bytes;
  return p_.add_op(std::move(op));
}

TensorId GraphBuilder::activation_like(const std::string& name, Shape shape, std::initializer_list<TensorId> inputs) {
  const TensorId id = transient(name, std::move(shape), Category::activations);
  bool grad = false;
  for (TensorId in : inputs) grad = grad || (grad_enabled_ && p_.tensor(in).requires_grad);
  p_.tensor(id).requires_grad = grad;
  return id;
}

TensorId GraphBuilder::embedding(const std::string& name, TensorId tokens, TensorId wte, TensorId wpe) {
  const Shape ts = p_.tensor(tokens).shape;  // copies: adding tensors may reallocate the table
  const int64_t C = p_.tensor(wte).shape[1];
  const TensorId x = activation_like(name, Shape{ts[0], ts[1], C}, {wte, wpe});
  if (!tp_.on()) {
    emit({OpKind::embedding_forward, name, {tokens, wte, wpe}, {x}, NoAttrs{}, double(ts.numel() * C)});
    return x;
  }
  const EmbeddingAttrs a{.vocab_begin = int64_t(tp_.index) * p_.tensor(wte).shape[0], .add_positions = tp_.index == 0};
  emit({OpKind::embedding_forward, name + ".slice", {tokens, wte, wpe}, {x}, a, double(ts.numel() * C)});
  return tp_.sequence_on() ? scatter_rows(name + ".reduce_scatter", x) : tensor_all_reduce(name + ".all_reduce", x);
}

GraphBuilder::NormOut GraphBuilder::layernorm(const std::string& name, TensorId x, TensorId w, TensorId b, float eps) {
  const Shape s = p_.tensor(x).shape;  // copy: adding tensors may reallocate the table
  NormOut out;
  out.y = activation_like(name + ".y", s, {x, w, b});
  out.mean = activation_like(name + ".mean", Shape{s.rows()}, {x});
  out.rstd = activation_like(name + ".rstd", Shape{s.rows()}, {x});
  emit({OpKind::layernorm_forward, name, {x, w, b}, {out.y, out.mean, out.rstd}, NormAttrs{eps}, 8.0 * double(s.numel())});
  return out;
}

TensorId GraphBuilder::linear(const std::string& name, TensorId x, TensorId w, TensorId b) {
  const Shape xs = p_.tensor(x).shape;  // copies: adding tensors may reallocate the table
  const Shape ws = p_.tensor(w).shape;
  MEMFIT_ASSERT(ws.rank() == 2 && ws[1] == xs.last(), "linear {}: weight {} does not match input {}", name,
                ws.to_string(), xs.to_string());
  std::vector<int64_t> dims = xs.dims();
  dims.back() = ws[0];
  const TensorId y = activation_like(name + ".y", Shape(dims), {x, w});
  if (grad_enabled_ && b != kNoTensor && p_.tensor(b).requires_grad) p_.tensor(y).requires_grad = true;
  MatmulAttrs a;
  a.m = xs.rows();
  a.n = ws[0];
  a.k = ws[1];
  a.trans_b = true;
  std::vector<TensorId> inputs = {x, w};
  if (b != kNoTensor) inputs.push_back(b);
  emit({OpKind::matmul, name, std::move(inputs), {y}, a, 2.0 * double(a.m) * double(a.n) * double(a.k)});
  return y;
}

TensorId GraphBuilder::row_parallel_linear(const std::string& name, TensorId x, TensorId w, TensorId b) {
  if (!tp_.on()) return linear(name, x, w, b);
  const TensorId partial = linear(name + ".partial", x, w, kNoTensor);
  const TensorId y = tp_.sequence_on() ? scatter_rows(name + ".reduce_scatter", partial)
                                       : tensor_all_reduce(name + ".all_reduce", partial);
  return b == kNoTensor ? y : add_bias(name + ".bias", y, b);
}

void GraphBuilder::sum_grad_over_tensor_group(TensorId x) {
  if (tp_.on()) p_.tensor(x).grad_summed_over_tensor_group = true;
}

TensorId GraphBuilder::column_parallel_input(const std::string& name, TensorId x, const Shape& full) {
  if (tp_.sequence_on()) return gather_rows(name + ".all_gather", x, full);
  sum_grad_over_tensor_group(x);
  return x;
}

TensorId GraphBuilder::scatter_rows(const std::string& name, TensorId full) {
  const Shape s = p_.tensor(full).shape;
  const int64_t C = s.last(), rows = s.numel() / C;
  MEMFIT_CHECK(rows % tp_.parts == 0, "policy",
               "sequence parallelism splits the {} rows (batch x sequence) over {} tensor ranks: they do not divide",
               rows, tp_.parts);
  const TensorId y = activation_like(name + ".y", Shape{rows / tp_.parts, C}, {full});
  emit({OpKind::reduce_scatter, name, {full}, {y}, CollectiveAttrs{CommGroup::tensor, tp_.parts, false}, 0, {}, {}, {},
        ring_bytes(double(p_.tensor(full).bytes()), tp_.parts, 1.0)});
  return y;
}

TensorId GraphBuilder::gather_rows(const std::string& name, TensorId shard, const Shape& full) {
  const TensorId y = activation_like(name + ".y", full, {shard});
  emit({OpKind::all_gather, name, {shard}, {y}, CollectiveAttrs{CommGroup::tensor, tp_.parts, false}, 0, {}, {}, {},
        ring_bytes(double(p_.tensor(y).bytes()), tp_.parts, 1.0)});
  return y;
}

TensorId GraphBuilder::tensor_all_reduce(const std::string& name, TensorId x) {
  const TensorId y = activation_like(name + ".y", p_.tensor(x).shape, {x});
  const double bytes = ring_bytes(double(p_.tensor(x).bytes()), tp_.parts, 2.0);
  emit({OpKind::all_reduce, name, {x}, {y}, CollectiveAttrs{CommGroup::tensor, tp_.parts, false}, 0, {}, {},
        {{0, 0}}, bytes});
  return y;
}

TensorId GraphBuilder::add_bias(const std::string& name, TensorId x, TensorId b) {
  const TensorId y = activation_like(name + ".y", p_.tensor(x).shape, {x, b});
  emit({OpKind::add_bias, name, {x, b}, {y}, NoAttrs{}, double(p_.tensor(x).numel()), {}, {}, {{0, 0}}});
  return y;
}

GraphBuilder::ParallelLosses GraphBuilder::vocab_parallel_losses(const std::string& prefix, TensorId hidden,
                                                                 TensorId w, TensorId targets, const ClassifierAttrs& c) {
  MEMFIT_ASSERT(tp_.on() && c.parts == tp_.parts, "{}: a vocabulary-parallel classifier of {} parts on {} ranks", prefix,
                c.parts, tp_.parts);
  const int64_t N = c.rows, V = p_.tensor(w).shape[0], C = p_.tensor(w).shape[1];
  const TensorId stats = transient(prefix + "stats", Shape{N, 3}, Category::activations);
  const TensorId gathered = transient(prefix + "stats_gathered", Shape{tp_.parts, N, 3}, Category::activations);
  const TensorId chunk = transient(prefix + "logits_chunk", Shape{c.chunk_rows, V}, Category::temporaries);
  ParallelLosses out;
  out.losses = transient(prefix + "losses", Shape{N}, Category::activations);
  out.lse = transient(prefix + "lse", Shape{N}, Category::activations);
  emit({OpKind::classifier_partial, prefix + "partial", {hidden, w, targets}, {stats}, c,
        2.0 * double(N) * double(V) * double(C) + 3.0 * double(N) * double(V), {}, {chunk}});
  emit({OpKind::all_gather, prefix + "all_gather_stats", {stats}, {gathered},
        CollectiveAttrs{CommGroup::tensor, tp_.parts, false}, 0, {}, {}, {},
        ring_bytes(double(p_.tensor(gathered).bytes()), tp_.parts, 1.0)});
  emit({OpKind::classifier_combine, prefix + "combine", {gathered}, {out.losses, out.lse}, c,
        4.0 * double(N) * double(tp_.parts)});
  return out;
}

TensorId GraphBuilder::gelu(const std::string& name, TensorId x) {
  const TensorId y = activation_like(name + ".y", p_.tensor(x).shape, {x});
  emit({OpKind::gelu_forward, name, {x}, {y}, NoAttrs{}, 10.0 * double(p_.tensor(x).numel())});
  return y;
}

TensorId GraphBuilder::add(const std::string& name, TensorId a, TensorId b) {
  const TensorId y = activation_like(name, p_.tensor(a).shape, {a, b});
  emit({OpKind::add, name, {a, b}, {y}, NoAttrs{}, double(p_.tensor(a).numel()), {}, {}, {{0, 0}, {0, 1}}});
  return y;
}

GraphBuilder::AttentionOut GraphBuilder::attention(const std::string& name, TensorId qkv, const AttentionAttrs& a,
                                                   AttentionKind kind) {
  const int64_t C = a.heads * a.head_dim;
  AttentionOut out;
  out.y = activation_like(name + ".y", Shape{a.batch, a.seq, C}, {qkv});
  if (kind == AttentionKind::flash) {
    out.lse = activation_like(name + ".lse", Shape{a.batch, a.heads, a.seq}, {qkv});
    // Two products over the causal pairs only (tiles above the diagonal are never visited).
    const double pairs = double(a.batch * a.heads) * double(a.seq) * double(a.seq + 1) / 2;
    emit({OpKind::flash_attention_forward, name, {qkv}, {out.y, out.lse}, a,
          4.0 * pairs * double(a.head_dim) + 5.0 * pairs});
    return out;
  }
  out.probs = activation_like(name + ".probs", Shape{a.batch, a.heads, a.seq, a.seq}, {qkv});
  // Two batched products over the full T x T square (the causal half is masked, not skipped).
  const double flops = 4.0 * double(a.batch * a.heads) * double(a.seq * a.seq) * double(a.head_dim) +
                       5.0 * double(a.batch * a.heads * a.seq * a.seq);
  emit({OpKind::attention_forward, name, {qkv}, {out.y, out.probs}, a, flops});
  return out;
}

}  // namespace memfit
