// Matrix products on the GPU, two backends behind one launcher: hand-written kernels (an fp32 SIMT
// kernel; a bf16 tensor-core kernel on mma.sync with an ldmatrix/cp.async pipeline and split-K) and
// cuBLASLt. Same contract for both, and the same as the CPU reference (gemm.hpp) for every use GPT-2
// makes of it. Host-safe header (g++ compiles it).
//
// How GPT-2 calls it (rows = B*T, weights in Hugging Face Conv1D layout w (IC,OC)):
//   forward      out (rows,OC)  = inp (rows,IC) @ w (IC,OC) + bias      no trans, kBias / kBiasGelu
//   dinp         dinp (rows,IC) = dout (rows,OC) @ w^T                  trans_b (B = w seen as (N=IC, K=OC))
//   dw           dw (IC,OC)    += inp^T @ dout                          trans_a, accumulate, K = rows (split-K)
//   LM head      logits (rows,Vp) = lnf (rows,C) @ wte^T                trans_b
//   LM head bwd  dinp (rows,C) = dlogits @ wte;  dwte (Vp,C) += dlogits^T @ lnf
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/common/cuda_dtype.hpp"

namespace gpt2::kernels {

using ::gpt2::GemmBackend;  // --gemm, core/backend.hpp

enum class GemmEpilogue {
  kNone,      // C = [C +] op(A) op(B)
  kBias,      // C = op(A) op(B) + bias[col]
  kBiasGelu,  // pre = op(A) op(B) + bias[col]; aux = pre (stored as T); C = gelu(pre)   (MLP up-projection)
  kDGelu,     // C = (op(A) op(B)) * gelu'(aux)   (aux: the saved pre-activation, same shape as C)
};


// Which bf16 kernel the hand backend runs.
//   kAuto:    wgmma where the context enabled it (GemmContext::hand_wgmma_enabled) and TMA takes the
//             operands, else mma.sync.
//   kMmaSync: the sm_80 kernel (mma.sync), on any device.
//   kWgmma:   the sm_90a kernel wherever TMA takes the operands (16-byte aligned A and B, leading
//             dimensions multiples of 8), mma.sync otherwise; an error on a device or binary without it
//             (gemm_hand_wgmma_available()).
enum class GemmHandPath { kAuto, kMmaSync, kWgmma };

// The wgmma kernel's tiles and schedule (gemm_sm90.cu); GPT2_GEMM_SM90 names one (unset: 128x256).
//   k128x128 ("1" or "128x128"): both consumer warpgroups work on each 128x128 tile, 64 rows each;
//   k128x256 ("128x256", the default): the same on 128x256 tiles;
//   k128x128PingPong ("128x128-pingpong"): each consumer warpgroup takes every other 128x128 tile whole,
//     so one's epilogue runs while the other's products do;
//   kByShape ("by-shape"): one of the three for each product (gemm_wgmma_kernel_for).
//   kDefault: the context's choice (test hooks only).
enum class GemmWgmmaKernel { kDefault, k128x128, k128x256, k128x128PingPong, kByShape };
inline const char* gemm_wgmma_kernel_name(GemmWgmmaKernel k) {
  switch (k) {
    case GemmWgmmaKernel::k128x128: return "128x128";
    case GemmWgmmaKernel::k128x256: return "128x256";
    case GemmWgmmaKernel::k128x128PingPong: return "128x128-pingpong";
    case GemmWgmmaKernel::kByShape: return "by-shape";
    case GemmWgmmaKernel::kDefault: break;
  }
  return "default";
}
// The kernel that runs a product: `k` itself, or kByShape's choice. From the H200's table (2026-11-27,
// every GPT-2 124M product at 8192 and 65536 rows, docs/performance.md): weight gradients (trans_a, a
// long K of rows) ran fastest on 128x256 tiles (1.04-1.14x of 128x128), the GELU gradient's product on
// 128x128 (its pre-activations come by TMA there: ping-pong 0.93x, 128x256 0.69x), and the rest mostly
// ping-pong (1.01-1.17x at 8192 rows). Summed over the step's products at 8192 rows: 12.95 ms against
// 13.49 for ping-pong alone and 14.50 for 128x256 alone (cuBLASLt 9.60).
inline GemmWgmmaKernel gemm_wgmma_kernel_for(GemmWgmmaKernel k, bool trans_a, GemmEpilogue ep) {
  if (k != GemmWgmmaKernel::kByShape) return k;
  if (trans_a) return GemmWgmmaKernel::k128x256;
  if (ep == GemmEpilogue::kDGelu) return GemmWgmmaKernel::k128x128;
  return GemmWgmmaKernel::k128x128PingPong;
}

// Switches that force the paths ordinary shapes do not take, so each fallback has a test. All off by
// default; the model never touches them.
struct GemmTestHooks {
  bool hand_force_scalar_loads = false;          // hand bf16: the unaligned (no cp.async) tile loader
  int hand_force_splits = 0;                     // hand: this split-K factor (> 0) instead of the shape rule
  // hand wgmma, with hand_force_splits > 1: tiles [0, this) whole and only the rest split (a split tail:
  // GemmSplitPlan), so small test shapes take the path that the model gives only to over 132 tiles; the
  // other paths, and a value past the last tile, ignore it
  int hand_force_tail_from = 0;
  bool lt_force_unfused_epilogue = false;        // cuBLASLt: plain matmul + our elementwise epilogue
  GemmHandPath hand_path = GemmHandPath::kAuto;  // hand bf16: which kernel (see GemmHandPath)
  GemmWgmmaKernel wgmma_kernel = GemmWgmmaKernel::kDefault;  // the wgmma kernel's tiles and schedule
  int wgmma_max_blocks = 0;  // wgmma: at most this many persistent blocks (> 0), so each takes many units
  bool unfused_bias_grad = false;                // weight_bias_grad_cuda as GEMM + bias_backward_cuda
  // cuBLASLt, bf16: the bias-gradient epilogue stores its sums in bf16 (cuBLASLt's own type for them)
  // instead of fp32, which cuBLASLt 13 has no algorithm for, and the GELU gradient's product carries MLP up's
  // bias gradient (DGELU_BGRAD, gemm_dgelu_bias_grad_cuda; GPT2_CUBLASLT_BIAS_GRAD=bf16 sets it)
  bool lt_bias_grad_bf16 = false;
  // cuBLASLt, bf16 sums: skip BGRADA and ask only for BGRADB on row-ordered layouts, the fallback where BGRADA
  // has no algorithm (its tests, and the benchmarks' A/B of the two)
  bool lt_bias_grad_row_major = false;
  // wgmma 128x128 kDGelu: the epilogue reads the pre-activations from global memory, as the other wgmma
  // kernels do, instead of TMA loading them while the products run (the benchmarks' A/B of that tile)
  bool wgmma_aux_from_global = false;
  // wgmma kDGelu, where the pre-activations are read in the epilogue (128x256 tiles, or the hook above): no
  // TMA prefetch of them into L2 during the products (the benchmarks' GemmNoAuxPrefetch A/B;
  // GPT2_GEMM_AUX_PREFETCH=0 sets it, for the 124M step's)
  bool wgmma_no_aux_prefetch = false;
  // wgmma: the epilogue finishes its tiles in registers and copies bf16 rows out with cp.async.bulk, where the
  // output allows it (gemm_sm90.cuh gemm_bf16_wgmma); GPT2_GEMM_STORE=bulk sets it
  bool wgmma_bulk_store = false;
  int wgmma_aux_tma_launches = 0;  // out: wgmma launches that loaded the pre-activations by TMA (tests count them)
  int wgmma_aux_prefetch_launches = 0;  // out: wgmma launches that prefetched them into L2 (tests count them)
  int wgmma_bulk_store_launches = 0;    // out: products whose epilogue stored with bulk copies (tests count them)
  int wgmma_split_tails = 0;       // out: products run as a split tail (GemmSplitPlan; tests count them)
};

// The hand backend's wgmma kernel can run here: the binary holds its sm_90a code (CUDA architectures
// including 90) and the current device has compute capability 9.0.
bool gemm_hand_wgmma_available();

namespace detail {
struct CublasLtState;  // handle, workspace and the per-shape plan cache (gemm_cublaslt.cu)
struct CublasLtStateDeleter {
  void operator()(CublasLtState* s) const;
};
}  // namespace detail

// Owns what the backends need: the cuBLASLt handle and workspace (kCublasLt), the split-K partial-sum
// workspace (kHand). Allocates once, in the constructor; the launchers never allocate. The workspaces
// are reused by every call, so calls that share a context must be ordered (one stream, or events):
// use one context per concurrent stream.
class GemmContext {
 public:
  explicit GemmContext(GemmBackend backend);
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  GemmBackend backend() const { return backend_; }
  // The device memory a context of `backend` allocates (its workspace): for device memory estimates.
  static size_t workspace_bytes(GemmBackend backend);

