// Weight unpack / dequantize kernels feeding the GEMMs, and stochastic re-quantization
// (SPEC §3.3-§3.5). Elementwise, grid-stride, one 16-column group per thread where the format packs.
#include <cuda_fp16.h>

#include "lowbit/dtype.h"
#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_lut.h"
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

// dt::e2m1_to_f32 without its table (linear_lut.h; H200 session 17: with the table the
// dequantization ran at ~1/15 of the copy rate).
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  return __uint_as_float(e2m1_f32_bits(code));
}

// One thread per 16 elements (one e4m3 block scale). BF16: bf16 outputs instead of f16 (exact
// too: the product has at most 6 significant bits and lies in [2^-10, 2688]).
template <bool BF16>
__global__ void dequant_nvfp4_16_kernel(const uint8_t* codes, const uint8_t* scales, int64_t R,
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
      const float vlo = e2m1_value(b & 0xfu) * s, vhi = e2m1_value(b >> 4) * s;
      const uint16_t lo = BF16 ? dt::f32_to_bf16(vlo) : dt::f32_to_f16(vlo);
      const uint16_t hi = BF16 ? dt::f32_to_bf16(vhi) : dt::f32_to_f16(vhi);
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
    out[i] = __fmul_rn(e2m1_value(dt::get_nibble(codes + n * (K / 2), k)), s);
  }
}

// splitmix64's i-th (0-based) output from `seed` as u in [0, 1) (docs/linear.md; the CPU's rule).
__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 5.9604644775390625e-08f;  // 2^-24
}

__device__ __forceinline__ float safe_scale(float s) { return s > 0.f ? s : 1.f; }
__device__ __forceinline__ float clamp6(float z) {
  z = z > 6.f ? 6.f : z;
  return z < -6.f ? -6.f : z;
}
// Upper neighbour with probability (a - lo) / (hi - lo).
__device__ __forceinline__ bool take_upper(float lo, float hi, float a, float u) {
  return u < (a - lo) / (hi - lo);
}

__device__ uint8_t stochastic_e4m3(float z, float u) {
  if (z != z) return dt::f32_to_e4m3(z);
  const float a = fabsf(z);
  const uint8_t sign = z < 0.f ? 0x80u : 0u;
  if (a >= 448.f) return static_cast<uint8_t>(sign | 0x7eu);
  uint8_t c = dt::f32_to_e4m3(a);
  if (dt::e4m3_to_f32(c) > a) --c;
  const float lo = dt::e4m3_to_f32(c), hi = dt::e4m3_to_f32(static_cast<uint8_t>(c + 1));
  if (lo == a) return static_cast<uint8_t>(sign | c);
  return static_cast<uint8_t>(sign | (take_upper(lo, hi, a, u) ? c + 1 : c));
}

__device__ uint8_t stochastic_e2m1(float z, float u) {
  if (z != z) return 0;
  const float a = fabsf(clamp6(z));
  int lo = 0;
  while (lo < 7 && dt::e2m1_to_f32(static_cast<uint8_t>(lo + 1)) <= a) ++lo;
  int idx = lo;
  if (lo < 7) {
    const float ml = dt::e2m1_to_f32(static_cast<uint8_t>(lo));
    const float mh = dt::e2m1_to_f32(static_cast<uint8_t>(lo + 1));
    if (ml != a && take_upper(ml, mh, a, u)) idx = lo + 1;
  }
  return static_cast<uint8_t>(idx | (z < 0.f ? 8 : 0));
}

// Integer code of element (n, k) of an int-family weight.
__device__ __forceinline__ int32_t requant_int_code(const RequantParams& p, int64_t n, int64_t k) {
  const float rs = p.scales[n];
  const float sc = safe_scale(p.ratios ? __fmul_rn(p.ratios[n * (p.K / p.group) + k / p.group], rs)
                                       : rs);
  const float z = p.w_rot[n * p.K + k] / sc;
  const float q = static_cast<float>(p.qmax);
  if (!p.stochastic) return dt::f32_to_int_clamped(z, -p.qmax, p.qmax);
  float r = floorf(__fadd_rn(z, uniform01(p.seed, static_cast<uint64_t>(n * p.K + k))));
  r = r > q ? q : r;
  r = r < -q ? -q : r;
  return r == r ? static_cast<int32_t>(r) : 0;
}

