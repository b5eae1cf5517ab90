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

#include "lowbit/dtype.h"
#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_rotate.cuh"

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

template <typename T>
void launch_typed(const RotateQuantParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(rotate_quantize_smem_bytes(p.K));
  const dim3 grid(static_cast<unsigned>(p.M));
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)  // the opt-in is needed (and paid for) only past the default 48 KB
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)),
                 "rotate_quantize", "shared memory");
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

int64_t rotate_quantize_max_k() {
  int dev = 0, optin = 0;
  check_cuda(cudaGetDevice(&dev), "rotate_quantize", "device");
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "rotate_quantize", "attribute");
  return (static_cast<int64_t>(optin) - 1024) / 4 / 256 * 256;
}

void rotate_quantize(const RotateQuantParams& p, cudaStream_t stream) {
  if (p.M == 0 || p.K == 0) return;
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
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
