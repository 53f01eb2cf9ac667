// Small files written so that a crash or a full disk never leaves a damaged one behind, and every
// failure names the path and the system's reason (strerror). Rank 0 uses these for ckpt/latest and
// the rewrite of metrics.jsonl on resume.
#pragma once

#include <string>

namespace gpt2 {

// strerror(e), with a hint where the usual remedy is not obvious ("No space left on device").
std::string os_error_text(int e);

// Writes `content` to `path` atomically: `path`.tmp, write, fsync, close, rename, fsync of the
// directory. Any failure removes the temporary file and ends the job naming the path and the reason.
void write_file_atomic(const std::string& path, const std::string& content);

// fsync of a file or directory; a failure ends the job naming the path and the reason.
void fsync_path_or_die(const std::string& path);

// Renames tmp to path (checked), then fsyncs the directory so that the rename itself is durable.
void rename_durable(const std::string& tmp, const std::string& path);

}  // namespace gpt2
