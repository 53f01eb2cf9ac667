#include "core/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.hpp"

namespace gpt2 {

namespace {

std::string dir_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == std::string::npos ? "." : (s == 0 ? "/" : path.substr(0, s));
}

}  // namespace

std::string os_error_text(int e) {
  std::string s = std::strerror(e);
  if (e == ENOSPC || e == EDQUOT) s += " (free space or raise the quota, then rerun with --resume auto)";
  return s;
}

void fsync_path_or_die(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  GPT2_REQUIRE(fd >= 0, "cannot open " << path << " to fsync it: " << os_error_text(errno));
  if (fsync(fd) != 0) {
    const int e = errno;
    close(fd);
    // Some file systems cannot fsync a directory; that is no data loss, so only real errors count.
    GPT2_REQUIRE(e == EINVAL || e == EROFS, "cannot fsync " << path << ": " << os_error_text(e));
    return;
  }
  close(fd);
}

void rename_durable(const std::string& tmp, const std::string& path) {
  GPT2_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0,
               "cannot rename " << tmp << " to " << path << ": " << os_error_text(errno));
  fsync_path_or_die(dir_of(path));
}

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  GPT2_REQUIRE(fd_ >= 0, "cannot create " << tmp_ << " (for " << path_ << "): " << os_error_text(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;  // committed, or failed and cleaned up
  close(fd_);
  unlink(tmp_.c_str());  // abandoned (an exception on the way): leave nothing half-written
}

void AtomicFileWriter::fail(const char* what, int err) {
  close(fd_);
  fd_ = -1;
  unlink(tmp_.c_str());  // leave nothing half-written; the previous `path` is untouched
  fatal(msg() << "cannot " << what << " " << tmp_ << " (for " << path_ << "): " << os_error_text(err));
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  GPT2_CHECK(fd_ >= 0, "write to " << tmp_ << " after commit");
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write", errno);
    done += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  GPT2_CHECK(fd_ >= 0, "(" << tmp_ << " committed twice)");
  // Space may only be allocated at fsync (delayed allocation, NFS): ENOSPC can first show up here.
  if (fsync(fd_) != 0) fail("fsync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) {
    const int e = errno;
    unlink(tmp_.c_str());
    fatal(msg() << "cannot close " << tmp_ << " (for " << path_ << "): " << os_error_text(e));
  }
  rename_durable(tmp_, path_);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFileWriter w(path);
  w.write(content.data(), content.size());
  w.commit();
}

}  // namespace gpt2
