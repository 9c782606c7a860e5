#include "runtime/transfer_engine.hpp"

#include <chrono>
#include <cstring>

#include "core/error.hpp"

namespace memfit {

namespace {

int worker_of(Queue q) {
  MEMFIT_ASSERT(q == Queue::transfer_out || q == Queue::transfer_in, "queue {} is not a transfer queue", queue_name(q));
  return q == Queue::transfer_out ? 0 : 1;
}

// A transfer that runs within its op (no async_id).
class SyncTransfer final : public PreparedOp {
 public:
  SyncTransfer(TransferEnd src, TransferEnd dst, uint64_t bytes) : src_(src), dst_(dst), bytes_(bytes) {}
  void run(const StepContext&) override { TransferEngine::copy(src_, dst_, bytes_); }

 private:
  TransferEnd src_, dst_;
  uint64_t bytes_;
};

class WaitTransfer final : public PreparedOp {
 public:
  explicit WaitTransfer(StartedTransfer& started) : started_(started) {}
  void run(const StepContext&) override { started_.complete(); }

 private:
  StartedTransfer& started_;
};

}  // namespace

void TransferEngine::copy(const TransferEnd& src, const TransferEnd& dst, uint64_t bytes) {
  if (bytes == 0) return;
  if (std::byte* from = src.buffer->host_data()) {
    dst.buffer->write(dst.offset, std::span<const std::byte>(from + src.offset, size_t(bytes)));
  } else {
    std::byte* to = dst.buffer->host_data();
    src.buffer->read(src.offset, std::span<std::byte>(to + dst.offset, size_t(bytes)));
  }
}

TransferEngine::TransferEngine() {
  for (Worker& w : workers_) w.thread = std::thread([this, &w] { run_worker(w); });
}

TransferEngine::~TransferEngine() {
  for (Worker& w : workers_) {
    std::unique_lock lock(w.mutex);
    w.finished.wait(lock, [&] { return w.head == w.tail; });  // let queued transfers finish
  }
  for (Worker& w : workers_) {
    {
      std::lock_guard lock(w.mutex);
      w.stopping = true;
    }
    w.work.notify_all();
  }
  for (Worker& w : workers_) w.thread.join();
}

void TransferEngine::run_worker(Worker& w) {
  std::unique_lock lock(w.mutex);
  for (;;) {
    w.work.wait(lock, [&] { return w.stopping || w.head != w.tail; });
    if (w.head == w.tail) return;  // stopping with nothing queued
    Request& r = w.slots[size_t(w.order[size_t(w.head % kSlots)])];
    lock.unlock();
    std::exception_ptr error;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      copy(r.src, r.dst, r.bytes);
    } catch (...) {
      error = std::current_exception();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    w.stats.bytes += r.bytes;
    w.stats.seconds += seconds;
    ++w.stats.transfers;
    r.error = error;
    r.done = true;
    ++w.head;
    w.finished.notify_all();
  }
}

TransferEngine::QueueStats TransferEngine::stats(Queue q) const {
  const Worker& w = workers_[size_t(worker_of(q))];
  std::lock_guard lock(w.mutex);
  return w.stats;
}

void TransferEngine::reset_stats() {
  for (Worker& w : workers_) {
    std::lock_guard lock(w.mutex);
    w.stats = QueueStats{};
  }
}

TransferEngine::Request* TransferEngine::start(Queue q, const TransferEnd& src, const TransferEnd& dst,
                                               uint64_t bytes) {
  Worker& w = workers_[size_t(worker_of(q))];
  std::unique_lock lock(w.mutex);
  MEMFIT_CHECK(w.in_flight < kSlots, "runtime", "more than {} transfers in flight on queue {}", kSlots,
               queue_name(q));
  int free = 0;
  while (w.slots[size_t(free)].in_use) ++free;  // one exists: in_flight < kSlots
  Request& r = w.slots[size_t(free)];
  r = Request{src, dst, bytes, true, false, nullptr};
  w.order[size_t(w.tail % kSlots)] = free;
  ++w.tail;
  ++w.in_flight;
  lock.unlock();
  w.work.notify_one();
  return &r;
}

void TransferEngine::wait(Queue q, Request* r) {
  Worker& w = workers_[size_t(worker_of(q))];
  std::unique_lock lock(w.mutex);
  w.finished.wait(lock, [&] { return r->done; });
  r->in_use = false;
  --w.in_flight;
  if (r->error) {
    std::exception_ptr error = std::exchange(r->error, nullptr);
    lock.unlock();
    std::rethrow_exception(error);
  }
}

void StartedTransfer::run(const StepContext&) {
  MEMFIT_CHECK(request_ == nullptr, "runtime", "transfer '{}' started again before its wait", name_);
  request_ = engine_.start(queue_, src_, dst_, bytes_);
}

void StartedTransfer::complete() {
  MEMFIT_CHECK(request_ != nullptr, "runtime", "transfer '{}' waited for but never started", name_);
  TransferEngine::Request* r = std::exchange(request_, nullptr);
  try {
    engine_.wait(queue_, r);
  } catch (const std::exception& e) {
    throw Error("io", fmt::format("transfer '{}' failed: {}", name_, e.what()));
  }
}

std::unique_ptr<PreparedOp> TransferEngine::prepare(const Program& p, const Op& op, const TransferEnd& src,
                                                    const TransferEnd& dst, StartedTransfers& started) {
  if (op.kind == OpKind::wait) {
    auto it = started.find(op.async_id);
    MEMFIT_CHECK(it != started.end(), "runtime", "wait '{}' names transfer {}, which no earlier op started", op.name,
                 op.async_id);
    StartedTransfer& s = *it->second;
    started.erase(it);
    return std::make_unique<WaitTransfer>(s);
  }
  MEMFIT_CHECK(op.kind == OpKind::transfer && op.inputs.size() == 1 && op.outputs.size() == 1, "runtime",
               "op '{}' ({}) on queue {} is not a transfer of one tensor", op.name, op_kind_name(op.kind),
               queue_name(op.queue));
  const TensorDesc& from = p.tensor(op.inputs[0]);
  const TensorDesc& to = p.tensor(op.outputs[0]);
  MEMFIT_CHECK(from.bytes() == to.bytes(), "runtime", "transfer '{}': '{}' holds {} bytes but '{}' {}", op.name,
               from.name, from.bytes(), to.name, to.bytes());
  MEMFIT_CHECK(from.tier != to.tier, "runtime", "transfer '{}' moves '{}' within the {} tier", op.name, from.name,
               tier_name(from.tier));
  MEMFIT_CHECK(src.buffer->host_data() || dst.buffer->host_data(), "runtime",
               "transfer '{}' moves between two tiers the host cannot address ({} to {})", op.name,
               tier_name(from.tier), tier_name(to.tier));
  if (op.async_id < 0) return std::make_unique<SyncTransfer>(src, dst, from.bytes());
  auto run = std::make_unique<StartedTransfer>(*this, op.queue, src, dst, from.bytes(), op.name.c_str());
  MEMFIT_CHECK(started.emplace(op.async_id, run.get()).second, "runtime", "transfer {} is started by two ops ('{}')",
               op.async_id, op.name);
  return run;
}

}  // namespace memfit
