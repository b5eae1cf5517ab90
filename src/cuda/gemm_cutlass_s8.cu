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
// Two tile configurations, bit-identical (int32 sums, the same epilogue): this file's 128 x 256
// cluster 2 x 1 for M < kTallMinM, and gemm_cutlass_s8_alt.cu's 256 x 128 cluster 1 x 2 (A tile
// multicast) for larger M: 1562 vs 1284 int8 TOPS at Wan 32768x5120->5120 on the H200, equal at
// Flux 4096x3072->12288 (round 1, docs/linear-gpu.md); and (session 35) gemm_cutlass_s8_sk.cu's
// 128 x 128 stream-K for bf16 / f16 output wherever the chosen one has fewer tiles than the GPU has
// SMs (use_stream_k). Availability is static (sm_90 and an sm_90a
// image of the kernel): no run-time self-check, so no first call synchronizes the caller's stream
// (the harness cases and the linear.gemm bench rows prove bit identity on the GPU).
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

using namespace cutlass_s8;
using Bf16 = Config<cutlass::bfloat16_t, cute::Shape<cute::_128, cute::_256, cute::_128>,
                    cute::Shape<cute::_2, cute::_1, cute::_1>>;
using F16 = Config<cutlass::half_t, cute::Shape<cute::_128, cute::_256, cute::_128>,
                   cute::Shape<cute::_2, cute::_1, cute::_1>>;

// M from which the 256 x 128 configuration runs (whole 256-row tiles are then the common case).
constexpr int64_t kTallMinM = 512;

}  // namespace

bool cutlass_s8_available(cudaStream_t) {
  return sm90a_image_loaded(reinterpret_cast<const void*>(cutlass::device_kernel<Bf16::Kernel>));
}

bool cutlass_s8_fits(const GemmParams& p) { return fits(p); }

size_t cutlass_s8_wide_scratch_bytes(const GemmParams& p) { return scratch_for<Bf16, F16>(p); }

bool gemm_cutlass_s8_wide(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!fits(p)) return false;
  return launch<Bf16, F16>(p, scratch, stream);
}

// Stream-K (gemm_cutlass_s8_sk.cu) where the shape's own configuration has fewer output tiles
// than the GPU has SMs (session 35: batched decode and chunked prefill shapes); bf16 output, and
// f16 since session 60.
static bool use_stream_k(const GemmParams& p) {
  if (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16) return false;
  const int64_t tiles = p.M >= kTallMinM ? ((p.M + 255) / 256) * ((p.N + 127) / 128)
                                         : ((p.M + 127) / 128) * ((p.N + 255) / 256);
  return tiles < multiprocessor_count();
}

size_t cutlass_s8_scratch_bytes(const GemmParams& p) {
  if (use_stream_k(p)) return cutlass_s8_sk_scratch_bytes(p);
  return p.M >= kTallMinM ? cutlass_s8_alt_scratch_bytes(p) : cutlass_s8_wide_scratch_bytes(p);
}

bool gemm_cutlass_s8(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (use_stream_k(p)) return gemm_cutlass_s8_sk(p, scratch, stream);
  return p.M >= kTallMinM ? gemm_cutlass_s8_alt(p, scratch, stream)
                          : gemm_cutlass_s8_wide(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

bool cutlass_s8_available(cudaStream_t) { return false; }
bool cutlass_s8_fits(const GemmParams&) { return false; }
size_t cutlass_s8_scratch_bytes(const GemmParams&) { return 0; }
bool gemm_cutlass_s8(const GemmParams&, void*, cudaStream_t) { return false; }
size_t cutlass_s8_wide_scratch_bytes(const GemmParams&) { return 0; }
bool gemm_cutlass_s8_wide(const GemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
