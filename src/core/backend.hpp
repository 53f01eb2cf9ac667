// The backend choices of a run as types, parsed once from the command line (app/) and resolved once
// ("auto" -> a value: train/backend.hpp). Free of CUDA, so every component can name them; the CUDA
// kernels use the same enums (kernels/common/cuda_dtype.hpp, kernels/gemm/gemm_cuda.hpp).
#pragma once

#include <optional>
#include <string>

namespace gpt2 {

enum class Device { kCpu, kCuda };
// What parameters, activations and gradients are stored in on the GPU. Master weights, Adam moments,
// layernorm and softmax statistics are fp32 in both. The CPU backend is fp32.
enum class Precision { kFp32, kBf16 };
// Who carries the gradient buckets: MPI (host memory; host-staged on a GPU) or NCCL (device memory).
enum class Comm { kMpi, kNccl };
// The CUDA GEMM: hand-written tensor-core kernels, or cuBLASLt.
enum class GemmBackend { kHand, kCublasLt };

const char* name_of(Device d);       // "cpu" | "cuda"
const char* name_of(Precision p);    // "fp32" | "bf16"
const char* name_of(Comm c);         // "mpi" | "nccl"
const char* name_of(GemmBackend g);  // "hand" | "cublaslt"

// Parsers of the option values: true and *out set on a known name. The optional forms also take
// "auto", which leaves *out empty (resolved later).
bool parse_choice(const std::string& s, Device* out);
bool parse_choice(const std::string& s, Precision* out);
bool parse_choice(const std::string& s, Comm* out);
bool parse_choice(const std::string& s, GemmBackend* out);
template <class E>
bool parse_choice(const std::string& s, std::optional<E>* out) {
  if (s == "auto") {
    out->reset();
    return true;
  }
  E e{};
  if (!parse_choice(s, &e)) return false;
  *out = e;
  return true;
}
template <class E>
std::string name_of(const std::optional<E>& e) {
  return e ? name_of(*e) : "auto";
}

}  // namespace gpt2
