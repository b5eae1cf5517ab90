// Fused decode GEMM for M <= 16 (SPEC §3.5): reads the packed weight codes directly, unpacks them
// onto the int8 grid in registers (the same unpack16 as the prefill unpack kernel), accumulates
// int32 with mma.sync m16n8k32 (the M <= 16 activation rows are the mma's M = 16, rows >= M are
// zero) and applies the shared epilogue. Integer sums are exact, so the output is bit-identical to
// unpack + prefill GEMM.
//
// CTA: 8 warps, 16 output columns (2 n8 tiles); the warps split K in 64-column chunks and reduce
// their int32 partials through shared memory. Within a chunk lane (gid, tid4) owns columns
// [16 tid4, 16 tid4 + 16): both operands use the same K permutation inside the chunk (k-step s of
// the mma takes words 2s and 2s + 1 of the lane's 16 codes), which a sum does not see.
#include <algorithm>

#include "src/core/check.h"
#include "src/cuda/common.cuh"
#include "src/cuda/gemm_common.cuh"
#include "src/cuda/linear_decode_ring.cuh"
#include "src/cuda/linear_decode_tiles.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_lut.h"
#include "src/cuda/linear_rotate.cuh"
#include "src/cuda/linear_unpack.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kTiles = 2;  // n8 tiles per CTA (864 CTAs at N = 13824: ~3 waves, a short tail)
constexpr int kCols = kTiles * 8;
constexpr int kChunk = 64;
// The general kernel (codes from the rotate kernel). (Its fused mode, every CTA rotating the
// activation rows itself, was off since the register rotate kernel and is deleted.)
__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeParams p) {
  __shared__ int32_t red[kWarps][kTiles][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kCols;
  const int64_t K = p.w.K;
  const int8_t* a_codes = p.a;
  const int64_t lda = p.lda;
  const Epilogue ep = p.ep;
  const int64_t chunks = K / kChunk + (K % kChunk ? 1 : 0);

  int32_t acc[kTiles][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[t][r] = 0;

  const bool row_lo = gid < p.M, row_hi = gid + 8 < p.M;
  // kDepth chunks per step (c, c + kWarps, ...): their loads are issued before any is unpacked, so
  // each lane keeps kDepth times the bytes in flight.
  constexpr int kDepth = 4;
  for (int64_t c0 = warp; c0 < chunks; c0 += kDepth * kWarps) {
    uint4 alo[kDepth], ahi[kDepth];
    uint32_t b[kDepth][kTiles][4];
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int64_t k = (c0 + u * kWarps) * kChunk + tid4 * 16;
      const bool kin = k < K;  // K % 16 == 0: a lane's 16 columns are all in or all out
      alo[u] = make_uint4(0, 0, 0, 0);
      ahi[u] = make_uint4(0, 0, 0, 0);
      if (kin && row_lo) alo[u] = *reinterpret_cast<const uint4*>(a_codes + gid * lda + k);
      if (kin && row_hi)
        ahi[u] = *reinterpret_cast<const uint4*>(a_codes + (gid + 8) * lda + k);
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const int64_t n = n0 + t * 8 + gid;
        if (kin && n < p.w.N) {
          unpack16(p.w, n, k, b[u][t]);
        } else {
          b[u][t][0] = b[u][t][1] = b[u][t][2] = b[u][t][3] = 0;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const uint32_t a0[4] = {alo[u].x, ahi[u].x, alo[u].y, ahi[u].y};
      const uint32_t a1[4] = {alo[u].z, ahi[u].z, alo[u].w, ahi[u].w};
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        mma_s8(acc[t], a0, b[u][t][0], b[u][t][1]);
        mma_s8(acc[t], a1, b[u][t][2], b[u][t][3]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int r = 0; r < 4; ++r) red[warp][t][r][lane] = acc[t][r];
  __syncthreads();

  // Thread (t, lane) of the first 4 warps finishes tile t.
  if (warp >= kTiles) return;
  const int t = warp;
  int32_t sum[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    int32_t s = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w][t][r][lane];
    sum[r] = s;
  }
  const bool out_even = (p.ldo % 2) == 0 && (reinterpret_cast<uintptr_t>(p.out) % 4) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = gid + h * 8;
    const int64_t col = n0 + t * 8 + tid4 * 2;
    if (row >= p.M || col >= p.w.N) continue;
    const bool has1 = col + 1 < p.w.N;
    if (p.acc_out) {
      p.acc_out[row * p.ldo + col] = sum[2 * h];
      if (has1) p.acc_out[row * p.ldo + col + 1] = sum[2 * h + 1];
      continue;
    }
    const float v0 = apply_epilogue(ep, static_cast<float>(sum[2 * h]), row, col);
    const float v1 = has1 ? apply_epilogue(ep, static_cast<float>(sum[2 * h + 1]), row, col + 1)
                          : 0.f;
    store2(p.out, p.out_dtype, row * p.ldo + col, v0, v1, has1, has1 && out_even);
  }
}

// fold_code with the code already in fp32 (exact: |code| <= 8).
__device__ __forceinline__ int32_t fold_code_f(float code, float ratio) {
  const int32_t r = __float2int_rn(__fmul_rn(code, ratio));
  return max(-127, min(127, r));
}

// ---- Streaming kernel (packed 4-bit with group 128, comfy int4, int8; K % 128 == 0) ----
// The weight stream is the whole cost at M <= 16, so this kernel is built around it: each lane
// issues 16-byte loads of packed codes (kPieces per step in flight), and the 4 lanes of a weight
// row (tid4 = 0..3) read one 128-column group as 4 x 32 codes, 64 contiguous bytes: fully used
// sectors. The fold onto the int8 grid (SPEC §3.3: clamp(rint(code * ratio))) depends only on
// the 4-bit code and the group's ratio, so the lanes of a row build the group's 16-entry int8
// table together (4 entries each, 3 shuffles) and look codes up with byte permutes: no
// conversion per weight. Comfy int4's table is the constant sign extension. The int32 sums go
// through mma.sync m16n8k32 (rows >= M are zero); lane (gid, tid4) feeds the mma the 32 columns
// it loaded (k step j takes codes 8j .. 8j + 7), and the activation fragments use the same
// columns, so the sums are the prefill path's integer sums. The warps of a CTA split K; their
// partials meet in shared memory and the first warp applies the shared epilogue. int8 weights
// (convrot8) take the same kernel without the table: 32 bytes per lane and piece.
constexpr int kPieces = 4;
// false selects the general kernel for the 4-bit formats too.
constexpr bool kUseDecode4 = true;
// false: plain launches (no overlap with the rotate kernel before it).
constexpr bool kUsePdl = true;  // 128-column groups per lane and step (4 x 16 bytes in flight)


// The 4-bit table lookup (lut4, lut_word) lives in linear_lut.h, shared with a CPU unit test.
// Every prmt selector nibble there is <= 7: nvcc models __byte_perm as reading only the low 3
// bits of each selector nibble (CUDA math API) and drops arithmetic that feeds bit 3, so a mask
// built on prmt's sign-replicate mode came out as 0x80 instead of 0xff on the H200 (round 1).

// Weight kinds of decode4_kernel.
constexpr int kWComfy = 0, kWPacked4 = 1, kWInt8 = 2;
// 128-column pieces per step, and 16-byte loads per piece and lane (int8: 32 codes = 32 bytes).
__host__ __device__ constexpr int pieces_of(int wf) { return wf == kWInt8 ? 2 : kPieces; }
__host__ __device__ constexpr int units_of(int wf) { return wf == kWInt8 ? 2 : 1; }

// Resident grid: a CTA takes column tiles blockIdx.x, + gridDim.x, ... (8 weight rows each), and
// each warp runs its (tile, step) items as one software pipeline, so the next tile's first loads
// are in flight while the current tile is reduced and stored; the grid is what fits on the GPU
// at once (no partial last wave). Round 1 launched one CTA per tile (1728 CTAs of 2 steps per
// warp at N = 13824: ~3.3 waves, each CTA's loads ramping up and draining). false: that grid.
constexpr bool kResidentGrid = true;

// HI: rows 8..15 exist (M > 8); without it the mma's upper A rows are constant zeros and the
// kernel holds no registers for them.
template <int WF, bool HI>
__global__ void __launch_bounds__(256) decode4_kernel(DecodeParams p, int steps_per_warp) {
  constexpr int P = pieces_of(WF), U = units_of(WF);
  // Partials by tile parity: a warp writing tile k + 2's entries has passed tile k + 1's barrier,
  // which warp 0 reaches only after it has read tile k's.
  __shared__ int32_t red[2][8][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  const int64_t groups = p.w.K / 128;
  const int tiles = static_cast<int>((p.w.N + 7) / 8);
  // This CTA's tiles (blockIdx.x < tiles) and the warp's items: item f is step f % steps_per_warp
  // of the CTA's tile f / steps_per_warp (the same count for every warp: barriers line up).
  const int my_tiles =
      (tiles - 1 - static_cast<int>(blockIdx.x)) / static_cast<int>(gridDim.x) + 1;
  const int items = my_tiles * steps_per_warp;
  const bool row_lo = gid < p.M, row_hi = HI && gid + 8 < p.M;
  const int8_t* a_lo = p.a + (row_lo ? gid : 0) * p.lda;
  const int8_t* a_hi = p.a + (row_hi ? gid + 8 : 0) * p.lda;
  // This lane's 4 table entries u = 4 tid4 + e hold the codes c = u - 7 (packed) as floats.
  float cf[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) cf[e] = static_cast<float>(4 * tid4 + e - 7);

  int32_t acc[4] = {0, 0, 0, 0};
  // Item f's weights: P x U 16-byte loads + the groups' ratios (zeros / 1 past the end).
  auto load_item = [&](int f, uint4(&wq)[P * U], float(&ratio)[P]) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) +
                      static_cast<int64_t>(f / steps_per_warp) * gridDim.x;
    const int64_t n = t * 8 + gid;
    const bool n_in = f < items && n < p.w.N;
    const int64_t g0 = static_cast<int64_t>(warp + (f % steps_per_warp) * nwarps) * P;
    const uint8_t* wrow = p.w.codes + (n_in ? n : 0) * p.w.row_bytes;
    const float* ratios = (WF == kWPacked4 && p.w.ratios)
                              ? p.w.ratios + (n_in ? n : 0) * p.w.groups_per_row
                              : nullptr;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t g = g0 + i;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wq[i * U + u] = make_uint4(0, 0, 0, 0);
        if (n_in && g < groups)
          wq[i * U + u] = __ldg(
              reinterpret_cast<const uint4*>(wrow + g * (64 * U) + tid4 * (16 * U)) + u);
      }
      ratio[i] = (ratios && n_in && g < groups) ? __ldg(ratios + g) : 1.f;
    }
  };
  uint4 wq[P * U];
  float ratio[P];
  // The weights do not come from the previous kernel: the first item's loads are issued before
  // waiting for it (programmatic dependent launch: the rotate kernel writes the activations).
  load_item(0, wq, ratio);
  ptx::griddep_wait();
  for (int f = 0; f < items; ++f) {
    uint4 wn[P * U];
    float rn[P];
    load_item(f + 1, wn, rn);  // in flight during this item (the next tile's, at a tile's end)
    const int step = f % steps_per_warp;
    const int64_t g0 = static_cast<int64_t>(warp + step * nwarps) * P;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t g = g0 + i;
      if (g >= groups) break;  // warp-uniform
      uint32_t lut[4] = {0u, 0u, 0u, 0u};
      if constexpr (WF == kWComfy) {
        comfy_lut(lut);
      } else if constexpr (WF == kWPacked4) {
        uint32_t own;
        if (p.w.ratios) {
          own = pack4(fold_code_f(cf[0], ratio[i]), fold_code_f(cf[1], ratio[i]),
                      fold_code_f(cf[2], ratio[i]), fold_code_f(cf[3], ratio[i]));
        } else {
          own = pack4(4 * tid4 - 7, 4 * tid4 - 6, 4 * tid4 - 5, 4 * tid4 - 4);
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) lut[t] = __shfl_sync(0xffffffffu, own, (lane & ~3) | t);
      }
      // Activation columns of this piece: [128 g + 32 tid4, + 32), rows gid and gid + 8.
      const int64_t k = g * 128 + tid4 * 32;
      uint4 alo[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      uint4 ahi[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      // Coherent loads: the codes were written by the grid this one overlapped (PDL).
      if (row_lo) {
        alo[0] = reinterpret_cast<const uint4*>(a_lo + k)[0];
        alo[1] = reinterpret_cast<const uint4*>(a_lo + k)[1];
      }
      if (HI && row_hi) {
        ahi[0] = reinterpret_cast<const uint4*>(a_hi + k)[0];
        ahi[1] = reinterpret_cast<const uint4*>(a_hi + k)[1];
      }
      uint32_t wv[4 * U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wv[4 * u] = wq[i * U + u].x, wv[4 * u + 1] = wq[i * U + u].y;
        wv[4 * u + 2] = wq[i * U + u].z, wv[4 * u + 3] = wq[i * U + u].w;
      }
      const uint32_t lo_w[8] = {alo[0].x, alo[0].y, alo[0].z, alo[0].w,
                                alo[1].x, alo[1].y, alo[1].z, alo[1].w};
      const uint32_t hi_w[8] = {ahi[0].x, ahi[0].y, ahi[0].z, ahi[0].w,
                                ahi[1].x, ahi[1].y, ahi[1].z, ahi[1].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // codes 8j .. 8j + 7 of the lane's 32
        uint32_t b0, b1;
        if constexpr (WF == kWInt8) {
          b0 = wv[2 * j], b1 = wv[2 * j + 1];
        } else {  // 4-bit: word j holds the 8 codes
          lut_word(wv[j], lut, &b0, &b1);
        }
        const uint32_t a[4] = {lo_w[2 * j], hi_w[2 * j], lo_w[2 * j + 1], hi_w[2 * j + 1]};
        mma_s8(acc, a, b0, b1);
      }
    }
#pragma unroll
    for (int i = 0; i < P * U; ++i) wq[i] = wn[i];
#pragma unroll
    for (int i = 0; i < P; ++i) ratio[i] = rn[i];
    if (step != steps_per_warp - 1) continue;  // block-uniform

    // The tile's last step: the warps' partials meet in shared memory, warp 0 stores the tile.
    const int tl = f / steps_per_warp;
    const int buf = tl & 1;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      red[buf][warp][r][lane] = acc[r];
      acc[r] = 0;
    }
    __syncthreads();
    if (warp != 0) continue;
    const int64_t n0 =
        (static_cast<int64_t>(blockIdx.x) + static_cast<int64_t>(tl) * gridDim.x) * 8;
    int32_t sum[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      int32_t s = 0;
      for (int w = 0; w < nwarps; ++w) s += red[buf][w][r][lane];
      sum[r] = s;
    }
    const bool out_even = (p.ldo % 2) == 0 && (reinterpret_cast<uintptr_t>(p.out) % 4) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = gid + h * 8;
      const int64_t col = n0 + tid4 * 2;
      if (row >= p.M || col >= p.w.N) continue;
      const bool has1 = col + 1 < p.w.N;
      if (p.acc_out) {
        p.acc_out[row * p.ldo + col] = sum[2 * h];
        if (has1) p.acc_out[row * p.ldo + col + 1] = sum[2 * h + 1];
        continue;
      }
      const float v0 = apply_epilogue(p.ep, static_cast<float>(sum[2 * h]), row, col);
      const float v1 =
          has1 ? apply_epilogue(p.ep, static_cast<float>(sum[2 * h + 1]), row, col + 1) : 0.f;
      store2(p.out, p.out_dtype, row * p.ldo + col, v0, v1, has1, has1 && out_even);
    }
  }
}

