#include "dist/mpi_ring.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace memfit {

namespace {

constexpr int kRingTag = 0x4d46;  // one ring at a time per communicator: messages pair up in order
constexpr int64_t kWideBytes = 4;  // fp32 partial sums (int32 for int32 data)

// The type partial sums of T accumulate in, and the conversions to and from it.
template <class T>
struct Wide {
  using type = float;
  static float up(T x) { return widen(x); }
  static T down(float x) { return narrow<T>(x); }
};
template <>
struct Wide<int32_t> {
  using type = int32_t;
  static int32_t up(int32_t x) { return x; }
  static int32_t down(int32_t x) { return x; }
};

template <class W>
W combine(W a, W b, ReduceOp op) {
  return op == ReduceOp::sum ? a + b : (a > b ? a : b);
}

// Calls f(T{}) with T the element type of dtype.
template <class F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::i32: return f(int32_t{});
    case DType::bf16: return f(bf16_t{});
    case DType::f16: return f(fp16_t{});
    default: break;
  }
  MEMFIT_ASSERT(false, "ring reduction of {}", dtype_name(dtype));
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error("dist", fmt::format("{} failed in a ring reduction (MPI error {})", what, rc));
}

bool test(MPI_Request* r) {
  int done = 0;
  check_mpi(MPI_Test(r, &done, MPI_STATUS_IGNORE), "MPI_Test");
  return done != 0;
}

}  // namespace

void RingReduction::prepare(const Spec& spec, MPI_Comm comm, int rank, int size, std::byte* scratch,
                            int64_t scratch_bytes) {
  MEMFIT_CHECK(spec.dtype == DType::f32 || spec.dtype == DType::i32 || spec.dtype == DType::bf16 ||
                   spec.dtype == DType::f16,
               "dist", "no reduction for {} tensors", dtype_name(spec.dtype));
  spec_ = spec;
  comm_ = comm;
  rank_ = rank;
  size_ = size;
  scratch_ = scratch;
  element_bytes_ = int64_t(dtype_bytes(spec.dtype, 1));
  segment_elements_ = scratch_bytes / (3 * kWideBytes);
  int64_t largest = 0;
  for (int64_t b = 0; b < size_; ++b) largest = std::max(largest, block_size(b));
  segments_ = (largest + segment_elements_ - 1) / segment_elements_;
  phase_ = Phase::idle;
}

int64_t RingReduction::block_begin(int64_t block) const {
  return spec_.kind == Kind::all_reduce ? block * spec_.count / size_ : block * spec_.count;
}

int64_t RingReduction::segment_length(int64_t block) const {
  return std::clamp(block_size(block) - segment_ * segment_elements_, int64_t(0), segment_elements_);
}

void RingReduction::start() {
  phase_ = Phase::reduce;
  segment_ = hop_ = 0;
  if (size_ == 1 || segments_ == 0) finish();
}

void RingReduction::post_receive(int64_t hop) {
  const int64_t n = segment_length(mod(rank_ - 2 - hop));
  recv_ = MPI_REQUEST_NULL;
  if (n > 0)
    check_mpi(MPI_Irecv(scratch_, int(n * kWideBytes), MPI_BYTE, int(mod(rank_ - 1)), kRingTag, comm_, &recv_),
              "MPI_Irecv");
}

