#include "core/log.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace gpt2 {
namespace {

int g_rank = 0;

// One stream's writer thread (log_set_async). It writes with write(2), not stdio, so a write blocked on
// a reader that stopped reading holds no FILE lock that exit() would then wait for.
class AsyncStream {
 public:
  explicit AsyncStream(int fd) : fd_(fd) { std::thread([this] { run(); }).detach(); }

  void push(std::string line) {
    std::lock_guard<std::mutex> g(mu_);
    if (pending_ + line.size() > kMaxPending) {
      ++dropped_;
      cv_.notify_one();
      return;
    }
    if (dropped_ > 0) queue_note();  // where the gap is, before the line that follows it
    pending_ += line.size();
    queue_.push_back(std::move(line));
    cv_.notify_one();
  }

  bool flush(double max_s) {
    std::unique_lock<std::mutex> g(mu_);
    auto drained = [&] { return queue_.empty() && dropped_ == 0 && !busy_; };
    if (!std::isfinite(max_s)) {
      idle_.wait(g, drained);
      return true;
    }
    return idle_.wait_for(g, std::chrono::duration<double>(std::max(0.0, max_s)), drained);
  }

 private:
  static constexpr size_t kMaxPending = size_t{1} << 20;

  void queue_note() {  // mu_ held
    char note[96];
    std::snprintf(note, sizeof(note), "[log: %ld line(s) dropped: the output was not being read]\n", dropped_);
    dropped_ = 0;
    pending_ += std::strlen(note);
    queue_.emplace_back(note);
  }

  void run() {
    for (;;) {
      std::string line;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return !queue_.empty() || dropped_ > 0; });
        if (queue_.empty()) queue_note();  // the drops were the last lines so far
        line = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      write_all(line.data(), line.size());
      {
        std::lock_guard<std::mutex> g(mu_);
        pending_ -= line.size();
        busy_ = false;
        if (queue_.empty() && dropped_ == 0) idle_.notify_all();
      }
    }
  }

  void write_all(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;  // a closed or failing stream: the line is lost, as printf's would be
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::string> queue_;
  size_t pending_ = 0;
  long dropped_ = 0;
  bool busy_ = false;
};

// Never destroyed: the writer threads are detached and may still be blocked in write() at exit.
AsyncStream* g_out = nullptr;
AsyncStream* g_err = nullptr;

std::string format(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(&s[0], s.size() + 1, fmt, args);
  return s;
}

}  // namespace

void set_log_rank(int rank) { g_rank = rank; }
bool is_log_rank() { return g_rank == 0; }

void log_set_async() {
  if (g_out != nullptr || g_rank != 0) return;  // the other ranks print nothing through these
  std::fflush(stdout);  // what stdio holds goes first
  std::fflush(stderr);
  g_out = new AsyncStream(STDOUT_FILENO);
  g_err = new AsyncStream(STDERR_FILENO);
}

bool log_flush(double max_s) {
  if (g_out == nullptr) return true;
  const auto t0 = std::chrono::steady_clock::now();
  const bool out = g_out->flush(max_s);
  const double left = max_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g_err->flush(left) && out;
}

void log_info(const char* fmt, ...) {
  if (g_rank != 0) return;
  va_list args;
  va_start(args, fmt);
  if (g_out != nullptr) {
    g_out->push(format(fmt, args));
  } else {
    std::vprintf(fmt, args);
    std::fflush(stdout);
  }
  va_end(args);
}

void log_warn(const char* fmt, ...) {
  if (g_rank != 0) return;
  va_list args;
  va_start(args, fmt);
  if (g_err != nullptr) {
    g_err->push("warning: " + format(fmt, args));
  } else {
    std::fputs("warning: ", stderr);
    std::vfprintf(stderr, fmt, args);
    std::fflush(stderr);
  }
  va_end(args);
}

std::string format_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof(buf), "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof(buf), "%.1fK", n / 1e3);
  else std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

}  // namespace gpt2
