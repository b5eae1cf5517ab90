// Device pieces of the fast rotation (SPEC §3.1, docs/linear.md), shared by the fused
// rotate+quantize kernel and the fused decode kernel so both produce the same fp32 values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "lowbit/dtype.h"
#include "lowbit/tensor.h"
#include "src/cuda/common.cuh"

namespace lowbit {
namespace cuda {
namespace linear {

__device__ __forceinline__ float nan_max(float m, float v) {
  // Propagates NaN (fmaxf would drop it): a NaN anywhere makes the amax NaN.
  return (v > m || v != v) ? v : m;
}

// Sign of D at in-block index i: -1 when an odd number of base-4 digits equal 3.
__device__ __forceinline__ float d_sign(int i) {
  return (__popc(i & (i >> 1) & 0x55555555) & 1) ? -1.f : 1.f;
}
// P: swap the two bits of every base-4 digit.
__device__ __forceinline__ int p_perm(int i) {
  return ((i & 0x55555555) << 1) | ((i >> 1) & 0x55555555);
}

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Loads 8 consecutive elements (zeros beyond `valid`).
template <typename T>
__device__ __forceinline__ void load8(const T* p, int valid, float v[8]) {
  if (valid >= 8 && (reinterpret_cast<uintptr_t>(p) % (8 * sizeof(T))) == 0) {
    if constexpr (sizeof(T) == 2) {
      uint4 u = *reinterpret_cast<const uint4*>(p);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_f32<T>(e[j]);
    } else {
      float4 a = reinterpret_cast<const float4*>(p)[0];
      float4 b = reinterpret_cast<const float4*>(p)[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
      v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = j < valid ? to_f32<T>(p[j]) : 0.f;
  }
}

__device__ __forceinline__ void store_out(void* base, int64_t off, DType dt, float v) {
  switch (dt) {
    case DType::f16:
      static_cast<__half*>(base)[off] = __float2half_rn(v);
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(base)[off] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float*>(base)[off] = v;
  }
}

// Rotates the 256-element chunk a warp holds (8 values per lane) for block size ROT.
template <int ROT>
__device__ __forceinline__ void hadamard_chunk(float v[8], int lane) {
  const int base = lane * 8;
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] *= d_sign((base + j) & (ROT - 1));
#pragma unroll
  for (int h = 1; h < 8 && h < ROT; h <<= 1) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if ((j & h) == 0) {
        float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
#pragma unroll
  for (int h = 8; h < ROT; h <<= 1) {
    const int lx = h / 8;
    const bool upper = (lane & lx) != 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float other = __shfl_xor_sync(0xffffffffu, v[j], lx);
      // lower element of the pair: a + b (a own); upper: a - b (a is the partner's).
      v[j] = upper ? other - v[j] : v[j] + other;
    }
  }
}

// Rotates row x (K elements, K % ROT == 0) into srow (fp32, K entries: t = (x·D·H)·2^-k in the
// butterflies' order, before P and the second D) with all kThreads threads of the CTA; returns
// this thread's part of the row's |y| max (NaN-sticky). The caller synchronizes, then reads the
// rotated values y through load4_rotated.
template <typename T, int ROT, int kThreads>
__device__ __forceinline__ float rotate_row_to_smem(const T* x, int K, float* srow) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr float kNorm = ROT == 16 ? 0.25f : (ROT == 64 ? 0.125f : 0.0625f);
  // A warp loads up to kBatch of its 256-element chunks before rotating any (bytes in flight).
  constexpr int kBatch = 4, kWarps = kThreads / 32;
  float amax = 0.f;
  for (int c0 = warp * 256; c0 < K; c0 += kWarps * 256 * kBatch) {
    float v[kBatch][8];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int e0 = c0 + b * kWarps * 256 + lane * 8;
      load8<T>(x + e0, K - e0, v[b]);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int e0 = c0 + b * kWarps * 256 + lane * 8;
      if (c0 + b * kWarps * 256 >= K) break;  // warp-uniform
      hadamard_chunk<ROT>(v[b], lane);
      if (e0 < K) {
        // Stored unpermuted and unsigned (two conflict-free float4 stores); load4_rotated applies
        // P and the second D on the way out. |y| is the same either way.
        float t[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          t[j] = v[b][j] * kNorm;
          amax = nan_max(amax, fabsf(t[j]));
        }
        reinterpret_cast<float4*>(srow + e0)[0] = make_float4(t[0], t[1], t[2], t[3]);
        reinterpret_cast<float4*>(srow + e0)[1] = make_float4(t[4], t[5], t[6], t[7]);
      }
    }
  }
  return amax;
}

// y[j .. j + 3] of the rotated row (j % 4 == 0): y[j] = d(j) · t[p(j)]. Within an aligned group
// of 4, p maps j, j+1, j+2, j+3 to p(j), p(j)+2, p(j)+1, p(j)+3 (it swaps bits 0 and 1), so one
// float4 load serves the four outputs. d(j) · (t · 2^-k) equals the CPU's (d · t) · 2^-k: the
// sign and the power of two are exact.
template <int ROT>
__device__ __forceinline__ float4 load4_rotated(const float* srow, int j) {
  const int i = j & (ROT - 1);
  const float4 q = *reinterpret_cast<const float4*>(srow + (j - i) + p_perm(i));
  return make_float4(d_sign(i) * q.x, d_sign(i + 1) * q.z, d_sign(i + 2) * q.y,
                     d_sign(i + 3) * q.w);
}

// The CTA-wide NaN-sticky max of v (every thread gets it). buf: kThreads / 32 floats of shared
// memory; contains two barriers.
template <int kThreads>
__device__ __forceinline__ float block_amax(float v, float* buf) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) buf[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = buf[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) m = nan_max(m, buf[w]);
  __syncthreads();
  return m;
}

// ---- The register rotation (rotate_quantize_reg_kernel, the fused tiled decode GEMV) ----------
// Thread `tid` of a row owns its 16 input elements [16 tid, 16 tid + 16): block tid / (ROT / 16),
// 16-group g = tid % (ROT / 16) within it. Its 16 outputs are the aligned run starting at
// reg_out0 (block start + 16 p(g)), in the order j -> p(j) (see linear_rotate.cu).
__device__ __forceinline__ float sign_if(bool neg, float v) { return neg ? -v : v; }

// NaN-propagating max of |v| into m (max.NaN, sm_80+): one FMNMX.
__device__ __forceinline__ float amax_nan(float m, float v) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(v)));
  return r;
}

