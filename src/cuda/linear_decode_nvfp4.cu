// NVFP4 (convrot4) decode GEMV on sm_90 (session 17): out(M, N) = pts · X16 · W(N, K)ᵀ + bias for
// M <= 16, reading the packed e2m1 weight codes and their e4m3 block scales directly instead of
// dequantizing the whole weight to 16 bits per call (the prefill path's cost at any M: 141 MB
// written and read again at 5120 -> 13824).
//
// One CTA of kWarps warps per 16-row weight tile; the warps split the tile's K into contiguous
// runs of 64-column steps. Per step a lane (gid, tid4) owns the 16 columns of NVFP4 block
// 4 step + tid4 of weight rows gid and gid + 8 (8 code bytes and one scale each): it turns them
// into f16 values four codes at a time (e2m1x4_f16x2, session 18: 12-13 % faster than two at a
// time), scales them by the block scale (e2m1 x e4m3 is exact in f16) and feeds four mma.sync
// m16n8k16 (f16 in, fp32 sums), the weights as A (16 rows), the activation rows (X16: the rotation's NVFP4 codes
// dequantized to f16, exact) as B (n8 tiles of tokens). An mma's 16 k slots are the lanes' own
// columns (lane tid4 gives slots 2 tid4, 2 tid4 + 1, 2 tid4 + 8, 2 tid4 + 9 of A and B alike),
// so each sums 16 distinct columns whatever block they come from. The warps' sums meet in shared
// memory, added in warp order (deterministic), then the epilogue (x pts, + bias), apply_epilogue's
// order. Not bit-exact by construction: the tensor cores' fp32 sums (the layer's NVFP4 tolerance).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "lowbit/dtype.h"
#include "src/core/check.h"
#include "src/cuda/common.cuh"
#include "src/cuda/gemm_common.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_lut.h"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

constexpr int kWarps = 4;
constexpr int kStepCols = 64;  // columns per step: one NVFP4 block per lane quad

__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, __half2 s) {
  __half2 h = *reinterpret_cast<__half2*>(&a);
  h = __hmul2(h, s);
  return *reinterpret_cast<uint32_t*>(&h);
}

// 8 code bytes through the read-only path (a plain __ldg the compiler may schedule; the steps in
// flight come from the kernel's register ring).
__device__ __forceinline__ uint2 ldg_nc8(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint2*>(p));
}

// e4m3 -> f16x2 {v, v} (exact; F2FP on sm_89+).
__device__ __forceinline__ __half2 e4m3_half2(uint8_t c) {
  const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E4M3));
  return __half2half2(h);
}

// mma j of a step (columns 4 j .. 4 j + 3 of the lane's 16, k slots 2 tid4 .. of A and B alike):
// the weights' fragment `a` against each n8 token tile's activation pairs 2 j and 2 j + 1.
template <int NT>
__device__ __forceinline__ void mma_tokens(float (&acc)[NT][4], const uint32_t (&a)[4],
                                           const uint4 (&x)[NT][2], int j) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint32_t xw[8] = {x[nt][0].x, x[nt][0].y, x[nt][0].z, x[nt][0].w,
                            x[nt][1].x, x[nt][1].y, x[nt][1].z, x[nt][1].w};
    ptx::mma_f16(acc[nt], a, xw[2 * j], xw[2 * j + 1]);
  }
}

