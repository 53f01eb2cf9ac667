// The cuBLASLt GEMM backend: the same contract as the hand kernels (gemm_cuda.hpp), and the yardstick
// they are measured against.
//
// Row-major trick: a row-major (M,N) matrix is the column-major (N,M) matrix of its transpose, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T in cuBLASLt's column-major terms: its "A" is our
// B, its "B" is our A, m = N, n = M. The bias (one value per column of our C) becomes one value per row
// of C^T, which is exactly what CUBLASLT_EPILOGUE_BIAS broadcasts.
//
// Compute type CUBLAS_COMPUTE_32F (for fp32 data: no TF32). Epilogues BIAS, GELU_AUX_BIAS and DGELU are
// fused when cuBLASLt offers an algorithm for them (GELU ones for bf16 only, see gemm_cublaslt);
// otherwise (or when the aux leading dimension is not a multiple of 8, which cuBLASLt requires) the
// product runs plain and a small elementwise kernel finishes. A weight gradient can carry its bias
// gradient (BGRADA: cuBLASLt's A is our dout, and its k is the rows), written in fp32 (or, asked for, bf16)
// to a staging vector that the caller adds into dbias (weight_bias_grad_cublaslt; with bf16 sums, where
// BGRADA has none, BGRADB on row-ordered layouts); and the GELU gradient's product can carry the column sums
// of its result (DGELU_BGRAD: the previous layer's bias gradient, dgelu_bias_grad_cublaslt), likewise staged.
// The heuristic is asked once per (type, shape, transposes, epilogue, alignment) and the plan cached, so
// repeated calls run the same algorithm (cuBLASLt with our own workspace is deterministic).
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/common/cuda_util.cuh"
#include "kernels/common/device_buffer.hpp"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/gemm_cuda.hpp"

// CUBLAS_CHECK: the cuBLAS member of the one error family; names the status.
#define CUBLAS_CHECK(call)                                                                                     \
  do {                                                                                                         \
    const cublasStatus_t gpt2_st_ = (call);                                                                    \
    GPT2_CHECK_GEN(gpt2_st_ == CUBLAS_STATUS_SUCCESS,                                                          \
                   (::gpt2::msg() << "cuBLASLt: " #call " failed: " << cublasLtGetStatusName(gpt2_st_) << " (" \
                                  << cublasLtGetStatusString(gpt2_st_) << ")")                                 \
                       .str());                                                                                \
  } while (0)

namespace gpt2::kernels {

namespace {

using cuda::ceil_div;
using cuda::from_f32;
using cuda::to_f32;

// 32 MiB: what NVIDIA recommends for Hopper's cuBLASLt kernels (sm_80 needs less; a little unused is fine).
constexpr size_t kLtWorkspaceBytes = 32ull << 20;
constexpr int kElementwiseThreads = 256;
constexpr long kElementwiseMaxBlocks = 1L << 16;  // grid-stride beyond that

// ---------------------------------------------------------------------------------------------------
// Unfused epilogues (fallback).

template <class T>
__global__ void __launch_bounds__(kElementwiseThreads)
    fill_rows_with_bias(T* __restrict__ c, const T* __restrict__ bias, long total, int N) {
  cuda::griddep_launch_dependents_then_wait();
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) c[i] = bias[i % N];
}

// c holds the pre-activation (already rounded to T): aux = c; c = gelu(c).
template <class T>
__global__ void __launch_bounds__(kElementwiseThreads)
    gelu_forward_save_pre(T* __restrict__ c, T* __restrict__ aux, long total) {
  cuda::griddep_launch_dependents_then_wait();
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const T pre = c[i];
    aux[i] = pre;
    c[i] = from_f32<T>(cuda::gelu_f32(to_f32(pre)));
  }
}

// c = c * gelu'(aux)
template <class T>
__global__ void __launch_bounds__(kElementwiseThreads)
    gelu_grad_scale_inplace(T* __restrict__ c, const T* __restrict__ aux, long total) {
  cuda::griddep_launch_dependents_then_wait();
  const long stride = static_cast<long>(gridDim.x) * blockDim.x;
  for (long i = static_cast<long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    c[i] = from_f32<T>(to_f32(c[i]) * cuda::gelu_grad_f32(to_f32(aux[i])));
}

unsigned elementwise_grid(long total) {
  const long blocks = ceil_div(total, kElementwiseThreads);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < kElementwiseMaxBlocks ? blocks : kElementwiseMaxBlocks));
}

