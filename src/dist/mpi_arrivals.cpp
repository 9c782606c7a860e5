// The arrival counters (see mpi_arrivals.hpp): one window over MPI_COMM_WORLD, kSlots int64
// counters per rank, a passive-target epoch open for the window's whole life.
#include "dist/mpi_arrivals.hpp"

#include <bit>
#include <chrono>
#include <cstdlib>

#include "core/error.hpp"

namespace memfit::mpi_arrivals {

namespace {

struct Window {
  MPI_Win win = MPI_WIN_NULL;
  int64_t* counters = nullptr;  // this rank's kSlots counters, inside the window
  uint64_t used = 0;            // bit s: slot s belongs to a live communicator of this process
};

Window& window() {
  static Window w;
  return w;
}

void free_window() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  Window& w = window();
  if (finalized || w.win == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(w.win);
  MPI_Win_free(&w.win);
}

}  // namespace

void ensure_window() {
  Window& w = window();
  if (w.win != MPI_WIN_NULL) return;
  static_assert(kSlots <= 64, "the used-slot mask is one uint64");
  void* base = nullptr;
  MEMFIT_CHECK(MPI_Win_allocate(MPI_Aint(kSlots * sizeof(int64_t)), int(sizeof(int64_t)), MPI_INFO_NULL,
                                MPI_COMM_WORLD, &base, &w.win) == MPI_SUCCESS,
               "dist", "MPI_Win_allocate of the collective arrival counters failed");
  w.counters = static_cast<int64_t*>(base);
  for (int s = 0; s < kSlots; ++s) w.counters[s] = 0;
  MPI_Win_lock_all(MPI_MODE_NOCHECK, w.win);
  // Registered after MPI's own exit handler (MPI is initialised first), so it runs before
  // MPI_Finalize. Freeing is collective: every rank gets here at a normal exit.
  std::atexit(free_window);
}

int acquire_slot(MPI_Comm comm) {
  Window& w = window();
  MEMFIT_ASSERT(w.win != MPI_WIN_NULL, "arrival counters used before the window exists");
  uint64_t used = w.used;
  MPI_Allreduce(MPI_IN_PLACE, &used, 1, MPI_UINT64_T, MPI_BOR, comm);
  MEMFIT_CHECK(used != ~uint64_t(0), "dist", "more than {} communicators alive at once", kSlots);
  const int slot = std::countr_one(used);
  w.used |= uint64_t(1) << slot;
  __atomic_store_n(&w.counters[slot], int64_t(0), __ATOMIC_RELAXED);
  return slot;
}

void release_slot(int slot) {
  Window& w = window();
  if (w.win == MPI_WIN_NULL) return;
  w.used &= ~(uint64_t(1) << slot);
  __atomic_store_n(&w.counters[slot], int64_t(0), __ATOMIC_RELAXED);  // no stale count for the slot's next owner
}

void publish(int slot, int64_t count) { __atomic_store_n(&window().counters[slot], count, __ATOMIC_RELAXED); }

int64_t read(int rank, int slot, double seconds) {
  Window& w = window();
  int64_t value = -1;
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Rget(&value, 1, MPI_INT64_T, rank, MPI_Aint(slot), 1, MPI_INT64_T, w.win, &request) != MPI_SUCCESS)
    return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  // An unanswered read stays pending: the job is about to end.
  return done ? value : -1;
}

}  // namespace memfit::mpi_arrivals
