#include "train/checkpoint.hpp"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "core/file_io.hpp"
#include "core/hdf5.hpp"
#include "core/log.hpp"
#include "data/token_file.hpp"

namespace gpt2 {

namespace {

std::string dir_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == std::string::npos ? "." : path.substr(0, s);
}

std::string base_of(const std::string& path) { return path.substr(path.rfind('/') + 1); }

void make_dirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  GPT2_REQUIRE(!ec, "cannot create directory " << dir << ": " << ec.message());
}

std::vector<hsize_t> hshape(const std::vector<size_t>& s) { return std::vector<hsize_t>(s.begin(), s.end()); }

size_t hf_numel(const ParamInfo& p) {
  size_t n = 1;
  for (size_t d : p.hf_shape) n *= d;
  return n;
}

// A checkpoint never holds NaN or Inf: resuming from it could only fail again. The first such value of a
// set of tensors ("<what> <tensor> holds <x> at index <i>"), or "" when there is none; wte's padding rows are
// not in the file and not looked at.
std::string first_non_finite(const ParamTable& table, const float* base, const char* what) {
  for (const ParamInfo& p : table.params()) {
    const float* x = base + p.offset;
    const size_t n = hf_numel(p);
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) {
        std::ostringstream os;
        os << what << " " << p.name << " holds " << x[i] << " at index " << i;
        return os.str();
      }
  }
  return "";
}

// Before a write: names the first offending tensor, so the message says where the divergence shows.
void require_finite(const std::string& path, const ParamTable& table, const float* base, const char* what) {
  const std::string bad = first_non_finite(table, base, what);
  GPT2_REQUIRE(bad.empty(), "refusing to write checkpoint " << path << ": " << bad
                                                            << " (training diverged; lower --lr or check the data)");
}

// After a read: no checkpoint this program writes holds one (require_finite), so the file was damaged or
// written by something else; loading it would train, sample or export from garbage.
void require_finite_loaded(const std::string& path, const ParamTable& table, const float* base, const char* what) {
  const std::string bad = first_non_finite(table, base, what);
  GPT2_REQUIRE(bad.empty(), "checkpoint " << path << " is corrupt: " << bad
                                          << " (a checkpoint written by gpt2-train never holds NaN or Inf; use an "
                                             "earlier one)");
}

// A counter attribute of a checkpoint, at least `min`: a negative step would start the data order before its
// beginning (found as an internal check deep in the batch loader, naming neither file nor attribute).
int64_t read_count_attr(hid_t loc, const char* name, const std::string& path, int64_t min) {
  const int64_t v = h5::read_attr_i64(loc, name, path);
  GPT2_REQUIRE(v >= min, "checkpoint " << path << " is corrupt: attribute " << name << " is " << v << " (at least "
                                       << min << " expected)");
  return v;
}

// Root attribute of a checkpoint written since 2026-12-07: "crc32" when every tensor carries its CRC-32.
// Older checkpoints have none and load as before (their tensors are not verified).
constexpr const char* kTensorChecksum = "tensor_checksum";

bool promises_checksums(hid_t f, const std::string& path) {
  if (!h5::has_attr(f, kTensorChecksum)) return false;
  const std::string kind = h5::read_attr_str(f, kTensorChecksum, path);
  GPT2_REQUIRE(kind == "crc32", "checkpoint " << path << " has tensor checksums of kind '" << kind
                                              << "'; this build verifies crc32 only");
  return true;
}