// Whether decode4_kernel takes these weights (else the general kernel runs).
bool decode4_applies(const DecodeParams& p) {
  const PackedWeightRef& w = p.w;
  if (w.K % 128 != 0 || p.x || p.lda % 16 != 0 || w.row_bytes % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(p.a) % 16 != 0 || reinterpret_cast<uintptr_t>(w.codes) % 16 != 0)
    return false;
  if (w.format == WeightFormat::comfy_int4 || w.format == WeightFormat::int8) return true;
  return w.format == WeightFormat::packed && w.bits == 4 && (!w.ratios || w.group == 128);
}

// CTAs of `kernel` (an instance of decode4_kernel) with `warps` warps resident per SM (at least
// 1), cached per device, instance and warp count.
template <typename Kernel>
int resident_ctas(Kernel kernel, int warps) {
  return std::max(1, occupancy_per_sm(reinterpret_cast<const void*>(kernel), warps * 32, 0,
                                      "decode_gemv"));
}

void launch_decode4(const DecodeParams& p, cudaStream_t stream) {
  const int wf = p.w.format == WeightFormat::comfy_int4
                     ? kWComfy
                     : (p.w.format == WeightFormat::int8 ? kWInt8 : kWPacked4);
  const int64_t steps = ceil_div(p.w.K / 128, pieces_of(wf));
  const int64_t per_warp = ceil_div(steps, 8);
  const int warps = static_cast<int>(ceil_div(steps, per_warp));
  const int64_t tiles = ceil_div(p.w.N, 8);
  // Programmatic dependent launch: the kernel may start while the rotate kernel before it runs
  // (that kernel triggers at its start); it waits (griddepcontrol.wait) before reading p.a.
  const int pw = static_cast<int>(per_warp);
  auto go = [&](auto kernel) {
    int64_t grid = tiles;
    if (kResidentGrid && !p.one_tile_per_cta)
      grid = std::min<int64_t>(
          tiles, static_cast<int64_t>(multiprocessor_count()) * resident_ctas(kernel, warps));
    launch_maybe_pdl(kUsePdl, kernel, dim3(static_cast<unsigned>(grid)),
                     dim3(static_cast<unsigned>(warps * 32)), 0, stream, p, pw);
  };
  const bool hi = p.M > 8;
  if (wf == kWComfy) {
    hi ? go(decode4_kernel<kWComfy, true>) : go(decode4_kernel<kWComfy, false>);
  } else if (wf == kWInt8) {
    hi ? go(decode4_kernel<kWInt8, true>) : go(decode4_kernel<kWInt8, false>);
  } else {
    hi ? go(decode4_kernel<kWPacked4, true>) : go(decode4_kernel<kWPacked4, false>);
  }
}

}  // namespace

