// GPT-2 on the CUDA backend: the same forward and backward as model/gpt2.hpp (the CPU specification),
// as a sequence of CUDA kernel launches on one stream. Parameters, activations and gradients are
// stored in the precision chosen (--precision bf16|fp32); master weights and the AdamW moments are fp32.
// Nothing here synchronises the host unless its comment says so.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/common/cuda_dtype.hpp"
#include "kernels/gemm/gemm_cuda.hpp"
#include "model/config.hpp"
#include "model/gpt2.hpp"
#include "model/params.hpp"
#include "model/step_profile.hpp"
#include "kernels/adamw/adamw.hpp"

namespace gpt2 {

// Bytes of the one device workspace GPT2Cuda keeps for micro-batches of B x T: the most that any of its
// backward kernels' scratch needs (the layernorm backward, the weight and bias gradients, the attention
// backward on this process's path). check_device_memory (train/runner_cuda.cpp) counts the same bytes.
size_t gpt2_cuda_workspace_bytes(const GPT2Config& cfg, int B, int T);

struct CudaModelOptions {
  Precision precision = Precision::kBf16;
  kernels::GemmBackend gemm = kernels::GemmBackend::kCublasLt;
  // A training micro-step (forward_train then backward() without a callback) replays a CUDA Graph of its
  // device work: captured at the second micro-step of a (B, T, dloss, layout), the first runs eagerly so
  // that every lazy allocation and cuBLASLt's algorithm choice happen outside the capture. The inputs are
  // uploaded and the encoder backward (its plan's size changes with the batch) runs outside the graph.
  // A backward() with a callback (gradients communicated as they are ready) runs eagerly.
  bool cuda_graph = false;
};

class GPT2Cuda {
 public:
  // Allocates parameters, master weights, gradients and moments on the current device; activations
  // are allocated at the first forward of a (B, T) shape. Work is enqueued on `stream`.
  GPT2Cuda(const GPT2Config& cfg, const CudaModelOptions& opt, cudaStream_t stream);
  ~GPT2Cuda();
  GPT2Cuda(const GPT2Cuda&) = delete;
  GPT2Cuda& operator=(const GPT2Cuda&) = delete;

  const GPT2Config& config() const;
  const ParamTable& table() const;
  Precision precision() const;
  cudaStream_t stream() const;

  // Host <-> device copies of the flat fp32 buffers (ParamTable layout). Synchronous.
  // set_params also empties the generation cache (its keys and values belong to the old weights).
  void set_params(const float* host);  // master weights, and the stored parameters rounded from them
  void get_params(float* host) const;  // master weights
  // The moments of the runs the optimizer owns, concatenated (all of the buffer unless
  // set_optimizer_shard said otherwise): AdamW::m()'s layout for the same runs.
  void set_moments(const float* m, const float* v);
  void get_moments(float* m, float* v) const;
  std::vector<float> get_grads() const;  // the stored gradients, as fp32

  // ZeRO-1: from now on this rank keeps AdamW moments only for `owned` (ascending runs of the flat
  // buffer; BucketPlan::owned_by) and adamw_step updates only those parameters; the moments are
  // reallocated (to the runs' total) and zeroed. The caller all-gathers the updated parameters.
  void set_optimizer_shard(const std::vector<FlatRange>& owned);
  // The master weights (fp32) and the stored parameters (precision(); the same buffer in fp32) on the
  // device, table().total() elements each: what a sharded update all-gathers.
  float* master_device();
  void* params_device();

  // ZeRO-1 with the all-gather overlapped: parameters still arriving on another stream (the all-gather
  // of the last update). Each entry is a run of the flat buffer and an event recorded after its data
  // lands there. The next forward makes the stream wait for an event just before the first layer that
  // reads its run, so the gather of later layers overlaps the compute of earlier ones; everything else
  // that reads or writes the parameters waits for all of them first. The events must stay valid until
  // the entries are consumed or replaced (set_param_arrivals({}) drops them: once the caller has waited
  // for the gathers on the host and ordered stream() after them, nothing is left to wait for).
  struct ParamArrival {
    FlatRange range;
    cudaEvent_t ready;
  };
  void set_param_arrivals(std::vector<ParamArrival> arrivals);

