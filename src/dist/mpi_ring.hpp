// Reductions over MPI point-to-point into memory memfit owns. OpenMPI's non-blocking
// reductions (libnbc) allocate temporaries on every call: MPI_Iallreduce one copy of its data,
// MPI_Ireduce_scatter_block one or two copies of its whole input. A step that reduces a 100 MB
// gradient bucket then peaks 100-200 MB above its plan, outside any planned tier. These
// reductions send through MPI_Isend/MPI_Irecv (which allocate nothing for large messages on
// shared memory) and combine received data in one fixed scratch that the communicator
// allocates once, at its creation.
//
// Two bandwidth-optimal algorithms, both sending each rank's (p - 1)/p of the data twice for an
// all-reduce:
// - power-of-two worlds of up to kMaxHalvingRanks ranks reduce-scatter by recursive halving:
//   at step s every rank exchanges half of the blocks it still holds with rank ^ 2^s, keeping
//   the half whose bit s matches its own. Every block is then summed as the same pairwise tree
//   over rank order, ((x0 + x1) + (x2 + x3)) + ..., whichever rank owns it: the order a layout
//   with half the ranks and twice the rows per rank forms in its own sum (rank r's two rows
//   are rows 2r and 2r + 1), so a checkpoint resumed there sums its gradients alike.
// - other worlds use the ring (Patarasuk and Yuan): p - 1 hops, at each of which every rank
//   passes a partial sum of one block to its right neighbour; block j is summed from rank
//   j + 1 round to rank j.
// An all-reduce then all-gathers the reduced blocks round the ring, in place. Blocks travel
// segment by segment, so a rank holds only a few segments of partial sums (its scratch),
// whatever the block size: the ring passes a segment's partial sum on as soon as it is formed;
// halving runs segment t of every block as round t, two rounds at a time (the first step of
// round t + 1 travels while round t finishes). Partial sums travel and accumulate in fp32
// (int32 for int32 data; halving's first step sends the data as it is) and are rounded once,
// at the block's owner: a 16-bit sum over p ranks is rounded once, not p - 1 times (a ring that
// rounds at every hop drifts from the one-rank run as the world grows). Every block's order is
// fixed, so results do not depend on timing, and an all-reduce and a reduce-scatter of the
// same data give the same bits.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"
#include "dist/communicator.hpp"

namespace memfit {

class RingReduction {
 public:
  enum class Kind : uint8_t { all_reduce, reduce_scatter };
  struct Spec {
    Kind kind = Kind::all_reduce;
    const void* send = nullptr;  // all_reduce: the data (in place); reduce_scatter: size * count elements
    void* recv = nullptr;        // all_reduce: the data; reduce_scatter: count elements (== send: in place)
    int64_t count = 0;           // all_reduce: elements in all; reduce_scatter: per rank
    DType dtype = DType::f32;
    ReduceOp op = ReduceOp::sum;
    bool ring = false;  // the ring whatever the world (the benchmark compares the two)
  };
  static constexpr int kMaxHalvingLevels = 5, kMaxHalvingRanks = 1 << kMaxHalvingLevels;

  // Sets up a reduction; nothing is sent until start(). scratch must outlive it.
  void prepare(const Spec& spec, MPI_Comm comm, int rank, int size, std::byte* scratch, int64_t scratch_bytes);
  // Posts the first messages. A communicator runs one ring at a time (they share its scratch).
  void start();
  // Moves the ring on as far as completed messages allow; true once the result is in place.
  bool advance();
  bool started() const { return phase_ != Phase::idle; }
  bool finished() const { return phase_ == Phase::done; }

 private:
  enum class Phase : uint8_t { idle, reduce, gather, done };
  int64_t block_begin(int64_t block) const;
  int64_t block_size(int64_t block) const { return block_begin(block + 1) - block_begin(block); }
  // The data this rank contributes: an all-reduce's buffer, a reduce-scatter's input.
  const std::byte* own_data() const {
    return static_cast<const std::byte*>(spec_.kind == Kind::all_reduce ? spec_.recv : spec_.send);
  }
  int64_t mod(int64_t i) const { return ((i % size_) + size_) % size_; }
  // Elements of segment_ of `block` (0 past its end).
  int64_t segment_length(int64_t block) const;
  // The reduction: one call does what hop_ of segment_ can do now; false while it waits.
  bool reduce_step();
  bool gather_step();
  void post_receive(int64_t hop);
  void finish();
  bool all_sent_and_received();

  // Recursive halving (see the top). Round t is segment t of every block, in slot t % 2.
  struct Slot {
    MPI_Request first_recv[kMaxHalvingRanks / 2], first_send[kMaxHalvingRanks / 2];
    MPI_Request later_send[kMaxHalvingLevels - 1], later_recv;  // a send per step after the first
    int64_t stride;                          // elements between the round's pieces (its longest)
  };
  int64_t piece_length(int64_t block, int64_t round) const;
  // The block whose piece sits at position pos after the first step, on the side `low_bit`.
  int64_t block_at(int64_t pos, int low_bit) const;
  std::byte* slot_base(int64_t round) const { return scratch_ + (round % 2) * slot_bytes_; }
  std::byte* output(int64_t round) const;
  bool slot_free(int64_t round);
  void post_first_step(int64_t round);
  bool halving_step();
  bool finish_first_step();
  bool later_step();

  bool halving_ = false;
  int levels_ = 0;  // log2(size)
  int64_t slot_bytes_ = 0, piece_elements_ = 0, rounds_ = 0, round_ = 0, posted_ = -1;
  int64_t step_ = 0, piece_ = 0, kept_ = 0;  // kept_: the first position this rank still holds
  bool step_posted_ = false;
  Slot slots_[2]{};

  Spec spec_{};
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::byte* scratch_ = nullptr;
  int64_t segment_elements_ = 0, element_bytes_ = 0;
  Phase phase_ = Phase::idle;
  int64_t segments_ = 0, segment_ = 0, hop_ = 0;
  // Requests: the receive into the scratch's first third, and a send from each of the other two.
  MPI_Request recv_ = MPI_REQUEST_NULL, sends_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

}  // namespace memfit
