// Ring decode kernel for M <= 16 (SPEC §3.5; design and measurements in docs/linear-gpu.md,
// "Session 3: the ring decode kernel").
//
// At M <= 16 the layer is the weight stream: 35 MB of packed int4 at 5120 -> 13824. The kernel is
// built so that the memory system always has tens of KB per SM requested and nothing else sits on
// the critical path:
//   - one persistent CTA per SM owns a contiguous range of weight rows (output columns), split
//     evenly (to 2 rows), so every CTA streams the same number of bytes;
//   - inside the CTA each warp owns tiles of 8 (M <= 8) or 16 (M > 8) consecutive rows over the
//     whole K, so it finishes its columns alone: no cross-warp reduction, no CTA barrier in the
//     main loop;
//   - a warp's items (tile, K slice of 256 bytes per row) arrive by 16-byte cp.async per lane
//     into the warp's own ring of D slots (D = 2..4), each lane's copies completing as one
//     arrival on the slot's mbarrier (cp.async.mbarrier.arrive.noinc, 32 per phase). The first
//     D items of every warp are requested before anything else happens (before
//     griddepcontrol.wait and before the activation prologue);
//   - the activations (the codes a rotate kernel wrote) go to shared memory once per CTA;
//   - per 32-column chunk a lane builds 4 entries of the group's 16-entry int8 table (SPEC §3.3
//     fold, 3 shuffles to share them), looks its 32 codes up with byte permutes (linear_lut.h,
//     the table the streaming kernel uses and tests/unit/linear_lut_test.cpp replays), and feeds
//     mma.sync m16n8k32 with the same columns of the activation rows: exact int32 sums, the
//     prefill path's epilogue, the same output bits.
//   - convrotfp8 (kRFp8, session 17): e4m3 weight and activation bytes through the int8 path's
//     loads and mma.sync m16n8k32 .e4m3 with fp32 accumulators (the tensor cores' sums, within
//     the layer's fp8 tolerance; the prefill path is cuBLASLt's fp8 GEMM).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>

#include "lowbit/dtype.h"
#include "src/cuda/common.cuh"
#include "src/cuda/gemm_common.cuh"
#include "src/cuda/linear_decode_ring.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_lut.h"
#include "src/cuda/linear_rotate.cuh"
#include "src/cuda/linear_unpack.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

// Weight kinds (template argument).
constexpr int kRComfy = 0, kRPacked4 = 1, kRInt8 = 2, kRFp8 = 3;
// One byte per weight (int8 codes, e4m3 bytes).
__host__ __device__ constexpr bool byte_codes(int wf) { return wf == kRInt8 || wf == kRFp8; }
// Columns of one K slice (one item covers rows x slice): 256 bytes per row for every kind.
__host__ __device__ constexpr int slice_cols(int wf) { return byte_codes(wf) ? 256 : 512; }
constexpr int kSliceBytes = 256;
// Row stride inside a slot: the slice plus a pad that makes the 8 lanes of an LDS.128 phase
// (rows gid, gid + 1, 4 lanes each) hit distinct 16-byte bank groups.
__host__ __device__ constexpr int slot_row_stride(int wf) {
  return kSliceBytes + (byte_codes(wf) ? 16 : 64);
}
// Warps per CTA: tiles of 8 rows (NT = 1) with 16 warps, tiles of 16 rows (NT = 2) with 8.
__host__ __device__ constexpr int ring_warps(int nt) { return nt == 1 ? 16 : 8; }
constexpr int kMaxDepth = 4;
// Transport: 16-byte cp.async per lane with cp.async.mbarrier.arrive. (H200 run 3: faster than
// one cp.async.bulk per row slice in every row, convrotint4 layer 26.4 vs 29.7 us at M = 1, 34.7
// vs 41.4 at M = 16, the same bits; the bulk transport is deleted, as are the fused rotation
// prologue (run 2: ~3 us slower than rotate kernel + ring) and the 8-row tiles at M > 8.)
// M == 1 takes the dp4a instances (false: mma.sync for every M).
constexpr bool kRingDot = true;

