// Executor: runs a compiled program. At construction it allocates one buffer per tier at the
// planned size, from the buffer type the backend serves that tier with (memory/), binds every tensor to its planned address and asks the backend to prepare
// every op; after that, running a section is a loop over prepared ops with no allocation.
// Ops of kind load_input are served by the InputHandler the trainer installs (the data
// loader fills a host buffer and writes it into the planned tensors). run_step is the one place that
// says what a step is (graph/program.hpp's SectionKind): every caller steps through it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "dist/communicator.hpp"
#include "kernels/backend.hpp"
#include "memory/arena.hpp"
#include "runtime/collective_op.hpp"
#include "runtime/compile.hpp"
#include "runtime/transfer_engine.hpp"

namespace memfit {

using InputHandler = std::function<void(const Op& op, const StepContext& ctx)>;

// Watches every op the executor runs (the profiler's trace, the leak guard's poisoning).
// Called inside steps, so implementations must not allocate.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void before_op(int op, const StepContext& ctx) {}
  virtual void after_op(int op, const StepContext& ctx) = 0;
};

// Decides, once a step's gradients exist (after its micro-steps and sync section), whether its
// optimizer section runs: fp16 loss scaling skips a step whose gradients overflowed
// (train/step_runner.hpp). Called inside steps, so implementations must not allocate.
class UpdateGate {
 public:
  virtual ~UpdateGate() = default;
  virtual bool apply_update(const StepContext& ctx) = 0;
};

// Where the disk tier's file goes (memory/disk_file.hpp): one file per rank under a directory.
struct ExecutorOptions {
  BufferSite disk;
};

class Executor {
 public:
  // Allocates each tier's buffer at the plan's peak from the backend's buffer type for it (a
  // disk tier's file under options.disk). Throws [runtime] when a disk tier is planned with no
  // directory or an op other than a transfer touches a tier the host cannot address, [memory]
  // when a buffer cannot be had, and [kernels] when an op has no kernel. Collective ops run
  // through the communicator of their group in `groups` (not owned; a world of one when null);
  // transfers through the executor's transfer engine (runtime/transfer_engine.hpp).
  Executor(const CompiledProgram& compiled, Backend& backend, const CommGroups* groups = nullptr,
           const ExecutorOptions& options = {});

  const Program& program() const { return program_; }
  const MemoryPlan& plan() const { return plan_; }

  void set_input_handler(InputHandler handler) { input_ = std::move(handler); }
  // Runs the ops of a section once. Throws [runtime] when the program has no such section.
  void run_section(SectionKind kind, const StepContext& ctx);
  // One optimizer step: the micro section `repeat` times (ctx.micro = 0, 1, ...; micro_count
  // = repeat), then the sync section (data-parallel programs), then the optimizer section
  // unless `gate` says otherwise. Returns whether the optimizer section ran.
  bool run_step(StepContext ctx, UpdateGate* gate = nullptr);
  // Ops [begin, end) in program order (tests use it to stop mid-section and inspect).
  void run_ops(int begin, int end, const StepContext& ctx) { run_range(begin, end, ctx); }

  // Copies a whole tensor out of or into its tier's buffer (whatever that tier is: the way
  // code outside runtime/ reaches tensors, so that it never holds an address into a tier). The
  // span must be exactly the tensor's bytes; throws [runtime] otherwise or when the tensor is
  // unplaced. None of these allocate, so they are usable inside steps.
  void read(TensorId id, std::span<std::byte> out) const;
  void write(TensorId id, std::span<const std::byte> in);
  // Bytes [byte_offset, byte_offset + span size) of the tensor (a chunk, a rank's piece);
  // throws [runtime] when the range does not lie inside the tensor.
  void read(TensorId id, uint64_t byte_offset, std::span<std::byte> out) const;
  void write(TensorId id, uint64_t byte_offset, std::span<const std::byte> in);
  template <typename T>
  void read_as(TensorId id, std::span<T> out) const {
    read(id, std::as_writable_bytes(out));
  }
  template <typename T>
  void write_as(TensorId id, std::span<const T> in) {
    write(id, std::as_bytes(in));
  }
  // Elements [first_element, first_element + span size) of a tensor whose elements are T.
  template <typename T>
  void read_as(TensorId id, int64_t first_element, std::span<T> out) const {
    read(id, uint64_t(first_element) * sizeof(T), std::as_writable_bytes(out));
  }
  template <typename T>
  void write_as(TensorId id, int64_t first_element, std::span<const T> in) {
    write(id, uint64_t(first_element) * sizeof(T), std::as_bytes(in));
  }
  // The value of a one-element tensor (a loss, a norm, a flag): its bytes must be sizeof(T).
  template <typename T>
  T read_scalar(TensorId id) const {
    T value{};
    read_as(id, std::span<T>(&value, 1));
    return value;
  }

  // A tier's buffer: its size and measured high-water mark, whatever the tier is.
  const Buffer& buffer(Tier t) const { return *buffers_[size_t(t)]; }
  // A tier held in a host arena (device and host on the CPU backend), for the leak guard's
  // poisoning and scans; throws [runtime] for any other buffer.
  Arena& arena(Tier t) const;

  // What the transfer engine's queues moved (asynchronous transfers: their workers' busy time);
  // zeros when the program has no transfers.
  TransferEngine::QueueStats transfer_stats(Queue q) const {
    return transfers_ ? transfers_->stats(q) : TransferEngine::QueueStats{};
  }
  void reset_transfer_stats() {
    if (transfers_) transfers_->reset_stats();
  }

  // Time spent per op (seconds, summed over runs) when timing is on.
  void set_timing(bool on) { timing_ = on; }
  void reset_op_seconds() { std::fill(op_seconds_.begin(), op_seconds_.end(), 0.0); }
  const std::vector<double>& op_seconds() const { return op_seconds_; }

  // Observers run in the order added: before_op before the op, after_op after it. Add them
  // before the first step (adding allocates); the executor does not own them.
  void add_observer(OpObserver* observer) { observers_.push_back(observer); }
  void remove_observers() { observers_.clear(); }

 private:
  // A tensor's address in its tier: for the executor's own use (binding ops) only; code outside
  // runtime/ copies through read/write instead.
  std::byte* data(TensorId id) const { return pointers_[size_t(id)]; }

  void allocate_tiers(const Backend& backend, const ExecutorOptions& options);
  void prepare_ops(Backend& backend, const CommGroups& groups);
  void run_range(int begin, int end, const StepContext& ctx);
  // The tensor's placement after checking that bytes [byte_offset, byte_offset + bytes) lie in it.
  const TensorPlacement& placed_range(TensorId id, uint64_t byte_offset, uint64_t bytes) const;

  const Program& program_;
  const MemoryPlan& plan_;
  std::array<std::unique_ptr<Buffer>, kNumTiers> buffers_;
  std::vector<std::byte*> pointers_;
  std::vector<std::unique_ptr<PreparedOp>> prepared_;  // null for load_input
  // Declared after buffers_, so destroyed before them: in-flight transfers finish first.
  std::unique_ptr<TransferEngine> transfers_;  // built when the program has transfers
  InputHandler input_;
  std::unique_ptr<CommGroups> own_groups_;  // when none are given
  const CommGroups* groups_ = nullptr;
  bool timing_ = false;
  std::vector<double> op_seconds_;
  std::vector<OpObserver*> observers_;
  // Ops of the step's sections, [begin, end) each (empty when the program has none).
  struct OpRange {
    int begin = 0, end = 0;
  };
  OpRange micro_, sync_, optimizer_;
  int micro_repeat_ = 1;
};

}  // namespace memfit
