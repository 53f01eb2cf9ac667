// Checkpoint guards that the command line cannot reach on purpose: the step loop stops a diverging
// run before it checkpoints, so save_checkpoint's own refusal of NaN/Inf is forced here; and the
// probe that --resume auto uses to skip a checkpoint that does not load.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

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
