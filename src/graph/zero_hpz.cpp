// ZeRO++ hpZ (zero_hpz.hpp): the secondary partition of a stage-3 bucket.
#include "graph/zero_hpz.hpp"

#include "core/error.hpp"
#include "graph/zero_parts.hpp"

namespace memfit {

int hpz_partition(const Policy& policy, const Topology& topo) {
  const int n = policy.zero_hpz_partition_size;
  return policy.zero_stage == 3 && n > 1 && n < topo.data && topo.data % n == 0 ? n : 1;
}

void check_hpz(const Policy& policy, const Topology& topo) {
  const int n = policy.zero_hpz_partition_size;
  MEMFIT_CHECK(n >= 1, "policy", "zero_hpz_partition_size (ZeRO++ hpZ) must be at least 1 (got {})", n);
  if (n == 1) return;
  MEMFIT_CHECK(policy.zero_stage == 3, "policy",
               "zero_hpz_partition_size (ZeRO++ hpZ) partitions stage 3's parameters a second time: it needs ZeRO "
               "stage 3 (got stage {})", policy.zero_stage);
  MEMFIT_CHECK(topo.data % n == 0, "policy",
               "zero_hpz_partition_size {} must divide the data-parallel degree {} (hpZ groups are {} consecutive "
               "data-parallel ranks)", n, topo.data, n);
  // Untested with the offload pass (which fetches the shards its gathers read): refused until it is.
  MEMFIT_CHECK(hpz_partition(policy, topo) == 1 || policy.offload_params == Tier::device, "policy",
               "zero_hpz_partition_size with offloaded parameters is not supported yet");
}

HpzCopy hpz_copy(Program& p, const ZeroLayout& L, size_t bi, TensorId gathered, int n) {
  const ZeroBucket& b = L.buckets[bi];
  MEMFIT_ASSERT(n > 1 && L.world_size % n == 0 && b.elements % n == 0, "hpZ partition {} of bucket {} ({} elements, {} ranks)",
                n, b.tag, b.elements, L.world_size);
  // A bytes bucket (a quantised base) is copied and gathered as fp32 words: the float copy and
  // the collective move bits unchanged, and its pieces are whole cache lines.
  const bool bytes = p.tensor(gathered).dtype == DType::u8;
  const int64_t piece = b.elements / n / (bytes ? 4 : 1);
  const DType dt = bytes ? DType::f32 : p.tensor(gathered).dtype;
  HpzCopy h;
  // Communication, not parameters: a transient buffer that only feeds the backward's gather
  // (parameters are the persistent model state that checkpoints, estimates and offload count).
  h.secondary = add_comm_buffer(p, "zero.params." + b.tag + ".secondary", piece, dt, b.layer);
  const int64_t member = L.rank % n;
  const TensorId mine = p.add_view(gathered, "zero.gather." + b.tag + ".forward.hpz_piece", Shape{piece}, dt,
                                   dtype_bytes(dt, member * piece));
  Op& c = h.copy;
  c.kind = OpKind::accumulate;  // overwrite mode: an exact copy
  c.phase = Phase::communication;
  c.name = "zero.hpz_copy." + b.tag;
  c.layer = b.layer;
  c.inputs = {mine};
  c.outputs = {h.secondary};
  c.modes = {WriteMode::overwrite};
  c.flops = double(piece);
  return h;
}

Op hpz_gather(Program& p, const std::string& name, TensorId secondary, TensorId gathered, int n, int layer) {
  if (p.tensor(gathered).dtype == DType::u8)  // a bytes bucket, as fp32 words (see hpz_copy)
    gathered = p.add_view(gathered, p.tensor(gathered).name + ".words", Shape{p.tensor(gathered).numel() / 4},
                          DType::f32, 0);
  Op op;
  op.kind = OpKind::all_gather;
  op.phase = Phase::communication;
  op.name = name;  // "zero.all_gather.<bucket>.backward": counted as param_gather_backward
  op.layer = layer;
  op.inputs = {secondary};
  op.outputs = {gathered};
  op.modes = {WriteMode::overwrite};
  op.attrs = CollectiveAttrs{CommGroup::hpz, n, false};
  op.comm_bytes = double(p.tensor(gathered).bytes()) * double(n - 1) / double(n);  // the ring's volume
  return op;
}

}  // namespace memfit
