#include "core/hdf5.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>

#include "core/file_io.hpp"

namespace gpt2::h5 {

void quiet_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string errno_suffix() {
  const int e = errno;
  return e != 0 ? ": " + os_error_text(e) : "";
}

// "/" for a file, "/optimizer/m" for a group.
static std::string loc_name(hid_t loc) {
  char buf[512] = {0};
  const ssize_t n = H5Iget_name(loc, buf, sizeof(buf));
  return n > 0 ? std::string(buf) : "/";
}

// The file `loc` belongs to, for messages about writes (which have no file argument).
static std::string file_name(hid_t loc) {
  char buf[4096] = {0};
  const ssize_t n = H5Fget_name(loc, buf, sizeof(buf));
  return n > 0 ? std::string(buf) : "(unknown file)";
}

std::string object_path(hid_t loc, const std::string& name) {
  std::string base = loc_name(loc);
  if (base.back() != '/') base += '/';
  return base + name;
}

void Id::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

Id open_read(const std::string& path) {
  quiet_errors();
  struct stat st {};
  GPT2_REQUIRE(stat(path.c_str(), &st) == 0, "file not found: " << path);
  GPT2_REQUIRE(access(path.c_str(), R_OK) == 0, "file is not readable: " << path);
  htri_t is = H5Fis_hdf5(path.c_str());
  GPT2_REQUIRE(is > 0, "not an HDF5 file (or truncated/corrupt): " << path);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  GPT2_REQUIRE(f >= 0, "cannot open HDF5 file (truncated or corrupt?): " << path);
  return Id(f);
}

Id create(const std::string& path) {
  quiet_errors();
  errno = 0;
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  GPT2_REQUIRE(f >= 0, "cannot create HDF5 file " << path << errno_suffix()
                                                  << " (does the directory exist and is it writable?)");
  return Id(f);
}

void close_written(Id& file, const std::string& path) {
  H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "cannot write " << path);
  const hid_t f = file.release();  // closed here, checked, not again by the Id
  H5_CHECK(H5Fclose(f), "cannot close " << path);
}

bool has_object(hid_t loc, const std::string& name) {
  // H5Lexists on a path with missing intermediate groups fails, so walk it.
  std::string prefix;
  size_t pos = 0;
  while (true) {
    size_t next = name.find('/', pos);
    prefix = name.substr(0, next);
    if (!prefix.empty() && H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (next == std::string::npos) return true;
    pos = next + 1;
  }
}

bool has_attr(hid_t loc, const std::string& name) { return H5Aexists(loc, name.c_str()) > 0; }

std::string object_kind(hid_t loc, const std::string& name) {
  if (!has_object(loc, name)) return "";
  Id obj(H5Oopen(loc, name.c_str(), H5P_DEFAULT));
  if (!obj.valid()) return "";  // e.g. a dangling soft link
  switch (H5Iget_type(obj.get())) {
    case H5I_GROUP: return "group";
    case H5I_DATASET: return "dataset";
    case H5I_DATATYPE: return "named datatype";
    default: return "object";
  }
}

Id open_dataset(hid_t loc, const std::string& name, const std::string& file, hid_t dapl) {
  const std::string kind = object_kind(loc, name);
  GPT2_REQUIRE(!kind.empty(), file << ": dataset " << object_path(loc, name) << " is missing");
  GPT2_REQUIRE(kind == "dataset", file << ": " << object_path(loc, name) << " is a " << kind << ", not a dataset");
  Id ds(H5Dopen2(loc, name.c_str(), dapl));
  H5_CHECK(ds.get(), "open dataset " << object_path(loc, name) << " in " << file);
  return ds;
}

std::vector<hsize_t> dataset_shape(hid_t loc, const std::string& name, const std::string& file) {
  Id ds = open_dataset(loc, name, file);
  Id space(H5Dget_space(ds.get()));
  int rank = H5Sget_simple_extent_ndims(space.get());
  H5_CHECK(rank, "dataspace of " << name << " in " << file);
  std::vector<hsize_t> dims(rank);
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "dims of " << name);
  return dims;
}

// The checksums are of little-endian bytes; a big-endian host would need to swap before summing.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "crc32 attributes are defined on little-endian fp32");

uint32_t crc32_join(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(bytes_b)));
}

