// ZeRO's shard arithmetic (see zero.hpp): buckets, padding, each rank's piece of a
// parameter, and the bytes a program's collectives send. Kept apart from the pass so that
// the layout can be read (and tested) on its own.
#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.hpp"
#include "graph/optimizer.hpp"
#include "graph/zero.hpp"
#include "graph/zero_parts.hpp"

namespace memfit {

std::pair<int64_t, int64_t> ZeroLayout::piece(const ZeroBucket& b, int64_t offset, int64_t numel) const {
  const int64_t lo = int64_t(rank) * shard(b), hi = lo + shard(b);
  const int64_t first = std::max(lo, offset), last = std::min(hi, offset + numel);
  if (first >= last) return {0, 0};
  return {first - offset, last - first};
}

int64_t ZeroLayout::padded_elements() const {
  int64_t n = 0;
  for (const ZeroBucket& b : buckets) n += b.elements;
  return n;
}

ZeroLayout zero_layout(const Program& p, const Policy& policy, const Topology& topo) {
  MEMFIT_CHECK(topo.data >= 1 && topo.tensor >= 1 && topo.rank >= 0 && topo.rank < topo.world(), "policy",
               "rank {} of a world of {} x {} ranks (data x tensor)", topo.rank, topo.data, topo.tensor);
  MEMFIT_CHECK(policy.zero_stage >= 0 && policy.zero_stage <= 3, "policy", "ZeRO stage must be 0..3 (got {})",
               policy.zero_stage);
  MEMFIT_CHECK(!policy.zero_quantized_weights || policy.zero_stage == 3, "policy",
               "zero_quantized_weights (ZeRO++ qwZ) quantises stage 3's parameter gathers: it needs ZeRO stage 3, "
               "not {}", policy.zero_stage);
  MEMFIT_CHECK(!policy.zero_quantized_weights || policy.offload_params == Tier::device, "policy",
               "zero_quantized_weights with offloaded parameters is not supported yet");
  ZeroLayout L;
  L.world_size = topo.data;
  L.rank = topo.data_rank();
  // qwZ: every shard holds whole int8 blocks, so each rank codes only its own elements.
  // qgZ: likewise, every shard holds whole blocks of its gradient wire.
  L.align = policy.optimizer == OptimizerKind::adamw8bit || policy.zero_quantized_weights ||
                    policy.zero_quantized_gradients
                ? kQuantBlock
                : 32;
  static_assert(kQwzBlock == kQuantBlock);
  // Frozen parameters get buckets of their own (their values are laid out without gradients,
  // so a trainable bucket's value and gradient offsets stay equal), and only at stage 3: below
  // it every rank keeps them whole, outside the buckets, and no collective touches them.
  // Parameters stored as several tensors (a quantised base) go into buckets of bytes.
  std::map<std::tuple<int, bool, bool>, size_t> bucket_of_layer;
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ParamEntry& e = p.params()[i];
    if (e.frozen() && policy.zero_stage < 3) continue;
    const bool bytes = !e.plain_storage();
    MEMFIT_ASSERT(!bytes || e.frozen(), "trainable parameter '{}' stored as {} tensors", e.name, e.storage.size());
    const int layer = p.tensor(e.storage[0].id).layer;
    auto [it, fresh] = bucket_of_layer.emplace(std::tuple{layer, e.frozen(), bytes}, L.buckets.size());
    if (fresh) {
      ZeroBucket b;
      b.layer = layer;
      b.frozen = e.frozen();
      b.bytes = bytes;
      b.tag = (layer < 0 ? std::string("outer") : fmt::format("h{}", layer)) +
              (bytes ? ".quant" : e.frozen() ? ".frozen" : "");
      L.buckets.push_back(std::move(b));
    }
    ZeroBucket& b = L.buckets[it->second];
    b.params.push_back(int(i));
    b.offsets.push_back(b.used);
    b.used += bytes ? stored_parts_span(p, e) : (p.tensor(e.value).numel() + L.align - 1) / L.align * L.align;
  }
  for (ZeroBucket& b : L.buckets) {
    // A bytes bucket's shards are whole cache lines (its parts are aligned to them).
    const int64_t unit = (b.bytes ? std::max(L.align, kStoredPartAlign) : L.align) * L.world_size;
    b.elements = (b.used + unit - 1) / unit * unit;
  }
  return L;
}

