// Tiled decode GEMV for 4-bit weights, M <= 16 (SPEC §3.5; design and measurements in
// docs/linear-gpu.md, "Session 4: decode tiles").
//
// The ring kernel (linear_decode_ring.cu) spends ~7 thread-instructions per weight unpacking the
// checkpoint's nibble order (group tables built per chunk, 16-entry byte lookups, mma operand
// shuffles). Here the GPU keeps its own layout of the weight, built once:
//   - tiles of 16 weight rows; an item is (tile, 128 columns) = 1024 bytes of codes, two 512-byte
//     chunks of 64 columns; lane l = (gid, tid4) owns 16 bytes of each chunk: 4 words that are,
//     after unpacking, exactly the A fragments (rows gid / gid + 8) of mma.sync m16n8k32 for the
//     chunk's columns [16 tid4, 16 tid4 + 16): the weights are the mma's A operand (16 output
//     columns), the M <= 16 activation rows its B operand (one or two n8 tiles);
//   - comfy int4: nibble u = c + 8. Word i of a lane: byte b holds u(row, p + b) in its low and
//     u(row, p + 8 + b) in its high nibble (row = gid + 8 (i & 1), p = 16 tid4 + 4 (i >> 1)), so
//     w & 0x0f0f0f0f is an A register (u) for columns p..p+3 and w & 0xf0f0f0f0 one (16 u) for
//     p+8..p+11: one LOP3 per 4 weights, mma u8 x s8, and sum = lo + hi / 16 - 8 Σa (exact);
//   - packed 4-bit: nibble = sign << 3 | |c| and per (row, group of 128) the 8-byte table
//     T[m] = fold(m) (SPEC §3.3; T[-m] = -T[m], checked when building). prmt's selector nibble
//     with bit 3 set replicates the selected byte's sign bit (0 here: T[m] <= 127), so
//     prmt(T, w) gives T[m] for c >= 0 and 0 for c < 0, prmt(T, w ^ 0x8888) the converse: the
//     int8-grid weight is X - Y, two accumulators, 4 mma per 32 weights per lane;
//   - each warp streams a contiguous run of its CTA's items through a per-lane cp.async ring
//     (D slots, no registers held by loads in flight, the first D - 1 requested before
//     griddepcontrol.wait); the CTA's warps split its items evenly, whatever K, and add their
//     partial sums of a tile into shared memory with integer atomics (exact in any order); one
//     barrier, then the epilogue (apply_epilogue: the prefill path's fp32 order).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "lowbit/dtype.h"
#include "src/cuda/common.cuh"
#include "src/cuda/gemm_common.cuh"
#include "src/cuda/linear_decode_tiles.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_rotate.cuh"
#include "src/cuda/linear_unpack.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

constexpr int kItemCols = 128;                  // columns of one item (one fold group)
constexpr int kItemBytes = 1024;                // 16 rows x 128 columns of 4-bit codes
constexpr int kTableBytes = 128;                // 16 rows x 8-byte fold tables (packed 4-bit)
constexpr int kTilesWarps = 16;                 // warps per CTA
constexpr int kTilesThreads = kTilesWarps * 32;
constexpr int64_t kTilesMaxK = 65536;           // int32 sums of 16 u x a stay below 2^31
constexpr int kTilesMaxRegs = 88;
constexpr int kSharedTileInts = 256;  // spread: per leftover tile, 16 columns x up to 16 tokens

__host__ __device__ constexpr int slot_bytes(int kind) {
  return kItemBytes + (kind == kTilesInt4 ? kTableBytes : 0);
}
struct TilesLayout {
  int64_t tiles = 0;      // ceil(N / 16)
  int ipt = 0;            // items per tile, K / 128
  int act_stride = 0;     // bytes between activation rows in shared memory (= 64 mod 128)
  int part_off = 0;       // int32 partial sums (tiles per CTA x 16 x M)
  int srow_off = 0;       // fused: the fp32 rotated row (K floats)
  int epi_off = 0;        // fp32 w_scale and bias of the CTA's columns (2 x epi_n)
  int epi_n = 0;          // tiles per CTA x 16
  int ring_off = 0;       // the warps' rings
  int depth = 0;          // slots per warp
  int64_t smem = 0;
  // Balanced split: CTA b owns the flat item range [b·I/G, (b+1)·I/G) of all T·ipt items, so
  // the tiles at its two ends may be shared with its neighbours; each side writes its partial
  // sums of such a tile to bnd[(boundary · 2 + side) · 256] and the second to arrive (the
  // boundary's counter is odd before its atomicAdd: every launch adds exactly 2) finishes it.
  // Otherwise CTA b owns whole tiles [b·T/G, (b+1)·T/G).
  int balanced = 0;
  // Transport: 0 = 16-byte cp.async per lane (cp.async.wait_group), 1 = one cp.async.bulk per
  // item (lane 0; TMA, completing on the slot's mbarrier: the item is 1 KB contiguous).
  int bulk = 0;
  int interleave = 0;       // warps take every W-th item of the CTA instead of a contiguous run
  // Spread split (DecodeTilesTuning::spread): whole tiles per CTA plus an even share of the
  // leftover tiles' items, streamed first and combined across CTAs through gacc / gcnt.
  int spread = 0;
  int32_t* gacc = nullptr;  // tiles x 256 int32, zero between launches (spread)
  uint32_t* gcnt = nullptr; // tiles item counters, zero between launches (spread)
  int trigger = 0;          // griddepcontrol.launch_dependents after the first requests
  int l2_prefetch = 0;      // items per warp prefetched into L2 before griddepcontrol.wait
  int act_async = 0;        // activation rows copied with cp.async (all rows in flight)
  int fuse_reg = 0;         // fused: the register rotation (no srow) instead of the smem one
  // Cooperative rotation (fused instances, x in): CTA b < M rotates row b into p.a / p.ep.a_scale
  // (global), counts itself in coop_cnt[0]; every CTA waits for M, copies the codes, counts
  // itself in coop_cnt[1]; the last one re-zeroes both (before the grid completes).
  int coop = 0;
  uint32_t* coop_cnt = nullptr;
  int32_t* bnd = nullptr;   // (G + 1) x 2 x 256 int32
  uint32_t* cnt = nullptr;  // (G + 1) counters, zero when allocated
};

using ptx::bulk_g2s;
using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::lds128;
using ptx::mbar_arrive_expect_tx;
using ptx::mbar_fence_init;
using ptx::mbar_init;
using ptx::mbar_try;
using ptx::mma_u8s8;
using ptx::prmt;

// ---- layout builder ----

// The 4-bit code c of weight (row, col), 0 past the last row; *bad set for u = 15 (packed).
__device__ __forceinline__ int32_t src_code(const PackedWeightRef& w, int kind, int64_t row,
                                            int64_t col, int* bad) {
  if (row >= w.N) return 0;
  const uint32_t byte = w.codes[row * w.row_bytes + (col >> 1)];
  const uint32_t nib = (col & 1) ? (byte >> 4) & 15u : byte & 15u;
  if (kind == kTilesComfy) return static_cast<int32_t>(nib ^ 8u) - 8;  // signed nibble
  if (nib == 15u) *bad = 1;
  return static_cast<int32_t>(nib) - 7;
}
__device__ __forceinline__ uint32_t tile_nibble(int kind, int32_t c) {
  if (kind == kTilesComfy) return static_cast<uint32_t>(c + 8);
  return (c < 0 ? 8u : 0u) | static_cast<uint32_t>(c < 0 ? -c : c);
}