uint32_t crc32_of(const void* data, size_t bytes, bool threads) {
  constexpr size_t kPiece = size_t{4} << 20;
  const auto* p = static_cast<const Bytef*>(data);
  // One piece: no OpenMP region at all (the runtime's own allocations then stay out of processes that read
  // many small files, such as the checkpoint fuzzer, where they mixed with libhdf5's use of freed memory).
  if (bytes <= kPiece) return static_cast<uint32_t>(::crc32(0L, p, static_cast<uInt>(bytes)));
  const size_t pieces = (bytes + kPiece - 1) / kPiece;
  std::vector<uLong> crc(pieces);
#pragma omp parallel for schedule(static) if (threads)
  for (size_t i = 0; i < pieces; ++i) {
    const size_t off = i * kPiece;
    crc[i] = ::crc32(0L, p + off, static_cast<uInt>(std::min(kPiece, bytes - off)));
  }
  uLong out = crc[0];
  for (size_t i = 1; i < pieces; ++i)
    out = ::crc32_combine(out, crc[i], static_cast<z_off_t>(std::min(kPiece, bytes - i * kPiece)));
  return static_cast<uint32_t>(out);
}

static size_t element_count(const std::vector<hsize_t>& shape) {
  size_t n = 1;
  for (hsize_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

void write_f32(hid_t loc, const std::string& name, const float* data, const std::vector<hsize_t>& shape) {
  Id space(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
  H5_CHECK(space.get(), "dataspace for " << name);
  Id ds(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(ds.get(), "cannot create dataset " << object_path(loc, name) << " in " << file_name(loc));
  H5_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
           "cannot write dataset " << object_path(loc, name) << " in " << file_name(loc));
  write_attr_i64(ds.get(), "crc32", crc32_of(data, element_count(shape) * sizeof(float)));
}

static const char* type_class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    case H5T_COMPOUND: return "a compound type";
    case H5T_ARRAY: return "an array type";
    case H5T_ENUM: return "an enum";
    case H5T_VLEN: return "a variable-length sequence";
    default: return "an unsupported type";
  }
}

static std::string shape_str(const std::vector<hsize_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

bool read_f32(hid_t loc, const std::string& name, float* data, const std::vector<hsize_t>& shape,
              const std::string& file, Crc crc) {
  std::vector<hsize_t> got = dataset_shape(loc, name, file);
  GPT2_REQUIRE(got == shape, file << ": dataset " << object_path(loc, name) << " has shape " << shape_str(got)
                                   << ", expected " << shape_str(shape));
  Id ds = open_dataset(loc, name, file);
  Id type(H5Dget_type(ds.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  GPT2_REQUIRE(cls == H5T_FLOAT || cls == H5T_INTEGER,
               file << ": dataset " << object_path(loc, name) << " holds " << type_class_name(cls)
                    << ", expected floats");
  H5_CHECK(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
           "read dataset " << object_path(loc, name) << " in " << file << " (truncated or corrupt file?)");
  const std::string where = file + ": dataset " + object_path(loc, name);
  if (!has_attr(ds.get(), "crc32")) {
    GPT2_REQUIRE(crc == Crc::kIfPresent, where << " has no crc32 attribute, which this file promises on every tensor "
                                                  "(damaged, or edited by a tool that dropped it)");
    return false;
  }
  const int64_t stored = read_attr_i64(ds.get(), "crc32", file);
  const uint32_t actual = crc32_of(data, element_count(shape) * sizeof(float));
  GPT2_REQUIRE(stored == static_cast<int64_t>(actual),
               where << " fails its CRC-32 check (attribute crc32 is " << stored << ", the data gives " << actual
                     << "): the file changed after it was written (a bad disk, copy or transfer); use another "
                        "copy or an earlier checkpoint. If you changed the tensor on purpose, set its crc32 to "
                        "Python's zlib.crc32(values.astype('<f4').tobytes())");
  return true;
}

static void write_attr(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type, const void* v) {
  Id space(H5Screate(H5S_SCALAR));
  if (H5Aexists(loc, name.c_str()) > 0) H5Adelete(loc, name.c_str());
  Id attr(H5Acreate2(loc, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(attr.get(), "cannot create attribute " << name << " of " << loc_name(loc) << " in " << file_name(loc));
  H5_CHECK(H5Awrite(attr.get(), mem_type, v),
           "cannot write attribute " << name << " of " << loc_name(loc) << " in " << file_name(loc));
}

void write_attr_i64(hid_t loc, const std::string& name, int64_t v) {
  write_attr(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}
void write_attr_f64(hid_t loc, const std::string& name, double v) {
  write_attr(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}
void write_attr_str(hid_t loc, const std::string& name, const std::string& v) {
  // Variable-length UTF-8 string: what h5py writes for a Python str, and reads back as str.
  Id type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* p = v.c_str();
  write_attr(loc, name, type.get(), type.get(), &p);
}

// Opens an attribute that must hold one value of class `want` (an integer is also read as a double).
// Checking the size matters: H5Aread of a 3-element attribute into one int64 writes past it.
static Id open_attr(hid_t loc, const std::string& name, const std::string& file, H5T_class_t want) {
  const std::string where = "attribute " + name + " of " + loc_name(loc);
  GPT2_REQUIRE(H5Aexists(loc, name.c_str()) > 0, file << ": " << where << " is missing");
  Id attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT));
  H5_CHECK(attr.get(), "open " << where << " in " << file);
  Id type(H5Aget_type(attr.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  const char* expected = want == H5T_STRING ? "a string" : want == H5T_INTEGER ? "an integer" : "a number";
  GPT2_REQUIRE(cls == want || (want == H5T_FLOAT && cls == H5T_INTEGER),
               file << ": " << where << " is " << type_class_name(cls) << ", expected " << expected);
  Id space(H5Aget_space(attr.get()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  GPT2_REQUIRE(n == 1, file << ": " << where << " holds " << n << " values, expected one");
  return attr;
}

int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file) {
  Id attr = open_attr(loc, name, file, H5T_INTEGER);
  int64_t v = 0;
  H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "read attribute " << name << " in " << file);
  return v;
}

double read_attr_f64(hid_t loc, const std::string& name, const std::string& file) {
  Id attr = open_attr(loc, name, file, H5T_FLOAT);
  double v = 0;
  H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), "read attribute " << name << " in " << file);
  return v;
}

// The value of a string attribute already opened (fixed or variable length, in its own character set); false
// when HDF5 cannot read it.
static bool read_str(hid_t attr, std::string* out) {
  Id ftype(H5Aget_type(attr));
  Id mtype(H5Tcopy(H5T_C_S1));
  H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get()));
  if (H5Tis_variable_str(ftype.get()) > 0) {
    H5Tset_size(mtype.get(), H5T_VARIABLE);
    char* p = nullptr;
    if (H5Aread(attr, mtype.get(), &p) < 0) return false;
    *out = p ? p : "";
    Id space(H5Aget_space(attr));
    H5Dvlen_reclaim(mtype.get(), space.get(), H5P_DEFAULT, &p);
    return true;
  }
  const size_t n = H5Tget_size(ftype.get());
  out->assign(n, '\0');
  H5Tset_size(mtype.get(), n);
  if (H5Aread(attr, mtype.get(), out->data()) < 0) return false;
  while (!out->empty() && out->back() == '\0') out->pop_back();
  return true;
}

std::string read_attr_str(hid_t loc, const std::string& name, const std::string& file) {
  Id attr = open_attr(loc, name, file, H5T_STRING);
  std::string out;
  H5_CHECK(read_str(attr.get(), &out) ? 0 : -1, "read attribute " << name << " in " << file);
  return out;
}

bool probe_attr_str(hid_t loc, const std::string& name, std::string* out) {
  if (H5Aexists(loc, name.c_str()) <= 0) return false;
  Id attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT));
  if (!attr.valid()) return false;
  Id type(H5Aget_type(attr.get()));
  Id space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING || H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  return read_str(attr.get(), out);
}

Id create_group(hid_t loc, const std::string& name) {
  Id lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Id g(H5Gcreate2(loc, name.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(g.get(), "cannot create group " << object_path(loc, name) << " in " << file_name(loc));
  return g;
}

Id open_group(hid_t loc, const std::string& name, const std::string& file) {
  const std::string kind = object_kind(loc, name);
  GPT2_REQUIRE(!kind.empty(), file << ": group " << object_path(loc, name) << " is missing");
  GPT2_REQUIRE(kind == "group", file << ": " << object_path(loc, name) << " is a " << kind << ", not a group");
  Id g(H5Gopen2(loc, name.c_str(), H5P_DEFAULT));
  H5_CHECK(g.get(), "open group " << object_path(loc, name) << " in " << file);
  return g;
}

}  // namespace gpt2::h5
