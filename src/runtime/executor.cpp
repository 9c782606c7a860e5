#include "runtime/executor.hpp"

#include <chrono>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "memory/arena.hpp"

namespace memfit {

Executor::Executor(const CompiledProgram& compiled, Backend& backend, const CommGroups* groups,
                   const ExecutorOptions& options)
    : program_(compiled.program), plan_(compiled.plan) {
  if (!groups) {
    own_groups_ = std::make_unique<CommGroups>();
    groups = own_groups_.get();
  }
  groups_ = groups;
  allocate_tiers(backend, options);
  prepare_ops(backend, *groups);
  auto range_of = [&](SectionKind kind) {
    const Section* s = program_.find_section(kind);
    return s ? OpRange{s->begin, s->end} : OpRange{};
  };
  micro_ = range_of(SectionKind::micro);
  sync_ = range_of(SectionKind::sync);
  optimizer_ = range_of(SectionKind::optimizer);
  if (const Section* micro = program_.find_section(SectionKind::micro)) micro_repeat_ = micro->repeat;
}

void Executor::allocate_tiers(const Backend& backend, const ExecutorOptions& options) {
  for (Tier t : kAllTiers) {
    const uint64_t bytes = plan_.tier(t).peak_bytes;
    const BufferType& type = backend.buffer_type(t);
    MEMFIT_CHECK(bytes == 0 || plan_.alignments[size_t(t)] % type.alignment() == 0, "runtime",
                 "the plan aligns the {} tier to {} bytes, but its buffer type '{}' needs {}", tier_name(t),
                 plan_.alignments[size_t(t)], type.name(), type.alignment());
    MEMFIT_CHECK(bytes == 0 || type.host_readable() || !options.disk.directory.empty(), "runtime",
                 "the plan puts {} on the {} tier, which needs a directory for its file (--offload-dir)",
                 format_bytes(bytes), tier_name(t));
    buffers_[size_t(t)] = bytes == 0 ? std::make_unique<Arena>(t, 0) : type.allocate(t, bytes, options.disk);
  }
  const auto& tensors = program_.tensors();
  pointers_.assign(tensors.size(), nullptr);
  for (size_t id = 0; id < tensors.size(); ++id) {
    const TensorPlacement& pl = plan_.tensors[id];
    if (pl.buffer < 0) continue;
    const Buffer& buffer = *buffers_[size_t(pl.tier)];
    MEMFIT_ASSERT(pl.offset + pl.bytes <= buffer.size(), "tensor {} placed outside its buffer", tensors[id].name);
    // Tensors on a tier the host cannot address have no pointer: only transfers reach them.
    if (buffer.host_data()) pointers_[id] = buffer.host_data() + pl.offset;
  }
}

void Executor::prepare_ops(Backend& backend, const CommGroups& groups) {
  StartedCollectives started;
  StartedTransfers started_transfers;
  prepared_.resize(program_.ops().size());
  op_seconds_.assign(program_.ops().size(), 0.0);
  for (size_t i = 0; i < program_.ops().size(); ++i) {
    const Op& op = program_.op(int(i));
    if (op.kind == OpKind::load_input) continue;
    const Engine engine = queue_engine(op.queue);
    OpBinding b;
    auto ptr = [&](TensorId id) -> void* {
      if (id == kNoTensor) return nullptr;
      MEMFIT_CHECK(pointers_[size_t(id)] || engine == Engine::transfer, "runtime",
                   "op '{}' reads or writes '{}' on the {} tier, which only transfers may touch", op.name,
                   program_.tensor(id).name, tier_name(plan_.tensors[size_t(id)].tier));
      return pointers_[size_t(id)];
    };
    for (TensorId id : op.inputs) b.inputs.push_back(ptr(id));
    for (TensorId id : op.outputs) b.outputs.push_back(ptr(id));
    for (TensorId id : op.workspace) b.workspace.push_back(ptr(id));
    switch (engine) {
      case Engine::compute: prepared_[i] = backend.prepare(program_, op, b); break;
      case Engine::communicator: prepared_[i] = prepare_collective(program_, op, b, groups, started); break;
      case Engine::transfer: {
        if (!transfers_) transfers_ = std::make_unique<TransferEngine>();
        auto end = [&](TensorId id) {
          const TensorPlacement& pl = plan_.tensors[size_t(id)];
          return TransferEnd{buffers_[size_t(pl.tier)].get(), pl.offset};
        };
        const bool wait = op.kind == OpKind::wait;
        const TransferEnd src = wait || op.inputs.empty() ? TransferEnd{} : end(op.inputs[0]);
        const TransferEnd dst = wait || op.outputs.empty() ? TransferEnd{} : end(op.outputs[0]);
        prepared_[i] = transfers_->prepare(program_, op, src, dst, started_transfers);
        break;
      }
    }
  }
  MEMFIT_CHECK(started.empty(), "runtime", "the program starts {} collective(s) it never waits for", started.size());
  MEMFIT_CHECK(started_transfers.empty(), "runtime", "the program starts {} transfer(s) it never waits for",
               started_transfers.size());
}

Arena& Executor::arena(Tier t) const {
  auto* arena = dynamic_cast<Arena*>(buffers_[size_t(t)].get());
  MEMFIT_CHECK(arena != nullptr, "runtime", "the {} tier is not a host arena", tier_name(t));
  return *arena;
}

const TensorPlacement& Executor::placed_range(TensorId id, uint64_t byte_offset, uint64_t bytes) const {
  MEMFIT_CHECK(id >= 0 && size_t(id) < plan_.tensors.size(), "runtime", "no tensor with id {}", int(id));
  const TensorPlacement& pl = plan_.tensors[size_t(id)];
  MEMFIT_CHECK(pl.buffer >= 0, "runtime", "tensor '{}' has no memory (no op uses it)", program_.tensor(id).name);
  MEMFIT_CHECK(byte_offset <= pl.bytes && bytes <= pl.bytes - byte_offset, "runtime",
               "bytes [{}, {}) lie outside tensor '{}' of {} bytes", byte_offset, byte_offset + bytes,
               program_.tensor(id).name, pl.bytes);
  return pl;
}

void Executor::read(TensorId id, std::span<std::byte> out) const {
  const TensorPlacement& pl = placed_range(id, 0, 0);
  MEMFIT_CHECK(out.size() == pl.bytes, "runtime", "tensor '{}' holds {} bytes, not {}", program_.tensor(id).name,
               pl.bytes, out.size());
  buffers_[size_t(pl.tier)]->read(pl.offset, out);
}

void Executor::write(TensorId id, std::span<const std::byte> in) {
  const TensorPlacement& pl = placed_range(id, 0, 0);
  MEMFIT_CHECK(in.size() == pl.bytes, "runtime", "tensor '{}' holds {} bytes, not {}", program_.tensor(id).name,
               pl.bytes, in.size());
  buffers_[size_t(pl.tier)]->write(pl.offset, in);
}

void Executor::read(TensorId id, uint64_t byte_offset, std::span<std::byte> out) const {
  const TensorPlacement& pl = placed_range(id, byte_offset, out.size());
  buffers_[size_t(pl.tier)]->read(pl.offset + byte_offset, out);
}

void Executor::write(TensorId id, uint64_t byte_offset, std::span<const std::byte> in) {
  const TensorPlacement& pl = placed_range(id, byte_offset, in.size());
  buffers_[size_t(pl.tier)]->write(pl.offset + byte_offset, in);
}

void Executor::run_range(int begin, int end, const StepContext& ctx) {
  for (int i = begin; i < end; ++i) {
    for (OpObserver* o : observers_) o->before_op(i, ctx);
    const auto t0 = timing_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (PreparedOp* op = prepared_[size_t(i)].get()) {
      op->run(ctx);
    } else {
      MEMFIT_CHECK(bool(input_), "runtime", "op '{}' loads input but no input handler is installed",
                   program_.op(i).name);
      input_(program_.op(i), ctx);
    }
    for (int g = 0; g < groups_->distinct_count(); ++g)  // collectives in flight advance between ops
      if (Communicator* c = groups_->distinct()[size_t(g)]; c->pending()) c->progress();
    if (timing_)
      op_seconds_[size_t(i)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (OpObserver* o : observers_) o->after_op(i, ctx);
  }
}

void Executor::run_section(SectionKind kind, const StepContext& ctx) {
  const Section* s = program_.find_section(kind);
  MEMFIT_CHECK(s != nullptr, "runtime", "the program has no section '{}'", section_name(kind));
  run_range(s->begin, s->end, ctx);
}

bool Executor::run_step(StepContext ctx, UpdateGate* gate) {
  ctx.micro_count = micro_repeat_;
  for (int m = 0; m < micro_repeat_; ++m) {
    ctx.micro = m;
    run_range(micro_.begin, micro_.end, ctx);
  }
  run_range(sync_.begin, sync_.end, ctx);  // the global loss and overflow flag
  if (gate && !gate->apply_update(ctx)) return false;
  run_range(optimizer_.begin, optimizer_.end, ctx);
  return true;
}

}  // namespace memfit