// One thread per 32-bit word of the codes region: word `idx` = item idx / 256, chunk h, lane,
// word i (see the file comment).
__global__ void build_tile_codes_kernel(PackedWeightRef w, int kind, int ipt, int64_t words,
                                        uint32_t* out, int* flag) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= words) return;
  const int64_t item = idx >> 8;
  const int within = static_cast<int>(idx & 255);
  const int h = within >> 7, lane = (within >> 2) & 31, i = within & 3;
  const int64_t t = item / ipt, g = item - t * ipt;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int64_t row = 16 * t + gid + 8 * (i & 1);
  const int64_t p = kItemCols * g + 64 * h + 16 * tid4 + 4 * (i >> 1);
  int bad = 0;
  uint32_t word = 0;
  for (int b = 0; b < 4; ++b) {
    const uint32_t lo = tile_nibble(kind, src_code(w, kind, row, p + b, &bad));
    const uint32_t hi = tile_nibble(kind, src_code(w, kind, row, p + 8 + b, &bad));
    if (kind == kTilesComfy) {
      word |= (lo | hi << 4) << (8 * b);
    } else {
      word |= lo << (4 * b) | hi << (4 * b + 16);
    }
  }
  out[idx] = word;
  if (bad) atomicOr(flag, 1);
}

// One thread per (tile row, group): the 8-byte table T[m] = fold(m), m = 0..7, at
// (t · ipt + g) · 128 + (r & 7) · 16 + (r >> 3) · 8 (r = row mod 16).
__global__ void build_tile_tables_kernel(PackedWeightRef w, int ipt, int64_t tiles, uint8_t* out,
                                         int* flag) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tiles * 16 * ipt) return;
  const int64_t row = idx / ipt, g = idx - row * ipt;
  const int64_t t = row >> 4;
  const int r = static_cast<int>(row & 15);
  uint8_t* dst = out + (t * ipt + g) * kTableBytes + (r & 7) * 16 + (r >> 3) * 8;
  int bad = 0;
  for (int m = 0; m < 8; ++m) {
    int32_t v = 0;
    if (row < w.N) {
      if (w.ratios) {
        const float ratio = w.ratios[row * w.groups_per_row + g];
        v = fold_code(m, ratio);
        if (v < 0 || v > 127 || fold_code(-m, ratio) != -v) bad = 1;
      } else {
        v = m;
      }
    }
    dst[m] = static_cast<uint8_t>(v & 0xff);
  }
  if (bad) atomicOr(flag, 1);
}

// ---- the GEMV ----

// Register rotation of x's rows [r0, r1) (r1 - r0 <= kTilesFuseLimit; K <= 16 THREADS): thread
// tid rotates its 16 elements of each row in registers (rotate16), the row's amax goes through
// s_amax (THREADS / 32 floats per row slot) and one barrier, and the thread writes its 16 codes
// (quantize16_int) as one 16-byte store at their output position in row m of dst (stride
// dst_stride bytes: shared memory in the fused mode, global in the cooperative one) and the
// scale to scales[m]: the register rotate kernel's arithmetic, hence its bits. Comfy with SUMS:
// adds the row's code sum to s_asum[m]. Every thread of the CTA takes part.
template <int KIND, int THREADS, typename XT, bool SUMS>
__device__ __forceinline__ void tiles_rotate_reg(const DecodeParams& p, int r0, int r1,
                                                 uint8_t* dst, int64_t dst_stride, float* scales,
                                                 float* s_amax, int32_t* s_asum) {
  constexpr int W = THREADS / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = static_cast<int>(p.w.K);
  const bool in = tid * 16 < K;
  const int g = reg_group<256>(tid), out0 = reg_out0<256>(tid);
  // Both rows' 32 bytes in flight before the first is computed (x: the preceding kernel's output,
  // read after griddepcontrol.wait with plain loads).
  uint4 raw[kTilesFuseLimit][2];
#pragma unroll
  for (int i = 0; i < kTilesFuseLimit; ++i) {
    raw[i][0] = raw[i][1] = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + i < r1 && in) {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const XT*>(p.x) +
                                                        (r0 + i) * p.x_row_stride + tid * 16);
      raw[i][0] = src[0];
      raw[i][1] = src[1];
    }
  }
#pragma unroll
  for (int i = 0; i < kTilesFuseLimit; ++i) {
    const int m = r0 + i;
    if (m >= r1) break;  // uniform
    float v[16], y[16];
    unpack_raw<XT>(raw[i], v);  // zeros past K (raw zero)
    rotate16<256>(v, g, y);
    const float wm = amax16_warp(y);
    if (lane == 0) s_amax[i * W + warp] = wm;
    __syncthreads();
    float am = s_amax[i * W];
#pragma unroll
    for (int w = 1; w < W; ++w) am = amax_nan(am, s_amax[i * W + w]);
    const float scale = token_scale(am, static_cast<float>(p.act_qmax));
    if (tid == 0) scales[m] = scale;
    uint32_t c[4];
    if (p.act_qmax == 7) {
      quantize16_int<7>(y, scale, c);
    } else {
      quantize16_int<127>(y, scale, c);
    }
    if (in) {
      *reinterpret_cast<uint4*>(dst + m * dst_stride + out0) = make_uint4(c[0], c[1], c[2], c[3]);
    }
    if (KIND == kTilesComfy && SUMS) {
      int32_t sum = 0;
      if (in) {
#pragma unroll
        for (int q = 0; q < 4; ++q) sum = __dp4a(static_cast<int>(c[q]), 0x01010101, sum);
      }
      sum = __reduce_add_sync(0xffffffffu, sum);
      if (lane == 0 && sum != 0) atomicAdd(&s_asum[m], sum);
    }
  }
}

// The M activation rows as int8 codes in shared memory (`act`, row stride act_stride bytes): copied
// from p.a (written by the preceding kernel: call after griddepcontrol.wait), or (XT not void)
// x rotated + quantized here, on the register rotation (reg_rotate) or through srow (K fp32) with
// the shared-memory rotation: the rotate kernels' arithmetic either way. Comfy: adds each row's
// code sum to s_asum[m] (zeroed and synchronized by the caller). Returns the epilogue's a_scale
// (s_scale in the fused mode). The caller synchronizes before reading act.
template <int KIND, int THREADS, typename XT>
__device__ __forceinline__ const float* tiles_activations(const DecodeParams& p, uint8_t* act,
                                                          int act_stride, float* srow,
                                                          float* s_scale, float* s_amax,
                                                          int32_t* s_asum, bool async_copy,
                                                          bool reg_rotate) {
  const int lane = threadIdx.x & 31;
  const int M = static_cast<int>(p.M);
  const int64_t K = p.w.K;
  if constexpr (!std::is_void<XT>::value) {
    if (reg_rotate) {
      tiles_rotate_reg<KIND, THREADS, XT, true>(p, 0, M, act, act_stride, s_scale, s_amax,
                                                s_asum);
      return s_scale;
    }
    // Rotate + quantize the M rows of x here (every CTA; x is read from L2) while the first
    // weights stream in.
    for (int m = 0; m < M; ++m) {
      const XT* x = static_cast<const XT*>(p.x) + m * p.x_row_stride;
      int32_t sum;
      const float scale = rotate_quantize_row<XT, 256, THREADS, KIND == kTilesComfy>(
          x, static_cast<int>(K), p.act_qmax, srow, s_amax, act + m * act_stride, sum);
      if (threadIdx.x == 0) s_scale[m] = scale;
      if (KIND == kTilesComfy) {
        sum = __reduce_add_sync(0xffffffffu, sum);
        if (lane == 0 && sum != 0) atomicAdd(&s_asum[m], sum);
      }
      __syncthreads();  // srow is reused by the next row; codes, s_scale, s_asum complete
    }
    return s_scale;  // a generic pointer into shared memory
  } else {
    const int per_row = static_cast<int>(K / 16);
    if (async_copy) {
      // Every row's 16-byte pieces in flight at once (cp.async.cg: L2, coherent; no registers),
      // instead of M dependent load -> store rounds (M L2 round trips at M = 16). Comfy: the
      // sums from the thread's own pieces once they landed (visible to it after the wait).
      for (int m = 0; m < M; ++m)
        for (int c = threadIdx.x; c < per_row; c += THREADS)
          cp_async16(smem_u32(act + m * act_stride + c * 16), p.a + m * p.lda + c * 16);
      cp_async_commit();
      cp_async_wait<0>();
      if (KIND == kTilesComfy) {
        for (int m = 0; m < M; ++m) {
          int32_t sum = 0;
          for (int c = threadIdx.x; c < per_row; c += THREADS) {
            const uint4 v = *reinterpret_cast<const uint4*>(act + m * act_stride + c * 16);
            sum = __dp4a(static_cast<int>(v.x), 0x01010101, sum);
            sum = __dp4a(static_cast<int>(v.y), 0x01010101, sum);
            sum = __dp4a(static_cast<int>(v.z), 0x01010101, sum);
            sum = __dp4a(static_cast<int>(v.w), 0x01010101, sum);
          }
          sum = __reduce_add_sync(0xffffffffu, sum);
          if (lane == 0 && sum != 0) atomicAdd(&s_asum[m], sum);
        }
      }
      return p.ep.a_scale;
    }
    for (int m = 0; m < M; ++m) {
      int32_t sum = 0;
      for (int c = threadIdx.x; c < per_row; c += THREADS) {
        // Coherent loads: written by the grid this one may have overlapped.
        const uint4 v = *reinterpret_cast<const uint4*>(p.a + m * p.lda + c * 16);
        *reinterpret_cast<uint4*>(act + m * act_stride + c * 16) = v;
        if (KIND == kTilesComfy) {
          sum = __dp4a(static_cast<int>(v.x), 0x01010101, sum);
          sum = __dp4a(static_cast<int>(v.y), 0x01010101, sum);
          sum = __dp4a(static_cast<int>(v.z), 0x01010101, sum);
          sum = __dp4a(static_cast<int>(v.w), 0x01010101, sum);
        }
      }
      if (KIND == kTilesComfy) {
        sum = __reduce_add_sync(0xffffffffu, sum);
        if (lane == 0 && sum != 0) atomicAdd(&s_asum[m], sum);
      }
    }
    return p.ep.a_scale;
  }
}


