// GEMMs through cuBLASLt's sm_90 kernels (wgmma). e4m3 x e4m3: the per-token activation scales
// and per-row weight scales applied by cuBLASLt's outer-vector scaling, the bias by its BIAS
// epilogue. The fp32 accumulation order (and the epilogue's operation order) are cuBLASLt's, so
// this path meets the fp8 tolerance, not bit-exactness (fp8 layer outputs are compared with a
// tolerance in any case: the CPU accumulates in another order). When cuBLASLt offers no algorithm
// (older library, other GPU, bias in another dtype) the caller falls back to the mma.sync kernel.
// Session 17: the same for f16 x f16 -> f16 and bf16 x bf16 -> bf16 (the sm_90 NVFP4 path after
// its exact dequantization into the output's type): no outer-vector scales (null there), the
// weight's tensor scale as cuBLASLt's alpha read from the device (pointer mode device, beta a
// device zero), the BIAS epilogue: acc * pts + bias, the epilogue's order.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>

#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kMaxAlgos = 8;  // heuristic candidates kept per shape (index 0 = cuBLASLt's first)

struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  bool init_failed = false;
  // (device, kind, M, N, K, out dtype, bias dtype or -1, fast accumulation, alpha on the device)
  // -> cuBLASLt's candidates, best first by its heuristic (count = 0: none offered).
  struct Entry {
    int count = 0;
    cublasLtMatmulAlgo_t algo[kMaxAlgos]{};
  };
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t, int, int, bool, bool>, Entry> algos;
};
LtState& state() {
  static LtState s;
  return s;
}

cudaDataType_t cuda_type(DType d) { return d == DType::f16 ? CUDA_R_16F : CUDA_R_16BF; }
bool kind16(GemmKind k) { return k == GemmKind::f16 || k == GemmKind::bf16; }

// beta for the f16 GEMM's device pointer mode (alpha = the weight's tensor scale on the device).
__device__ const float kDeviceZero = 0.f;
const float* device_zero() {
  void* p = nullptr;
  return cudaGetSymbolAddress(&p, kDeviceZero) == cudaSuccess ? static_cast<const float*>(p)
                                                               : nullptr;
}

struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  ~Desc() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// Column-major view: out^T (N, M) = W (N, K) · A^T (K, M): cuBLAS "A" = W stored (K, N) with
// TRANSA = T, "B" = activation codes stored (K, M), TRANSB = N (the TN layout fp8 requires).
bool build(const GemmParams& p, Desc& d) {
  if (!ok(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return false;
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (!ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) ||
      !ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))))
    return false;
  if (kind16(p.kind) && p.w_tensor_scale) {
    cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    if (!ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm,
                                           sizeof(pm))))
      return false;
  }
  cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const void* sa = p.w_scale;
  const void* sb = p.a_scale;
  if (p.kind == GemmKind::e4m3 &&
      (!ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec,
                                         sizeof(vec))) ||
      !ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec,
                                         sizeof(vec))) ||
      !ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa,
                                         sizeof(sa))) ||
      !ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb,
                                         sizeof(sb)))))
    return false;
  if (p.fp8_fast_accum) {
    const int8_t fast = 1;
    if (!ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                           sizeof(fast))))
      return false;
  }
  if (p.bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bt = cuda_type(p.bias_dtype);
    if (!ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof(epi))) ||
        !ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias,
                                           sizeof(p.bias))) ||
        !ok(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                           sizeof(bt))))
      return false;
  }
  const cudaDataType_t ot = cuda_type(p.out_dtype);
  const cudaDataType_t it = p.kind == GemmKind::f16    ? CUDA_R_16F
                           : p.kind == GemmKind::bf16 ? CUDA_R_16BF
                                                      : CUDA_R_8F_E4M3;
  return ok(cublasLtMatrixLayoutCreate(&d.la, it, p.K, p.N, p.ldb)) &&
         ok(cublasLtMatrixLayoutCreate(&d.lb, it, p.K, p.M, p.lda)) &&
         ok(cublasLtMatrixLayoutCreate(&d.lc, ot, p.N, p.M, p.ldo));
}

