#include "runtime/executor.hpp"

#include <chrono>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace memfit {

Executor::Executor(const CompiledProgram& compiled, Backend& backend, const CommGroups* groups)
    : program_(compiled.program), plan_(compiled.plan) {
  if (!groups) {
    own_groups_ = std::make_unique<CommGroups>();
    groups = own_groups_.get();
  }
  groups_ = groups;
  for (Tier t : kAllTiers) {
    const uint64_t bytes = plan_.tier(t).peak_bytes;
    if (t != Tier::device && bytes > 0)
      throw Error("runtime", fmt::format("the plan puts {} on the {} tier, which the {} backend cannot run yet",
                                         format_bytes(bytes), tier_name(t), backend.name()));
    const BufferType& type = backend.buffer_type(t);
    MEMFIT_CHECK(bytes == 0 || plan_.alignments[size_t(t)] % type.alignment() == 0, "runtime",
                 "the plan aligns the {} tier to {} bytes, but its buffer type '{}' needs {}", tier_name(t),
                 plan_.alignments[size_t(t)], type.name(), type.alignment());
    buffers_[size_t(t)] = bytes == 0 ? std::make_unique<Arena>(t, 0) : type.allocate(t, bytes);
    MEMFIT_CHECK(dynamic_cast<const Arena*>(buffers_[size_t(t)].get()) != nullptr, "runtime",
                 "the {} tier's buffer type '{}' is not a host arena, which this executor cannot run yet", tier_name(t),
                 type.name());
  }
  const auto& tensors = program_.tensors();
  pointers_.assign(tensors.size(), nullptr);
  for (size_t id = 0; id < tensors.size(); ++id) {
    const TensorPlacement& pl = plan_.tensors[id];
    if (pl.buffer < 0) continue;
    MEMFIT_ASSERT(pl.offset + pl.bytes <= buffers_[size_t(pl.tier)]->size(), "tensor {} placed outside its buffer",
                  tensors[id].name);
    pointers_[id] = buffers_[size_t(pl.tier)]->host_data() + pl.offset;
  }
  StartedCollectives started;
  prepared_.resize(program_.ops().size());
  op_seconds_.assign(program_.ops().size(), 0.0);
  for (size_t i = 0; i < program_.ops().size(); ++i) {
    const Op& op = program_.op(int(i));
    if (op.kind == OpKind::load_input) continue;
    OpBinding b;
    auto ptr = [&](TensorId id) -> void* { return id == kNoTensor ? nullptr : pointers_[size_t(id)]; };
    for (TensorId id : op.inputs) b.inputs.push_back(ptr(id));
    for (TensorId id : op.outputs) b.outputs.push_back(ptr(id));
    for (TensorId id : op.workspace) b.workspace.push_back(ptr(id));
    switch (queue_engine(op.queue)) {
      case Engine::compute: prepared_[i] = backend.prepare(program_, op, b); break;
      case Engine::communicator: prepared_[i] = prepare_collective(program_, op, b, *groups, started); break;
      case Engine::transfer:
        throw Error("runtime", fmt::format("op '{}' moves bytes between tiers, which this build cannot run yet", op.name));
    }
  }
  MEMFIT_CHECK(started.empty(), "runtime", "the program starts {} collective(s) it never waits for", started.size());
  auto range_of = [&](SectionKind kind) {
    const Section* s = program_.find_section(kind);
    return s ? OpRange{s->begin, s->end} : OpRange{};
  };
  micro_ = range_of(SectionKind::micro);
  sync_ = range_of(SectionKind::sync);
  optimizer_ = range_of(SectionKind::optimizer);
  if (const Section* micro = program_.find_section(SectionKind::micro)) micro_repeat_ = micro->repeat;
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