  // The flat gradient buffer on the device (precision() elements, table().total() of them): the
  // reducer all-reduces slices of it.
  void* grads_device();

  void zero_grad();
  // What the next training forward keeps for backward (default kNone), as GPT2::set_recompute: the
  // dropped activations are recomputed in backward by the forward's own kernels. The gradients are the
  // same bits, except under selective with cuBLASLt in bf16 (its fused GELU epilogue rounds
  // differently from the GELU kernel that recomputes it: within bf16 rounding).
  void set_recompute(Recompute r);
  // Training forward: as GPT2::forward_train, but enqueued: the mean loss is collected on the host
  // and returned by take_loss_sum(). inputs/targets are host arrays (B,T), validated here.
  void forward_train(const int32_t* inputs, const int32_t* targets, int B, int T, float dloss);
  // Sum of the mean losses of the forward_train calls since the last call. Synchronises the stream.
  double take_loss_sum();
  // Mean loss without preparing backward. Synchronous.
  float forward_eval(const int32_t* inputs, const int32_t* targets, int B, int T);
  // Accumulates (+=) gradients of the last forward_train; calls on_ready on the host as each block's
  // backward has been ENQUEUED (the reducer records an event on stream() there), in the same order
  // as GPT2::backward: block_begin(L), block_begin(L-1), ..., block_begin(0), then 0.
  void backward(const GradReadyFn& on_ready = {});

  // Sum of squares of the gradient buffer (deterministic). Synchronises the stream.
  double grad_sum_squares();
  // Sum of squares of the master weights (deterministic), to check that ranks agree. Synchronous.
  double param_sum_squares();
  // The gradients' over the run [begin, end) of the flat buffer (a ZeRO-1 shard's piece). Synchronous.
  double grad_sum_squares(size_t begin, size_t end);
  // One AdamW update of every owned tensor (part). s.weight_decay applies to the tensors with
  // ParamInfo::decay, the others get 0; s.step is the 1-based step count. Enqueued.
  void adamw_step(const kernels::AdamWStep& s);
  // Whether every master weight the last adamw_step updated is finite (its kernel flags one that is not: a
  // finite gradient can still overflow in the update, under a huge lr). Synchronises the stream.
  bool last_update_finite();

  // ---- generation with a key/value cache (GPT2::decode_step on the device) ----------------------
  // The model owns one cache: keys and values (L, NH, max_seq_len, hs) in precision(), plus one token's
  // activations, all separate from the training activations and allocated at the first decode_step
  // (2 * L * max_seq_len * C elements; 38 MB for GPT-2 124M in bf16). Training does not touch them.
  //
  // Runs the model on `token` at position cache_len() (which must be < max_seq_len), appends its keys
  // and values to the cache and returns the next-token logits (Vp, fp32; columns >= vocab_size are
  // padding) in host memory, valid until the next call. The same kernels as the training forward at one
  // row, so with --precision fp32 the logits equal GPT2::decode_step's to rounding. Synchronous: one
  // stream synchronisation per token.
  const float* decode_step(int32_t token);
  // Empties the cache (the next token goes to position 0); keeps its memory.
  void reset_cache();
  // Tokens in the cache.
  int cache_len() const;

  // ---- where a step's device time goes (gpt2-train --profile-step) ------------------------------
  // From begin_profile to end_profile, every op the model enqueues (each GEMM, attention, layernorm,
  // AdamW, the norms, the copies of the inputs and losses, ZeRO-1's waits for the parameters, the
  // gradient buckets' hand-off to the reducer) is timed by CUDA events on stream(), and the time the
  // stream spends waiting for the host between them is counted apart. A micro-step whose device work
  // would be replayed as a CUDA Graph runs eagerly instead, so that each op can be timed. end_profile
  // synchronises the stream and returns the ops summed by name (StepProfile). Outside a profile the
  // model records nothing.
  void begin_profile();
  StepProfile end_profile();
  // What the caller puts on stream() itself, for the profile: the device time from profile_mark to the
  // next op or pause is `name` (the reducer's wait for the last gradient buckets, say); profile_pause
  // ends it. Nothing outside a profile. `name` and `kind` must outlive end_profile (string literals).
  void profile_mark(const char* name, const char* kind);
  void profile_pause();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpt2
