// The MPI communicator (MPI_COMM_WORLD, or a group split from it) with non-blocking
// collectives. The subtle points:
// - MPI counts are int: a collective over more than 2^30 elements is split into several
//   requests, all held by one ticket.
// - MPI has no 16-bit float types: bf16 and fp16 travel as 2-byte types.
// - Request slots are preallocated; a ticket is a slot index, so a step allocates nothing in
//   memfit code (MPI's own bookkeeping happens inside LibraryCallScope).
// - Sums and maxima run as rings over point-to-point messages (dist/mpi_ring.hpp) through one
//   scratch segment the communicator holds from its creation (resident_bytes), one ring at a
//   time in start order; OpenMPI's own non-blocking reductions allocate copies of their data
//   on every call. Gathers and broadcasts are MPI's (they allocate nothing).
// - Waits poll (MPI_Testall) against the timeout; starting a collective publishes this rank's
//   count of collectives started on the communicator (dist/mpi_arrivals.hpp), which is how a
//   timed-out wait names the ranks that did not arrive.
#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/library_scope.hpp"
#include "dist/communicator.hpp"
#include "dist/mpi_arrivals.hpp"
#include "dist/mpi_ring.hpp"

namespace memfit {

namespace {

constexpr int64_t kMaxChunk = int64_t(1) << 30;  // elements per MPI call
constexpr int kSlots = 64;
constexpr int kRequestsPerSlot = 8;
constexpr int64_t kRingScratchBytes = int64_t(2) << 20;

struct MpiTypes {
  MPI_Datatype half = MPI_DATATYPE_NULL;  // 2 opaque bytes, for bf16 and fp16
};

// Created once per process (after MPI_Init), shared by every communicator.
const MpiTypes& mpi_types() {
  static const MpiTypes types = [] {
    MpiTypes t;
    MPI_Type_contiguous(2, MPI_BYTE, &t.half);
    MPI_Type_commit(&t.half);
    return t;
  }();
  return types;
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error("dist", fmt::format("{} failed: {}", what, std::string(text, size_t(len))));
}

using Clock = std::chrono::steady_clock;

// How long a timed-out rank waits for each other rank's counter, and how long a rank that
// timed out but is not the one to report keeps waiting for the reporter to end the job.
constexpr double kReadSeconds = 1.0;
constexpr double kReporterGraceSeconds = 2.0;
// A wait spins this many polls (tens of microseconds) before it sleeps between polls.
constexpr uint32_t kSpinPolls = 2048;
constexpr std::chrono::microseconds kIdlePause{20};

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return (ranks.size() == 1 ? "rank " : "ranks ") + s;
}

class MpiCommunicator final : public Communicator {
 public:
  // Collective over comm (the arrival slot). Owns (frees) comm when `owned`.
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> members(size_t(size_), 0);
    for (int r = 0; r < size_; ++r) members[size_t(r)] = r;
    world_ranks_.assign(size_t(size_), -1);
    MPI_Group_translate_ranks(group, size_, members.data(), world, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    mpi_types();
    arrival_slot_ = mpi_arrivals::acquire_slot(comm_);
    for (auto& slot : slots_) slot.fill(MPI_REQUEST_NULL);
    // Touched now, so it is resident before any plan is compared with the process's RSS.
    ring_scratch_.assign(size_t(kRingScratchBytes), std::byte{0});
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    mpi_arrivals::release_slot(arrival_slot_);
    // Freeing is collective: while an exception unwinds (this rank is failing, the job is
    // about to be ended) it could wait for ranks that never come.
    if (owned_ && std::uncaught_exceptions() == 0) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank(int rank) const override { return world_ranks_[size_t(rank)]; }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  uint64_t resident_bytes() const override { return ring_scratch_.size(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    {
      LibraryCallScope scope;
      check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    }
    auto c = std::make_unique<MpiCommunicator>(sub, true);
    c->set_timeout(timeout_);
    return c;
  }

  int ranks_on_node() override {
    LibraryCallScope scope;
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int n = 1;
    check(MPI_Comm_size(node, &n), "MPI_Comm_size");
    check(MPI_Comm_free(&node), "MPI_Comm_free");
    return n;
  }

  CommTicket start_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    return start_ring({RingReduction::Kind::all_reduce, data, data, count, dtype, op}, "all_reduce");
  }

  CommTicket start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    // send == recv: the in-place form (the input is recv; the result lands at its start).
    return start_ring({RingReduction::Kind::reduce_scatter, send, recv, count, dtype, op}, "reduce_scatter");
  }

