// The int8 GEMM transposed for few activation rows (session 36): convrot8 at 16 < M <= 64 (batched
// decode). The other CUTLASS configurations put the activation rows on the 128-row side of the
// tile, so at M 32 each stage carries a 16 KB activation box that is three quarters padding and
// only ~6 stages of weight fit in shared memory; Nsight Compute at 32 x 5120 -> 13824 (session
// 36): DRAM 46 % of peak, the consumers 53 % of their samples waiting for a stage. Here the weight
// is A (128 rows of the tile) and the activation codes B (64 columns), gemm_cutlass_s8.cuh's
// WeightAConfig: 24 KB per stage, more of them in flight; the same int32 sums and epilogue, the
// same output bits. bf16 output, and f16 since session 60.
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
using TTile = cute::Shape<cute::_128, cute::_64, cute::_128>;
using TBf16 = cutlass_s8::WeightAConfig<int8_t, TTile, cutlass::bfloat16_t>;
using TF16 = cutlass_s8::WeightAConfig<int8_t, TTile, cutlass::half_t>;

bool t_fits(const WeightAGemmParams& p) {
  return (p.out_dtype == DType::bf16 || p.out_dtype == DType::f16) &&
         cutlass_s8::weight_a_fits(p, 1);
}
}  // namespace

bool cutlass_s8_t_applies(const WeightAGemmParams& p) {
  return t_fits(p) &&
         sm90a_image_loaded(reinterpret_cast<const void*>(cutlass::device_kernel<TBf16::Kernel>));
}

size_t cutlass_s8_t_scratch_bytes(const WeightAGemmParams& p) {
  if (!t_fits(p)) return 0;
  return p.out_dtype == DType::f16 ? cutlass_s8::weight_a_scratch_bytes<TF16>(p)
                                   : cutlass_s8::weight_a_scratch_bytes<TBf16>(p);
}

bool gemm_cutlass_s8_t(const WeightAGemmParams& p, void* scratch, cudaStream_t stream) {
  if (!cutlass_s8_t_applies(p)) return false;
  return p.out_dtype == DType::f16 ? cutlass_s8::weight_a_launch<TF16>(p, scratch, stream)
                                   : cutlass_s8::weight_a_launch<TBf16>(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

bool cutlass_s8_t_applies(const WeightAGemmParams&) { return false; }
size_t cutlass_s8_t_scratch_bytes(const WeightAGemmParams&) { return 0; }
bool gemm_cutlass_s8_t(const WeightAGemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
