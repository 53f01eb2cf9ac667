// RAII for HDF5 identifiers and the few typed helpers that the token files and checkpoints need.
// Every HDF5 call that can fail goes through H5_CHECK, so a failure names the file and object.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"

// H5_CHECK(call, "what we were doing"): HDF5 returns a negative value on failure.
#define H5_CHECK(call, ...) \
  GPT2_CHECK_GEN((call) >= 0, (::gpt2::msg() << "HDF5: " << __VA_ARGS__).str())

namespace gpt2::h5 {

// Silences HDF5's own error stack printing: we report errors ourselves, with context.
void quiet_errors();

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

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Opens an existing file read-only, with a clear error if it is missing, unreadable or not HDF5.
Id open_read(const std::string& path);
// Creates (truncates) a file for writing.
Id create(const std::string& path);

bool has_object(hid_t loc, const std::string& name);
bool has_attr(hid_t loc, const std::string& name);

// Dataset shape (dims); error if missing.
std::vector<hsize_t> dataset_shape(hid_t loc, const std::string& name, const std::string& file);

void write_f32(hid_t loc, const std::string& name, const float* data, const std::vector<hsize_t>& shape);
// Reads a float dataset whose shape must equal `shape` exactly.
void read_f32(hid_t loc, const std::string& name, float* data, const std::vector<hsize_t>& shape,
              const std::string& file);

void write_attr_i64(hid_t loc, const std::string& name, int64_t v);
void write_attr_f64(hid_t loc, const std::string& name, double v);
void write_attr_str(hid_t loc, const std::string& name, const std::string& v);
int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file);
double read_attr_f64(hid_t loc, const std::string& name, const std::string& file);
std::string read_attr_str(hid_t loc, const std::string& name, const std::string& file);

// Creates a group (and missing parents).
Id create_group(hid_t loc, const std::string& name);
Id open_group(hid_t loc, const std::string& name, const std::string& file);

}  // namespace gpt2::h5
