// Fused Hadamard rotation + per-token quantization (SPEC §3.1, §3.2, §3.5): one CTA per row, the
// input read once.
//
// Rotation R_n = D·H_n·P·D (n = rot in {16, 64, 256}), applied to a row vector x as
// y = (((x·D)·H_n)·P)·D / sqrt(n):
//   1. sign flip D on the input (index i gets -1 per base-4 digit equal to 3),
//   2. H_n as in-place butterflies (a, b) -> (a + b, a - b) on pairs (i, i + h), stages
//      h = 1, 2, 4, ..., n/2 in that order (the CPU's fast transform uses the same order, so the
//      fp32 results agree to the bit),
//   3. the permutation P (swap the two bits of every base-4 digit; an involution) and the second D
//      (D(P(i)) = D(i): digit 3 maps to itself), then the exact power-of-two 1/sqrt(n).
// A warp owns 256 consecutive elements of a row, 8 per lane: stages h < 8 run in registers, stages
// h >= 8 exchange with lane ^ (h / 8). The rotated row is staged in shared memory (fp32, at its
// permuted position) so the quantizer can see the row's amax and write coalesced codes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "lowbit/dtype.h"
#include "src/core/check.h"
#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_lut.h"
#include "src/cuda/linear_rotate.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

constexpr int kThreads = 256;

template <typename T, int ROT>
__global__ void __launch_bounds__(kThreads) rotate_quantize_kernel(RotateQuantParams p) {
  extern __shared__ float srow[];  // (K) the rotated row
  __shared__ float warp_amax[kThreads / 32];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int K = static_cast<int>(p.K);
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;

  float amax = rotate_row_to_smem<T, ROT, kThreads>(x, K, srow);
  __syncthreads();

  if (p.fmt == ActFormat::rotate_only) {
    // 4 consecutive outputs per thread: one 8-byte store for 16-bit outputs when aligned.
    const int64_t off = row * p.rotated_row_stride;
    const bool half = p.rotated_dtype == DType::bf16 || p.rotated_dtype == DType::f16;
    const bool vec =
        half && (reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(p.rotated) + off) % 8) == 0;
    for (int e0 = threadIdx.x * 4; e0 < K; e0 += kThreads * 4) {
      const float4 q = load4_rotated<ROT>(srow, e0);
      if (vec) {
        uint2 w;
        if (p.rotated_dtype == DType::bf16) {
          __nv_bfloat162 a = __floats2bfloat162_rn(q.x, q.y), b = __floats2bfloat162_rn(q.z, q.w);
          w.x = *reinterpret_cast<uint32_t*>(&a);
          w.y = *reinterpret_cast<uint32_t*>(&b);
        } else {
          __half2 a = __floats2half2_rn(q.x, q.y), b = __floats2half2_rn(q.z, q.w);
          w.x = *reinterpret_cast<uint32_t*>(&a);
          w.y = *reinterpret_cast<uint32_t*>(&b);
        }
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.rotated) + off + e0) = w;
      } else {
        const float v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) store_out(p.rotated, off + e0 + j, p.rotated_dtype, v[j]);
      }
    }
    return;
  }

  if (p.fmt == ActFormat::nvfp4) {
    // 4 lanes per 16-element block: amax, e4m3 block scale, e2m1 codes (pts = 1).
    uint8_t* codes = static_cast<uint8_t*>(p.codes) + row * p.codes_row_stride;
    uint8_t* bs = p.block_scales + row * (p.K / 16);
    for (int e0 = threadIdx.x * 4; e0 < ((K + 127) & ~127); e0 += kThreads * 4) {
      const bool in = e0 < K;
      float4 q = in ? load4_rotated<ROT>(srow, e0) : make_float4(0, 0, 0, 0);
      float m = nan_max(nan_max(fabsf(q.x), fabsf(q.y)), nan_max(fabsf(q.z), fabsf(q.w)));
      m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, 2));
      float base = m / 6.f;
      base = base > 448.f ? 448.f : base;  // NaN stays NaN
      const uint8_t s8 = dt::f32_to_e4m3(base);
      float denom = dt::e4m3_to_f32(s8);  // * pts (= 1)
      if (!(denom > 0.f)) denom = 1.f;
      if (in) {
        float z[4] = {q.x / denom, q.y / denom, q.z / denom, q.w / denom};
        uint8_t c[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float t = z[j] < -6.f ? -6.f : (z[j] > 6.f ? 6.f : z[j]);
          c[j] = dt::f32_to_e2m1(t);
        }
        const uint16_t packed = static_cast<uint16_t>(c[0] | (c[1] << 4) | (c[2] << 8) |
                                                      (c[3] << 12));
        *reinterpret_cast<uint16_t*>(codes + e0 / 2) = packed;
        if ((lane & 3) == 0) bs[e0 / 16] = s8;
      }
    }
    return;
  }

  // Per-token scale: row amax over the CTA.
  amax = block_amax<kThreads>(amax, warp_amax);
  const float qmax = p.fmt == ActFormat::int8 ? 127.f : (p.fmt == ActFormat::int4 ? 7.f : 448.f);
  float scale = amax / qmax;
  if (scale == 0.f) scale = 1.f;  // NaN stays NaN
  if (threadIdx.x == 0) p.scales[row] = scale;

  uint8_t* codes = static_cast<uint8_t*>(p.codes) + row * p.codes_row_stride;
  for (int e0 = threadIdx.x * 4; e0 < K; e0 += kThreads * 4) {
    float4 q = load4_rotated<ROT>(srow, e0);
    float z[4] = {q.x / scale, q.y / scale, q.z / scale, q.w / scale};
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t c;
      if (p.fmt == ActFormat::e4m3) {
        c = __nv_cvt_float_to_fp8(z[j], __NV_SATFINITE, __NV_E4M3);
      } else {
        const int lim = p.fmt == ActFormat::int8 ? 127 : 7;
        c = static_cast<uint8_t>(static_cast<int8_t>(dt::f32_to_int_clamped(z[j], -lim, lim)));
      }
      word |= (c & 0xffu) << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(codes + e0) = word;
  }
}

