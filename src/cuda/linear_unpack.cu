// Weight unpack / dequantize kernels feeding the GEMMs, and stochastic re-quantization
// (SPEC §3.3-§3.5). Elementwise, grid-stride, one 16-column group per thread where the format packs.
#include <cuda_fp16.h>

#include "lowbit/dtype.h"
#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_unpack.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 16;
  return static_cast<int>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

__global__ void unpack_int8_kernel(PackedWeightRef w, int8_t* out) {
  const int64_t groups = w.N * (w.K / 16);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / (w.K / 16), k = (i % (w.K / 16)) * 16;
    uint32_t words[4];
    unpack16(w, n, k, words);
    *reinterpret_cast<uint4*>(out + n * w.K + k) = make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// One thread per 16 elements (one e4m3 block scale).
__global__ void dequant_nvfp4_f16_kernel(const uint8_t* codes, const uint8_t* scales, int64_t R,
                                         int64_t C, uint16_t* out) {
  const int64_t blocks = R * (C / 16);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < blocks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / (C / 16), c0 = (i % (C / 16)) * 16;
    const float s = dt::e4m3_to_f32(scales[i]);
    const uint2 v = *reinterpret_cast<const uint2*>(codes + r * (C / 2) + c0 / 2);
    const uint32_t words[2] = {v.x, v.y};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = (words[j >> 2] >> (8 * (j & 3))) & 0xffu;
      // Exact in f16: a 2-bit-mantissa e2m1 times a 4-bit e4m3 fits an f16 significand and range.
      const uint16_t lo = dt::f32_to_f16(dt::e2m1_to_f32(b & 0xfu) * s);
      const uint16_t hi = dt::f32_to_f16(dt::e2m1_to_f32(b >> 4) * s);
      o[j] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + r * C + c0);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

__global__ void dequant_int8_f32_kernel(const int8_t* codes, const float* row_scale, int64_t N,
                                        int64_t K, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * K;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __fmul_rn(static_cast<float>(codes[i]), row_scale[i / K]);
}

__global__ void dequant_e4m3_f32_kernel(const uint8_t* codes, const float* row_scale, int64_t N,
                                        int64_t K, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * K;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __fmul_rn(dt::e4m3_to_f32(codes[i]), row_scale[i / K]);
}

__global__ void dequant_nvfp4_f32_kernel(const uint8_t* codes, const uint8_t* scales, const float* pts,
                                         int64_t N, int64_t K, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * K;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / K, k = i % K;
    const float s = __fmul_rn(dt::e4m3_to_f32(scales[n * (K / 16) + k / 16]), *pts);
    out[i] = __fmul_rn(dt::e2m1_to_f32(dt::get_nibble(codes + n * (K / 2), k)), s);
  }
}

// Counter-based uniform in [0, 1): splitmix64 of (seed, index), top 24 bits (exact in fp32).
__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 5.9604644775390625e-08f;  // 2^-24
}

__global__ void requantize_int_kernel(const float* w, const float* row_scale, int64_t N, int64_t K,
                                      int qmax, bool stochastic, uint64_t seed, int8_t* codes) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * K;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float S = row_scale[i / K];
    if (!(S > 0.f)) S = 1.f;
    const float z = w[i] / S;
    float r;
    if (stochastic) {
      r = floorf(__fadd_rn(z, uniform01(seed, static_cast<uint64_t>(i))));
      r = r != r ? 0.f : r;
    } else {
      r = dt::rint_even(z);
      r = r != r ? 0.f : r;
    }
    r = r < -qmax ? -qmax : (r > qmax ? qmax : r);
    codes[i] = static_cast<int8_t>(r);
  }
}

}  // namespace

int64_t packed_row_bytes(WeightFormat f, int64_t K, int bits) {
  switch (f) {
    case WeightFormat::int8:
      return K;
    case WeightFormat::packed:
      return K / 8 * bits;
    case WeightFormat::ternary:
      return (K + 4) / 5;
    default:
      return K / 2;
  }
}

void unpack_weight_int8(const PackedWeightRef& w, int8_t* out, cudaStream_t stream) {
  if (w.N == 0 || w.K == 0) return;
  unpack_int8_kernel<<<grid_for(w.N * (w.K / 16)), kThreads, 0, stream>>>(w, out);
  check_launch("unpack_weight_int8");
}

void dequant_nvfp4_f16(const uint8_t* codes, const uint8_t* scales, int64_t R, int64_t C,
                       uint16_t* out, cudaStream_t stream) {
  if (R == 0 || C == 0) return;
  dequant_nvfp4_f16_kernel<<<grid_for(R * (C / 16)), kThreads, 0, stream>>>(codes, scales, R, C,
                                                                            out);
  check_launch("dequant_nvfp4_f16");
}

void dequant_int8_f32(const int8_t* codes, const float* row_scale, int64_t N, int64_t K,
                      float* out, cudaStream_t stream) {
  if (N * K == 0) return;
  dequant_int8_f32_kernel<<<grid_for(N * K), kThreads, 0, stream>>>(codes, row_scale, N, K, out);
  check_launch("dequant_int8_f32");
}

void dequant_e4m3_f32(const uint8_t* codes, const float* row_scale, int64_t N, int64_t K,
                      float* out, cudaStream_t stream) {
  if (N * K == 0) return;
  dequant_e4m3_f32_kernel<<<grid_for(N * K), kThreads, 0, stream>>>(codes, row_scale, N, K, out);
  check_launch("dequant_e4m3_f32");
}

void dequant_nvfp4_f32(const uint8_t* codes, const uint8_t* scales, const float* pts, int64_t N,
                       int64_t K, float* out, cudaStream_t stream) {
  if (N * K == 0) return;
  dequant_nvfp4_f32_kernel<<<grid_for(N * K), kThreads, 0, stream>>>(codes, scales, pts, N, K,
                                                                     out);
  check_launch("dequant_nvfp4_f32");
}

void requantize_int(const float* w, const float* row_scale, int64_t N, int64_t K, int qmax,
                    bool stochastic, uint64_t seed, int8_t* codes, cudaStream_t stream) {
  if (N * K == 0) return;
  requantize_int_kernel<<<grid_for(N * K), kThreads, 0, stream>>>(w, row_scale, N, K, qmax,
                                                                  stochastic, seed, codes);
  check_launch("requantize_int");
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
