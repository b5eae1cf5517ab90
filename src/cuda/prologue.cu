// CUDA attention prologue (SPEC §1): memory-bound row kernels, fp32 math in the CPU oracle's order.
//
// Thread mapping: a row of D channels is held by D/16 consecutive lanes, two 8-channel chunks
// (two 16-byte loads) per lane. For split-half RoPE over all channels a lane holds chunk k and
// its rotation partner k + D/16 ("paired"), so the rotation needs no exchange; otherwise it holds
// chunks 2k and 2k+1 ("contiguous": interleaved pairs never leave a chunk; split-half partial
// rotary reads the few partners it lacks from memory). The sum of squares adds each chunk in
// channel order, then the chunks as a pairwise tree (xor shuffles), exactly the CPU's order.
//
// norm_rope_quantize: a CTA owns a tile of whole blocks (<= 128 rows when block <= 128) of one
// (batch, head group): it reads x once into registers as fp32 v, reduces row maxima into the
// layout's group scales in shared memory, then writes the codes. Heads of a group run one after
// the other so the rotary table (shared by heads) is served from L1.
// norm_rope_mean: a cluster of 8 CTAs per (batch, head) sums the rows in registers, reduces in
// shared memory, and rank 0 adds the 8 partial sums through distributed shared memory; no scratch
// buffer and no atomics, so the result is deterministic.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "src/core/check.h"
#include "src/core/prologue_internal.h"
#include "src/cuda/common.cuh"

namespace lowbit {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kChunkRows = 128;  // rows held in registers per pass of a tile
constexpr int kMeanCluster = 8;  // CTAs per (batch, head) in the mean pass (portable size)

// ---- scalar helpers ---------------------------------------------------------------------------

template <bool BF16>
__device__ __forceinline__ float act_to_f32(uint32_t bits16) {
  if constexpr (BF16)
    return __uint_as_float(bits16 << 16);
  else
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

template <bool BF16>
__device__ __forceinline__ float round_act(float v) {
  if constexpr (BF16)
    return __bfloat162float(__float2bfloat16_rn(v));
  else
    return __half2float(__float2half_rn(v));
}

template <bool BF16>
__device__ __forceinline__ uint32_t act_bits(float v) {
  if constexpr (BF16)
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else
    return __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ float load_any(const void* p, int64_t off, DType dt) {
  switch (dt) {
    case DType::bf16:
      return __uint_as_float(static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(p) + off)) << 16);
    case DType::f16:
      return __half2float(__ushort_as_half(__ldg(static_cast<const unsigned short*>(p) + off)));
    default:
      return __ldg(static_cast<const float*>(p) + off);
  }
}

// 16 bytes of x, streamed past L1 (x is read once per pass; L1 is kept for the table).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The approximate fp32 division Triton emits for `/` (SageAttention's quantizers use it).
__device__ __forceinline__ float div_full(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// max that propagates NaN (one FMNMX.NAN; |a| folds into the operand).
__device__ __forceinline__ float max_nan(float m, float a) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(a));
  return r;
}

// SPEC §1 rounding of one value with a nonzero scale: q = v / scale (div.full); q += 0.5*sign(q);
// truncate (cvt.rzi: NaN -> 0); clamp to int8 (a safety net: |q| <= 127 for any finite scale).
// copysign(0.5, q) differs from Triton's where(q >= 0, 0.5, -0.5) only at q = -0 and NaN, where
// both give code 0.
__device__ __forceinline__ int quantize_code(float v, float scale) {
  float q = div_full(v, scale);
  q = __fadd_rn(q, copysignf(0.5f, q));
  const int i = __float2int_rz(q);
  return min(127, max(-128, i));
}

template <bool BF16>
__device__ __forceinline__ void unpack(uint4 r, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = act_to_f32<BF16>(w[i] & 0xffffu);
    f[2 * i + 1] = act_to_f32<BF16>(w[i] >> 16);
  }
}

// Sum of squares of one 8-channel chunk in channel order.
__device__ __forceinline__ float chunk_squares(const float* x) {
  float s = __fmul_rn(x[0], x[0]);
#pragma unroll
  for (int j = 1; j < 8; ++j) s = __fmaf_rn(x[j], x[j], s);
  return s;
}