// The root attributes that continue a run (TrainState), checked as load_checkpoint takes them.
TrainState read_train_state(hid_t f, const std::string& path) {
  TrainState state;
  state.step = read_count_attr(f, "step", path, 0);
  state.tokens_seen = read_count_attr(f, "tokens_seen", path, 0);
  state.seed = static_cast<uint64_t>(h5::read_attr_i64(f, "seed", path));
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  state.world_size = static_cast<int>(std::min(read_count_attr(f, "world_size", path, 1), kMaxInt));
  state.global_batch_tokens =
      h5::has_attr(f, "global_batch_tokens") ? read_count_attr(f, "global_batch_tokens", path, 0) : 0;
  state.seq_len =
      h5::has_attr(f, "seq_len") ? static_cast<int>(std::min(read_count_attr(f, "seq_len", path, 0), kMaxInt)) : 0;
  return state;
}

// The groups that hold one dataset per parameter.
std::vector<const char*> tensor_groups(bool with_optimizer) {
  if (with_optimizer) return {"model", "optimizer/m", "optimizer/v"};
  return {"model"};
}

// step_*.h5 in <out>/ckpt, oldest first (the zero-padded step numbers sort in step order).
std::vector<std::string> list_checkpoint_names(const std::string& out_dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir((out_dir + "/ckpt").c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("step_", 0) == 0 && n.size() > 3 && n.compare(n.size() - 3, 3, ".h5") == 0) names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Integer attribute without ending the job (for checkpoint_problem): false when missing or not one integer.
bool probe_attr_i64(hid_t loc, const char* name, int64_t* v) {
  if (H5Aexists(loc, name) <= 0) return false;
  h5::Id attr(H5Aopen(loc, name, H5P_DEFAULT));
  if (!attr.valid()) return false;
  h5::Id type(H5Aget_type(attr.get()));
  h5::Id space(H5Aget_space(attr.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  return H5Aread(attr.get(), H5T_NATIVE_INT64, v) >= 0;
}

// "" when every tensor of `table` is a dataset of the right shape in group `name` of `f`, with its crc32
// attribute when `checksums` (probe_values reads the values after every group's metadata passed).
std::string probe_tensors(hid_t f, const std::string& name, const ParamTable& table, bool checksums) {
  if (h5::object_kind(f, name) != "group") return "it has no group /" + name;
  h5::Id g(H5Gopen2(f, name.c_str(), H5P_DEFAULT));
  if (!g.valid()) return "HDF5 cannot open /" + name;
  for (const ParamInfo& p : table.params()) {
    if (h5::object_kind(g.get(), p.name) != "dataset") return "/" + name + "/" + p.name + " is missing";
    h5::Id ds(H5Dopen2(g.get(), p.name.c_str(), H5P_DEFAULT));
    h5::Id space(H5Dget_space(ds.get()));
    const int nd = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(nd > 0 ? nd : 0);
    if (nd < 0 || H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0 || dims != hshape(p.hf_shape))
      return "/" + name + "/" + p.name + " has the wrong shape";
    int64_t crc = 0;
    if (checksums && !probe_attr_i64(ds.get(), "crc32", &crc)) return "/" + name + "/" + p.name + " has no crc32";
  }
  return "";
}

// "" when every tensor of group `name` reads back, matches its crc32 (when it has one) and is finite: what
// load_checkpoint checks as it reads, so that --resume auto passes over a checkpoint whose bytes changed on
// disk instead of failing on it at every requeue. Tensors in our writer's form only (contiguous, stored in
// exactly their fp32 bytes, within the file's size); any other (a compressed copy made with h5py) is left to
// the load, as a size read from a corrupt header must not become an allocation.
std::string probe_values(hid_t f, const std::string& name, const ParamTable& table, hsize_t file_bytes) {
  h5::Id g(H5Gopen2(f, name.c_str(), H5P_DEFAULT));
  if (!g.valid()) return "HDF5 cannot open /" + name;
  std::vector<float> buf;
  for (const ParamInfo& p : table.params()) {
    const std::string where = "/" + name + "/" + p.name;
    h5::Id ds(H5Dopen2(g.get(), p.name.c_str(), H5P_DEFAULT));
    h5::Id dcpl(H5Dget_create_plist(ds.get()));
    const hsize_t bytes = static_cast<hsize_t>(hf_numel(p)) * sizeof(float);
    if (!ds.valid() || !dcpl.valid() || H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS ||
        H5Dget_storage_size(ds.get()) != bytes || bytes > file_bytes)
      continue;
    buf.resize(hf_numel(p));
    if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
      return where + " cannot be read (truncated or corrupt)";
    int64_t crc = 0;
    // On one thread: the probe runs in a forked child, where an OpenMP parallel region would hang.
    if (probe_attr_i64(ds.get(), "crc32", &crc) &&
        crc != static_cast<int64_t>(h5::crc32_of(buf.data(), bytes, /*threads=*/false)))
      return where + " fails its CRC-32 check (its bytes changed after the write)";
    const auto bad = std::find_if(buf.begin(), buf.end(), [](float x) { return !std::isfinite(x); });
    if (bad != buf.end())
      return where + " holds " + std::to_string(*bad) + " at index " + std::to_string(bad - buf.begin());
  }
  return "";
}

}  // namespace

void save_checkpoint(const std::string& path, const GPT2& model, const OptimizerState* opt, const TrainState& state) {
  require_finite(path, model.table(), model.params().data(), "parameter");
  if (opt != nullptr) {
    require_finite(path, model.table(), opt->m, "Adam first moment of");
    require_finite(path, model.table(), opt->v, "Adam second moment of");
  }
  make_dirs(dir_of(path));
  const std::string tmp = path + ".tmp";
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::Id f = h5::create(tmp);
    const GPT2Config& c = model.config();
    h5::write_attr_i64(f.get(), "format_version", 1);
    // Every tensor below carries its CRC-32 (h5::write_f32); this promise makes a missing one an error.
    h5::write_attr_str(f.get(), kTensorChecksum, "crc32");
    h5::write_attr_i64(f.get(), "n_layer", c.n_layer);
    h5::write_attr_i64(f.get(), "n_head", c.n_head);
    h5::write_attr_i64(f.get(), "n_embd", c.n_embd);
    h5::write_attr_i64(f.get(), "vocab_size", c.vocab_size);
    h5::write_attr_i64(f.get(), "max_seq_len", c.max_seq_len);
    h5::write_attr_i64(f.get(), "step", state.step);
    h5::write_attr_i64(f.get(), "tokens_seen", state.tokens_seen);
    h5::write_attr_i64(f.get(), "seed", static_cast<int64_t>(state.seed));
    h5::write_attr_i64(f.get(), "data_step", state.step);  // the sampler is a pure function of (seed, step)
    h5::write_attr_i64(f.get(), "world_size", state.world_size);
    h5::write_attr_i64(f.get(), "global_batch_tokens", state.global_batch_tokens);
    h5::write_attr_i64(f.get(), "seq_len", state.seq_len);
    // Internal and Hugging Face layouts agree except for wte's padding rows, which are left out:
    // the first vocab_size rows are contiguous at the start of the tensor.
    h5::Id g = h5::create_group(f.get(), "model");
    for (const ParamInfo& p : model.table().params())
      h5::write_f32(g.get(), p.name, model.params().data() + p.offset, hshape(p.hf_shape));
    if (opt != nullptr) {
      h5::Id go = h5::create_group(f.get(), "optimizer");
      h5::Id gm = h5::create_group(go.get(), "m");
      h5::Id gv = h5::create_group(go.get(), "v");
      for (const ParamInfo& p : model.table().params()) {
        h5::write_f32(gm.get(), p.name, opt->m + p.offset, hshape(p.hf_shape));
        h5::write_f32(gv.get(), p.name, opt->v + p.offset, hshape(p.hf_shape));
      }
      const AdamWConfig& oc = opt->config;
      h5::write_attr_i64(go.get(), "step", opt->step);
      h5::write_attr_f64(go.get(), "beta1", oc.beta1);
      h5::write_attr_f64(go.get(), "beta2", oc.beta2);
      h5::write_attr_f64(go.get(), "eps", oc.eps);
      h5::write_attr_f64(go.get(), "weight_decay", oc.weight_decay);
      h5::write_attr_f64(go.get(), "grad_clip", oc.grad_clip);
    }
    // A failed write (a full disk) ends the job here, naming the file and the reason; the .tmp it
    // leaves is removed at the next start, and `latest` still names the previous checkpoint.
    h5::close_written(f, tmp);
  }
  fsync_path_or_die(tmp);
  rename_durable(tmp, path);
}

GPT2Config read_checkpoint_config(const std::string& path) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::Id f = h5::open_read(path);
  GPT2_REQUIRE(h5::has_object(f.get(), "model"), path << " is not a checkpoint: it has no /model group");
  // Each dimension in [1, 2^30] before it becomes an int: a corrupt 2^32 + 12 must not read as 12.
  auto dim = [&](const char* name) {
    const int64_t v = h5::read_attr_i64(f.get(), name, path);
    GPT2_REQUIRE(v >= 1 && v <= (int64_t{1} << 30),
                 "checkpoint " << path << " has an invalid model: attribute " << name << " is " << v);
    return static_cast<int>(v);
  };
  GPT2Config c;
  c.n_layer = dim("n_layer");
  c.n_head = dim("n_head");
  c.n_embd = dim("n_embd");
  c.vocab_size = dim("vocab_size");
  c.max_seq_len = dim("max_seq_len");
  const std::string err = c.validate();
  GPT2_REQUIRE(err.empty(), "checkpoint " << path << " has an invalid model: " << err);
  return c;
}

