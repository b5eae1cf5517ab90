// The second CUTLASS int8 GEMM configuration, for tuning on the H200: CTA tile 256 x 128 x 128
// bytes, cluster 1 x 2 (the A tile multicast), cooperative, bf16 output only. Same epilogue and
// same output bits as gemm_cutlass_s8.cu (gemm_cutlass_s8.cuh); not used by the layer yet: the
// `linear.gemm` bench rows time both so the faster one can become the default per shape.
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
using Alt = cutlass_s8::Config<cutlass::bfloat16_t, cute::Shape<cute::_256, cute::_128, cute::_128>,
                               cute::Shape<cute::_1, cute::_2, cute::_1>>;
}  // namespace

size_t cutlass_s8_alt_scratch_bytes(const GemmParams& p) {
  return (static_cast<size_t>(p.N) * 4 + 255) / 256 * 256 +
         cutlass_s8::workspace_for<Alt, void>(p);
}

bool gemm_cutlass_s8_alt(const GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!cutlass_s8::fits(p) || p.out_dtype != DType::bf16) return false;
  return cutlass_s8::launch<Alt, void>(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

size_t cutlass_s8_alt_scratch_bytes(const GemmParams&) { return 0; }
bool gemm_cutlass_s8_alt(const GemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