template <int LANES>
__device__ __forceinline__ float lane_tree_sum(float s) {
#pragma unroll
  for (int o = 1; o < LANES; o <<= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
  return s;
}

template <int LANES>
__device__ __forceinline__ float lane_max(float s) {
#pragma unroll
  for (int o = 1; o < LANES; o <<= 1) s = max_nan(s, __shfl_xor_sync(0xffffffffu, s, o));
  return s;
}

// Table access modes, decided on the host.
enum TableMode : int { kTableScalar = 0, kTablePairsF32 = 1, kTableMatrixF32 = 2 };

// cos / sin of 8 consecutive pairs starting at `pair` (a multiple of 4).
__device__ __forceinline__ void load_table8(const PrologueArgs& a, int mode, int64_t row_off,
                                            int pair, float (&cs)[8], float (&sn)[8]) {
  if (mode == kTablePairsF32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.rope) + row_off +
                                                      2 * static_cast<int64_t>(pair));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 t = __ldg(p + i);
      cs[2 * i] = t.x, sn[2 * i] = t.y, cs[2 * i + 1] = t.z, sn[2 * i + 1] = t.w;
    }
  } else if (mode == kTableMatrixF32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.rope) + row_off +
                                                      4 * static_cast<int64_t>(pair));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 t = __ldg(p + i);
      cs[i] = t.x, sn[i] = t.z;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t o = row_off + static_cast<int64_t>(pair + i) * a.r_sp;
      const bool in = pair + i < a.pairs;
      cs[i] = in ? load_any(a.rope, o, a.r_dtype) : 1.f;
      sn[i] = in ? load_any(a.rope, o + a.r_sc, a.r_dtype) : 0.f;
    }
  }
}

// Per-CTA constants in shared memory: the (D) norm weight and the head's (D) mean.
template <int D>
struct RowShared {
  float w[D];
  float mean[D];
};