bool load_checkpoint(const std::string& path, GPT2& model, OptimizerState* opt, TrainState* state) {
  const GPT2Config fc = read_checkpoint_config(path);
  const GPT2Config& mc = model.config();
  GPT2_REQUIRE_OPTIONS(fc.n_layer == mc.n_layer && fc.n_head == mc.n_head && fc.n_embd == mc.n_embd &&
                           fc.vocab_size == mc.vocab_size && fc.max_seq_len == mc.max_seq_len,
                       "checkpoint " << path << " holds a model " << fc.describe() << " but this run builds "
                                     << mc.describe() << "; pass matching model options");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::Id f = h5::open_read(path);
  h5::Id g = h5::open_group(f.get(), "model", path);
  const h5::Crc crc = promises_checksums(f.get(), path) ? h5::Crc::kRequired : h5::Crc::kIfPresent;
  std::vector<float>& params = model.params();
  std::fill(params.begin(), params.end(), 0.0f);
  for (const ParamInfo& p : model.table().params())
    h5::read_f32(g.get(), p.name, params.data() + p.offset, hshape(p.hf_shape), path, crc);
  require_finite_loaded(path, model.table(), params.data(), "parameter");
  bool loaded_opt = false;
  if (opt != nullptr && h5::has_object(f.get(), "optimizer")) {
    h5::Id go = h5::open_group(f.get(), "optimizer", path);
    h5::Id gm = h5::open_group(go.get(), "m", path);
    h5::Id gv = h5::open_group(go.get(), "v", path);
    std::fill(opt->m, opt->m + model.table().total(), 0.0f);
    std::fill(opt->v, opt->v + model.table().total(), 0.0f);
    for (const ParamInfo& p : model.table().params()) {
      h5::read_f32(gm.get(), p.name, opt->m + p.offset, hshape(p.hf_shape), path, crc);
      h5::read_f32(gv.get(), p.name, opt->v + p.offset, hshape(p.hf_shape), path, crc);
    }
    require_finite_loaded(path, model.table(), opt->m, "Adam first moment of");
    require_finite_loaded(path, model.table(), opt->v, "Adam second moment of");
    opt->step = static_cast<long>(read_count_attr(go.get(), "step", path, 0));
    loaded_opt = true;
  }
  if (state != nullptr) *state = read_train_state(f.get(), path);
  return loaded_opt;
}

