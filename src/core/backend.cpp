#include "core/backend.hpp"

#include <initializer_list>

namespace gpt2 {

const char* name_of(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }
const char* name_of(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }
const char* name_of(Comm c) { return c == Comm::kNccl ? "nccl" : "mpi"; }
const char* name_of(GemmBackend g) { return g == GemmBackend::kHand ? "hand" : "cublaslt"; }

namespace {
template <class E>
bool parse_among(const std::string& s, std::initializer_list<E> all, E* out) {
  for (E e : all)
    if (s == name_of(e)) {
      *out = e;
      return true;
    }
  return false;
}
}  // namespace

bool parse_choice(const std::string& s, Device* out) { return parse_among(s, {Device::kCpu, Device::kCuda}, out); }
bool parse_choice(const std::string& s, Precision* out) {
  return parse_among(s, {Precision::kFp32, Precision::kBf16}, out);
}
bool parse_choice(const std::string& s, Comm* out) { return parse_among(s, {Comm::kMpi, Comm::kNccl}, out); }
bool parse_choice(const std::string& s, GemmBackend* out) {
  return parse_among(s, {GemmBackend::kHand, GemmBackend::kCublasLt}, out);
}

}  // namespace gpt2
