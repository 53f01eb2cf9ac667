#include "train/checkpointer.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/timer.hpp"
#include "train/stop_signal.hpp"

namespace gpt2 {

Checkpointer::Checkpointer(const TrainConfig& cfg, Communicator& comm, ModelRunner& runner, const GPT2& model)
    : cfg_(cfg), comm_(comm), runner_(runner), model_(model) {}

void Checkpointer::save(const TrainState& state) {
  last_step_ = state.step;
  if (!writes()) return;
  Timer t;
  const OptimizerState os = runner_.checkpoint_state(comm_.rank() == 0);  // collective under ZeRO-1
  if (comm_.rank() != 0) return;
  const std::string path = checkpoint_path(cfg_.out_dir, state.step);
  save_checkpoint(path, model_, &os, state);
  write_latest(cfg_.out_dir, path);
  prune_checkpoints(cfg_.out_dir, cfg_.ckpt_keep, path);
  last_save_s_ = t.ms() / 1000.0;
  log_info("step %6lld | checkpoint %s\n", static_cast<long long>(state.step), path.c_str());
}

void Checkpointer::after_step(const TrainState& state, bool last) {
  if (cfg_.ckpt_every > 0 && state.step % cfg_.ckpt_every == 0 && !last) save(state);
}

void Checkpointer::at_end(const TrainState& state) {
  if (last_step_ != state.step) save(state);
}

// Parameters, Adam m and v in fp32, at a bandwidth a local disk or a busy parallel file system
// sustains, with a margin for fsync and the exit that follows.
double Checkpointer::estimate_s() const {
  constexpr double kAssumedBytesPerS = 500e6;
  constexpr double kMargin = 1.25, kExitS = 0.25;
  const double bytes = 3.0 * static_cast<double>(model_.table().total()) * sizeof(float);
  return kMargin * (last_save_s_ > 0 ? last_save_s_ : bytes / kAssumedBytesPerS) + kExitS;
}

void Checkpointer::on_stop(const TrainState& state, double kill_in_s) {
  GPT2_REQUIRE(!cfg_.out_dir.empty() || cfg_.benchmark, "preempted without --out: no checkpoint can be written");
  if (last_step_ == state.step) return;
  // Decide before writing: a checkpoint cut off by SIGKILL leaves only a .tmp file and costs the time
  // the ranks could have used to exit cleanly. Rank 0 timed the last checkpoint, so it decides for all.
  const double need_s = estimate_s();
  int skip = comm_.rank() == 0 && writes() && kill_in_s < need_s ? 1 : 0;
  if (comm_.size() > 1) comm_.allreduce(&skip, 1, ReduceOp::kMax, "checkpoint within the grace period?");
  if (skip == 0) return save(state);
  if (comm_.rank() != 0) return;
  const std::string prev = read_latest(cfg_.out_dir);
  log_warn("step %6lld | not checkpointing: the launcher kills this job in %.1f s (%s: %.1f s after SIGTERM) "
           "and a checkpoint takes about %.1f s. %s; the steps since are lost. For a checkpoint send SIGUSR1 "
           "instead (mpirun forwards it and kills nothing) or give the job more time (docs/preemption.md)\n",
           static_cast<long long>(state.step), std::max(0.0, kill_in_s), kill_grace_source(), kill_grace_s(), need_s,
           prev.empty() ? "There is no earlier checkpoint: a restart begins at step 0"
                        : ("--resume auto continues from " + prev).c_str());
}

}  // namespace gpt2
