// Files written so that a crash or a full disk never leaves a damaged one behind, and every failure
// names the path and the system's reason (strerror): ckpt/latest, the rewrite of metrics.jsonl on
// resume, the Hugging Face export (model.safetensors, config.json).
#pragma once

#include <cstddef>
#include <string>

namespace gpt2 {

// strerror(e), with a hint where the usual remedy is not obvious ("No space left on device").
std::string os_error_text(int e);

// Writes `path` atomically, in pieces (a file too large to build in memory first): `path`.tmp is
// written, then commit() fsyncs, closes and renames it over `path` and fsyncs the directory. Any
// failure removes the temporary file and ends the job naming the path and the reason. A writer
// destroyed without commit() (an exception on the way) removes the temporary file too: `path` is
// never touched until commit.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t bytes);
  void commit();

 private:
  [[noreturn]] void fail(const char* what, int err);
  std::string path_, tmp_;
  int fd_ = -1;
};

// AtomicFileWriter for a file whose content is at hand.
void write_file_atomic(const std::string& path, const std::string& content);

// fsync of a file or directory; a failure ends the job naming the path and the reason.
void fsync_path_or_die(const std::string& path);

// Renames tmp to path (checked), then fsyncs the directory so that the rename itself is durable.
void rename_durable(const std::string& tmp, const std::string& path);

}  // namespace gpt2
