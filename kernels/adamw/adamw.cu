// AdamW on the GPU over fp32 master weights and fp32 moments, refreshing the T working copy of the
// parameters. Memory-bound: 128-bit accesses to every array over the aligned body, scalar tail.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/adamw/adamw_cuda.hpp"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"

namespace gpt2::kernels {

namespace {

using cuda::from_f32;
using cuda::Packed128;
using cuda::to_f32;

struct AdamWLaunch {
  // 8 warps a block: 8 resident blocks fill an SM (2048 threads) on sm_80 and sm_90.
  static constexpr int kThreads = 256;
  // Grid-stride cap: 2^16 blocks x 256 threads cover 16M vector groups a sweep (more than a 1.5B-param
  // model's bf16 groups need in flight); larger tensors loop instead of growing the grid.
  static constexpr long kMaxBlocks = 1L << 16;
};

// Per-step constants, computed on the host exactly as adamw_update_cpu computes them (bias corrections
// in double, then rounded to float), so both backends round the same values.
struct AdamWCoeffs {
  float b1, b2, one_b1, one_b2, eps, grad_scale;
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float decay;      // 1 - lr * weight_decay
};

AdamWCoeffs make_coeffs(const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  AdamWCoeffs c;
  c.b1 = s.beta1;
  c.b2 = s.beta2;
  c.one_b1 = 1.0f - s.beta1;
  c.one_b2 = 1.0f - s.beta2;
  c.eps = s.eps;
  c.grad_scale = s.grad_scale;
  c.step_size = static_cast<float>(s.lr / bc1);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.decay = 1.0f - s.lr * s.weight_decay;
  return c;
}

// The same expression, in the same order, as adamw_update_cpu (IEEE sqrt and division), every product
// and sum rounded on its own (__fmul_rn, __fadd_rn: nvcc may not contract them into an fma). Left to
// itself nvcc contracts `a * b + c * d` into fma(a, b, c * d) in some inlined copies and not in others:
// on the H100 (2026-11-27) the multi-tensor launch and the per-tensor one differed in the last bit of
// about 1 weight in 3, while each matched the CPU only to a tolerance. Memory-bound: the fmas saved nothing.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float grad, const AdamWCoeffs& c) {
  const float g = __fmul_rn(grad, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.b1, m), __fmul_rn(c.one_b1, g));
  v = __fadd_rn(__fmul_rn(c.b2, v), __fmul_rn(__fmul_rn(c.one_b2, g), g));
  const float denom = __fadd_rn(sqrtf(v) / c.bc2_sqrt, c.eps);
  p = __fsub_rn(__fmul_rn(p, c.decay), __fmul_rn(c.step_size, m) / denom);
}

// NaN (every comparison is false) or an infinity.
__device__ __forceinline__ bool not_finite(float x) { return !(fabsf(x) <= FLT_MAX); }

// K consecutive floats through K/4 128-bit accesses.
template <int K>
__device__ __forceinline__ void load_floats(const float* p, float (&f)[K]) {
#pragma unroll
  for (int q = 0; q < K / 4; ++q) {
    const Packed128<float> x = cuda::load128(p + 4 * q);
#pragma unroll
    for (int r = 0; r < 4; ++r) f[4 * q + r] = x[r];
  }
}
template <int K>
__device__ __forceinline__ void store_floats(float* p, const float (&f)[K]) {
#pragma unroll
  for (int q = 0; q < K / 4; ++q) {
    Packed128<float> x;
#pragma unroll
    for (int r = 0; r < 4; ++r) x[r] = f[4 * q + r];
    cuda::store128(p + 4 * q, x);
  }
}

