// attention()'s q quantized inside the attention kernels (sessions 57-61): the consumer
// warpgroup's quantization of its 64 rows of 16-bit q into its swizzled Q rows, and the producer's
// L2 prefetch of the q rows of a CTA further on. Shared by the fp8 P·V round-3 kernels
// (attention_wgmma.cu, kVar bit 13) and the 16-bit P·V TMA-ring kernel (attention_wgmma256.cu,
// kQ16; session 61).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "src/cuda/attention_common.cuh"
#include "src/cuda/prologue_common.cuh"  // SPEC §1's codes
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace attn {

// Byte offset of 16-byte chunk `chunk` of row `row` in 128-byte rows under the 128-byte swizzle
// (chunk ^ row % 8): TMA's boxes and the cp.async loads of attention_wgmma.cu lay tiles this way.
__device__ __forceinline__ uint32_t swz128(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of 16-byte chunk `chunk` of int8 Q row `row` as TMA's boxes lay them: D = 128,
// swz128; D = 64, 64-byte rows in the 64-byte swizzle (chunk c of row r at c ^ ((r / 2) % 4)).
template <int D>
__device__ __forceinline__ uint32_t q16_swz(int row, int chunk) {
  if constexpr (D == 128) return swz128(row, chunk);
  return static_cast<uint32_t>(row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4));
}

// kVar bit 13 (session 57): a consumer's 64 query rows q0 .. q0 + 63 of 16-bit q (p.q16: bf16, or
// f16 since session 60; T16, the output's type) quantized
// into its Q rows by the consumer warpgroup, as attention()'s q pass would (SPEC §1, THREAD_Q
// groups of 32-row blocks: group r % 8 holds rows r, r + 8, r + 16, r + 24; no norm or rope):
// the maximum of |x| over the group, times |sm_scale|, div.full by 127 plus scale_eps, then the
// codes of x * sm_scale (quantize_fqs_n: the prologue kernels' codes). Thread i (< 128): group
// i / 8 (block i / 64), row (i % 8) / 2 of the group's four, the 8-channel chunks 2 k + i % 2
// (so that a lane pair reads 32 contiguous bytes, one sector, per load). Rows past Nq
// give codes 0 (TMA's zero fill) and no part of a maximum. The codes go to the 128-byte swizzled
// Q rows (D = 64, session 59: the 64-byte rows of the 64-byte swizzle); the scales
// through qs (16 floats) to the threads whose accumulator rows they scale
// (warp w's rows w 16 + lane / 4 and + 8: group lane / 4 of block w / 2), after named barrier
// `bar` over the warpgroup, which also publishes the codes to the wgmmas (async proxy).
template <int D, typename T16>
__device__ __forceinline__ float quantize_q16_rows(const AttnParams& p, int b, int h, int64_t q0,
                                                   uint32_t sq, float* qs, int i, int bar) {
  static_assert(D == 128 || D == 64, "Q rows of 128 (128-byte swizzle) or 64 bytes (64-byte)");
  constexpr int kVals = D / 2;  // channels per thread
  const int grp = i / 8, j = i % 8, odd = j % 2;
  const int r = (grp / 8) * 32 + grp % 8 + 8 * (j / 2);
  const int64_t row = q0 + r;
  float v[kVals];  // v[8 k + e]: channel 8 (2 k + odd) + e
  if (row < p.Nq) {
    const uint4* src =
        reinterpret_cast<const uint4*>(static_cast<const T16*>(p.q16) + b * p.q16_sb +
                                       row * p.q16_sn + h * p.q16_sh) +
        odd;
    uint4 x[kVals / 8];
#pragma unroll
    for (int k = 0; k < kVals / 8; ++k) x[k] = load_stream16(src + 2 * k);
#pragma unroll
    for (int k = 0; k < kVals / 8; ++k)
      unpack<std::is_same<T16, __nv_bfloat16>::value>(x[k], v + 8 * k);
  } else {
#pragma unroll
    for (int k = 0; k < kVals; ++k) v[k] = 0.f;
  }
  float m = fabsf(v[0]);
#pragma unroll
  for (int k = 1; k < kVals; ++k) m = max_nan(m, fabsf(v[k]));
#pragma unroll
  for (int x = 1; x < 8; x *= 2) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, x));
  m = __fmul_rn(m, fabsf(p.q16_sm_scale));
  const float scale = __fadd_rn(div_full(m, 127.f), p.q16_eps);
