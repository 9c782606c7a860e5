#include "train/step_runner.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/half.hpp"
#include "graph/precision.hpp"

namespace memfit {

namespace {

// Whether tensor `id` holds inf or NaN, read a chunk of `raw` at a time.
bool holds_non_finite(const Executor& ex, TensorId id, std::span<std::byte> raw) {
  const TensorDesc& t = ex.program().tensor(id);
  bool found = false;
  visit_float_type(t.dtype, [&](auto tag) {
    using T = decltype(tag);
    const std::span<T> chunk(reinterpret_cast<T*>(raw.data()), raw.size() / sizeof(T));
    for (int64_t first = 0; first < t.numel() && !found; first += int64_t(chunk.size())) {
      const std::span<T> x = chunk.first(size_t(std::min<int64_t>(int64_t(chunk.size()), t.numel() - first)));
      ex.read_as<T>(id, first, x);
      for (size_t i = 0; i < x.size() && !found; ++i) found = non_finite(x[i]);
    }
  });
  return found;
}

}  // namespace

StepRunner::StepRunner(Executor& ex, InputHandler input, const LossScaleConfig& scaling, TensorStaging& staging)
    : ex_(ex), staging_(staging), input_(std::move(input)) {
  const Program& p = ex.program();
  const Section* micro = p.find_section(SectionKind::micro);
  MEMFIT_ASSERT(micro != nullptr, "the program has no micro section");
  micro_begin_ = micro->begin, micro_end_ = micro->end, micro_repeat_ = micro->repeat;
  if (const TensorId flag = p.find_tensor(kOverflowFlag); flag != kNoTensor) {
    flag_ = flag;
    scaler_.emplace(scaling);
    for (int i = micro_begin_; i < micro_end_; ++i) {
      const Op& op = p.op(i);
      if (op.kind != OpKind::load_input) continue;
      load_ops_.push_back(&op);
      for (int m = 0; m < micro_repeat_; ++m) {
        uint64_t bytes = 0;
        for (TensorId id : op.outputs) bytes += p.tensor(id).bytes();
        recorded_.emplace_back(bytes);
      }
    }
  }
  ex_.set_input_handler([this](const Op& op, const StepContext& ctx) { on_input(op, ctx); });
}

void StepRunner::on_input(const Op& op, const StepContext& ctx) {
  size_t slot = 0;
  while (slot < load_ops_.size() && load_ops_[slot] != &op) ++slot;
  if (slot == load_ops_.size()) return input_(op, ctx);  // eval, or no recording
  std::vector<std::byte>& rec = recorded_[size_t(ctx.micro) * load_ops_.size() + slot];
  const Program& p = ex_.program();
  if (!replaying_) input_(op, ctx);
  uint64_t at = 0;
  for (TensorId id : op.outputs) {
    const uint64_t bytes = p.tensor(id).bytes();
    const std::span<std::byte> copy(rec.data() + at, bytes);
    if (replaying_) ex_.write(id, std::span<const std::byte>(copy));
    else ex_.read(id, copy);
    at += bytes;
  }
}

bool StepRunner::apply_update(const StepContext&) {
  outcome_ = scaler_->update(ex_.read_scalar<float>(flag_) != 0.0f);
  return outcome_ == LossScaler::Outcome::applied;
}

StepRunner::Result StepRunner::run(StepContext ctx) {
  if (!scaler_) {
    ex_.run_step(ctx);
    return Result{};
  }
  ctx.loss_scale = scaler_->scale();
  ex_.run_step(ctx, this);
  if (outcome_ == LossScaler::Outcome::exhausted) {
    ctx.micro_count = micro_repeat_;
    const std::string culprit = find_first_non_finite(ctx);
    throw Error("train", fmt::format("gradients overflowed at the minimum loss scale {} in optimizer step {}: {}; "
                                     "fp16 cannot hold this run's values (largest finite fp16 is 65504): "
                                     "try --precision bf16, which has fp32's range",
                                     ctx.loss_scale, ctx.step,
                                     culprit.empty() ? "no op output held inf/NaN when the step was re-run"
                                                     : "the first op whose output held inf/NaN is " + culprit));
  }
  return Result{outcome_ == LossScaler::Outcome::applied, ctx.loss_scale};
}

std::string StepRunner::find_first_non_finite(StepContext ctx) {
  const Program& p = ex_.program();
  replaying_ = true;
  std::string found;
  for (int m = 0; m < micro_repeat_ && found.empty(); ++m) {
    ctx.micro = m;
    for (int i = micro_begin_; i < micro_end_ && found.empty(); ++i) {
      ex_.run_ops(i, i + 1, ctx);
      const Op& op = p.op(i);
      for (TensorId id : op.outputs) {
        if (id == kNoTensor || !dtype_is_float(p.tensor(id).dtype)) continue;
        if (!holds_non_finite(ex_, id, staging_.raw())) continue;
        found = fmt::format("op '{}' ({}, {}, layer {}) writing '{}' in micro-step {}", op.name, op_kind_name(op.kind),
                            phase_name(op.phase), op.layer, p.tensor(id).name, m);
        break;
      }
    }
  }
  replaying_ = false;
  return found;
}

}  // namespace memfit
