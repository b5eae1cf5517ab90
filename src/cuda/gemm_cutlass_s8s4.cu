// The comfy W4A4 prefill GEMM without an unpacked weight (session 36): CUTLASS's sm_90 mixed-input
// mainloop on the checkpoint's own int4 codes. ComfyUI's convrot_w4a4 weight is (N, K/2) bytes of
// two's-complement 4-bit codes, the even column in the low nibble, one fp32 scale per row (SPEC
// §3.7) — exactly CUTLASS's K-major `int4b_t` packing — so the mainloop converts each stage's
// codes to int8 in registers (NumericArrayConverter<int8_t, int4b_t>, DirectConvert: no scale
// in the mainloop) and runs int8 wgmma with int32 accumulation: the same sums as the int8 GEMM on
// the unpacked weight, exact in any order.
//
// CUTLASS passes the narrow operand through the register file as wgmma's A, so the GEMM runs
// transposed: A = the weight (N, K) int4, B = the activation codes (M, K) int8 (column-major
// K x M), D = out^T (N, M) column-major, i.e. out (M, N) row-major with row stride ldo. The
// epilogue is gemm_cutlass_s8.cuh's compute node (((acc · a_scale) · w_scale) + bias, each
// rounded) with the broadcasts swapped: a_scale along D's columns, w_scale and bias along its
// rows: the output bits equal apply_epilogue's, as the other CUTLASS configurations'.
//
// CTA tile 128 weight rows x 128 activation rows x 128 K, no cluster, cooperative (two consumer
// warpgroups of 64 weight rows), CUTLASS's stream-K tile scheduler (at 64-512 rows of 5120 ->
// 13824 there are 108-432 output tiles for 132 SMs); from WeightAGemmParams::wide_min_m rows 128 x 256
// (each converted weight fragment feeds twice the activation rows), up to small_max_m rows
// 128 x 64 (session 37; gemm_cutlass_mixed.cuh). bf16 and f16 output.
#ifndef NDEBUG  // before any header: see gemm_cutlass_s8.cuh
#define NDEBUG
#endif
#include <cstdint>

#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"

#if defined(LOWBIT_HAVE_CUTLASS)
#include "src/cuda/gemm_cutlass_mixed.cuh"
#endif

namespace lowbit {
namespace cuda {
namespace linear {

#if defined(LOWBIT_HAVE_CUTLASS)

namespace {

using namespace cute;

template <class Out>
using S4Narrow = cutlass_s8::WeightAConfig<cutlass::int4b_t, Shape<_128, _128, _128>, Out>;
template <class Out>
using S4Wide = cutlass_s8::WeightAConfig<cutlass::int4b_t, Shape<_128, _256, _128>, Out>;
template <class Out>
using S4Small = cutlass_s8::WeightAConfig<cutlass::int4b_t, Shape<_128, _64, _128>, Out>;

bool s4_fits(const WeightAGemmParams& p) { return cutlass_s8::weight_a_fits(p, 2); }
using S4 = cutlass_s8::WeightAEntry<S4Small, S4Narrow, S4Wide, s4_fits>;

}  // namespace

bool cutlass_s8s4_applies(const WeightAGemmParams& p) { return S4::applies(p); }
size_t cutlass_s8s4_scratch_bytes(const WeightAGemmParams& p) { return S4::scratch_bytes(p); }
bool gemm_cutlass_s8s4(const WeightAGemmParams& p, void* scratch, cudaStream_t stream) {
  return S4::run(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

bool cutlass_s8s4_applies(const WeightAGemmParams&) { return false; }
size_t cutlass_s8s4_scratch_bytes(const WeightAGemmParams&) { return 0; }
bool gemm_cutlass_s8s4(const WeightAGemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
