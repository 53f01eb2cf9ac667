// Preemption signals (docs/preemption.md): SIGUSR1, SIGTERM and SIGINT ask the step loop to stop at a
// step every rank agrees on, checkpoint there and exit with kExitPreempted (75). The handlers only
// record which signal came and when; everything else happens in the step loop.
#pragma once

namespace gpt2 {

// Installs the handlers. Call it first thing in main(), before MPI_Init (which keeps them: checked with
// Open MPI 4.1), so that a signal at any moment of start-up is seen instead of killing the process
// with 128+signal, an exit status batch scripts do not requeue. A second SIGINT kills at once (Ctrl-C
// twice when a checkpoint takes too long).
void install_stop_handlers();

// The first stop signal this process received (SIGUSR1, SIGTERM or SIGINT), or 0 if none.
int stop_signal();

// Seconds this process has left before the launcher follows the SIGTERM it received with SIGKILL, as
// far as it can know: infinity when no SIGTERM came (SIGUSR1 and SIGINT are requests, no kill follows)
// or when the launcher's grace period is unknown. The grace period (kill_grace_s) is
//  - GPT2_KILL_GRACE_S from the environment (slurm/train.sbatch sets it to SLURM's KillWait), and
//  - under Open MPI's mpirun, odls_base_sigkill_timeout (default 1 s): mpirun 4.1 answers SIGTERM or
//    SIGINT by sending the ranks SIGCONT, waiting that long, sending SIGTERM, waiting that long again,
//    then SIGKILL; so a rank has odls_base_sigkill_timeout seconds after its SIGTERM,
// the smaller of the two when both apply.
double seconds_until_kill();

// The grace period described above (infinity if unknown), and where it came from, for messages.
double kill_grace_s();
const char* kill_grace_source();

}  // namespace gpt2