struct RingLayout {
  int depth = 0;       // slots per warp
  int slot_bytes = 0;  // rows x stride codes, then rows x 16 bytes of ratios (packed 4-bit)
  int act_stride = 0;  // bytes between activation rows in shared memory (window + 16)
  int win_slices = 0;  // K slices per activation window (all of K's unless they do not fit)
  int ring_off = 0;    // the warps' rings
  int64_t smem = 0;    // dynamic shared memory bytes
};

// ---- PTX: mbarrier and copies (sm_90; the wrappers are ptx.cuh's) ----
using ptx::cp_async16;
using ptx::cp_async_mbar_arrive_noinc;
using ptx::lds128;
using ptx::mbar_fence_init;
using ptx::mbar_init;
using ptx::mbar_try;

// Warp-uniform wait: true once every lane saw the phase complete (a completed phase stays
// visible until the slot is re-armed, which only this warp does); false after ~2^22 polls (a
// copy that never lands: the warp abandons its work instead of hanging or trapping, so the
// output is wrong and the harness says so).
__device__ __forceinline__ bool mbar_wait_warp(uint32_t bar, uint32_t parity) {
#pragma unroll 1
  for (uint32_t polls = 0; polls < (1u << 22); ++polls)
    if (__all_sync(0xffffffffu, mbar_try(bar, parity))) return true;
  return false;
}

// fold_code with the code already in fp32 (exact: |code| <= 8); the streaming kernel's rule.
__device__ __forceinline__ int32_t ring_fold(float code, float ratio) {
  const int32_t r = __float2int_rn(__fmul_rn(code, ratio));
  return max(-127, min(127, r));
}

// ptx::prmt (inline PTX): every selector nibble here is <= 7, where PTX prmt and lut_prmt agree.
using ptx::prmt;
// lut_word (linear_lut.h) with the selector arithmetic shared by the two halves of the word:
// the same selectors (every nibble <= 7, prmt reads the low 16 bits), 11 instructions per 8 codes.
__device__ __forceinline__ void ring_lut_word(uint32_t word, const uint32_t lut[4], uint32_t* b0,
                                              uint32_t* b1) {
  const uint32_t idx = word & 0x77777777u;
  const uint32_t pick = ((word >> 1) & 0x44444444u) | 0x32103210u;
  const uint32_t idx1 = idx >> 16, pick1 = pick >> 16;
  *b0 = prmt(prmt(lut[0], lut[1], idx), prmt(lut[2], lut[3], idx), pick);
  *b1 = prmt(prmt(lut[0], lut[1], idx1), prmt(lut[2], lut[3], idx1), pick1);
}