// One row's values for this lane: v[0..7] are channels ch0.., v[8..15] channels ch1.. .
// `ok`: the token exists (otherwise v = 0 and nothing is read). All lanes of the row must call
// this together (shuffles).
template <int D, bool BF16, bool PAIRED>
__device__ __forceinline__ void row_values(const PrologueArgs& a, int table_mode,
                                           const RowShared<D>& sh, int64_t b, int64_t n, int64_t h,
                                           bool ok, int ch0, int ch1, uint4 r0, uint4 r1,
                                           float (&v)[16]) {
  constexpr int LANES = D / 16;
  float x[16];
  unpack<BF16>(r0, x);
  unpack<BF16>(r1, x + 8);
  float inv = 1.f;
  int64_t wo = 0;
  if (a.norm) {
    const float p0 = chunk_squares(x), p1 = chunk_squares(x + 8);
    float total;
    if (PAIRED)
      total = __fadd_rn(lane_tree_sum<LANES>(p0), lane_tree_sum<LANES>(p1));
    else
      total = lane_tree_sum<LANES>(__fadd_rn(p0, p1));
    // D is a power of two here, so total * (1/D) is the exact quotient total / D.
    static_assert((D & (D - 1)) == 0, "D must be a power of two");
    inv = __frsqrt_rn(__fadd_rn(__fmul_rn(total, 1.f / static_cast<float>(D)), a.eps));
    if (a.w_rows) {
      wo = ok ? static_cast<int64_t>(__ldg(a.w_rows + n * a.w_rows_s)) * a.w_sr : 0;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int c = (j < 8 ? ch0 : ch1) + (j & 7);
        x[j] = round_act<BF16>(__fmul_rn(__fmul_rn(x[j], inv), load_any(a.w, wo + c, a.w_dtype)));
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int c = (j < 8 ? ch0 : ch1) + (j & 7);
        x[j] = round_act<BF16>(__fmul_rn(__fmul_rn(x[j], inv), sh.w[c]));
      }
    }
  }
  // x now holds y (the norm output); v receives the rotation.
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = x[j];
  if (a.rotate && ok) {
    const int64_t ro = b * a.r_sb + n * a.r_sn;
    if (PAIRED) {  // chunk 0 leads, chunk 1 trails; pairs ch0 .. ch0 + 7
      float cs[8], sn[8];
      load_table8(a, table_mode, ro, ch0, cs, sn);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[j] = __fmaf_rn(cs[j], x[j], -__fmul_rn(sn[j], x[8 + j]));
        v[8 + j] = __fmaf_rn(sn[j], x[j], __fmul_rn(cs[j], x[8 + j]));
      }
    } else if (a.interleaved) {  // pairs (2p, 2p+1) inside the lane: pairs ch0/2 .. ch0/2 + 7
      if (ch0 < 2 * a.pairs) {
        float cs[8], sn[8];
        load_table8(a, table_mode, ro, ch0 / 2, cs, sn);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (ch0 + 2 * i < 2 * a.pairs) {
            v[2 * i] = __fmaf_rn(cs[i], x[2 * i], -__fmul_rn(sn[i], x[2 * i + 1]));
            v[2 * i + 1] = __fmaf_rn(sn[i], x[2 * i], __fmul_rn(cs[i], x[2 * i + 1]));
          }
        }
      }
    } else if (ch0 < 2 * a.pairs) {  // split-half partial rotary: partners read from memory
      const int64_t xo = b * a.x_sb + n * a.x_sn + h * a.x_sh;
      const int P = static_cast<int>(a.pairs);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int c = ch0 + j;  // contiguous lanes: ch1 = ch0 + 8
        if (c < 2 * P) {
          const bool leading = c < P;
          const int partner = leading ? c + P : c - P, pair = leading ? c : c - P;
          float other = load_any(a.x, xo + partner, a.x_dtype);
          if (a.norm) {
            const float w = a.w_rows ? load_any(a.w, wo + partner, a.w_dtype) : sh.w[partner];
            other = round_act<BF16>(__fmul_rn(__fmul_rn(other, inv), w));
          }
          const int64_t to = ro + static_cast<int64_t>(pair) * a.r_sp;
          const float cs = load_any(a.rope, to, a.r_dtype);
          const float sn = load_any(a.rope, to + a.r_sc, a.r_dtype);
          v[j] = leading ? __fmaf_rn(cs, x[j], -__fmul_rn(sn, other))
                         : __fmaf_rn(sn, other, __fmul_rn(cs, x[j]));
        }
      }
    }
  }
  if (a.mean) {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = __fsub_rn(v[j], sh.mean[(j < 8 ? ch0 : ch1) + (j & 7)]);
  }
  if (!ok) {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = 0.f;  // rows past N are zero, never -mean
  }
}

template <int D, bool PAIRED>
__device__ __forceinline__ void lane_channels(int lane_in_row, int& ch0, int& ch1) {
  if (PAIRED) {
    ch0 = 8 * lane_in_row;
    ch1 = ch0 + D / 2;
  } else {
    ch0 = 16 * lane_in_row;
    ch1 = ch0 + 8;
  }
}

__device__ __forceinline__ int group_of_row(ScaleLayout layout, int r) {
  switch (layout) {
    case ScaleLayout::thread_q: return r % 8;
    case ScaleLayout::thread_k: return (r % 8) / 2;
    case ScaleLayout::warp_q: return r / 32;
    default: return 0;
  }
}

// Rows of block-relative group g: i-th row, and how many there are.
__device__ __forceinline__ int group_rows(ScaleLayout layout, int block, int g) {
  switch (layout) {
    case ScaleLayout::thread_q: return block / 8;
    case ScaleLayout::thread_k: return block / 4;
    case ScaleLayout::warp_q: return max(0, min(32, block - 32 * g));
    default: return block;
  }
}
__device__ __forceinline__ int group_row(ScaleLayout layout, int g, int i) {
  switch (layout) {
    case ScaleLayout::thread_q: return g + 8 * i;
    case ScaleLayout::thread_k: return 8 * (i / 2) + 2 * g + (i & 1);
    case ScaleLayout::warp_q: return 32 * g + i;
    default: return i;
  }
}

// ---- norm_rope_quantize -----------------------------------------------------------------------

struct QuantizeLaunch {
  int tile_rows;     // whole blocks; a multiple of `block`
  int64_t tiles;     // per (batch, head)
  int head_group;    // heads per CTA
  int table_mode;
};

