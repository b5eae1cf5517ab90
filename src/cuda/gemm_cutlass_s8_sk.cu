// The third CUTLASS int8 GEMM configuration (session 35): CTA tile 128 x 128 x 128 bytes, no
// cluster, cooperative, CUTLASS's stream-K tile scheduler, bf16 output only (one more CUTLASS
// instantiation is minutes of CI's two cores; f16 keeps the other configurations). For the M
// between decode and prefill (batched decode, chunked prefill, 17 <= M < ~1024) the other two
// configurations leave most SMs idle: at 64 x 5120 -> 13824 the 128 x 256 tile with its 2 x 1
// cluster is 54 busy CTAs streaming the weight, at 256 x 14336 -> 4096 32 (H200, session 35's
// linear.layer.midm: convrot8 0.77-1.01x and 0.57x cuBLASLt bf16). Stream-K gives each SM an
// equal share of the (tile, K block) iterations; a tile split over several CTAs adds their int32
// partial sums in the workspace (exact in any order), and one CTA applies the epilogue: the same
// output bits as the other configurations (gemm_cutlass_s8.cuh's epilogue).
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
using SkTile = cute::Shape<cute::_128, cute::_128, cute::_128>;
using SkCluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
using SkBf16 =
    cutlass_s8::Config<cutlass::bfloat16_t, SkTile, SkCluster, cutlass::gemm::StreamKScheduler>;
// (f16 output since session 60)
using SkF16 =
    cutlass_s8::Config<cutlass::half_t, SkTile, SkCluster, cutlass::gemm::StreamKScheduler>;
}  // namespace

size_t cutlass_s8_sk_scratch_bytes(const GemmParams& p) {
  return cutlass_s8::scratch_for<SkBf16, SkF16>(p);
}

bool gemm_cutlass_s8_sk(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!cutlass_s8::fits(p) || (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16))
    return false;
  return cutlass_s8::launch<SkBf16, SkF16>(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

size_t cutlass_s8_sk_scratch_bytes(const GemmParams&) { return 0; }
bool gemm_cutlass_s8_sk(const GemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