// Hop 0 sends this rank's own segment of block r - 1 (widened); hop h in 1 .. p - 2 adds its own
// segment of block r - 1 - h to the partial sum the left neighbour sent at hop h - 1 and sends
// it on; hop p - 1 adds its own segment of block r, the last term, and rounds it into place.
bool RingReduction::reduce_step() {
  const int64_t e = element_bytes_, at = segment_ * segment_elements_;
  const auto* own_data = static_cast<const std::byte*>(spec_.kind == Kind::all_reduce ? spec_.recv : spec_.send);
  auto* received = reinterpret_cast<const void*>(scratch_);
  if (hop_ > 0 && !test(&recv_)) return false;
  const int64_t block = mod(rank_ - 1 - hop_);
  const int64_t n = segment_length(block);
  const std::byte* own = own_data + (block_begin(block) + at) * e;
  if (hop_ == size_ - 1) {
    // Block r: in place over this rank's own block (read here for the last time), else into recv.
    const bool in_place = spec_.kind == Kind::all_reduce || spec_.send == spec_.recv;
    std::byte* out = static_cast<std::byte*>(spec_.recv) + (in_place ? block_begin(block) + at : at) * e;
    with_type(spec_.dtype, [&](auto t) {
      using T = decltype(t);
      using W = Wide<T>;
      const auto* r = static_cast<const typename W::type*>(received);
      const auto* o = reinterpret_cast<const T*>(own);
      auto* y = reinterpret_cast<T*>(out);
      for (int64_t i = 0; i < n; ++i) y[i] = W::down(combine(r[i], W::up(o[i]), spec_.op));
    });
    hop_ = 0;
    ++segment_;
    return true;
  }
  const int b = int(hop_ % 2);
  if (!test(&sends_[b])) return false;  // its previous contents are still on their way
  std::byte* send = scratch_ + (1 + b) * segment_elements_ * kWideBytes;
  with_type(spec_.dtype, [&](auto t) {
    using T = decltype(t);
    using W = Wide<T>;
    const auto* r = static_cast<const typename W::type*>(received);
    const auto* o = reinterpret_cast<const T*>(own);
    auto* s = reinterpret_cast<typename W::type*>(send);
    if (hop_ == 0)
      for (int64_t i = 0; i < n; ++i) s[i] = W::up(o[i]);
    else
      for (int64_t i = 0; i < n; ++i) s[i] = combine(r[i], W::up(o[i]), spec_.op);
  });
  post_receive(hop_);  // the received partial is consumed: the scratch takes the next
  if (n > 0)
    check_mpi(MPI_Isend(send, int(n * kWideBytes), MPI_BYTE, int(mod(rank_ + 1)), kRingTag, comm_, &sends_[b]),
              "MPI_Isend");
  ++hop_;
  return true;
}

// The reduced blocks go round in place: at hop h this rank passes on block r - h.
bool RingReduction::gather_step() {
  if (!test(&recv_) || !test(&sends_[0])) return false;
  if (hop_ == size_ - 1) {
    hop_ = 0;
    ++segment_;
    return true;
  }
  const int64_t e = element_bytes_, at = segment_ * segment_elements_;
  auto* data = static_cast<std::byte*>(spec_.recv);
  const int64_t out_block = mod(rank_ - hop_), in_block = mod(rank_ - 1 - hop_);
  const int64_t n_in = segment_length(in_block), n_out = segment_length(out_block);
  if (n_in > 0)
    check_mpi(MPI_Irecv(data + (block_begin(in_block) + at) * e, int(n_in * e), MPI_BYTE, int(mod(rank_ - 1)),
                        kRingTag, comm_, &recv_),
              "MPI_Irecv");
  if (n_out > 0)
    check_mpi(MPI_Isend(data + (block_begin(out_block) + at) * e, int(n_out * e), MPI_BYTE, int(mod(rank_ + 1)),
                        kRingTag, comm_, &sends_[0]),
              "MPI_Isend");
  ++hop_;
  return true;
}

bool RingReduction::advance() {
  while (phase_ != Phase::done) {
    if (segment_ < segments_) {
      if (!(phase_ == Phase::reduce ? reduce_step() : gather_step())) return false;
      continue;
    }
    // A phase ends once its last messages are delivered: the next one reuses the buffers.
    if (!test(&recv_) || !test(&sends_[0]) || !test(&sends_[1])) return false;
    if (phase_ == Phase::reduce && spec_.kind == Kind::all_reduce) {
      phase_ = Phase::gather;
      segment_ = hop_ = 0;
    } else {
      finish();
    }
  }
  return true;
}

void RingReduction::finish() {
  const int64_t e = element_bytes_;
  auto* recv = static_cast<std::byte*>(spec_.recv);
  if (spec_.kind == Kind::reduce_scatter) {
    const size_t bytes = size_t(spec_.count * e);
    if (spec_.send == spec_.recv) {
      // In place: this rank's reduced block moves to the front, where the caller reads it.
      if (rank_ != 0) std::memcpy(recv, recv + block_begin(rank_) * e, bytes);
    } else if (size_ == 1) {
      std::memcpy(recv, spec_.send, bytes);
    }
  }
  phase_ = Phase::done;
}

}  // namespace memfit