// KIND: kTilesComfy / kTilesInt4. NT: n8 tiles of activation rows (1: M <= 8, 2: M <= 16).
// D: ring slots per warp. XT: the activation dtype when the CTA rotates + quantizes x itself
// (fused mode, M <= kTilesFuseLimit: the ring kernel's fused prologue, the rotate kernels' bits),
// else void (codes from the rotate kernel).
// At most 88 registers: 512 x 88 + the register rotate kernel's CTA (320 threads x 64) fit in
// one SM's 64 K registers together, so the CTA on the rotate kernel's SM starts (PDL) with the
// others instead of after it.
template <int KIND, int NT, int D, typename XT = void>
__global__ void __maxnreg__(kTilesMaxRegs)
    gemv_tiles_kernel(DecodeParams p, TilesLayout L) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int W = kTilesWarps, SLOT = slot_bytes(KIND);
  constexpr bool kFused = !std::is_void<XT>::value;
  extern __shared__ __align__(128) uint8_t dsm[];
  __shared__ int32_t s_asum[16];
  __shared__ float s_scale[16], s_amax[kTilesFuseLimit * W];
  __shared__ __align__(8) uint64_t s_bar[W * D];  // bulk transport: one mbarrier per slot
  __shared__ int32_t s_cnt[2];  // spread: items of the two leftover slots flushed so far

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int M = static_cast<int>(p.M);
  const int64_t N = p.w.N, K = p.w.K;
  const int64_t T = L.tiles, G = gridDim.x, b = blockIdx.x;
  const int ipt = L.ipt;
  // This CTA's items [s0, s1) of the T · ipt in the layout, touching tiles [t0, t1).
  // Spread: [s0, s1) are the CTA's Tw = T / G whole tiles [b·Tw, (b+1)·Tw), and before them it
  // streams its even share [a0, a0 + na) of the R · ipt items of the R = T - G·Tw leftover tiles
  // (local items j < na; at most two tiles, shared with neighbouring CTAs, local slots 0 and 1;
  // the whole tiles take slots ws0 = 2, 3, ...). Their sums go through gacc / gcnt mid-kernel
  // (the last warp combines them while the others stream): no cross-CTA step at the end.
  int64_t s0, s1, a0 = 0, lt0 = 0;
  int na = 0, ws0 = 0;
  if (L.spread) {
    const int64_t tw = T / G, rl = (T - G * tw) * ipt;
    s0 = b * tw * ipt;
    s1 = s0 + tw * ipt;
    a0 = G * tw * ipt + b * rl / G;
    na = static_cast<int>((b + 1) * rl / G - b * rl / G);
    lt0 = G * tw;  // the first leftover tile (tiles >= lt0 are leftovers)
    ws0 = 2;
  } else if (L.balanced) {
    s0 = b * (T * ipt) / G;
    s1 = (b + 1) * (T * ipt) / G;
  } else {
    s0 = b * T / G * ipt;
    s1 = (b + 1) * T / G * ipt;
  }
  const int64_t t0 = s0 / ipt, t1 = (s1 + ipt - 1) / ipt;
  const int ntl = static_cast<int>(t1 - t0);  // this CTA's tiles (whole or shared)
  const int items = na + static_cast<int>(s1 - s0);  // split evenly over the warps
  const int64_t at0 = a0 / ipt;  // spread: the leftover tile of slot 0
  // The warp's items, local indices jb + step · k (k < n_items): a contiguous run of the CTA's
  // items (step 1), or interleaved (step W: the CTA's warps read adjacent items at a time).
  const int step = L.interleave ? W : 1;
  // Spread: warp W - 1 takes half a share (weights 2, ..., 2, 1 of 2W - 1) and then combines the
  // leftover tiles (below), so no streaming warp waits on a global round trip.
  const int jb = L.interleave ? warp
                 : L.spread   ? static_cast<int>(int64_t{items} * (2 * warp) / (2 * W - 1))
                              : warp * items / W;
  const int n_items = L.interleave ? (items > warp ? (items - warp + W - 1) / W : 0)
                      : L.spread
                          ? static_cast<int>(int64_t{items} * min(2 * warp + 2, 2 * W - 1) /
                                             (2 * W - 1)) - jb
                          : (warp + 1) * items / W - jb;
  const uint8_t* codes = p.tiles;
  const uint8_t* tables = p.tiles + T * ipt * kItemBytes;
  // Local item j -> its index in the layout (spread: leftover items first; step is 1 there).
  auto gidx = [&](int k) -> int64_t {
    const int j = jb + step * k;
    return j < na ? a0 + j : s0 + (j - na);
  };
  uint8_t* ring = dsm + L.ring_off + warp * D * SLOT;
  uint8_t* act = dsm;
  int32_t* part = reinterpret_cast<int32_t*>(dsm + L.part_off);

  const bool bulk = L.bulk != 0;
  if (bulk) {
    if (threadIdx.x < W * D) mbar_init(smem_u32(&s_bar[threadIdx.x]), 1u);
    mbar_fence_init();
    __syncthreads();
  }
  const uint32_t bar0 = smem_u32(&s_bar[warp * D]);

  // Item k of this warp into slot s: lane l copies its 16 bytes of both chunks, lanes 0..7 the
  // tables of rows l and l + 8 (packed 4-bit); bulk: lane 0 copies the item's 1 KB and its
  // tables with two bulk copies.
  auto issue = [&](int k, int s) {
    const int64_t gi = gidx(k);
    uint8_t* slot = ring + s * SLOT;
    if (bulk) {  // warp-uniform
      if (lane == 0) {
        const uint32_t bar = bar0 + 8u * s;
        const uint32_t tb = KIND == kTilesInt4 ? kTableBytes : 0;
        mbar_arrive_expect_tx(bar, kItemBytes + tb);
        bulk_g2s(smem_u32(slot), codes + gi * kItemBytes, kItemBytes, bar);
        if (KIND == kTilesInt4)
          bulk_g2s(smem_u32(slot + kItemBytes), tables + gi * kTableBytes, kTableBytes, bar);
      }
      return;
    }
    const uint8_t* src = codes + gi * kItemBytes + lane * 16;
    cp_async16(smem_u32(slot + lane * 16), src);
    cp_async16(smem_u32(slot + 512 + lane * 16), src + 512);
    if (KIND == kTilesInt4 && lane < 8)
      cp_async16(smem_u32(slot + kItemBytes + lane * 16), tables + gi * kTableBytes + lane * 16);
  };
