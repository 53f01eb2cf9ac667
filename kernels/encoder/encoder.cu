// CUDA token + position embedding, forward and deterministic backward. See encoder_cuda.hpp.
//
//   forward   a gather and an add: one thread per 16-byte pack of the output (scalar when C or the
//             pointers do not allow packs).
//   dwpe      one thread per (t, pack) sums the B rows in b order: each output has one owner.
//   dwte      several positions share a token, so the host plans the work (positions grouped by
//             token, encoder_backward_plan). A block owns one (token, 32-pack channel slice); its
//             warps split the token's positions round-robin, each summing in registers, and the
//             warp sums are added in warp order: no atomics, the same bits on every run. The
//             split lets frequent tokens (hundreds of positions) use 8 warps of memory parallelism.
#include <cstdint>

#include "core/error.hpp"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/launch.cuh"
#include "kernels/encoder/encoder_cuda.hpp"

namespace gpt2::kernels {
namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::kWarpSize;
using cuda::Packed128;
using cuda::to_f32;

// ---- launch configuration ------------------------------------------------------------------------

// Element-wise kernels (forward, dwpe): 256 threads, one pack (or element) each; plain 1-D grid.
constexpr int kElementwiseThreads = 256;

// dwte: a block = 32 lanes (32 consecutive packs of the channel dimension) x 8 warps that split the
// token's positions. 8 warps give a frequent token 8x the loads in flight of a single warp; more
// would mostly idle, since the typical token occurs only a few times in a batch.
struct WteLaunch {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * kWarpSize;
};

// ---- W consecutive elements: one 128-bit access when W is the pack size, else scalar ----------------

template <class T, int W>
__device__ __forceinline__ void load_f32(float (&f)[W], const T* p) {
  if constexpr (W == Packed128<T>::kSize) {
    const Packed128<T> v = cuda::load128(p);
#pragma unroll
    for (int e = 0; e < W; ++e) f[e] = to_f32(v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) f[e] = to_f32(p[e]);
  }
}

// Streaming variant for data read exactly once (dout).
template <class T, int W>
__device__ __forceinline__ void load_f32_cs(float (&f)[W], const T* p) {
  if constexpr (W == Packed128<T>::kSize) {
    const Packed128<T> v = cuda::load128cs(p);
#pragma unroll
    for (int e = 0; e < W; ++e) f[e] = to_f32(v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) f[e] = to_f32(p[e]);
  }
}

template <class T, int W>
__device__ __forceinline__ void store_from_f32(T* p, const float (&f)[W]) {
  if constexpr (W == Packed128<T>::kSize) {
    Packed128<T> v;
#pragma unroll
    for (int e = 0; e < W; ++e) v[e] = from_f32<T>(f[e]);
    cuda::store128(p, v);
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) p[e] = from_f32<T>(f[e]);
  }
}

// ---- kernels -----------------------------------------------------------------------------------

// out[row, p*W .. p*W+W) = wte[tok, ...] + wpe[t, ...], one thread per (row, p).
template <class T, int W>
__global__ void __launch_bounds__(kElementwiseThreads)
    encoder_fwd_gather_add(T* out, const int32_t* inp, const T* wte, const T* wpe, int N, int T_, int C) {
  cuda::griddep_launch_dependents_then_wait();
  const int P = C / W;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(N) * P) return;
  const int row = static_cast<int>(i / P), p = static_cast<int>(i % P);
  const int t = row % T_;
  const size_t tok = static_cast<size_t>(inp[row]);
  float e[W], q[W];
  load_f32<T, W>(e, wte + tok * C + static_cast<size_t>(p) * W);
  load_f32<T, W>(q, wpe + static_cast<size_t>(t) * C + static_cast<size_t>(p) * W);
#pragma unroll
  for (int k = 0; k < W; ++k) e[k] += q[k];
  store_from_f32<T, W>(out + static_cast<size_t>(row) * C + static_cast<size_t>(p) * W, e);
}

// dwpe[t, p*W ..] += sum_b dout[b, t, p*W ..], b in order; one thread per (t, p).
template <class T, int W>
__global__ void __launch_bounds__(kElementwiseThreads)
    encoder_bwd_wpe_position_owner(T* dwpe, const T* dout, int B, int T_, int C) {
  cuda::griddep_launch_dependents_then_wait();
  const int P = C / W;
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(T_) * P) return;
  const int t = static_cast<int>(i / P), p = static_cast<int>(i % P);
  const size_t col = static_cast<size_t>(p) * W;
  float acc[W] = {};
#pragma unroll 4
  for (int b = 0; b < B; ++b) {
    float d[W];
    load_f32_cs<T, W>(d, dout + (static_cast<size_t>(b) * T_ + t) * C + col);
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] += d[k];
  }
  T* dst = dwpe + static_cast<size_t>(t) * C + col;
  float cur[W];
  load_f32<T, W>(cur, dst);
#pragma unroll
  for (int k = 0; k < W; ++k) cur[k] += acc[k];
  store_from_f32<T, W>(dst, cur);
}