template <int D, bool BF16, bool PAIRED>
__global__ void __launch_bounds__(kThreads, 2)
    quantize_kernel(const PrologueArgs a, const QuantizeLaunch L) {
  constexpr int LANES = D / 16;
  constexpr int RPS = kThreads / LANES;        // rows per step
  constexpr int STEPS = kChunkRows / RPS;      // steps per chunk
  extern __shared__ float dyn[];               // row maxima (tile_rows), then the tile's scales
  __shared__ RowShared<D> sh;
  float* row_amax = dyn;
  float* scales = dyn + L.tile_rows;

  const int tid = threadIdx.x, lane_in_row = tid % LANES, row_in_step = tid / LANES;
  int ch0, ch1;
  lane_channels<D, PAIRED>(lane_in_row, ch0, ch1);
  const int64_t b = blockIdx.z, tile = blockIdx.y;
  const int64_t h0 = static_cast<int64_t>(blockIdx.x) * L.head_group;
  const int64_t h1 = a.heads < h0 + L.head_group ? a.heads : h0 + L.head_group;
  const int blocks_in_tile = L.tile_rows / a.block;
  const int64_t first_block = tile * blocks_in_tile;
  const int64_t blocks_left = a.n_blocks - first_block;
  const int nscales =
      static_cast<int>(blocks_left < blocks_in_tile ? blocks_left : blocks_in_tile) * a.groups;
  const int64_t row0 = tile * L.tile_rows;  // token of the tile's row 0
  const int chunks = (L.tile_rows + kChunkRows - 1) / kChunkRows;

  if (a.norm && !a.w_rows)
    for (int c = tid; c < D; c += kThreads) sh.w[c] = load_any(a.w, c, a.w_dtype);

  float v[STEPS][16];
  for (int64_t h = h0; h < h1; ++h) {
    __syncthreads();  // the previous head's readers of sh.mean / scales are done
    if (a.mean)
      for (int c = tid; c < D; c += kThreads) sh.mean[c] = a.mean[b * a.m_sb + h * a.m_sh + c];
    __syncthreads();
    const int64_t xbh = b * a.x_sb + h * a.x_sh;
    const uint16_t* x = static_cast<const uint16_t*>(a.x);

    auto compute_chunk = [&](int chunk) {
      uint4 raw[STEPS][2];
#pragma unroll
      for (int s = 0; s < STEPS; ++s) {
        const int r = chunk * kChunkRows + s * RPS + row_in_step;
        const int64_t n = row0 + r;
        raw[s][0] = raw[s][1] = make_uint4(0, 0, 0, 0);
        if (r < L.tile_rows && n < a.tokens) {
          raw[s][0] = load_stream16(x + xbh + n * a.x_sn + ch0);
          raw[s][1] = load_stream16(x + xbh + n * a.x_sn + ch1);
        }
      }
#pragma unroll
      for (int s = 0; s < STEPS; ++s) {
        const int r = chunk * kChunkRows + s * RPS + row_in_step;
        const int64_t n = row0 + r;
        const bool ok = r < L.tile_rows && n < a.tokens;
        row_values<D, BF16, PAIRED>(a, L.table_mode, sh, b, n, h, ok, ch0, ch1, raw[s][0],
                                    raw[s][1], v[s]);
        if (a.sm_scale != 1.f) {  // x * 1 is exact: skipping it changes no bit
#pragma unroll
          for (int j = 0; j < 16; ++j) v[s][j] = __fmul_rn(v[s][j], a.sm_scale);
        }
      }
    };

    // Pass 1: row maxima.
    for (int chunk = 0; chunk < chunks; ++chunk) {
      compute_chunk(chunk);
#pragma unroll
      for (int s = 0; s < STEPS; ++s) {
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < 16; ++j) m = max_nan(m, fabsf(v[s][j]));
        m = lane_max<LANES>(m);
        const int r = chunk * kChunkRows + s * RPS + row_in_step;
        if (lane_in_row == 0 && r < L.tile_rows) row_amax[r] = m;
      }
    }
    __syncthreads();
    // Group scales: one warp per scale, lanes over the group's rows.
    const int warp = tid / 32, lane = tid % 32;
    for (int si = warp; si < nscales; si += kThreads / 32) {
      const int bi = si / a.groups, g = si % a.groups;
      const int cnt = group_rows(a.layout, a.block, g);
      float m = 0.f;
      for (int i = lane; i < cnt; i += 32)
        m = max_nan(m, row_amax[bi * a.block + group_row(a.layout, g, i)]);
      m = lane_max<32>(m);
      const float scale = __fadd_rn(div_full(m, 127.f), a.scale_eps);
      if (lane == 0) {
        scales[si] = scale;
        a.scale[b * a.s_sb + h * a.s_sh + first_block * a.groups + si] = scale;
      }
    }
    __syncthreads();
    // Pass 2: codes (recomputed when the tile spans several chunks).
    for (int chunk = 0; chunk < chunks; ++chunk) {
      if (chunks > 1) compute_chunk(chunk);
#pragma unroll
      for (int s = 0; s < STEPS; ++s) {
        const int r = chunk * kChunkRows + s * RPS + row_in_step;
        const int64_t n = row0 + r;
        if (r >= L.tile_rows || n >= a.tokens) continue;
        const float scale = scales[(r / a.block) * a.groups + group_of_row(a.layout, r % a.block)];
        uint32_t packed[4] = {0, 0, 0, 0};  // a zero scale (all-zero group): codes 0, no 0/0
        if (scale != 0.f) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const uint32_t c0 = static_cast<uint32_t>(quantize_code(v[s][4 * k], scale));
            const uint32_t c1 = static_cast<uint32_t>(quantize_code(v[s][4 * k + 1], scale));
            const uint32_t c2 = static_cast<uint32_t>(quantize_code(v[s][4 * k + 2], scale));
            const uint32_t c3 = static_cast<uint32_t>(quantize_code(v[s][4 * k + 3], scale));
            packed[k] = __byte_perm(__byte_perm(c0, c1, 0x0040), __byte_perm(c2, c3, 0x0040), 0x5410);
          }
        }
        int8_t* q = a.q + b * a.q_sb + n * a.q_sn + h * a.q_sh;
        *reinterpret_cast<uint2*>(q + ch0) = make_uint2(packed[0], packed[1]);
        *reinterpret_cast<uint2*>(q + ch1) = make_uint2(packed[2], packed[3]);
      }
    }
  }
}

