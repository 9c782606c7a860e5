// Communication volume of a step program (zero.hpp: communication_volume): each collective's
// ring volume (Op::comm_bytes) by what it moves, and whether this rank's ring neighbour is on
// its node. The purpose is read from the names the ZeRO pass gives its collectives
// ("zero.all_gather.<bucket>.forward", "zero.reduce_scatter.<bucket>", ...), which only that
// pass makes, and from the tensor group for tensor parallelism's; a collective of no known purpose counts under `scalars` only when it moves a few
// bytes, else the accounting would be wrong without anyone seeing it, so it throws.
#include <string_view>

#include "core/error.hpp"
#include "graph/zero.hpp"

namespace memfit {

namespace {

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

CommPurpose purpose_of(const Op& op) {
  const std::string_view name = op.name;
  if (op.kind == OpKind::all_gather && name.starts_with("zero.all_gather.")) {
    if (ends_with(name, ".forward") || ends_with(name, ".eval")) return CommPurpose::param_gather_forward;
    if (ends_with(name, ".backward")) return CommPurpose::param_gather_backward;
    return CommPurpose::param_gather_update;
  }
  if (op.kind == OpKind::reduce_scatter && name.starts_with("zero.reduce_scatter.")) return CommPurpose::grad_reduce_scatter;
  if (op.kind == OpKind::all_to_all && name.starts_with("zero.reduce_scatter.")) return CommPurpose::grad_reduce_scatter;
  if (op.kind == OpKind::all_reduce && name.starts_with("zero.all_reduce.")) {
    for (std::string_view scalar : {"loss", "eval_loss", "overflow_flag", "grad_norm"})
      if (name.substr(16) == scalar) return CommPurpose::scalars;
    return CommPurpose::grad_all_reduce;
  }
  if (std::get<CollectiveAttrs>(op.attrs).group == CommGroup::tensor) return CommPurpose::tensor_parallel;
  MEMFIT_CHECK(op.comm_bytes <= 64, "policy", "collective '{}' ({} bytes per rank) has no known purpose", op.name,
               op.comm_bytes);
  return CommPurpose::scalars;
}

// World rank of member m of this rank's group of `size` ranks (graph/policy.hpp's layout: tensor
// ranks adjacent; an hpZ group is `size` consecutive data ranks).
int world_rank_of(CommGroup g, const Topology& t, int m, int size) {
  switch (g) {
    case CommGroup::world: return m;
    case CommGroup::data: return m * t.tensor + t.tensor_rank();
    case CommGroup::tensor: return t.data_rank() * t.tensor + m;
    case CommGroup::node: return ((t.data_rank() / t.data_per_node()) * t.data_per_node() + m) * t.tensor + t.tensor_rank();
    case CommGroup::across_nodes: return (m * t.data_per_node() + t.data_rank() % t.data_per_node()) * t.tensor + t.tensor_rank();
    case CommGroup::hpz: return (t.data_rank() / size * size + m) * t.tensor + t.tensor_rank();
  }
  return m;
}

int member_index(CommGroup g, const Topology& t, int size) {
  switch (g) {
    case CommGroup::world: return t.rank;
    case CommGroup::data: return t.data_rank();
    case CommGroup::tensor: return t.tensor_rank();
    case CommGroup::node: return t.data_rank() % t.data_per_node();
    case CommGroup::across_nodes: return t.data_rank() / t.data_per_node();
    case CommGroup::hpz: return t.data_rank() % size;
  }
  return t.rank;
}

}  // namespace

std::string_view comm_purpose_name(CommPurpose c) {
  switch (c) {
    case CommPurpose::param_gather_forward: return "param_gather_forward";
    case CommPurpose::param_gather_backward: return "param_gather_backward";
    case CommPurpose::param_gather_update: return "param_gather_update";
    case CommPurpose::grad_reduce_scatter: return "grad_reduce_scatter";
    case CommPurpose::grad_all_reduce: return "grad_all_reduce";
    case CommPurpose::scalars: return "scalars";
    case CommPurpose::tensor_parallel: return "tensor_parallel";
  }
  return "?";
}

CommVolume communication_volume(const Program& p, const Topology& program_topo, int ranks_per_node) {
  MEMFIT_CHECK(ranks_per_node >= 1, "policy", "ranks per node must be at least 1 (got {})", ranks_per_node);
  // The node and across_nodes groups (qgZ) were laid out by the program's own node size.
  Topology topo = program_topo;
  if (topo.ranks_per_node == 0) topo.ranks_per_node = ranks_per_node;
  CommVolume v;
  v.ranks_per_node = ranks_per_node;
  v.nodes = (topo.world() + ranks_per_node - 1) / ranks_per_node;
  auto node = [&](int world_rank) { return world_rank / ranks_per_node; };
  for (int i = 0; i < int(p.ops().size()); ++i) {
    const Op& op = p.op(i);
    if (op.comm_bytes == 0) continue;
    const double bytes = op.comm_bytes * double(p.sections()[size_t(p.section_of_op(i))].runs_per_step());
    if (bytes == 0) continue;
    const CollectiveAttrs& a = std::get<CollectiveAttrs>(op.attrs);
    v.by_purpose[size_t(purpose_of(op))] += bytes;
    v.total += bytes;
    const int me = member_index(a.group, topo, a.size);
    if (op.kind == OpKind::all_to_all) {
      // Not a ring: a 1/N part goes to each other member, on this rank's node or not.
      int near = 0;
      for (int m = 0; m < a.size; ++m)
        near += m != me && node(world_rank_of(a.group, topo, m, a.size)) == node(world_rank_of(a.group, topo, me, a.size));
      const double inside = a.size > 1 ? bytes * double(near) / double(a.size - 1) : bytes;
      v.intra_node += inside;
      v.inter_node += bytes - inside;
      // What leaves the node: every data rank of this slice on the node runs the same exchange
      // (in its own group where the group is across nodes) and sends the same share across.
      int on_node = 0;
      for (int d = 0; d < topo.data; ++d)
        on_node += node(world_rank_of(CommGroup::data, topo, d, topo.data)) == node(topo.rank);
      v.node_link += double(on_node) * (bytes - inside);
      continue;
    }
    const bool crosses =
        node(world_rank_of(a.group, topo, me, a.size)) != node(world_rank_of(a.group, topo, (me + 1) % a.size, a.size));
    (crosses ? v.inter_node : v.intra_node) += bytes;
    // Every link of a ring carries the same bytes: a group on several nodes has a link across
    // each boundary it spans, carrying what each rank sends.
    if (node(world_rank_of(a.group, topo, 0, a.size)) != node(world_rank_of(a.group, topo, a.size - 1, a.size)))
      v.node_link += bytes;
  }
  return v;
}

}  // namespace memfit