CheckpointReport inspect_checkpoint(const std::string& path) {
  CheckpointReport r;
  r.config = read_checkpoint_config(path);
  const ParamTable table(r.config);
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::Id f = h5::open_read(path);
  const h5::Crc crc = promises_checksums(f.get(), path) ? h5::Crc::kRequired : h5::Crc::kIfPresent;
  r.has_optimizer = h5::has_object(f.get(), "optimizer");
  std::vector<float> buf;
  for (const char* group : tensor_groups(r.has_optimizer)) {
    h5::Id g = h5::open_group(f.get(), group, path);
    for (const ParamInfo& p : table.params()) {
      // The shape before the buffer: a corrupt vocab_size must not become a 10 GB allocation first.
      const std::vector<hsize_t> got = h5::dataset_shape(g.get(), p.name, path);
      GPT2_REQUIRE(got == hshape(p.hf_shape), "checkpoint " << path << " is corrupt: /" << group << "/" << p.name
                                                            << " does not have the shape its model attributes give");
      buf.resize(hf_numel(p));
      r.crc_verified += h5::read_f32(g.get(), p.name, buf.data(), hshape(p.hf_shape), path, crc) ? 1 : 0;
      const auto bad = std::find_if(buf.begin(), buf.end(), [](float x) { return !std::isfinite(x); });
      GPT2_REQUIRE(bad == buf.end(), "checkpoint " << path << " is corrupt: /" << group << "/" << p.name << " holds "
                                                   << *bad << " at index " << (bad - buf.begin()));
      ++r.tensors;
      r.bytes += static_cast<double>(buf.size()) * sizeof(float);
    }
  }
  if (r.has_optimizer) {
    h5::Id go = h5::open_group(f.get(), "optimizer", path);
    r.optimizer_step = static_cast<long>(read_count_attr(go.get(), "step", path, 0));
  }
  r.state = read_train_state(f.get(), path);
  return r;
}

