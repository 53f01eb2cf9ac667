// RAII for HDF5 identifiers and the few typed helpers that the token files and checkpoints need.
// Every HDF5 call that can fail goes through H5_CHECK, so a failure names the file and object.
#pragma once

#include <hdf5.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"

// H5_CHECK(call, "what we were doing"): HDF5 returns a negative value on failure. errno is cleared
// first, so a system error under the call (a full disk: ENOSPC) is named in the message.
#define H5_CHECK(call, ...)                                         \
  GPT2_CHECK_GEN((errno = 0, (call)) >= 0,                          \
                 (::gpt2::msg() << "HDF5: " << __VA_ARGS__ << ::gpt2::h5::errno_suffix()).str())

namespace gpt2::h5 {

// Silences HDF5's own error stack printing: we report errors ourselves, with context.
void quiet_errors();

// ": <strerror(errno)>" when errno is set, else "" (for H5_CHECK).
std::string errno_suffix();

// "/model/wte.weight": the full name of `name` under `loc`, for messages.
std::string object_path(hid_t loc, const std::string& name);

// Owns one hid_t and closes it with the right H5*close for its type.
class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  ~Id() { reset(); }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Gives up ownership without closing (for a close whose result is checked).
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Opens an existing file read-only, with a clear error if it is missing, unreadable or not HDF5.
Id open_read(const std::string& path);
// Creates (truncates) a file for writing.
Id create(const std::string& path);
// Closes a file written with create(), checked: HDF5 writes cached data at close, so this is where
// a full disk often shows up first.
void close_written(Id& file, const std::string& path);

bool has_object(hid_t loc, const std::string& name);
bool has_attr(hid_t loc, const std::string& name);

// What `name` under `loc` is: "group", "dataset", "named datatype", or "" when it does not exist.
std::string object_kind(hid_t loc, const std::string& name);
// Opens a dataset; errors name the file and object: missing, or "is a group, not a dataset".
Id open_dataset(hid_t loc, const std::string& name, const std::string& file, hid_t dapl = H5P_DEFAULT);

// Dataset shape (dims); error if missing.
std::vector<hsize_t> dataset_shape(hid_t loc, const std::string& name, const std::string& file);

// zlib's CRC-32 of `bytes` bytes: the value Python's zlib.crc32() gives for them. Computed in 4 MiB
// pieces on every OpenMP thread and joined with crc32_combine, so a checkpoint's checksums cost a
// fraction of its write. `threads` false: on this thread alone, as a forked child must (libgomp's pool
// does not survive fork(): a parallel region in the child of a process that ran one waits forever).
uint32_t crc32_of(const void* data, size_t bytes, bool threads = true);
// The CRC-32 of A then B from A's and B's (zlib's crc32_combine), B being `bytes_b` bytes long.
uint32_t crc32_join(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

// Writes a float dataset (contiguous, little-endian fp32) and its attribute `crc32`: the CRC-32 of
// its values as little-endian fp32 bytes, so a byte that changes after the write (a bad disk, a bad
// copy between file systems) fails the read instead of loading as a wrong weight.
void write_f32(hid_t loc, const std::string& name, const float* data, const std::vector<hsize_t>& shape);
// Whether a dataset must carry `crc32` (files that promise one on every tensor) or is verified only
// when it does (files from before checksums, or from other tools).
enum class Crc { kIfPresent, kRequired };
// Reads a float dataset whose shape must equal `shape` exactly, and checks its crc32 attribute;
// returns whether it had one (and it matched: a mismatch ends the job, naming file and dataset).
bool read_f32(hid_t loc, const std::string& name, float* data, const std::vector<hsize_t>& shape,
              const std::string& file, Crc crc = Crc::kIfPresent);

void write_attr_i64(hid_t loc, const std::string& name, int64_t v);
void write_attr_f64(hid_t loc, const std::string& name, double v);
void write_attr_str(hid_t loc, const std::string& name, const std::string& v);
// Attribute reads check the type and that the attribute holds one value, e.g.
// "attribute 'vocab_size' of / in f.h5 is a string, expected an integer".
int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file);
double read_attr_f64(hid_t loc, const std::string& name, const std::string& file);
std::string read_attr_str(hid_t loc, const std::string& name, const std::string& file);
// The same for a probe that must not end the job: false when the attribute is missing, not one string, or
// unreadable.
bool probe_attr_str(hid_t loc, const std::string& name, std::string* out);

// Creates a group (and missing parents).
Id create_group(hid_t loc, const std::string& name);
Id open_group(hid_t loc, const std::string& name, const std::string& file);

}  // namespace gpt2::h5