// ---------------------------------------------------------------------------------------------------
// RAII for the descriptors.

struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDescPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using PreferencePtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

// row_major: CUBLASLT_ORDER_ROW (ld: the stride between rows), else cuBLASLt's column-major default.
LayoutPtr make_layout(cudaDataType_t type, int rows, int cols, int ld, bool row_major = false) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
                                          static_cast<int64_t>(ld)));
  LayoutPtr layout(l);
  if (row_major) {
    const int32_t order = CUBLASLT_ORDER_ROW;
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
  }
  return layout;
}

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

// Largest power of two <= 16 dividing the address (nullptr: no constraint).
int alignment_of(const void* p) {
  if (p == nullptr) return 16;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 16;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

}  // namespace

namespace detail {

// A cached matmul: descriptors, the heuristic's algorithm, and whether there was one.
struct LtPlan {
  MatmulDescPtr op;
  LayoutPtr a, b, c;  // cuBLASLt's A (= our B), B (= our A), C = D; row_major: our A, our B, C = D
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  bool row_major = false;  // the product in our own terms on row-ordered layouts (BGRADB's weight gradient)
};

struct LtPlanKey {
  int dtype, M, N, K;
  bool trans_a, trans_b;
  int epilogue;    // cublasLtEpilogue_t
  int align;       // min alignment (bytes) of every pointer the heuristic sees
  int bgrad_type;  // BGRADA, BGRADB, DGELU_BGRAD: the bias gradient's cudaDataType_t; -1 otherwise
  bool row_major;  // LtPlan::row_major
  bool operator<(const LtPlanKey& o) const {
    return std::tie(dtype, M, N, K, trans_a, trans_b, epilogue, align, bgrad_type, row_major) <
           std::tie(o.dtype, o.M, o.N, o.K, o.trans_a, o.trans_b, o.epilogue, o.align, o.bgrad_type, o.row_major);
  }
};

struct CublasLtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = kLtWorkspaceBytes;
  // Split-K reduction schemes a bf16 plan may use: fp32 only, unless GPT2_CUBLASLT_REDUCTION says
  // otherwise (a diagnosis: any = cuBLASLt's own default, every scheme; none = never split K; see get_plan).
  uint32_t bf16_reduction_schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  // GPT2_CUBLASLT_LOG_PLANS=1: each plan, as the heuristic answers it, on stderr (algorithm, tile,
  // stages, split-K and its reduction): which kernel ran a product that came out wrong.
  bool log_plans = false;
  std::map<LtPlanKey, std::unique_ptr<LtPlan>> plans;

  ~CublasLtState() {
    plans.clear();
    if (workspace) cudaFree(workspace);  // no CHECK: may run while a fatal error unwinds
    if (handle) cublasLtDestroy(handle);
  }
};

void CublasLtStateDeleter::operator()(CublasLtState* s) const {
  delete s;
}

size_t cublaslt_workspace_bytes() {
  return kLtWorkspaceBytes;
}

CublasLtState* create_cublaslt_state() {
  auto s = std::make_unique<CublasLtState>();
  const char* env = std::getenv("GPT2_CUBLASLT_REDUCTION");
  const std::string reduction = env != nullptr ? env : "";
  GPT2_CHECK(reduction.empty() || reduction == "fp32" || reduction == "any" || reduction == "none",
             "GPT2_CUBLASLT_REDUCTION='" << reduction
                                         << "': use fp32 (split-K parts summed in fp32, the default), any "
                                            "(cuBLASLt's default, bf16 sums allowed) or none (K never split); "
                                            "the last two are for diagnosis");
  if (reduction == "any") s->bf16_reduction_schemes = CUBLASLT_REDUCTION_SCHEME_MASK;
  if (reduction == "none") s->bf16_reduction_schemes = CUBLASLT_REDUCTION_SCHEME_NONE;
  const char* log_env = std::getenv("GPT2_CUBLASLT_LOG_PLANS");
  const std::string log = log_env != nullptr ? log_env : "";
  GPT2_CHECK(log.empty() || log == "0" || log == "1",
             "GPT2_CUBLASLT_LOG_PLANS='" << log << "': use 1 (each cuBLASLt plan on stderr) or 0");
  s->log_plans = log == "1";
  CUBLAS_CHECK(cublasLtCreate(&s->handle));
  s->workspace = device_alloc(s->workspace_bytes, "cuBLASLt's workspace");
  return s.release();
}

}  // namespace detail