// One 64-column step of a lane: c0 / c1 the 8 code bytes of weight rows gid / gid + 8, sc0 / sc1
// their block scales, x the lane's 16 activation values of each n8 token tile. Four codes at a
// time to f16 (one 16-entry lookup), scaled (e2m1 x e4m3 is exact in f16), then four mma.sync.
template <int NT>
__device__ __forceinline__ void step_mma(float (&acc)[NT][4], uint2 c0, uint2 c1, __half2 sc0,
                                         __half2 sc1, const uint4 (&x)[NT][2]) {
  const uint32_t cw0[2] = {c0.x, c0.y}, cw1[2] = {c1.x, c1.y};
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // columns 4 j .. 4 j + 3 of the lane's 16
    // bytes 2 j (columns 4 j, 4 j + 1) and 2 j + 1 (4 j + 2, 4 j + 3) of each row's 8
    const uint32_t p0 = cw0[j >> 1] >> (16 * (j & 1)), p1 = cw1[j >> 1] >> (16 * (j & 1));
    uint32_t h0a, h0b, h1a, h1b;  // rows gid / gid + 8: columns 4 j, 4 j + 1 / 4 j + 2, 4 j + 3
    e2m1x4_f16x2(p0, &h0a, &h0b);
    e2m1x4_f16x2(p1, &h1a, &h1b);
    const uint32_t a[4] = {hmul2_bits(h0a, sc0), hmul2_bits(h1a, sc1), hmul2_bits(h0b, sc0),
                           hmul2_bits(h1b, sc1)};
    mma_tokens<NT>(acc, a, x, j);
  }
}

// step_mma with the codes converted through e4m3 (session 19, DecodeTilesTuning::nvfp4_gemv_cvt,
// the default: H200 23.3 / 25.3 / 31.9 us at M 1 / 8 / 16 x 5120 -> 13824 against the lookup's
// 26.5 / 27.7 / 32.6, the same bits; 100 instead of 122 SASS instructions per step):
// e2m1x8_e4m3 (7 integer ops per 8 codes) and one cvt per f16x2 pair give the codes x 2^-6;
// sc0 / sc1 are the block scales x 64 (exact in f16: <= 448 x 64), so each product is the same
// exact f16 as step_mma's. The pairs are columns (0, 2), (4, 6), (1, 3), (5, 7) of each 8: x holds
// the activation columns in that order (the rotate kernel's permuted x16).
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t two_bytes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | static_cast<uint32_t>(h.y) << 16;
}
template <int NT>
__device__ __forceinline__ void step_mma_cvt(float (&acc)[NT][4], uint2 c0, uint2 c1,
                                             __half2 sc0, __half2 sc1, const uint4 (&x)[NT][2]) {
  const uint32_t cw0[2] = {c0.x, c0.y}, cw1[2] = {c1.x, c1.y};
#pragma unroll
  for (int w = 0; w < 2; ++w) {  // the lane's columns 8 w .. 8 w + 7
    uint32_t e0, o0, e1, o1;     // rows gid / gid + 8: even and odd columns as e4m3 bytes
    e2m1x8_e4m3(cw0[w], &e0, &o0);
    e2m1x8_e4m3(cw1[w], &e1, &o1);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // mma 2 w + h: the even (h 0) or odd (h 1) columns
      const uint32_t r0 = h ? o0 : e0, r1 = h ? o1 : e1;
      const uint32_t a[4] = {hmul2_bits(e4m3x2_f16x2(r0 & 0xffffu), sc0),
                             hmul2_bits(e4m3x2_f16x2(r1 & 0xffffu), sc1),
                             hmul2_bits(e4m3x2_f16x2(r0 >> 16), sc0),
                             hmul2_bits(e4m3x2_f16x2(r1 >> 16), sc1)};
      mma_tokens<NT>(acc, a, x, 2 * w + h);
    }
  }
}

// The CTA's end: each warp's C fragments (c0, c1 = weight row gid, tokens 2 tid4, 2 tid4 + 1;
// c2, c3 = row gid + 8) into `red`, the warps' sums added in warp order (deterministic), the
// epilogue (x pts, + bias: apply_epilogue's order) and the stores of the tile's 16 columns.
template <int NT>
__device__ __forceinline__ void finish_tile(const Nvfp4DecodeParams& p, const float (&acc)[NT][4],
                                            float (&red)[kWarps][16][16], int64_t n0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int M = static_cast<int>(p.M);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tok = 8 * nt + 2 * tid4 + (r & 1);
      if (tok < 16) red[warp][gid + 8 * (r >> 1)][tok] = acc[nt][r];
    }
  __syncthreads();
  ptx::griddep_launch_dependents();
  for (int i = threadIdx.x; i < 16 * M; i += kWarps * 32) {
    const int row = i / M, tok = i - row * M;
    const int64_t col = n0 + row;
    if (col >= p.N) continue;
    float v = red[0][row][tok];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = __fadd_rn(v, red[w][row][tok]);
    v = apply_epilogue(p.ep, v, tok, col);
    store2(p.out, p.out_dtype, tok * p.ldo + col, v, 0.f, false, false);
  }
}

