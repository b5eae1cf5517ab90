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
// Device-side asserts compile to calls, and a call inside the mainloop serializes the wgmma
// pipeline (ptxas C7510): CUTLASS is built with its asserts off, whatever the build type.
#ifndef NDEBUG
#define NDEBUG
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"

#if defined(LOWBIT_HAVE_CUTLASS)
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#endif

namespace lowbit {
namespace cuda {
namespace linear {

#if defined(LOWBIT_HAVE_CUTLASS)

namespace {

// ((acc · a) · w) + b on a fragment, each operation rounded (the CPU oracle's fp32 order).
template <class T>
struct ScaleScaleBiasRn;
template <int N>
struct ScaleScaleBiasRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& acc,
                                                     cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& w,
                                                     cutlass::Array<float, N> const& b) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fadd_rn(__fmul_rn(__fmul_rn(acc[i], a[i]), w[i]), b[i]);
    return r;
  }
};

using namespace cute;

template <class ElementOut>
struct Config {
  using TileShape = Shape<_128, _256, _128>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // (M) per-token scales, loaded one element at a time (alignment 1: no vector load may reach
  // past a_scale[M - 1] when M is odd).
  using AScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                             Stride<_1, _0, _0>, 1>;
  using WScale = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float>;  // (N)
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float>;    // (N)
  using Evt = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<ScaleScaleBiasRn, ElementOut, float, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, AScale, WScale, Bias>;

  static constexpr int kAlignOut = 16 / sizeof(ElementOut);
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void,
      cutlass::layout::RowMajor, kAlignOut, ElementOut, cutlass::layout::RowMajor, kAlignOut,
      EpilogueSchedule, Evt>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16,
      int8_t, cutlass::layout::ColumnMajor, 16, int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

__global__ void bias_to_f32_kernel(const void* in, DType dt, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (dt == DType::bf16) {
    out[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(in)[i]);
  } else if (dt == DType::f16) {
    out[i] = __half2float(static_cast<const __half*>(in)[i]);
  } else {
    out[i] = static_cast<const float*>(in)[i];
  }
}

template <class ElementOut>
typename Config<ElementOut>::Gemm::Arguments make_args(const GemmParams& p, const float* bias) {
  using C = Config<ElementOut>;
  using Kernel = typename C::Kernel;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;
  const int M = static_cast<int>(p.M), N = static_cast<int>(p.N), K = static_cast<int>(p.K);
  // Row-major (M, K) A, (N, K) B (K-contiguous "column-major" B), row-major (M, N) out.
  StrideA sa{};
  get<0>(sa) = p.lda;
  StrideB sb{};
  get<0>(sb) = p.ldb;
  StrideD sd{};
  get<0>(sd) = p.ldo;
  StrideC sc{};
  get<0>(sc) = p.ldo;
  typename C::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = make_shape(M, N, K, 1);
  args.mainloop.ptr_A = static_cast<const int8_t*>(p.a);
  args.mainloop.dA = sa;
  args.mainloop.ptr_B = static_cast<const int8_t*>(p.b);
  args.mainloop.dB = sb;
  auto& t = args.epilogue.thread;
  // Children in order: accumulator, a_scale (M), w_scale (N), bias (N); then the compute node.
  get<1>(t).ptr_col = p.a_scale;
  get<1>(t).null_default = 1.f;
  get<2>(t).ptr_row = p.w_scale;
  get<2>(t).null_default = 1.f;
  get<3>(t).ptr_row = bias;
  get<3>(t).null_default = -0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = sc;
  args.epilogue.ptr_D = static_cast<ElementOut*>(p.out);
  args.epilogue.dD = sd;
  return args;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Shapes and pointers this kernel addresses (TMA: 16-byte aligned bases and row strides).
bool fits(const GemmParams& p) {
  if (p.kind != GemmKind::s8 || p.acc_out || p.w_tensor_scale) return false;
  if (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16) return false;
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return false;
  if (p.M > INT32_MAX || p.N > INT32_MAX || p.K > INT32_MAX) return false;
  if (p.K % 16 || p.lda % 16 || p.ldb % 16 || p.ldo % 8 || p.N % 8) return false;
  return aligned16(p.a) && aligned16(p.b) && aligned16(p.out) && aligned16(p.a_scale) &&
         aligned16(p.w_scale);
}

template <class ElementOut>
size_t workspace_bytes_of(const GemmParams& p) {
  return Config<ElementOut>::Gemm::get_workspace_size(make_args<ElementOut>(p, nullptr));
}

template <class ElementOut>
bool run(const GemmParams& p, const float* bias, void* workspace, cudaStream_t stream) {
  typename Config<ElementOut>::Gemm gemm;
  auto args = make_args<ElementOut>(p, bias);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return false;
  return gemm.run(stream) == cutlass::Status::kSuccess;
}

// Workspace of the largest request we make: the tile scheduler's needs do not depend on M, N, K
// for a plain (not split-K / stream-K) GEMM, but query it per call anyway and round up.
size_t workspace_for(const GemmParams& p) {
  return p.out_dtype == DType::f16 ? workspace_bytes_of<cutlass::half_t>(p)
                                   : workspace_bytes_of<cutlass::bfloat16_t>(p);
}

// Launches on `stream`; returns false (nothing launched) when CUTLASS refuses the arguments.
// `scratch` holds at least N fp32 (the converted bias) + the workspace, 256-byte aligned.
bool launch(const GemmParams& p, void* scratch, cudaStream_t stream) {
  char* base = static_cast<char*>(scratch);
  const float* bias = nullptr;
  size_t off = 0;
  if (p.bias) {
    if (p.bias_dtype == DType::f32 && aligned16(p.bias)) {
      bias = static_cast<const float*>(p.bias);
    } else {
      float* b32 = reinterpret_cast<float*>(base);
      bias_to_f32_kernel<<<static_cast<unsigned>((p.N + 255) / 256), 256, 0, stream>>>(
          p.bias, p.bias_dtype, p.N, b32);
      bias = b32;
    }
    off = (static_cast<size_t>(p.N) * 4 + 255) / 256 * 256;
  }
  void* ws = base + off;
  return p.out_dtype == DType::f16 ? run<cutlass::half_t>(p, bias, ws, stream)
                                   : run<cutlass::bfloat16_t>(p, bias, ws, stream);
}

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
    const size_t scratch_bytes = static_cast<size_t>(N) * 4 + 256 + workspace_for(g);
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
    ok = launch(g, scratch, stream);
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
                &attr, cutlass::device_kernel<Config<cutlass::bfloat16_t>::Kernel>) ==
                cudaSuccess &&
            attr.binaryVersion == 90;
  if (ok) ok = self_check(stream);
  cudaGetLastError();
  verdict[dev] = ok;
  return ok;
}

bool cutlass_s8_fits(const GemmParams& p) { return fits(p); }

size_t cutlass_s8_scratch_bytes(const GemmParams& p) {
  return (static_cast<size_t>(p.N) * 4 + 255) / 256 * 256 + workspace_for(p);
}

bool gemm_cutlass_s8(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!fits(p)) return false;
  return launch(p, scratch, stream);
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