#pragma unroll
  for (int k = 0; k < D - 1; ++k) {
    if (k < n_items) issue(k, k);
    cp_async_commit();
  }
  // More of the warp's run into L2 while the preceding kernel runs (one request per warp).
  // (A hint: the range is the run from item D - 1 on, cut at the end of the layout's items; a
  // spread run's jump from the leftover items to the whole tiles is not followed.)
  if (L.l2_prefetch > 0 && step == 1 && lane == 0 && n_items > D - 1) {
    const int64_t gs = gidx(D - 1);
    const int64_t n =
        min(static_cast<int64_t>(min(n_items - (D - 1), L.l2_prefetch)), T * ipt - gs);
    ptx::bulk_prefetch_l2(codes + gs * kItemBytes, static_cast<uint32_t>(n * kItemBytes));
    if (KIND == kTilesInt4)
      ptx::bulk_prefetch_l2(tables + gs * kTableBytes, static_cast<uint32_t>(n * kTableBytes));
  }
  // The next kernel in the stream may launch now (it waits for this grid before reading).
  if (L.trigger) ptx::griddep_launch_dependents();

  // Partial sums and activation sums start at zero; the epilogue's per-column operands (layer
  // parameters, not written by the preceding kernel) are fetched now, off the critical path.
  for (int i = threadIdx.x; i < (ntl + ws0) * 16 * M; i += kTilesThreads) part[i] = 0;
  if (threadIdx.x < 16) s_asum[threadIdx.x] = 0;
  if (threadIdx.x < 2) s_cnt[threadIdx.x] = 0;
  float* s_ws = reinterpret_cast<float*>(dsm + L.epi_off);
  float* s_bias = s_ws + L.epi_n;
  for (int i = threadIdx.x; i < ntl * 16; i += kTilesThreads) {
    const int64_t col = 16 * t0 + i;
    float ws = 1.f, bias = 0.f;
    if (col < N) {
      if (p.ep.w_scale) ws = p.ep.w_scale[col];
      if (p.ep.bias) bias = load_scalar(p.ep.bias, p.ep.bias_dtype, col);
    }
    s_ws[i] = ws;
    s_bias[i] = bias;
  }
  ptx::griddep_wait();  // the activation codes come from the preceding kernel
  __syncthreads();
  Epilogue ep = p.ep;
  bool coop_done = false;
  if constexpr (kFused) {
    if (L.coop) {
      if (b < M) {  // this CTA's row: rotate + quantize into the global codes and scales
        tiles_rotate_reg<KIND, kTilesThreads, XT, false>(
            p, static_cast<int>(b), static_cast<int>(b) + 1,
            reinterpret_cast<uint8_t*>(const_cast<int8_t*>(p.a)), p.lda,
            const_cast<float*>(p.ep.a_scale), s_amax, s_asum);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd(&L.coop_cnt[0], 1u);
      }
      if (threadIdx.x == 0) {  // every row written (acquire); bounded: wrong output, not a hang
        for (uint32_t polls = 0; polls < (1u << 26); ++polls) {
          if (ptx::ld_acquire_gpu(L.coop_cnt) >= static_cast<uint32_t>(M)) break;
          __nanosleep(32);
        }
      }
      __syncthreads();
      tiles_activations<KIND, kTilesThreads, void>(p, act, L.act_stride, nullptr, s_scale, s_amax,
                                                   s_asum, true, false);
      if (threadIdx.x < M) s_scale[threadIdx.x] = __ldcg(p.ep.a_scale + threadIdx.x);
      ep.a_scale = s_scale;
      __syncthreads();
      if (threadIdx.x == 0 && atomicAdd(&L.coop_cnt[1], 1u) == static_cast<uint32_t>(G - 1)) {
        atomicExch(&L.coop_cnt[0], 0u);  // every CTA has passed its wait
        atomicExch(&L.coop_cnt[1], 0u);
      }
      coop_done = true;
    }
  }
  if (coop_done) {
    // the cooperative rotation above
  } else {
    ep.a_scale = tiles_activations<KIND, kTilesThreads, XT>(
        p, act, L.act_stride, reinterpret_cast<float*>(dsm + L.srow_off), s_scale, s_amax,
        s_asum, L.act_async != 0, L.fuse_reg != 0);
    __syncthreads();
  }

  // B operands: activation row (token) gid (+ 8) of the n8 tile; rows >= M read row M - 1 (they
  // only feed output columns that are never stored).
  const uint8_t* a_tok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    a_tok[nt] = act + min(gid + 8 * nt, M - 1) * L.act_stride + 16 * tid4;

  int32_t acc0[NT][4], acc1[NT][4];  // comfy: lo (u) / hi (16 u); packed: X / Y
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc0[nt][r] = acc1[nt][r] = 0;

  // apply_epilogue's arithmetic and order; ws / bias: the column's w_scale and bias.
  auto finish_with = [&](int32_t sum, int tok, int64_t col, float ws, float bias) {
    if (KIND == kTilesComfy) sum -= 8 * s_asum[tok];
    if (p.acc_out) {
      p.acc_out[tok * p.ldo + col] = sum;
    } else {
      float v = static_cast<float>(sum);
      if (ep.a_scale) v = __fmul_rn(v, ep.a_scale[tok]);
      if (ep.w_scale) v = __fmul_rn(v, ws);
      if (ep.w_tensor_scale) v = __fmul_rn(v, *ep.w_tensor_scale);
      if (ep.bias) v = __fadd_rn(v, bias);
      store2(p.out, p.out_dtype, tok * p.ldo + col, v, 0.f, false, false);
    }
  };
  // Spread: the streaming warps add their sums of a leftover slot to shared memory and count
  // the items (no wait). Warp W - 1, after its half share, waits until the CTA's items of each
  // leftover tile are counted, adds the slot to the tile's global sums and the CTA's item count
  // to the tile's counter (threadfence-reduction pattern); the CTA that completes the count
  // (ipt) finishes the tile and leaves its sums and counter zero.
  auto leftover_combine = [&](int ls) {
    const int64_t t = at0 + ls;
    const int64_t lo = max(a0, t * ipt), hi = min(a0 + na, (t + 1) * ipt);
    if (hi <= lo) return;  // no item of this CTA there (warp-uniform)
    const int mine = static_cast<int>(hi - lo);  // this CTA's items of tile t
    for (uint32_t polls = 0; polls < (1u << 26); ++polls) {
      if (*reinterpret_cast<volatile int32_t*>(&s_cnt[ls]) >= mine) break;
      __nanosleep(64);
    }
    __threadfence_block();
    __syncwarp();
    int32_t* gsum = L.gacc + t * kSharedTileInts;
    for (int i = lane; i < 16 * M; i += 32) {
      const int32_t v = part[ls * 16 * M + i];
      if (v != 0) atomicAdd(gsum + i, v);
    }
    __threadfence();
    __syncwarp();
    int last = 0;
    if (lane == 0)
      last = atomicAdd(&L.gcnt[t], static_cast<uint32_t>(mine)) + mine ==
             static_cast<uint32_t>(ipt);
    __threadfence();
    last = __shfl_sync(0xffffffffu, last, 0);
    __syncwarp();
    if (!last) return;
    for (int i = lane; i < 16 * M; i += 32) {
      const int c = i / M, tok = i - c * M;
      const int32_t v = atomicExch(gsum + i, 0);
      const int64_t col = 16 * t + c;
      if (col < N) {
        const float ws = p.ep.w_scale ? p.ep.w_scale[col] : 1.f;
        const float bias = p.ep.bias ? load_scalar(p.ep.bias, p.ep.bias_dtype, col) : 0.f;
        finish_with(v, tok, col, ws, bias);
      }
    }
    if (lane == 0) atomicExch(&L.gcnt[t], 0u);
  };

  // Local tile slot and group of the current item (spread: leftover tiles in slots 0, 1).
  int tl = 0, g = 0, run = 0;
  if (n_items > 0) {
    const int64_t gf = gidx(0), tf = gf / ipt;
    g = static_cast<int>(gf - tf * ipt);
    tl = static_cast<int>(L.spread && tf >= lt0 ? tf - at0 : tf - t0 + ws0);
  }
  int slot = 0;
  uint32_t parity = 0;  // bulk: the phase of the slots in this pass over the ring
  for (int k = 0; k < n_items; ++k) {
    if (bulk) {
      // Every lane waits for (acquires) the slot's phase. A copy that never lands gives up after
      // ~2^24 polls: wrong output (the harness says so), not a hang.
      for (uint32_t polls = 0; polls < (1u << 24); ++polls)
        if (mbar_try(bar0 + 8u * slot, parity)) break;
    } else {
      cp_async_wait<D - 2>();  // this lane's copies of item k landed
    }
    __syncwarp();      // ... and every lane's (tables); slot k - 1 is read by all lanes
    if (k + D - 1 < n_items) issue(k + D - 1, slot == 0 ? D - 1 : slot - 1);
    cp_async_commit();
    const uint8_t* sl = ring + slot * SLOT;
    uint32_t tab[4] = {0u, 0u, 0u, 0u};
    if constexpr (KIND != kTilesComfy) {
      const uint4 t = lds128(sl + kItemBytes + gid * 16);
      tab[0] = t.x, tab[1] = t.y, tab[2] = t.z, tab[3] = t.w;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 wv = lds128(sl + h * 512 + lane * 16);
      const uint32_t wd[4] = {wv.x, wv.y, wv.z, wv.w};
      const int kc = g * kItemCols + 64 * h;
      uint4 bv[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) bv[nt] = lds128(a_tok[nt] + kc);
      if constexpr (KIND == kTilesComfy) {
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo[i] = wd[i] & 0x0f0f0f0fu;
          hi[i] = wd[i] & 0xf0f0f0f0u;
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          mma_u8s8(acc0[nt], lo, bv[nt].x, bv[nt].y);
          mma_u8s8(acc1[nt], hi, bv[nt].z, bv[nt].w);
        }
      } else {
        // X (c >= 0) and Y (c < 0) in two u8 mma sets. (Merging them per byte into one s8 word,
        // as session 5's direct kernel did, was bit-identical but 9 % slower at M = 1: run 10.)
        uint32_t x1[4], x2[4], y1[4], y2[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t ta = tab[2 * (i & 1)], tb = tab[2 * (i & 1) + 1];  // row gid / gid + 8
          const uint32_t v = wd[i] ^ 0x88888888u;
          x1[i] = prmt(ta, tb, wd[i]);
          x2[i] = prmt(ta, tb, wd[i] >> 16);
          y1[i] = prmt(ta, tb, v);
          y2[i] = prmt(ta, tb, v >> 16);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          mma_u8s8(acc0[nt], x1, bv[nt].x, bv[nt].y);
          mma_u8s8(acc0[nt], x2, bv[nt].z, bv[nt].w);
          mma_u8s8(acc1[nt], y1, bv[nt].x, bv[nt].y);
          mma_u8s8(acc1[nt], y2, bv[nt].z, bv[nt].w);
        }
      }
    }
    if (++slot == D) {
      slot = 0;
      parity ^= 1u;
    }
    // Next item's group; adv: tile boundaries crossed on the way (step < ipt: 0 or 1). Spread:
    // after the last leftover item the run jumps to the first whole tile (slot 2, group 0).
    int adv = 0;
    int next_tl = -1;
    ++run;
    if (L.spread && jb + k + 1 == na) {
      next_tl = ws0;
      g = 0;
    } else {
      for (g += step; g >= ipt; g -= ipt) ++adv;
    }
    if (adv > 0 || next_tl >= 0 || k == n_items - 1) {
      // The tile's columns of this warp are complete: add them to the CTA's partial sums.
      // D fragment: c0, c1 = (row gid, tokens 2 tid4, 2 tid4 + 1), c2, c3 = row gid + 8.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = gid + 8 * (r >> 1), tok = 8 * nt + 2 * tid4 + (r & 1);
          const int32_t v = KIND == kTilesComfy ? acc0[nt][r] + (acc1[nt][r] >> 4)
                                                : acc0[nt][r] - acc1[nt][r];
          if (tok < M) atomicAdd(&part[(tl * 16 + row) * M + tok], v);
          acc0[nt][r] = acc1[nt][r] = 0;
        }
      }
      if (L.spread && tl < ws0) {  // a leftover slot: count the items added (warp-uniform)
        __threadfence_block();
        __syncwarp();
        if (lane == 0) atomicAdd(&s_cnt[tl], run);
      }
      run = 0;
      tl = next_tl >= 0 ? next_tl : tl + adv;
    }
  }
  if (L.spread && warp == W - 1) {
#pragma unroll 1
    for (int ls = 0; ls < 2; ++ls) leftover_combine(ls);
  }
  cp_async_wait<0>();
  __syncthreads();

  // apply_epilogue's arithmetic and order, w_scale and bias from shared memory (c: the column's
  // index in this CTA's range).
  auto finish = [&](int32_t sum, int tok, int64_t col) {
    const int c = static_cast<int>(col - 16 * t0);
    finish_with(sum, tok, col, s_ws[c], s_bias[c]);
  };
  // Tiles shared with a neighbour (balanced split only): the first if this CTA starts inside it,
  // the last if it ends inside it.
  const bool left_shared = t0 * ipt < s0, right_shared = t1 * ipt > s1;
  // Epilogue of the whole tiles: columns [16 t0, 16 t1) less the shared ends, every row.
  const int c_lo = left_shared ? 16 : 0, c_hi = (ntl - (right_shared ? 1 : 0)) * 16;
  const int cols = c_hi - c_lo;
  for (int idx = threadIdx.x; idx < cols * M; idx += kTilesThreads) {
    const int tok = idx / cols, c = c_lo + (idx - tok * cols);
    const int64_t col = 16 * t0 + c;
    if (col < N) finish(part[(ws0 * 16 + c) * M + tok], tok, col);
  }
  __shared__ uint32_t s_second;