// One 64-column step's operands of a lane: 8 code bytes and the block scale of weight rows gid
// and gid + 8, the 16 f16 activation values of its token rows.
template <int NT>
struct StepRegs {
  uint2 c0, c1;
  uint32_t sc;  // scale bytes of rows gid (bits 0-7) and gid + 8 (bits 8-15)
  uint4 x[NT][2];
};

// NT: n8 tiles of tokens (1: M <= 8, 2: M <= 16). DEPTH: steps whose loads are in flight ahead of
// the one being multiplied (a register ring; 1: load, then multiply).
template <int NT, int DEPTH>
__global__ void __launch_bounds__(kWarps * 32) gemv_nvfp4_kernel(Nvfp4DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  __shared__ float red[kWarps][16][16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int64_t N = p.N, K = p.K;
  const int M = static_cast<int>(p.M);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int steps = static_cast<int>(K / kStepCols);
  const int s_begin = warp * steps / kWarps, s_end = (warp + 1) * steps / kWarps;
  // Weight rows gid / gid + 8 (rows past N read row N - 1: their sums are never stored).
  const int64_t r0 = min(n0 + gid, N - 1), r1 = min(n0 + gid + 8, N - 1);
  const uint8_t* w0 = p.w_codes + r0 * (K / 2) + 8 * tid4;
  const uint8_t* w1 = p.w_codes + r1 * (K / 2) + 8 * tid4;
  const uint8_t* s0 = p.w_scales + r0 * (K / 16) + tid4;
  const uint8_t* s1 = p.w_scales + r1 * (K / 16) + tid4;
  // Token rows gid (+ 8) of the n8 tiles (rows >= M read row M - 1).
  const __half* xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    xr[nt] = reinterpret_cast<const __half*>(p.x16) + min(gid + 8 * nt, M - 1) * K + 16 * tid4;

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[nt][r] = 0.f;

  auto load = [&](int s, StepRegs<NT>& q) {
    q.c0 = ldg_nc8(w0 + 32 * s);
    q.c1 = ldg_nc8(w1 + 32 * s);
    q.sc = static_cast<uint32_t>(__ldg(s0 + 4 * s)) | static_cast<uint32_t>(__ldg(s1 + 4 * s)) << 8;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint4* xp = reinterpret_cast<const uint4*>(xr[nt] + kStepCols * s);
      q.x[nt][0] = __ldg(xp);
      q.x[nt][1] = __ldg(xp + 1);
    }
  };
  auto multiply = [&](const StepRegs<NT>& q) {
    step_mma<NT>(acc, q.c0, q.c1, e4m3_half2(static_cast<uint8_t>(q.sc & 0xffu)),
                 e4m3_half2(static_cast<uint8_t>(q.sc >> 8)), q.x);
  };

  // The activations may come from the preceding kernels (programmatic dependent launch): the
  // weight bytes do not.
  ptx::griddep_wait();
  StepRegs<NT> ring[DEPTH];
#pragma unroll
  for (int u = 0; u < DEPTH; ++u)
    if (s_begin + u < s_end) load(s_begin + u, ring[u]);
  for (int s = s_begin; s < s_end; s += DEPTH) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      if (s + u < s_end) {
        multiply(ring[u]);
        if (s + u + DEPTH < s_end) load(s + u + DEPTH, ring[u]);
      }
    }
  }
  finish_tile<NT>(p, acc, red, n0);
#else
  __trap();  // launched on sm_89+ only (decode_nvfp4_applies)
