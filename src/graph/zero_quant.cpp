// ZeRO++ qwZ (zero_quant.hpp): the wire of a quantised stage-3 gather.
#include "graph/zero_quant.hpp"

#include "graph/zero_parts.hpp"

namespace memfit {

QwzGather qwz_gather(Program& p, const ZeroLayout& L, size_t bi, TensorId shard, TensorId gathered,
                     const std::string& name) {
  const ZeroBucket& b = L.buckets[bi];
  const int64_t per_rank = int64_t(comm_wire_bytes(L.shard(b), kQwzBlock));
  QwzGather g;
  g.wire = add_comm_buffer(p, name + ".int8", per_rank * L.world_size, DType::u8, b.layer);
  g.mine = p.add_view(g.wire, name + ".int8.shard", Shape{per_rank}, DType::u8, uint64_t(per_rank) * uint64_t(L.rank));

  CommQuantAttrs a;
  a.block = kQwzBlock;
  a.valid = bucket_value_ranges(p, b, int64_t(L.rank) * L.shard(b), int64_t(L.rank + 1) * L.shard(b));
  // |x|, max, then x * (127 / absmax) per element
  g.quantize = codec_op(OpKind::comm_quantize, name + ".quantize", b.layer, shard, g.mine, a, 3.0 * double(L.shard(b)));
  a.valid.clear();
  a.ranks = L.world_size;
  g.dequantize = codec_op(OpKind::comm_dequantize, name + ".dequantize", b.layer, g.wire, gathered, a, double(b.elements));
  return g;
}

}  // namespace memfit
