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

// A count for progress lines: "812", "12.3K", "4.56M", "1.23B".
std::string format_count(double n);

}  // namespace gpt2
