#include "train/checkpoint.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/hdf5.hpp"
#include "data/token_file.hpp"

namespace gpt2 {

namespace {

void fsync_path(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

std::string dir_of(const std::string& path) {
  const size_t s = path.rfind('/');
  return s == std::string::npos ? "." : path.substr(0, s);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  GPT2_REQUIRE(!ec, "cannot create directory " << dir << ": " << ec.message());
}

void atomic_rename(const std::string& tmp, const std::string& path) {
  fsync_path(tmp);
  GPT2_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename " << tmp << " to " << path);
  fsync_path(dir_of(path));  // make the rename itself durable
}

std::vector<hsize_t> hshape(const std::vector<size_t>& s) { return std::vector<hsize_t>(s.begin(), s.end()); }

}  // namespace

void save_checkpoint(const std::string& path, const GPT2& model, const AdamW* opt, const TrainState& state) {
  make_dirs(dir_of(path));
  const std::string tmp = path + ".tmp";
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    h5::Id f = h5::create(tmp);
    const GPT2Config& c = model.config();
    h5::write_attr_i64(f.get(), "format_version", 1);
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
        h5::write_f32(gm.get(), p.name, opt->m().data() + p.offset, hshape(p.hf_shape));
        h5::write_f32(gv.get(), p.name, opt->v().data() + p.offset, hshape(p.hf_shape));
      }
      const AdamWConfig& oc = opt->config();
      h5::write_attr_i64(go.get(), "step", opt->step_count());
      h5::write_attr_f64(go.get(), "beta1", oc.beta1);
      h5::write_attr_f64(go.get(), "beta2", oc.beta2);
      h5::write_attr_f64(go.get(), "eps", oc.eps);
      h5::write_attr_f64(go.get(), "weight_decay", oc.weight_decay);
      h5::write_attr_f64(go.get(), "grad_clip", oc.grad_clip);
    }
    H5_CHECK(H5Fflush(f.get(), H5F_SCOPE_GLOBAL), "flush " << tmp);
  }
  atomic_rename(tmp, path);
}

GPT2Config read_checkpoint_config(const std::string& path) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::Id f = h5::open_read(path);
  GPT2_REQUIRE(h5::has_object(f.get(), "model"), path << " is not a checkpoint: it has no /model group");
  GPT2Config c;
  c.n_layer = static_cast<int>(h5::read_attr_i64(f.get(), "n_layer", path));
  c.n_head = static_cast<int>(h5::read_attr_i64(f.get(), "n_head", path));
  c.n_embd = static_cast<int>(h5::read_attr_i64(f.get(), "n_embd", path));
  c.vocab_size = static_cast<int>(h5::read_attr_i64(f.get(), "vocab_size", path));
  c.max_seq_len = static_cast<int>(h5::read_attr_i64(f.get(), "max_seq_len", path));
  const std::string err = c.validate();
  GPT2_REQUIRE(err.empty(), "checkpoint " << path << " has an invalid model: " << err);
  return c;
}

bool load_checkpoint(const std::string& path, GPT2& model, AdamW* opt, TrainState* state) {
  const GPT2Config fc = read_checkpoint_config(path);
  const GPT2Config& mc = model.config();
  GPT2_REQUIRE(fc.n_layer == mc.n_layer && fc.n_head == mc.n_head && fc.n_embd == mc.n_embd &&
                   fc.vocab_size == mc.vocab_size && fc.max_seq_len == mc.max_seq_len,
               "checkpoint " << path << " holds a model " << fc.describe() << " but this run builds "
                             << mc.describe() << "; pass matching model options");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::Id f = h5::open_read(path);
  h5::Id g = h5::open_group(f.get(), "model", path);
  std::vector<float>& params = model.params();
  std::fill(params.begin(), params.end(), 0.0f);
  for (const ParamInfo& p : model.table().params())
    h5::read_f32(g.get(), p.name, params.data() + p.offset, hshape(p.hf_shape), path);
  bool loaded_opt = false;
  if (opt != nullptr && h5::has_object(f.get(), "optimizer")) {
    h5::Id go = h5::open_group(f.get(), "optimizer", path);
    h5::Id gm = h5::open_group(go.get(), "m", path);
    h5::Id gv = h5::open_group(go.get(), "v", path);
    std::fill(opt->m().begin(), opt->m().end(), 0.0f);
    std::fill(opt->v().begin(), opt->v().end(), 0.0f);
    for (const ParamInfo& p : model.table().params()) {
      h5::read_f32(gm.get(), p.name, opt->m().data() + p.offset, hshape(p.hf_shape), path);
      h5::read_f32(gv.get(), p.name, opt->v().data() + p.offset, hshape(p.hf_shape), path);
    }
    opt->set_step_count(h5::read_attr_i64(go.get(), "step", path));
    loaded_opt = true;
  }
  if (state != nullptr) {
    state->step = h5::read_attr_i64(f.get(), "step", path);
    state->tokens_seen = h5::read_attr_i64(f.get(), "tokens_seen", path);
    state->seed = static_cast<uint64_t>(h5::read_attr_i64(f.get(), "seed", path));
    state->world_size = static_cast<int>(h5::read_attr_i64(f.get(), "world_size", path));
    state->global_batch_tokens = h5::has_attr(f.get(), "global_batch_tokens")
                                     ? h5::read_attr_i64(f.get(), "global_batch_tokens", path) : 0;
    state->seq_len = h5::has_attr(f.get(), "seq_len") ? static_cast<int>(h5::read_attr_i64(f.get(), "seq_len", path)) : 0;
  }
  return loaded_opt;
}

std::string checkpoint_path(const std::string& out_dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step_%08lld.h5", static_cast<long long>(step));
  return out_dir + "/ckpt/" + name;
}

void write_latest(const std::string& out_dir, const std::string& path) {
  const std::string latest = out_dir + "/ckpt/latest";
  const std::string tmp = latest + ".tmp";
  {
    std::ofstream os(tmp, std::ios::trunc);
    GPT2_REQUIRE(os.good(), "cannot write " << tmp);
    os << path.substr(path.rfind('/') + 1) << "\n";
  }
  atomic_rename(tmp, latest);
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
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("step_", 0) == 0 && n.size() > 3 && n.compare(n.size() - 3, 3, ".h5") == 0) names.push_back(n);
    }
    closedir(d);
  }
  const std::string current_name = current.substr(current.rfind('/') + 1);
  std::sort(names.begin(), names.end());  // zero-padded step numbers sort in step order
  names.erase(std::upper_bound(names.begin(), names.end(), current_name), names.end());  // up to current
  for (size_t i = 0; i + keep < names.size(); ++i)
    if (names[i] != current_name) std::remove((dir + "/" + names[i]).c_str());
}

std::string resolve_checkpoint(const std::string& path) {
  if (!std::filesystem::is_directory(path)) return path;
  const std::string latest = read_latest(path);
  GPT2_REQUIRE(!latest.empty(), path << " is a directory without ckpt/latest: give a checkpoint file");
  return latest;
}

}  // namespace gpt2