// Session 3: the ring kernel (linear_decode_ring.cu) is the default wherever it applies; false
// keeps the session-2 kernels below for every shape (they stay the fallback either way).
constexpr bool kUseRing = true;

void decode_gemv(const DecodeParams& p, cudaStream_t stream) {
  if (p.M == 0 || p.w.N == 0) return;
  if (p.e4m3) {  // e4m3 codes: the ring kernel only (the other kernels sum integers)
    LOWBIT_CHECK(decode_ring_applies(p), "decode_gemv", "weight",
                 "e4m3 codes: expected the ring kernel's arguments (sm_90, K a multiple of 256, "
                 "M <= 16, 16-byte aligned codes, no integer output)");
    decode_ring(p, stream);
    return;
  }
  // Session 4: the tiled kernel on the weight's device layout (p.tiles, 4-bit formats) first;
  // p.tiles = null (DecodeParams) selects the ring kernel below.
  if (!p.one_tile_per_cta && p.tiles && decode_tiles_applies(p)) {
    decode_tiles(p, stream);
    return;
  }
  // one_tile_per_cta asks for the streaming kernel's round-1 grid (an A/B bench row).
  if (kUseRing && !p.one_tile_per_cta && decode_ring_applies(p)) {
    decode_ring(p, stream);
    return;
  }
  decode_gemv_stream(p, stream);
}

void decode_gemv_stream(const DecodeParams& p, cudaStream_t stream) {
  if (p.M == 0 || p.w.N == 0) return;
  LOWBIT_CHECK(p.x == nullptr && p.a != nullptr, "decode_gemv", "activations",
               "expected activation codes (the streaming kernels have no fused rotation)");
  if (kUseDecode4 && decode4_applies(p)) {
    launch_decode4(p, stream);
  } else {
    decode_kernel<<<ceil_div(p.w.N, kCols), kThreads, 0, stream>>>(p);
  }
  check_launch("decode_gemv");
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
