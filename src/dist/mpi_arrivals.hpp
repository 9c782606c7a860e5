// MPI start-up and who arrived at a collective (internal to dist/, MPI only). Every rank publishes, per
// communicator, how many collectives it has started on it, in one MPI RMA window over
// MPI_COMM_WORLD (one int64 counter per slot per rank). Starting a collective is one relaxed
// store into this rank's own window memory: no MPI call, no allocation. A rank whose wait
// times out reads the counters of the other members with MPI_Rget: members whose counter is
// below the collective's sequence number did not arrive.
//
// The subtle points:
// - Slots name communicators across ranks: a communicator takes the lowest slot free on every
//   member (an all-reduce of the members' used-slot masks), so all members agree on it whatever
//   other communicators each of them holds.
// - The window lives from the first MPI communicator until exit (freed before MPI_Finalize);
//   its passive-target epoch (MPI_Win_lock_all) stays open throughout, so reading needs no
//   action by the target. With OpenMPI's osc/sm (ranks on one node; verified here with 4.1.4)
//   a rank that sleeps outside MPI is read at once; a component that needs the target's
//   progress (osc/pt2pt) answers when the target next enters MPI, so each read polls against a
//   deadline and a target that does not answer counts as not arrived.
#pragma once

#include <mpi.h>

#include <cstdint>

namespace memfit {

// Initialises MPI (MPI_THREAD_FUNNELED) unless it is; finalised at exit. Throws [dist].
void ensure_mpi();

}  // namespace memfit

namespace memfit::mpi_arrivals {

// Slots per rank: communicators alive at once in one process.
inline constexpr int kSlots = 64;

// Creates the window on first use: collective over MPI_COMM_WORLD (every rank's first
// MPI communicator is made at the same point of the program).
void ensure_window();

// Collective over comm: the lowest slot free on every member, marked used here.
int acquire_slot(MPI_Comm comm);
void release_slot(int slot);

// This rank has started `count` collectives on the communicator of `slot`.
void publish(int slot, int64_t count);

// World rank `rank`'s counter of `slot`, or -1 when it does not answer within `seconds`.
int64_t read(int rank, int slot, double seconds);

}  // namespace memfit::mpi_arrivals