// The 16 elements of raw 16-byte words (2 for 16-bit types, 4 for f32) as fp32.
template <typename T>
__device__ __forceinline__ void unpack_raw(const uint4* raw, float v[16]) {
  if constexpr (sizeof(T) == 2) {
    const uint32_t w[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w,
                           raw[1].x, raw[1].y, raw[1].z, raw[1].w};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        v[2 * q] = __uint_as_float(w[q] << 16);
        v[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[q]));
        v[2 * q] = f.x;
        v[2 * q + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[4 * q] = __uint_as_float(raw[q].x), v[4 * q + 1] = __uint_as_float(raw[q].y);
      v[4 * q + 2] = __uint_as_float(raw[q].z), v[4 * q + 3] = __uint_as_float(raw[q].w);
    }
  }
}

// p(j) for j < 16 (swap the two bits of both base-4 digits), usable in constant expressions.
__host__ __device__ constexpr int p16(int j) {
  return ((j & 5) << 1) | ((j >> 1) & 5);
}
// d(j) < 0 for j < 16.
__host__ __device__ constexpr bool dneg16(int j) {
  return ((j & 3) == 3) != ((j >> 2) == 3);
}

// D, then H_ROT's butterflies (h = 1 .. ROT/2 in order) on the thread's 16 values; g: the
// thread's 16-group within its block. Leaves t = (x·D·H) unnormalized, in register order j.
template <int ROT>
__device__ __forceinline__ void hadamard16(float v[16], int g) {
  const bool neg_g = d_sign(g) < 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    v[j] = sign_if(neg_g != dneg16(j), v[j]);
  }
#pragma unroll
  for (int h = 1; h < 16; h <<= 1) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if ((j & h) == 0) {
        const float a = v[j], b = v[j + h];
        v[j] = __fadd_rn(a, b);
        v[j + h] = __fsub_rn(a, b);
      }
    }
  }
