// What the step loop needs from a backend, so one loop drives both: the CPU backend (model/gpt2 +
// optim/adamw + comm/bucket_scheduler) and the CUDA backend (model/gpt2_cuda + comm/device_reducer,
// which drives the same bucket scheduler on the device).
// The host GPT2 and AdamW objects are the CPU backend's working state and the CUDA backend's mirror
// for checkpoints and sampling: to_host() makes them current, from_host() sends them to the device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/bucket_plan.hpp"
#include "comm/communicator.hpp"
#include "core/backend.hpp"
#include "data/batch_loader.hpp"
#include "model/gpt2.hpp"
#include "model/step_profile.hpp"
#include "optim/adamw.hpp"
#include "train/checkpoint.hpp"

namespace gpt2 {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // "cpu, 2 thread(s)" or "cuda:0 NVIDIA H100 80GB HBM3 | bf16 | gemm cublaslt | comm nccl"
  virtual std::string describe() const = 0;
  // Per-rank peak in TFLOP/s for MFU when --peak-tflops is not given (0: unknown).
  virtual double default_peak_tflops() const = 0;

  virtual void zero_grad() = 0;
  // Forward of one micro-batch with dlogits prepared (see GPT2::forward_train); the loss is collected.
  virtual void forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss) = 0;
  // Sum of the mean losses since the last call (synchronises a device).
  virtual double take_loss_sum() = 0;
  // Backward of the last forward_train (gradients +=). communicate: this is the step's last
  // micro-step on a multi-rank run, so buckets are all-reduced as backward produces them.
  virtual void backward(bool communicate) = 0;
  // Waits for every bucket; returns the communication ms backward did not hide.
  virtual double finish_communication() = 0;
  // Mean loss of one micro-batch, no backward.
  virtual float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T) = 0;
  // Sum of squares of the averaged gradient over the whole model, the same on every rank (under ZeRO-1
  // each rank sums its shard and the partial sums are all-reduced: collective).
  virtual double grad_sum_squares() = 0;
  // Whether the last optimizer_step left every parameter finite, the same answer on every rank (under
  // ZeRO-1 each rank checks the shard it updated and the answers are all-reduced: collective).
  virtual bool update_is_finite() = 0;
  // This rank's own copy of all the parameters, not reduced: whether the ranks hold the same weights.
  virtual double local_param_sum_squares() = 0;
  // One AdamW step of the parameters this rank owns: all of them, or under ZeRO-1 its shard, which
  // it then all-gathers so every rank holds the whole updated model (the step count lives in the
  // host AdamW object).
  virtual void optimizer_step(float lr, float grad_scale) = 0;
  // At a checkpoint, on every rank (collective under ZeRO-1, which gathers the moments): makes the
  // host model current on the writer and returns there the optimizer state in the flat layout, valid
  // until the next optimizer_step.
  virtual OptimizerState checkpoint_state(bool writer) = 0;
  virtual void to_host() = 0;
  virtual void from_host() = 0;
  // --profile-step: each op of the step between the two calls timed on the device (GPT2Cuda::begin_profile).
  // A backend that cannot returns an empty profile (the options refuse it first).
  virtual void begin_profile() {}
  virtual StepProfile end_profile() { return {}; }
  // Memory for the batch loader's token buffers: the heap by default, page-locked on a GPU.
  virtual HostAllocator host_allocator() const { return {}; }
};

// CPU backend: works on `model` and `opt` directly; comm is the MPI communicator. zero1: `opt` owns
// plan.owned_by(comm.rank()) and the buckets are reduce-scattered (plan cut for comm.size() shards).
std::unique_ptr<ModelRunner> make_cpu_runner(GPT2& model, AdamW& opt, Communicator& comm, const BucketPlan& plan,
                                             int threads, bool zero1);

struct CudaRunnerOptions {
  Precision precision = Precision::kBf16;
  GemmBackend gemm = GemmBackend::kCublasLt;
  Comm comm = Comm::kNccl;
  double comm_timeout_s = 600;
  int local_rank = 0, local_size = 1, world_size = 1;
  int micro_batch = 1, seq_len = 1;  // for the device memory check before anything is allocated
  bool zero1 = false;                // ZeRO-1: plan is cut for world_size shards; opt owns this rank's runs
  Recompute recompute = Recompute::kNone;  // activations dropped in forward and recomputed in backward
  bool cuda_graph = false;                 // micro-steps replayed as a CUDA Graph where they allow it
};

// CUDA backend (only in builds with CUDA; elsewhere it ends the job with an error saying so). host_comm
// carries the host-staged buckets of --comm mpi and the small host reductions; --comm nccl makes its
// own NCCL communicator.
std::unique_ptr<ModelRunner> make_cuda_runner(GPT2& model, AdamW& opt, Communicator& host_comm, const BucketPlan& plan,
                                              const CudaRunnerOptions& options);

}  // namespace gpt2