#pragma unroll
  for (int k = 0; k < kVals; ++k) v[k] = __fmul_rn(v[k], p.q16_sm_scale);
  uint32_t codes[kVals / 4];
  quantize_fqs_n<kVals, false>(v, scale, codes);
#pragma unroll
  for (int k = 0; k < kVals / 8; ++k)  // channels 16 k + 8 odd .. + 7: half of code chunk k
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(sq + q16_swz<D>(r, k) + 8 * odd),
                 "r"(codes[2 * k]), "r"(codes[2 * k + 1])
                 : "memory");
  if (j == 0) qs[grp] = scale;
  ptx::fence_proxy_async();  // the codes, for the wgmmas
  named_bar_sync(bar, 128);
  const int w = i / 32, lane = i % 32;
  return qs[(w / 2) * 8 + lane / 4];
}

// A consumer warpgroup's row scales qm0 / qm1 (its thread's rows row0 and row1 = row0 + 8; the
// logits are t * qm, floored at FLT_MIN): kQ16, its own quantization of its 64 rows q0 + 64 cw
// .. into its Q rows at sq (group scales at qs + 16 cw, named barrier 9 + cw: the kernels' other
// ids are below 9); else the scales of q's pass (q_scale_floor).
template <int D, typename T16, bool kQ16>
__device__ __forceinline__ void consumer_q_scales(const AttnParams& p, int b, int h, int64_t q0,
                                                  int cw, int64_t row0, int64_t row1, uint32_t sq,
                                                  float* qs, int tid, float& qm0, float& qm1) {
  if constexpr (kQ16) {
    const float s =
        quantize_q16_rows<D, T16>(p, b, h, q0 + 64 * cw, sq, qs + 16 * cw, tid & 127, 9 + cw);
    qm0 = fmaxf(row0 < p.Nq ? s : 0.f, 1.17549435e-38f);
    qm1 = fmaxf(row1 < p.Nq ? s : 0.f, 1.17549435e-38f);
  } else {
    qm0 = q_scale_floor(p, b, h, row0);
    qm1 = q_scale_floor(p, b, h, row1);
  }
}

// Producer warp 1 at its CTA's start (p.q16_ahead > 0): the q rows of the CTA q16_ahead linear
// block indices later (about a wave ahead), into L2 by bulk prefetches of a row's 2 D bytes,
// kRows / 32 rows per lane; causal grids read that CTA's place in the longest-first walk
// (cta_work_at, kHeadsInner as the kernel's grid).
template <int D, int kRows, bool kHeadsInner, typename T16>
__device__ __forceinline__ void prefetch_q16_rows(const AttnParams& p, int lane) {
  if (p.q16_ahead <= 0) return;
  const unsigned X = gridDim.x, Y = gridDim.y;
  const unsigned lin = blockIdx.x + X * (blockIdx.y + Y * blockIdx.z) + p.q16_ahead;
  const unsigned x = lin % X, y = (lin / X) % Y, z = lin / (X * Y);
  if (z >= gridDim.z) return;
  const CtaWork w = cta_work_at<kHeadsInner>(p, static_cast<int>(x), static_cast<int>(y));
#pragma unroll
  for (int i = 0; i < kRows / 32; ++i) {
    const int64_t row = static_cast<int64_t>(w.qb) * kRows + lane + 32 * i;
    if (row < p.Nq) {
      const T16* src =
          static_cast<const T16*>(p.q16) + z * p.q16_sb + row * p.q16_sn + w.h * p.q16_sh;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(2 * D) : "memory");
    }
  }
}

}  // namespace attn
}  // namespace cuda
}  // namespace lowbit