// dwte[row_token[u], ...] += sum of dout over u's positions. Block (u = blockIdx.x, channel slice
// blockIdx.y): lane -> pack p = 32*blockIdx.y + lane; warp w sums the token's positions
// j = start + w, start + w + kWarps, ... in order; the warp sums are then added in warp order.
template <class T, int W>
__global__ void __launch_bounds__(WteLaunch::kThreads)
    encoder_bwd_wte_token_owner(T* dwte, const T* dout, const int32_t* row_start, const int32_t* row_token,
                                const int32_t* positions, int C) {
  cuda::griddep_launch_dependents_then_wait();
  __shared__ float warp_sums[WteLaunch::kWarps][W][kWarpSize];  // lanes adjacent: no bank conflicts
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int P = C / W;
  const int p = blockIdx.y * kWarpSize + lane;
  const int u = blockIdx.x;
  const size_t col = static_cast<size_t>(p) * W;

  float acc[W] = {};
  if (p < P) {
    const int begin = row_start[u], end = row_start[u + 1];
#pragma unroll 4
    for (int j = begin + warp; j < end; j += WteLaunch::kWarps) {
      float d[W];
      load_f32_cs<T, W>(d, dout + static_cast<size_t>(positions[j]) * C + col);
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] += d[k];
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) warp_sums[warp][k][lane] = acc[k];
  __syncthreads();
  if (warp == 0 && p < P) {
    float total[W] = {};
#pragma unroll
    for (int w = 0; w < WteLaunch::kWarps; ++w) {
#pragma unroll
      for (int k = 0; k < W; ++k) total[k] += warp_sums[w][k][lane];
    }
    T* dst = dwte + static_cast<size_t>(row_token[u]) * C + col;
    float cur[W];
    load_f32<T, W>(cur, dst);
#pragma unroll
    for (int k = 0; k < W; ++k) cur[k] += total[k];
    store_from_f32<T, W>(dst, cur);
  }
}

template <class T>
bool aligned16(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Calls f(std::integral_constant<int, W>) with W = the 16-byte pack size when C and all the given
// pointers allow 128-bit accesses, else W = 1.
template <class T, class F, class... Ptrs>
void with_access_width(int C, F&& f, const Ptrs*... ptrs) {
  constexpr int V = Packed128<T>::kSize;
  if (C % V == 0 && (aligned16(ptrs) && ...)) {
    f(std::integral_constant<int, V>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

}  // namespace

// ---- launchers ---------------------------------------------------------------------------------

template <class T>
void encoder_forward_cuda(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int T_, int C,
                          cudaStream_t stream) {
  GPT2_CHECK(B >= 0 && T_ >= 0, "B = " << B << " T = " << T_);
  GPT2_CHECK(C >= 1, "C = " << C);
  GPT2_CHECK(static_cast<long long>(B) * T_ <= INT32_MAX, "B*T = " << static_cast<long long>(B) * T_);
  const int N = B * T_;
  if (N == 0) return;
  GPT2_CHECK(out && inp && wte && wpe, "(a null pointer) B = " << B << " T = " << T_ << " C = " << C);
  with_access_width<T>(
      C,
      [&](auto width) {
        constexpr int W = decltype(width)::value;
        const long threads = static_cast<long>(N) * (C / W);
        cuda::launch_kernel(encoder_fwd_gather_add<T, W>, static_cast<unsigned>(ceil_div(threads, kElementwiseThreads)),
                            kElementwiseThreads, 0, stream, out, inp, wte, wpe, N, T_, C);
      },
      out, wte, wpe);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void encoder_backward_cuda(T* dwte, T* dwpe, const T* dout, const int32_t* plan_device, int num_unique, int B, int T_,
                           int C, cudaStream_t stream) {
  GPT2_CHECK(B >= 0 && T_ >= 0, "B = " << B << " T = " << T_);
  GPT2_CHECK(C >= 1, "C = " << C);
  GPT2_CHECK(static_cast<long long>(B) * T_ <= INT32_MAX, "B*T = " << static_cast<long long>(B) * T_);
  const int N = B * T_;
  if (N == 0) return;
  GPT2_CHECK(num_unique >= 1 && num_unique <= N, "num_unique = " << num_unique << " for N = B*T = " << N);
  GPT2_CHECK(dwte && dwpe && dout && plan_device, "(a null pointer) B = " << B << " T = " << T_ << " C = " << C);
  GPT2_CHECK(ceil_div(C, kWarpSize) <= 65535, "C = " << C << " (channel slices exceed gridDim.y)");
  const int32_t* row_start = plan_device;
  const int32_t* row_token = row_start + num_unique + 1;
  const int32_t* positions = row_token + num_unique;

  with_access_width<T>(
      C,
      [&](auto width) {
        constexpr int W = decltype(width)::value;
        const long threads = static_cast<long>(T_) * (C / W);
        cuda::launch_kernel(encoder_bwd_wpe_position_owner<T, W>,
                            static_cast<unsigned>(ceil_div(threads, kElementwiseThreads)), kElementwiseThreads, 0,
                            stream, dwpe, dout, B, T_, C);
      },
      dwpe, dout);
  CUDA_CHECK_LAUNCH();

  with_access_width<T>(
      C,
      [&](auto width) {
        constexpr int W = decltype(width)::value;
        const dim3 grid(static_cast<unsigned>(num_unique), static_cast<unsigned>(ceil_div(C / W, kWarpSize)));
        cuda::launch_kernel(encoder_bwd_wte_token_owner<T, W>, grid, WteLaunch::kThreads, 0, stream, dwte, dout,
                            row_start, row_token, positions, C);
      },
      dwte, dout);
  CUDA_CHECK_LAUNCH();
}

template void encoder_forward_cuda<float>(float*, const int32_t*, const float*, const float*, int, int, int,
                                          cudaStream_t);
template void encoder_forward_cuda<bf16>(bf16*, const int32_t*, const bf16*, const bf16*, int, int, int, cudaStream_t);
template void encoder_backward_cuda<float>(float*, float*, const float*, const int32_t*, int, int, int, int,
                                           cudaStream_t);
template void encoder_backward_cuda<bf16>(bf16*, bf16*, const bf16*, const int32_t*, int, int, int, int, cudaStream_t);

}  // namespace gpt2::kernels