#pragma unroll 1
  for (int e = 0; e < 2; ++e) {
    if (!(e == 0 ? left_shared : right_shared)) continue;  // uniform
    const int64_t boundary = e == 0 ? b : b + 1;            // between CTAs boundary - 1, boundary
    const int side = e == 0 ? 1 : 0;                        // 0: the left CTA's part
    const int ltl = e == 0 ? 0 : ntl - 1;
    int32_t* mine = L.bnd + (boundary * 2 + side) * 256;
    const int32_t* other = L.bnd + (boundary * 2 + (1 - side)) * 256;
    for (int i = threadIdx.x; i < 16 * M; i += kTilesThreads) mine[i] = part[ltl * 16 * M + i];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_second = atomicAdd(&L.cnt[boundary], 1u) & 1u;
    __syncthreads();
    if (s_second) {  // the other side's sums are in place: finish the tile
      __threadfence();
      for (int i = threadIdx.x; i < 16 * M; i += kTilesThreads) {
        const int c = i / M, tok = i - c * M;
        const int64_t col = 16 * (t0 + ltl) + c;
        if (col < N) finish(part[ltl * 16 * M + i] + __ldcg(other + i), tok, col);
      }
    }
  }
#else
  __trap();  // launched on sm_90 only (decode_tiles_applies)
