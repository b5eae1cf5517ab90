// Shared by the two INT8 attention kernels (SPEC §2): the launch parameters, the scale-layout
// index rule of SPEC §1, the causal visibility rule and the small conversions both kernels use.
// attention.cu holds the mma.sync kernel (sm_89/sm_90) and the host entry; attention_wgmma.cu the
// sm_90a wgmma kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "lowbit/dtype.h"
#include "lowbit/tensor.h"

namespace lowbit {
namespace cuda {
namespace attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2_448 = 8.807354922057604f;

struct AttnParams {
  const int8_t* q;  // (B, Nq, Hq, D) int8
  int64_t q_sb, q_sn, q_sh;
  const float* q_scale;  // (B, Hq, S)
  int64_t qs_sb, qs_sh, qs_ss;
  int q_layout, q_block;
  const int8_t* k;  // (B, Nkv, Hkv, D) int8
  int64_t k_sb, k_sn, k_sh;
  const float* k_scale;  // (B, Hkv, S)
  int64_t ks_sb, ks_sh, ks_ss;
  int k_layout, k_block;
  const void* v;             // fp8: (B, Hkv, D, npad) e4m3; 16-bit: (B, Nkv, Hkv, D)
  int64_t v_sb, v_sn, v_sh;  // 16-bit mode strides (elements)
  int64_t npad;
  const float* v_scale;  // (B, Hkv, D) or null (16-bit)
  const float* v_mean;   // (B, Hkv, D) or null
  const float* k_mean;   // (B, Hkv, D) or null
  void* out;             // (B, Nq, Hq, D) 16-bit
  int64_t o_sb, o_sn, o_sh;
  float* lse;  // (B, Hq, Nq) or null
  int64_t l_sb, l_sh, l_sn;
  int Nq, Nkv, Hq, Hkv, G;
  int causal;  // 0 none; else keys j < i + shift + 1 are visible
  int64_t shift;
  float scale_log2, sm_scale;
};

// SPEC §1 scale index of `row` (layout: 0 per_block, 1 thread_q, 2 thread_k, 3 warp_q).
__device__ __forceinline__ int64_t scale_index_dev(int layout, int block, int64_t row) {
  const int64_t r = row % block;
  int64_t group = 0, groups = 1;
  if (layout == 1) {
    group = r % 8;
    groups = 8;
  } else if (layout == 2) {
    group = (r % 8) / 2;
    groups = 4;
  } else if (layout == 3) {
    group = r / 32;
    groups = 4;
  }
  return (row / block) * groups + group;
}

// One past the last key query `row` sees (clamped to [0, Nkv]).
__device__ __forceinline__ int64_t visible_end(const AttnParams& p, int64_t row) {
  if (!p.causal) return p.Nkv;
  int64_t e = row + p.shift + 1;
  return e < 0 ? 0 : (e > p.Nkv ? p.Nkv : e);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Four e4m3 codes (round to nearest even, saturating) of x0..x3, x0 in the low byte.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
#else
  return static_cast<uint32_t>(dt::f32_to_e4m3(x0)) | (uint32_t{dt::f32_to_e4m3(x1)} << 8) |
         (uint32_t{dt::f32_to_e4m3(x2)} << 16) | (uint32_t{dt::f32_to_e4m3(x3)} << 24);
#endif
}

template <typename T16>
__device__ __forceinline__ uint32_t pack_16x2(float lo, float hi) {
  if constexpr (std::is_same<T16, __nv_bfloat16>::value) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <typename T16>
__device__ __forceinline__ float to_f32(T16 x) {
  if constexpr (std::is_same<T16, __nv_bfloat16>::value)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

// ---- the sm_90a wgmma kernel (attention_wgmma.cu) ---------------------------------------------

// True when the current device runs the wgmma kernel: sm_90 with the sm_90a image present.
bool wgmma_attention_available();
// Whether the wgmma kernel covers head dim D (64 or 128; both P·V modes).
inline bool wgmma_attention_applies(int D) { return D == 64 || D == 128; }
// The sm_90a kernels: round1 (two warpgroups, cp.async double buffer; 16-bit P·V always runs
// it) and round3 (fp8 P·V: a producer warpgroup feeding a 5-stage K/V ring on mbarriers, TMA at
// D = 128, two ping-pong consumer warpgroups with few instructions per logit). (Round 2 `ws`,
// rounds 4 and 5 and the biased-logit twins: removed in session 8, all slower than
// round3_i2fp_no_turn.)
enum class WgmmaKernel {
  round1,
  round3,
  // round 3 + I2FP logits without the consumers' ping-pong turns (same bits as round 3; bf16
  // output with per-half k scales, and the TMA producer at D = 128, else round 3): auto at
  // D = 128 since H200 run 10
  round3_i2fp_no_turn,
  // round3_i2fp_no_turn with three consumer warpgroups (192 query rows per CTA) at D = 64, fed
  // by a TMA producer warp (setmaxnreg 24; Q and K in 64-byte rows, 64-byte swizzle) with the
  // consumers at 160 registers; same bits; bf16 output with per-half k scales, else (and at
  // D = 128) round3_i2fp_no_turn / round 3; bench knob cons3. auto at D = 64 since H200 run 16
  round3_i2fp_no_turn_c3
};
// Launches a wgmma kernel. B batches; D 64 or 128; fp8 or 16-bit P·V; out bf16 or f16 (the
// 16-bit V has out's dtype).
void launch_attention_wgmma(const AttnParams& p, int B, int D, bool fp8, DType out_dtype,
                            WgmmaKernel which, cudaStream_t stream);

}  // namespace attn
}  // namespace cuda
}  // namespace lowbit