void shard_stored_tensors(Program& p, const ZeroLayout& L, size_t bi, TensorId shard_root, ParamEntry& e,
                          int64_t first) {
  const ZeroBucket& b = L.buckets[bi];
  const std::vector<int64_t> at = stored_part_offsets(p, e, first);
  e.storage_shard.assign(e.storage.size(), {});
  for (size_t k = 0; k < e.storage.size(); ++k) {
    const TensorDesc t = p.tensor(e.storage[k].id);  // a copy: add_view grows the tensor table
    const auto [from, count] = L.piece(b, at[k], int64_t(t.bytes()));
    if (count == 0) continue;
    const int64_t bits = dtype_bits(t.dtype);
    MEMFIT_ASSERT(from * 8 % bits == 0 && count * 8 % bits == 0, "{}: bytes [{}, +{}) split an element", t.name, from,
                  count);
    e.storage_shard[k] = {p.add_view(shard_root, t.name + ".shard", Shape{count * 8 / bits}, t.dtype,
                                     uint64_t(at[k] + from - int64_t(L.rank) * L.shard(b))),
                          from, count};
  }
}

std::vector<int64_t> stored_part_offsets(const Program& p, const ParamEntry& e, int64_t first) {
  std::vector<int64_t> out;
  for (const StoredTensor& s : e.storage) {
    out.push_back(first);
    first += (int64_t(p.tensor(s.id).bytes()) + kStoredPartAlign - 1) / kStoredPartAlign * kStoredPartAlign;
  }
  return out;
}

int64_t stored_parts_span(const Program& p, const ParamEntry& e) {
  const std::vector<int64_t> at = stored_part_offsets(p, e, 0);
  const int64_t last = int64_t(p.tensor(e.storage.back().id).bytes());
  return at.back() + (last + kStoredPartAlign - 1) / kStoredPartAlign * kStoredPartAlign;
}

FrozenSummary frozen_savings_per_rank(const FrozenSummary& whole, const Policy& policy, const Topology& topo) {
  auto share = [&](int64_t bytes, int from_stage) {
    return policy.zero_stage >= from_stage ? (bytes + topo.data - 1) / topo.data : bytes;
  };
  FrozenSummary s = whole;
  s.gradient_bytes = share(whole.gradient_bytes, 2);
  s.master_bytes = share(whole.master_bytes, 1);
  s.optimizer_bytes = share(whole.optimizer_bytes, 1);
  return s;
}

double communication_bytes_per_step(const Program& p) {
  double bytes = 0;
  for (int i = 0; i < int(p.ops().size()); ++i) {
    bytes += p.op(i).comm_bytes * double(p.sections()[size_t(p.section_of_op(i))].runs_per_step());
  }
  return bytes;
}

std::vector<int> bucket_first_uses(const Program& p, const ZeroLayout& L, const std::vector<Op>& ops, size_t pass) {
  std::map<TensorId, size_t> bucket_of_value;  // every stored tensor (a value, or quantised codes and scales)
  for (size_t bi = 0; bi < L.buckets.size(); ++bi)
    for (int pi : L.buckets[bi].params)
      for (const StoredTensor& s : p.params()[size_t(pi)].storage) bucket_of_value[s.id] = bi;
  std::vector<int> first(L.buckets.size(), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const SectionKind sec = p.sections()[size_t(p.section_of_op(int(i)))].kind;
    const bool bwd = op.phase == Phase::backward || op.phase == Phase::recompute;
    const bool in_pass = pass == 2 ? sec == SectionKind::eval : sec == SectionKind::micro && (pass == 1) == bwd;
    if (!in_pass) continue;
    for (TensorId id : op.inputs)
      if (auto it = bucket_of_value.find(id); it != bucket_of_value.end() && first[it->second] < 0)
        first[it->second] = int(i);
  }
  return first;
}

