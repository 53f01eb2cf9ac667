// cuBLASLt, emulated: the calls kernels/gemm/gemm_cublaslt.cu makes, answered from cuBLASLt's documented
// contract (cublasLt.h; cuBLAS docs, "cublasLtMatmul", "cublasLtEpilogue_t", "cublasLtMatmulDescAttributes_t"),
// so that the repository's own wrapper, unchanged, runs in the emulated builds and is checked against the
// CPU references: its row-major-to-column-major swap, transposes, leading dimensions, epilogues, bias and aux
// pointers, alignment promises and workspace. What it does not read is not modelled: batches, other data or
// compute types, other epilogues and attributes (each an error that names it, never a silent answer).
//
// cublasLtMatmul: D = epilogue(alpha op(A) op(B) + beta C), op(A) m x k, op(B) k x n, D m x n, each matrix
// column-major or (CUBLASLT_MATRIX_LAYOUT_ORDER) row-major, all four in one order (assumed: the wrapper never
// mixes them), queued on the stream (a kernel node when captured) with the descriptor's values of the call;
// products in double, the epilogue in double, one rounding to D's type:
//   BIAS           D += bias[i]                           (bias: D's type, or BIAS_DATA_TYPE)
//   GELU_AUX_BIAS  aux = D + bias[i] (stored in D's type); D = gelu of the unrounded value
//   DGELU          D *= gelu'(aux)                        (aux: the forward's pre-activation)
//   BGRADA         bias[i] = sum over k of op(A)[i][k]    (stored, not added; BIAS_DATA_TYPE or D's type)
//   BGRADB         bias[j] = sum over k of op(B)[k][j]    (likewise)
//   DGELU_BGRAD    D *= gelu'(aux); bias[i] = sum over j of D[i][j], of the unrounded values (stored likewise)
// Assumed where the documentation is silent (the lent GPU settles them): GELU is the tanh form (GPT-2's; PyTorch
// relies on cuBLASLt's being that); a fused kernel takes the GELU of its fp32 value, not of the stored aux;
// DGELU_BGRAD's bias gradient is the sum of the GELU gradient's results (Transformer Engine takes it as the
// previous layer's bias gradient), before they are rounded to D's type.
// Answered as the lent GPUs' cuBLASLt 13 answered (2026-11-27, H100 and H200): no algorithm for a bias gradient
// in fp32 beside bf16 data (cublasLt.h: "the same type as the output elements"), so the wrapper falls back to
// its bias kernel; EMU_CUBLASLT_BGRAD_FP32=1 offers one anyway. A bias gradient in the data's type is offered
// (whether a GPU has one is the lent GPU's to say).
// The heuristic answers one algorithm for every supported problem, which records the alignment the caller
// promised (MIN_ALIGNMENT_*, default 256): a matmul whose pointers break that promise, or whose aux leading
// dimension is not a multiple of 8 or below m, fails. The workspace must be device memory when given.
// EMU_CUBLASLT_BGRADA=0: none for BGRADA (as a cuBLASLt with BGRADB alone would answer).
// EMU_CUBLASLT_FUSED=0: the heuristic has no algorithm for any epilogue but DEFAULT, as a cuBLASLt without
// them would answer, so the wrapper's fallbacks (its own bias, GELU and bias-gradient passes) run.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "emu/runtime.h"

namespace {

struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order = CUBLASLT_ORDER_COL;
  // where element (r, c) is: ld strides columns (column-major) or rows (row-major)
  uint64_t at(uint64_t r, uint64_t c) const {
    return order == CUBLASLT_ORDER_ROW ? r * ld + c : r + c * ld;
  }
};
struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
};
struct Preference {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default assumes 256-byte alignment
};
constexpr uint64_t kAlgoMagic = 0x656d75416c676fULL;  // "emuAlgo"

