#include "dist/mpi_ring.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"

namespace memfit {

namespace {

constexpr int kRingTag = 0x4d46;  // one ring at a time per communicator: messages pair up in order
// Halving's first step: + the piece's position; later steps: + 64 + the step. Distinct from the
// ring's tag, so a neighbour already gathering cannot match a receive still reducing.
constexpr int kHalvingTag = 0x4e00;
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

// Halving combines the lower ranks' partial on the left (a fixed order in the bits of max(+0, -0)).
template <class W>
W combine_ordered(W mine, W theirs, bool mine_low, ReduceOp op) {
  return mine_low ? combine(mine, theirs, op) : combine(theirs, mine, op);
}

int64_t bit_reverse(int64_t x, int bits) {
  int64_t y = 0;
  for (int i = 0; i < bits; ++i) y |= ((x >> i) & 1) << (bits - 1 - i);
  return y;
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

bool test_all(MPI_Request* r, int n) {
  int done = 0;
  check_mpi(MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
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
  halving_ = !spec.ring && size >= 2 && size <= kMaxHalvingRanks && (size & (size - 1)) == 0;
  levels_ = 0;
  while ((1 << levels_) < size) ++levels_;
  // A slot holds a round's size/2 received pieces and its size/2 partial sums, in fp32.
  slot_bytes_ = scratch_bytes / 2;
  piece_elements_ = slot_bytes_ / (int64_t(size) * kWideBytes);
  rounds_ = (largest + piece_elements_ - 1) / piece_elements_;
  for (Slot& s : slots_) {
    std::fill(std::begin(s.first_recv), std::end(s.first_recv), MPI_REQUEST_NULL);
    std::fill(std::begin(s.first_send), std::end(s.first_send), MPI_REQUEST_NULL);
    std::fill(std::begin(s.later_send), std::end(s.later_send), MPI_REQUEST_NULL);
    s.later_recv = MPI_REQUEST_NULL;
  }
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
  round_ = step_ = piece_ = kept_ = 0;
  posted_ = -1;
  step_posted_ = false;
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
  auto* received = reinterpret_cast<const void*>(scratch_);
  if (hop_ > 0 && !test(&recv_)) return false;
  const int64_t block = mod(rank_ - 1 - hop_);
  const int64_t n = segment_length(block);
  const std::byte* own = own_data() + (block_begin(block) + at) * e;
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
    if (phase_ == Phase::reduce && halving_) {
      if (round_ < rounds_) {
        if (!halving_step()) return false;
        continue;
      }
    } else if (segment_ < segments_) {
      if (!(phase_ == Phase::reduce ? reduce_step() : gather_step())) return false;
      continue;
    }
    // A phase ends once its last messages are delivered: the next one reuses the buffers.
    if (!all_sent_and_received()) return false;
    if (phase_ == Phase::reduce && spec_.kind == Kind::all_reduce) {
      phase_ = Phase::gather;
      segment_ = hop_ = 0;
    } else {
      finish();
    }
  }
  return true;
}

bool RingReduction::all_sent_and_received() {
  if (!test(&recv_) || !test(&sends_[0]) || !test(&sends_[1])) return false;
  for (Slot& s : slots_)
    if (!test_all(s.first_recv, kMaxHalvingRanks / 2) || !test_all(s.first_send, kMaxHalvingRanks / 2) ||
        !test_all(s.later_send, kMaxHalvingLevels - 1) || !test(&s.later_recv))
      return false;
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

int64_t RingReduction::piece_length(int64_t block, int64_t round) const {
  return std::clamp(block_size(block) - round * piece_elements_, int64_t(0), piece_elements_);
}

// After the first step a rank keeps the blocks whose bit 0 is its own, at the bit-reversed
// position of block >> 1: every later step then gives away one contiguous half of what it keeps.
int64_t RingReduction::block_at(int64_t pos, int low_bit) const {
  return (bit_reverse(pos, levels_ - 1) << 1) | low_bit;
}

std::byte* RingReduction::output(int64_t round) const {
  const bool in_place = spec_.kind == Kind::all_reduce || spec_.send == spec_.recv;
  const int64_t at = round * piece_elements_ + (in_place ? block_begin(rank_) : 0);
  return static_cast<std::byte*>(spec_.recv) + at * element_bytes_;
}

// A slot is reused two rounds on, once the sends from its partial sums (and from the data) are out.
bool RingReduction::slot_free(int64_t round) {
  Slot& s = slots_[round % 2];
  return test_all(s.first_send, kMaxHalvingRanks / 2) && test_all(s.later_send, kMaxHalvingLevels - 1);
}

// The first step exchanges the data as it is (16-bit data in 16 bits) with rank ^ 1: this
// rank's pieces of the blocks the partner keeps, for the partner's pieces of the blocks it keeps.
void RingReduction::post_first_step(int64_t round) {
  Slot& s = slots_[round % 2];
  s.stride = 0;
  for (int64_t b = 0; b < size_; ++b) s.stride = std::max(s.stride, piece_length(b, round));
  const int partner = rank_ ^ 1;
  const int64_t e = element_bytes_;
  std::byte* in = slot_base(round);
  for (int64_t pos = 0; pos < size_ / 2; ++pos) {
    const int64_t mine = block_at(pos, rank_ & 1), theirs = block_at(pos, partner & 1);
    const int64_t n_in = piece_length(mine, round), n_out = piece_length(theirs, round);
    if (n_in > 0)
      check_mpi(MPI_Irecv(in + pos * s.stride * e, int(n_in * e), MPI_BYTE, partner, kHalvingTag + int(pos), comm_,
                          &s.first_recv[pos]),
                "MPI_Irecv");
    if (n_out > 0)
      check_mpi(MPI_Isend(own_data() + (block_begin(theirs) + round * piece_elements_) * e, int(n_out * e), MPI_BYTE,
                          partner, kHalvingTag + int(pos), comm_, &s.first_send[pos]),
                "MPI_Isend");
  }
  posted_ = round;
}

bool RingReduction::halving_step() {
  if (posted_ < round_) {
    if (!slot_free(round_)) return false;
    post_first_step(round_);
  }
  // The next round's first step travels while this one finishes.
  if (posted_ == round_ && round_ + 1 < rounds_ && slot_free(round_ + 1)) post_first_step(round_ + 1);
  return step_ == 0 ? finish_first_step() : later_step();
}

// Combines each received piece with this rank's own, as it arrives: into the slot's partial
// sums, or with 2 ranks (the last step) rounded into the result.
bool RingReduction::finish_first_step() {
  Slot& s = slots_[round_ % 2];
  const int64_t e = element_bytes_;
  const std::byte* in = slot_base(round_);
  std::byte* partial = slot_base(round_) + (size_ / 2) * piece_elements_ * kWideBytes;
  const bool low = (rank_ & 1) == 0;
  for (; piece_ < size_ / 2; ++piece_) {
    if (!test(&s.first_recv[piece_])) return false;
    const int64_t block = block_at(piece_, rank_ & 1), n = piece_length(block, round_);
    const std::byte* own = own_data() + (block_begin(block) + round_ * piece_elements_) * e;
    with_type(spec_.dtype, [&](auto t) {
      using T = decltype(t);
      using W = Wide<T>;
      const auto* a = reinterpret_cast<const T*>(own);
      const auto* b = reinterpret_cast<const T*>(in + piece_ * s.stride * e);
      if (levels_ == 1) {
        auto* y = reinterpret_cast<T*>(output(round_));
        for (int64_t i = 0; i < n; ++i) y[i] = W::down(combine_ordered(W::up(a[i]), W::up(b[i]), low, spec_.op));
      } else {
        auto* w = reinterpret_cast<typename W::type*>(partial) + piece_ * s.stride;
        for (int64_t i = 0; i < n; ++i) w[i] = combine_ordered(W::up(a[i]), W::up(b[i]), low, spec_.op);
      }
    });
  }
  piece_ = kept_ = 0;
  step_ = levels_ == 1 ? 0 : 1;
  if (levels_ == 1) ++round_;
  return true;
}

// Step s >= 1 exchanges partial sums with rank ^ 2^s: of the 2w positions this rank holds, it
// sends the half whose bit s is the partner's and adds what comes back into the other half.
bool RingReduction::later_step() {
  Slot& s = slots_[round_ % 2];
  const int64_t w = size_ >> (step_ + 1), bit = (rank_ >> step_) & 1;
  const int64_t keep = kept_ + bit * w, give = kept_ + (1 - bit) * w, n = w * s.stride;
  std::byte* in = slot_base(round_);
  std::byte* partial = in + (size_ / 2) * piece_elements_ * kWideBytes;
  if (!step_posted_) {
    const int partner = rank_ ^ (1 << step_), tag = kHalvingTag + 64 + int(step_);
    check_mpi(MPI_Irecv(in, int(n * kWideBytes), MPI_BYTE, partner, tag, comm_, &s.later_recv), "MPI_Irecv");
    check_mpi(MPI_Isend(partial + give * s.stride * kWideBytes, int(n * kWideBytes), MPI_BYTE, partner, tag, comm_,
                        &s.later_send[step_ - 1]),
              "MPI_Isend");
    step_posted_ = true;
  }
  if (!test(&s.later_recv)) return false;
  const bool last = step_ == levels_ - 1, low = bit == 0;
  with_type(spec_.dtype, [&](auto t) {
    using T = decltype(t);
    using W = Wide<T>;
    using V = typename W::type;
    const auto* r = reinterpret_cast<const V*>(in);
    auto* p = reinterpret_cast<V*>(partial) + keep * s.stride;
    if (last) {  // w == 1, and the position kept is this rank's block
      auto* y = reinterpret_cast<T*>(output(round_));
      for (int64_t i = 0, m = piece_length(rank_, round_); i < m; ++i)
        y[i] = W::down(combine_ordered(p[i], r[i], low, spec_.op));
    } else {
      for (int64_t i = 0; i < n; ++i) p[i] = combine_ordered(p[i], r[i], low, spec_.op);
    }
  });
  step_posted_ = false;
  kept_ = keep;
  if (last) {
    step_ = kept_ = 0;
    ++round_;
  } else {
    ++step_;
  }
  return true;
}

}  // namespace memfit
