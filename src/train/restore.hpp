// Where a run starts from: the checkpoint it resumes (--resume), or the weights it is initialised
// with (--init-from: our checkpoint or Hugging Face safetensors), or a fresh seeded model.
#pragma once

#include <string>

#include "comm/communicator.hpp"
#include "model/gpt2.hpp"
#include "optim/adamw.hpp"
#include "train/checkpoint.hpp"
#include "train/trainer.hpp"

namespace gpt2 {

// The checkpoint this run resumes from ("" = none). Rank 0 looks at the files (and removes the
// temporaries of a run that died mid-write); every rank gets its choice. Also resolves cfg.init_from
// to a file and, when no model options were given (cfg.model_from_checkpoint), sets cfg.model from
// the checkpoint or --init-from, as from_pretrained does.
std::string choose_checkpoint(TrainConfig& cfg, Communicator& comm);

// Loads resume_path (model, optimizer, step, data order) or else cfg.init_from into model and opt,
// whatever part of the buffer opt owns (all of it, or a ZeRO-1 shard of any world size); returns the
// state the run continues from, stamped with this run's geometry.
TrainState restore_state(const TrainConfig& cfg, const std::string& resume_path, GPT2& model, AdamW& opt, int world);

// Loads a checkpoint's model and, when it has one, its optimizer state into opt. Returns whether the
// file had an optimizer.
bool load_model_and_optimizer(const std::string& path, GPT2& model, AdamW& opt, TrainState* state);

}  // namespace gpt2
