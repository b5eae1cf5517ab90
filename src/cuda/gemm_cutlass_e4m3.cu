// e4m3 x e4m3 GEMM with the fused scale/bias epilogue on sm_90a through CUTLASS 3.x (SPEC §3.5):
// convrotfp8's prefill GEMM on the H200 when the CUTLASS headers were found at configure time
// (LOWBIT_HAVE_CUTLASS); otherwise the stubs below refuse and cuBLASLt (gemm_fp8_lt.cu) runs.
//
//   out(M, N) = out_dtype( ((A(M, K) · B(N, K)ᵀ · a_scale[m]) · w_scale[n]) + bias[n] )
//
// The configuration and epilogue are the int8 kernel's (gemm_cutlass_s8.cuh): TMA warp-specialized
// cooperative mainloop, CTA tile 256 x 128 x 128 bytes, cluster 1 x 2 (the A tile multicast), the
// same four-input epilogue visitor node. The accumulator is fp32 with CUTLASS's default fp8
// mainloop (partial sums promoted into fp32 registers every k-block, as cuBLASLt does without its
// fast-accumulation flag), so results match the CPU oracle within the fp8 tolerance, not bitwise
// (the summation order differs from the CPU's and from cuBLASLt's).
#ifndef NDEBUG  // before any header: see gemm_cutlass_s8.cuh
#define NDEBUG
#endif
#include <cstdint>

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
using Tile = cute::Shape<cute::_256, cute::_128, cute::_128>;
using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
using E4m3Bf16 = cutlass_s8::Config<cutlass::bfloat16_t, Tile, Cluster, cutlass::float_e4m3_t>;
using E4m3F16 = cutlass_s8::Config<cutlass::half_t, Tile, Cluster, cutlass::float_e4m3_t>;
}  // namespace

bool cutlass_e4m3_fits(const GemmParams& p) { return cutlass_s8::fits(p, GemmKind::e4m3); }

size_t cutlass_e4m3_scratch_bytes(const GemmParams& p) {
  return (static_cast<size_t>(p.N) * 4 + 255) / 256 * 256 +
         cutlass_s8::workspace_for<E4m3Bf16, E4m3F16>(p);
}

bool gemm_cutlass_e4m3(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!cutlass_e4m3_fits(p)) return false;
  return cutlass_s8::launch<E4m3Bf16, E4m3F16>(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

bool cutlass_e4m3_fits(const GemmParams&) { return false; }
size_t cutlass_e4m3_scratch_bytes(const GemmParams&) { return 0; }
bool gemm_cutlass_e4m3(const GemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
