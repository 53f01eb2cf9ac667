// The step loop: data -> forward/backward (micro-steps) -> bucketed all-reduce -> clip -> AdamW ->
// logs, metrics, validation, checkpoints. Every rank runs it; only rank 0 prints and writes files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/backend.hpp"
#include "model/config.hpp"
#include "optim/adamw.hpp"
#include "optim/schedule.hpp"
#include "train/sample.hpp"

namespace gpt2 {

class MpiEnv;

// --verify-data: none; shared: one copy of the data that every node sees, each token read once by one rank
// of the job; local: a copy on each node (node-local disks), each copy read in full by the ranks reading it.
enum class DataVerify { kNone, kShared, kLocal };

struct TrainConfig {
  GPT2Config model;
  int micro_batch = 4;                // B: sequences per rank per micro-step
  int seq_len = 64;                   // T
  int64_t global_batch_tokens = 0;    // tokens per optimizer step over all ranks; 0: B * T * world
  LrSchedule schedule;
  AdamWConfig optim;
  int64_t max_steps = 100;
  uint64_t seed = 1337;
  std::string train_data;             // file or glob
  std::string val_data;               // file or glob, optional
  int val_every = 0;                  // steps between validations (0: only at start and end)
  int val_batches = 20;               // batches per validation (capped by the val set)
  std::string out_dir;                // metrics.jsonl and ckpt/ go here ("" = nothing written)
  std::string init_from;              // checkpoint or run directory to start from (model, and optimizer if present)
  bool model_from_checkpoint = false; // no model options given: n_layer, n_head, n_embd (and vocab_size,
                                      // max_seq_len when 0) come from the resumed or --init-from checkpoint
  bool eval_only = false;             // validation loss of the initial model, then exit
  DataVerify verify_data = DataVerify::kNone;  // read every token at the start, check the files' CRC-32s
  int log_every = 1;
  // Backends; empty = auto, resolved once by resolve_backends().
  std::optional<Device> device;       // auto: cuda when a GPU is visible (and the build has CUDA)
  std::optional<Precision> precision; // auto: bf16 on cuda, fp32 on cpu
  GemmBackend gemm = GemmBackend::kCublasLt;
  Recompute recompute = Recompute::kNone;  // activations dropped in forward, recomputed in backward
  bool cuda_graph = false;            // GPU: micro-steps replayed as a CUDA Graph
  int zero = 0;                       // 0: every rank holds the whole optimizer; 1: ZeRO-1, sharded over ranks
  std::optional<Comm> comm;           // auto: nccl on cuda with a GPU per rank, else mpi
  double comm_timeout_s = 600;        // a bucket all-reduce slower than this means a lost peer
  int ckpt_every = 0;                 // steps between checkpoints (0: only at the end)
  int ckpt_keep = 0;                  // newest checkpoints to keep (0: all)
  std::string resume = "none";        // none | auto | PATH
  double bucket_mb = 25.0;            // all-reduce bucket size
  int threads = 0;                    // OpenMP threads per rank (0: cores / ranks on this node)
  double peak_tflops = 0.0;           // per rank, for MFU (0: an estimate for the device)
  bool benchmark = false;             // synthetic tokens, no files, no checkpoints
  int64_t profile_step = 0;           // GPU: time each op of this step (1-based) and report where the time went; 0: off
  SampleOptions sample;               // text generated at the end (sample.max_new_tokens = 0: none)
  std::string sample_prompt = "\n";
};

// Exit status after a preemption signal (SIGUSR1, SIGTERM or SIGINT on any rank): every rank agreed on a
// step, a checkpoint was written there, and the job should be requeued and resumed with --resume auto.
// 75 is EX_TEMPFAIL ("temporary failure, try again later") from sysexits.h.
constexpr int kExitPreempted = 75;

// The backends a run uses, every "auto" resolved.
struct Backends {
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  Comm comm = Comm::kMpi;
  GemmBackend gemm = GemmBackend::kCublasLt;
  bool on_gpu() const { return device == Device::kCuda; }
};

// Resolves the "auto" choices of cfg on this machine, once, and refuses the combinations a backend
// does not implement, with the option to change (--precision bf16 on the CPU, --zero 1 on the GPU ...).
// Each rank resolves on its own node; the trainer then checks that all chose alike (nodes can differ: a
// missing driver, fewer GPUs than ranks) and ends the job, saying so, where they did not.
Backends resolve_backends(const TrainConfig& cfg, const MpiEnv& env);

// Runs training (or evaluation / benchmark) as configured. Returns the process exit status.
int run_training(const TrainConfig& cfg, MpiEnv& env);

}  // namespace gpt2
