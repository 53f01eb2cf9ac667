// Logging: only rank 0 prints progress; errors go through core/error.hpp from any rank.
#pragma once

#include <string>

#include <cstdarg>

namespace gpt2 {

void set_log_rank(int rank);
bool is_log_rank();  // true on rank 0 (and before MPI is initialised)

// printf-style, rank 0 only, flushed (so lines appear promptly under srun/mpirun).
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// printf-style to stderr, rank 0 only: warnings the user should read.
void log_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// From here on log_info and log_warn never block the caller: on rank 0 (the others print nothing) each
// stream gets a writer thread, and a line that finds more than 1 MiB still unwritten on its stream is
// dropped (the writer reports how many). Why: a launcher can stop reading our output for seconds. Open
// MPI's mpirun answers SIGTERM by sleeping odls_base_sigkill_timeout, sending SIGTERM, sleeping again,
// then SIGKILL, and reads nothing meanwhile; rank 0 then blocked in a progress line's write and never
// reached the step boundary that checkpoints. gpt2-train turns it on; tools that print results stay
// synchronous.
void log_set_async();
// Waits until both streams' writers have written everything queued, for at most max_s seconds
// (infinity: no bound); true if they did. Synchronous logging: returns true at once.
bool log_flush(double max_s);

// A count for progress lines: "812", "12.3K", "4.56M", "1.23B".
std::string format_count(double n);

}  // namespace gpt2
