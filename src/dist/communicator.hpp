// Communicator: the collectives data parallelism needs, over one group of ranks. Step programs
// name collectives as ops (all_reduce, reduce_scatter, all_gather, broadcast); the runtime runs
// them through this interface, with MPI between processes on the CPU (NCCL later, behind the
// same interface) and a single-process implementation for world size 1. split() makes the
// communicators of sub-groups (data- and tensor-parallel groups: runtime/collective_op.hpp).
//
// Collectives can be started and completed separately, so communication overlaps compute:
// start_*() returns a ticket, wait(ticket) completes it. Tickets index a fixed table of
// request slots, so starting and waiting allocate nothing.
//
// A wait that does not complete within the timeout (set_timeout, `--comm-timeout`) throws
// [dist] naming the collective (label_next) and the ranks that did not arrive at it; the CLI
// then ends every rank (abort_job), so no rank is left in a collective.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.hpp"

namespace memfit {

enum class ReduceOp : uint8_t { sum, max };

using CommTicket = int;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data (count elements) becomes the reduction over ranks.
  virtual CommTicket start_all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  // send holds size() * count elements; rank r receives the reduction of block r into recv.
  // send == recv is the in-place form: the result lands in the first count elements.
  virtual CommTicket start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) = 0;
  // send holds count elements; recv receives size() * count, rank r's block at r * count.
  virtual CommTicket start_all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual CommTicket start_broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  // send holds size() * count elements, block r for member r; recv receives member r's block
  // for this rank at r * count (ZeRO++ qgZ's byte wires). send and recv do not overlap.
  virtual CommTicket start_all_to_all(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual void wait(CommTicket ticket) = 0;
  // Whether any started collective has not been waited for, and a nudge to the transport to
  // advance them: MPI implementations move non-blocking collectives only inside MPI calls, so
  // the executor calls this between ops while anything is in flight. Allocates nothing in
  // memfit code.
  virtual bool pending() const { return false; }
  virtual void progress() {}
  virtual void barrier() = 0;

  // The ranks of this communicator that pass the same color, ordered by key (MPI_Comm_split);
  // collective over this communicator. The new one keeps this one's timeout.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // How many members share this rank's node (MPI_Comm_split_type shared); collective.
  virtual int ranks_on_node() { return size(); }
  // The world rank of member `rank` (reports name world ranks).
  virtual int world_rank(int rank) const { return rank; }
  // Process memory this communicator holds for its whole life (scratch it reduces through),
  // outside any planned tier: the run's process plan counts it.
  virtual uint64_t resident_bytes() const { return 0; }
  // Seconds a wait may take before it throws; <= 0: no limit.
  virtual void set_timeout(double seconds) { (void)seconds; }
  // The name the next started collective goes by in a timeout's report (an op name). Not
  // copied: it must outlive the collective.
  void label_next(const char* label) { next_label_ = label; }
  // The group this communicator serves, for reports ("world", "data", "tensor").
  void set_name(std::string name) { name_ = std::move(name); }
  const std::string& name() const { return name_; }

  // Blocking forms.
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) { wait(start_all_reduce(data, count, dtype, op)); }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
    wait(start_reduce_scatter(send, recv, count, dtype, op));
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) {
    wait(start_all_gather(send, recv, count, dtype));
  }
  void broadcast(void* data, int64_t count, DType dtype, int root) { wait(start_broadcast(data, count, dtype, root)); }

 protected:
  // The label given to label_next, once (then null).
  const char* take_label() {
    const char* label = next_label_;
    next_label_ = nullptr;
    return label;
  }

 private:
  const char* next_label_ = nullptr;
  std::string name_ = "world";
};

// A group of one rank; `world_rank` is its rank in the world around it (reports name it).
std::unique_ptr<Communicator> make_single_process_communicator(int world_rank = 0);

// MPI_COMM_WORLD; initialises MPI on first use (finalised at exit). Throws [dist] when MPI
// cannot start.
std::unique_ptr<Communicator> make_mpi_communicator();

// Under a launcher with several ranks: starts MPI now, so that an error on any rank can end the
// job from its first line on (the CLI calls it first). No-op otherwise.
void start_job();
// The one way out of a failed run. Under a launcher with several ranks: prints
// "memfit: error: [rank R] <message>" to stderr and ends every rank of the job (MPI_Abort with
// status 1), so no rank is left waiting in a collective. Otherwise prints
// "memfit: error: <message>" and returns the exit status, 1.
int fail_job(const std::string& message);
// When several ranks were launched: this rank, as the launcher numbered it (-1 otherwise).
int launched_rank();

// True when this process was started by an MPI launcher (mpirun / srun) with more than one
// rank, read from the launcher's environment without initialising MPI.
bool launched_with_several_ranks();
// The number of ranks the launcher started (1 when not launched by one).
int launched_world_size();

}  // namespace memfit