#endif
}

// A ring slot: one step of a 16-row tile, code bytes row-major (32 per row), then the rows' 4
// block scales each.
constexpr int kSlotCodes = 16 * 32;
constexpr int kSlotScales = 16 * 4;
constexpr int kSlot = kSlotCodes + kSlotScales;

// Session 18: the same sums with each warp's weight bytes streamed by cp.async into a ring of
// DEPTH shared-memory slots of its own (16 rows x 32 code bytes + 16 rows x 4 scale bytes a
// slot): the loads hold no registers (45 / 56 registers at NT 1 / 2 against 118 for the register
// ring of 4), so DEPTH steps are in flight and the first ones are requested before
// griddepcontrol.wait. Nsight Compute of the register ring (session 18, 1 x 5120 -> 13824): 3.25
// warps per scheduler, 47 % of the stalls on L1TEX scoreboards, DRAM at 25 %, 1.64 waves. H200
// (session 19, x 5120 -> 13824, M 1 / 8 / 16): 4 slots 35.8 / 36.7 / 39.9 us, 8 slots 38.8 /
// 41.7 / 47.9, the register ring (depth 4 / 1) 39.1 / 40.1 / 44.0; two 16-row tiles per CTA
// sharing the activation loads 42.2 / 44.9 / 50.3 (deleted).
// Session 19: the step loop unrolled by DEPTH (compile-time slots) and the copies predicated
// instead of branched: 122-145 instead of 167 SASS instructions per step (Nsight Compute of the
// rolled loop: issue slots 53 % busy, 12.3 M warp instructions at M 1 — the kernel is issue-bound
// more than memory-bound, DRAM 27 %); the layer 29.6 / 30.6 / 34.4 -> 26.3 / 27.5 / 32.6 us.
// XAHEAD: the lane's activation values of step s + 1 are loaded while step s multiplies (0, the
// default: at the step; measured faster once unrolled, DecodeTilesTuning::nvfp4_gemv_x_ahead).
// CVT: step_mma_cvt (the codes through e4m3; x16 permuted) instead of step_mma.
// TILES (session 20, with CVT): 16-row weight tiles per CTA, each warp multiplying the same step's
// activation values against every tile (a slot holds the step of each tile), so that the
// activation rows are read from L2 once per TILES tiles (at M 16 a warp-step reads 2 KB of them
// against 576 weight bytes per tile).
template <int NT, int DEPTH, int XAHEAD, int CVT = 0, int TILES = 1>
__global__ void __launch_bounds__(kWarps * 32) gemv_nvfp4_smem_kernel(Nvfp4DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  static_assert(TILES == 1 || (CVT && !XAHEAD), "tiles: the e4m3 form, activations at the step");
  __shared__ __align__(16) uint8_t ring[kWarps][DEPTH][TILES * kSlot];
  __shared__ float red[kWarps][16][16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int64_t N = p.N, K = p.K;
  const int M = static_cast<int>(p.M);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16 * TILES;
  const int steps = static_cast<int>(K / kStepCols);
  const int s_begin = warp * steps / kWarps, s_end = (warp + 1) * steps / kWarps;

  // Copy roles: lane L brings 16 code bytes of row L / 2 (half L % 2 of the step's 32) and, for
  // L < 16, the 4 scale bytes of row L. Rows past N read row N - 1 (their sums are never stored).
  const int nsteps = s_end - s_begin;
  const uint8_t* csrc[TILES];
  const uint8_t* ssrc[TILES];
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    csrc[t] = p.w_codes + min(n0 + 16 * t + (lane >> 1), N - 1) * (K / 2) + 16 * (lane & 1) +
              32 * s_begin;
    ssrc[t] = p.w_scales + min(n0 + 16 * t + (lane & 15), N - 1) * (K / 16) + 4 * s_begin;
  }
  const uint32_t ring0 = ptx::smem_u32(&ring[warp][0][0]);
  const uint32_t cdst = ring0 + 16 * lane, sdst = ring0 + kSlotCodes + 4 * (lane & 15);
  const bool scale_lane = lane < 16;
  // Step s into slot s % DEPTH (a compile-time slot inside the unrolled loop below): one commit
  // group per step, empty past the run (predicated copies, no branch).
  auto issue = [&](int s, int slot) {
    const bool on = s < nsteps;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      const uint32_t at = (slot * TILES + t) * kSlot;
      ptx::cp_async_if<16>(cdst + at, csrc[t] + 32 * s, on);
      ptx::cp_async_if<4>(sdst + at, ssrc[t] + 4 * s, on && scale_lane);
    }
    ptx::cp_async_commit();
  };
  // The weight bytes do not depend on the preceding kernels (programmatic dependent launch): the
  // first DEPTH steps are requested before the wait, the activations only after it.
