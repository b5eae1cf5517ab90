// The second CUTLASS int8 GEMM configuration: CTA tile 256 x 128 x 128 bytes, cluster 1 x 2 (the
// A tile multicast), cooperative, bf16 and f16 output. Same epilogue and same output bits as
// gemm_cutlass_s8.cu (gemm_cutlass_s8.cuh); gemm_cutlass_s8 runs it for M >= 512 (1562 vs 1284
// int8 TOPS at Wan 32768x5120->5120 on the H200, round 1). Its own translation unit so the two
// configurations compile in parallel.
#ifndef NDEBUG  // before any header: see gemm_cutlass_s8.cuh
#define NDEBUG
#endif
#include <cstdint>

#include "src/cuda/linear_kernels.cuh"

#if defined(LOWBIT_HAVE_CUTLASS)
#include "src/cuda/gemm_cutlass_s8.cuh"
#endif

namespace lowbit {
namespace cuda {
namespace linear {

#if defined(LOWBIT_HAVE_CUTLASS)

namespace {
using TallTile = cute::Shape<cute::_256, cute::_128, cute::_128>;
using TallCluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
using AltBf16 = cutlass_s8::Config<cutlass::bfloat16_t, TallTile, TallCluster>;
using AltF16 = cutlass_s8::Config<cutlass::half_t, TallTile, TallCluster>;
}  // namespace

size_t cutlass_s8_alt_scratch_bytes(const GemmParams& p) {
  return cutlass_s8::scratch_for<AltBf16, AltF16>(p);
}

bool gemm_cutlass_s8_alt(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!cutlass_s8::fits(p)) return false;
  return cutlass_s8::launch<AltBf16, AltF16>(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

size_t cutlass_s8_alt_scratch_bytes(const GemmParams&) { return 0; }
bool gemm_cutlass_s8_alt(const GemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
