// The job around the communicators: whether a launcher started several ranks (read from its
// environment, before MPI starts), MPI started at the top of the CLI, and the one way out of a
// failed run. The invariant (issue 20): under a launcher with several ranks, an error on one
// rank ends all of them. A rank that only returned from main would leave the others waiting in
// a collective forever (its MPI_Finalize would even wait for them), so every fatal error goes
// through fail_job, which prints the error with the rank and calls MPI_Abort.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "dist/communicator.hpp"
#include "dist/mpi_arrivals.hpp"

namespace memfit {

namespace {

int launcher_variable(std::initializer_list<const char*> names, int otherwise) {
  for (const char* name : names)
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return otherwise;
}

}  // namespace

int launched_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 1) return std::atoi(v);
  }
  return 1;
}

bool launched_with_several_ranks() { return launched_world_size() > 1; }

int launched_rank() {
  if (!launched_with_several_ranks()) return -1;
  return launcher_variable({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}, -1);
}

void start_job() {
  if (launched_with_several_ranks()) ensure_mpi();
}

int fail_job(const std::string& message) {
  std::fflush(stdout);
  int initialized = 0, finalized = 0;
  if (launched_with_several_ranks()) {
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized && !finalized) {
      try {
        ensure_mpi();  // MPI_Abort needs MPI; start_job normally did this already
        initialized = 1;
      } catch (const std::exception&) {
      }
    }
  }
  if (!initialized || finalized) {
    const int rank = launched_rank();
    if (rank >= 0) std::fprintf(stderr, "memfit: error: [rank %d] %s\n", rank, message.c_str());
    else std::fprintf(stderr, "memfit: error: %s\n", message.c_str());
    std::fflush(stderr);
    return 1;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "memfit: error: [rank %d] %s\n", rank, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;  // not reached: MPI_Abort ends this process too
}

}  // namespace memfit
