// Checkpoints (DESIGN.md section 5): one HDF5 file per step, Hugging Face GPT-2 names and shapes,
// written by rank 0 to a temporary name, fsynced and renamed, so a crash mid-write never damages
// the last good checkpoint. <out>/ckpt/latest names the newest complete one.
#pragma once

#include <cstdint>
#include <string>

#include "model/gpt2.hpp"
#include "optim/adamw.hpp"

namespace gpt2 {

struct TrainState {
  int64_t step = 0;         // optimizer steps completed (= the next step to run)
  int64_t tokens_seen = 0;  // global tokens consumed
  uint64_t seed = 0;        // the run's seed: with `step` it fixes the data order (sampler is stateless)
  int world_size = 1;       // informational: resume may use another world size
  int64_t global_batch_tokens = 0;  // with seq_len, fixes which windows a step reads:
  int seq_len = 0;                  // a resume must keep both to continue the same data order
};

// The optimizer's part of a checkpoint: AdamW's step count, hyperparameters and moments, the moments
// in the parameter table's flat layout whatever the sharding (a ZeRO-1 run gathers them first), so
// a checkpoint resumes on any world size and --zero level.
struct OptimizerState {
  AdamWConfig config;
  long step = 0;
  float* m = nullptr;  // table.total() floats each
  float* v = nullptr;
};

// Writes model (+ optimizer when given) + state to `path` atomically.
void save_checkpoint(const std::string& path, const GPT2& model, const OptimizerState* opt, const TrainState& state);

// Model dimensions stored in a checkpoint (to build the model before loading).
GPT2Config read_checkpoint_config(const std::string& path);

// Loads parameters into `model` (whose config must match the file), the optimizer state when `opt`
// is given and the file has one (returns whether it did), and the train state when `state` is given.
// The optimizer's moments land in opt->m and opt->v (table.total() floats each, gaps zeroed) and its
// step count in opt->step.
bool load_checkpoint(const std::string& path, GPT2& model, OptimizerState* opt, TrainState* state);

// What `gpt2-data inspect CKPT` reports: the file's model and counters, and every tensor read back one at
// a time (memory: the largest tensor), its CRC-32 verified where the file has them and its values checked
// finite. Any failure ends the job naming the file, tensor and reason, as a load would.
struct CheckpointReport {
  GPT2Config config;
  TrainState state;
  bool has_optimizer = false;
  long optimizer_step = 0;
  int tensors = 0;       // datasets read back
  int crc_verified = 0;  // of which with a crc32 that matched
  double bytes = 0;      // their fp32 bytes
};
CheckpointReport inspect_checkpoint(const std::string& path);

// "<dir>/ckpt/step_00001000.h5"
std::string checkpoint_path(const std::string& out_dir, int64_t step);
// Points <out>/ckpt/latest at `path`: atomic (tmp, fsync, rename, fsync of the directory); a write
// error ends the job naming the file and the reason.
void write_latest(const std::string& out_dir, const std::string& path);
// The checkpoint <out>/ckpt/latest names, or "" if it is missing or empty (not checked further).
std::string read_latest(const std::string& out_dir);
// Why `path` is not a checkpoint that load_checkpoint would accept (not HDF5, truncated, attributes
// or tensors missing or misshapen, a tensor that fails its CRC-32 or holds NaN/Inf), or "" when it is.
// Never ends the job: the probe runs in a child process, because libhdf5 1.10 itself crashes on some
// corrupt files (found by fuzz_checkpoint) and can spin on others; a crash, or no answer within a minute
// plus the file's size at 50 MB/s, is reported as the problem. It reads every tensor in our writer's form
// (contiguous fp32) once; one rewritten chunked or compressed by another tool is left to the load.
std::string checkpoint_problem(const std::string& path);
// The same probe in this process (what the child runs; the fuzzer calls it to see its memory errors).
std::string checkpoint_problem_in_process(const std::string& path);
// The checkpoint to resume <out> from: the one ckpt/latest names when it loads; otherwise (latest
// missing, empty or naming a file that does not load) the newest step_*.h5 that loads, with a
// warning. "" when the run has no checkpoints; an error when it has some but none loads, so a
// run is never silently restarted from step 0 over its own checkpoints.
std::string find_resume_checkpoint(const std::string& out_dir);
// `path` itself, or for a run's --out directory find_resume_checkpoint() (an error if none).
std::string resolve_checkpoint(const std::string& path);
// Removes *.tmp in <out>/ckpt and <out> (left by a run that died while writing), with a warning each.
void remove_stale_temporaries(const std::string& out_dir);
// Deletes all but the newest `keep` step_*.h5 files in <out>/ckpt up to and including `current` (the
// checkpoint just written, which `latest` names): it is never deleted, and neither is any file with a
// higher step (left by an earlier run that this one forked from; they are kept for the user to judge).
// keep <= 0: keep all.
void prune_checkpoints(const std::string& out_dir, int keep, const std::string& current);

}  // namespace gpt2
