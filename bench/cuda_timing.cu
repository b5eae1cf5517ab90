// Device-event timing with an L2 flush before each timed call, and the cuBLASLt bf16 GEMM
// baseline.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "lowbit/runtime.h"
#include "src/cuda/common.cuh"  // launch_maybe_pdl

namespace lowbit {
namespace bench {

namespace {
void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error("bench", what, cudaGetErrorString(e));
}
void ok(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error("bench", what, "cuBLASLt status " + std::to_string(static_cast<int>(s)));
}

// Does nothing: the host's launch floor (bench family attention.host).
__global__ void empty_kernel() {}

// Reads every 16-byte word of the flush buffer; the (never true) store keeps the loads alive.
__global__ void l2_flush_read_kernel(const uint4* __restrict__ buf, size_t words, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = buf[i];
    acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
  }
  if (acc.x == 0x9e3779b9u && acc.y == 0x7f4a7c15u) *sink = acc;
}

// A buffer twice the L2 (zeroed once), READ before each timed call so every run starts with a
// cold L2 that holds only clean lines: the dirty lines the previous call left are written back
// during the flush, outside the timed region (a write flush would leave the L2 full of dirty
// lines whose write-back the next timed call would pay: ~20 us, which dwarfs a decode GEMV).
struct L2Flusher {
  void* buf = nullptr;
  size_t bytes = 0;
  L2Flusher() {
    int dev = 0, l2 = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    bytes = static_cast<size_t>(l2) * 2 / 16 * 16;
    blocks = std::max(sms, 1) * 8;
    if (bytes) {
      ok(cudaMalloc(&buf, bytes + 16), "L2 flush buffer");
      ok(cudaMemset(buf, 0, bytes + 16), "L2 flush buffer");
    }
  }
  ~L2Flusher() { cudaFree(buf); }
  void flush(cudaStream_t s) {
    if (!buf) return;
    auto* words = static_cast<const uint4*>(buf);
    l2_flush_read_kernel<<<blocks, 256, 0, s>>>(words, bytes / 16,
                                                static_cast<uint4*>(buf) + bytes / 16);
  }
  int blocks = 0;
};
}  // namespace

double cuda_time_ms(const Context& ctx, int warmup, int iters, const std::function<void()>& fn) {
  static L2Flusher flusher;
  cudaStream_t s = static_cast<cudaStream_t>(ctx.cuda_stream);
  for (int i = 0; i < warmup; ++i) fn();
  ok(cudaStreamSynchronize(s), "warm-up");
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) ok(cudaEventCreate(&e), "event");
  for (int i = 0; i < iters; ++i) {
    flusher.flush(s);
    ok(cudaEventRecord(ev[2 * i], s), "record");
    fn();
    ok(cudaEventRecord(ev[2 * i + 1], s), "record");
  }
  ok(cudaStreamSynchronize(s), "timed runs");
  std::vector<float> t(iters);
  for (int i = 0; i < iters; ++i) ok(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]), "elapsed");
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[iters / 2];
}

// out(M, N) bf16 = a(M, K) bf16 · b(N, K)ᵀ bf16 (+ bias(N)), fp32 accumulation: the layout of a
// linear layer (row-major activations, weights (out, in)).
double cuda_bf16_gemm_ms(const Env& env, int64_t m, int64_t n, int64_t k, bool bias) {
  cudaStream_t s = static_cast<cudaStream_t>(env.ctx.cuda_stream);
  DeviceTensor a = make_tensor(Device::cuda, DType::bf16, {m, k}, 1);
  DeviceTensor b = make_tensor(Device::cuda, DType::bf16, {n, k}, 2);
  DeviceTensor c = make_empty(Device::cuda, DType::bf16, {m, n});
  DeviceTensor bv = make_tensor(Device::cuda, DType::bf16, {n}, 3);
  cublasLtHandle_t lt;
  ok(cublasLtCreate(&lt), "cublasLtCreate");
  cublasLtMatmulDesc_t op;
  ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  // Column-major view: C^T(N, M) = B(N, K) · A^T(K, M): transa = T on B stored (K, N) col-major.
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  if (bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const void* bp = bv.view.data;
    ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue");
    ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)), "bias");
  }
  cublasLtMatrixLayout_t la, lb, lc;
  ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k), "layout B");
  ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k), "layout A");
  ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, m, n), "layout C");
  size_t ws_bytes = 64 << 20;
  void* ws = device_alloc(ws_bytes);
  cublasLtMatmulPreference_t pref;
  ok(cublasLtMatmulPreferenceCreate(&pref), "pref");
  ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                          sizeof(ws_bytes)), "pref ws");
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  ok(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found), "heuristic");
  float alpha = 1.f, beta = 0.f;
  double ms = 0;
  if (found > 0) {
    ms = env.time_ms([&] {
      ok(cublasLtMatmul(lt, op, &alpha, b.view.data, la, a.view.data, lb, &beta, c.view.data, lc,
                        c.view.data, lc, &heur.algo, ws, ws_bytes, s), "matmul");
    });
  }
  cublasLtMatmulPreferenceDestroy(pref);
  device_free(ws);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  return ms;
}

void launch_empty_kernel(const Context& ctx, bool pdl) {
  // The library's own launcher (cudaLaunchKernelEx with the PDL attribute, or <<<>>>).
  cuda::launch_maybe_pdl(pdl, empty_kernel, dim3(1), dim3(32), 0,
                         static_cast<cudaStream_t>(ctx.cuda_stream));
  ok(cudaGetLastError(), "empty kernel launch");
}

}  // namespace bench
}  // namespace lowbit