namespace {

using detail::CublasLtState;
using detail::LtPlan;
using detail::LtPlanKey;

template <class T>
constexpr cudaDataType_t lt_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

const char* epilogue_name(int ep) {
  switch (ep) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "none";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
      return "DGELU";
    case CUBLASLT_EPILOGUE_BGRADA:
      return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return "DGELU_BGRAD";
  }
  return "other";
}

// One line per plan (GPT2_CUBLASLT_LOG_PLANS=1), in our terms (M, N, K of gemm_cuda) and cuBLASLt's
// (the algorithm's configuration); result nullptr: the heuristic had no algorithm.
void log_plan(const LtPlanKey& key, const cublasLtMatmulHeuristicResult_t* result) {
  std::ostringstream os;
  os << "cuBLASLt plan: " << (key.dtype == CUDA_R_32F ? "fp32" : "bf16") << " M=" << key.M << " N=" << key.N
     << " K=" << key.K << (key.trans_a ? " A^T" : "") << (key.trans_b ? " B^T" : "")
     << " epilogue=" << epilogue_name(key.epilogue)
     << (key.bgrad_type < 0 ? "" : key.bgrad_type == CUDA_R_32F ? " (fp32 sums)" : " (bf16 sums)")
     << (key.row_major ? " row-major" : "") << " align=" << key.align << ": ";
  if (result == nullptr) {
    os << "no algorithm";
  } else {
    const auto config = [&](cublasLtMatmulAlgoConfigAttributes_t attr) -> long long {
      uint32_t v = 0;  // every attribute read here is 32 bits or less (zero-extended)
      size_t written = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&result->algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS)
        return -1;
      return static_cast<long long>(v);
    };
    const long long scheme = config(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    os << "algo " << config(CUBLASLT_ALGO_CONFIG_ID) << " tile " << config(CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
       << config(CUBLASLT_ALGO_CONFIG_STAGES_ID) << " split-K " << config(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)
       << " reduction ";
    if (scheme == CUBLASLT_REDUCTION_SCHEME_NONE)
      os << "none";
    else if (scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE)
      os << "in-place (bf16 sums)";
    else if (scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
      os << "compute-type (fp32 sums)";
    else if (scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)
      os << "output-type (bf16 sums)";
    else
      os << scheme;
    os << " workspace " << result->workspaceSize << " B waves " << result->wavesCount;
  }
  std::fprintf(stderr, "%s\n", os.str().c_str());
}

// The plan for this call, built (and the heuristic asked) the first time the key is seen. bias/aux are
// set on the descriptor for the heuristic (it reads their alignment); callers set them again per call.
// bgrad_type: the type BGRADA, BGRADB and DGELU_BGRAD store the bias gradient in (ignored for the other
// epilogues). row_major: the product described in our own terms, C = op(A) op(B) on row-ordered layouts,
// where the row-major trick would put the operand whose columns BGRADB sums on the wrong side (no aux).
template <class T>
LtPlan& get_plan(CublasLtState& st, int M, int N, int K, bool trans_a, bool trans_b, cublasLtEpilogue_t epilogue,
                 const T* a, const T* b, const T* c, const void* bias, const T* aux,
                 cudaDataType_t bgrad_type = CUDA_R_32F, bool row_major = false) {
  int align = alignment_of(a);
  for (const void* p : {static_cast<const void*>(b), static_cast<const void*>(c), static_cast<const void*>(bias),
                        static_cast<const void*>(aux)})
    align = alignment_of(p) < align ? alignment_of(p) : align;
  const bool bgrad = epilogue == CUBLASLT_EPILOGUE_BGRADA || epilogue == CUBLASLT_EPILOGUE_BGRADB ||
                     epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  GPT2_CHECK(!row_major || aux == nullptr, "a row-major cuBLASLt plan with an aux matrix");
  const LtPlanKey key{static_cast<int>(lt_type<T>()), M, N, K, trans_a, trans_b, static_cast<int>(epilogue), align,
                      bgrad ? static_cast<int>(bgrad_type) : -1, row_major};
  auto it = st.plans.find(key);
  if (it != st.plans.end()) return *it->second;

  auto plan = std::make_unique<LtPlan>();
  constexpr cudaDataType_t type = lt_type<T>();
  cublasLtMatmulDesc_t op = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan->op.reset(op);
  plan->row_major = row_major;
  const bool lt_trans_a = row_major ? trans_a : trans_b, lt_trans_b = row_major ? trans_b : trans_a;
  set_desc(op, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(lt_trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(op, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(lt_trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(epilogue));
  if (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || bgrad)
    set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  // The bias gradient is stored in fp32 (one rounding, when the caller adds it), unless the caller asks
  // for bf16: cuBLASLt 13 had no algorithm for an fp32 one beside bf16 data (2026-11-27, H100 and H200).
  if (bgrad) set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(bgrad_type));
  if (epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_DGELU ||
      epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
    set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(aux));
    set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(N));  // rows of C^T
  }
  if (row_major) {
    // Stored (row-major) shapes, ours: A (M,K) ld K, transposed (K,M) ld M; B (K,N) ld N, transposed (N,K)
    // ld K; C (M,N) ld N.
    plan->a = trans_a ? make_layout(type, K, M, M, true) : make_layout(type, M, K, K, true);
    plan->b = trans_b ? make_layout(type, N, K, K, true) : make_layout(type, K, N, N, true);
    plan->c = make_layout(type, M, N, N, true);
  } else {
    // Stored (column-major) shapes: our B (K,N) row-major is (N,K) col-major, ld N; transposed (N,K) is
    // (K,N) col-major, ld K. Likewise our A. C^T is (N,M), ld N.
    plan->a = trans_b ? make_layout(type, K, N, K) : make_layout(type, N, K, N);
    plan->b = trans_a ? make_layout(type, M, K, M) : make_layout(type, K, M, K);
    plan->c = make_layout(type, N, M, N);
  }

  cublasLtMatmulPreference_t pref_raw = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
  PreferencePtr pref(pref_raw);
  const uint64_t ws = st.workspace_bytes;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al = static_cast<uint32_t>(align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &al, sizeof(al)));
  // Split-K only with the parts summed in fp32 (the compute type): the in-place and output-type schemes
  // add the parts in bf16, one rounding per part, where the contract (gemm_cuda.hpp) is one rounding of
  // the fp32 sum. The H200 (2026-11-27) split 64 x 64 over K = 8192 six ways this way and rounded it
  // once; without split-K the 124M step ran 9% slower. (fp32 output: every scheme is fp32.)
  if constexpr (!std::is_same_v<T, float>) {
    const uint32_t schemes = st.bf16_reduction_schemes;  // and none (no split), always allowed
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                      sizeof(schemes)));
  }

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  // Not CUBLAS_CHECK: "no algorithm" (NOT_SUPPORTED) is an answer here; the caller falls back or reports.
  const cublasStatus_t st_h = cublasLtMatmulAlgoGetHeuristic(st.handle, op, plan->a.get(), plan->b.get(), plan->c.get(),
                                                             plan->c.get(), pref.get(), 1, &result, &returned);
  plan->ok = st_h == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (plan->ok) plan->algo = result.algo;
  if (st.log_plans) log_plan(key, plan->ok ? &result : nullptr);
  return *st.plans.emplace(key, std::move(plan)).first->second;
}