// DOT (M == 1, NT == 1): dp4a on the lane's own 32 columns instead of mma.sync (no operand
// shuffling, no idle mma rows); the 4 lanes of a weight row add their sums at the tile's end.
// HI (NT = 2, M > 8): the mma's A rows 8..15 are loaded. kRFp8: fp32 sums, never DOT.
template <int WF, int NT, bool DOT, bool WIN = false>
__global__ void __launch_bounds__(ring_warps(NT) * 32, 1)
    gemv_ring_kernel(DecodeParams p, RingLayout L) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool HI = NT == 2, FP8 = WF == kRFp8;
  static_assert(!(FP8 && DOT), "e4m3 has no dp4a form");
  using Acc = std::conditional_t<FP8, float, int32_t>;
  constexpr int W = ring_warps(NT), kThreads = W * 32, ROWS = 8 * NT;
  constexpr int KS = slice_cols(WF), J = KS / 128, RS = slot_row_stride(WF);
  __shared__ __align__(8) uint64_t bars[W * kMaxDepth];
  extern __shared__ __align__(128) uint8_t dsm[];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int64_t N = p.w.N, K = p.w.K;
  const int M = static_cast<int>(p.M);
  const int D = L.depth;
  // This CTA's rows [r0, r1): an even split, rounded to even starts (2-column output stores).
  const int64_t G = gridDim.x, b = blockIdx.x;
  const int64_t r0 = (b * N / G) & ~int64_t{1};
  const int64_t r1 = b + 1 == G ? N : (((b + 1) * N / G) & ~int64_t{1});
  const int tiles = static_cast<int>((r1 - r0 + ROWS - 1) / ROWS);
  const int slices = static_cast<int>(K / KS);
  // K split (session 34): where the CTA has at most half as many tiles as warps (few output
  // columns per CTA, e.g. a down projection K 13824 -> N 5120: 3-5 tiles for 8-16 warps), the
  // tile's slices are split over `parts` warps (warp = part · tiles + tile), whose sums meet in
  // shared memory after the loop; else each warp runs tiles warp, warp + W, ... over all of K.
  // Activation windows (session 34): where M rows of K codes do not fit beside the ring, the
  // CTA walks K in L.win_slices-slice windows, reloading the activations between them (every
  // warp then holds at most one tile: ring_layout); else one window of all K.
  const int SW = WIN ? L.win_slices : slices, nwin = WIN ? (slices + SW - 1) / SW : 1;
  const int last_len = slices - (nwin - 1) * SW;  // (the shortest window)
  const int parts = tiles > 0 && 2 * tiles <= W ? min(W / tiles, last_len) : 1;
  const int part = parts > 1 ? warp / tiles : 0;
  const int wtile = parts > 1 ? warp % tiles : warp;  // the warp's first tile
  // This warp's slices [b, e) of window w (its part of them).
  auto sub = [&](int w, int& sb, int& se) {
    const int w0 = w * SW, n = min(w0 + SW, slices) - w0;
    sb = w0 + part * n / parts;
    se = w0 + (part + 1) * n / parts;
  };
  int my_tiles = warp < tiles ? (tiles - 1 - warp) / W + 1 : 0;
  if (parts > 1) my_tiles = part < parts ? 1 : 0;
  int items = 0;
  for (int w = 0; w < nwin; ++w) {
    int sb, se;
    sub(w, sb, se);
    items += my_tiles * (se - sb);
  }
  const bool has_ratios = WF == kRPacked4 && p.w.ratios != nullptr;
  uint8_t* ring = dsm + L.ring_off + static_cast<size_t>(warp) * D * L.slot_bytes;
  const uint32_t bar0 = ptx::smem_u32(&bars[warp * kMaxDepth]);

  if (threadIdx.x < W * kMaxDepth) mbar_init(ptx::smem_u32(&bars[threadIdx.x]), 32u);
  mbar_fence_init();
  __syncthreads();

  // Requests the warp's next item (the tile at row it_n0, slice it_sl) into slot it_slot. Items
  // are requested in order, so the counters advance by one item per call (no divisions).
  int it_slot = 0, it_w = 0, it_sl, it_e;
  sub(0, it_sl, it_e);
  int64_t it_n0 = r0 + static_cast<int64_t>(wtile) * ROWS;
  auto issue = [&]() {
    const int rows = static_cast<int>(min(static_cast<int64_t>(ROWS), r1 - it_n0));
    uint8_t* slot = ring + it_slot * L.slot_bytes;
    const uint32_t bar = bar0 + 8u * it_slot;
    const uint8_t* src = p.w.codes + it_n0 * p.w.row_bytes + int64_t{it_sl} * kSliceBytes;
    for (int c = lane; c < rows * (kSliceBytes / 16); c += 32) {
      const int r = c / (kSliceBytes / 16), q = c % (kSliceBytes / 16);
      cp_async16(ptx::smem_u32(slot + r * RS + q * 16), src + r * p.w.row_bytes + q * 16);
    }
    if (has_ratios && lane < rows)
      cp_async16(ptx::smem_u32(slot + ROWS * RS + lane * 16),
                 p.w.ratios + (it_n0 + lane) * p.w.groups_per_row + it_sl * J);
    cp_async_mbar_arrive_noinc(bar);  // one arrival per lane once its copies landed (32 per phase)
    if (++it_slot == D) it_slot = 0;
    if (++it_sl == it_e) {  // the next window, or the next tile after the last window
      if (++it_w == nwin) {
        it_w = 0;
        it_n0 += static_cast<int64_t>(W) * ROWS;
      }
      sub(it_w, it_sl, it_e);
    }
  };
  const int pre = min(D, items);
  for (int i = 0; i < pre; ++i) issue();

  // The activations may come from the preceding kernel (programmatic dependent launch).
  ptx::griddep_wait();
  uint8_t* act = dsm;
  const Epilogue ep = p.ep;
  // Window w's activation columns into shared memory (then a CTA barrier).
  auto load_window = [&](int w) {
    const int64_t c0 = int64_t{w} * SW * KS;
    const int per_row = (min((w + 1) * SW, slices) - w * SW) * KS / 16;
    for (int idx = threadIdx.x; idx < M * per_row; idx += kThreads) {
      const int m = idx / per_row, c = idx - m * per_row;
      // Coherent loads: written by the grid this one may have overlapped.
      const uint4 v = *reinterpret_cast<const uint4*>(p.a + m * p.lda + c0 + c * 16);
      *reinterpret_cast<uint4*>(act + m * L.act_stride + c * 16) = v;
    }
    __syncthreads();
  };

  // Constant tables: comfy's sign extension; packed 4-bit without ratios, c = u - 7.
  uint32_t lut_c[4] = {0u, 0u, 0u, 0u};
  if constexpr (WF == kRComfy) {
    comfy_lut(lut_c);
  } else if constexpr (WF == kRPacked4) {
#pragma unroll
    for (int t = 0; t < 4; ++t) lut_c[t] = pack4(4 * t - 7, 4 * t - 6, 4 * t - 5, 4 * t - 4);
  }
  // This lane's 4 entries u = 4 tid4 + e of a group table hold the codes c = u - 7.
  float cf[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) cf[e] = static_cast<float>(4 * tid4 + e - 7);

  // Activation rows of the mma's A rows gid / gid + 8. Rows >= M load row M - 1 instead of
  // zeros: they only feed output rows >= M, which are never stored (no branch, no zeroing).
  // Without HI (M <= 8) the upper rows are constant zeros (no loads, no registers).
  // DOT (M == 1): every lane reads row 0.
  const uint8_t* a_lo = act + (DOT ? 0 : min(gid, M - 1)) * L.act_stride;
  const uint8_t* a_hi = act + min(gid + 8, M - 1) * L.act_stride;
  const bool out_even = (p.ldo % 2) == 0 && (reinterpret_cast<uintptr_t>(p.out) % 4) == 0;

  // Two accumulator sets (even / odd chunks): two independent mma chains per n8 tile instead of
  // one chain of 4 J mma per item. Integer sums: the same total in any order (fp8: the sets are
  // added into `tot` after every item, below).
  Acc acc[2][NT][4];
