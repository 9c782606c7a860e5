// The transfer engine: runs OpKind::transfer ops, which move a tensor's bytes between tiers
// (device, host, disk). A transfer with no Op::async_id runs in the op itself; one with an id
// only starts (it is queued to the worker thread of its queue, transfer.out or transfer.in) and
// the wait op with the same id blocks until the worker has finished it, so compute runs while
// the bytes move. Bytes move through the tiers' Buffers (memory/buffer_type.hpp): a memcpy
// between host-addressable tiers, pread/pwrite at the planned offsets for a disk file. A
// kernel never sees where its operands came from.
//
// Invariants: every request slot is allocated when the engine is built, so starting and
// waiting allocate nothing; at most kSlots transfers per queue are in flight (the scheduler's
// queue depth for transfers, graph/op.hpp); a failure in a worker (a short write, ENOSPC, EIO) is kept with its
// transfer and thrown as [io] by that transfer's wait, naming the op; the engine's destructor
// lets in-flight transfers finish before the workers stop, so no worker writes into a buffer
// after the executor has freed it.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "graph/program.hpp"
#include "kernels/backend.hpp"
#include "memory/buffer_type.hpp"

namespace memfit {

// Where a transfer reads or writes: a tier's buffer and a byte offset into it.
struct TransferEnd {
  Buffer* buffer = nullptr;
  uint64_t offset = 0;
};

class StartedTransfer;
// Started transfers whose wait op is not prepared yet, by Op::async_id (prepare time only).
using StartedTransfers = std::map<int, StartedTransfer*>;

class TransferEngine {
 public:
  static constexpr int kSlots = kTransferQueueDepth;  // per queue: the scheduler's depth

  TransferEngine();
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // A prepared transfer op, or the wait of a started one (matched by Op::async_id through
  // `started`, at prepare time). Throws [runtime] when the op is not a transfer or a wait on a
  // transfer queue, when its ends are not two different tiers of equal bytes, when neither end
  // is host-addressable (disk to disk), or when a wait names no started transfer.
  std::unique_ptr<PreparedOp> prepare(const Program& p, const Op& op, const TransferEnd& src, const TransferEnd& dst,
                                      StartedTransfers& started);

  // Copies `bytes` from src to dst now (in the calling thread). Throws [memory]/[io] from the buffers.
  static void copy(const TransferEnd& src, const TransferEnd& dst, uint64_t bytes);

  // What each worker moved since construction (or reset_stats): bytes, and seconds spent
  // copying them (the worker's busy time, so bytes / seconds is the achieved bandwidth).
  struct QueueStats {
    uint64_t bytes = 0, transfers = 0;
    double seconds = 0;
  };
  QueueStats stats(Queue q) const;
  void reset_stats();

 private:
  friend class StartedTransfer;
  struct Request {
    TransferEnd src, dst;
    uint64_t bytes = 0;
    bool in_use = false, done = false;  // in use from start to wait; done once the worker copied
    std::exception_ptr error;
  };
  struct Worker {
    std::array<Request, kSlots> slots;
    std::array<int, kSlots> order{};  // slot indices in start order: [head, tail) are queued
    int head = 0, tail = 0, in_flight = 0;
    bool stopping = false;
    QueueStats stats;  // guarded by mutex
    mutable std::mutex mutex;
    std::condition_variable work, finished;
    std::thread thread;
  };
  Request* start(Queue q, const TransferEnd& src, const TransferEnd& dst, uint64_t bytes);
  void wait(Queue q, Request* r);
  void run_worker(Worker& w);

  std::array<Worker, 2> workers_;  // transfer_out, transfer_in
};

// A started transfer that its wait op completes.
class StartedTransfer : public PreparedOp {
 public:
  StartedTransfer(TransferEngine& engine, Queue queue, TransferEnd src, TransferEnd dst, uint64_t bytes,
                  const char* name)
      : engine_(engine), queue_(queue), src_(src), dst_(dst), bytes_(bytes), name_(name) {}
  void run(const StepContext&) override;
  void complete();

 private:
  TransferEngine& engine_;
  Queue queue_;
  TransferEnd src_, dst_;
  uint64_t bytes_;
  const char* name_;  // the program outlives its prepared ops
  TransferEngine::Request* request_ = nullptr;
};

}  // namespace memfit