// Elements [0, n) of one run, shared by this launch's threads (thread `tid` of `stride`): groups
// [0, vec_count) of K = 16/sizeof(T) elements through 128-bit accesses, elements [vec_count*K, n) one
// by one. params == nullptr: the parameters are the master weights themselves. Both kernels below.
// Returns whether any master weight this thread updated came out non-finite.
template <class T>
__device__ __forceinline__ bool adamw_run(float* __restrict__ master, T* __restrict__ params,
                                          const T* __restrict__ grads, float* __restrict__ m,
                                          float* __restrict__ v, long n, long vec_count, const AdamWCoeffs& c,
                                          long tid, long stride) {
  constexpr int K = Packed128<T>::kSize;
  bool nonfinite = false;
  for (long i = tid; i < vec_count; i += stride) {
    const long e = i * K;
    const Packed128<T> g = cuda::load128cs(grads + e);
    float p[K], mm[K], vv[K];
    load_floats<K>(master + e, p);
    load_floats<K>(m + e, mm);
    load_floats<K>(v + e, vv);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      adamw_element(p[k], mm[k], vv[k], to_f32(g[k]), c);
      nonfinite |= not_finite(p[k]);
    }
    store_floats<K>(master + e, p);
    store_floats<K>(m + e, mm);
    store_floats<K>(v + e, vv);
    if (params != nullptr) {
      Packed128<T> q;
#pragma unroll
      for (int k = 0; k < K; ++k) q[k] = from_f32<T>(p[k]);
      cuda::store128(params + e, q);
    }
  }
  for (long i = vec_count * K + tid; i < n; i += stride) {
    float p = master[i], mi = m[i], vi = v[i];
    adamw_element(p, mi, vi, to_f32(grads[i]), c);
    nonfinite |= not_finite(p);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (params != nullptr) params[i] = from_f32<T>(p);
  }
  return nonfinite;
}