std::string checkpoint_path(const std::string& out_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step_%08lld.h5", static_cast<long long>(step));
  return out_dir + "/ckpt/" + name;
}

void write_latest(const std::string& out_dir, const std::string& path) {
  // Atomic (tmp, fsync, rename, fsync of the directory) and checked: an empty `latest` after a full
  // disk once made --resume auto start again from step 0.
  write_file_atomic(out_dir + "/ckpt/latest", base_of(path) + "\n");
}

std::string read_latest(const std::string& out_dir) {
  std::ifstream is(out_dir + "/ckpt/latest");
  std::string name;
  if (!is.good() || !(is >> name)) return "";
  return out_dir + "/ckpt/" + name;
}

void prune_checkpoints(const std::string& out_dir, int keep, const std::string& current) {
  if (keep <= 0) return;
  const std::string dir = out_dir + "/ckpt";
  std::vector<std::string> names = list_checkpoint_names(out_dir);
  const std::string current_name = base_of(current);
  names.erase(std::upper_bound(names.begin(), names.end(), current_name), names.end());  // up to current
  for (size_t i = 0; i + keep < names.size(); ++i)
    if (names[i] != current_name) std::remove((dir + "/" + names[i]).c_str());
}

namespace {

// How long the probe may take before the file counts as corrupt (libhdf5 can spin on a corrupt length): a
// minute, and as long again as reading the file at 50 MB/s (a busy parallel file system) takes.
int probe_timeout_s(const std::string& path) {
  struct stat st {};
  const double bytes = stat(path.c_str(), &st) == 0 ? static_cast<double>(st.st_size) : 0.0;
  return 60 + static_cast<int>(std::min(bytes / 50e6, 1e6));
}

// checkpoint_problem's work, in the calling process; the caller holds hdf5_mutex().
std::string probe_checkpoint(const std::string& path) {
  h5::quiet_errors();
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::string("cannot stat it: ") + os_error_text(errno);
  if (access(path.c_str(), R_OK) != 0) return std::string("cannot read it: ") + os_error_text(errno);
  if (H5Fis_hdf5(path.c_str()) <= 0) return "it is not an HDF5 file (" + std::to_string(st.st_size) + " bytes)";
  h5::Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) return "HDF5 cannot open it (truncated or corrupt)";
  GPT2Config c;
  int64_t v[5];
  const char* dims[5] = {"n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len"};
  for (int i = 0; i < 5; ++i)
    if (!probe_attr_i64(f.get(), dims[i], &v[i]) || v[i] <= 0 || v[i] > (1 << 30))
      return std::string("attribute ") + dims[i] + " is missing or invalid";
  struct Counter {
    const char* name;
    int64_t least;  // what load_checkpoint accepts (read_count_attr's minimum; any seed)
  };
  for (const Counter& a : {Counter{"step", 0}, Counter{"tokens_seen", 0},
                           Counter{"seed", std::numeric_limits<int64_t>::min()}, Counter{"world_size", 1}}) {
    int64_t value = 0;
    if (!probe_attr_i64(f.get(), a.name, &value) || value < a.least)
      return std::string("attribute ") + a.name + " is missing or invalid";
  }
  c.n_layer = static_cast<int>(v[0]);
  c.n_head = static_cast<int>(v[1]);
  c.n_embd = static_cast<int>(v[2]);
  c.vocab_size = static_cast<int>(v[3]);
  c.max_seq_len = static_cast<int>(v[4]);
  const std::string err = c.validate();
  if (!err.empty()) return "invalid model: " + err;
  const ParamTable table(c);
  const bool checksums = H5Aexists(f.get(), kTensorChecksum) > 0;
  std::string checksum_kind;
  if (checksums && (!h5::probe_attr_str(f.get(), kTensorChecksum, &checksum_kind) || checksum_kind != "crc32"))
    return std::string("attribute ") + kTensorChecksum + " is not \"crc32\" (the one kind this build verifies)";
  const bool with_optimizer = h5::has_object(f.get(), "optimizer");
  std::string problem;
  for (const char* group : tensor_groups(with_optimizer))
    if (problem.empty()) problem = probe_tensors(f.get(), group, table, checksums);
  // The values last: every tensor read once more (on rank 0, in the probe's process), about a second for
  // 124M's 1.5 GB.
  for (const char* group : tensor_groups(with_optimizer))
    if (problem.empty()) problem = probe_values(f.get(), group, table, static_cast<hsize_t>(st.st_size));
  return problem;
}

}  // namespace