#pragma unroll
  for (int h = 16; h < ROT; h <<= 1) {
    const int lx = h / 16;
    // lower element of the pair (own a, partner b): a + b; upper (own b, partner a): a - b.
    const float s = (g & lx) ? -1.f : 1.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, v[j], lx);
      v[j] = __fmaf_rn(s, v[j], other);  // s * v is exact: RN(other -/+ v)
    }
  }
}


template <int ROT>
__device__ __forceinline__ int reg_group(int tid) {
  return tid & (ROT / 16 - 1);
}
template <int ROT>
__device__ __forceinline__ int reg_out0(int tid) {
  const int g = reg_group<ROT>(tid);
  return (tid * 16 - g * 16) + p16(g) * 16;
}
// v: the thread's 16 inputs as fp32 (clobbered) -> y: its 16 outputs, y[j] at reg_out0 + j.
template <int ROT>
__device__ __forceinline__ void rotate16(float v[16], int g, float y[16]) {
  hadamard16<ROT>(v, g);
  constexpr float kNorm = ROT == 16 ? 0.25f : (ROT == 64 ? 0.125f : 0.0625f);
  // The output sign d(p(i)) = d(i) = d(g) d(j), folded into the normalization:
  // y[p(j)] = d(j) d(g) t_j 2^-k.
  const float norm_g = d_sign(g) * kNorm;
#pragma unroll
  for (int j = 0; j < 16; ++j) y[p16(j)] = __fmul_rn(v[j], dneg16(j) ? -norm_g : norm_g);
}
// The warp's NaN-sticky max of |y| over its lanes' 16 values (every lane gets it).
__device__ __forceinline__ float amax16_warp(const float y[16]) {
  float m = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) m = amax_nan(m, y[j]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = amax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}
// The per-token scale rule: amax / qmax, 1 for an all-zero row, NaN stays NaN.
__device__ __forceinline__ float token_scale(float amax, float qmax) {
  const float scale = amax / qmax;
  return scale == 0.f ? 1.f : scale;
}
// int8 / int4 codes (|code| <= LIM) of RN(y / scale), 4 per word in y's order: the correctly
// rounded division through r = RN(1 / s) where div_rn applies (the quotient rounded half-to-even
// by one FADD of 1.5·2^23, whose low byte is the code: |z| <= LIM (1 + 2^-22), no clamp), else
// IEEE division and the clamped conversion.
// e4m3 codes (satfinite) of RN(y / scale), 4 per word in y's order, the same division rule. The
// residual corrections turn z = -0 into +0 ((-s)(-0) + (-0) = +0); the CPU's y / s keeps it, and
// e4m3 has a -0 (0x80). Away from NaN (which takes IEEE division), the correctly rounded quotient
// has the sign of y: copied back (a no-op unless z = 0; the conversion keeps the sign of zero).
// Four codes at a time (fewer live registers than all 16 quotients first).
__device__ __forceinline__ void quantize16_e4m3(const float y[16], float scale, uint32_t w[4]) {
  if (div_rn_applies(scale)) {
    const float r = __frcp_rn(scale);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float z[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) z[j] = copysignf(div_rn(y[4 * q + j], scale, r), y[4 * q + j]);
      w[q] = e4m3x2(z[0], z[1]) | (e4m3x2(z[2], z[3]) << 16);
    }
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float z[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) z[j] = __fdiv_rn(y[4 * q + j], scale);
      w[q] = e4m3x2(z[0], z[1]) | (e4m3x2(z[2], z[3]) << 16);
    }
  }
}
template <int LIM>
__device__ __forceinline__ void quantize16_int(const float y[16], float scale, uint32_t w[4]) {
  const bool fast = div_rn_applies(scale);
  const float r = __frcp_rn(scale);
  uint32_t b[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float z = fast ? div_rn(y[j], scale, r) : __fdiv_rn(y[j], scale);
    b[j] = fast ? __float_as_uint(__fadd_rn(z, 12582912.f))
                : static_cast<uint32_t>(dt::f32_to_int_clamped(z, -LIM, LIM));
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
    w[q] = __byte_perm(__byte_perm(b[4 * q], b[4 * q + 1], 0x0040),
                       __byte_perm(b[4 * q + 2], b[4 * q + 3], 0x0040), 0x5410);
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