template <class T>
void run_plan(CublasLtState& st, LtPlan& plan, T* c, const T* a, const T* b, const void* bias, const T* aux, float beta,
              cudaStream_t stream) {
  cublasLtMatmulDesc_t op = plan.op.get();
  // The cached descriptor may have been built with other pointers of the same alignment.
  if (bias) set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux) set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(aux));
  const float alpha = 1.0f;
  const T* lt_a = plan.row_major ? a : b;  // cuBLASLt's A and B (the row-major trick swaps ours)
  const T* lt_b = plan.row_major ? b : a;
  CUBLAS_CHECK(cublasLtMatmul(st.handle, op, &alpha, lt_a, plan.a.get(), lt_b, plan.b.get(), &beta, c, plan.c.get(), c,
                              plan.c.get(), &plan.algo, st.workspace, st.workspace_bytes, stream));
}

}  // namespace

namespace detail {

template <class T>
void gemm_cublaslt(GemmContext& ctx, T* c, const T* a, const T* b, const T* bias, T* aux, int M, int N, int K,
                   bool trans_a, bool trans_b, bool accumulate, GemmEpilogue ep, cudaStream_t stream) {
  CublasLtState* st = ctx.cublaslt();
  GPT2_CHECK(st != nullptr, "cuBLASLt GEMM on a context made for the hand backend");

  // Fused epilogue when allowed and cuBLASLt has an algorithm for it. fp32 fuses only the bias: fp32 is
  // the checking precision, and cuBLASLt does not document how it evaluates GELU (an approximate tanh
  // would miss the 1e-5 agreement with the CPU), so fp32 GELU runs in our kernels with tanhf.
  const bool uses_aux = ep == GemmEpilogue::kBiasGelu || ep == GemmEpilogue::kDGelu;
  if (ep != GemmEpilogue::kNone && !ctx.test_hooks().lt_force_unfused_epilogue &&
      (std::is_same_v<T, bf16> || !uses_aux)) {
    if (!uses_aux || N % 8 == 0) {  // cuBLASLt: the aux leading dimension must be a multiple of 8
      const cublasLtEpilogue_t lt_ep = ep == GemmEpilogue::kBias       ? CUBLASLT_EPILOGUE_BIAS
                                       : ep == GemmEpilogue::kBiasGelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                       : CUBLASLT_EPILOGUE_DGELU;
      const T* bias_used = ep == GemmEpilogue::kDGelu ? nullptr : bias;
      LtPlan& plan = get_plan<T>(*st, M, N, K, trans_a, trans_b, lt_ep, a, b, c, bias_used, uses_aux ? aux : nullptr);
      if (plan.ok) {
        run_plan<T>(*st, plan, c, a, b, bias_used, uses_aux ? aux : nullptr, 0.0f, stream);
        return;
      }
    }
  }

  // Plain product; the unfused epilogues seed C with the bias (beta = 1 adds the product to it in fp32,
  // one rounding) or finish with an elementwise pass.
  const long total = static_cast<long>(M) * N;
  const bool seed_bias = ep == GemmEpilogue::kBias || ep == GemmEpilogue::kBiasGelu;
  if (seed_bias) {
    cuda::launch_kernel(fill_rows_with_bias<T>, elementwise_grid(total), kElementwiseThreads, 0, stream, c, bias, total,
                        N);
    CUDA_CHECK_LAUNCH();
  }
  LtPlan& plan = get_plan<T>(*st, M, N, K, trans_a, trans_b, CUBLASLT_EPILOGUE_DEFAULT, a, b, c, nullptr, nullptr);
  GPT2_CHECK(plan.ok, "cuBLASLt has no algorithm for M=" << M << " N=" << N << " K=" << K << " trans_a=" << trans_a
                                                         << " trans_b=" << trans_b
                                                         << " type=" << (std::is_same_v<T, float> ? "fp32" : "bf16"));
  run_plan<T>(*st, plan, c, a, b, nullptr, nullptr, (accumulate || seed_bias) ? 1.0f : 0.0f, stream);
  if (ep == GemmEpilogue::kBiasGelu) {
    cuda::launch_kernel(gelu_forward_save_pre<T>, elementwise_grid(total), kElementwiseThreads, 0, stream, c, aux,
                        total);
    CUDA_CHECK_LAUNCH();
  } else if (ep == GemmEpilogue::kDGelu) {
    cuda::launch_kernel(gelu_grad_scale_inplace<T>, elementwise_grid(total), kElementwiseThreads, 0, stream, c, aux,
                        total);
    CUDA_CHECK_LAUNCH();
  }
}

template void gemm_cublaslt<float>(GemmContext&, float*, const float*, const float*, const float*, float*, int, int,
                                   int, bool, bool, bool, GemmEpilogue, cudaStream_t);
template void gemm_cublaslt<bf16>(GemmContext&, bf16*, const bf16*, const bf16*, const bf16*, bf16*, int, int, int,
                                  bool, bool, bool, GemmEpilogue, cudaStream_t);

template <class T, class S>
LtBiasGradEpilogue weight_bias_grad_cublaslt(GemmContext& ctx, T* dw, S* dbias_sums, const T* inp, const T* dout,
                                             int rows, int IC, int OC, cudaStream_t stream) {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, T>, "bias sums in fp32 or in the data's type");
  CublasLtState* st = ctx.cublaslt();
  GPT2_CHECK(st != nullptr, "cuBLASLt GEMM on a context made for the hand backend");
  // dw (IC,OC) += inp^T dout: gemm_cuda's M = IC, N = OC, K = rows, trans_a, C +=; true if it ran.
  const auto ran = [&](cublasLtEpilogue_t epilogue, bool row_major) {
    LtPlan& plan = get_plan<T>(*st, IC, OC, rows, true, false, epilogue, inp, dout, dw, dbias_sums, nullptr,
                               lt_type<S>(), row_major);
    if (plan.ok) run_plan<T>(*st, plan, dw, inp, dout, dbias_sums, nullptr, 1.0f, stream);
    return plan.ok;
  };
  // In the row-major trick dout is cuBLASLt's A: BGRADA.
  if (!ctx.test_hooks().lt_bias_grad_row_major && ran(CUBLASLT_EPILOGUE_BGRADA, false))
    return LtBiasGradEpilogue::kBgradA;
  // bf16 sums (the opt-in) where BGRADA has none: the same product on row-ordered layouts, in our own terms,
  // makes dout cuBLASLt's B, whose sums over k are BGRADB's (the case Transformer Engine and PyTorch fuse,
  // their weight gradient being stored transposed to ours). Whether cuBLASLt orders rows with this epilogue is
  // the lent GPU's to say.
  if constexpr (std::is_same_v<S, T> && !std::is_same_v<T, float>) {
    if (ran(CUBLASLT_EPILOGUE_BGRADB, true)) return LtBiasGradEpilogue::kBgradBRowMajor;
  }
  return LtBiasGradEpilogue::kNone;
}
template LtBiasGradEpilogue weight_bias_grad_cublaslt<float, float>(GemmContext&, float*, float*, const float*,
                                                                    const float*, int, int, int, cudaStream_t);
