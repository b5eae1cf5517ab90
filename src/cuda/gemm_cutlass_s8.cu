// int8 GEMM with the fused scale/bias epilogue on sm_90a through CUTLASS 3.x (SPEC §3.5): the
// prefill path of the int8-grid qtypes on the H200 when the CUTLASS headers were found at
// configure time (LOWBIT_HAVE_CUTLASS); otherwise this file only defines the "not available" stubs
// and the hand-written wgmma / mma.sync kernels run.
//
//   out(M, N) = out_dtype( ((float(A(M, K) · B(N, K)ᵀ) · a_scale[m]) · w_scale[n]) + bias[n] )
//
// Mainloop: TMA warp-specialized cooperative kernel (one producer warp, two consumer warpgroups of
// 64 x 256 each), CTA tile 128 x 256 x 128 bytes, cluster 2 x 1 (the B tile is multicast to the
// two CTAs of a cluster), stage count from the shared memory left after the epilogue, persistent
// tile scheduler. int32 accumulation is exact, so the sums equal every other path's.
// Epilogue: an epilogue visitor tree with ONE compute node of four inputs (the accumulator, the
// per-token scale broadcast along columns, the per-channel scale and the bias broadcast along
// rows), evaluated with __fmul_rn / __fadd_rn (no FMA contraction) in the CPU oracle's order, then
// one round-to-nearest conversion to the output dtype (stored through TMA): the output bits equal
// apply_epilogue's. A null scale multiplies by 1 (exact); a null bias adds -0.0 (the additive
// identity, so -0.0 results stay -0.0 as on the CPU, which skips the addition).
//
// Instantiations (compile time: CI has two cores): output bf16 and f16, bias always fp32 (other
// bias dtypes are converted into an fp32 temporary first, exact). Other output dtypes and shapes
// TMA cannot address (K or row strides not 16-byte multiples) take the older kernels.
//
// Self-check: the first use on each device runs this kernel and the mma.sync kernel (same
// epilogue) on a small odd-sized random problem and compares the output bits; any difference or
// launch error sends the device to the older kernels for the rest of the process.
#ifndef NDEBUG  // before any header: see gemm_cutlass_s8.cuh
#define NDEBUG
#endif
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"

#if defined(LOWBIT_HAVE_CUTLASS)
#include "src/cuda/gemm_cutlass_s8.cuh"
#endif

namespace lowbit {
namespace cuda {
namespace linear {

#if defined(LOWBIT_HAVE_CUTLASS)

namespace {

using namespace cutlass_s8;
using Bf16 = Config<cutlass::bfloat16_t, cute::Shape<cute::_128, cute::_256, cute::_128>,
                    cute::Shape<cute::_2, cute::_1, cute::_1>>;
using F16 = Config<cutlass::half_t, cute::Shape<cute::_128, cute::_256, cute::_128>,
                   cute::Shape<cute::_2, cute::_1, cute::_1>>;

__global__ void fill_hash_s8_kernel(int8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u + seed * 97u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = static_cast<int8_t>(static_cast<int>(h % 255u) - 127);
  }
}
__global__ void fill_scales_kernel(float* p, int64_t n, float base) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = base * (1.f + static_cast<float>((i * 37) % 101) / 64.f);
}

// This kernel and the mma.sync kernel on a 203 x 264 x 1040 problem with scales and a bf16 bias:
// the output bits must agree.
bool self_check(cudaStream_t stream) {
  const int64_t M = 203, N = 264, K = 1040;
  int8_t *a = nullptr, *b = nullptr;
  float *as = nullptr, *ws = nullptr, *bias = nullptr;
  uint16_t *o0 = nullptr, *o1 = nullptr;
  void* scratch = nullptr;
  GemmParams g;
  g.kind = GemmKind::s8;
  g.lda = K;
  g.ldb = K;
  g.M = M;
  g.N = N;
  g.K = K;
  g.ldo = N;
  g.bias_dtype = DType::f32;
  g.out_dtype = DType::bf16;
  bool ok = cudaMalloc(&a, M * K) == cudaSuccess && cudaMalloc(&b, N * K) == cudaSuccess &&
            cudaMalloc(&as, M * 4) == cudaSuccess && cudaMalloc(&ws, N * 4) == cudaSuccess &&
            cudaMalloc(&bias, N * 4) == cudaSuccess && cudaMalloc(&o0, M * N * 2) == cudaSuccess &&
            cudaMalloc(&o1, M * N * 2) == cudaSuccess;
  if (ok) {
    g.a = a;
    g.b = b;
    const size_t scratch_bytes = static_cast<size_t>(N) * 4 + 256 + workspace_for<Bf16, F16>(g);
    ok = cudaMalloc(&scratch, scratch_bytes) == cudaSuccess;
  }
  if (ok) {
    fill_hash_s8_kernel<<<64, 256, 0, stream>>>(a, M * K, 11u);
    fill_hash_s8_kernel<<<64, 256, 0, stream>>>(b, N * K, 12u);
    fill_scales_kernel<<<1, 256, 0, stream>>>(as, M, 1.f / 127.f);
    fill_scales_kernel<<<2, 256, 0, stream>>>(ws, N, 3e-3f);
    fill_scales_kernel<<<2, 256, 0, stream>>>(bias, N, -0.37f);
    g.a_scale = as;
    g.w_scale = ws;
    g.bias = bias;
    g.out = o0;
    gemm(g, stream);  // mma.sync, the reference
    g.out = o1;
    ok = launch<Bf16, F16>(g, scratch, stream);
  }
  if (ok) {
    std::vector<uint16_t> h0(M * N), h1(M * N);
    ok = cudaMemcpyAsync(h0.data(), o0, M * N * 2, cudaMemcpyDeviceToHost, stream) ==
             cudaSuccess &&
         cudaMemcpyAsync(h1.data(), o1, M * N * 2, cudaMemcpyDeviceToHost, stream) ==
             cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess && h0 == h1;
  }
  for (void* ptr : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(as),
                    static_cast<void*>(ws), static_cast<void*>(bias), static_cast<void*>(o0),
                    static_cast<void*>(o1), scratch})
    cudaFree(ptr);
  cudaGetLastError();  // a failed check leaves no sticky launch error behind
  return ok;
}

}  // namespace

bool cutlass_s8_available(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<int, bool> verdict;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  std::lock_guard<std::mutex> lock(mu);
  auto it = verdict.find(dev);
  if (it != verdict.end()) return it->second;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  cudaFuncAttributes attr{};
  bool ok = major == 9 && minor == 0 &&
            cudaFuncGetAttributes(
                &attr, cutlass::device_kernel<Bf16::Kernel>) ==
                cudaSuccess &&
            attr.binaryVersion == 90;
  if (ok) ok = self_check(stream);
  cudaGetLastError();
  verdict[dev] = ok;
  return ok;
}

bool cutlass_s8_fits(const GemmParams& p) { return fits(p); }

size_t cutlass_s8_scratch_bytes(const GemmParams& p) {
  return (static_cast<size_t>(p.N) * 4 + 255) / 256 * 256 + workspace_for<Bf16, F16>(p);
}

bool gemm_cutlass_s8(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!fits(p)) return false;
  return launch<Bf16, F16>(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

bool cutlass_s8_available(cudaStream_t) { return false; }
bool cutlass_s8_fits(const GemmParams&) { return false; }
size_t cutlass_s8_scratch_bytes(const GemmParams&) { return 0; }
bool gemm_cutlass_s8(const GemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