#pragma unroll
  for (int u = 0; u < DEPTH; ++u) issue(u, u);

  // Token rows gid (+ 8) of the n8 tiles (rows >= M read row M - 1).
  const __half* xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    xr[nt] = reinterpret_cast<const __half*>(p.x16) + min(gid + 8 * nt, M - 1) * K + 16 * tid4 +
             kStepCols * s_begin;
  auto load_x = [&](int s, uint4 (&x)[NT][2]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint4* xp = reinterpret_cast<const uint4*>(xr[nt] + kStepCols * s);
      x[nt][0] = __ldg(xp);
      x[nt][1] = __ldg(xp + 1);
    }
  };

  float acc[TILES][NT][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[t][nt][r] = 0.f;

  ptx::griddep_wait();
  // XAHEAD: two activation buffers, step s in xb[s % 2] (DEPTH is even: compile-time indices).
  uint4 xb[2][NT][2];
  if (XAHEAD && nsteps > 0) load_x(0, xb[0]);
  const uint8_t* ring_w = &ring[warp][0][0];
  for (int s0 = 0; s0 < nsteps; s0 += DEPTH) {
#pragma unroll
    for (int u = 0; u < DEPTH; ++u) {
      const int s = s0 + u;
      if (s >= nsteps) break;  // warp-uniform
      uint4 xs[NT][2];
      if (!XAHEAD) load_x(s, xs);
      if (XAHEAD && s + 1 < nsteps) load_x(s + 1, xb[(u + 1) & 1]);
      const uint4(&x)[NT][2] = XAHEAD ? xb[u & 1] : xs;
      ptx::cp_async_wait<DEPTH - 1>();  // this lane's copies of step s have landed
      __syncwarp();                     // ... and every other lane's
      uint2 c0[TILES], c1[TILES];
      __half2 sc0[TILES], sc1[TILES];
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        const uint8_t* sl = ring_w + (u * TILES + t) * kSlot;
        c0[t] = *reinterpret_cast<const uint2*>(sl + 32 * gid + 8 * tid4);
        c1[t] = *reinterpret_cast<const uint2*>(sl + 32 * (gid + 8) + 8 * tid4);
        sc0[t] = e4m3_half2(sl[kSlotCodes + 4 * gid + tid4]);
        sc1[t] = e4m3_half2(sl[kSlotCodes + 4 * (gid + 8) + tid4]);
      }
      __syncwarp();  // every lane has read the slot before it is refilled
      issue(s + DEPTH, u);

#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        if constexpr (CVT) {
          const __half2 k64 = __float2half2_rn(64.f);
          step_mma_cvt<NT>(acc[t], c0[t], c1[t], __hmul2(sc0[t], k64), __hmul2(sc1[t], k64), x);
        } else {
          step_mma<NT>(acc[t], c0[t], c1[t], sc0[t], sc1[t], x);
        }
      }
    }
  }
  ptx::cp_async_wait<0>();  // the run's trailing groups are empty; nothing is left in flight
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    if (t > 0) __syncthreads();  // the previous tile's sums are read out of `red`
    finish_tile<NT>(p, acc[t], red, n0 + 16 * t);
  }
#else
  __trap();  // launched on sm_89+ only (decode_nvfp4_applies)