template LtBiasGradEpilogue weight_bias_grad_cublaslt<bf16, float>(GemmContext&, bf16*, float*, const bf16*,
                                                                   const bf16*, int, int, int, cudaStream_t);
template LtBiasGradEpilogue weight_bias_grad_cublaslt<bf16, bf16>(GemmContext&, bf16*, bf16*, const bf16*,
                                                                  const bf16*, int, int, int, cudaStream_t);

template <class T>
bool dgelu_bias_grad_cublaslt(GemmContext& ctx, T* c, T* dbias_sums, const T* a, const T* b, const T* aux, int M,
                              int N, int K, bool trans_a, bool trans_b, cudaStream_t stream) {
  CublasLtState* st = ctx.cublaslt();
  GPT2_CHECK(st != nullptr, "cuBLASLt GEMM on a context made for the hand backend");
  if (N % 8 != 0) return false;  // cuBLASLt: the aux leading dimension must be a multiple of 8
  // C^T (N,M) = op(B)^T op(A)^T, then * gelu'(aux); the bias gradient has one value per row of C^T, the sum
  // over its M columns: our C's column sums.
  LtPlan& plan = get_plan<T>(*st, M, N, K, trans_a, trans_b, CUBLASLT_EPILOGUE_DGELU_BGRAD, a, b, c, dbias_sums, aux,
                             lt_type<T>());
  if (!plan.ok) return false;
  run_plan<T>(*st, plan, c, a, b, dbias_sums, aux, 0.0f, stream);
  return true;
}
template bool dgelu_bias_grad_cublaslt<bf16>(GemmContext&, bf16*, bf16*, const bf16*, const bf16*, const bf16*, int,
                                             int, int, bool, bool, cudaStream_t);

}  // namespace detail

}  // namespace gpt2::kernels