// ---- Register kernel (the default) ---------------------------------------------------------
// One CTA per row, K / 16 threads (rounded up to whole warps). Thread `tid` of the row owns the
// 16 consecutive input elements [16 tid, 16 tid + 16): block b = tid / (ROT / 16) of the row, and
// within it g = tid % (ROT / 16), so the thread holds block indices i = 16 g + j, j = 0..15.
//   - D on the input: d(i) = d(g) · d(j) (digits of g and j are disjoint), a sign flip;
//   - butterflies h = 1, 2, 4, 8 in registers, h = 16 .. ROT/2 with lane ^ (h / 16) through one
//     warp shuffle per value and stage (the 16 threads of a block are 16 aligned lanes);
//   - output: y at block position p(i) = 16 p(g) + p(j) (P acts digit-wise) is d(i) · t_i · 2^-k,
//     so the thread's 16 outputs are the contiguous, 16-aligned run [16 p(g), 16 p(g) + 16) in
//     the order j -> p(j): one 16-byte int8 store (or two for 16-bit outputs), and exactly one
//     NVFP4 block of 16 (its block amax needs no other thread).
// Per-token amax: warp max, then the CTA's warps through shared memory (one barrier pair).
// Division by the row scale: z = y / s is correctly rounded through a per-row reciprocal
// r = RN(1 / s) and two residual corrections (q1 = q0 + (y - s q0) r, then the same once more:
// Markstein's theorem makes the second one RN(y / s) when q1 is faithful), valid while no
// residual underflows; rows with s outside [2^-60, 2^60] (or NaN) take IEEE division instead.
// int8/int4 rounding: z + 1.5 * 2^23 rounds to nearest even in one FADD, and the low byte of the
// sum's bits is the two's-complement code (|z| <= qmax (1 + 2^-22) here, so no clamp is needed).
constexpr int kRegMaxThreads = 1024;

