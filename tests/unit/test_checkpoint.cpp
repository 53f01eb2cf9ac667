// Checkpoint guards that the command line cannot reach on purpose: the step loop stops a diverging
// run before it checkpoints, so save_checkpoint's own refusal of NaN/Inf is forced here; and the
// probe that --resume auto uses to skip a checkpoint that does not load; and the tensors' CRC-32s, which
// need a byte flipped inside a tensor's stored data (tests/cli edits values with h5py instead).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "core/hdf5.hpp"
#include "model/gpt2.hpp"
#include "optim/adamw.hpp"
#include "train/checkpoint.hpp"

namespace gpt2 {
namespace {

GPT2Config tiny() {
  GPT2Config c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 256;
  c.max_seq_len = 16;
  return c;
}

std::string temp_dir() {
  char tmpl[] = "/tmp/gpt2_ckpt_test_XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

bool exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }

TEST(Checkpoint, RefusesNonFiniteValues) {
  const std::string dir = temp_dir();
  GPT2 model(tiny());
  model.init(1);
  std::vector<float> m(model.table().total()), v(model.table().total());
  OptimizerState opt{AdamWConfig{}, 0, m.data(), v.data()};
  const TrainState state;
  const ParamInfo& ln = model.table().params()[model.table().find("h.0.ln_1.weight")];
  model.params()[ln.offset + 3] = std::numeric_limits<float>::quiet_NaN();
  const std::string path = checkpoint_path(dir, 1);
  EXPECT_DEATH(save_checkpoint(path, model, &opt, state),
               "refusing to write checkpoint .*step_00000001.h5: parameter h.0.ln_1.weight holds nan at index 3");
  model.params()[ln.offset + 3] = 1.0f;
  v[ln.offset] = std::numeric_limits<float>::infinity();
  EXPECT_DEATH(save_checkpoint(path, model, &opt, state), "Adam second moment of h.0.ln_1.weight holds inf");
  EXPECT_FALSE(exists(path));
  EXPECT_FALSE(exists(path + ".tmp"));
  std::filesystem::remove_all(dir);
}

// Flips one bit of the byte `at` bytes into the stored data of dataset `name`.
void flip_stored_bit(const std::string& path, const std::string& name, hsize_t at) {
  haddr_t addr = HADDR_UNDEF;
  {
    h5::Id f = h5::open_read(path);
    h5::Id ds(H5Dopen2(f.get(), name.c_str(), H5P_DEFAULT));
    ASSERT_TRUE(ds.valid());
    addr = H5Dget_offset(ds.get());  // contiguous: one extent
    ASSERT_NE(addr, HADDR_UNDEF);
    ASSERT_LT(at, H5Dget_storage_size(ds.get()));
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(addr + at));
  char b = 0;
  io.read(&b, 1);
  b = static_cast<char>(b ^ 0x10);
  io.seekp(static_cast<std::streamoff>(addr + at));
  io.write(&b, 1);
}

TEST(Checkpoint, Crc32IsZlibsOverAnySize) {
  // The pieces on OpenMP threads, joined, give what one zlib call over the whole buffer gives (what
  // Python's zlib.crc32 computes), at sizes around the 4 MiB piece.
  std::vector<unsigned char> buf((size_t{9} << 20) + 13);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  for (size_t n : {size_t{0}, size_t{1}, size_t{4} << 20, (size_t{4} << 20) + 1, (size_t{8} << 20) - 1, buf.size()})
    EXPECT_EQ(h5::crc32_of(buf.data(), n), static_cast<uint32_t>(crc32(0L, buf.data(), static_cast<uInt>(n)))) << n;
  EXPECT_EQ(h5::crc32_of("123456789", 9), 0xCBF43926u);  // the CRC-32 check value
}

TEST(Checkpoint, EveryTensorHasItsCrc32AndAChangedByteFailsItsLoad) {
  // The CRC-32s run on OpenMP threads: a death test's plain fork() would inherit them half-way.
  testing::FLAGS_gtest_death_test_style = "threadsafe";
  const std::string dir = temp_dir();
  GPT2 model(tiny());
  model.init(3);
  std::vector<float> m(model.table().total()), v(model.table().total());
  for (size_t i = 0; i < m.size(); ++i) {  // wte's padding rows stay 0: the file leaves them out
    m[i] = model.params()[i] == 0.0f ? 0.0f : 0.5f * static_cast<float>(i % 7);
    v[i] = model.params()[i] == 0.0f ? 0.0f : 0.25f + static_cast<float>(i % 5);
  }
  OptimizerState opt{AdamWConfig{}, 0, m.data(), v.data()};
  const TrainState state;
  const std::string path = checkpoint_path(dir, 1);
  save_checkpoint(path, model, &opt, state);
  {
    h5::Id f = h5::open_read(path);
    EXPECT_EQ(h5::read_attr_str(f.get(), "tensor_checksum", path), "crc32");
    const std::pair<const char*, const float*> groups[] = {
        {"model", model.params().data()}, {"optimizer/m", m.data()}, {"optimizer/v", v.data()}};
    for (const auto& [group, base] : groups)
      for (const ParamInfo& p : model.table().params()) {
        const std::string name = std::string(group) + "/" + p.name;
        h5::Id ds(H5Dopen2(f.get(), name.c_str(), H5P_DEFAULT));
        size_t n = 1;
        for (size_t d : p.hf_shape) n *= d;
        EXPECT_EQ(h5::read_attr_i64(ds.get(), "crc32", path),
                  static_cast<int64_t>(crc32(0L, reinterpret_cast<const Bytef*>(base + p.offset),
                                             static_cast<uInt>(n * sizeof(float)))))
            << name;
      }
  }
  // Loads as written, bit for bit.
  GPT2 back(tiny());
  std::vector<float> m2(m.size()), v2(v.size());
  OptimizerState opt2{AdamWConfig{}, 0, m2.data(), v2.data()};
  ASSERT_TRUE(load_checkpoint(path, back, &opt2, nullptr));
  EXPECT_EQ(back.params(), model.params());
  EXPECT_EQ(m2, m);
  EXPECT_EQ(v2, v);

  // One bit flipped in a weight's stored bytes fails the load, naming the tensor.
  const std::string bad = dir + "/flipped.h5";
  std::filesystem::copy_file(path, bad);
  flip_stored_bit(bad, "model/h.0.mlp.c_fc.weight", 4 * 37 + 1);
  EXPECT_DEATH(load_checkpoint(bad, back, &opt2, nullptr),
               "flipped.h5: dataset /model/h.0.mlp.c_fc.weight fails its CRC-32 check");
  // The same in the optimizer's state.
  const std::string bad_v = dir + "/flipped_v.h5";
  std::filesystem::copy_file(path, bad_v);
  flip_stored_bit(bad_v, "optimizer/v/wte.weight", 0);
  EXPECT_DEATH(load_checkpoint(bad_v, back, &opt2, nullptr), "dataset /optimizer/v/wte.weight fails its CRC-32 check");
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, ProbeOfLargeTensorsInAChildOfAnOpenMPProcess) {
  // The probe runs in a child forked from a process whose OpenMP threads have run (training, the CRC-32s
  // of a save): a parallel region there would wait forever on threads that fork() did not copy, and the
  // probe would time out on a good checkpoint. wte here is 6.4 MB, more than one 4 MiB piece.
  GPT2Config c = tiny();
  c.vocab_size = 50257;
  GPT2 model(c);
  model.init(4);
  std::vector<float> m(model.table().total()), v(model.table().total());
  OptimizerState opt{AdamWConfig{}, 0, m.data(), v.data()};
  const std::string dir = temp_dir();
  save_checkpoint(checkpoint_path(dir, 1), model, &opt, TrainState{});  // ran the CRC-32 on the threads
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(checkpoint_problem(checkpoint_path(dir, 1)), "");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, ProbeAndResumeChoice) {
  const std::string dir = temp_dir();
  GPT2 model(tiny());
  model.init(2);
  std::vector<float> m(model.table().total()), v(model.table().total());
  OptimizerState opt{AdamWConfig{}, 0, m.data(), v.data()};
  TrainState state;
  for (int s = 1; s <= 3; ++s) {
    state.step = s;
    save_checkpoint(checkpoint_path(dir, s), model, &opt, state);
  }
  EXPECT_EQ(checkpoint_problem(checkpoint_path(dir, 3)), "");
  EXPECT_EQ(find_resume_checkpoint(dir), checkpoint_path(dir, 3));  // no latest: newest that loads
  write_latest(dir, checkpoint_path(dir, 2));
  EXPECT_EQ(find_resume_checkpoint(dir), checkpoint_path(dir, 2));  // latest loads: it wins

  // One byte of step 2's stored data changed (and latest names it): the probe reads every tensor, so
  // --resume auto passes over it to step 3, the newest that loads, instead of failing the load at every
  // requeue. The same with a copy whose tensors have no crc32 (written before checksums) and a NaN.
  const std::string good2 = dir + "/good2.h5";
  std::filesystem::copy_file(checkpoint_path(dir, 2), good2);
  flip_stored_bit(checkpoint_path(dir, 2), "optimizer/m/h.0.attn.c_proj.bias", 2);
  EXPECT_NE(checkpoint_problem(checkpoint_path(dir, 2)).find("/optimizer/m/h.0.attn.c_proj.bias fails its CRC-32 check"),
            std::string::npos)
      << checkpoint_problem(checkpoint_path(dir, 2));
  EXPECT_EQ(find_resume_checkpoint(dir), checkpoint_path(dir, 3));
  std::filesystem::copy_file(good2, checkpoint_path(dir, 2), std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(checkpoint_problem(checkpoint_path(dir, 2)), "");
  {
    h5::Id f(H5Fopen(good2.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(f.valid());
    H5Adelete(f.get(), "tensor_checksum");
    h5::Id ds(H5Dopen2(f.get(), "model/ln_f.bias", H5P_DEFAULT));
    H5Adelete(ds.get(), "crc32");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const hsize_t at = 5, one = 1;
    h5::Id fspace(H5Dget_space(ds.get()));
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &at, nullptr, &one, nullptr);
    h5::Id mspace(H5Screate_simple(1, &one, nullptr));
    ASSERT_GE(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, &nan), 0);
  }
  EXPECT_EQ(checkpoint_problem(good2), "/model/ln_f.bias holds nan at index 5");
  const std::string md5 = dir + "/md5.h5";
  std::filesystem::copy_file(checkpoint_path(dir, 2), md5);
  {  // checksums of a kind this build does not verify: the load refuses them, so the probe must too
    h5::Id f(H5Fopen(md5.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(f.valid());
    h5::write_attr_str(f.get(), "tensor_checksum", "md5");
  }
  EXPECT_NE(checkpoint_problem(md5).find("tensor_checksum is not \"crc32\""), std::string::npos) << checkpoint_problem(md5);

  // Truncate step 3 (as a copy cut short would be) and empty latest: step 2 is the newest that loads.
  std::string raw;
  {
    std::ifstream in(checkpoint_path(dir, 3), std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(checkpoint_path(dir, 3), std::ios::binary | std::ios::trunc) << raw.substr(0, raw.size() / 2);
  std::ofstream(dir + "/ckpt/latest", std::ios::trunc).flush();
  EXPECT_NE(checkpoint_problem(checkpoint_path(dir, 3)), "");
  EXPECT_EQ(find_resume_checkpoint(dir), checkpoint_path(dir, 2));

  std::ofstream(dir + "/ckpt/empty.h5").flush();
  EXPECT_NE(checkpoint_problem(dir + "/ckpt/empty.h5").find("not an HDF5 file"), std::string::npos);
  EXPECT_NE(checkpoint_problem(dir + "/ckpt/none.h5").find("No such file"), std::string::npos);
  const std::string fresh = temp_dir();
  EXPECT_EQ(find_resume_checkpoint(fresh), "");  // a run without checkpoints starts afresh
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(fresh);
}

}  // namespace
}  // namespace gpt2
