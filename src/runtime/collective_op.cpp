#include "runtime/collective_op.hpp"

#include <cstring>

#include "core/error.hpp"

namespace memfit {

namespace {

// A collective as two closures: start() returns the communicator's ticket, finish() runs
// after the wait (the in-place reduce-scatter's move into the rank's block). Blocking: both in
// one op. Asynchronous: the start op keeps the ticket for its wait op.
template <class Start, class Finish>
class CollectiveRun final : public StartedCollective {
 public:
  CollectiveRun(Communicator* c, const char* label, Start start, Finish finish, bool async)
      : comm_(c), label_(label), start_(std::move(start)), finish_(std::move(finish)), async_(async) {}
  void run(const StepContext&) override {
    comm_->label_next(label_);
    ticket_ = start_();
    if (!async_) complete();
  }
  void complete() override {
    MEMFIT_ASSERT(ticket_ >= 0, "collective completed before it was started");
    comm_->wait(ticket_);
    ticket_ = -1;
    finish_();
  }

 private:
  Communicator* comm_;
  const char* label_;
  Start start_;
  Finish finish_;
  bool async_;
  CommTicket ticket_ = -1;
};
template <class Start, class Finish>
std::unique_ptr<StartedCollective> make_run(Communicator* c, const char* label, Start start, Finish finish, bool async) {
  return std::make_unique<CollectiveRun<Start, Finish>>(c, label, std::move(start), std::move(finish), async);
}

class WaitOp final : public PreparedOp {
 public:
  explicit WaitOp(StartedCollective* started) : started_(started) {}
  void run(const StepContext&) override { started_->complete(); }

