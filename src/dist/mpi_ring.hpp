// Reductions over MPI point-to-point into memory memfit owns. OpenMPI's non-blocking
// reductions (libnbc) allocate temporaries on every call: MPI_Iallreduce one copy of its data,
// MPI_Ireduce_scatter_block one or two copies of its whole input. A step that reduces a 100 MB
// gradient bucket then peaks 100-200 MB above its plan, outside any planned tier. These rings
// send through MPI_Isend/MPI_Irecv (which allocate nothing for large messages on shared
// memory) and combine received data from one fixed scratch segment that the communicator
// allocates once, at its creation.
//
// The algorithm is the bandwidth-optimal ring (Patarasuk and Yuan): a reduce-scatter in p - 1
// hops, at each of which every rank passes a partial sum of one block to its right
// neighbour, then for an all-reduce an all-gather of the reduced blocks in p - 1 more. The
// blocks travel segment by segment: a segment's partial sum goes on as soon as it is formed,
// so a rank holds only a few segments of partial sums (its scratch), whatever the block size.
// Partial sums travel and accumulate in fp32 (int32 for int32 data) and are rounded once, at
// the block's owner: a 16-bit sum over p ranks is rounded once, not p - 1 times (a ring that
// rounds at every hop drifts from the one-rank run as the world grows). Every block's sum is
// formed in a fixed order (from the owner's right neighbour round to the owner), so results do
// not depend on timing, and an all-reduce and a reduce-scatter of the same data give the same
// bits.
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
  };

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
  int64_t mod(int64_t i) const { return ((i % size_) + size_) % size_; }
  // Elements of segment_ of `block` (0 past its end).
  int64_t segment_length(int64_t block) const;
  // The reduction: one call does what hop_ of segment_ can do now; false while it waits.
  bool reduce_step();
  bool gather_step();
  void post_receive(int64_t hop);
  void finish();

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