  CommTicket start_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    MEMFIT_CHECK(count <= kMaxChunk, "dist", "all-gather of {} elements per rank exceeds {}", count, kMaxChunk);
    const CommTicket t = take_slot("all_gather");
    LibraryCallScope scope;
    // In place when the caller's block already sits at its place in recv.
    const void* src = send == at(recv, int64_t(rank_) * count, dtype) ? MPI_IN_PLACE : send;
    check(MPI_Iallgather(src, int(count), mpi_type(dtype), recv, int(count), mpi_type(dtype), comm_,
                         &slots_[size_t(t)][0]),
          "MPI_Iallgather");
    return t;
  }

  CommTicket start_broadcast(void* data, int64_t count, DType dtype, int root) override {
    const CommTicket t = take_slot("broadcast");
    for_chunks(t, count, dtype, [&](int64_t off, int n, MPI_Request* r) {
      return MPI_Ibcast(at(data, off, dtype), n, mpi_type(dtype), root, comm_, r);
    });
    return t;
  }

  // MPI's own (pairwise exchanges: no reduction, so no copies of the data).
  CommTicket start_all_to_all(const void* send, void* recv, int64_t count, DType dtype) override {
    MEMFIT_CHECK(count <= kMaxChunk, "dist", "all-to-all of {} elements per rank exceeds {}", count, kMaxChunk);
    const CommTicket t = take_slot("all_to_all");
    LibraryCallScope scope;
    check(MPI_Ialltoall(send, int(count), mpi_type(dtype), recv, int(count), mpi_type(dtype), comm_,
                        &slots_[size_t(t)][0]),
          "MPI_Ialltoall");
    return t;
  }

