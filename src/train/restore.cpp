#include "train/restore.hpp"

#include <vector>

#include "comm/fail_together.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "train/hf_interop.hpp"

namespace gpt2 {

bool load_model_and_optimizer(const std::string& path, GPT2& model, AdamW& opt, TrainState* state) {
  const size_t total = model.table().total();
  const bool whole = opt.owned().size() == 1 && opt.owned()[0].begin == 0 && opt.owned()[0].end == total;
  std::vector<float> m_flat, v_flat;  // a shard reads through full-size buffers, freed on return
  OptimizerState os;
  if (whole) {
    os.m = opt.m().data();
    os.v = opt.v().data();
  } else {
    m_flat.resize(total);
    v_flat.resize(total);
    os.m = m_flat.data();
    os.v = v_flat.data();
  }
  const bool with_opt = load_checkpoint(path, model, &os, state);
  if (with_opt) {
    if (!whole) opt.import_moments(m_flat.data(), v_flat.data());
    opt.set_step_count(os.step);
  }
  return with_opt;
}

std::string choose_checkpoint(TrainConfig& cfg, Communicator& comm) {
  const int rank = comm.rank();
  if (rank == 0 && !cfg.out_dir.empty() && !cfg.benchmark) remove_stale_temporaries(cfg.out_dir);
  // --resume and --init-from may name another path on each node (a node-local copy), but not 'auto' on some
  // ranks and a file on others, or a file on some and none on others: the ranks would take different
  // collectives below and wait in them until the timeout.
  const int resume_kind = cfg.resume == "auto" ? 1 : (cfg.resume != "none" && !cfg.resume.empty()) ? 2 : 0;
  const int kind = resume_kind + 3 * static_cast<int>(!cfg.init_from.empty());
  int kinds[2] = {kind, -kind};
  comm.allreduce(kinds, 2, ReduceOp::kMax, "--resume and --init-from check");
  fail_together(comm, "--resume and --init-from", [&] {
    GPT2_REQUIRE_OPTIONS(kinds[0] == -kinds[1],
                         "--resume and --init-from must be given alike on every rank: a path may differ from node "
                         "to node, but not 'auto' on some ranks and a file on others, or a file on some and none "
                         "on others");
  });
  std::string resume_path;
  if (cfg.resume == "auto") {
    fail_together(comm, "--resume auto", [&] {
      GPT2_REQUIRE_OPTIONS(!cfg.out_dir.empty(), "--resume auto needs --out (it looks for <out>/ckpt/latest)");
    });
    if (rank == 0) resume_path = find_resume_checkpoint(cfg.out_dir);
    resume_path = broadcast_string(comm, resume_path, 0, "resume checkpoint");
  } else if (cfg.resume != "none" && !cfg.resume.empty()) {
    fail_together(comm, "--resume", [&] { resume_path = resolve_checkpoint(cfg.resume); });
  }
  // --init-from takes a checkpoint, a run's --out directory (its latest checkpoint) or safetensors.
  if (resume_path.empty() && !cfg.init_from.empty())
    cfg.init_from = broadcast_string(comm, rank == 0 ? resolve_checkpoint(cfg.init_from) : "", 0, "--init-from checkpoint");
  if (cfg.model_from_checkpoint) {  // no model options: the architecture is the checkpoint's (as from_pretrained)
    const std::string& src = !resume_path.empty() ? resume_path : cfg.init_from;
    fail_together(comm, "model from checkpoint", [&] {
      GPT2_REQUIRE_OPTIONS(!src.empty(), "no model given and no checkpoint to take it from: use --model PRESET, or "
                                         "--n-layer, --n-head and --n-embd, or --init-from CHECKPOINT");
      GPT2Config fc = is_safetensors(src) ? read_hf_config(src, cfg.model) : read_checkpoint_config(src);
      // An explicit --vocab-size or --max-seq-len stays, so that a mismatch is reported, not ignored.
      if (cfg.model.vocab_size > 0) fc.vocab_size = cfg.model.vocab_size;
      if (cfg.model.max_seq_len > 0) fc.max_seq_len = cfg.model.max_seq_len;
      cfg.model = fc;
    });
    log_info("model %s from %s\n", cfg.model.describe().c_str(), src.c_str());
  }

  return resume_path;
}

TrainState restore_state(const TrainConfig& cfg, const std::string& resume_path, GPT2& model, AdamW& opt, int world) {
  const int T = cfg.seq_len;
  TrainState state;
  state.seed = cfg.seed;
  if (!resume_path.empty()) {
    // --resume continues a run exactly: Adam's moments are part of it (starting them again from zero changes
    // every step after); a checkpoint without them is a starting point, which --init-from is for.
    GPT2_REQUIRE(load_model_and_optimizer(resume_path, model, opt, &state),
                 "checkpoint " << resume_path << " has no optimizer state (its /optimizer group): --resume needs "
                               << "Adam's moments to continue the run; to start a new run from its weights use "
                                  "--init-from "
                               << resume_path);
    GPT2_REQUIRE_OPTIONS((state.global_batch_tokens == 0 || state.global_batch_tokens == cfg.global_batch_tokens) &&
                     (state.seq_len == 0 || state.seq_len == T),
                 "checkpoint " << resume_path << " was written with --global-batch-tokens " << state.global_batch_tokens
                               << " and --seq-len " << state.seq_len << "; resume with the same values (this run has "
                               << cfg.global_batch_tokens << " and " << T << ") to continue the same data order");
    if (state.seed != cfg.seed) log_warn("resuming with the checkpoint's seed %llu (not --seed %llu) to keep the data order\n",
                                         static_cast<unsigned long long>(state.seed), static_cast<unsigned long long>(cfg.seed));
    log_info("resumed from %s at step %lld (written by %d rank(s))\n", resume_path.c_str(),
             static_cast<long long>(state.step), state.world_size);
  } else if (!cfg.out_dir.empty() && !read_latest(cfg.out_dir).empty() && !cfg.eval_only) {
    log_warn("%s already holds checkpoints of another run (ckpt/latest); this fresh run will overwrite its "
             "metrics and, once it checkpoints, its latest (use --resume auto to continue it instead)\n",
             cfg.out_dir.c_str());
  }
  if (resume_path.empty() && !cfg.init_from.empty()) {
    if (is_safetensors(cfg.init_from)) {  // Hugging Face weights (e.g. the released gpt2), for fine-tuning
      const GPT2Config fc = read_hf_config(cfg.init_from, cfg.model);
      const GPT2Config& mc = cfg.model;
      GPT2_REQUIRE_OPTIONS(fc.n_layer == mc.n_layer && fc.n_head == mc.n_head && fc.n_embd == mc.n_embd &&
                       fc.vocab_size == mc.vocab_size && fc.max_seq_len == mc.max_seq_len,
                   "--init-from " << cfg.init_from << " holds a model " << fc.describe() << " but this run builds "
                                  << mc.describe() << ": set " << model_options_for(fc));
      load_hf_weights(cfg.init_from, model);
      log_info("initialised from %s (Hugging Face safetensors: model only, fresh optimizer)\n", cfg.init_from.c_str());
    } else {
      const bool with_opt = load_model_and_optimizer(cfg.init_from, model, opt, nullptr);
      log_info("initialised from %s (%s)\n", cfg.init_from.c_str(), with_opt ? "model and optimizer" : "model only");
    }
  }
  state.world_size = world;
  state.global_batch_tokens = cfg.global_batch_tokens;
  state.seq_len = T;
  return state;
}

}  // namespace gpt2