// ---- norm_rope_mean ---------------------------------------------------------------------------

template <int D, bool BF16, bool PAIRED>
__global__ void __cluster_dims__(kMeanCluster, 1, 1) __launch_bounds__(kThreads)
    mean_kernel(const PrologueArgs a, int table_mode) {
  constexpr int LANES = D / 16;
  constexpr int RPS = kThreads / LANES;
  constexpr int UNROLL = 4;
  __shared__ RowShared<D> sh;
  __shared__ float red[RPS][D];
  __shared__ float cta_sum[D];

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int tid = threadIdx.x, lane_in_row = tid % LANES, row_in_step = tid / LANES;
  int ch0, ch1;
  lane_channels<D, PAIRED>(lane_in_row, ch0, ch1);
  const int64_t h = blockIdx.y, b = blockIdx.z;
  if (a.norm && !a.w_rows)
    for (int c = tid; c < D; c += kThreads) sh.w[c] = load_any(a.w, c, a.w_dtype);
  __syncthreads();

  float acc[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j] = 0.f;
  const int64_t steps = (a.tokens + RPS - 1) / RPS;
  const int64_t xbh = b * a.x_sb + h * a.x_sh;
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  // Steps rank, rank + 8, ...; UNROLL of them loaded before use.
  for (int64_t s0 = rank; s0 < steps; s0 += kMeanCluster * UNROLL) {
    uint4 raw[UNROLL][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t n = (s0 + u * kMeanCluster) * RPS + row_in_step;
      raw[u][0] = raw[u][1] = make_uint4(0, 0, 0, 0);
      if (n < a.tokens) {
        raw[u][0] = load_stream16(x + xbh + n * a.x_sn + ch0);
        raw[u][1] = load_stream16(x + xbh + n * a.x_sn + ch1);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t n = (s0 + u * kMeanCluster) * RPS + row_in_step;
      float v[16];
      row_values<D, BF16, PAIRED>(a, table_mode, sh, b, n, h, n < a.tokens, ch0, ch1, raw[u][0],
                                  raw[u][1], v);
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[j] = __fadd_rn(acc[j], v[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) red[row_in_step][(j < 8 ? ch0 : ch1) + (j & 7)] = acc[j];
  __syncthreads();
  for (int c = tid; c < D; c += kThreads) {
    float s = 0.f;
    for (int r = 0; r < RPS; ++r) s = __fadd_rn(s, red[r][c]);
    cta_sum[c] = s;
  }
  cluster.sync();
  if (rank == 0) {
    for (int c = tid; c < D; c += kThreads) {
      float t = 0.f;
      for (int k = 0; k < kMeanCluster; ++k) t = __fadd_rn(t, cluster.map_shared_rank(cta_sum, k)[c]);
      a.mean_out[b * a.mo_sb + h * a.mo_sh + c] = __fdiv_rn(t, static_cast<float>(a.tokens));
    }
  }
  cluster.sync();  // keep every rank's shared memory alive until rank 0 has read it
}

// ---- rows store (the unfused steps of the bench: norm only, rope only) ------------------------

template <int D, bool BF16, bool PAIRED>
__global__ void __launch_bounds__(kThreads) store_kernel(const PrologueArgs a, int table_mode,
                                                          void* out, int64_t o_sb, int64_t o_sn,
                                                          int64_t o_sh) {
  constexpr int LANES = D / 16;
  constexpr int RPS = kThreads / LANES;
  __shared__ RowShared<D> sh;
  const int tid = threadIdx.x, lane_in_row = tid % LANES, row_in_step = tid / LANES;
  int ch0, ch1;
  lane_channels<D, PAIRED>(lane_in_row, ch0, ch1);
  if (a.norm && !a.w_rows)
    for (int c = tid; c < D; c += kThreads) sh.w[c] = load_any(a.w, c, a.w_dtype);
  __syncthreads();
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * RPS + row_in_step;
  const bool ok = n < a.tokens;
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  uint4 r0 = make_uint4(0, 0, 0, 0), r1 = r0;
  const int64_t xo = b * a.x_sb + n * a.x_sn + h * a.x_sh;
  if (ok) {
    r0 = load_stream16(x + xo + ch0);
    r1 = load_stream16(x + xo + ch1);
  }
  float v[16];
  row_values<D, BF16, PAIRED>(a, table_mode, sh, b, n, h, ok, ch0, ch1, r0, r1, v);
  if (!ok) return;
  uint32_t w[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) w[k] = act_bits<BF16>(v[2 * k]) | (act_bits<BF16>(v[2 * k + 1]) << 16);
  uint16_t* o = static_cast<uint16_t*>(out) + b * o_sb + n * o_sn + h * o_sh;
  *reinterpret_cast<uint4*>(o + ch0) = make_uint4(w[0], w[1], w[2], w[3]);
  *reinterpret_cast<uint4*>(o + ch1) = make_uint4(w[4], w[5], w[6], w[7]);
}

// ---- host side --------------------------------------------------------------------------------

int table_mode_of(const PrologueArgs& a) {
  if (!a.rotate || a.r_dtype != DType::f32) return kTableScalar;
  const bool aligned = reinterpret_cast<uintptr_t>(a.rope) % 16 == 0 && a.r_sn % 4 == 0 &&
                       (a.r_sb % 4 == 0);
  if (!aligned) return kTableScalar;
  // Vector loads cover 8 pairs at a time: the table must hold them (pairs a multiple of 4 for
  // interleaved lanes that start at pair 8k; split-half paired lanes cover all D/2 pairs).
  if (a.pairs % 8 != 0) return kTableScalar;
  if (a.r_sp == 2 && a.r_sc == 1) return kTablePairsF32;
  if (a.r_sp == 4 && a.r_sc == 2) return kTableMatrixF32;
  return kTableScalar;
}

bool paired_of(const PrologueArgs& a) {
  return a.rotate && !a.interleaved && 2 * a.pairs == a.dim;
}

template <typename F>
void dispatch_kernel(const PrologueArgs& a, const char* op, F&& f) {
  const bool bf16 = a.x_dtype == DType::bf16, paired = paired_of(a);
  auto by_dim = [&](auto bf, auto pr) {
    if (a.dim == 64)
      f(std::integral_constant<int, 64>{}, bf, pr);
    else if (a.dim == 128)
      f(std::integral_constant<int, 128>{}, bf, pr);
    else
      check::fail(op, "x", "head dim on cuda: expected 64 or 128, got " + std::to_string(a.dim));
  };
  auto by_pair = [&](auto bf) {
    if (paired)
      by_dim(bf, std::true_type{});
    else
      by_dim(bf, std::false_type{});
  };
  if (bf16)
    by_pair(std::true_type{});
  else
    by_pair(std::false_type{});
}

}  // namespace

void norm_rope_quantize(const PrologueArgs& a, Context& ctx) {
  QuantizeLaunch L;
  L.tile_rows = a.block >= kChunkRows ? a.block : a.block * (kChunkRows / a.block);
  const int64_t padded_rows = a.n_blocks * a.block;
  L.tiles = (padded_rows + L.tile_rows - 1) / L.tile_rows;
  L.table_mode = table_mode_of(a);
  // Heads per CTA: enough CTAs for ~3 resident per SM, the rest of the heads looped so that the
  // rotary table of a tile is reused from L1.
  const int64_t sms = multiprocessor_count();
  const int64_t units = L.tiles * a.heads * a.batch;
  L.head_group = a.rotate ? static_cast<int>(std::clamp<int64_t>(units / (3 * sms), 1, 8)) : 1;
  const int64_t head_groups = (a.heads + L.head_group - 1) / L.head_group;
  check::that(L.tiles <= 65535 && a.batch <= 65535, "norm_rope_quantize", "x",
              "cuda grid: expected at most 65535 tiles and batch items, got " +
                  std::to_string(L.tiles) + " and " + std::to_string(a.batch));
  const size_t smem = sizeof(float) * (L.tile_rows + (L.tile_rows / a.block) * a.groups);
  dim3 grid(static_cast<unsigned>(head_groups), static_cast<unsigned>(L.tiles),
            static_cast<unsigned>(a.batch));
  dispatch_kernel(a, "norm_rope_quantize", [&](auto d, auto bf, auto pr) {
    auto kernel = quantize_kernel<decltype(d)::value, decltype(bf)::value, decltype(pr)::value>;
    if (smem > 48 * 1024)
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)),
                 "norm_rope_quantize", "shared memory");
    kernel<<<grid, kThreads, smem, stream_of(ctx)>>>(a, L);
  });
  check_launch("norm_rope_quantize");
}