#pragma unroll
  for (int u = 0; u < 2; ++u)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[u][t][r] = 0;
  // fp8 (session 34): the tensor cores' fp32 sums of e4m3 products keep fewer bits than fp32
  // (K 13824: 1.4 % off in a harness case), so each item's sums (a chain of 4 mma per set) are
  // added into `tot` with the FADD's full precision and the mma chains start again from 0.
  float tot[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) tot[t][r] = 0.f;

  // Consumer state: the slot and its phase parity, the tile's rows.
  int s = 0;
  uint32_t parity = 0;
  int64_t n0 = r0 + static_cast<int64_t>(wtile) * ROWS;
  // The tile's outputs once its columns are complete (acc holds its whole sums).
  auto finish_tile = [&]() {
    const int rows = static_cast<int>(min(static_cast<int64_t>(ROWS), r1 - n0));
    if constexpr (DOT) {
      // Lane (gid, tid4) holds row gid's sum over its columns: add the 4 lanes of the row.
      int32_t sum = acc[0][0][0] + acc[1][0][0];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      acc[0][0][0] = acc[1][0][0] = 0;
      if (tid4 == 0 && gid < rows) {
        const int64_t col = n0 + gid;
        if (p.acc_out) {
          p.acc_out[col] = sum;
        } else {
          const float v = apply_epilogue(ep, static_cast<float>(sum), 0, col);
          store2(p.out, p.out_dtype, col, v, 0.f, false, false);
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = gid + 8 * h;
          const int lc = nt * 8 + 2 * tid4;
          const Acc sum0 = acc[0][nt][2 * h] + acc[1][nt][2 * h];
          const Acc sum1 = acc[0][nt][2 * h + 1] + acc[1][nt][2 * h + 1];
          if (row < M && lc < rows) {
            const int64_t col = n0 + lc;
            const bool has1 = lc + 1 < rows;
            if (!FP8 && p.acc_out) {  // (fp8: no acc_out, decode_ring_applies)
              p.acc_out[row * p.ldo + col] = static_cast<int32_t>(sum0);
              if (has1) p.acc_out[row * p.ldo + col + 1] = static_cast<int32_t>(sum1);
            } else {
              const float v0 = apply_epilogue(ep, static_cast<float>(sum0), row, col);
              const float v1 =
                  has1 ? apply_epilogue(ep, static_cast<float>(sum1), row, col + 1) : 0.f;
              store2(p.out, p.out_dtype, row * p.ldo + col, v0, v1, has1, has1 && out_even);
            }
          }
#pragma unroll
          for (int u = 0; u < 2; ++u) acc[u][nt][2 * h] = acc[u][nt][2 * h + 1] = Acc(0);
        }
      }
    }
  };
  // One item: the weights of slot s against the activation columns from k0 (of the window);
  // false when its copy never lands (mbar_wait_warp: the warp abandons its work, so the output
  // is wrong and the harness says so).
  auto step = [&](int i, int k0) {
    if (!mbar_wait_warp(bar0 + 8u * s, parity)) return false;
    const uint8_t* slot = ring + s * L.slot_bytes;
    const float* sratio = reinterpret_cast<const float*>(slot + ROWS * RS);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = tid4 + 4 * j;  // 32-column chunk of the slice; group j of the slice
      const int kc = k0 + 32 * c;
      const uint4 lo0 = lds128(a_lo + kc), lo1 = lds128(a_lo + kc + 16);
      uint4 hi0 = make_uint4(0, 0, 0, 0), hi1 = hi0;
      if constexpr (HI) {
        hi0 = lds128(a_hi + kc);
        hi1 = lds128(a_hi + kc + 16);
      }
      const uint32_t lo_w[8] = {lo0.x, lo0.y, lo0.z, lo0.w, lo1.x, lo1.y, lo1.z, lo1.w};
      const uint32_t hi_w[8] = {hi0.x, hi0.y, hi0.z, hi0.w, hi1.x, hi1.y, hi1.z, hi1.w};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int r = gid + 8 * nt;  // weight row of the tile this lane feeds (mma column gid)
        const uint8_t* wrow = slot + r * RS;
        uint32_t wv[8];
        if constexpr (byte_codes(WF)) {
          const uint4 u0 = lds128(wrow + c * 32), u1 = lds128(wrow + c * 32 + 16);
          wv[0] = u0.x, wv[1] = u0.y, wv[2] = u0.z, wv[3] = u0.w;
          wv[4] = u1.x, wv[5] = u1.y, wv[6] = u1.z, wv[7] = u1.w;
        } else {
          const uint4 u0 = lds128(wrow + c * 16);
          wv[0] = u0.x, wv[1] = u0.y, wv[2] = u0.z, wv[3] = u0.w;
        }
        uint32_t lut[4] = {lut_c[0], lut_c[1], lut_c[2], lut_c[3]};
        if (WF == kRPacked4 && has_ratios) {  // warp-uniform
          const float ratio = sratio[r * 4 + j];
          const uint32_t own = pack4(ring_fold(cf[0], ratio), ring_fold(cf[1], ratio),
                                     ring_fold(cf[2], ratio), ring_fold(cf[3], ratio));
#pragma unroll
          for (int t = 0; t < 4; ++t) lut[t] = __shfl_sync(0xffffffffu, own, t, 4);  // row's lanes
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // codes 8q .. 8q + 7 of the lane's 32
          uint32_t b0, b1;
          if constexpr (byte_codes(WF)) {
            b0 = wv[2 * q], b1 = wv[2 * q + 1];
          } else {
            ring_lut_word(wv[q], lut, &b0, &b1);
          }
          if constexpr (DOT) {
            acc[j & 1][nt][0] =
                __dp4a(static_cast<int>(b0), static_cast<int>(lo_w[2 * q]), acc[j & 1][nt][0]);
            acc[j & 1][nt][0] =
                __dp4a(static_cast<int>(b1), static_cast<int>(lo_w[2 * q + 1]), acc[j & 1][nt][0]);
          } else {
            const uint32_t a[4] = {lo_w[2 * q], hi_w[2 * q], lo_w[2 * q + 1], hi_w[2 * q + 1]};
            if constexpr (FP8)
              ptx::mma_e4m3(acc[j & 1][nt], a, b0, b1);
            else
              mma_s8(acc[j & 1][nt], a, b0, b1);
          }
        }
      }
    }
    if constexpr (FP8) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          tot[nt][r] += acc[0][nt][r] + acc[1][nt][r];
          acc[0][nt][r] = acc[1][nt][r] = 0.f;
        }
    }
    __syncwarp();  // every lane has read slot s: refill it (issue() takes slot s next)
    if (i + D < items) issue();
    if (++s == D) {
      s = 0;
      parity ^= 1u;
    }
    return true;
  };
  // The tile's sums complete: fp8's back in acc[0] (acc[1] is 0).
  auto settle = [&]() {
    if constexpr (FP8) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          acc[0][nt][r] = tot[nt][r];
          tot[nt][r] = 0.f;
        }
    }
  };
  if constexpr (!WIN) {  // one window: the warp's items tile by tile
    load_window(0);
    int sb, se;
    sub(0, sb, se);
    int sl = sb;
    for (int i = 0; i < items; ++i) {
      if (!step(i, sl * KS)) return;
      if (++sl != se) continue;
      sl = sb;
      settle();
      if (parts > 1) break;  // (one tile per warp: the sums meet below)
      finish_tile();
      n0 += static_cast<int64_t>(W) * ROWS;
    }
  } else {  // windows: one tile per warp (ring_layout), its sums carried from window to window
    bool lost = false;  // (the warp still passes the CTA's barriers)
    int i = 0;
    for (int w = 0; w < nwin; ++w) {
      load_window(w);
      int sb, se;
      sub(w, sb, se);
      for (int sl = sb; my_tiles > 0 && sl < se && !lost; ++sl, ++i)
        lost = !step(i, (sl - w * SW) * KS);
      if (w + 1 < nwin) __syncthreads();  // every warp is done with the window's activations
    }
    if (lost) my_tiles = 0;  // (stores nothing; a part still reaches the barrier below)
    settle();
    if (parts == 1 && my_tiles > 0) finish_tile();
  }
  if (parts > 1) {  // (CTA-uniform) parts 1.. leave their sums in their own ring's first slot
    // (every copy into it has landed and been read), part 0 adds them and stores the tile.
    Acc* own = reinterpret_cast<Acc*>(ring);
    if (part > 0 && my_tiles > 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) own[(nt * 4 + r) * 32 + lane] = acc[0][nt][r] + acc[1][nt][r];
    }
    __syncthreads();
    if (part != 0 || my_tiles == 0) return;
    for (int q = 1; q < parts; ++q) {
      const Acc* other = reinterpret_cast<const Acc*>(
          dsm + L.ring_off + static_cast<size_t>(q * tiles + warp) * D * L.slot_bytes);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[0][nt][r] += other[(nt * 4 + r) * 32 + lane];
    }
    finish_tile();
  }