std::optional<Op> bucket_padding_fill(Program& p, const ZeroBucket& b, TensorId grad_root) {
  const ParamEntry& last = p.params()[size_t(b.params.back())];
  const int64_t end = b.offsets.back() + p.tensor(last.value).numel();
  if (end == b.elements) return std::nullopt;
  const DType gdt = p.tensor(grad_root).dtype;
  Op fill;
  fill.kind = OpKind::fill;
  fill.phase = Phase::backward;
  fill.layer = b.layer;
  fill.name = "zero.zero_padding." + b.tag;
  fill.outputs = {p.add_view(grad_root, "zero.grads." + b.tag + ".padding", Shape{b.elements - end}, gdt,
                             dtype_bytes(gdt, end))};
  fill.modes = {WriteMode::overwrite};
  fill.attrs = FillAttrs{0.0f};
  fill.flops = double(b.elements - end);
  return fill;
}

std::vector<std::pair<int64_t, int64_t>> bucket_value_ranges(const Program& p, const ZeroBucket& b, int64_t lo,
                                                             int64_t hi) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t j = 0; j < b.params.size(); ++j) {
    const int64_t first = std::max(lo, b.offsets[j]);
    const int64_t last = std::min(hi, b.offsets[j] + p.tensor(p.params()[size_t(b.params[j])].value).numel());
    if (first < last) out.emplace_back(first - lo, last - first);
  }
  return out;
}

TensorId add_comm_buffer(Program& p, std::string name, int64_t elements, DType dtype, int layer) {
  TensorDesc d;
  d.name = std::move(name);
  d.shape = Shape{elements};
  d.dtype = dtype;
  d.category = Category::communication;
  d.lifetime = Lifetime::transient;
  d.layer = layer;
  return p.add_tensor(std::move(d));
}

Op codec_op(OpKind kind, std::string name, int layer, TensorId in, TensorId out, CommQuantAttrs a, double flops) {
  Op op;
  op.kind = kind;
  op.phase = Phase::communication;
  op.name = std::move(name);
  op.layer = layer;
  op.inputs = {in};
  op.outputs = {out};
  op.modes = {WriteMode::overwrite};
  op.attrs = std::move(a);
  op.flops = flops;
  return op;
}

std::vector<Op> sharded_norm_ops(Program& p, const Op& norm, const std::vector<TensorId>& grads, CollectiveAttrs group) {
  GradNormAttrs a = std::get<GradNormAttrs>(norm.attrs);
  int64_t elements = 0;
  for (TensorId id : grads) elements += p.tensor(id).numel();
  const int64_t chunks = std::max<int64_t>(1, (elements + a.chunk - 1) / a.chunk);
  TensorDesc d;
  d.name = "grad_norm.sum_of_squares";
  d.shape = Shape{1};
  d.category = Category::temporaries;
  const TensorId squares = p.add_tensor(d);
  const TensorId partials = norm.workspace[0];  // the unsharded op's partials, fewer of them now
  p.tensor(partials).shape = Shape{chunks};
  std::vector<Op> ops(3, norm);
  Op& part = ops[0];
  part.name = "grad_norm.shard";
  part.inputs = grads;
  part.outputs = {squares};
  a.form = GradNormAttrs::Form::sum_of_squares;
  part.attrs = a;
  part.flops = 2.0 * double(elements);
  Op& sum = ops[1];
  sum = Op{};
  sum.kind = OpKind::all_reduce;
  sum.phase = Phase::communication;
  sum.name = "zero.all_reduce.grad_norm";
  sum.outputs = {squares};
  sum.modes = {WriteMode::overwrite};
  sum.attrs = group;
  sum.comm_bytes = ring_bytes(double(p.tensor(squares).bytes()), group.size, 2.0);
  Op& root = ops[2];
  root.name = "grad_norm";
  root.inputs = {squares};
  root.workspace.clear();  // sqrt_of_input needs none
  a.form = GradNormAttrs::Form::sqrt_of_input;
  root.attrs = a;
  root.flops = 1;
  return ops;
}

}  // namespace memfit