// Loads the thread's 16 elements as fp32 (zeros when !in).
template <typename T>
__device__ __forceinline__ void load16(const T* p, bool in, bool vec, float v[16]) {
  if (!in) {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = 0.f;
    return;
  }
  if (vec) {  // 16-byte loads, converted as the fused kernels convert their raw words
    constexpr int kRaw = sizeof(T) == 2 ? 2 : 4;
    uint4 raw[kRaw];
#pragma unroll
    for (int q = 0; q < kRaw; ++q) raw[q] = __ldg(reinterpret_cast<const uint4*>(p) + q);
    unpack_raw<T>(raw, v);
    return;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = to_f32<T>(p[j]);
}

template <typename T, int ROT, ActFormat FMT>
__global__ void __launch_bounds__(kRegMaxThreads) rotate_quantize_reg_kernel(RotateQuantParams p,
                                                                           bool vec_in,
                                                                           bool vec_out) {
  __shared__ float warp_amax[2][kRegMaxThreads / 32];
  // Bench-only stamps (RotateQuantParams::stamps): thread 0 of each CTA.
  uint64_t* const stamps =
      p.stamps && threadIdx.x == 0 ? p.stamps + blockIdx.x * kRotateStampWords : nullptr;
  auto stamp = [&](int i) {
    if (stamps) {
      uint64_t t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      stamps[i] = t;
    }
  };
  stamp(0);
  // A kernel launched after this one with programmatic dependent launch (the 4-bit decode
  // kernel) may start now: it streams its weights and waits (griddepcontrol.wait) for our writes.
  ptx::griddep_launch_dependents();
  // Launched with PDL (RotateQuantParams::pdl) behind a kernel that triggered early (the previous
  // decode layer's GEMV): nothing is read or written before that grid has completed. Without the
  // attribute a no-op.
  ptx::griddep_wait();
  stamp(1);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = static_cast<int>(p.K);
  const bool in = tid * 16 < K;
  const int g = reg_group<ROT>(tid);
  const int out0 = reg_out0<ROT>(tid);
  // Rows blockIdx.x, + gridDim.x, ...: the next row's 32 (f32: 64) bytes are loaded while this
  // one is computed, so a CTA keeps its loads in flight through the barrier and the stores.
  // (Two rows ahead in two register buffers, session 7, was no faster: H200 run 16.)
  constexpr int kRaw = sizeof(T) == 2 ? 2 : 4;
  uint4 raw[kRaw];
  auto fetch = [&](int64_t r, uint4* buf) {
    if (in && vec_in && r < p.M) {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) +
                                                        r * p.x_row_stride + tid * 16);
#pragma unroll
      for (int q = 0; q < kRaw; ++q) buf[q] = __ldg(src + q);
    }
  };
  // Row `row` from buf (then refilled with row + gridDim.x); parity: the warp_amax buffer,
  // alternating between consecutive rows of the CTA.
  auto process = [&](int64_t row, uint4* buf, int parity) {
    float v[16];
    if (in && vec_in) {
      unpack_raw<T>(buf, v);
    } else {
      load16<T>(static_cast<const T*>(p.x) + row * p.x_row_stride + tid * 16, in, false, v);
    }
    fetch(row + static_cast<int64_t>(gridDim.x), buf);
    float y[16];  // in output order
    rotate16<ROT>(v, g, y);

    if constexpr (FMT == ActFormat::rotate_only) {
      if (!in) return;
      const int64_t off = row * p.rotated_row_stride + out0;
      if (vec_out && p.rotated_dtype == DType::bf16) {
        uint32_t w[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          __nv_bfloat162 h = __floats2bfloat162_rn(y[2 * q], y[2 * q + 1]);
          w[q] = *reinterpret_cast<uint32_t*>(&h);
        }
        uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.rotated) + off);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
      } else if (vec_out && p.rotated_dtype == DType::f16) {
        uint32_t w[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          __half2 h = __floats2half2_rn(y[2 * q], y[2 * q + 1]);
          w[q] = *reinterpret_cast<uint32_t*>(&h);
        }
        uint4* dst = reinterpret_cast<uint4*>(static_cast<__half*>(p.rotated) + off);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
      } else if (vec_out && p.rotated_dtype == DType::f32) {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(p.rotated) + off);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          dst[q] = make_float4(y[4 * q], y[4 * q + 1], y[4 * q + 2], y[4 * q + 3]);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) store_out(p.rotated, off + j, p.rotated_dtype, y[j]);
      }
    } else if constexpr (FMT == ActFormat::nvfp4) {
      if (!in) return;
      float m = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) m = amax_nan(m, y[j]);
      float base = m / 6.f;
      base = base > 448.f ? 448.f : base;  // NaN stays NaN
      const uint8_t s8 = dt::f32_to_e4m3(base);
      float denom = dt::e4m3_to_f32(s8);  // * pts (= 1)
      if (!(denom > 0.f)) denom = 1.f;
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float z = y[j] / denom;
        const float c = z < -6.f ? -6.f : (z > 6.f ? 6.f : z);
        w[j / 8] |= static_cast<uint32_t>(dt::f32_to_e2m1(c)) << (4 * (j % 8));
      }
      uint8_t* codes = static_cast<uint8_t*>(p.codes) + row * p.codes_row_stride + out0 / 2;
      if (vec_out) {
        *reinterpret_cast<uint2*>(codes) = make_uint2(w[0], w[1]);
      } else {
#pragma unroll
        for (int b = 0; b < 8; ++b) codes[b] = static_cast<uint8_t>(w[b / 4] >> (8 * (b % 4)));
      }
      p.block_scales[row * (p.K / 16) + out0 / 16] = s8;
      if (p.x16) {  // code value x block scale: exact in f16 (launch_typed: 16-byte aligned)
        uint32_t h[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          // pair q: columns 2 q, 2 q + 1; permuted: columns (0, 2), (4, 6), (1, 3), (5, 7) of
          // each 8 (word q / 4: the lane's 8 code nibbles of columns 8 (q / 4) ..).
          const int c0 = p.x16_permuted ? (q & 1) * 4 + (q >> 1 & 1) : 2 * (q % 4);
          const int c1 = p.x16_permuted ? c0 + 2 : c0 + 1;
          const uint32_t wq = w[q / 4];
          const __half2 v =
              __floats2half2_rn(__uint_as_float(e2m1_f32_bits(wq >> (4 * c0) & 15u)) * denom,
                                __uint_as_float(e2m1_f32_bits(wq >> (4 * c1) & 15u)) * denom);
          h[q] = *reinterpret_cast<const uint32_t*>(&v);
        }
        uint4* dst = reinterpret_cast<uint4*>(p.x16 + row * p.K + out0);
        dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
        dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
      }
    } else {
      // Per-token scale. amax of |y| = amax of |t| · 2^-k exactly (rounding is monotonic).
      float m = amax16_warp(y);
      // Two buffers by row parity: a warp writing the next row's entry has passed this row's
      // barrier, which every warp reaches only after reading the previous row's entries.
      if (lane == 0) warp_amax[parity][warp] = m;
      __syncthreads();
      m = warp_amax[parity][0];
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
        m = amax_nan(m, warp_amax[parity][w]);
      constexpr float kQmax =
          FMT == ActFormat::int8 ? 127.f : (FMT == ActFormat::int4 ? 7.f : 448.f);
      const float scale = token_scale(m, kQmax);
      if (tid == 0) p.scales[row] = scale;
      if (!in) return;

      uint32_t w[4];
      if constexpr (FMT == ActFormat::e4m3) {
        quantize16_e4m3(y, scale, w);
      } else {
        quantize16_int<FMT == ActFormat::int8 ? 127 : 7>(y, scale, w);
      }
      uint8_t* codes = static_cast<uint8_t*>(p.codes) + row * p.codes_row_stride + out0;
      if (vec_out) {
        *reinterpret_cast<uint4*>(codes) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int bb = 0; bb < 16; ++bb)
          codes[bb] = static_cast<uint8_t>(w[bb / 4] >> (8 * (bb % 4)));
      }
    }
  };
  fetch(blockIdx.x, raw);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.M; row += gridDim.x, parity ^= 1)
    process(row, raw, parity);
  stamp(2);
}