cublasStatus_t refuse(cublasStatus_t st, const std::string& why) {
  emu::note("cuBLASLt (emulated): %s", why.c_str());
  return st;
}
bool supported_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }
double load(const void* p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
void store(void* p, cudaDataType t, size_t i, double v) {
  if (t == CUDA_R_32F) static_cast<float*>(p)[i] = static_cast<float>(v);
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(static_cast<float>(v));  // one rounding: fp32 -> bf16
}
double gelu(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}
bool fused_offered() {
  static const bool offered = [] {
    const char* v = std::getenv("EMU_CUBLASLT_FUSED");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return offered;
}
bool bgrad_fp32_on_bf16_offered() {
  static const bool offered = [] {
    const char* v = std::getenv("EMU_CUBLASLT_BGRAD_FP32");
    return v && std::strcmp(v, "1") == 0;
  }();
  return offered;
}
// EMU_CUBLASLT_BGRADA=0: no algorithm for BGRADA (the wrapper's row-major BGRADB fallback runs)
bool bgrada_offered() {
  static const bool offered = [] {
    const char* v = std::getenv("EMU_CUBLASLT_BGRADA");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return offered;
}
bool epilogue_known(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB ||
         e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool bias_grad(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
bool uses_bias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || bias_grad(e);
}
bool uses_aux(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}
int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}

// Matmuls by epilogue, said at exit (train_emu.py checks that a run used the fused epilogues it should)
std::atomic<unsigned long long> g_by_epilogue[7];
int epilogue_slot(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS ? 1 : e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? 2 : e == CUBLASLT_EPILOGUE_DGELU ? 3
         : e == CUBLASLT_EPILOGUE_BGRADA ? 4 : e == CUBLASLT_EPILOGUE_DGELU_BGRAD ? 5
         : e == CUBLASLT_EPILOGUE_BGRADB ? 6 : 0;
}
void count_matmul(uint32_t epilogue) {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] {
      emu::note("cuBLASLt: matmul calls by epilogue: default %llu, bias %llu, gelu_aux_bias %llu, dgelu %llu, bgrada "
                "%llu, dgelu_bgrad %llu, bgradb %llu",
                g_by_epilogue[0].load(), g_by_epilogue[1].load(), g_by_epilogue[2].load(), g_by_epilogue[3].load(),
                g_by_epilogue[4].load(), g_by_epilogue[5].load(), g_by_epilogue[6].load());
    });
  });
  ++g_by_epilogue[epilogue_slot(epilogue)];
}

// The problem the descriptors describe, checked as cuBLASLt would: "" or why not.
std::string check_problem(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl,
                          uint64_t* m, uint64_t* n, uint64_t* k) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) return "only CUBLAS_COMPUTE_32F with fp32 scale is emulated";
  if (!supported_type(a.type) || a.type != b.type || a.type != c.type || a.type != dl.type)
    return "A, B, C and D must all be fp32 or all bf16";
  if (!epilogue_known(d.epilogue)) return "epilogue " + std::to_string(d.epilogue) + " is not emulated";
  for (int32_t op : {d.trans_a, d.trans_b})
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return "transpose operation " + std::to_string(op) + " is not emulated";
  const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
  *m = ta ? a.cols : a.rows;
  *k = ta ? a.rows : a.cols;
  const uint64_t kb = tb ? b.cols : b.rows;
  *n = tb ? b.rows : b.cols;
  if (kb != *k) return "op(A) is " + std::to_string(*m) + "x" + std::to_string(*k) + " but op(B) has " +
                       std::to_string(kb) + " rows";
  if (c.rows != *m || c.cols != *n || dl.rows != *m || dl.cols != *n || c.ld != dl.ld)
    return "C and D must be " + std::to_string(*m) + "x" + std::to_string(*n) + " with one leading dimension";
  if (a.order != b.order || a.order != c.order || a.order != dl.order)
    return "A, B, C and D in different orders (row- and column-major mixed) is not emulated";
  for (const Layout* l : {&a, &b, &c})
    if (l->ld < static_cast<int64_t>(l->order == CUBLASLT_ORDER_ROW ? l->cols : l->rows))
      return "a leading dimension below the rows (column-major) or columns (row-major) of its matrix";
  if (uses_bias(d.epilogue) && d.bias_type != -1 && !supported_type(static_cast<cudaDataType>(d.bias_type)))
    return "bias data type " + std::to_string(d.bias_type) + " is not emulated";
  if (uses_aux(d.epilogue) && dl.order == CUBLASLT_ORDER_ROW) return "an aux matrix beside row-major D is not emulated";
  if (uses_aux(d.epilogue) && (d.aux_ld % 8 != 0 || d.aux_ld < static_cast<int64_t>(*m)))
    return "EPILOGUE_AUX_LD " + std::to_string(d.aux_ld) + " must be a multiple of 8 and at least m = " +
           std::to_string(*m);
  return "";
}

}  // namespace