#else
  __trap();  // launched on sm_90 only (decode_ring_applies)
#endif
}

int ring_kind(const DecodeParams& d) {
  const PackedWeightRef& w = d.w;
  if (d.e4m3) return kRFp8;
  if (w.format == WeightFormat::comfy_int4) return kRComfy;
  if (w.format == WeightFormat::int8) return kRInt8;
  return kRPacked4;
}

// Tile height in n8 mma tiles: 16 rows for M > 8, else 8.
int ring_nt(const DecodeParams& d) { return d.M > 8 ? 2 : 1; }

// The layout for M rows, or depth 0 when nothing fits. Session 34: for e4m3 codes, where the
// activations of all K do not fit beside a ring of 2 slots, windows of K (the fewest that fit),
// provided every warp of the grid holds at most one tile (the windows carry one tile's sums per
// warp). (H200, 16 x 13824 -> 5120 / 16 x 14336 -> 4096: fp8 0.0582 -> 0.0450 / 0.0516 ->
// 0.0344 ms against two launches of 8 rows; the integer formats keep the streaming kernel there:
// windows were +14 % / -5 % for int8, +6 % / +5 % int4, -4 % / -1 % comfy.)
RingLayout ring_layout(const DecodeParams& d, int max_smem) {
  RingLayout L;
  const int wf = ring_kind(d);
  const int nt = ring_nt(d), W = ring_warps(nt), rows = 8 * nt;
  const bool ratios = wf == kRPacked4 && d.w.ratios != nullptr;
  L.slot_bytes = rows * slot_row_stride(wf) + (ratios ? rows * 16 : 0);
  const int slices = static_cast<int>(d.w.K / slice_cols(wf));
  const int64_t grid = std::min<int64_t>(multiprocessor_count(), (d.w.N + rows - 1) / rows);
  const int64_t most_rows = (d.w.N + grid - 1) / grid + 2;  // (a CTA's rows, starts rounded)
  const bool one_tile = (most_rows + rows - 1) / rows <= W;
  for (int nwin = 1; nwin <= slices && (nwin == 1 || (one_tile && d.e4m3)); ++nwin) {
    L.win_slices = (slices + nwin - 1) / nwin;
    if (nwin > 1 && (slices + L.win_slices - 1) / L.win_slices != nwin) continue;
    L.act_stride = L.win_slices * slice_cols(wf) + 16;
    const int64_t off = (d.M * L.act_stride + 127) / 128 * 128;
    L.ring_off = static_cast<int>(off);
    for (int depth = kMaxDepth; depth >= 2; --depth) {
      const int64_t total = off + static_cast<int64_t>(W) * depth * L.slot_bytes;
      if (total <= max_smem) {
        L.depth = depth;
        L.smem = total;
        return L;
      }
    }
  }
  L.depth = 0;
  return L;
}

