// Asynchronous logging (core/log.hpp, log_set_async): a reader that stops reading must not block the
// caller. mpirun 4.1 stops reading its ranks' output between the SIGTERM it gets and the SIGKILL it sends;
// rank 0 then stalled in a progress line's write and never checkpointed (fault.signal, 2026-11-26).
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/log.hpp"

namespace gpt2 {
namespace {

constexpr int kLines = 12000;  // 200 bytes each: 2.4 MB, past a pipe's 64 KB and the 1 MiB queue bound

// In a child whose stdout is a pipe the parent does not read yet: log every line, say so on `ctl`
// ('A'), check that a bounded flush gives up ('B'), then wait until everything queued is written.
[[noreturn]] void child(int out_w, int ctl_w) {
  dup2(out_w, STDOUT_FILENO);
  close(out_w);
  log_set_async();
  const std::string pad(180, 'x');
  for (int i = 0; i < kLines; ++i) log_info("line %05d %s\n", i, pad.c_str());
  if (write(ctl_w, "A", 1) != 1) _exit(3);
  if (!log_flush(0.2) && write(ctl_w, "B", 1) != 1) _exit(3);
  _exit(log_flush(INFINITY) ? 0 : 4);
}

// Reads ctl until `want` bytes came or 60 s passed (a blocked child never sends them).
std::string read_ctl(int fd, size_t want) {
  std::string got;
  while (got.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) break;
    char c;
    if (read(fd, &c, 1) != 1) break;
    got += c;
  }
  return got;
}

TEST(AsyncLog, ACallerNeverWaitsForAReaderThatStoppedReading) {
  int out[2], ctl[2];
  ASSERT_EQ(pipe(out), 0);
  ASSERT_EQ(pipe(ctl), 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(out[0]);
    close(ctl[0]);
    child(out[1], ctl[1]);
  }
  close(out[1]);
  close(ctl[1]);
  // With blocking writes the child would stall after 64 KB, long before 'A'.
  EXPECT_EQ(read_ctl(ctl[0], 2), "AB") << "logging blocked on the unread pipe, or a bounded flush waited for it";

  // Now read everything: the lines that fitted the queue, in order, then a note for the dropped ones.
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) text.append(buf, static_cast<size_t>(n));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  close(out[0]);
  close(ctl[0]);

  // Lines come in order; each gap is announced, just before the line after it (or at the end), by one
  // note whose count is the gap's size. How many gaps there are depends on the scheduler: a writer that
  // runs while the caller is still logging frees room, so lines after a first gap can still fit.
  int next = 0;     // the line expected next
  long noted = 0;   // lines announced as dropped by a note not yet followed by a line
  long dropped = 0;
  int written = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    ASSERT_NE(end, std::string::npos) << "a partial line at the end";
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    int i = -1;
    long n = -1;
    if (std::sscanf(line.c_str(), "line %d ", &i) == 1) {
      ASSERT_EQ(i, next + noted) << "lines out of order, or a gap without a note saying how many were dropped";
      next = i + 1;
      noted = 0;
      ++written;
    } else {
      ASSERT_EQ(std::sscanf(line.c_str(), "[log: %ld line(s) dropped", &n), 1) << line;
      ASSERT_EQ(noted, 0) << "two notes for one gap: " << line;
      ASSERT_GT(n, 0) << line;
      noted = n;
      dropped += n;
    }
  }
  EXPECT_EQ(next + noted, kLines) << "the lines at the end were neither written nor counted as dropped";
  EXPECT_GT(dropped, 0) << "2.4 MB into a 1 MiB bound dropped nothing";
  EXPECT_EQ(written + dropped, kLines) << "every line is either written or counted as dropped";
  EXPECT_GT(written, (1 << 20) / 200 / 2) << "the queue held far less than its bound";
}

TEST(AsyncLog, SynchronousUntilTurnedOn) {
  EXPECT_TRUE(log_flush(0.0));  // nothing to wait for without log_set_async
}

}  // namespace
}  // namespace gpt2