  // Hand backend: fp32 split-K partials, splits x M x N floats at most splitk_workspace_bytes().
  float* splitk_workspace() const { return splitk_ws_; }
  size_t splitk_workspace_bytes() const { return splitk_ws_bytes_; }
  detail::CublasLtState* cublaslt() const { return lt_.get(); }

  // Hand backend: the wgmma kernel is the bf16 path where gemm_hand_wgmma_available() (compute capability
  // 9.0), unless GPT2_GEMM_SM90=0 (mma.sync, as on every other device).
  bool hand_wgmma_enabled() const { return hand_wgmma_kernel_ != GemmWgmmaKernel::kDefault; }
  // The wgmma kernel to run, never kDefault: GemmTestHooks::wgmma_kernel, else GPT2_GEMM_SM90's (unset:
  // 128x256), else 128x128 (a forced wgmma path with GPT2_GEMM_SM90=0).
  GemmWgmmaKernel hand_wgmma_kernel() const;

  GemmTestHooks& test_hooks() { return hooks_; }
  const GemmTestHooks& test_hooks() const { return hooks_; }

 private:
  GemmBackend backend_;
  float* splitk_ws_ = nullptr;
  size_t splitk_ws_bytes_ = 0;
  GemmWgmmaKernel hand_wgmma_kernel_ = GemmWgmmaKernel::kDefault;  // GPT2_GEMM_SM90's; kDefault: not enabled
  std::unique_ptr<detail::CublasLtState, detail::CublasLtStateDeleter> lt_;
  GemmTestHooks hooks_;
};

// C = epilogue([C +] op(A) op(B))
//   Row-major everywhere. [out] C (M,N), ldc = N.
//   [in] op(A) (M,K): A is (M,K) [lda = K], or (K,M) [lda = M] when trans_a.
//   [in] op(B) (K,N): B is (K,N) [ldb = N], or (N,K) [ldb = K] when trans_b.
//   [in] bias (N) for kBias / kBiasGelu (nullptr otherwise).
//   [out] aux (M,N) for kBiasGelu (the pre-activation, as T); [in] aux (M,N) for kDGelu; else nullptr.
//   accumulate: C += (only with kNone); otherwise C is overwritten (= ).
//   M, N >= 0 (nothing to do when either is 0), K >= 1. C must not alias A, B, bias or aux.
// Arithmetic in fp32 with fp32 accumulators; for T = float true fp32 FMA (no TF32), so it matches the
// CPU to ~1e-6. For T = bf16 each output is its fp32 value rounded once, except cuBLASLt's C += when it
// does not split K: it rounds the product to bf16, then the sum (measured on the H200, 2026-11-27;
// GemmRounding in test_gemm.cpp holds each backend to its own). Deterministic: the same inputs give the
// same bits (the hand split-K factor depends on the shape only; partial sums are reduced in a fixed order).
template <class T>
void gemm_cuda(GemmContext& ctx, T* c, const T* a, const T* b, const T* bias, T* aux, int M, int N, int K, bool trans_a,
               bool trans_b, bool accumulate, GemmEpilogue ep, cudaStream_t stream);

// How the hand backend splits a product's K: `splits` ranges (1 = no split) over every output tile, or,
// where tail_from > 0 (the wgmma kernel only), tiles [0, tail_from) of the tile order whole, finished by
// the GEMM, and the rest (the tail: what is left after the whole waves of SMs) in `splits` ranges, whose
// partials a second kernel adds up and finishes.
struct GemmSplitPlan {
  int splits = 1;
  int tail_from = 0;
};

// The plan the hand backend uses for this shape and storage type on the mma.sync (or SIMT) kernel, or on
// the context's wgmma kernel (path kWgmma, bf16 only; by-shape: the one trans_a and ep choose). For tests
// and benchmarks: it depends on (M, N, K, T, path, wgmma kernel) and the fixed workspace size only, not on
// the device (the model's SM count is fixed), so the bits do not either. gemm_hand_splits: its splits.
template <class T>
GemmSplitPlan gemm_hand_split_plan(const GemmContext& ctx, int M, int N, int K,
                                   GemmHandPath path = GemmHandPath::kMmaSync, bool trans_a = false,
                                   GemmEpilogue ep = GemmEpilogue::kNone);
template <class T>
int gemm_hand_splits(const GemmContext& ctx, int M, int N, int K, GemmHandPath path = GemmHandPath::kMmaSync,
                     bool trans_a = false, GemmEpilogue ep = GemmEpilogue::kNone);

// The bf16 kernel gemm_cuda would run for these operands with ctx's backend and hooks: kMmaSync or
// kWgmma (never kAuto); kMmaSync for the cuBLASLt backend too (it runs neither). For tests and logs.
GemmHandPath gemm_hand_path(const GemmContext& ctx, const bf16* a, const bf16* b, int M, int N, int K, bool trans_a,
                            bool trans_b);

// Bias gradient: dbias[j] += sum_i dout[i,j]
//   [in] dout (N,OC);  [in,out] dbias (OC) +=;  scratch: bias_backward_scratch_bytes(N, OC) bytes.
//   Deterministic: fp32 column sums of fixed row chunks go to scratch, then one pass adds the chunks
//   in a fixed order (column_sums_add_cuda). Sums in fp32; dbias is read and written as T.
size_t bias_backward_scratch_bytes(int N, int OC);
template <class T>
void bias_backward_cuda(T* dbias, void* scratch, const T* dout, int N, int OC, cudaStream_t stream);

// Weight and bias gradients of a linear layer out = inp @ w + bias, with one read of dout:
//   dw (IC,OC)  += inp^T @ dout           (gemm_cuda's dw: trans_a, accumulate, K = rows)
//   dbias (OC)  += sum_i dout[i,:]
//   [in] inp (rows,IC), dout (rows,OC);  [in,out] dw, dbias (+=);
//   scratch: weight_bias_grad_scratch_bytes(rows, OC) bytes, float-aligned.
// Hand backend on the SIMT kernel and on mma.sync's cp.async variant: the blocks of the first output row tile also sum the
// columns of the dout tiles they already stage in shared memory, in K order (fp32 with Kahan's
// compensation; with split-K per split, then in split order), so the separate bias kernel and its read of
// dout go away. dw has exactly gemm_cuda's bits; dbias is deterministic but sums in another order than
// bias_backward_cuda. cuBLASLt: its BGRADA epilogue writes the column sums to scratch, in fp32 or (bf16 data
// with the hook lt_bias_grad_bf16, GPT2_CUBLASLT_BIAS_GRAD=bf16) rounded to bf16, and a small kernel adds
// them into dbias; dw may differ from gemm_cuda's in the last bit (another algorithm). A bf16 sum is
// rounded twice where dbias already holds a gradient (accumulation over micro-steps): once to bf16 by
// cuBLASLt, once more when added.
// Otherwise (no cuBLASLt algorithm for the epilogue, the wgmma kernel, bf16 operands that mma.sync
// stages through registers, the test hook unfused_bias_grad): gemm_cuda, then bias_backward_cuda.
size_t weight_bias_grad_scratch_bytes(int rows, int OC);
// Returns whether the bias gradient rode along the product (false: GEMM, then the bias kernel).
template <class T>
bool weight_bias_grad_cuda(GemmContext& ctx, T* dw, T* dbias, void* scratch, const T* inp, const T* dout, int rows,
                           int IC, int OC, cudaStream_t stream);

// The GELU gradient's product with the previous layer's bias gradient (MLP down's dinp, MLP up's dbias):
//   c (M,N)     = (op(a) op(b)) * gelu'(pre)      (gemm_cuda with kDGelu)
//   dbias (N)  += sum_i c[i,:]                     where it returns true
//   scratch: weight_bias_grad_scratch_bytes(M, N) bytes, float-aligned.
// dbias rides along only on cuBLASLt in bf16 with the opt-in bias sums (GPT2_CUBLASLT_BIAS_GRAD=bf16, the
// hook lt_bias_grad_bf16), where cuBLASLt has its DGELU_BGRAD epilogue: the sums of the fp32 results,
// rounded to bf16 (the output's type) and then added into dbias. Otherwise only the product runs, dbias is
// untouched, and it returns false: the caller takes dbias from c (weight_bias_grad_cuda).
template <class T>
bool gemm_dgelu_bias_grad_cuda(GemmContext& ctx, T* c, T* dbias, void* scratch, const T* a, const T* b, T* pre, int M,
                               int N, int K, bool trans_a, bool trans_b, cudaStream_t stream);

namespace detail {
// The cuBLASLt backend (gemm_cublaslt.cu); gemm_cuda dispatches to it after checking the arguments.
CublasLtState* create_cublaslt_state();
size_t cublaslt_workspace_bytes();
template <class T>
void gemm_cublaslt(GemmContext& ctx, T* c, const T* a, const T* b, const T* bias, T* aux, int M, int N, int K,
                   bool trans_a, bool trans_b, bool accumulate, GemmEpilogue ep, cudaStream_t stream);
// dw (IC,OC) += inp^T dout with the column sums of dout written (not added) to dbias_sums (OC values of
// S: float, or T where T is bf16, cuBLASLt's own type for them), by the epilogue it returns: BGRADA (in the
// row-major trick), or, for bf16 sums where BGRADA has no algorithm (or the hook lt_bias_grad_row_major skips
// it), BGRADB on row-ordered layouts; kNone, having done nothing, when cuBLASLt has no algorithm for either.
enum class LtBiasGradEpilogue { kNone, kBgradA, kBgradBRowMajor };
template <class T, class S>
LtBiasGradEpilogue weight_bias_grad_cublaslt(GemmContext& ctx, T* dw, S* dbias_sums, const T* inp, const T* dout,
                                             int rows, int IC, int OC, cudaStream_t stream);
// c (M,N) = (op(a) op(b)) * gelu'(aux) with c's column sums written (not added) to dbias_sums (N values, T);
// false, having done nothing, when cuBLASLt has no algorithm for DGELU_BGRAD (or N is not a multiple of 8).
template <class T>
bool dgelu_bias_grad_cublaslt(GemmContext& ctx, T* c, T* dbias_sums, const T* a, const T* b, const T* aux, int M,
                              int N, int K, bool trans_a, bool trans_b, cudaStream_t stream);
}  // namespace detail

}  // namespace gpt2::kernels