// Builds the descriptors and finds (once per shape, cached) cuBLASLt's candidates; nullptr when
// the path does not apply or cuBLASLt offers nothing. Called with the state's lock held.
const LtState::Entry* candidates(const GemmParams& p, size_t workspace_bytes, Desc& d) {
  if (p.acc_out) return nullptr;
  if (p.kind == GemmKind::e4m3) {
    if (p.w_tensor_scale || !p.a_scale || !p.w_scale) return nullptr;
    // cuBLASLt fp8: 16-byte aligned pointers and leading dimensions.
    if (p.K % 16 || p.lda % 16 || p.ldb % 16 || p.ldo % 8) return nullptr;
  } else if (kind16(p.kind)) {
    // cuBLASLt's 16-bit GEMMs: the output in the operands' type
    if (p.out_dtype != (p.kind == GemmKind::f16 ? DType::f16 : DType::bf16)) return nullptr;
    if (p.a_scale || p.w_scale || p.fp8_fast_accum) return nullptr;
    if (p.K % 8 || p.lda % 8 || p.ldb % 8 || p.ldo % 8) return nullptr;
    if (p.w_tensor_scale && !device_zero()) return nullptr;
  } else {
    return nullptr;
  }
  if (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16) return nullptr;
  if (p.bias && p.bias_dtype != p.out_dtype) return nullptr;
  LtState& s = state();
  if (s.init_failed) return nullptr;
  if (!s.handle && !ok(cublasLtCreate(&s.handle))) {
    s.init_failed = true;
    return nullptr;
  }
  if (!build(p, d)) return nullptr;
  int dev = 0;
  cudaGetDevice(&dev);
  auto key = std::make_tuple(dev, static_cast<int>(p.kind), p.M, p.N, p.K,
                             static_cast<int>(p.out_dtype),
                             p.bias ? static_cast<int>(p.bias_dtype) : -1, p.fp8_fast_accum,
                             p.w_tensor_scale != nullptr);
  auto it = s.algos.find(key);
  if (it == s.algos.end()) {
    LtState::Entry e;
    cublasLtMatmulPreference_t pref = nullptr;
    if (ok(cublasLtMatmulPreferenceCreate(&pref))) {
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes));
      cublasLtMatmulHeuristicResult_t res[kMaxAlgos]{};
      int n = 0;
      if (ok(cublasLtMatmulAlgoGetHeuristic(s.handle, d.op, d.la, d.lb, d.lc, d.lc, pref, kMaxAlgos,
                                            res, &n))) {
        for (int i = 0; i < n; ++i)
          if (res[i].state == CUBLAS_STATUS_SUCCESS) e.algo[e.count++] = res[i].algo;
      }
      cublasLtMatmulPreferenceDestroy(pref);
    }
    it = s.algos.emplace(key, e).first;
  }
  return it->second.count ? &it->second : nullptr;
}

}  // namespace

bool gemm_cublaslt(const GemmParams& p, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, int candidate) {
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Desc d;
  const LtState::Entry* e = candidates(p, workspace_bytes, d);
  if (!e || candidate >= e->count) return false;
  static const float one = 1.f, zero = 0.f;
  // 16-bit with a tensor scale: alpha and beta are device pointers (pointer mode device).
  const bool dev_alpha = kind16(p.kind) && p.w_tensor_scale;
  const float* alpha = dev_alpha ? p.w_tensor_scale : &one;
  const float* beta = dev_alpha ? device_zero() : &zero;
  return ok(cublasLtMatmul(s.handle, d.op, alpha, p.b, d.la, p.a, d.lb, beta, p.out, d.lc, p.out,
                           d.lc, &e->algo[candidate < 0 ? 0 : candidate], workspace,
                           workspace_bytes, stream));
}

int gemm_cublaslt_candidates(const GemmParams& p, size_t workspace_bytes) {
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  Desc d;
  const LtState::Entry* e = candidates(p, workspace_bytes, d);
  return e ? e->count : 0;
}

size_t gemm_cublaslt_workspace_bytes() { return kWorkspaceBytes; }

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