std::string checkpoint_problem_in_process(const std::string& path) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  return probe_checkpoint(path);
}

std::string checkpoint_problem(const std::string& path) {
  // No other thread is inside HDF5 while we fork (the child inherits this lock held, and never takes it).
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  int fds[2];
  if (pipe(fds) != 0) return probe_checkpoint(path);  // no pipe: probe here, unprotected
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return probe_checkpoint(path);
  }
  if (pid == 0) {  // the child: answer through the pipe and leave without atexit handlers (MPI, HDF5)
    close(fds[0]);
    // Forked inside a fail_together() (--resume PATH): an error here must end this child, never unwind
    // into the copy of the parent's stack and take part in its collectives.
    FatalAsException::end_all_on_this_thread();
    // Test hook: GPT2_FAULT_PROBE_CRASH=TEXT makes the probe of a path containing TEXT crash as libhdf5
    // does on some corrupt files, whatever the libhdf5 version.
    if (const char* f = std::getenv("GPT2_FAULT_PROBE_CRASH"); f != nullptr && *f && path.find(f) != std::string::npos)
      raise(SIGSEGV);
    std::string answer;
    try {
      answer = "=" + probe_checkpoint(path);
    } catch (const std::exception& e) {
      answer = std::string("=cannot be probed: ") + e.what();
    } catch (...) {
      answer = "=cannot be probed: an unknown exception";
    }
    for (size_t done = 0; done < answer.size();) {
      const ssize_t n = write(fds[1], answer.data() + done, answer.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string answer;
  const int timeout_s = probe_timeout_s(path);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fds[0], POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child is done (or died)
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return "libhdf5 did not finish reading it within " + std::to_string(timeout_s) +
           " s (a corrupt file, or a file system slower than 50 MB/s)";
  if (WIFSIGNALED(status))
    return std::string("libhdf5 crashed reading it (") + strsignal(WTERMSIG(status)) + "): a corrupt file";
  if (answer.empty() || answer[0] != '=') return "cannot be probed (the probe process ended without an answer)";
  return answer.substr(1);
}

std::string find_resume_checkpoint(const std::string& out_dir) {
  const std::string latest_file = out_dir + "/ckpt/latest";
  const std::string named = read_latest(out_dir);
  std::string why;
  if (!named.empty()) {
    const std::string problem = checkpoint_problem(named);
    if (problem.empty()) return named;
    why = latest_file + " names " + base_of(named) + ", which does not load: " + problem;
  } else {
    why = latest_file + (std::filesystem::exists(latest_file) ? " is empty" : " is missing");
  }
  // `latest` is written after the checkpoint it names, so the newest step file that loads is the
  // newest complete checkpoint: resume there rather than start again from step 0.
  const std::vector<std::string> names = list_checkpoint_names(out_dir);
  std::string skipped;
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    const std::string path = out_dir + "/ckpt/" + *it;
    const std::string problem = checkpoint_problem(path);
    if (problem.empty()) {
      log_warn("%s; using the newest checkpoint that loads: %s%s\n", why.c_str(), path.c_str(), skipped.c_str());
      return path;
    }
    skipped += "\n  skipped " + *it + ": " + problem;
  }
  GPT2_REQUIRE(!names.empty() || named.empty(),
               why << ", and " << out_dir << "/ckpt holds no checkpoint (step_*.h5) to resume from instead: remove "
                   << latest_file << " to start afresh, or pass --resume PATH");
  GPT2_REQUIRE(names.empty(), why << ", and none of the " << names.size() << " checkpoint(s) in " << out_dir
                                  << "/ckpt loads:" << skipped
                                  << "\nMove them away to start afresh, or pass --resume PATH");
  return "";
}

std::string resolve_checkpoint(const std::string& path) {
  if (!std::filesystem::is_directory(path)) return path;
  const std::string found = find_resume_checkpoint(path);
  GPT2_REQUIRE(!found.empty(), path << " is a directory without checkpoints (no ckpt/latest, no ckpt/step_*.h5): "
                                    << "give a checkpoint file or a run's --out directory");
  return found;
}

void remove_stale_temporaries(const std::string& out_dir) {
  // Left by a run that died (or hit a full disk) while writing: never a complete file (the rename
  // that completes a write removes its .tmp name). Removing them frees the space they hold.
  for (const std::string& dir : {out_dir + "/ckpt", out_dir}) {
    std::vector<std::string> stale;
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string n = e->d_name;
        struct stat st {};
        // Only regular files: we never write anything else under a .tmp name.
        if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0 && lstat((dir + "/" + n).c_str(), &st) == 0 &&
            S_ISREG(st.st_mode))
          stale.push_back(dir + "/" + n);
      }
      closedir(d);
    }
    for (const std::string& p : stale) {
      GPT2_REQUIRE(std::remove(p.c_str()) == 0,
                   "cannot remove stale temporary file " << p << ": " << os_error_text(errno));
      log_warn("removed %s, left by an earlier run that stopped while writing it\n", p.c_str());
    }
  }
}

}  // namespace gpt2
