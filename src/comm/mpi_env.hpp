// MPI bootstrap: rank, world size, local rank (from a shared-memory split, because launcher
// environment variables are unreliable: srun leaves OMPI_COMM_WORLD_LOCAL_RANK unset, mpirun inside
// SLURM sets SLURM_LOCALID=0 on every rank). Installs the abort hook, so any fatal() ends every rank.
#pragma once

#include <mpi.h>

#include <string>

#include "core/error.hpp"

#define MPI_CHECK(call)                                                                     \
  do {                                                                                      \
    int gpt2_mpi_rc_ = (call);                                                              \
    if (gpt2_mpi_rc_ != MPI_SUCCESS) {                                                      \
      char gpt2_mpi_str_[MPI_MAX_ERROR_STRING] = {0};                                       \
      int gpt2_mpi_len_ = 0;                                                                \
      MPI_Error_string(gpt2_mpi_rc_, gpt2_mpi_str_, &gpt2_mpi_len_);                        \
      ::gpt2::fatal((::gpt2::msg() << "MPI: " #call " failed: " << gpt2_mpi_str_).str(),    \
                    __FILE__, __LINE__);                                                    \
    }                                                                                       \
  } while (0)

namespace gpt2 {

class MpiEnv {
 public:
  MpiEnv(int* argc, char*** argv);
  ~MpiEnv();
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }  // index among the ranks on this node
  int local_size() const { return local_size_; }  // ranks on this node
  int num_nodes() const { return num_nodes_; }

  // Ends the program normally on every rank with `status` (after MPI_Finalize). Use for outcomes
  // every rank reaches together, such as --help or a bad option; anything else goes through fatal().
  [[noreturn]] void exit_all(int status);

 private:
  int rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1, num_nodes_ = 1;
};

}  // namespace gpt2
