#include "comm/mpi_env.hpp"

#include <cstdlib>

#include "core/log.hpp"

namespace gpt2 {

namespace {
void mpi_abort_hook(int code, const std::string& /*what: printed already*/) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}
}  // namespace

MpiEnv::MpiEnv(int* argc, char*** argv) {
  int provided = 0;
  // MULTIPLE: the prefetch thread may call fatal() (and so MPI_Abort) while the main thread is in MPI.
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  set_abort_hook(mpi_abort_hook);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors come back to MPI_CHECK
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  set_error_context_rank(rank_);
  set_log_rank(rank_);
  if (provided < MPI_THREAD_MULTIPLE && rank_ == 0)
    log_warn("this MPI provides thread level %d, not MPI_THREAD_MULTIPLE: an error on the data prefetch thread "
             "may not abort the job cleanly\n", provided);

  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &local_size_));
  MPI_Comm_free(&local);
  int leader = local_rank_ == 0 ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(&leader, &num_nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
}

MpiEnv::~MpiEnv() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiEnv::exit_all(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Finalize();
  std::exit(status);
}

}  // namespace gpt2