template <typename T, int ROT, ActFormat FMT>
void launch_reg(const RotateQuantParams& p, cudaStream_t stream) {
  const int threads = static_cast<int>((p.K / 16 + 31) / 32 * 32);
  const bool vec_in = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                      (p.x_row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  bool vec_out;
  if constexpr (FMT == ActFormat::rotate_only) {
    const int64_t es = dtype_bits(p.rotated_dtype) / 8;
    vec_out = reinterpret_cast<uintptr_t>(p.rotated) % 16 == 0 &&
              (p.rotated_row_stride * es) % 16 == 0;
  } else {
    const int64_t a = FMT == ActFormat::nvfp4 ? 8 : 16;
    vec_out = reinterpret_cast<uintptr_t>(p.codes) % a == 0 && p.codes_row_stride % a == 0;
  }
  // As many CTAs as are resident at once (each loops over rows), at most one per row.
  auto kernel = rotate_quantize_reg_kernel<T, ROT, FMT>;
  const int sms = multiprocessor_count();
  int64_t grid = p.M;
  if (p.M > sms) {
    const int per_sm =
        occupancy_per_sm(reinterpret_cast<const void*>(kernel), threads, 0, "rotate_quantize");
    grid = std::min<int64_t>(p.M, static_cast<int64_t>(sms) * std::max(1, per_sm));
  }
  launch_maybe_pdl(p.pdl, kernel, dim3(static_cast<unsigned>(grid)), dim3(threads), 0, stream, p,
                   vec_in, vec_out);
}

template <typename T, ActFormat FMT>
void launch_reg_fmt(const RotateQuantParams& p, cudaStream_t stream) {
  switch (p.rot) {
    case 16:
      launch_reg<T, 16, FMT>(p, stream);
      break;
    case 64:
      launch_reg<T, 64, FMT>(p, stream);
      break;
    default:
      launch_reg<T, 256, FMT>(p, stream);
  }
}

template <typename T>
void launch_reg_typed(const RotateQuantParams& p, cudaStream_t stream) {
  switch (p.fmt) {
    case ActFormat::rotate_only:
      launch_reg_fmt<T, ActFormat::rotate_only>(p, stream);
      break;
    case ActFormat::int8:
      launch_reg_fmt<T, ActFormat::int8>(p, stream);
      break;
    case ActFormat::int4:
      launch_reg_fmt<T, ActFormat::int4>(p, stream);
      break;
    case ActFormat::e4m3:
      launch_reg_fmt<T, ActFormat::e4m3>(p, stream);
      break;
    default:
      launch_reg_fmt<T, ActFormat::nvfp4>(p, stream);
  }
  check_launch("rotate_quantize");
}

// Whether the register kernel runs p (the only one that writes x16 itself).
bool reg_kernel_applies(const RotateQuantParams& p) {
  return !p.legacy_kernel && p.K / 16 <= kRegMaxThreads &&
         reinterpret_cast<uintptr_t>(p.x16) % 16 == 0;
}

template <typename T>
void launch_typed(const RotateQuantParams& p, cudaStream_t stream) {
  if (reg_kernel_applies(p)) {
    launch_reg_typed<T>(p, stream);
    return;
  }
  const size_t smem = static_cast<size_t>(rotate_quantize_smem_bytes(p.K));
  const dim3 grid(static_cast<unsigned>(p.M));
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)  // the opt-in is needed (and paid for) only past the default 48 KB
      set_kernel_smem(kernel, static_cast<int>(smem), "rotate_quantize", "shared memory");
    kernel<<<grid, kThreads, smem, stream>>>(p);
  };
  switch (p.rot) {
    case 16:
      go(rotate_quantize_kernel<T, 16>);
      break;
    case 64:
      go(rotate_quantize_kernel<T, 64>);
      break;
    default:
      go(rotate_quantize_kernel<T, 256>);
  }
  check_launch("rotate_quantize");
}

}  // namespace