__global__ void requantize_kernel(RequantParams p) {
  // Units per row: the smallest run of codes that fills whole stored bytes.
  int64_t units;
  switch (p.format) {
    case RequantFormat::packed: units = p.K / 8; break;
    case RequantFormat::ternary: units = (p.K + 4) / 5; break;
    case RequantFormat::comfy_int4:
    case RequantFormat::nvfp4: units = p.K / 2; break;
    default: units = p.K;
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.N * units;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / units, u = i % units;
    uint8_t* row = p.codes + n * p.row_bytes;
    switch (p.format) {
      case RequantFormat::int8:
        row[u] = static_cast<uint8_t>(static_cast<int8_t>(requant_int_code(p, n, u)));
        break;
      case RequantFormat::packed: {
        uint64_t word = 0;
        for (int j = 0; j < 8; ++j)
          word |= static_cast<uint64_t>(requant_int_code(p, n, u * 8 + j) + p.qmax) << (j * p.bits);
        for (int b = 0; b < p.bits; ++b) row[u * p.bits + b] = static_cast<uint8_t>(word >> (8 * b));
        break;
      }
      case RequantFormat::ternary: {
        int v = 0, w = 1;
        for (int j = 0; j < 5; ++j, w *= 3) {
          const int64_t k = u * 5 + j;
          v += (k < p.K ? requant_int_code(p, n, k) + 1 : 0) * w;
        }
        row[u] = static_cast<uint8_t>(v);
        break;
      }
      case RequantFormat::comfy_int4: {
        const int32_t c0 = requant_int_code(p, n, 2 * u), c1 = requant_int_code(p, n, 2 * u + 1);
        row[u] = static_cast<uint8_t>((c0 & 15) | ((c1 & 15) << 4));
        break;
      }
      case RequantFormat::e4m3: {
        const float z = p.w_rot[n * p.K + u] / safe_scale(p.scales[n]);
        row[u] = p.stochastic ? stochastic_e4m3(z, uniform01(p.seed, static_cast<uint64_t>(n * p.K + u)))
                              : dt::f32_to_e4m3(z);
        break;
      }
      default: {  // nvfp4
        const float pts = *p.tensor_scale;
        uint8_t c[2];
        for (int j = 0; j < 2; ++j) {
          const int64_t k = 2 * u + j;
          const float den =
              safe_scale(__fmul_rn(dt::e4m3_to_f32(p.block_scales[n * (p.K / 16) + k / 16]), pts));
          const float z = clamp6(p.w_rot[n * p.K + k] / den);
          c[j] = p.stochastic ? stochastic_e2m1(z, uniform01(p.seed, static_cast<uint64_t>(n * p.K + k)))
                              : dt::f32_to_e2m1(z);
        }
        row[u] = static_cast<uint8_t>(c[0] | (c[1] << 4));
      }
    }
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

void dequant_nvfp4_16(const uint8_t* codes, const uint8_t* scales, int64_t R, int64_t C,
                      uint16_t* out, DType out_dtype, cudaStream_t stream) {
  if (R == 0 || C == 0) return;
  const int grid = grid_for(R * (C / 16));
  if (out_dtype == DType::bf16)
    dequant_nvfp4_16_kernel<true><<<grid, kThreads, 0, stream>>>(codes, scales, R, C, out);
  else
    dequant_nvfp4_16_kernel<false><<<grid, kThreads, 0, stream>>>(codes, scales, R, C, out);
  check_launch("dequant_nvfp4_16");
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

void requantize_codes(const RequantParams& p, cudaStream_t stream) {
  if (p.N == 0 || p.K == 0) return;
  requantize_kernel<<<grid_for(p.N * p.K / 2 + 1), kThreads, 0, stream>>>(p);
  check_launch("requantize_codes");
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