 private:
  StartedCollective* started_;
};

}  // namespace

CommGroups::CommGroups() {
  own_world_ = make_single_process_communicator();
  groups_.fill(own_world_.get());
  add_distinct(own_world_.get());
}

namespace {

bool runs_over(const Program* program, CommGroup g) {
  if (!program) return true;
  for (const Op& op : program->ops())
    if (const auto* a = std::get_if<CollectiveAttrs>(&op.attrs); a && a->group == g) return true;
  return false;
}

}  // namespace

CommGroups::CommGroups(Communicator& world, const Topology& topology, int hpz_partition, const Program* program) {
  MEMFIT_CHECK(topology.world() == world.size() && topology.rank == world.rank(), "runtime",
               "the topology is rank {} of {} x {} ranks (data x tensor), but this is rank {} of {}", topology.rank,
               topology.data, topology.tensor, world.rank(), world.size());
  groups_[size_t(CommGroup::world)] = &world;
  groups_[size_t(CommGroup::data)] = group(world, topology.data, "data", topology.tensor_rank(), topology.data_rank(), data_);
  groups_[size_t(CommGroup::tensor)] =
      group(world, topology.tensor, "tensor", topology.data_rank(), topology.tensor_rank(), tensor_);
  // The data ranks of each node, and those with the same index on every node: split only when
  // the data group spans several nodes of several ranks (else qgZ takes one hop over `data`).
  // Colors count over (node or index, tensor slice), so each is unique across slices.
  const int h = topology.data_per_node(), d = topology.data_rank(), tr = topology.tensor_rank();
  const bool hops = runs_over(program, CommGroup::node) || runs_over(program, CommGroup::across_nodes);
  if (hops && h > 1 && h < topology.data && topology.data % h == 0) {
    groups_[size_t(CommGroup::node)] = group(world, h, "node", (d / h) * topology.tensor + tr, d % h, node_);
    groups_[size_t(CommGroup::across_nodes)] =
        group(world, topology.data / h, "across_nodes", (d % h) * topology.tensor + tr, d / h, across_nodes_);
  } else {
    groups_[size_t(CommGroup::node)] = groups_[size_t(CommGroup::across_nodes)] = groups_[size_t(CommGroup::data)];
  }
  // hpZ: groups of hpz_partition consecutive data ranks, one set per tensor slice (the color
  // numbers the group across slices); off, the group is the data group's communicator.
  MEMFIT_CHECK(hpz_partition >= 1 && topology.data % hpz_partition == 0, "runtime",
               "hpZ partition {} does not divide the data-parallel degree {}", hpz_partition, topology.data);
  const int hpz_id = topology.data_rank() / hpz_partition;
  // Partitions of one node's ranks are the node group (the usual setting): no second split.
  groups_[size_t(CommGroup::hpz)] =
      hpz_partition == 1 || !runs_over(program, CommGroup::hpz) ? groups_[size_t(CommGroup::data)]
      : node_ && hpz_partition == h   ? node_.get()
                                      : group(world, hpz_partition, "hpz", hpz_id * topology.tensor + topology.tensor_rank(),
                                              topology.data_rank() % hpz_partition, hpz_);
  for (Communicator* c : groups_) add_distinct(c);
}

// Every rank takes the same branches (they depend on the topology only), so the splits, which
// are collective over the world, match; a group of one or of the whole world needs none, so a
// data-parallel run splits nothing.
Communicator* CommGroups::group(Communicator& world, int size, const char* name, int color, int key,
                                std::unique_ptr<Communicator>& own) {
  if (size == world.size()) return &world;
  own = size == 1 ? make_single_process_communicator(world.world_rank(world.rank())) : world.split(color, key);
  own->set_name(name);
  return own.get();
}

void CommGroups::add_distinct(Communicator* c) {
  for (int i = 0; i < distinct_count_; ++i)
    if (distinct_[size_t(i)] == c) return;
  distinct_[size_t(distinct_count_++)] = c;
}

std::unique_ptr<PreparedOp> prepare_collective(const Program& p, const Op& op, const OpBinding& b,
                                               const CommGroups& groups, StartedCollectives& started) {
  const CollectiveAttrs* attrs = std::get_if<CollectiveAttrs>(&op.attrs);
  MEMFIT_CHECK(attrs != nullptr, "runtime", "collective op '{}' has no CollectiveAttrs", op.name);
  if (op.kind == OpKind::wait) {
    auto it = started.find(op.async_id);
    MEMFIT_CHECK(it != started.end(), "runtime", "op '{}' waits for collective {}, which no earlier op starts", op.name,
                 op.async_id);
    StartedCollective* s = it->second;
    started.erase(it);
    return std::make_unique<WaitOp>(s);
  }
  const bool async = op.async_id >= 0;
  auto remember = [&](std::unique_ptr<StartedCollective> run) -> std::unique_ptr<PreparedOp> {
    if (async) {
      MEMFIT_CHECK(started.emplace(op.async_id, run.get()).second, "runtime",
                   "collective {} is started by two ops ('{}' is the second)", op.async_id, op.name);
    }
    return run;
  };
  Communicator& comm = groups[attrs->group];
  MEMFIT_CHECK(attrs->size == comm.size(), "runtime",
               "op '{}' was planned for a {} group of {} ranks but runs in one of {} ranks", op.name,
               comm_group_name(attrs->group), attrs->size, comm.size());
  const int world = comm.size(), rank = comm.rank();
  Communicator* c = &comm;
  const char* label = op.name.c_str();  // the program outlives its prepared ops
  switch (op.kind) {
    case OpKind::all_reduce:
    case OpKind::broadcast: {
      // all_reduce may also be out of place (tensor parallelism's forward sums): the input is
      // copied into the output, which is then reduced in place.
      const bool copy_in = op.kind == OpKind::all_reduce && op.inputs.size() == 1;
      MEMFIT_CHECK((op.inputs.empty() || copy_in) && op.outputs.size() == 1, "runtime", "op '{}' needs one output",
                   op.name);
      const TensorDesc& t = p.tensor(op.outputs[0]);
      void* data = b.outputs[0];
      const int64_t n = t.numel();
      const DType dt = t.dtype;
      if (op.kind == OpKind::broadcast)
        return remember(make_run(c, label, [=] { return c->start_broadcast(data, n, dt, 0); }, [] {}, async));
      const ReduceOp rop = attrs->max ? ReduceOp::max : ReduceOp::sum;
      if (copy_in) {
        const TensorDesc& x = p.tensor(op.inputs[0]);
        MEMFIT_CHECK(x.dtype == dt && x.numel() == n, "runtime", "op '{}': '{}' and '{}' differ in shape or dtype",
                     op.name, x.name, t.name);
        const void* in = b.inputs[0];
        const uint64_t bytes = t.bytes();
        return remember(make_run(
            c, label,
            [=] {
              if (in != data) std::memcpy(data, in, bytes);
              return c->start_all_reduce(data, n, dt, rop);
            },
            [] {}, async));
      }
      return remember(make_run(c, label, [=] { return c->start_all_reduce(data, n, dt, rop); }, [] {}, async));
    }
    case OpKind::reduce_scatter:
    case OpKind::all_gather: {
      MEMFIT_CHECK(op.inputs.size() == 1 && op.outputs.size() == 1, "runtime", "op '{}' needs one input and one output",
                   op.name);
      const bool rs = op.kind == OpKind::reduce_scatter;
      const TensorDesc& full = p.tensor(rs ? op.inputs[0] : op.outputs[0]);
      const TensorDesc& shard = p.tensor(rs ? op.outputs[0] : op.inputs[0]);
      MEMFIT_CHECK(full.dtype == shard.dtype && full.numel() == shard.numel() * world, "runtime",
                   "op '{}': '{}' ({} elements) is not {} shards of '{}' ({} elements)", op.name, full.name,
                   full.numel(), world, shard.name, shard.numel());
      const int64_t n = shard.numel();
      const DType dt = shard.dtype;
      const uint64_t block = dtype_bytes(dt, n);
      if (!rs)
        return remember(make_run(
            c, label, [=, in = b.inputs[0], out = b.outputs[0]] { return c->start_all_gather(in, out, n, dt); }, [] {},
            async));
      auto* in = static_cast<std::byte*>(b.inputs[0]);
      auto* out = static_cast<std::byte*>(b.outputs[0]);
      if (out != in + uint64_t(rank) * block)
        return remember(
            make_run(c, label, [=] { return c->start_reduce_scatter(in, out, n, dt, ReduceOp::sum); }, [] {}, async));
      // In place: the result lands at the start of the buffer and moves to the rank's block.
      return remember(make_run(
          c, label, [=] { return c->start_reduce_scatter(in, in, n, dt, ReduceOp::sum); },
          [=] {
            if (out != in) std::memmove(out, in, block);
          },
          async));
    }
    case OpKind::all_to_all: {
      MEMFIT_CHECK(op.inputs.size() == 1 && op.outputs.size() == 1, "runtime", "op '{}' needs one input and one output",
                   op.name);
      const TensorDesc& send = p.tensor(op.inputs[0]);
      const TensorDesc& recv = p.tensor(op.outputs[0]);
      MEMFIT_CHECK(send.dtype == recv.dtype && send.numel() == recv.numel() && send.numel() % world == 0, "runtime",
                   "op '{}': '{}' and '{}' are not {} equal parts each", op.name, send.name, recv.name, world);
      const int64_t n = send.numel() / world;
      const DType dt = send.dtype;
      return remember(make_run(
          c, label, [=, in = b.inputs[0], out = b.outputs[0]] { return c->start_all_to_all(in, out, n, dt); }, [] {},
          async));
    }
    default: break;
  }
  throw Error("runtime", fmt::format("op '{}' ({}) is not a collective", op.name, op_kind_name(op.kind)));
}

}  // namespace memfit