#endif
}

// 16 bytes of the weight layout (read-only for the kernel's lifetime), not kept in L1.
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

TilesLayout tiles_layout(const DecodeParams& d, int grid, int depth, bool balanced = false,
                         bool spread = false, bool fuse_reg = false) {
  TilesLayout L;
  const int kind = decode_tiles_kind(d.w);
  L.tiles = (d.w.N + 15) / 16;
  L.ipt = static_cast<int>(d.w.K / kItemCols);
  // Row stride = 64 (mod 128): the 8 lanes of an LDS.128 phase (tokens gid, gid + 1, 4 lanes
  // each at 16 tid4) hit 8 distinct 16-byte bank groups.
  L.act_stride = static_cast<int>(d.w.K / 128 * 128 + 192);
  int64_t off = (d.M * L.act_stride + 127) / 128 * 128;
  if (d.x && !fuse_reg) {
    L.srow_off = static_cast<int>(off);
    off += (d.w.K * 4 + 127) / 128 * 128;
  }
  L.fuse_reg = d.x && fuse_reg ? 1 : 0;
  L.part_off = static_cast<int>(off);
  // Balanced: a CTA's items may touch one more tile than the whole-tile split gives it.
  // Spread: two more slots (the leftover tiles) before the whole ones.
  const int64_t tiles_per_cta = (L.tiles + grid - 1) / grid + (balanced ? 1 : 0) +
                                (spread ? 2 : 0);
  L.balanced = balanced ? 1 : 0;
  L.spread = spread ? 1 : 0;
  off += (tiles_per_cta * 16 * d.M * 4 + 127) / 128 * 128;
  L.epi_off = static_cast<int>(off);
  L.epi_n = static_cast<int>(tiles_per_cta * 16);
  off += (2 * tiles_per_cta * 16 * 4 + 127) / 128 * 128;
  L.ring_off = static_cast<int>(off);
  L.depth = depth;
  L.smem = off + static_cast<int64_t>(kTilesWarps) * depth * slot_bytes(kind);
  return L;
}

struct TilesDevice {
  bool sm90 = false;
  int max_smem = 0;
};
TilesDevice tiles_device() {
  static std::mutex mu;
  static std::map<int, TilesDevice> cache;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "decode_tiles", "device");
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  TilesDevice info;
  int major = 0, optin = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
             "decode_tiles", "compute capability");
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "decode_tiles", "shared memory");
  cudaFuncAttributes attr{};
  const bool image =
      cudaFuncGetAttributes(&attr, gemv_tiles_kernel<kTilesComfy, 1, 6>) == cudaSuccess &&
      attr.binaryVersion >= 90;
  (void)cudaGetLastError();
  info.sm90 = major == 9 && image;
  info.max_smem = optin - 2048;  // room for the static arrays (mbarriers included)
  cache.emplace(dev, info);
  return info;
}

template <typename Kernel>
void tiles_smem(Kernel kernel, int64_t bytes) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*>, int64_t> done;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "decode_tiles", "device");
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel));
  auto it = done.find(key);
  if (it != done.end() && it->second >= bytes) return;
  int64_t limit = bytes;
  if (it != done.end()) limit = std::max(limit, it->second);
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(limit)),
             "decode_tiles", "shared memory");
  done[key] = limit;
}

// The balanced split's boundary buffers of the current device and stream: (SMs + 1) x 2 x 256
// int32 and (SMs + 1) counters, zeroed once (on `stream`, ordered before the first kernel that
// uses them). Every launch adds 2 to the counter of each boundary it shares, so they are even
// between launches; launches on one stream never overlap past griddepcontrol.wait, and each
// stream has its own buffers (about 270 KB, kept for the process's lifetime).
void boundary_buffers(cudaStream_t stream, int32_t** bnd, uint32_t** cnt) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, std::pair<int32_t*, uint32_t*>> bufs;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "decode_tiles", "device");
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, stream);
  auto it = bufs.find(key);
  if (it == bufs.end()) {
    const size_t n = static_cast<size_t>(multiprocessor_count()) + 1;
    void* b = nullptr;
    void* c = nullptr;
    check_cuda(cudaMalloc(&b, n * 2 * 256 * sizeof(int32_t)), "decode_tiles", "boundary sums");
    check_cuda(cudaMalloc(&c, n * sizeof(uint32_t)), "decode_tiles", "boundary counters");
    check_cuda(cudaMemsetAsync(c, 0, n * sizeof(uint32_t), stream), "decode_tiles", "memset");
    it = bufs.emplace(key, std::make_pair(static_cast<int32_t*>(b), static_cast<uint32_t*>(c)))
             .first;
  }
  *bnd = it->second.first;
  *cnt = it->second.second;
}

// The cooperative rotation's two counters for the current device and stream: zeroed once (on
// `stream`) when allocated; every launch leaves them zero (its last CTA re-zeroes them), and
// launches on one stream touch them only after griddepcontrol.wait (the previous grid done).
uint32_t* coop_counters(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, uint32_t*> bufs;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "decode_tiles", "device");
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, stream);
  auto it = bufs.find(key);
  if (it == bufs.end()) {
    void* c = nullptr;
    check_cuda(cudaMalloc(&c, 2 * sizeof(uint32_t)), "decode_tiles", "cooperative counters");
    check_cuda(cudaMemsetAsync(c, 0, 2 * sizeof(uint32_t), stream), "decode_tiles", "memset");
    it = bufs.emplace(key, static_cast<uint32_t*>(c)).first;
  }
  return it->second;
}

int tiles_grid(const DecodeParams& d) {
  const int64_t tiles = (d.w.N + 15) / 16;
  return static_cast<int>(std::min<int64_t>(multiprocessor_count(), tiles));
}

// The leftover tiles' sums and item counters of the spread split for the current device and stream
// (>= `tiles` tiles): zeroed once on `stream` when allocated, left zero by every launch (the
// finishing CTA of each shared tile zeroes its entries). Each stream has its own (launches on
// one stream do not overlap past griddepcontrol.wait, before which the kernel does not touch
// them); kept for the process's lifetime, regrown (after synchronizing the stream) when a
// larger weight needs more.
void shared_tile_buffers(cudaStream_t stream, int64_t tiles, int32_t** acc, uint32_t** cnt) {
  struct Buf {
    int64_t tiles = 0;
    int32_t* acc = nullptr;
    uint32_t* cnt = nullptr;
  };
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Buf> bufs;
  const char* op = "decode_tiles";
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), op, "device");
  std::lock_guard<std::mutex> lock(mu);
  Buf& b = bufs[std::make_pair(dev, stream)];
  if (b.tiles < tiles) {
    if (b.acc) {
      check_cuda(cudaStreamSynchronize(stream), op, "synchronize");
      check_cuda(cudaFree(b.acc), op, "free");
      check_cuda(cudaFree(b.cnt), op, "free");
      b = Buf{};
    }
    const int64_t n = std::max<int64_t>(tiles, 1024);
    void* a = nullptr;
    void* c = nullptr;
    check_cuda(cudaMalloc(&a, static_cast<size_t>(n) * kSharedTileInts * sizeof(int32_t)), op,
               "shared tile sums");
    check_cuda(cudaMalloc(&c, static_cast<size_t>(n) * sizeof(uint32_t)), op,
               "shared tile counters");
    check_cuda(cudaMemsetAsync(a, 0, static_cast<size_t>(n) * kSharedTileInts * sizeof(int32_t),
                               stream),
               op, "memset");
    check_cuda(cudaMemsetAsync(c, 0, static_cast<size_t>(n) * sizeof(uint32_t), stream), op,
               "memset");
    b.tiles = n;
    b.acc = static_cast<int32_t*>(a);
    b.cnt = static_cast<uint32_t*>(c);
  }
  *acc = b.acc;
  *cnt = b.cnt;
}