extern "C" {

size_t CUBLASWINAPI cublasLtGetVersion(void) { return 0; }  // cuda_library_versions(): "cuBLASLt 0", the emulated one
const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(emulated, other)";
  }
}
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "the emulated cuBLASLt refused the call (see its [emu] note)";
}
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(new int(0));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t h) {
  delete reinterpret_cast<int*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
// CUBLASLT_MATRIX_LAYOUT_ORDER (COL or ROW) only.
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t size) {
  if (attr != CUBLASLT_MATRIX_LAYOUT_ORDER)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "layout attribute " + std::to_string(attr) + " is not emulated");
  int32_t order;
  if (size != sizeof order) return refuse(CUBLAS_STATUS_INVALID_VALUE, "CUBLASLT_MATRIX_LAYOUT_ORDER: wrong size");
  std::memcpy(&order, buf, size);
  if (order != CUBLASLT_ORDER_COL && order != CUBLASLT_ORDER_ROW)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matrix order " + std::to_string(order) + " is not emulated");
  reinterpret_cast<Layout*>(l)->order = order;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete reinterpret_cast<Layout*>(l);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  auto* desc = new Desc;
  desc->compute = compute;
  desc->scale = scale;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete reinterpret_cast<Desc*>(d);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t size) {
  Desc& d = *reinterpret_cast<Desc*>(desc);
  auto take = [&](auto* field) {
    if (size != sizeof *field) return refuse(CUBLAS_STATUS_INVALID_VALUE, "attribute " + std::to_string(attr) +
                                                                              ": wrong size " + std::to_string(size));
    std::memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return take(&d.trans_a);
    case CUBLASLT_MATMUL_DESC_TRANSB: return take(&d.trans_b);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return take(&d.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return take(&d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return take(&d.bias_type);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return take(&d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return take(&d.aux_ld);
    default: return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matmul attribute " + std::to_string(attr) + " is not emulated");
  }
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete reinterpret_cast<Preference*>(p);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t size) {
  Preference& p = *reinterpret_cast<Preference*>(pref);
  const int slot = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
                   : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
                   : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
                   : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                                        : -1;
  if (slot >= 0 && size == sizeof(uint32_t)) {
    std::memcpy(&p.align[slot], buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(uint64_t)) {
    std::memcpy(&p.max_workspace, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  // The emulated algorithm never splits K (the scheme "none"), which every mask allows.
  if (attr == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK && size == sizeof(uint32_t)) {
    uint32_t mask;
    std::memcpy(&mask, buf, size);
    if ((mask & ~static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK)) == 0) return CUBLAS_STATUS_SUCCESS;
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "reduction scheme mask " + std::to_string(mask));
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute " + std::to_string(attr) + " (size " +
                                                 std::to_string(size) + ") is not emulated");
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t pref, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* returned) {
  *returned = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  uint64_t m, n, k;
  const Desc& desc = *reinterpret_cast<const Desc*>(op);
  const std::string why = check_problem(desc, *reinterpret_cast<const Layout*>(a), *reinterpret_cast<const Layout*>(b),
                                        *reinterpret_cast<const Layout*>(c), *reinterpret_cast<const Layout*>(d), &m, &n, &k);
  if (!why.empty()) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm: " + why);
  if (desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !fused_offered()) return CUBLAS_STATUS_SUCCESS;  // none returned
  const Layout& la = *reinterpret_cast<const Layout*>(a);
  if (bias_grad(desc.epilogue) && la.type == CUDA_R_16BF && desc.bias_type == CUDA_R_32F &&
      !bgrad_fp32_on_bf16_offered())
    return CUBLAS_STATUS_SUCCESS;  // none returned, as on the lent GPUs
  if (desc.epilogue == CUBLASLT_EPILOGUE_BGRADA && !bgrada_offered()) return CUBLAS_STATUS_SUCCESS;
  const Preference& p = *reinterpret_cast<const Preference*>(pref);
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].algo.data[0] = kAlgoMagic;
  for (int i = 0; i < 4; ++i) results[0].algo.data[1 + i] = p.align[i];
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// The emulated algorithm's configuration (GPT2_CUBLASLT_LOG_PLANS): one algorithm, K never split.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                                 cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                                                                 size_t size, size_t* written) {
  if (algo == nullptr || algo->data[0] != kAlgoMagic) return refuse(CUBLAS_STATUS_INVALID_VALUE, "not an algorithm");
  uint32_t v = 0;
  if (attr == CUBLASLT_ALGO_CONFIG_SPLITK_NUM) v = 1;
  else if (attr == CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) v = CUBLASLT_REDUCTION_SCHEME_NONE;
  else if (attr != CUBLASLT_ALGO_CONFIG_ID && attr != CUBLASLT_ALGO_CONFIG_TILE_ID && attr != CUBLASLT_ALGO_CONFIG_STAGES_ID)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "algorithm attribute " + std::to_string(attr) + " is not emulated");
  if (written) *written = sizeof(v);
  if (size < sizeof(v)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &v, sizeof(v));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void* alpha_p,
                                           const void* A, cublasLtMatrixLayout_t a_l, const void* B,
                                           cublasLtMatrixLayout_t b_l, const void* beta_p, const void* C,
                                           cublasLtMatrixLayout_t c_l, void* D, cublasLtMatrixLayout_t d_l,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                           cudaStream_t stream) {
  const Desc d = *reinterpret_cast<const Desc*>(op);  // the values of this call, as a launch's parameters are
  const Layout la = *reinterpret_cast<const Layout*>(a_l), lb = *reinterpret_cast<const Layout*>(b_l),
               lc = *reinterpret_cast<const Layout*>(c_l), ld = *reinterpret_cast<const Layout*>(d_l);
  uint64_t m, n, k;
  const std::string why = check_problem(d, la, lb, lc, ld, &m, &n, &k);
  if (!why.empty()) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, why);
  if (!algo || algo->data[0] != kAlgoMagic) return refuse(CUBLAS_STATUS_INVALID_VALUE, "no algorithm of the heuristic");
  // The alignment the heuristic was promised: A, B, C, D; the bias and aux pointers count with A's (the
  // heuristic "depends on their value to determine expected pointer alignment").
  const void* ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i)
    if (alignment_of(ptrs[i]) < static_cast<int>(algo->data[1 + i]))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("matrix ") + "ABCD"[i] + " at " +
                                                     std::to_string(reinterpret_cast<uintptr_t>(ptrs[i])) +
                                                     " breaks the promised alignment of " +
                                                     std::to_string(algo->data[1 + i]) + " bytes");
  for (const void* p : {uses_bias(d.epilogue) ? d.bias : nullptr, uses_aux(d.epilogue) ? d.aux : nullptr})
    if (p && alignment_of(p) < static_cast<int>(algo->data[1]))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "a bias or aux pointer breaks the promised alignment");
  if (uses_bias(d.epilogue) && !d.bias) return refuse(CUBLAS_STATUS_INVALID_VALUE, "the epilogue needs BIAS_POINTER");
  if (uses_aux(d.epilogue) && !d.aux)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the epilogue needs EPILOGUE_AUX_POINTER");
  if (workspace_bytes && !emu::is_device_memory(workspace))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the workspace is not device memory");
  const float alpha = *static_cast<const float*>(alpha_p), beta = *static_cast<const float*>(beta_p);  // host mode
  const cudaDataType t = ld.type;
  const cudaDataType bias_t = d.bias_type == -1 ? t : static_cast<cudaDataType>(d.bias_type);
  count_matmul(d.epilogue);
  emu::stream_submit(stream, [=]() {
    const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
    // op(A) by rows and op(B) by columns, in double: each output is one contiguous dot product
    std::vector<double> ar(m * k), bc(n * k);
    for (uint64_t i = 0; i < m; ++i)
      for (uint64_t kk = 0; kk < k; ++kk) ar[i * k + kk] = load(A, t, ta ? la.at(kk, i) : la.at(i, kk));
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t kk = 0; kk < k; ++kk) bc[j * k + kk] = load(B, t, tb ? lb.at(j, kk) : lb.at(kk, j));
    std::vector<double> out(m * n);
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        double s = 0;
        for (uint64_t kk = 0; kk < k; ++kk) s += ar[i * k + kk] * bc[j * k + kk];
        out[i + j * m] = alpha * s + (beta != 0 ? beta * load(C, t, lc.at(i, j)) : 0.0);
      }
    if (d.epilogue == CUBLASLT_EPILOGUE_BGRADA)
      for (uint64_t i = 0; i < m; ++i) {
        double g = 0;
        for (uint64_t kk = 0; kk < k; ++kk) g += ar[i * k + kk];
        store(const_cast<void*>(d.bias), bias_t, i, g);
      }
    if (d.epilogue == CUBLASLT_EPILOGUE_BGRADB)
      for (uint64_t j = 0; j < n; ++j) {
        double g = 0;
        for (uint64_t kk = 0; kk < k; ++kk) g += bc[j * k + kk];
        store(const_cast<void*>(d.bias), bias_t, j, g);
      }
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) {
        double v = out[i + j * m];
        if (d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
          v += load(d.bias, bias_t, i);
        if (d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
          store(const_cast<void*>(d.aux), t, i + j * d.aux_ld, v);
          v = gelu(static_cast<float>(v));  // the fused kernel's fp32 value
        } else if (d.epilogue == CUBLASLT_EPILOGUE_DGELU || d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
          v *= gelu_grad(load(d.aux, t, i + j * d.aux_ld));
        }
        out[i + j * m] = v;
        store(D, t, ld.at(i, j), v);
      }
    if (d.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD)
      for (uint64_t i = 0; i < m; ++i) {
        double g = 0;
        for (uint64_t j = 0; j < n; ++j) g += out[i + j * m];
        store(const_cast<void*>(d.bias), bias_t, i, g);
      }
    return true;
  }, "cublasLtMatmul");
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
