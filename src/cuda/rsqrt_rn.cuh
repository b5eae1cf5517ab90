// The RMSNorm's 1 / sqrt(s), correctly rounded (SPEC §1: the CUDA and CPU backends agree to the
// bit), in fewer instructions than libdevice's __frsqrt_rn for the values a norm meets.
#pragma once

#include <cstdint>

namespace lowbit {
namespace cuda {

// Bit patterns of the direct path's range [2^-100, 2^100): there MUFU.RSQ's estimate y, the
// residual e = 1 - s y^2 (y^2 as a product and its exact fma error, so every term is a normal
// float) and the correction y + (y e)(1/2 + 3/8 e) are __frsqrt_rn's own steps without its range
// reduction to [1/2, 2) and the exponent put back (s scaled by 4^k scales each step exactly by a
// power of two, and nothing overflows or goes subnormal in this range): ~12 instructions instead
// of ~21. Outside it (subnormal, huge, zero, inf, NaN, negative) libdevice's own routine runs.
// The same bits as __frsqrt_rn for every float: tests/gpu/rsqrt_exhaustive.cu checks all 2^32
// patterns on a GPU; the harness's `prologue.rsqrt` cases check it against the CPU oracle.
constexpr uint32_t kRsqrtDirectLo = 0x0d800000u;  // 2^-100
constexpr uint32_t kRsqrtDirectHi = 0x71800000u;  // 2^100

// The direct path's steps on any s (its value means something only where rsqrt_direct_ok(s)).
__device__ __forceinline__ float rsqrt_direct(float s) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(s));
  const float y2 = __fmul_rn(y, y);
  const float y2_err = __fmaf_rn(y, y, -y2);
  const float e = __fmaf_rn(y2_err, -s, __fmaf_rn(y2, -s, 1.f));
  return __fmaf_rn(__fmaf_rn(0.375f, e, 0.5f), __fmul_rn(y, e), y);
}
__device__ __forceinline__ bool rsqrt_direct_ok(float s) {
  return __float_as_uint(s) - kRsqrtDirectLo < kRsqrtDirectHi - kRsqrtDirectLo;
}

// The branch form, for the callers that take it (prologue.cu's kernels, v3_row's non-uniform
// form, norm_rsqrt_kernel). Session 31's v3_row (uniform) and v4_row_pair run rsqrt_direct
// unconditionally and let one rare branch rewrite the result instead (src/cuda/prologue_v3.cu).
// The range test is written out here rather than as rsqrt_direct_ok: with the bool in between,
// ptxas scheduled the prologue kernels differently (session 31, SASS compared).
__device__ __forceinline__ float norm_rsqrt(float s) {
  if (__float_as_uint(s) - kRsqrtDirectLo < kRsqrtDirectHi - kRsqrtDirectLo) {
    return rsqrt_direct(s);
  }
  return __frsqrt_rn(s);
}

}  // namespace cuda
}  // namespace lowbit
