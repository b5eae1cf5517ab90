// CUDA attention prologue (SPEC §1): memory-bound row kernels, fp32 math in the CPU oracle's order.
//
// Thread mapping: a row of D channels is held by D/16 consecutive lanes, two 8-channel chunks
// (two 16-byte loads) per lane. For split-half RoPE over all channels a lane holds chunk k and
// its rotation partner k + D/16 ("paired"), so the rotation needs no exchange; otherwise it holds
// chunks 2k and 2k+1 ("contiguous": interleaved pairs never leave a chunk; split-half partial
// rotary reads the few partners it lacks from memory; the fast kernels use the paired placement
// without rope too). The sum of squares adds each chunk in
// channel order, then the chunks as a pairwise tree (xor shuffles), exactly the CPU's order.
//
// Head dim 64, 128 and 256 (D = 256: 16 lanes per row; the round-3/4 kernels of prologue_v3.cu
// take 64 / 128 only, so D = 256 always runs the kernels of this file).
//
// norm_rope_quantize: a CTA owns a tile of whole blocks (<= 128 rows when block <= 128) of one
// (batch, head group): it reads x once into registers as fp32 v (128 rows per pass; 64 at
// D = 256, a 128-row tile then reads x twice), reduces row maxima into the layout's group scales
// in shared memory, then writes the codes. Heads of a group run one after
// the other so the rotary table (shared by heads) is served from L1.
// norm_rope_mean (first generation): a cluster of 8 CTAs per (batch, head) sums the rows in
// registers, reduces in shared memory, and rank 0 adds the 8 partial sums through distributed
// shared memory; no scratch buffer and no atomics, so the result is deterministic.
// The fast kernels (default where they apply) are described further down.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

#include "src/core/check.h"
#include "src/core/prologue_internal.h"
#include "src/cuda/common.cuh"
#include "src/cuda/prologue_common.cuh"