template <int KIND, int NT, int D, typename T = void>
void launch_tiles(const DecodeParams& d, const TilesLayout& L, int grid, cudaStream_t stream) {
  auto kernel = gemv_tiles_kernel<KIND, NT, D, T>;
  tiles_smem(kernel, L.smem);
  launch_maybe_pdl(true, kernel, dim3(static_cast<unsigned>(grid)), dim3(kTilesThreads),
                   static_cast<size_t>(L.smem), stream, d, L);
}

// A read-only stream of the layout (bench only; session 5's direct GEMV kernel without its
// arithmetic): the grid's items split evenly over min(SMs, items) CTAs of 16 warps, each lane's
// 16-byte words loaded with ld.global.nc, 4 items ahead in a register ring, each item
// folded into one xor; the store (sink is null: never taken, but the compiler cannot know) keeps
// the loads alive. (A grid-stride loop of 8 independent loads per thread does not do: ptxas
// interleaves the uses and keeps the kernel at 32 registers, ~5 loads in flight.)
// INTERLEAVE: warp w reads the CTA's items w, w + 16, ... (the CTA's warps on 16 adjacent KB at a
// time) instead of a contiguous run.
template <bool TABLES, bool INTERLEAVE>
__global__ void __launch_bounds__(kTilesThreads, 1)
    stream_probe_kernel(const uint8_t* tiles, int64_t items_total, uint4* sink) {
  constexpr int U = 4, W = kTilesWarps, STEP = INTERLEAVE ? W : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t G = gridDim.x, b = blockIdx.x;
  const int64_t s0 = b * items_total / G, s1 = (b + 1) * items_total / G;
  const int items = static_cast<int>(s1 - s0);
  const int jb = INTERLEAVE ? warp : warp * items / W;
  const int n = INTERLEAVE ? (items > warp ? (items - warp + W - 1) / W : 0)
                           : (warp + 1) * items / W - jb;
  const uint8_t* codes = tiles + (s0 + jb) * kItemBytes + lane * 16;
  const uint8_t* tables = tiles + items_total * kItemBytes + (s0 + jb) * kTableBytes +
                          (lane >> 2) * 16;
  uint4 b0[U], b1[U], bt[U];
#pragma unroll
  for (int j = 0; j < U; ++j) {
    b0[j] = b1[j] = bt[j] = make_uint4(0u, 0u, 0u, 0u);
    if (j < n) {
      b0[j] = ldg_stream(codes + j * STEP * kItemBytes);
      b1[j] = ldg_stream(codes + j * STEP * kItemBytes + 512);
      if (TABLES) bt[j] = ldg_stream(tables + j * STEP * kTableBytes);
    }
  }
  uint32_t acc = 0;
  for (int k0 = 0; k0 < n; k0 += U) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int k = k0 + j;
      if (k >= n) break;
      const uint4 w0 = b0[j], w1 = b1[j], t = bt[j];
      if (k + U < n) {
        b0[j] = ldg_stream(codes + (k + U) * STEP * kItemBytes);
        b1[j] = ldg_stream(codes + (k + U) * STEP * kItemBytes + 512);
        if (TABLES) bt[j] = ldg_stream(tables + (k + U) * STEP * kTableBytes);
      }
      acc ^= w0.x ^ w0.y ^ w0.z ^ w0.w ^ w1.x ^ w1.y ^ w1.z ^ w1.w;
      if (TABLES) acc ^= t.x ^ t.y ^ t.z ^ t.w;
    }
  }
  if (acc == 0x9e3779b9u && sink != nullptr) *sink = make_uint4(acc, 0u, 0u, 0u);
}

}  // namespace

int decode_tiles_kind(const PackedWeightRef& w) {
  if (w.K % kItemCols != 0 || w.K > kTilesMaxK || w.N < 1) return kTilesNone;
  if (w.format == WeightFormat::comfy_int4) return kTilesComfy;
  if (w.format == WeightFormat::packed && w.bits == 4 &&
      (!w.ratios || (w.group == 128 && w.groups_per_row == w.K / 128)))
    return kTilesInt4;
  return kTilesNone;
}

bool decode_tiles_device() { return tiles_device().sm90; }

int64_t decode_tiles_bytes(const PackedWeightRef& w) {
  const int kind = decode_tiles_kind(w);
  if (kind == kTilesNone) return 0;
  const int64_t items = (w.N + 15) / 16 * (w.K / kItemCols);
  return items * (kind == kTilesInt4 ? kItemBytes + kTableBytes : kItemBytes);
}

bool decode_tiles_build(const PackedWeightRef& w, uint8_t* out, cudaStream_t stream) {
  const char* op = "decode_tiles_build";
  const int kind = decode_tiles_kind(w);
  if (kind == kTilesNone) return false;
  const int ipt = static_cast<int>(w.K / kItemCols);
  const int64_t tiles = (w.N + 15) / 16;
  Scratch flag(sizeof(int), stream, op);
  check_cuda(cudaMemsetAsync(flag.as<int>(), 0, sizeof(int), stream), op, "memset");
  const int64_t words = tiles * ipt * (kItemBytes / 4);
  build_tile_codes_kernel<<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(
      w, kind, ipt, words, reinterpret_cast<uint32_t*>(out), flag.as<int>());
  check_launch(op);
  if (kind == kTilesInt4) {
    const int64_t n = tiles * 16 * ipt;
    build_tile_tables_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        w, ipt, tiles, out + tiles * ipt * kItemBytes, flag.as<int>());
    check_launch(op);
  }
  int bad = 0;
  check_cuda(cudaMemcpyAsync(&bad, flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream),
             op, "flag copy");
  check_cuda(cudaStreamSynchronize(stream), op, "synchronize");
  return bad == 0;
}

bool decode_tiles_applies(const DecodeParams& d) {
  if (!d.tiles || d.M < 1 || d.M > 16) return false;
  if (decode_tiles_kind(d.w) == kTilesNone) return false;
  if (reinterpret_cast<uintptr_t>(d.tiles) % 16 != 0) return false;
  if (d.x) {  // fused: the ring kernel's rule (rot 256, bf16 / f16 x, few rows), depth 8 only
    // More rows: the cooperative mode (codes and scales through d.a / d.ep.a_scale), or the
    // rotate kernel into them first (decode_tiles_with).
    const bool scratch = d.a && d.ep.a_scale && d.lda % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(d.a) % 16 == 0;
    if ((d.M > kTilesFuseLimit && !scratch) || d.rot != 256) return false;
    if (d.x_dtype != DType::bf16 && d.x_dtype != DType::f16) return false;
  } else if (!d.a || d.lda % 16 != 0 || reinterpret_cast<uintptr_t>(d.a) % 16 != 0) {
    return false;
  }
  const TilesDevice info = tiles_device();
  if (!info.sm90) return false;
  // Fused with more rows than kTilesFuseLimit: the cooperative mode's layout (no fp32 row, depth
  // 4), which the rotate-kernel fallback's also fits in.
  const bool many = d.x && d.M > kTilesFuseLimit;
  return tiles_layout(d, tiles_grid(d), d.x && !many ? 8 : 4, false, false, many).smem <=
         info.max_smem;
}

