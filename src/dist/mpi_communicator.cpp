// The MPI communicator (MPI_COMM_WORLD, or a group split from it) with non-blocking
// collectives. The subtle points:
// - MPI counts are int: a collective over more than 2^30 elements is split into several
//   requests, all held by one ticket.
// - MPI has no 16-bit float types: bf16 and fp16 travel as 2-byte types with user-defined
//   reduction ops that add in fp32 and round once per combination (to nearest even).
// - Request slots are preallocated; a ticket is a slot index, so a step allocates nothing in
//   memfit code (MPI's own bookkeeping happens inside LibraryCallScope).
// - Waits poll (MPI_Testall) against the timeout; starting a collective publishes this rank's
//   count of collectives started on the communicator (dist/mpi_arrivals.hpp), which is how a
//   timed-out wait names the ranks that did not arrive.
#include <mpi.h>

#include <array>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include <immintrin.h>

#include "core/error.hpp"
#include "io/float_convert.hpp"
#include "dist/communicator.hpp"
#include "dist/mpi_arrivals.hpp"
#include "kernels/library_scope.hpp"

namespace memfit {

namespace {

constexpr int64_t kMaxChunk = int64_t(1) << 30;  // elements per MPI call
constexpr int kSlots = 64;
constexpr int kRequestsPerSlot = 8;

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }
uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_float(uint16_t h) { return f32_from_f16_bits(h); }
uint16_t float_to_f16(float f) {
#if defined(__F16C__)
  return uint16_t(_cvtss_sh(f, 0));  // round to nearest even
#else
  (void)f;
  throw Error("dist", "fp16 reductions need a CPU with F16C (build with MEMFIT_NATIVE=ON)");
#endif
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float), bool Max>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = Load(a[i]), y = Load(b[i]);
    b[i] = Store(Max ? (x > y ? x : y) : x + y);
  }
}

struct MpiTypes {
  MPI_Datatype half = MPI_DATATYPE_NULL;  // 2 opaque bytes, for bf16 and fp16
  MPI_Op bf16_sum{}, bf16_max{}, f16_sum{}, f16_max{};
};

// Created once per process (after MPI_Init), shared by every communicator.
const MpiTypes& mpi_types() {
  static const MpiTypes types = [] {
    MpiTypes t;
    MPI_Type_contiguous(2, MPI_BYTE, &t.half);
    MPI_Type_commit(&t.half);
    MPI_Op_create(&reduce16<bf16_to_float, float_to_bf16, false>, 1, &t.bf16_sum);
    MPI_Op_create(&reduce16<bf16_to_float, float_to_bf16, true>, 1, &t.bf16_max);
    MPI_Op_create(&reduce16<f16_to_float, float_to_f16, false>, 1, &t.f16_sum);
    MPI_Op_create(&reduce16<f16_to_float, float_to_f16, true>, 1, &t.f16_max);
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

  CommTicket start_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    const CommTicket t = take_slot("all_reduce");
    for_chunks(t, count, dtype, [&](int64_t off, int n, MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, at(data, off, dtype), n, mpi_type(dtype), mpi_op(dtype, op), comm_, r);
    });
    return t;
  }

  CommTicket start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    MEMFIT_CHECK(count <= kMaxChunk, "dist", "reduce-scatter of {} elements per rank exceeds {}", count, kMaxChunk);
    const CommTicket t = take_slot("reduce_scatter");
    LibraryCallScope scope;
    // send == recv: MPI's in-place form (the input is recv; the result lands at its start).
    check(MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, int(count), mpi_type(dtype),
                                    mpi_op(dtype, op), comm_, &slots_[size_t(t)][0]),
          "MPI_Ireduce_scatter_block");
    return t;
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

  void wait(CommTicket t) override {
    MEMFIT_ASSERT(t >= 0 && t < kSlots && busy_[size_t(t)], "wait on ticket {} that is not pending", t);
    LibraryCallScope scope;
    MPI_Request* requests = slots_[size_t(t)].data();
    if (timeout_ <= 0) {
      check(MPI_Waitall(kRequestsPerSlot, requests, MPI_STATUSES_IGNORE), "MPI_Waitall");
    } else {
      const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                            std::chrono::duration<double>(timeout_));
      int done = 0;
      for (uint32_t polls = 1;; ++polls) {
        check(MPI_Testall(kRequestsPerSlot, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
        if (done) break;
        if (polls % 256 == 0 && Clock::now() > deadline && timed_out(t)) break;
      }
    }
    busy_[size_t(t)] = false;
    --in_flight_;
  }

  bool pending() const override { return in_flight_ > 0; }

  void progress() override {
    LibraryCallScope scope;
    for (int s = 0; s < kSlots && in_flight_ > 0; ++s) {
      if (!busy_[size_t(s)]) continue;
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
        check(MPI_Testall(kRequestsPerSlot, slots_[size_t(t)].data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
        std::this_thread::yield();
      }
      if (done) return true;
    }
    throw Error("dist", message);
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

  MPI_Op mpi_op(DType t, ReduceOp op) const {
    const MpiTypes& m = mpi_types();
    if (t == DType::bf16) return op == ReduceOp::sum ? m.bf16_sum : m.bf16_max;
    if (t == DType::f16) return op == ReduceOp::sum ? m.f16_sum : m.f16_max;
    return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
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
