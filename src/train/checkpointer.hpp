// When and how a run writes its checkpoints: every --ckpt-every steps, at the end, and after a stop
// signal when the checkpoint fits in the time the launcher leaves before its SIGKILL. Every rank calls
// every method at the same point (under ZeRO-1 the optimizer moments are gathered from all ranks);
// rank 0 writes the file, `latest` and prunes old ones.
#pragma once

#include <cstdint>

#include "comm/communicator.hpp"
#include "model/gpt2.hpp"
#include "train/checkpoint.hpp"
#include "train/runner.hpp"
#include "train/trainer.hpp"

namespace gpt2 {

class Checkpointer {
 public:
  Checkpointer(const TrainConfig& cfg, Communicator& comm, ModelRunner& runner, const GPT2& model);

  // After each completed step (state.step: steps done): the periodic checkpoint, not on the last step.
  void after_step(const TrainState& state, bool last);
  // At the end of the run: a checkpoint of the final state, unless one was just written.
  void at_end(const TrainState& state);
  // After a stop signal, all ranks together: writes a checkpoint unless the launcher's SIGKILL comes
  // first (kill_in_s: the least time any rank has left), in which case rank 0 says what is lost and
  // where --resume auto will continue from. The previous checkpoint stays intact either way.
  void on_stop(const TrainState& state, double kill_in_s);

 private:
  void save(const TrainState& state);
  // Seconds a checkpoint takes: the last one's time (rank 0), else its size at a cautious bandwidth.
  double estimate_s() const;
  bool writes() const { return !cfg_.out_dir.empty() && !cfg_.benchmark; }

  const TrainConfig& cfg_;
  Communicator& comm_;
  ModelRunner& runner_;
  const GPT2& model_;
  int64_t last_step_ = -1;  // the step of the last checkpoint written by this run
  double last_save_s_ = 0;  // how long it took (rank 0)
};

}  // namespace gpt2