// One run over the whole grid (adamw_update_cuda).
template <class T>
__global__ void __launch_bounds__(AdamWLaunch::kThreads)
    adamw_update_vec128(float* __restrict__ master, T* __restrict__ params, const T* __restrict__ grads,
                        float* __restrict__ m, float* __restrict__ v, long n, long vec_count, AdamWCoeffs c) {
  cuda::griddep_launch_dependents_then_wait();
  adamw_run<T>(master, params, grads, m, v, n, vec_count, c, static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x,
               static_cast<long>(gridDim.x) * blockDim.x);
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Multi-tensor: block b updates chunk b (a grid-stride loop over chunks when there are more than the
// grid). Weight decay is the only per-chunk coefficient: decay_on for chunks that take it, 1 (lr * 0
// subtracted from 1, as adamw_update_cuda computes it for weight_decay 0) for the others.
// vec_ok: the base pointers are 16-byte aligned, so a chunk is vectorised when its offsets are whole
// 128-bit groups of every array (flat % K for master, params, grads; moment % 4 for m and v).
template <class T>
__global__ void __launch_bounds__(AdamWLaunch::kThreads)
    adamw_update_multi(float* __restrict__ master, T* __restrict__ params, const T* __restrict__ grads,
                       float* __restrict__ m, float* __restrict__ v, const AdamWChunk* __restrict__ chunks,
                       int num_chunks, AdamWCoeffs c, float decay_on, bool vec_ok, int* __restrict__ nonfinite) {
  cuda::griddep_launch_dependents_then_wait();
  constexpr int K = Packed128<T>::kSize;
  bool bad = false;
  for (int b = blockIdx.x; b < num_chunks; b += gridDim.x) {
    const AdamWChunk ch = chunks[b];
    AdamWCoeffs cc = c;
    cc.decay = ch.decay ? decay_on : c.decay;
    float* mp = master + ch.flat;
    T* pp = params != nullptr ? params + ch.flat : nullptr;
    const T* gp = grads + ch.flat;
    float* mm = m + ch.moment;
    float* vv = v + ch.moment;
    const bool vec = vec_ok && ch.flat % K == 0 && ch.moment % 4 == 0;
    bad |= adamw_run<T>(mp, pp, gp, mm, vv, ch.n, vec ? ch.n / K : 0, cc, threadIdx.x, blockDim.x);
  }
  // Only a thread that saw a non-finite weight writes (an integer atomic: the flag, not a float sum).
  if (bad && nonfinite != nullptr) atomicOr(nonfinite, 1);
}

}  // namespace

std::vector<AdamWChunk> adamw_chunks(const std::vector<OwnedPiece>& pieces) {
  std::vector<AdamWChunk> out;
  for (const OwnedPiece& p : pieces) {
    for (size_t done = 0; done < p.size; done += kAdamWChunkElems) {
      const size_t n = std::min<size_t>(kAdamWChunkElems, p.size - done);
      out.push_back({static_cast<int64_t>(p.flat + done), static_cast<int64_t>(p.local + done), static_cast<int32_t>(n),
                     p.decay ? 1 : 0});
    }
  }
  return out;
}

template <class T>
void adamw_update_multi_cuda(float* master, T* params, const T* grads, float* m, float* v, const AdamWChunk* chunks,
                             int num_chunks, const AdamWStep& s, cudaStream_t stream, int* nonfinite) {
  GPT2_CHECK(num_chunks >= 0, "num_chunks=" << num_chunks);
  GPT2_CHECK(s.step >= 1, "step=" << s.step << " (1-based)");
  if (num_chunks == 0) return;
  GPT2_CHECK(master != nullptr && params != nullptr && grads != nullptr && m != nullptr && v != nullptr &&
                 chunks != nullptr,
             "a null pointer among master, params, grads, m, v, chunks");
  const bool params_are_master = static_cast<void*>(params) == static_cast<void*>(master);
  constexpr bool kFloatParams = std::is_same_v<T, float>;
  GPT2_CHECK(!params_are_master || kFloatParams, "bf16 params must not be the fp32 master weights");
  T* params_out = params_are_master ? nullptr : params;
  const bool vec_ok = aligned16(master) && aligned16(grads) && aligned16(m) && aligned16(v) &&
                      (params_out == nullptr || aligned16(params_out));
  AdamWStep no_decay = s;
  no_decay.weight_decay = 0.0f;
  const AdamWCoeffs c = make_coeffs(no_decay);
  const float decay_on = make_coeffs(s).decay;
  const long blocks = num_chunks < AdamWLaunch::kMaxBlocks ? num_chunks : AdamWLaunch::kMaxBlocks;
  cuda::launch_kernel(adamw_update_multi<T>, static_cast<unsigned>(blocks), AdamWLaunch::kThreads, 0, stream, master,
                      params_out, grads, m, v, chunks, num_chunks, c, decay_on, vec_ok, nonfinite);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void adamw_update_cuda(float* master, T* params, const T* grads, float* m, float* v, long n, const AdamWStep& s,
                       cudaStream_t stream) {
  GPT2_CHECK(n >= 0, "n=" << n);
  GPT2_CHECK(s.step >= 1, "step=" << s.step << " (1-based)");
  if (n == 0) return;
  GPT2_CHECK(master != nullptr && params != nullptr && grads != nullptr && m != nullptr && v != nullptr,
             "master=" << master << " params=" << static_cast<void*>(params) << " grads=" << grads << " m=" << m
                       << " v=" << v);
  const bool params_are_master = static_cast<void*>(params) == static_cast<void*>(master);
  constexpr bool kFloatParams = std::is_same_v<T, float>;
  GPT2_CHECK(!params_are_master || kFloatParams,
             "bf16 params=" << static_cast<void*>(params) << " must not be the fp32 master weights");
  T* params_out = params_are_master ? nullptr : params;  // in place: written once, through master
  constexpr int K = Packed128<T>::kSize;
  const bool vec = aligned16(master) && aligned16(grads) && aligned16(m) && aligned16(v) &&
                   (params_out == nullptr || aligned16(params_out));
  const long vec_count = vec ? n / K : 0;
  const long work = vec_count > n - vec_count * K ? vec_count : n - vec_count * K;
  long blocks = cuda::ceil_div(work, AdamWLaunch::kThreads);
  blocks = blocks < 1 ? 1 : (blocks > AdamWLaunch::kMaxBlocks ? AdamWLaunch::kMaxBlocks : blocks);
  cuda::launch_kernel(adamw_update_vec128<T>, static_cast<unsigned>(blocks), AdamWLaunch::kThreads, 0, stream, master,
                      params_out, grads, m, v, n, vec_count, make_coeffs(s));
  CUDA_CHECK_LAUNCH();
}

template void adamw_update_cuda<float>(float*, float*, const float*, float*, float*, long, const AdamWStep&,
                                       cudaStream_t);
template void adamw_update_cuda<bf16>(float*, bf16*, const bf16*, float*, float*, long, const AdamWStep&, cudaStream_t);
template void adamw_update_multi_cuda<float>(float*, float*, const float*, float*, float*, const AdamWChunk*, int,
                                             const AdamWStep&, cudaStream_t, int*);
template void adamw_update_multi_cuda<bf16>(float*, bf16*, const bf16*, float*, float*, const AdamWChunk*, int,
                                            const AdamWStep&, cudaStream_t, int*);

}  // namespace gpt2::kernels
