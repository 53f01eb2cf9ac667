// What a training run will hold in memory, estimated from the configuration before anything is
// allocated, so that a size that cannot fit is refused with the numbers instead of ending in
// std::bad_alloc (or the kernel's OOM killer) on every rank.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.hpp"

namespace gpt2 {

// Bytes per rank, in double: the inputs may be absurd (n_embd 2e9) and must not overflow.
struct MemoryEstimate {
  double params = 0;       // fp32 flat parameter buffer
  double grads = 0;        // fp32 gradients, same layout
  double optimizer = 0;    // AdamW first and second moments
  double activations = 0;  // one micro-batch's activations kept for backward under the --recompute
                           // mode (host; 0 on a GPU run, see estimate_device_memory)
  double batches = 0;      // this rank's token windows of one step, twice (current + prefetched), + inputs/targets
  double total() const { return params + grads + optimizer + activations + batches; }
  // "parameters 0.48 GiB + gradients ... = 2.10 GiB"
  std::string describe() const;
};

// seqs_per_rank: sequences this rank reads per optimizer step (micro-batch x accumulation).
// on_gpu: activations live on the device, so the host holds only the fp32 mirror of the model and
// optimizer (the CUDA runner checks the device itself: check_device_memory in train/runner_cuda.cpp).
// optimizer_shards: the ranks the AdamW moments are sharded over (ZeRO-1: the world size; else 1).
MemoryEstimate estimate_training_memory(const GPT2Config& model, int micro_batch, int seq_len, int64_t seqs_per_rank,
                                        bool on_gpu, Recompute recompute = Recompute::kNone,
                                        int optimizer_shards = 1);

// GPU memory of one rank of a CUDA run: params = the device copy of the weights (2 bytes each in
// bf16, 4 in fp32) + the fp32 master weights (bf16 only), grads in the storage precision, optimizer =
// fp32 Adam moments, activations = the device activations in the storage precision with fp32
// layernorm statistics and losses, as kept under `recompute` (the fields of the CUDA model's
// DeviceActivations) and `workspace_bytes`, the model's scratch for its backward kernels (the caller's
// gpt2_cuda_workspace_bytes: it depends on the attention backward's path); batches 0. The GEMM workspace
// and the CUDA context are not counted.
MemoryEstimate estimate_device_memory(const GPT2Config& model, int micro_batch, int seq_len, bool bf16,
                                      Recompute recompute, double workspace_bytes);

// Physical memory a new allocation can use on this node without swapping (MemAvailable of
// /proc/meminfo; sysconf's free pages where that is missing), in bytes; <= 0 when unknown.
double available_host_memory();

// "1.23 GiB"
std::string format_bytes(double bytes);

}  // namespace gpt2
