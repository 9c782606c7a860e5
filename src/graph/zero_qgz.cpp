// ZeRO++ qgZ (zero_qgz.hpp). The subtle point is the order of the first hop's wire: rank d of
// node a sends node-local peer j the shards j will forward across nodes (those of data ranks
// m h + j, m = 0 .. nodes - 1), so j's decoded sum is a node-partial of exactly the shards it
// sends in the second hop, already ordered by destination node m; the second hop sends part m
// to rank m h + j, which receives every node's partial of its own shard. One hop is the same
// with one node: part j of the wire is shard j.
#include "graph/zero_qgz.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.hpp"
#include "graph/zero_parts.hpp"

namespace memfit {

namespace {

// One hop: code `x` (parts destinations of chunks of `chunk` elements) into a wire, exchange it
// over `group`, and sum the received parts into `y`. Returns {quantize, all_to_all, sum}.
std::vector<Op> hop(Program& p, const std::string& name, int layer, TensorId x, TensorId y, CommGroup group, int parts,
                    int64_t chunk, int bits, std::vector<std::pair<int64_t, int64_t>> valid) {
  const int64_t n = p.tensor(x).numel(), part = n / parts;
  const int64_t bytes = int64_t(parts) * int64_t(qgz_wire_bytes(part, kQgzBlock, bits));
  const TensorId send = add_comm_buffer(p, name + ".wire", bytes, DType::u8, layer);
  const TensorId recv = add_comm_buffer(p, name + ".received", bytes, DType::u8, layer);
  CommQuantAttrs a;
  a.block = kQgzBlock;
  a.bits = bits;
  a.ranks = parts;
  a.chunk = chunk;
  a.valid = std::move(valid);
  std::vector<Op> ops;
  ops.push_back(codec_op(OpKind::grad_quantize, name + ".quantize", layer, x, send, a, 3.0 * double(n)));
  Op c;
  c.kind = OpKind::all_to_all;
  c.phase = Phase::communication;
  c.name = name;
  c.layer = layer;
  c.inputs = {send};
  c.outputs = {recv};
  c.modes = {WriteMode::overwrite};
  c.attrs = CollectiveAttrs{group, parts, false};
  c.comm_bytes = double(bytes) * double(parts - 1) / double(parts);  // what leaves for the other members
  ops.push_back(std::move(c));
  a.valid.clear();
  a.chunk = 0;
  ops.push_back(codec_op(OpKind::grad_dequantize_sum, name + ".dequantize_sum", layer, recv, y, a,
                      2.0 * double(parts) * double(part)));
  return ops;
}

}  // namespace

bool qgz_two_hops(const Topology& topo) {
  const int h = topo.data_per_node();
  return h > 1 && h < topo.data;
}

namespace {

// Into `out`: the shard, or the accumulation's buffer.
QgzReduce qgz_reduce_scatter_into(Program& p, const ZeroLayout& L, size_t bi, const Topology& topo, int bits,
                                  TensorId grads, TensorId out) {
  const ZeroBucket& b = L.buckets[bi];
  const int W = L.world_size;
  const int64_t S = L.shard(b);
  const std::string name = "zero.reduce_scatter." + b.tag;
  QgzReduce r;
  if (!qgz_two_hops(topo)) {
    std::vector<Op> ops = hop(p, name, b.layer, grads, out, CommGroup::data, W, S, bits, bucket_value_ranges(p, b, 0, b.elements));
    r.now.assign(ops.begin(), ops.end() - 1);
    r.later.push_back(std::move(ops.back()));
    return r;
  }
  const int h = topo.data_per_node(), nodes = W / h;
  MEMFIT_CHECK(W % h == 0, "policy", "qgZ: {} data ranks per node do not divide the data degree {}", h, W);
  const TensorId partial = add_comm_buffer(p, name + ".node_sum", int64_t(nodes) * S, DType::f32, b.layer);
  std::vector<Op> first = hop(p, name + ".node", b.layer, grads, partial, CommGroup::node, h, S, bits, bucket_value_ranges(p, b, 0, b.elements));
  std::vector<Op> second = hop(p, name + ".across_nodes", b.layer, partial, out, CommGroup::across_nodes, nodes, S, bits, {});
  r.now = std::move(first);
  r.now.insert(r.now.end(), second.begin(), second.end() - 1);
  r.later.push_back(std::move(second.back()));
  return r;
}

}  // namespace

Op accumulate_shard(const ZeroLayout& L, size_t bi, TensorId buf, TensorId shard) {
  const ZeroBucket& b = L.buckets[bi];
  Op acc;
  acc.kind = OpKind::accumulate;
  acc.phase = Phase::backward;
  acc.layer = b.layer;
  acc.name = "zero.accumulate." + b.tag;
  acc.inputs = {buf};
  acc.outputs = {shard};
  acc.modes = {WriteMode::accumulate_after_first_micro};
  acc.flops = double(L.shard(b));
  return acc;
}

QgzReduce qgz_reduce_scatter(Program& p, const ZeroLayout& L, size_t bi, const Topology& topo, int bits,
                             TensorId grads, TensorId shard, int k) {
  QgzReduce r = qgz_reduce_scatter_into(p, L, bi, topo, bits, grads,
                                        k == 1 ? shard
                                               : add_comm_buffer(p, "zero.reduce_scatter." + L.buckets[bi].tag + ".buffer",
                                                            L.shard(L.buckets[bi]), p.tensor(shard).dtype,
                                                            L.buckets[bi].layer));
  if (k > 1) r.later.push_back(accumulate_shard(L, bi, r.later.back().outputs[0], shard));
  return r;
}

}  // namespace memfit
