#include "runtime/collective_op.hpp"

#include <cstring>

#include "core/error.hpp"

namespace memfit {

namespace {

template <class Fn>
class FnOp final : public PreparedOp {
 public:
  explicit FnOp(Fn fn) : fn_(std::move(fn)) {}
  void run(const StepContext&) override { fn_(); }

 private:
  Fn fn_;
};
template <class Fn>
std::unique_ptr<PreparedOp> make_fn_op(Fn fn) {
  return std::make_unique<FnOp<Fn>>(std::move(fn));
}

}  // namespace

bool is_collective(OpKind kind) {
  return kind == OpKind::all_reduce || kind == OpKind::reduce_scatter || kind == OpKind::all_gather ||
         kind == OpKind::broadcast;
}

std::unique_ptr<PreparedOp> prepare_collective(const Program& p, const Op& op, const OpBinding& b, Communicator& comm) {
  const CollectiveAttrs* attrs = std::get_if<CollectiveAttrs>(&op.attrs);
  MEMFIT_CHECK(attrs != nullptr, "runtime", "collective op '{}' has no CollectiveAttrs", op.name);
  MEMFIT_CHECK(attrs->world_size == comm.size(), "runtime",
               "op '{}' was planned for world size {} but runs in a world of {} ranks", op.name, attrs->world_size,
               comm.size());
  const int world = comm.size(), rank = comm.rank();
  Communicator* c = &comm;
  switch (op.kind) {
    case OpKind::all_reduce:
    case OpKind::broadcast: {
      MEMFIT_CHECK(op.inputs.empty() && op.outputs.size() == 1, "runtime", "op '{}' needs one output", op.name);
      const TensorDesc& t = p.tensor(op.outputs[0]);
      void* data = b.outputs[0];
      const int64_t n = t.numel();
      const DType dt = t.dtype;
      if (op.kind == OpKind::broadcast) return make_fn_op([=] { c->broadcast(data, n, dt, 0); });
      const ReduceOp rop = attrs->max ? ReduceOp::max : ReduceOp::sum;
      return make_fn_op([=] { c->all_reduce(data, n, dt, rop); });
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
      if (!rs) return make_fn_op([=, in = b.inputs[0], out = b.outputs[0]] { c->all_gather(in, out, n, dt); });
      auto* in = static_cast<std::byte*>(b.inputs[0]);
      auto* out = static_cast<std::byte*>(b.outputs[0]);
      if (out != in + uint64_t(rank) * block) return make_fn_op([=] { c->reduce_scatter(in, out, n, dt, ReduceOp::sum); });
      return make_fn_op([=] {
        c->reduce_scatter(in, in, n, dt, ReduceOp::sum);  // in place: the result lands at the start
        if (out != in) std::memmove(out, in, block);
      });
    }
    default: break;
  }
  throw Error("runtime", fmt::format("op '{}' ({}) is not a collective", op.name, op_kind_name(op.kind)));
}

}  // namespace memfit