  void wait(CommTicket t) override {
    MEMFIT_ASSERT(t >= 0 && t < kSlots && busy_[size_t(t)], "wait on ticket {} that is not pending", t);
    LibraryCallScope scope;
    const bool timed = timeout_ > 0;
    const Clock::time_point deadline =
        timed ? Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_))
              : Clock::time_point::max();
    // Polls rather than MPI_Waitall, which spins inside the library: after a short spin a
    // waiting rank sleeps between polls, so ranks that wait on a slower peer give their core
    // to the ranks (or other jobs) still computing. Oversubscribed runs (more ranks than
    // cores) were several times slower with every waiting rank spinning.
    int done = 0;
    for (uint32_t polls = 1;; ++polls) {
      done = test(t);
      if (done) break;
      if (polls % 256 == 0 && timed && Clock::now() > deadline && timed_out(t)) break;
      if (polls > kSpinPolls) std::this_thread::sleep_for(kIdlePause);
    }
    busy_[size_t(t)] = false;
    ring_[size_t(t)] = false;
    --in_flight_;
  }

  bool pending() const override { return in_flight_ > 0; }

  void progress() override {
    LibraryCallScope scope;
    advance_rings();
    for (int s = 0; s < kSlots && in_flight_ > 0; ++s) {
      if (!busy_[size_t(s)] || ring_[size_t(s)]) continue;
      int done = 0;
      check(MPI_Testall(kRequestsPerSlot, slots_[size_t(s)].data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    }
  }

  void barrier() override {
    const CommTicket t = take_slot("barrier");
    {
      LibraryCallScope scope;
      check(MPI_Ibarrier(comm_, &slots_[size_t(t)][0]), "MPI_Ibarrier");
    }
    wait(t);
  }

 private:
  struct Started {
    const char* kind = "";
    const char* label = nullptr;
    int64_t sequence = 0;  // this collective's number on the communicator, from 1
  };

  CommTicket take_slot(const char* kind) {
    for (int i = 0; i < kSlots; ++i) {
      const int s = (next_ + i) % kSlots;
      if (!busy_[size_t(s)]) {
        busy_[size_t(s)] = true;
        ++in_flight_;
        next_ = s + 1;
        started_[size_t(s)] = Started{kind, take_label(), ++sequence_};
        mpi_arrivals::publish(arrival_slot_, sequence_);
        return s;
      }
    }
    MEMFIT_ASSERT(false, "more than {} collectives in flight", kSlots);
  }

  // The wait for ticket t passed its deadline: reads every member's count of started
  // collectives and throws [dist] naming the ranks that did not arrive. The lowest rank that
  // arrived reports; the others keep waiting a little while it ends the job, and report too
  // only if it does not (true: the collective completed meanwhile).
  bool timed_out(CommTicket t) {
    const Started& c = started_[size_t(t)];
    std::vector<int> arrived, missing;
    for (int r = 0; r < size_; ++r) {
      const int64_t count = r == rank_ ? sequence_ : mpi_arrivals::read(world_rank(r), arrival_slot_, kReadSeconds);
      (count >= c.sequence ? arrived : missing).push_back(world_rank(r));
    }
    const std::string message = fmt::format(
        "collective '{}' ({} #{} on the {} group of {} ranks) did not complete within {:g} s: {}", c.label ? c.label : c.kind,
        c.kind, c.sequence, name(), size_, timeout_,
        missing.empty() ? "every rank arrived, the transport did not finish it" : rank_list(missing) + " did not arrive");
    if (arrived.front() != world_rank(rank_)) {
      const Clock::time_point grace = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                         std::chrono::duration<double>(kReporterGraceSeconds));
      int done = 0;
      while (!done && Clock::now() < grace) {
        done = test(t);
        std::this_thread::yield();
      }
      if (done) return true;
    }
    throw Error("dist", message);
  }

  CommTicket start_ring(const RingReduction::Spec& spec, const char* kind) {
    const CommTicket t = take_slot(kind);
    ring_[size_t(t)] = true;
    rings_[size_t(t)].prepare(spec, comm_, rank_, size_, ring_scratch_.data(), kRingScratchBytes);
    LibraryCallScope scope;
    advance_rings();
    return t;
  }

  // Runs the started rings in start order, one at a time (they share the scratch), as far as
  // their messages have arrived.
  void advance_rings() {
    for (;;) {
      int head = -1;
      for (int s = 0; s < kSlots; ++s)
        if (busy_[size_t(s)] && ring_[size_t(s)] && !rings_[size_t(s)].finished() &&
            (head < 0 || started_[size_t(s)].sequence < started_[size_t(head)].sequence))
          head = s;
      if (head < 0) return;
      RingReduction& r = rings_[size_t(head)];
      if (!r.started()) r.start();
      if (!r.advance()) return;
    }
  }

  // Whether collective t has completed (moving every ring, and MPI's progress, on).
  bool test(CommTicket t) {
    advance_rings();
    if (ring_[size_t(t)]) return rings_[size_t(t)].finished();
    int done = 0;
    check(MPI_Testall(kRequestsPerSlot, slots_[size_t(t)].data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    return done != 0;
  }

  template <typename Start>
  void for_chunks(CommTicket t, int64_t count, DType dtype, Start start) {
    const int64_t chunks = (count + kMaxChunk - 1) / kMaxChunk;
    MEMFIT_CHECK(chunks <= kRequestsPerSlot, "dist", "a collective of {} elements is too large", count);
    LibraryCallScope scope;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t off = c * kMaxChunk;
      const int n = int(std::min(kMaxChunk, count - off));
      check(start(off, n, &slots_[size_t(t)][size_t(c)]), "MPI collective");
    }
  }

  static void* at(void* base, int64_t elements, DType dtype) {
    return static_cast<char*>(base) + dtype_bytes(dtype, elements);
  }
  static const void* at(const void* base, int64_t elements, DType dtype) {
    return static_cast<const char*>(base) + dtype_bytes(dtype, elements);
  }

  MPI_Datatype mpi_type(DType t) const {
    switch (t) {
      case DType::f32: return MPI_FLOAT;
      case DType::i32: return MPI_INT32_T;
      case DType::bf16:
      case DType::f16: return mpi_types().half;
      case DType::i8: return MPI_INT8_T;
      case DType::u8: return MPI_UINT8_T;
      case DType::nf4: break;
    }
    throw Error("dist", fmt::format("no collective for {} tensors", dtype_name(t)));
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1, next_ = 0, in_flight_ = 0;
  std::vector<int> world_ranks_;  // of each member
  int arrival_slot_ = -1;
  int64_t sequence_ = 0;  // collectives started on this communicator
  double timeout_ = 0;
  std::array<std::array<MPI_Request, kRequestsPerSlot>, kSlots> slots_{};
  std::array<bool, kSlots> busy_{};
  std::array<Started, kSlots> started_{};
  std::array<bool, kSlots> ring_{};
  std::array<RingReduction, kSlots> rings_{};
  std::vector<std::byte> ring_scratch_;
};

}  // namespace

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
}

std::unique_ptr<Communicator> make_mpi_communicator() {
  ensure_mpi();
  mpi_arrivals::ensure_window();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

}  // namespace memfit