#endif
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

bool decode_nvfp4_applies(const Nvfp4DecodeParams& p) {
  if (p.M < 1 || p.M > 16 || p.N < 1 || p.K < kStepCols || p.K % kStepCols) return false;
  if (!p.x16 || !p.w_codes || !p.w_scales || !p.out) return false;
  if (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16 && p.out_dtype != DType::f32)
    return false;
  // 8-byte code loads (row stride K / 2, a multiple of 32), 16-byte activation loads.
  if (!aligned(p.w_codes, 8) || !aligned(p.x16, 16)) return false;
  // The device runs the kernel: e4m3 conversions (compute capability 8.9+ and device code for it).
  return fp8_mma_missing().empty();
}

// The cp.async ring: 16-byte code copies, 4-byte scale copies (row stride K / 16, a multiple of
// 4); decode_nvfp4 takes the register ring where they do not align.
bool decode_nvfp4_ring_applies(const Nvfp4DecodeParams& p) {
  return aligned(p.w_codes, 16) && aligned(p.w_scales, 4);
}

void decode_nvfp4(const Nvfp4DecodeParams& p, cudaStream_t stream, int depth, int slots,
                  bool x_ahead, bool cvt, int tiles) {
  LOWBIT_CHECK(depth == 1 || depth == 4, "decode_nvfp4", "depth",
               "expected 1 or 4, got " + std::to_string(depth));
  LOWBIT_CHECK(slots == 0 || slots == 2 || slots == 4, "decode_nvfp4", "slots",
               "expected 0, 2 or 4, got " + std::to_string(slots));
  LOWBIT_CHECK(!cvt || (slots == 4 && !x_ahead && decode_nvfp4_ring_applies(p)), "decode_nvfp4",
               "cvt", "expected the 4-slot ring (activations at the step, 16-byte aligned codes)");
  LOWBIT_CHECK(tiles == 1 || (tiles == 2 && cvt), "decode_nvfp4", "tiles",
               "expected 1, or 2 with the e4m3 form, got " + std::to_string(tiles));
  const dim3 block(kWarps * 32);
  const dim3 grid(static_cast<unsigned>((p.N + 16 * tiles - 1) / (16 * tiles)));
  auto go = [&](auto kernel) { launch_maybe_pdl(true, kernel, grid, block, 0, stream, p); };
  const bool two = p.M > 8;
  if (tiles == 2) {
    two ? go(gemv_nvfp4_smem_kernel<2, 4, 0, 1, 2>) : go(gemv_nvfp4_smem_kernel<1, 4, 0, 1, 2>);
  } else if (cvt) {
    two ? go(gemv_nvfp4_smem_kernel<2, 4, 0, 1>) : go(gemv_nvfp4_smem_kernel<1, 4, 0, 1>);
  } else if (slots > 0 && decode_nvfp4_ring_applies(p)) {
    if (slots == 2) {
      if (x_ahead)
        two ? go(gemv_nvfp4_smem_kernel<2, 2, 1>) : go(gemv_nvfp4_smem_kernel<1, 2, 1>);
      else
        two ? go(gemv_nvfp4_smem_kernel<2, 2, 0>) : go(gemv_nvfp4_smem_kernel<1, 2, 0>);
    } else {
      if (x_ahead)
        two ? go(gemv_nvfp4_smem_kernel<2, 4, 1>) : go(gemv_nvfp4_smem_kernel<1, 4, 1>);
      else
        two ? go(gemv_nvfp4_smem_kernel<2, 4, 0>) : go(gemv_nvfp4_smem_kernel<1, 4, 0>);
    }
  } else if (two) {
    depth == 4 ? go(gemv_nvfp4_kernel<2, 4>) : go(gemv_nvfp4_kernel<2, 1>);
  } else {
    depth == 4 ? go(gemv_nvfp4_kernel<1, 4>) : go(gemv_nvfp4_kernel<1, 1>);
  }
  check_launch("decode_nvfp4");
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