namespace lowbit {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kChunkRows = 128;  // rows held in registers per pass of a tile
// Rows per pass at head dim D: D = 256 holds 64 (16 lanes per row: 4 rows of 16 values per
// thread, the registers of D = 128's 128-row pass; 128 rows would spill).
__host__ __device__ constexpr int chunk_rows_of(int64_t D) { return D > 128 ? 64 : kChunkRows; }
constexpr int kMeanCluster = 8;  // CTAs per (batch, head) in the mean pass (portable size)

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
    if (a.token_inv) {  // NormScope::token: the token's inverse over H·D (token_inv_kernel)
      inv = ok ? __ldg(a.token_inv + b * a.tokens + n) : 1.f;
    } else {
      const float p0 = chunk_squares(x), p1 = chunk_squares(x + 8);
      float total;
      if (PAIRED)
        total = __fadd_rn(lane_tree_sum<LANES>(p0), lane_tree_sum<LANES>(p1));
      else
        total = lane_tree_sum<LANES>(__fadd_rn(p0, p1));
      // D is a power of two here, so total * (1/D) is the exact quotient total / D.
      static_assert((D & (D - 1)) == 0, "D must be a power of two");
      inv = norm_rsqrt(__fadd_rn(__fmul_rn(total, 1.f / static_cast<float>(D)), a.eps));
    }
    if (a.w_rows || a.norm_heads) {  // the token's weight row (segmented) or the head's
      wo = ok ? static_cast<int64_t>(a.norm_heads ? static_cast<int>(h) : seg_row(a, b, n)) * a.w_sr
              : 0;
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
    const int64_t ro = r_item(a, b) + n * a.r_sn;
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
      const int64_t xo = x_item(a, b) + n * a.x_sn + h * a.x_sh;
      const int P = static_cast<int>(a.pairs);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int c = ch0 + j;  // contiguous lanes: ch1 = ch0 + 8
        if (c < 2 * P) {
          const bool leading = c < P;
          const int partner = leading ? c + P : c - P, pair = leading ? c : c - P;
          float other = load_any(a.x, xo + partner, a.x_dtype);
          if (a.norm) {
            const float w = (a.w_rows || a.norm_heads) ? load_any(a.w, wo + partner, a.w_dtype)
                                                       : sh.w[partner];
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

// Rows of block-relative group g: how many there are (the i-th: group_row).
__device__ __forceinline__ int group_rows(ScaleLayout layout, int block, int g) {
  switch (layout) {
    case ScaleLayout::thread_q: return block / 8;
    case ScaleLayout::thread_k: return block / 4;
    case ScaleLayout::warp_q: return max(0, min(32, block - 32 * g));
    default: return block;
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
  constexpr int CHUNK = chunk_rows_of(D);      // rows per pass
  constexpr int STEPS = CHUNK / RPS;           // steps per chunk
  extern __shared__ float dyn[];               // row maxima (tile_rows), then the tile's scales
  __shared__ RowShared<D> sh;
  float* row_amax = dyn;
  float* scales = dyn + L.tile_rows;

  const int tid = threadIdx.x, lane_in_row = tid % LANES, row_in_step = tid / LANES;
  int ch0, ch1;
  lane_channels<D, PAIRED>(lane_in_row, ch0, ch1);
  const int64_t b = blockIdx.z, tile = blockIdx.y;
  const int64_t nb = tokens_of(a, b);  // (a padded varlen batch: the item's own tokens)
  const int64_t h0 = static_cast<int64_t>(blockIdx.x) * L.head_group;
  const int64_t h1 = a.heads < h0 + L.head_group ? a.heads : h0 + L.head_group;
  const int blocks_in_tile = L.tile_rows / a.block;
  const int64_t first_block = tile * blocks_in_tile;
  const int64_t blocks_left = a.n_blocks - first_block;
  const int nscales =
      static_cast<int>(blocks_left < blocks_in_tile ? blocks_left : blocks_in_tile) * a.groups;
  const int64_t row0 = tile * L.tile_rows;  // token of the tile's row 0
  const int chunks = (L.tile_rows + CHUNK - 1) / CHUNK;

  if (a.norm && !a.w_rows && !a.norm_heads)
    for (int c = tid; c < D; c += kThreads) sh.w[c] = load_any(a.w, c, a.w_dtype);

  float v[STEPS][16];
  for (int64_t h = h0; h < h1; ++h) {
    __syncthreads();  // the previous head's readers of sh.mean / scales are done
    if (a.mean)
      for (int c = tid; c < D; c += kThreads) sh.mean[c] = a.mean[b * a.m_sb + h * a.m_sh + c];
    __syncthreads();
    const int64_t xbh = x_item(a, b) + h * a.x_sh;
    const uint16_t* x = static_cast<const uint16_t*>(a.x);

    auto compute_chunk = [&](int chunk) {
      uint4 raw[STEPS][2];
#pragma unroll
      for (int s = 0; s < STEPS; ++s) {
        const int r = chunk * CHUNK + s * RPS + row_in_step;
        const int64_t n = row0 + r;
        raw[s][0] = raw[s][1] = make_uint4(0, 0, 0, 0);
        if (r < L.tile_rows && n < nb) {
          raw[s][0] = load_stream16(x + xbh + n * a.x_sn + ch0);
          raw[s][1] = load_stream16(x + xbh + n * a.x_sn + ch1);
        }
      }
#pragma unroll
      for (int s = 0; s < STEPS; ++s) {
        const int r = chunk * CHUNK + s * RPS + row_in_step;
        const int64_t n = row0 + r;
        const bool ok = r < L.tile_rows && n < nb;
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
        const int r = chunk * CHUNK + s * RPS + row_in_step;
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
        const int r = chunk * CHUNK + s * RPS + row_in_step;
        const int64_t n = row0 + r;
        if (r >= L.tile_rows || n >= nb) continue;
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

// Rows per step of the mean kernels: kThreads threads, D / 16 lanes per row.
template <int D>
constexpr int mean_rps() {
  return kThreads / (D / 16);
}

// CTA `rank`'s share of the (batch b, head h) column sums: steps rank, rank + kMeanCluster, ...
// (RPS rows each), UNROLL of them loaded before use, each thread's rows added in step order, then
// the RPS rows of `red` in row order into cta_sum[D]. sh.w must be loaded (and synchronized).
template <int D, bool BF16, bool PAIRED>
__device__ __forceinline__ void mean_rank_sums(const PrologueArgs& a, int table_mode,
                                               const RowShared<D>& sh, float (&red)[mean_rps<D>()][D],
                                               int rank, int64_t b, int64_t h, float* cta_sum) {
  constexpr int LANES = D / 16;
  constexpr int RPS = mean_rps<D>();
  constexpr int UNROLL = 4;
  const int tid = threadIdx.x, lane_in_row = tid % LANES, row_in_step = tid / LANES;
  int ch0, ch1;
  lane_channels<D, PAIRED>(lane_in_row, ch0, ch1);
  float acc[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j] = 0.f;
  const int64_t nb = tokens_of(a, b);  // (a padded varlen batch: the item's own tokens)
  const int64_t steps = (nb + RPS - 1) / RPS;
  const int64_t xbh = x_item(a, b) + h * a.x_sh;
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  // Steps rank, rank + 8, ...; UNROLL of them loaded before use.
  for (int64_t s0 = rank; s0 < steps; s0 += kMeanCluster * UNROLL) {
    uint4 raw[UNROLL][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t n = (s0 + u * kMeanCluster) * RPS + row_in_step;
      raw[u][0] = raw[u][1] = make_uint4(0, 0, 0, 0);
      if (n < nb) {
        raw[u][0] = load_stream16(x + xbh + n * a.x_sn + ch0);
        raw[u][1] = load_stream16(x + xbh + n * a.x_sn + ch1);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t n = (s0 + u * kMeanCluster) * RPS + row_in_step;
      float v[16];
      row_values<D, BF16, PAIRED>(a, table_mode, sh, b, n, h, n < nb, ch0, ch1, raw[u][0],
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
}

template <int D>
__device__ __forceinline__ void mean_load_weights(const PrologueArgs& a, RowShared<D>& sh) {
  if (a.norm && !a.w_rows && !a.norm_heads)
    for (int c = threadIdx.x; c < D; c += kThreads) sh.w[c] = load_any(a.w, c, a.w_dtype);
  __syncthreads();
}

// A cluster of kMeanCluster CTAs per (batch, head) (launched with the cluster attribute; sm_90
// code): rank r's sums, then rank 0 adds the ranks' sums in rank order through distributed shared
// memory.
template <int D, bool BF16, bool PAIRED>
__global__ void __launch_bounds__(kThreads) mean_kernel(const PrologueArgs a, int table_mode) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ RowShared<D> sh;
  __shared__ float red[mean_rps<D>()][D];
  __shared__ float cta_sum[D];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t h = blockIdx.y, b = blockIdx.z;
  mean_load_weights<D>(a, sh);
  mean_rank_sums<D, BF16, PAIRED>(a, table_mode, sh, red, rank, b, h, cta_sum);
  cluster.sync();
  if (rank == 0) {
    for (int c = threadIdx.x; c < D; c += kThreads) {
      float t = 0.f;
      for (int k = 0; k < kMeanCluster; ++k) t = __fadd_rn(t, cluster.map_shared_rank(cta_sum, k)[c]);
      a.mean_out[b * a.mo_sb + h * a.mo_sh + c] = mean_of(a, b, t);
    }
  }
  cluster.sync();  // keep every rank's shared memory alive until rank 0 has read it
#else
  __trap();  // launched only where the device code has clusters (legacy_norm_rope_mean)
#endif
}

// The same sums without clusters (device code older than sm_90): one CTA per (batch, head) runs
// the kMeanCluster ranks one after the other, then adds their sums in rank order: the same bits.
template <int D, bool BF16, bool PAIRED>
__global__ void __launch_bounds__(kThreads)
    mean_kernel_serial(const PrologueArgs a, int table_mode) {
  __shared__ RowShared<D> sh;
  __shared__ float red[mean_rps<D>()][D];
  __shared__ float sums[kMeanCluster][D];
  const int64_t h = blockIdx.y, b = blockIdx.z;
  mean_load_weights<D>(a, sh);
  for (int rank = 0; rank < kMeanCluster; ++rank) {
    mean_rank_sums<D, BF16, PAIRED>(a, table_mode, sh, red, rank, b, h, sums[rank]);
    __syncthreads();  // red is reused by the next rank
  }
  for (int c = threadIdx.x; c < D; c += kThreads) {
    float t = 0.f;
    for (int k = 0; k < kMeanCluster; ++k) t = __fadd_rn(t, sums[k][c]);
    a.mean_out[b * a.mo_sb + h * a.mo_sh + c] = mean_of(a, b, t);
  }
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
  if (a.norm && !a.w_rows && !a.norm_heads)
    for (int c = tid; c < D; c += kThreads) sh.w[c] = load_any(a.w, c, a.w_dtype);
  __syncthreads();
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * RPS + row_in_step;
  const bool ok = n < tokens_of(a, b);  // (a padded varlen batch: the item's own tokens)
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  uint4 r0 = make_uint4(0, 0, 0, 0), r1 = r0;
  const int64_t xo = x_item(a, b) + n * a.x_sn + h * a.x_sh;
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
    else if (a.dim == 256)
      f(std::integral_constant<int, 256>{}, bf, pr);
    else
      check::fail(op, "x",
                  "head dim on cuda: expected 64, 128 or 256, got " + std::to_string(a.dim));
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

void legacy_norm_rope_quantize(const PrologueArgs& a, Context& ctx) {
  QuantizeLaunch L;
  const int chunk = chunk_rows_of(a.dim);
  L.tile_rows = a.block >= chunk ? a.block : a.block * (chunk / a.block);
  const int64_t padded_rows = a.n_blocks * a.block;
  L.tiles = (padded_rows + L.tile_rows - 1) / L.tile_rows;
  L.table_mode = table_mode_of(a);
  // Heads per CTA: enough CTAs for ~3 resident per SM, the rest of the heads looped so that the
  // rotary table of a tile is reused from L1.
  const int64_t sms = multiprocessor_count();
  const int64_t units = L.tiles * a.heads * a.batch;
  L.head_group = a.rotate ? static_cast<int>(std::clamp<int64_t>(units / (3 * sms), 1, 8)) : 1;
  const int64_t head_groups = (a.heads + L.head_group - 1) / L.head_group;
  LOWBIT_CHECK(L.tiles <= 65535 && a.batch <= 65535, "norm_rope_quantize", "x",
               "cuda grid: expected at most 65535 tiles and batch items, got " +
                   std::to_string(L.tiles) + " and " + std::to_string(a.batch));
  const size_t smem = sizeof(float) * (L.tile_rows + (L.tile_rows / a.block) * a.groups);
  dim3 grid(static_cast<unsigned>(head_groups), static_cast<unsigned>(L.tiles),
            static_cast<unsigned>(a.batch));
  dispatch_kernel(a, "norm_rope_quantize", [&](auto d, auto bf, auto pr) {
    auto kernel = quantize_kernel<decltype(d)::value, decltype(bf)::value, decltype(pr)::value>;
    if (smem > 48 * 1024)
      set_kernel_smem(kernel, static_cast<int>(smem), "norm_rope_quantize", "shared memory");
    kernel<<<grid, kThreads, smem, stream_of(ctx)>>>(a, L);
  });
  check_launch("norm_rope_quantize");
}

void legacy_norm_rope_mean(const PrologueArgs& a, Context& ctx) {
  LOWBIT_CHECK(a.heads <= 65535 && a.batch <= 65535, "norm_rope_mean", "x",
               "cuda grid: expected at most 65535 heads and batch items");
  const int mode = table_mode_of(a);
  // Clusters where the GPU and the device code have them, else one CTA per (batch, head).
  const CodeArch code = code_arch();
  const bool clusters =
      code.sm >= 90 && code.ptx >= 90 && !detail::prologue_cuda_tuning().mean_no_cluster;
  const dim3 grid(clusters ? kMeanCluster : 1, static_cast<unsigned>(a.heads),
                  static_cast<unsigned>(a.batch));
  dispatch_kernel(a, "norm_rope_mean", [&](auto d, auto bf, auto pr) {
    constexpr int D = decltype(d)::value;
    constexpr bool BF16 = decltype(bf)::value, PAIRED = decltype(pr)::value;
    if (!clusters) {
      mean_kernel_serial<D, BF16, PAIRED><<<grid, kThreads, 0, stream_of(ctx)>>>(a, mode);
      return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.stream = stream_of(ctx);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kMeanCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    check_cuda(cudaLaunchKernelEx(&cfg, mean_kernel<D, BF16, PAIRED>, a, mode), "norm_rope_mean",
               "cluster launch");
  });
  check_launch("norm_rope_mean");
}

// ==== fast kernels (the default path) ==========================================================
//
// The round-2 mean kernel (the round-2 quantize kernel, dominated by the round-3 one's coverage,
// was deleted in session 8) gives each thread one row of a (batch, tile) pair of rows at a time,
// D/16 lanes per row (16 channels per lane, as above), and loops over a group of heads with the
// x loads of the next kMeanPrefetch (row, head) units in flight while the current one is
// computed. Every value that does not depend on the head is hoisted out of that loop: the norm
// weight (shared memory), the row's rotary values (registers), pointers.


constexpr int kMeanPrefetch = 4;   // mean kernel: (row, head) units whose loads are in flight
constexpr int kMeanWarps = 4;      // mean CTA: 4 warps
constexpr int kMeanMaxHeads = 6;   // heads per mean CTA (6 KB of accumulators per head)
constexpr int kMeanCtasPerSm = 4;  // mean CTAs resident per SM (registers: <= 128 per thread)
// mean_final launched with PDL unless the tuning knob `pdl` says otherwise.
constexpr int kPdlDefault = detail::kPdlOn;

// Chunks of a lane: lane_in_row and lane_in_row + LANES ("paired": every 8 lanes of a row read
// 128 contiguous bytes per load) unless pairs are interleaved (chunks 2 lane_in_row and +1, so a
// lane's pairs never leave it). Without rope the paired placement is used too: it keeps the loads
// coalesced, and the sum of squares (tree over chunks lane, lane + LANES) has the same order.
template <int D, int ROPE>
__device__ __forceinline__ void fast_lane_channels(int lane_in_row, int& ch0, int& ch1) {
  if (ROPE != kRopeInterleaved) {
    ch0 = 8 * lane_in_row;
    ch1 = ch0 + D / 2;
  } else {
    ch0 = 16 * lane_in_row;
    ch1 = ch0 + 8;
  }
}

__device__ __forceinline__ int lane_channel(int j, int ch0, int ch1) {
  return (j < 8 ? ch0 : ch1) + (j & 7);
}

// rope(norm(x)) of this lane's 16 channels of one row (SPEC §1 order, bit-identical to row_values
// for full rotary). All lanes of the row call it together (shuffles).
template <int D, bool BF16, int ROPE>
__device__ __forceinline__ void fast_row(bool norm, float eps, const float (&w)[16],
                                         const float (&cs)[8], const float (&sn)[8],
                                         const uint4 (&raw)[2], float (&v)[16]) {
  constexpr int LANES = D / 16;
  float x[16];
  unpack<BF16>(raw[0], x);
  unpack<BF16>(raw[1], x + 8);
  if (norm) {
    const float p0 = chunk_squares(x), p1 = chunk_squares(x + 8);
    const float total = ROPE != kRopeInterleaved
                            ? __fadd_rn(lane_tree_sum<LANES>(p0), lane_tree_sum<LANES>(p1))
                            : lane_tree_sum<LANES>(__fadd_rn(p0, p1));
    const float inv = norm_rsqrt(__fadd_rn(__fmul_rn(total, 1.f / static_cast<float>(D)), eps));
#pragma unroll
    for (int j = 0; j < 16; ++j) x[j] = __fmul_rn(__fmul_rn(x[j], inv), w[j]);
#pragma unroll
    for (int j = 0; j < 16; j += 2) round_pair<BF16>(x[j], x[j + 1]);
  }
  if (ROPE == kRopePaired) {  // x[j] leads, x[8 + j] trails: pair ch0 + j
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = __fmaf_rn(cs[j], x[j], -__fmul_rn(sn[j], x[8 + j]));
      v[8 + j] = __fmaf_rn(sn[j], x[j], __fmul_rn(cs[j], x[8 + j]));
    }
  } else if (ROPE == kRopeInterleaved) {  // (x[2i], x[2i+1]): pair ch0 / 2 + i
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      v[2 * i] = __fmaf_rn(cs[i], x[2 * i], -__fmul_rn(sn[i], x[2 * i + 1]));
      v[2 * i + 1] = __fmaf_rn(sn[i], x[2 * i], __fmul_rn(cs[i], x[2 * i + 1]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = x[j];
  }
}

// The norm weight of every lane's 16 channels as fp32 quads, w_sh[k][l] = channels of quad k of
// lane l (a row's lanes read consecutive 16-byte words). Thread tid < 4 * LANES loads quad
// (tid / LANES, tid % LANES) with weight_quad and stores it with store_weight_quad; the caller
// synchronizes before reading.
// SEG (segmented weights, seg_fast_ok): threads < kSegRows * D / 4 load the kSegRows rows' quads,
// row after row (quad tid % (D / 4) of row tid / (D / 4)); a token reads its row's at an offset.
template <int D, int ROPE, bool SEG = false>
__device__ __forceinline__ float4 weight_quad(const PrologueArgs& a, int tid) {
  constexpr int LANES = D / 16, NQ = 4 * LANES;
  float q[4] = {1.f, 1.f, 1.f, 1.f};
  const int row = SEG ? tid / NQ : 0, t = SEG ? tid % NQ : tid;
  if (tid < (SEG ? kSegRows : 1) * NQ && row < a.w_count && a.norm) {
    const int k = t / LANES, l = t % LANES;
    int c0, c1;
    fast_lane_channels<D, ROPE>(l, c0, c1);
    const int c = (k < 2 ? c0 : c1) + 4 * (k & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = load_any(a.w, row * a.w_sr + c + i, a.w_dtype);
  }
  return make_float4(q[0], q[1], q[2], q[3]);
}

template <int D, bool SEG = false>
__device__ __forceinline__ void store_weight_quad(int tid, float4 q, float4* w_sh) {
  if (tid < (SEG ? kSegRows : 1) * (D / 4)) w_sh[tid] = q;  // quad tid at flat index tid
}

// The lane's 16 weights from quads woff + k LANES + lane_in_row (woff: its row's, SEG).
template <int D>
__device__ __forceinline__ void read_weight_quads(const float4* w_sh, int woff, int lane_in_row,
                                                  float (&w)[16]) {
  constexpr int LANES = D / 16;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 t = lds16(w_sh + woff + k * LANES + lane_in_row);
    w[4 * k] = t.x, w[4 * k + 1] = t.y, w[4 * k + 2] = t.z, w[4 * k + 3] = t.w;
  }
}

// ---- fast norm_rope_mean ----------------------------------------------------------------------
//
// A plain streaming reduction. CTA: kMeanWarps warps, thread = (row slot, lane of the row) as in
// the quantize kernel (RPS = kMeanWarps * RW row slots). A CTA owns `steps` row steps of one
// batch item (rows chunk * steps * RPS + s * RPS + slot, s < steps) for a group of <= 6 heads:
// rows outer, heads inner, so the row's rotary values sit in registers for all heads of the row
// (the next row's are loaded one row ahead, behind the heads of this one). Each lane adds
// rope(norm(x)) of its 16 channels to a private accumulator in shared memory (nobody else touches
// it: no barrier in the loop; layout [head][quad][thread] float4, conflict-free). x loads of the
// next kMeanPrefetch (row, head) units are in flight. At the end the CTA adds its RPS row slots per
// (head, channel) in slot order into one partial per (batch, head, chunk) in scratch, and
// mean_final_kernel adds the chunks in a fixed order and divides by N. No clusters, no atomics:
// deterministic for a given launch shape.

struct FastMeanLaunch {
  int head_group;
  int table_mode;
  int steps;       // row steps per CTA
  int64_t chunks;  // CTAs along the tokens = partials per (batch, head)
};

// SEG (session 39): segmented weights, each row step's token picks its weight row.
template <int D, bool BF16, int ROPE, bool SEG = false>
__global__ void __launch_bounds__(kMeanWarps * 32, 4)
    fast_mean_kernel(const PrologueArgs a, const FastMeanLaunch L, float* partials) {
  constexpr int LANES = D / 16, RW = 32 / LANES, RPS = kMeanWarps * RW;
  constexpr int THREADS = kMeanWarps * 32;
  static_assert(!SEG || kSegRows * D / 4 <= THREADS, "one weight quad per thread");
  extern __shared__ float4 mean_acc[];  // [head][quad k][THREADS]: this thread's channels
  // norm weight quads (registers go to loads in flight): [row][k][l] at row D / 4 + k LANES + l
  __shared__ float4 w_sh[(SEG ? kSegRows : 1) * 4 * LANES];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int slot = warp * RW + lane / LANES, lane_in_row = lane % LANES;
  int ch0, ch1;
  fast_lane_channels<D, ROPE>(lane_in_row, ch0, ch1);
  const int64_t b = blockIdx.z, chunk = blockIdx.y;
  const int64_t h0 = static_cast<int64_t>(blockIdx.x) * L.head_group;
  const int nh = static_cast<int>(a.heads - h0 < L.head_group ? a.heads - h0 : L.head_group);
  const int64_t n_first = chunk * L.steps * RPS + slot;  // this thread's row of step s: + s * RPS
  const int64_t nb = tokens_of(a, b);  // (a padded varlen batch: the item's own tokens)
  griddep_launch_dependents();  // mean_final may launch (it waits for this grid's end)

#pragma unroll 1
  for (int k = 0; k < 4 * nh; ++k) mean_acc[k * THREADS + tid] = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 wq = weight_quad<D, ROPE, SEG>(a, tid);  // stored after the first x loads
  float cs[8], sn[8], tc[8], ts[8];  // this row's rotary values, the next row's (in flight)
#pragma unroll
  for (int i = 0; i < 8; ++i) cs[i] = tc[i] = 1.f, sn[i] = ts[i] = 0.f;
  auto table_row = [&](int s) {
    const int64_t n = n_first + static_cast<int64_t>(s) * RPS;
    if (ROPE != kRopeNone && s < L.steps && n < nb)
      load_table8(a, L.table_mode, r_item(a, b) + n * a.r_sn, 8 * lane_in_row, tc, ts);
  };
  table_row(0);

  const uint16_t* xb = static_cast<const uint16_t*>(a.x) + x_item(a, b) + h0 * a.x_sh;
  // (step, head) of the next unit to load / to process: units run in order, heads inner.
  int ls = 0, lh = 0, ps = 0, ph = 0;
  auto load = [&](int, uint4(&r)[2]) {
    const int64_t n = n_first + static_cast<int64_t>(ls) * RPS;
    if (n < nb) {
      const uint16_t* px = xb + n * a.x_sn + lh * a.x_sh;
      r[0] = load_stream16(px + ch0);
      r[1] = load_stream16(px + ch1);
    } else {
      r[0] = r[1] = make_uint4(0, 0, 0, 0);
    }
    if (++lh == nh) lh = 0, ++ls;
  };
  auto proc = [&](int, const uint4(&r)[2]) {
    if (ROPE != kRopeNone && ph == 0) {  // a new row: take its table values, fetch the next's
#pragma unroll
      for (int i = 0; i < 8; ++i) cs[i] = tc[i], sn[i] = ts[i];
      table_row(ps + 1);
    }
    float w[16], v[16];
    const int64_t n = n_first + static_cast<int64_t>(ps) * RPS;
    read_weight_quads<D>(w_sh, seg_quad_offset<D, SEG>(a, b, n, n < nb), lane_in_row, w);
    fast_row<D, BF16, ROPE>(a.norm, a.eps, w, cs, sn, r, v);
    if (n_first + static_cast<int64_t>(ps) * RPS < nb) {
      float4* acc = mean_acc + ph * 4 * THREADS + tid;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float4 t = acc[k * THREADS];
        t.x = __fadd_rn(t.x, v[4 * k]);
        t.y = __fadd_rn(t.y, v[4 * k + 1]);
        t.z = __fadd_rn(t.z, v[4 * k + 2]);
        t.w = __fadd_rn(t.w, v[4 * k + 3]);
        acc[k * THREADS] = t;
      }
    }
    if (++ph == nh) ph = 0, ++ps;
  };
  auto start = [&] {
    store_weight_quad<D, SEG>(tid, wq, w_sh);
    __syncthreads();
  };
  pipeline<kMeanPrefetch>(L.steps * nh, load, proc, start);
  __syncthreads();

  // Column sums over the RPS row slots, in slot order. Channel c of head hl lives in quad k of
  // the thread (slot, lane_in_row) that holds it, component c % 4.
  const float* accf = reinterpret_cast<const float*>(mean_acc);
  for (int e = tid; e < nh * D; e += THREADS) {
    const int hl = e / D, c = e % D;
    int lir, k;
    if (ROPE != kRopeInterleaved) {  // chunks lir and lir + LANES: ch0 = 8 lir, ch1 = ch0 + D/2
      const int hi = c >= D / 2 ? 1 : 0, cc = c - hi * (D / 2);
      lir = cc / 8, k = 2 * hi + (cc % 8) / 4;
    } else {  // chunks 2 lir, 2 lir + 1: ch0 = 16 lir
      lir = c / 16, k = (c % 16) / 4;
    }
    const float* col = accf + 4 * ((hl * 4 + k) * THREADS + lir) + c % 4;
    float t = 0.f;
#pragma unroll 8
    for (int sl = 0; sl < RPS; ++sl)
      t = __fadd_rn(t, col[4 * ((sl / RW) * 32 + (sl % RW) * LANES)]);
    partials[((b * a.heads + h0 + hl) * L.chunks + chunk) * D + c] = t;
  }
}

// mean_out[b, h, c] = (sum of the chunk partials in a fixed order) / N. CTA per (batch * head,
// 32 channels): thread (c, j) adds chunks j, j + 32, ... in order, then thread j = 0 adds the 32
// sums in j order.
__global__ void __launch_bounds__(1024)
    mean_final_kernel(const PrologueArgs a, const float* partials, int64_t chunks) {
  __shared__ float sums[32][33];
  griddep_wait();  // launched with PDL behind the mean kernel: its partials must be complete
  // A quantize kernel launched with PDL behind this one may start now (it waits for this grid's
  // end before it reads anything).
  griddep_launch_dependents();
  const int cl = threadIdx.x & 31, j = threadIdx.x >> 5;
  const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * 32 + cl;
  const float* p = partials + bh * chunks * a.dim + c;
  float t = 0.f;
#pragma unroll 4
  for (int64_t g = j; g < chunks; g += 32) t = __fadd_rn(t, __ldg(p + g * a.dim));
  sums[j][cl] = t;
  __syncthreads();
  if (j == 0) {
    float s = sums[0][cl];
    for (int k = 1; k < 32; ++k) s = __fadd_rn(s, sums[k][cl]);
    a.mean_out[b * a.mo_sb + h * a.mo_sh + c] = mean_of(a, b, s);
  }
}

// Options the round-2 mean kernel covers: per-head (or no) norm weight, full rotary (or none).
bool fast_mean_supported(const PrologueArgs& a) {
  if (detail::prologue_cuda_tuning().legacy || a.norm_heads) return false;
  if (a.w_rows && !seg_fast_ok(a)) return false;
  return !a.rotate || 2 * a.pairs == a.dim;
}

void fast_norm_rope_mean(const PrologueArgs& a, Context& ctx, ScratchHold* hold) {
  const int lanes = static_cast<int>(a.dim / 16), rw = 32 / lanes, rps = kMeanWarps * rw;
  FastMeanLaunch L;
  L.table_mode = table_mode_of(a);
  // Head groups as large as the accumulators allow (the rotary row is loaded once per group).
  const int forced = detail::prologue_cuda_tuning().heads_per_cta;
  int64_t hg = std::clamp<int64_t>(forced > 0 ? forced : kMeanMaxHeads, 1,
                                   std::min<int64_t>(a.heads, kMeanMaxHeads));
  const int64_t head_groups = (a.heads + hg - 1) / hg;
  L.head_group = static_cast<int>((a.heads + head_groups - 1) / head_groups);
  // Row steps per CTA by the wave model of src/cuda/prologue_common.cuh (kMeanCtasPerSm CTAs per
  // SM, fixed cost ~2 units: setup and the final column sums). Wan: 7 steps as before (2051
  // CTAs); Flux: 3 steps instead of 1 (a 1-step CTA's column sums cost more than its rows).
  const int64_t row_steps = std::max<int64_t>(1, (a.tokens + rps - 1) / rps);
  const int64_t first = std::max<int64_t>(1, (row_steps + 65534) / 65535);
  const int64_t steps = pick_by_waves(
      first, std::max(first, std::min<int64_t>(row_steps, 512)),
      int64_t{kMeanCtasPerSm} * multiprocessor_count(), 2.0, [&](int64_t k) {
        const int64_t chunks = (row_steps + k - 1) / k;
        const bool distinct = (row_steps + chunks - 1) / chunks == k;
        return std::pair<int64_t, double>(distinct ? chunks * head_groups * a.batch : 0,
                                          static_cast<double>(k * L.head_group));
      });
  const int forced_steps = detail::prologue_cuda_tuning().mean_steps;
  L.steps = static_cast<int>(forced_steps > 0 ? std::min<int64_t>(forced_steps, row_steps) : steps);
  L.chunks = (row_steps + L.steps - 1) / L.steps;
  LOWBIT_CHECK(L.chunks <= 65535 && a.batch <= 65535 && head_groups <= INT32_MAX, "norm_rope_mean",
               "x",
               "cuda grid: expected at most 65535 token chunks and batch items, got " +
                   std::to_string(L.chunks) + " and " + std::to_string(a.batch));
  cudaStream_t stream = stream_of(ctx);
  ScratchHold local;
  Scratch& part =
      hold_scratch(hold ? *hold : local,
                   sizeof(float) * static_cast<size_t>(a.batch * a.heads * L.chunks * a.dim),
                   stream, "norm_rope_mean");
  dim3 grid(static_cast<unsigned>(head_groups), static_cast<unsigned>(L.chunks),
            static_cast<unsigned>(a.batch));
  const int smem = L.head_group * 4 * kMeanWarps * 32 * static_cast<int>(sizeof(float4));
  dispatch_prologue(a, "norm_rope_mean", [&](auto d, auto bf, auto rope) {
    constexpr int D = decltype(d)::value;
    auto kernel = fast_mean_kernel<D, decltype(bf)::value, decltype(rope)::value>;
    if constexpr (D <= 128)
      if (a.w_rows) kernel = fast_mean_kernel<D, decltype(bf)::value, decltype(rope)::value, true>;
    set_kernel_smem(kernel, smem, "norm_rope_mean", "shared memory");
    kernel<<<grid, kMeanWarps * 32, smem, stream>>>(a, L, part.as<float>());
    check_launch("norm_rope_mean");
  });
  launch_mean_final(a, part.as<float>(), L.chunks, stream);
}

}  // namespace

void launch_mean_final(const PrologueArgs& a, const float* partials, int64_t chunks,
                       cudaStream_t stream) {
  // Programmatic dependent launch: the kernel is resident and waiting (griddep_wait) when the
  // mean kernel before it ends, instead of being launched then (the mean kernels let it launch
  // once their last CTAs have started). Nothing before its wait reads or writes memory.
  const int pdl = detail::prologue_cuda_tuning().pdl;
  launch_maybe_pdl((pdl > 0 ? pdl : kPdlDefault) == detail::kPdlOn, mean_final_kernel,
                   dim3(static_cast<unsigned>(a.batch * a.heads),
                        static_cast<unsigned>(a.dim / 32)),
                   dim3(1024), 0, stream, a, partials, chunks);
  check_launch("norm_rope_mean");
}

namespace {

void quantize_pass(const PrologueArgs& a, Context& ctx, bool behind_mean) {
  if (v3_supported(a, true))
    v3_norm_rope_quantize(a, ctx, behind_mean);
  else
    legacy_norm_rope_quantize(a, ctx);
}

void mean_pass(const PrologueArgs& a, Context& ctx, ScratchHold* hold) {
  if (v3_supported(a, false))
    v3_norm_rope_mean(a, ctx, hold);
  else if (fast_mean_supported(a))
    fast_norm_rope_mean(a, ctx, hold);
  else
    legacy_norm_rope_mean(a, ctx);
}

}  // namespace

void norm_rope_quantize(const PrologueArgs& a, Context& ctx) { quantize_pass(a, ctx, false); }

void norm_rope_mean(const PrologueArgs& a, Context& ctx) { mean_pass(a, ctx, nullptr); }

// The k path in one call: the mean pass (its partials held until the quantize kernel is launched,
// so that mean_final and the quantize kernel are adjacent in the stream), then the quantize pass
// knowing that only the mean pass of the same x runs before it (it may read x before its PDL
// wait: the round-3 kernel's `early` placement, the default here).
void norm_rope_mean_quantize(const PrologueArgs& a, Context& ctx) {
  if (short_k_supported(a)) {  // short rows without norm or rope: one kernel (session 52)
    short_k_mean_quantize(a, ctx);
    return;
  }
  PrologueArgs m = a;
  m.mean = nullptr;  // the mean pass normalizes and rotates only
  ScratchHold hold;
  mean_pass(m, ctx, &hold);
  quantize_pass(a, ctx, true);
}  // `hold` freed on the stream here, behind the quantize kernel

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

namespace {
__global__ void norm_rsqrt_kernel(const float* s, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = norm_rsqrt(s[i]);
}
}  // namespace

namespace {

// NormScope::token: one warp per token (b, n) sums the squares of its H·D channels in SPEC §1's
// order over the H·D / 8 chunks: lane l holds chunks l, l + 32, ... (chunk k = channels 8k ..
// 8k + 7 of head 8k / D), each group of 32 chunks added as the pairwise tree's first five levels
// by xor shuffles (a missing chunk is +0: adding it changes nothing), the groups' sums in shared
// memory then added as the tree's remaining levels, exactly as the CPU's sum_of_squares.
constexpr int kTokenWarps = 8;

// NormScope::token: the weight of channel c (= h D + d) of a token's H·D, as f32.
__device__ __forceinline__ float token_weight(const PrologueArgs& a, int64_t c) {
  return load_any(a.w, (c / a.dim) * a.w_sr + c % a.dim, a.w_dtype);
}

template <bool BF16>
__global__ void __launch_bounds__(kTokenWarps * 32)
    token_inv_kernel(const PrologueArgs a, float* out, float* w_out) {
  extern __shared__ float group_sums[];
  if (w_out) {  // the weight rows as f32, head h at h * D (grid-stride over H·D)
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         i < a.heads * a.dim; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
      w_out[i] = token_weight(a, i);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kTokenWarps + warp;
  if (t >= a.batch * a.tokens) return;  // a whole warp (no CTA barrier below)
  const int64_t b = t / a.tokens, n = t % a.tokens;
  if (n >= tokens_of(a, b)) {  // a padded varlen batch's padding row: never read
    if (lane == 0) out[t] = 1.f;
    return;
  }
  const int D = static_cast<int>(a.dim);
  const int64_t chunks = a.heads * a.dim / 8;
  const int groups = static_cast<int>((chunks + 31) / 32);
  float* g = group_sums + warp * groups;
  const uint16_t* x = static_cast<const uint16_t*>(a.x) + x_item(a, b) + n * a.x_sn;
  for (int j = 0; j < groups; ++j) {
    const int64_t k = 32 * static_cast<int64_t>(j) + lane;
    float s = 0.f;
    if (k < chunks) {
      const int64_t c = 8 * k, h = c / D, d = c % D;
      float v[8];
      unpack<BF16>(__ldg(reinterpret_cast<const uint4*>(x + h * a.x_sh + d)), v);
      s = chunk_squares(v);
    }
    s = lane_tree_sum<32>(s);
    if (lane == 0) g[j] = s;
  }
  __syncwarp();
  for (int step = 1; step < groups; step *= 2) {
    for (int k = 2 * step * lane; k + step < groups; k += 64 * step) g[k] = __fadd_rn(g[k], g[k + step]);
    __syncwarp();
  }
  if (lane == 0)
    out[t] = norm_rsqrt(
        __fadd_rn(__fdiv_rn(g[0], static_cast<float>(a.heads * a.dim)), a.eps));
}

// The staged form of NormScope::token (session 45): token_inv_kernel's sum and the store step's
// norm output in one pass. One warp per token keeps the token's chunks in registers (lane l:
// chunks l + 32 j, j < MAXG groups), sums their squares exactly as token_inv_kernel does (each
// group's xor-shuffle tree, every lane then holding the same group sums, whose remaining tree
// levels run in registers in the same order), and writes y = round(round(x * inv) * w) (the store
// kernel's arithmetic) contiguous (B, N, H, D): x is read once, where the two kernels read it
// twice and the first-generation store read its weights one value at a time. The weights sit in
// shared memory as f32; CTAs loop over tokens.
template <bool BF16, int MAXG>
__global__ void __launch_bounds__(kTokenWarps * 32)
    token_norm_store_kernel(const PrologueArgs a, uint16_t* y) {
  extern __shared__ float4 w_sh4[];  // the H·D weights, channel h * D + d
  float* w_sh = reinterpret_cast<float*>(w_sh4);
  const int D = static_cast<int>(a.dim);
  const int64_t row = a.heads * a.dim, chunks = row / 8;
  for (int64_t c = threadIdx.x; c < row; c += blockDim.x) w_sh[c] = token_weight(a, c);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int groups = static_cast<int>((chunks + 31) / 32);
  const int64_t total = a.batch * a.tokens;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kTokenWarps + warp; t < total;
       t += static_cast<int64_t>(gridDim.x) * kTokenWarps) {
    const int64_t b = t / a.tokens, n = t % a.tokens;
    if (n >= tokens_of(a, b)) continue;  // a padded varlen batch's padding row: never read
    const uint16_t* x = static_cast<const uint16_t*>(a.x) + x_item(a, b) + n * a.x_sn;
    uint4 r[MAXG];
#pragma unroll
    for (int j = 0; j < MAXG; ++j) {
      const int64_t k = 32 * j + lane;
      r[j] = make_uint4(0, 0, 0, 0);
      if (j < groups && k < chunks) {
        const int64_t c = 8 * k, h = c / D, d = c % D;
        r[j] = load_stream16(x + h * a.x_sh + d);
      }
    }
    float g[MAXG];
#pragma unroll
    for (int j = 0; j < MAXG; ++j) {
      float s = 0.f;
      if (32 * j + lane < chunks) {
        float v[8];
        unpack<BF16>(r[j], v);
        s = chunk_squares(v);
      }
      g[j] = lane_tree_sum<32>(s);
    }
#pragma unroll
    for (int step = 1; step < MAXG; step *= 2) {
#pragma unroll
      for (int k = 0; k + step < MAXG; k += 2 * step)
        if (k + step < groups) g[k] = __fadd_rn(g[k], g[k + step]);
    }
    const float inv = norm_rsqrt(__fadd_rn(__fdiv_rn(g[0], static_cast<float>(row)), a.eps));
    uint16_t* yo = y + t * row;
#pragma unroll
    for (int j = 0; j < MAXG; ++j) {
      const int64_t k = 32 * j + lane;
      if (j < groups && k < chunks) {
        float v[8];
        unpack<BF16>(r[j], v);
        const float4 w0 = w_sh4[2 * k], w1 = w_sh4[2 * k + 1];
        const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        uint32_t o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float lo = round_act<BF16>(__fmul_rn(__fmul_rn(v[2 * i], inv), w[2 * i]));
          const float hi = round_act<BF16>(__fmul_rn(__fmul_rn(v[2 * i + 1], inv), w[2 * i + 1]));
          o[i] = act_bits<BF16>(lo) | (act_bits<BF16>(hi) << 16);
        }
        *reinterpret_cast<uint4*>(yo + 8 * k) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
}

template <bool BF16, int MAXG>
void launch_token_norm_store(const PrologueArgs& a, uint16_t* y, Context& ctx) {
  const auto kernel = token_norm_store_kernel<BF16, MAXG>;
  const size_t smem = sizeof(float) * static_cast<size_t>(a.heads * a.dim);
  const int per_sm = std::max(1, occupancy_per_sm(reinterpret_cast<const void*>(kernel),
                                                  kTokenWarps * 32, smem, "token_norm_store"));
  const int64_t tokens = a.batch * a.tokens;
  const int64_t blocks = std::min<int64_t>((tokens + kTokenWarps - 1) / kTokenWarps,
                                           int64_t{per_sm} * multiprocessor_count());
  kernel<<<static_cast<unsigned>(blocks), kTokenWarps * 32, smem, stream_of(ctx)>>>(a, y);
}

}  // namespace

void token_norm_inv(const PrologueArgs& a, float* out, Context& ctx, float* w_out) {
  const int64_t tokens = a.batch * a.tokens;
  if (tokens == 0) return;
  const int64_t groups = (a.heads * a.dim / 8 + 31) / 32;
  const size_t smem = sizeof(float) * static_cast<size_t>(kTokenWarps * groups);  // <= 48 KB
  const unsigned blocks = static_cast<unsigned>((tokens + kTokenWarps - 1) / kTokenWarps);
  if (a.x_dtype == DType::bf16)
    token_inv_kernel<true><<<blocks, kTokenWarps * 32, smem, stream_of(ctx)>>>(a, out, w_out);
  else
    token_inv_kernel<false><<<blocks, kTokenWarps * 32, smem, stream_of(ctx)>>>(a, out, w_out);
  check_launch("token_norm_inv");
}

namespace {
// (a padded varlen batch read in place: item b's rows from its packed row, (1, 0) past its
// tokens, one table per item)
__global__ void compact_rope_kernel(PrologueArgs a, int64_t table_batches, float2* out) {
  const int64_t total = table_batches * a.tokens * a.pairs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = i % a.pairs, n = (i / a.pairs) % a.tokens, b = i / (a.pairs * a.tokens);
    if (a.item_rows && n >= tokens_of(a, b)) {
      out[i] = make_float2(1.f, 0.f);
      continue;
    }
    const int64_t o = r_item(a, b) + n * a.r_sn + p * a.r_sp;
    out[i] = make_float2(load_any(a.rope, o, a.r_dtype), load_any(a.rope, o + a.r_sc, a.r_dtype));
  }
}
int64_t table_batches(const PrologueArgs& a) { return a.r_sb == 0 && !a.item_rows ? 1 : a.batch; }
}  // namespace

bool rope_table_compactable(const PrologueArgs& a) {
  if (!a.rotate || 2 * a.pairs != a.dim || a.pairs % 8 != 0 || a.tokens == 0 || a.batch == 0)
    return false;
  if (a.dim != 64 && a.dim != 128 && a.dim != 256) return false;
  return table_mode_of(a) != kTablePairsF32;
}

int64_t rope_table_bytes(const PrologueArgs& a) {
  return table_batches(a) * a.tokens * a.pairs * 2 * static_cast<int64_t>(sizeof(float));
}

void compact_rope_table(const PrologueArgs& a, float* out, Context& ctx) {
  const int64_t total = table_batches(a) * a.tokens * a.pairs;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  compact_rope_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(a, table_batches(a),
                                                          reinterpret_cast<float2*>(out));
  check_launch("compact_rope_table");
}

bool token_norm_store(const PrologueArgs& a, void* y, Context& ctx) {
  const int64_t groups = (a.heads * a.dim / 8 + 31) / 32;
  if (a.batch * a.tokens == 0 || groups > kTokenStoreMaxGroups) return false;
  uint16_t* out = static_cast<uint16_t*>(y);
  const bool bf = a.x_dtype == DType::bf16;
  if (groups <= 8)
    bf ? launch_token_norm_store<true, 8>(a, out, ctx)
       : launch_token_norm_store<false, 8>(a, out, ctx);
  else if (groups <= 16)
    bf ? launch_token_norm_store<true, 16>(a, out, ctx)
       : launch_token_norm_store<false, 16>(a, out, ctx);
  else
    bf ? launch_token_norm_store<true, 24>(a, out, ctx)
       : launch_token_norm_store<false, 24>(a, out, ctx);
  check_launch("token_norm_store");
  return true;
}

void norm_rsqrt(const float* s, float* out, int64_t n, Context& ctx) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 1 << 16);
  norm_rsqrt_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream_of(ctx)>>>(s, out, n);
  check_launch("norm_rsqrt");
}

}  // namespace cuda
}  // namespace lowbit
