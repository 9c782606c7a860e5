// The MPI communicator (MPI_COMM_WORLD) with non-blocking collectives. The subtle points:
// - MPI counts are int: a collective over more than 2^30 elements is split into several
//   requests, all held by one ticket.
// - MPI has no 16-bit float types: bf16 and fp16 travel as 2-byte types with user-defined
//   reduction ops that add in fp32 and round once per combination (to nearest even).
// - Request slots are preallocated; a ticket is a slot index, so a step allocates nothing in
//   memfit code (MPI's own bookkeeping happens inside LibraryCallScope).
#include <mpi.h>

#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "core/error.hpp"
#include "io/float_convert.hpp"
#include "dist/communicator.hpp"
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

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error("dist", fmt::format("{} failed: {}", what, std::string(text, size_t(len))));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Type_contiguous(2, MPI_BYTE, &types_.half);
    MPI_Type_commit(&types_.half);
    MPI_Op_create(&reduce16<bf16_to_float, float_to_bf16, false>, 1, &types_.bf16_sum);
    MPI_Op_create(&reduce16<bf16_to_float, float_to_bf16, true>, 1, &types_.bf16_max);
    MPI_Op_create(&reduce16<f16_to_float, float_to_f16, false>, 1, &types_.f16_sum);
    MPI_Op_create(&reduce16<f16_to_float, float_to_f16, true>, 1, &types_.f16_max);
    for (auto& slot : slots_) slot.fill(MPI_REQUEST_NULL);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  CommTicket start_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    const CommTicket t = take_slot();
    for_chunks(t, count, dtype, [&](int64_t off, int n, MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, at(data, off, dtype), n, mpi_type(dtype), mpi_op(dtype, op), MPI_COMM_WORLD, r);
    });
    return t;
  }

  CommTicket start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    MEMFIT_CHECK(count <= kMaxChunk, "dist", "reduce-scatter of {} elements per rank exceeds {}", count, kMaxChunk);
    const CommTicket t = take_slot();
    LibraryCallScope scope;
    // send == recv: MPI's in-place form (the input is recv; the result lands at its start).
    check(MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, int(count), mpi_type(dtype), mpi_op(dtype, op), MPI_COMM_WORLD,
                                    &slots_[size_t(t)][0]),
          "MPI_Ireduce_scatter_block");
    return t;
  }

  CommTicket start_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    MEMFIT_CHECK(count <= kMaxChunk, "dist", "all-gather of {} elements per rank exceeds {}", count, kMaxChunk);
    const CommTicket t = take_slot();
    LibraryCallScope scope;
    // In place when the caller's block already sits at its place in recv.
    const void* src = send == at(recv, int64_t(rank_) * count, dtype) ? MPI_IN_PLACE : send;
    check(MPI_Iallgather(src, int(count), mpi_type(dtype), recv, int(count), mpi_type(dtype), MPI_COMM_WORLD,
                         &slots_[size_t(t)][0]),
          "MPI_Iallgather");
    return t;
  }

  CommTicket start_broadcast(void* data, int64_t count, DType dtype, int root) override {
    const CommTicket t = take_slot();
    for_chunks(t, count, dtype, [&](int64_t off, int n, MPI_Request* r) {
      return MPI_Ibcast(at(data, off, dtype), n, mpi_type(dtype), root, MPI_COMM_WORLD, r);
    });
    return t;
  }

  void wait(CommTicket t) override {
    MEMFIT_ASSERT(t >= 0 && t < kSlots && busy_[size_t(t)], "wait on ticket {} that is not pending", t);
    LibraryCallScope scope;
    check(MPI_Waitall(kRequestsPerSlot, slots_[size_t(t)].data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
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
    LibraryCallScope scope;
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  }

 private:
  CommTicket take_slot() {
    for (int i = 0; i < kSlots; ++i) {
      const int s = (next_ + i) % kSlots;
      if (!busy_[size_t(s)]) {
        busy_[size_t(s)] = true;
        ++in_flight_;
        next_ = s + 1;
        return s;
      }
    }
    MEMFIT_ASSERT(false, "more than {} collectives in flight", kSlots);
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
      case DType::f16: return types_.half;
      case DType::i8: return MPI_INT8_T;
      case DType::u8: return MPI_UINT8_T;
      case DType::nf4: break;
    }
    throw Error("dist", fmt::format("no collective for {} tensors", dtype_name(t)));
  }

  MPI_Op mpi_op(DType t, ReduceOp op) const {
    if (t == DType::bf16) return op == ReduceOp::sum ? types_.bf16_sum : types_.bf16_max;
    if (t == DType::f16) return op == ReduceOp::sum ? types_.f16_sum : types_.f16_max;
    return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  }

  int rank_ = 0, size_ = 1, next_ = 0, in_flight_ = 0;
  MpiTypes types_;
  std::array<std::array<MPI_Request, kRequestsPerSlot>, kSlots> slots_{};
  std::array<bool, kSlots> busy_{};
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

int launched_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 1) return std::atoi(v);
  }
  return 1;
}

bool launched_with_several_ranks() { return launched_world_size() > 1; }

}  // namespace memfit