namespace {
std::mutex g_tuning_mu;
bool g_tuning_set = false;
DecodeTilesTuning g_tuning;
}  // namespace

DecodeTilesTuning layer_tiles_tuning() {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  return g_tuning_set ? g_tuning : DecodeTilesTuning{};
}

void set_layer_tiles_tuning(const DecodeTilesTuning* t) {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  g_tuning_set = t != nullptr;
  g_tuning = t ? *t : DecodeTilesTuning{};
}

void decode_tiles(const DecodeParams& d, cudaStream_t stream) {
  decode_tiles_with(d, layer_tiles_tuning(), stream);
}

void decode_tiles_with(const DecodeParams& dp, const DecodeTilesTuning& t, cudaStream_t stream) {
  DecodeParams d = dp;
  const int grid = tiles_grid(d);
  const int max_smem = tiles_device().max_smem;
  // Fused call (x in) with scratch codes / scales (d.a, d.ep.a_scale): the cooperative rotation
  // where it applies; else, past kTilesFuseLimit rows, the rotate kernel into the scratch first.
  const bool scratch = d.x && d.a && d.ep.a_scale && d.lda % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(d.a) % 16 == 0;
  const bool coop = scratch && t.coop && d.M <= grid && d.w.K <= 16 * kTilesThreads &&
                    (d.act_qmax == 7 || d.act_qmax == 127) &&
                    reinterpret_cast<uintptr_t>(d.x) % 16 == 0 && d.x_row_stride % 8 == 0;
  if (d.x && !coop && (d.M > kTilesFuseLimit || (scratch && t.coop))) {
    RotateQuantParams rq = rotate_quant_rows(d.x, d.x_dtype, d.M, d.w.K,
                                             d.act_qmax == 7 ? ActFormat::int4 : ActFormat::int8,
                                             const_cast<int8_t*>(d.a),
                                             const_cast<float*>(d.ep.a_scale), d.rot);
    rq.x_row_stride = d.x_row_stride;
    rq.codes_row_stride = d.lda;
    rq.pdl = t.trigger;
    rotate_quantize(rq, stream);
    d.x = nullptr;
  }
  // The deepest ring <= t.depth (0: the deepest) that fits: 8, 6 or 4 slots per warp; the fused
  // instances exist with 8 only (decode_tiles_applies checked that it fits). H200 run 6: depth 4
  // was the fastest (convrotint4 1 x 5120 -> 13824 17.9 us vs 19.6 at depth 8, comfy 16.6 vs
  // 17.0), so it is the default (DecodeTilesTuning).
  // Fused on the register rotation (t.fuse_reg): K <= 16 threads' worth, 16-byte rows of x, and
  // depth 8 or 4 (its instances); else the shared-memory rotation at depth 8.
  const bool freg = coop || (d.x && t.fuse_reg && d.w.K <= 16 * kTilesThreads &&
                             (d.act_qmax == 7 || d.act_qmax == 127) &&
                             reinterpret_cast<uintptr_t>(d.x) % 16 == 0 && d.x_row_stride % 8 == 0);
  int depth = (d.x && !freg) || t.depth <= 0 || t.depth >= 8 ? 8 : (t.depth >= 6 && !d.x ? 6 : 4);
  if (coop && d.M > 8) depth = 4;  // the two-n8-tile fused instances exist at depth 4 only
  TilesLayout L = tiles_layout(d, grid, depth, false, false, freg);
  while ((!d.x || freg) && L.smem > max_smem && depth > 4) {
    depth = d.x ? 4 : depth - 2;
    L = tiles_layout(d, grid, depth, false, false, freg);
  }
  L.bulk = t.bulk ? 1 : 0;
  L.interleave = t.interleave ? 1 : 0;
  L.trigger = t.trigger ? 1 : 0;
  L.l2_prefetch = std::max(0, t.l2_prefetch);
  L.act_async = t.async_act ? 1 : 0;
  if (coop) {
    L.coop = 1;
    L.coop_cnt = coop_counters(stream);
  }
  if (t.balanced) {  // the same depth with one more (shared) tile per CTA, if it fits
    TilesLayout B = tiles_layout(d, grid, depth, true);
    if (B.smem <= max_smem) {
      B.bulk = L.bulk;
      B.interleave = L.interleave;
      B.trigger = L.trigger;
      B.l2_prefetch = L.l2_prefetch;
      B.act_async = L.act_async;
      L = B;
      boundary_buffers(stream, &L.bnd, &L.cnt);
    }
  } else if (t.spread && !t.interleave) {  // two more (leftover) slots per CTA, if they fit
    TilesLayout B = tiles_layout(d, grid, depth, false, true);
    if (B.smem <= max_smem) {
      B.bulk = L.bulk;
      B.trigger = L.trigger;
      B.l2_prefetch = L.l2_prefetch;
      B.act_async = L.act_async;
      L = B;
      shared_tile_buffers(stream, L.tiles, &L.gacc, &L.gcnt);
    }
  }
  const int kind = decode_tiles_kind(d.w);
  const bool two = d.M > 8;
  auto go = [&](auto kind_tag) {
    constexpr int KIND = decltype(kind_tag)::value;
    if (d.x) {  // fused instances: one n8 tile (M <= kTilesFuseLimit), depth 8 (or 4: freg)
      auto by_x = [&](auto depth_tag) {
        constexpr int DEPTH = decltype(depth_tag)::value;
        if (d.x_dtype == DType::f16) {
          launch_tiles<KIND, 1, DEPTH, __half>(d, L, grid, stream);
        } else {
          launch_tiles<KIND, 1, DEPTH, __nv_bfloat16>(d, L, grid, stream);
        }
      };
      if (two) {  // the cooperative mode only (M > kTilesFuseLimit)
        if (d.x_dtype == DType::f16) {
          launch_tiles<KIND, 2, 4, __half>(d, L, grid, stream);
        } else {
          launch_tiles<KIND, 2, 4, __nv_bfloat16>(d, L, grid, stream);
        }
      } else if (depth == 8) {
        by_x(std::integral_constant<int, 8>{});
      } else {
        by_x(std::integral_constant<int, 4>{});
      }
      return;
    }
    auto by_nt = [&](auto depth_tag) {
      constexpr int DEPTH = decltype(depth_tag)::value;
      if (two) {
        launch_tiles<KIND, 2, DEPTH>(d, L, grid, stream);
      } else {
        launch_tiles<KIND, 1, DEPTH>(d, L, grid, stream);
      }
    };
    if (depth == 8) {
      by_nt(std::integral_constant<int, 8>{});
    } else if (depth == 6) {
      by_nt(std::integral_constant<int, 6>{});
    } else {
      by_nt(std::integral_constant<int, 4>{});
    }
  };
  if (kind == kTilesComfy) {
    go(std::integral_constant<int, kTilesComfy>{});
  } else {
    go(std::integral_constant<int, kTilesInt4>{});
  }
  check_launch("decode_tiles");
}

void decode_tiles_stream_probe(const DecodeParams& d, bool interleave, cudaStream_t stream) {
  const int64_t items = (d.w.N + 15) / 16 * (d.w.K / kItemCols);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(multiprocessor_count(), items));
  auto go = [&](auto kernel) {
    kernel<<<grid, kTilesThreads, 0, stream>>>(d.tiles, items, nullptr);
  };
  const bool tables = decode_tiles_kind(d.w) == kTilesInt4;
  if (tables && interleave) {
    go(stream_probe_kernel<true, true>);
  } else if (tables) {
    go(stream_probe_kernel<true, false>);
  } else if (interleave) {
    go(stream_probe_kernel<false, true>);
  } else {
    go(stream_probe_kernel<false, false>);
  }
  check_launch("decode_tiles_stream_probe");
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