void norm_rope_mean(const PrologueArgs& a, Context& ctx) {
  check::that(a.heads <= 65535 && a.batch <= 65535, "norm_rope_mean", "x",
              "cuda grid: expected at most 65535 heads and batch items");
  dim3 grid(kMeanCluster, static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch));
  const int mode = table_mode_of(a);
  dispatch_kernel(a, "norm_rope_mean", [&](auto d, auto bf, auto pr) {
    mean_kernel<decltype(d)::value, decltype(bf)::value, decltype(pr)::value>
        <<<grid, kThreads, 0, stream_of(ctx)>>>(a, mode);
  });
  check_launch("norm_rope_mean");
}

void norm_rope_store(const PrologueArgs& a, void* out, int64_t o_sb, int64_t o_sn, int64_t o_sh,
                     Context& ctx) {
  const int rps = kThreads / static_cast<int>(a.dim / 16);
  dim3 grid(static_cast<unsigned>((a.tokens + rps - 1) / rps), static_cast<unsigned>(a.heads),
            static_cast<unsigned>(a.batch));
  const int mode = table_mode_of(a);
  dispatch_kernel(a, "norm_rope_store", [&](auto d, auto bf, auto pr) {
    store_kernel<decltype(d)::value, decltype(bf)::value, decltype(pr)::value>
        <<<grid, kThreads, 0, stream_of(ctx)>>>(a, mode, out, o_sb, o_sn, o_sh);
  });
  check_launch("norm_rope_store");
}

}  // namespace cuda
}  // namespace lowbit
