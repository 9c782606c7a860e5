// ZeRO++ qwZ (zero_quant.hpp): the wire of a quantised stage-3 gather.
#include "graph/zero_quant.hpp"

#include <algorithm>

namespace memfit {

namespace {

// The element ranges of this rank's shard of bucket b that hold parameter values, relative to
// the shard's start: the padding after each parameter (up to the layout's alignment) and at
// the bucket's end is never written, so the coder must not read it.
std::vector<std::pair<int64_t, int64_t>> valid_ranges(const Program& p, const ZeroLayout& L, const ZeroBucket& b) {
  const int64_t lo = int64_t(L.rank) * L.shard(b), hi = lo + L.shard(b);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t j = 0; j < b.params.size(); ++j) {
    const int64_t first = std::max(lo, b.offsets[j]);
    const int64_t last = std::min(hi, b.offsets[j] + p.tensor(p.params()[size_t(b.params[j])].value).numel());
    if (first < last) out.emplace_back(first - lo, last - first);
  }
  return out;
}

}  // namespace

QwzGather qwz_gather(Program& p, const ZeroLayout& L, size_t bi, TensorId shard, TensorId gathered,
                     const std::string& name) {
  const ZeroBucket& b = L.buckets[bi];
  const int64_t per_rank = int64_t(comm_wire_bytes(L.shard(b), kQwzBlock));
  QwzGather g;
  TensorDesc d;
  d.name = name + ".int8";
  d.shape = Shape{per_rank * L.world_size};
  d.dtype = DType::u8;
  d.category = Category::communication;
  d.lifetime = Lifetime::transient;
  d.layer = b.layer;
  g.wire = p.add_tensor(std::move(d));
  g.mine = p.add_view(g.wire, name + ".int8.shard", Shape{per_rank}, DType::u8, uint64_t(per_rank) * uint64_t(L.rank));

  CommQuantAttrs a;
  a.block = kQwzBlock;
  a.valid = valid_ranges(p, L, b);
  Op& q = g.quantize;
  q.kind = OpKind::comm_quantize;
  q.phase = Phase::communication;
  q.name = name + ".quantize";
  q.layer = b.layer;
  q.inputs = {shard};
  q.outputs = {g.mine};
  q.modes = {WriteMode::overwrite};
  q.attrs = a;
  q.flops = 3.0 * double(L.shard(b));  // |x|, max, then x * (127 / absmax) per element

  a.valid.clear();
  a.ranks = L.world_size;
  Op& dq = g.dequantize;
  dq.kind = OpKind::comm_dequantize;
  dq.phase = Phase::communication;
  dq.name = name + ".dequantize";
  dq.layer = b.layer;
  dq.inputs = {g.wire};
  dq.outputs = {gathered};
  dq.modes = {WriteMode::overwrite};
  dq.attrs = a;
  dq.flops = double(b.elements);
  return g;
}

}  // namespace memfit