struct DeviceInfo {
  bool sm90 = false;
  int max_smem = 0;  // opt-in dynamic shared memory per block, less room for the static arrays
};
DeviceInfo device_info() {
  static std::mutex mu;
  static std::map<int, DeviceInfo> cache;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "decode_ring", "device");
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  DeviceInfo info;
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "decode_ring", "shared memory");
  // sm_90 code on an sm_90 GPU (an older build, or older PTX JIT-compiled for this GPU, traps in
  // the kernel body).
  const CodeArch code = code_arch();
  info.sm90 = code.sm / 10 == 9 && code.ptx >= 90;
  info.max_smem = optin - 1024;
  cache.emplace(dev, info);
  return info;
}

template <int WF, int NT>
void launch_ring(const DecodeParams& d, const RingLayout& L, cudaStream_t stream) {
  auto go = [&](auto kernel) {
    set_kernel_smem(kernel, static_cast<int>(L.smem), "decode_ring", "shared memory");
    const int64_t tiles = (d.w.N + 8 * NT - 1) / (8 * NT);
    const int grid = static_cast<int>(std::min<int64_t>(multiprocessor_count(), tiles));
    launch_maybe_pdl(true, kernel, dim3(static_cast<unsigned>(grid)),
                     dim3(static_cast<unsigned>(ring_warps(NT) * 32)), static_cast<size_t>(L.smem),
                     stream, d, L);
  };
  if constexpr (NT == 1 && WF != kRFp8) {
    if (d.M == 1 && kRingDot) {  // dp4a instances
      go(gemv_ring_kernel<WF, 1, true>);
      return;
    }
  }
  if constexpr (WF == kRFp8) {  // activation windows (ring_layout: e4m3 only)
    if (L.win_slices < d.w.K / slice_cols(WF)) {
      go(gemv_ring_kernel<WF, NT, false, true>);
      return;
    }
  }
  go(gemv_ring_kernel<WF, NT, false>);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool decode_ring_applies(const DecodeParams& d) {
  const PackedWeightRef& w = d.w;
  if (d.M < 1 || d.M > 16 || w.N < 1) return false;
  if (d.e4m3) {  // one byte per weight, fp32 sums: no raw integer output
    if (w.format != WeightFormat::int8 || w.K % slice_cols(kRFp8) != 0 || d.acc_out) return false;
  } else if (w.format == WeightFormat::int8) {
    if (w.K % slice_cols(kRInt8) != 0) return false;
  } else if (w.format == WeightFormat::comfy_int4) {
    if (w.K % slice_cols(kRComfy) != 0) return false;
  } else if (w.format == WeightFormat::packed && w.bits == 4) {
    if (w.K % slice_cols(kRPacked4) != 0) return false;
    if (w.ratios && (w.group != 128 || w.groups_per_row != w.K / 128 || !aligned16(w.ratios)))
      return false;
  } else {
    return false;
  }
  if (w.row_bytes % 16 != 0 || !aligned16(w.codes)) return false;
  if (d.x || !d.a || d.lda % 16 != 0 || !aligned16(d.a)) return false;  // codes in only
  const DeviceInfo info = device_info();
  if (!info.sm90) return false;
  return ring_layout(d, info.max_smem).depth >= 2;
}

void decode_ring(const DecodeParams& d, cudaStream_t stream) {
  const RingLayout L = ring_layout(d, device_info().max_smem);  // depth >= 2: applies() checked
  auto by_kind = [&](auto wf_tag) {
    constexpr int WF = decltype(wf_tag)::value;
    if (ring_nt(d) == 2) {
      launch_ring<WF, 2>(d, L, stream);
    } else {
      launch_ring<WF, 1>(d, L, stream);
    }
  };
  switch (ring_kind(d)) {
    case kRFp8:
      by_kind(std::integral_constant<int, kRFp8>{});
      break;
    case kRComfy:
      by_kind(std::integral_constant<int, kRComfy>{});
      break;
    case kRInt8:
      by_kind(std::integral_constant<int, kRInt8>{});
      break;
    default:
      by_kind(std::integral_constant<int, kRPacked4>{});
  }
  check_launch("decode_ring");
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