int64_t rotate_quantize_smem_bytes(int64_t K) { return ((K + 127) / 128) * 128 * 4; }

int64_t rotate_quantize_reg_max_k() { return static_cast<int64_t>(kRegMaxThreads) * 16; }

int64_t rotate_quantize_max_k() {
  const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, "rotate_quantize");
  return (static_cast<int64_t>(optin) - 1024) / 4 / 256 * 256;
}

void rotate_quantize(const RotateQuantParams& p, cudaStream_t stream) {
  if (p.M == 0 || p.K == 0) return;
  LOWBIT_CHECK(!p.x16 || (p.fmt == ActFormat::nvfp4 && p.codes_row_stride == p.K / 2),
               "rotate_quantize", "x16",
               "expected only with nvfp4 codes of row stride K / 2 = " + std::to_string(p.K / 2) +
                   ", got row stride " + std::to_string(p.codes_row_stride));
  LOWBIT_CHECK(!p.x16_permuted || (p.x16 && reg_kernel_applies(p)), "rotate_quantize",
               "x16_permuted",
               "expected with a 16-byte aligned x16 and K <= " +
                   std::to_string(rotate_quantize_reg_max_k()) + " (the register kernel), got K " +
                   std::to_string(p.K));
  switch (p.x_dtype) {
    case DType::f16:
      launch_typed<__half>(p, stream);
      break;
    case DType::bf16:
      launch_typed<__nv_bfloat16>(p, stream);
      break;
    default:
      launch_typed<float>(p, stream);
  }
  // x16 where the register kernel did not run (the legacy kernel, a misaligned x16).
  if (p.fmt == ActFormat::nvfp4 && p.x16 && !reg_kernel_applies(p))
    dequant_nvfp4_16(static_cast<const uint8_t*>(p.codes), p.block_scales, p.M, p.K, p.x16,
                     DType::f16, stream);
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
