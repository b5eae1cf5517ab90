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
//   - CTA b of G (one per SM) owns the whole tiles [b·T/G, (b+1)·T/G); each warp streams a
//     contiguous run of its CTA's items through a per-lane cp.async ring (4 slots, no registers
//     held by loads in flight, the first 3 requested before griddepcontrol.wait); the CTA's
//     warps split its items evenly, whatever K, and add their partial sums of a tile into shared
//     memory with integer atomics (exact in any order); one barrier, then the epilogue
//     (apply_epilogue: the prefill path's fp32 order);
//   - the activations: codes from the rotate kernel (one bulk copy per row on one mbarrier, so
//     the CTA does not also wait for its ring's first items; at 8 < M <= 16 by default in
//     clusters of 4 CTAs, each row multicast into the cluster; comfy row sums one warp per row),
//     or (M <= 2) x rotated + quantized by every CTA itself with the register rotate kernel's
//     arithmetic (linear_rotate.cuh): the same bits. The epilogue's operands are staged in shared
//     memory during the prologue (session 16), the epilogue maps one column to a thread (session
//     17: docs/linear-gpu.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "lowbit/dtype.h"
#include "src/core/check.h"
#include "src/core/guarded.h"
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
constexpr int kTilesDepth = 4;                  // ring slots per warp (H200 run 6: 4 > 6 > 8)
// Ring slots per warp of the two-kernel path for M > kTilesFuseLimit where they fit in shared
// memory (else kTilesDepth): H200 run 33, stream of 8 layers 16 x 5120 -> 13824, rotate + tiles
// 1.88x vs 1.80x of cuBLASLt bf16 (int4), 1.93x vs 1.92x (comfy), the same bits. The fused mode
// (M <= kTilesFuseLimit) keeps kTilesDepth (6 slots there: -1 % int4, +1.3 % comfy at M 1).
constexpr int kTilesDepthDeep = 6;
constexpr int64_t kTilesMaxK = 65536;           // int32 sums of 16 u x a stay below 2^31
constexpr int kTilesMaxRegs = 88;

__host__ __device__ constexpr int slot_bytes(int kind) {
  return kItemBytes + (kind == kTilesInt4 ? kTableBytes : 0);
}
// Shared memory of one CTA: the M activation rows, the int32 partial sums of its tiles, their
// epilogue operands, the warps' rings. CTA b owns whole tiles [b·T/G, (b+1)·T/G).
struct TilesLayout {
  int64_t tiles = 0;      // ceil(N / 16)
  int ipt = 0;            // items per tile, K / 128
  int act_stride = 0;     // bytes between activation rows in shared memory (= 64 mod 128)
  int part_off = 0;       // int32 partial sums (tiles per CTA x 16 columns x part_stride(M))
  int epi_off = 0;        // fp32 w_scale and bias of the CTA's columns (2 x epi_n)
  int epi_n = 0;          // tiles per CTA x 16
  int ring_off = 0;       // the warps' rings
  int depth = kTilesDepth;  // ring slots per warp (the kernel instance's D)
  int64_t smem = 0;
};

// Words between the partial sums of two columns in shared memory: M rounded up to odd, so the
// epilogue's reads part[c * stride + tok] of 32 consecutive columns c hit 32 distinct banks (a
// stride of M = 16 put them on 2 banks: 16-way conflicts). The atomics' pattern (8 columns x 4
// token pairs per instruction) is at most 2-way at any M.
__host__ __device__ constexpr int part_stride(int M) { return M | 1; }

// The epilogue's operands, staged in shared memory by the prologue.
struct TilesEpilogueOps {
  void* out;
  int32_t* acc_out;
  int64_t ldo;
  DType out_dtype;
  bool has_wts;
  float wts;  // *w_tensor_scale (1 when null)
};

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::lds128;
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

// One thread per (group g, row n < ld): the GEMM's table at g · ld + n (gemm_cutlass_s8s4_lut.cu),
// 8 bytes hi[i] = fold(i + 1), i = 0..6, hi[7] = 0; rows past N all zero. (The tiles' own table
// kernel above flags a table the layout cannot carry; the whole layout is then unused.)
__global__ void build_gemm_lut_kernel(PackedWeightRef w, int64_t ld, int64_t count, uint8_t* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= count) return;
  const int64_t g = idx / ld, row = idx - g * ld;
  uint32_t t[2] = {0u, 0u};
  if (row < w.N) {
    for (int i = 0; i < 7; ++i) {
      const int32_t v = w.ratios ? fold_code(i + 1, w.ratios[row * w.groups_per_row + g]) : i + 1;
      t[i >> 2] |= (static_cast<uint32_t>(v) & 0xffu) << (8 * (i & 3));
    }
  }
  reinterpret_cast<uint2*>(out)[idx] = make_uint2(t[0], t[1]);
}

// ---- the int8-grid weight from the layout (session 35) ----

// One thread per (item, chunk h, lane): its 16 bytes of codes (rows gid / gid + 8, columns
// 128 g + 64 h + 16 tid4 + 0..15) as int8-grid codes, one 16-byte store per row: int4 through
// the fold table by prmt (X - Y, as the GEMV's mma operands), comfy u - 8; the values
// unpack_weight_int8 gives (SPEC §3.3), at ~4 instructions per 4 weights instead of its fp32 fold
// per weight. Rows past N (the last tile's padding) are not written.
template <int KIND>
__device__ __forceinline__ uint32_t tile_word_s8(uint32_t sel, uint32_t t0, uint32_t t1) {
  if (KIND == kTilesInt4) {
    // prmt: T[m] for c >= 0 (bit 3 clear), the replicated zero sign for c < 0; with sel ^ 0x8888
    // the converse; -Y per byte as (0x80 - Y) ^ 0x80 (no borrow: Y <= 127).
    const uint32_t x = prmt(t0, t1, sel);
    const uint32_t y = prmt(t0, t1, sel ^ 0x8888u);
    return x | ((0x80808080u - y) ^ 0x80808080u);
  }
  return ((sel & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u;  // (u + 120) ^ 0x80 = u - 8
}

template <int KIND>
__global__ void unpack_tiles_int8_kernel(const uint8_t* tiles, int64_t N, int ipt, int64_t units,
                                         int8_t* out) {
  const int64_t T = (N + 15) / 16;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < units;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t item = u >> 6;
    const int h = static_cast<int>(u >> 5) & 1, lane = static_cast<int>(u) & 31;
    const int gid = lane >> 2, tid4 = lane & 3;
    const int64_t t = item / ipt, g = item - t * ipt;
    const uint4 w =
        *reinterpret_cast<const uint4*>(tiles + item * kItemBytes + h * 512 + lane * 16);
    uint4 tb = make_uint4(0u, 0u, 0u, 0u);
    if (KIND == kTilesInt4)
      tb = *reinterpret_cast<const uint4*>(tiles + T * ipt * kItemBytes + item * kTableBytes +
                                           gid * 16);
    const int64_t K = static_cast<int64_t>(ipt) * kItemCols;
    const int64_t col = g * kItemCols + 64 * h + 16 * tid4;
    const int64_t row = 16 * t + gid;
    // Words 0 / 2: row gid, columns +0..3 / +4..7 (low 16 bits), +8..11 / +12..15 (high);
    // words 1 / 3 the same for row gid + 8.
    const int sh = KIND == kTilesInt4 ? 16 : 4;
    if (row < N)
      *reinterpret_cast<uint4*>(out + row * K + col) = make_uint4(
          tile_word_s8<KIND>(w.x, tb.x, tb.y), tile_word_s8<KIND>(w.z, tb.x, tb.y),
          tile_word_s8<KIND>(w.x >> sh, tb.x, tb.y), tile_word_s8<KIND>(w.z >> sh, tb.x, tb.y));
    if (row + 8 < N)
      *reinterpret_cast<uint4*>(out + (row + 8) * K + col) = make_uint4(
          tile_word_s8<KIND>(w.y, tb.z, tb.w), tile_word_s8<KIND>(w.w, tb.z, tb.w),
          tile_word_s8<KIND>(w.y >> sh, tb.z, tb.w), tile_word_s8<KIND>(w.w >> sh, tb.z, tb.w));
  }
}

// ---- the GEMV ----

// Register rotation of x's M <= kTilesFuseLimit rows (K <= 16 THREADS): thread tid rotates its
// 16 elements of each row in registers (rotate16), the row's amax goes through s_amax (THREADS /
// 32 floats per row slot) and one barrier, and the thread writes its 16 codes (quantize16_int) as
// one 16-byte store at their output position in row m of act (shared memory, stride act_stride
// bytes) and the scale to scales[m]: the register rotate kernel's arithmetic, hence its bits.
// Comfy: adds the row's code sum to s_asum[m]. Every thread of the CTA takes part.
template <int KIND, int THREADS, typename XT>
__device__ __forceinline__ void tiles_rotate_reg(const DecodeParams& p, uint8_t* act,
                                                 int act_stride, float* scales, float* s_amax,
                                                 int32_t* s_asum) {
  constexpr int W = THREADS / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int M = static_cast<int>(p.M);
  const int K = static_cast<int>(p.w.K);
  const bool in = tid * 16 < K;
  const int g = reg_group<256>(tid), out0 = reg_out0<256>(tid);
  // Both rows' 32 bytes in flight before the first is computed (x: the preceding kernel's output,
  // read after griddepcontrol.wait with plain loads).
  uint4 raw[kTilesFuseLimit][2];
#pragma unroll
  for (int i = 0; i < kTilesFuseLimit; ++i) {
    raw[i][0] = raw[i][1] = make_uint4(0u, 0u, 0u, 0u);
    if (i < M && in) {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const XT*>(p.x) +
                                                        i * p.x_row_stride + tid * 16);
      raw[i][0] = src[0];
      raw[i][1] = src[1];
    }
  }
#pragma unroll
  for (int i = 0; i < kTilesFuseLimit; ++i) {
    const int m = i;
    if (m >= M) break;  // uniform
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
      *reinterpret_cast<uint4*>(act + m * act_stride + out0) = make_uint4(c[0], c[1], c[2], c[3]);
    }
    if (KIND == kTilesComfy) {
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

// Comfy: the code sum of activation row m = warp (M <= 16 = kTilesWarps rows in shared memory,
// landed and visible to every thread) into s_asum[m]: each warp sums its row's 16-byte pieces
// (independent loads, one reduction, a plain store). H200 session 16: the earlier loop over the
// rows (each thread its own pieces, a reduction and a shared atomic per row, rows in series) took
// ~4 us of the 16 x 5120 -> 13824 layer's ~19.
template <int KIND, int THREADS>
__device__ __forceinline__ void tiles_act_sums(const DecodeParams& p, const uint8_t* act,
                                               int act_stride, int32_t* s_asum) {
  static_assert(THREADS / 32 >= 16, "one warp per activation row");
  if (KIND != kTilesComfy) return;
  const int lane = threadIdx.x & 31, m = threadIdx.x >> 5;
  if (m >= static_cast<int>(p.M)) return;
  const int per_row = static_cast<int>(p.w.K / 16);
  const uint8_t* row = act + m * act_stride;
  int32_t sum = 0;
  for (int c = lane; c < per_row; c += 32) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + c * 16);
    sum = __dp4a(static_cast<int>(v.x), 0x01010101, sum);
    sum = __dp4a(static_cast<int>(v.y), 0x01010101, sum);
    sum = __dp4a(static_cast<int>(v.z), 0x01010101, sum);
    sum = __dp4a(static_cast<int>(v.w), 0x01010101, sum);
  }
  sum = __reduce_add_sync(0xffffffffu, sum);
  if (lane == 0) s_asum[m] = sum;
}

// KIND: kTilesComfy / kTilesInt4. NT: n8 tiles of activation rows (1: M <= 8, 2: M <= 16).
// XT: the activation dtype when every CTA rotates + quantizes x itself (M <= kTilesFuseLimit),
// else void (codes from the rotate kernel).
// At most 88 registers: 512 x 88 + the register rotate kernel's CTA (320 threads x 64) fit in
// one SM's 64 K registers together, so the CTA on the rotate kernel's SM starts (PDL) with the
// others instead of after it.
// D: ring slots per warp (kTilesDepth, or kTilesDepthDeep for the two-kernel path: TilesLayout).
// CL: clusters of CL CTAs share the activation copy (multicast; codes in; 0: no cluster).
template <int KIND, int NT, typename XT = void, int D = kTilesDepth, int CL = 0>
__global__ void __maxnreg__(kTilesMaxRegs) gemv_tiles_kernel(DecodeParams p, TilesLayout L) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int W = kTilesWarps, SLOT = slot_bytes(KIND);
  constexpr bool kFused = !std::is_void<XT>::value;
  constexpr bool kMcast = CL > 0;
  static_assert(!kMcast || !kFused, "the multicast copy takes the rotate kernel's codes");
  extern __shared__ __align__(128) uint8_t dsm[];
  __shared__ int32_t s_asum[16];
  __shared__ float s_scale[16], s_amax[kTilesFuseLimit * W];
  // The epilogue's operands (staged in the prologue) and the activation copy's barrier.
  __shared__ TilesEpilogueOps s_epi;
  __shared__ __align__(8) uint64_t s_act_bar;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tid4 = lane & 3;
  // Bench-only phase stamps (DecodeParams::stamps): thread 0 of each CTA.
  uint64_t* const stamps =
      p.stamps && threadIdx.x == 0 ? p.stamps + blockIdx.x * kTilesStampWords : nullptr;
  auto stamp = [&](int phase) {
    if (stamps) {
      uint64_t gt, ck;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(ck));
      stamps[phase] = gt;
      stamps[kStampClock + phase] = ck;
    }
  };
  stamp(kStampEntry);
  const int M = static_cast<int>(p.M);
  const int64_t N = p.w.N;
  const int64_t T = L.tiles, G = gridDim.x, b = blockIdx.x;
  const int ipt = L.ipt;
  // This CTA's whole 16-row tiles [t0, t1), i.e. items [t0 · ipt, t1 · ipt), split evenly over
  // its warps: warp w streams the contiguous run [jb, jb + n_items) of them.
  const int64_t t0 = b * T / G, t1 = (b + 1) * T / G;
  const int ntl = static_cast<int>(t1 - t0);
  const int items = ntl * ipt;
  const int jb = warp * items / W;
  const int n_items = (warp + 1) * items / W - jb;
  const int64_t first = t0 * ipt + jb;  // the warp's first item in the layout
  const uint8_t* codes = p.tiles + first * kItemBytes;
  const uint8_t* tables = p.tiles + T * ipt * kItemBytes + first * kTableBytes;
  uint8_t* ring = dsm + L.ring_off + warp * D * SLOT;
  uint8_t* act = dsm;
  int32_t* part = reinterpret_cast<int32_t*>(dsm + L.part_off);

  // Item k of this warp into slot s: lane l copies its 16 bytes of both chunks, lanes 0..7 the
  // tables of rows l and l + 8 (packed 4-bit).
  auto issue = [&](int k, int s) {
    const uint8_t* src = codes + static_cast<int64_t>(k) * kItemBytes + lane * 16;
    uint8_t* slot = ring + s * SLOT;
    cp_async16(smem_u32(slot + lane * 16), src);
    cp_async16(smem_u32(slot + 512 + lane * 16), src + 512);
    if (KIND == kTilesInt4 && lane < 8)
      cp_async16(smem_u32(slot + kItemBytes + lane * 16),
                 tables + static_cast<int64_t>(k) * kTableBytes + lane * 16);
  };
  // (H200 session 17: requesting only 0 / 2 of these before the wait and the rest after it made
  // the rotate kernel in front faster but the activation copy slower: +3-4 % / +0.5-1.5 %.)
#pragma unroll
  for (int k = 0; k < D - 1; ++k) {
    if (k < n_items) issue(k, k);
    cp_async_commit();
  }
  // The next kernel in the stream may launch now (it waits for this grid before reading): its
  // CTAs take the SMs this grid's CTAs leave and request their first items under our tail.
  ptx::griddep_launch_dependents();

  // Partial sums and activation sums start at zero; the epilogue's per-column operands (layer
  // parameters, not written by the preceding kernel) are fetched now, off the critical path.
  const int ps = part_stride(M);
  for (int i = threadIdx.x; i < ntl * 16 * ps; i += kTilesThreads) part[i] = 0;
  if (threadIdx.x < 16) s_asum[threadIdx.x] = 0;
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
  // The epilogue's other operands into shared memory now (layer parameters, not written by the
  // preceding kernel), so the epilogue reads no parameter or global memory: H200 session 16, the
  // epilogue phase of a 16 x 5120 -> 13824 layer 2.0 -> 1.75 us.
  if (threadIdx.x == 0) {
    s_epi.out = p.out;
    s_epi.acc_out = p.acc_out;
    s_epi.ldo = p.ldo;
    s_epi.out_dtype = p.out_dtype;
    s_epi.has_wts = p.ep.w_tensor_scale != nullptr;
    s_epi.wts = p.ep.w_tensor_scale ? *p.ep.w_tensor_scale : 1.f;
    if constexpr (!kFused) {
      ptx::mbar_init(smem_u32(&s_act_bar), 1);
      ptx::mbar_fence_init();
    }
    // Multicast: the CTA's M rows arrive as its cluster's copies, issued only after the
    // cluster barrier (which this thread reaches after the expectation).
    if constexpr (kMcast)
      ptx::mbar_arrive_expect_tx(smem_u32(&s_act_bar),
                                 static_cast<uint32_t>(p.w.K) * static_cast<uint32_t>(M));
  }
  // Multicast: this CTA's barrier is ready for its peers' copies (waited after the wait below).
  if constexpr (kMcast) ptx::cluster_arrive_release();
  ptx::griddep_wait();  // x / the activation codes come from the preceding kernel
  stamp(kStampWaited);
  __syncthreads();
  Epilogue ep = p.ep;
  if constexpr (kFused) {  // every CTA rotates + quantizes the M <= kTilesFuseLimit rows itself
    tiles_rotate_reg<KIND, kTilesThreads, XT>(p, act, L.act_stride, s_scale, s_amax, s_asum);
    ep.a_scale = s_scale;  // a generic pointer into shared memory
  } else {
    // The M activation scales (the preceding kernel's) into s_scale: loaded before the copy's
    // wait, stored after it.
    float a_scale = 1.f;
    if (p.ep.a_scale && threadIdx.x < M) a_scale = p.ep.a_scale[threadIdx.x];
    // The M activation rows (the preceding kernel's codes) as one bulk copy per row (warp 0, lane
    // m) completing on s_act_bar, so the CTA waits for these bytes only. (A cp.async copy's
    // wait_group 0 also waited for the ring's first items, committed before: H200 session 16,
    // the copy phase of a 16 x 5120 -> 13824 int4 layer 2.6 -> 1.9 us.) The row bytes (K, a
    // multiple of 128) and both addresses are 16-byte multiples (decode_tiles_applies, act_stride);
    // M x K fits in shared memory, far below the barrier's 2^20 - 1 transaction bytes.
    const uint32_t bar = smem_u32(&s_act_bar);
    const uint32_t row_bytes = static_cast<uint32_t>(p.w.K);
    if constexpr (kMcast) {
      // Clusters of CL CTAs: CTA rank r copies rows r, r + CL, ... multicast into every CTA of
      // the cluster (each row read from L2 once per cluster; every CTA expects all M rows).
      ptx::cluster_wait_acquire();
      const int rank = static_cast<int>(ptx::cluster_ctarank());
      if (warp == 0 && lane < M && lane % CL == rank)
        ptx::bulk_g2s_multicast(smem_u32(act + lane * L.act_stride), p.a + lane * p.lda,
                                row_bytes, bar, static_cast<uint16_t>((1u << CL) - 1u));
    } else if (warp == 0) {
      if (lane == 0) ptx::mbar_arrive_expect_tx(bar, row_bytes * static_cast<uint32_t>(M));
      __syncwarp();
      if (lane < M)
        ptx::bulk_g2s(smem_u32(act + lane * L.act_stride), p.a + lane * p.lda, row_bytes, bar);
    }
    ptx::mbar_wait_bounded(bar, 0);
    tiles_act_sums<KIND, kTilesThreads>(p, act, L.act_stride, s_asum);
    if (p.ep.a_scale) {
      if (threadIdx.x < M) s_scale[threadIdx.x] = a_scale;
      ep.a_scale = s_scale;
    }
  }
  __syncthreads();
  stamp(kStampActs);

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

  // Local tile and group of the current item.
  int tl = static_cast<int>(first / ipt - t0), g = static_cast<int>(first % ipt);
  int slot = 0;
  for (int k = 0; k < n_items; ++k) {
    cp_async_wait<D - 2>();  // this lane's copies of item k landed
    __syncwarp();            // ... and every lane's (tables); slot k - 1 is read by all lanes
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
    if (++slot == D) slot = 0;
    const bool tile_end = ++g == ipt;
    if (tile_end) g = 0;
    if (tile_end || k == n_items - 1) {
      // The tile's columns of this warp are complete: add them to the CTA's partial sums.
      // D fragment: c0, c1 = (row gid, tokens 2 tid4, 2 tid4 + 1), c2, c3 = row gid + 8.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = gid + 8 * (r >> 1), tok = 8 * nt + 2 * tid4 + (r & 1);
          const int32_t v = KIND == kTilesComfy ? acc0[nt][r] + (acc1[nt][r] >> 4)
                                                : acc0[nt][r] - acc1[nt][r];
          if (tok < M) atomicAdd(&part[(tl * 16 + row) * ps + tok], v);
          acc0[nt][r] = acc1[nt][r] = 0;
        }
      }
      if (tile_end) ++tl;
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  stamp(kStampItems);

  // Epilogue of the CTA's columns [16 t0, 16 t1).
  const int cols = ntl * 16;
  {
    // apply_epilogue's arithmetic and order, every operand from shared memory.
    void* const out = s_epi.out;
    int32_t* const acc_out = s_epi.acc_out;
    const int64_t ldo = s_epi.ldo;
    const DType out_dtype = s_epi.out_dtype;
    const bool has_wts = s_epi.has_wts;
    const float wts = s_epi.wts;
    const bool has_as = ep.a_scale != nullptr, has_ws = ep.w_scale != nullptr,
               has_bias = ep.bias != nullptr;
    // Output (tok, column c of the CTA) from its int32 sum; ws / bias: the column's operands.
    auto emit = [&](int tok, int c, int64_t col, float ws, float bias) {
      int32_t sum = part[c * ps + tok];
      if (KIND == kTilesComfy) sum -= 8 * s_asum[tok];
      if (acc_out) {
        acc_out[tok * ldo + col] = sum;
        return;
      }
      float v = static_cast<float>(sum);
      if (has_as) v = __fmul_rn(v, s_scale[tok]);
      if (has_ws) v = __fmul_rn(v, ws);
      if (has_wts) v = __fmul_rn(v, wts);
      if (has_bias) v = __fadd_rn(v, bias);
      store2(out, out_dtype, tok * ldo + col, v, 0.f, false, false);
    };
    // Thread -> column c = tid mod cw (cw: the columns rounded up to a power of two >= 32) and
    // tokens tid / cw, + kTilesThreads / cw, ...: the column's operands read once, no division
    // per output (session 17: the flat loop below spent ~120 instructions per output). More
    // columns than threads (over 32 tiles per CTA) take the flat loop.
    int cw = 32;
    while (cw < cols && cw < kTilesThreads) cw *= 2;
    if (cols <= cw) {
      const int c = threadIdx.x & (cw - 1);
      const int64_t col = 16 * t0 + c;
      if (c < cols && col < N) {
        const float ws = s_ws[c], bias = s_bias[c];
        for (int tok = threadIdx.x / cw; tok < M; tok += kTilesThreads / cw)
          emit(tok, c, col, ws, bias);
      }
    } else {
      for (int idx = threadIdx.x; idx < cols * M; idx += kTilesThreads) {
        const int tok = idx / cols, c = idx - tok * cols;
        const int64_t col = 16 * t0 + c;
        if (col < N) emit(tok, c, col, s_ws[c], s_bias[c]);
      }
    }
  }
  stamp(kStampEnd);
  if (stamps) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    stamps[kStampSm] = sm;
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

// max_smem: the device's budget; the two-kernel path for M > kTilesFuseLimit takes
// kTilesDepthDeep ring slots where the layout fits in it, else kTilesDepth (as every other mode;
// decode_tiles_applies asks for the kTilesDepth layout, max_smem 0).
TilesLayout tiles_layout(const DecodeParams& d, int grid, int64_t max_smem) {
  TilesLayout L;
  const int kind = decode_tiles_kind(d.w);
  L.tiles = (d.w.N + 15) / 16;
  L.ipt = static_cast<int>(d.w.K / kItemCols);
  // Row stride = 64 (mod 128): the 8 lanes of an LDS.128 phase (tokens gid, gid + 1, 4 lanes
  // each at 16 tid4) hit 8 distinct 16-byte bank groups.
  L.act_stride = static_cast<int>(d.w.K / 128 * 128 + 192);
  int64_t off = (d.M * L.act_stride + 127) / 128 * 128;
  L.part_off = static_cast<int>(off);
  const int64_t tiles_per_cta = (L.tiles + grid - 1) / grid;
  off += (tiles_per_cta * 16 * part_stride(static_cast<int>(d.M)) * 4 + 127) / 128 * 128;
  L.epi_off = static_cast<int>(off);
  L.epi_n = static_cast<int>(tiles_per_cta * 16);
  off += (2 * tiles_per_cta * 16 * 4 + 127) / 128 * 128;
  L.ring_off = static_cast<int>(off);
  const int64_t slot_row = static_cast<int64_t>(kTilesWarps) * slot_bytes(kind);
  if (!d.x && d.M > kTilesFuseLimit && off + kTilesDepthDeep * slot_row <= max_smem)
    L.depth = kTilesDepthDeep;
  L.smem = off + L.depth * slot_row;
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
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "decode_tiles", "shared memory");
  // sm_90 code on an sm_90 GPU (an older build, or older PTX JIT-compiled for this GPU, traps in
  // the kernel body).
  const CodeArch code = code_arch();
  info.sm90 = code.sm / 10 == 9 && code.ptx >= 90;
  info.max_smem = optin - 2048;  // room for the static arrays
  cache.emplace(dev, info);
  return info;
}

// Launches the GEMV with programmatic stream serialization (PDL).
template <int KIND, int NT, typename XT = void, int D = kTilesDepth>
void launch_tiles(const DecodeParams& d, const TilesLayout& L, int grid, cudaStream_t stream) {
  auto kernel = gemv_tiles_kernel<KIND, NT, XT, D>;
  set_kernel_smem(kernel, static_cast<int>(L.smem), "decode_tiles");
  launch_maybe_pdl(true, kernel, dim3(static_cast<unsigned>(grid)), dim3(kTilesThreads),
                   static_cast<size_t>(L.smem), stream, d, L);
}

// The multicast instances (two n8 tiles, 6 ring slots, clusters of CL CTAs): f(kernel, CL) with
// the one for d's weight kind and d.cluster (2 or 4).
template <typename F>
auto with_cluster_kernel(const DecodeParams& d, F&& f) {
  const bool comfy = decode_tiles_kind(d.w) == kTilesComfy;
  auto pick = [&](auto cl) {
    constexpr int CL = decltype(cl)::value;
    return comfy ? f(gemv_tiles_kernel<kTilesComfy, 2, void, kTilesDepthDeep, CL>, CL)
                 : f(gemv_tiles_kernel<kTilesInt4, 2, void, kTilesDepthDeep, CL>, CL);
  };
  return d.cluster == 2 ? pick(std::integral_constant<int, 2>{})
                        : pick(std::integral_constant<int, 4>{});
}
// A launch configuration of `grid` CTAs in clusters of `cl` (attrs: room for 2), with PDL if
// asked.
void cluster_config(cudaLaunchConfig_t& cfg, cudaLaunchAttribute* attrs, int cl, int grid,
                    int64_t smem, cudaStream_t stream, bool pdl) {
  cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(kTilesThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = static_cast<unsigned>(cl);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  cfg.numAttrs = 1;
  if (pdl) {
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 2;
  }
  cfg.attrs = attrs;
}
// Prepares the cluster instance for d (shared memory limit) and returns how many of its clusters
// are resident at once with `smem` bytes (0: none; per device, instance and size, cached).
int cluster_capacity(const DecodeParams& d, int64_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int64_t>, int> cache;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "decode_tiles", "device");
  return with_cluster_kernel(d, [&](auto kernel, int cl) {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), smem);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    int n = 0;
    bool set = true;
    try {  // (through the shared cache: a raw set could shrink what it recorded)
      set_kernel_smem(kernel, static_cast<int>(smem), "decode_tiles");
    } catch (const Error&) {
      set = false;
    }
    if (set) {
      cudaLaunchConfig_t cfg;
      cudaLaunchAttribute attrs[2];
      cluster_config(cfg, attrs, cl, cl, smem, nullptr, false);
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) n = 0;
    }
    (void)cudaGetLastError();
    cache.emplace(key, n);
    return n;
  });
}

// A read-only stream of the layout (bench only; the roofline of the GEMV): the grid's items
// split evenly over min(SMs, items) CTAs of 16 warps, each lane's 16-byte words loaded with
// ld.global.nc, 4 items ahead in a register ring, each item folded into one xor; the store (sink
// is null: never taken, but the compiler cannot know) keeps the loads alive. As the GEMV, it
// triggers its dependents and waits for its predecessor after its first requests (launched with
// PDL: a stream of probes overlaps as a stream of GEMVs does).
template <bool TABLES>
__global__ void __launch_bounds__(kTilesThreads, 1)
    stream_probe_kernel(const uint8_t* tiles, int64_t items_total, uint4* sink) {
  constexpr int U = 4, W = kTilesWarps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t G = gridDim.x, b = blockIdx.x;
  const int64_t s0 = b * items_total / G, s1 = (b + 1) * items_total / G;
  const int items = static_cast<int>(s1 - s0);
  const int jb = warp * items / W;
  const int n = (warp + 1) * items / W - jb;
  const uint8_t* codes = tiles + (s0 + jb) * kItemBytes + lane * 16;
  const uint8_t* tables = tiles + items_total * kItemBytes + (s0 + jb) * kTableBytes +
                          (lane >> 2) * 16;
  uint4 b0[U], b1[U], bt[U];
#pragma unroll
  for (int j = 0; j < U; ++j) {
    b0[j] = b1[j] = bt[j] = make_uint4(0u, 0u, 0u, 0u);
    if (j < n) {
      b0[j] = ldg_stream(codes + j * kItemBytes);
      b1[j] = ldg_stream(codes + j * kItemBytes + 512);
      if (TABLES) bt[j] = ldg_stream(tables + j * kTableBytes);
    }
  }
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();
  uint32_t acc = 0;
  for (int k0 = 0; k0 < n; k0 += U) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int k = k0 + j;
      if (k >= n) break;
      const uint4 w0 = b0[j], w1 = b1[j], t = bt[j];
      if (k + U < n) {
        b0[j] = ldg_stream(codes + (k + U) * kItemBytes);
        b1[j] = ldg_stream(codes + (k + U) * kItemBytes + 512);
        if (TABLES) bt[j] = ldg_stream(tables + (k + U) * kTableBytes);
      }
      acc ^= w0.x ^ w0.y ^ w0.z ^ w0.w ^ w1.x ^ w1.y ^ w1.z ^ w1.w;
      if (TABLES) acc ^= t.x ^ t.y ^ t.z ^ t.w;
    }
  }
  if (acc == 0x9e3779b9u && sink != nullptr) *sink = make_uint4(acc, 0u, 0u, 0u);
}

}  // namespace

namespace {
// Multicast activation copy: whole clusters of d.cluster CTAs, at most one CTA per multiprocessor
// and per tile, at most as many clusters as are resident at once (0 when none fits).
int cluster_grid(const DecodeParams& d) {
  const int cl = d.cluster;
  if (d.x || (cl != 2 && cl != 4)) return 0;
  const int64_t tiles = (d.w.N + 15) / 16;
  const int64_t g = std::min<int64_t>(multiprocessor_count(), tiles) / cl * cl;
  const int cap = cluster_capacity(d, tiles_device().max_smem);
  return static_cast<int>(std::min<int64_t>(g, static_cast<int64_t>(cap) * cl));
}
}  // namespace

int tiles_grid(const DecodeParams& d) {
  if (d.cluster > 0) return cluster_grid(d);
  const int64_t tiles = (d.w.N + 15) / 16;
  return static_cast<int>(std::min<int64_t>(multiprocessor_count(), tiles));
}

int decode_tiles_kind(const PackedWeightRef& w) {
  if (w.K % kItemCols != 0 || w.K > kTilesMaxK || w.N < 1) return kTilesNone;
  if (w.format == WeightFormat::comfy_int4) return kTilesComfy;
  if (w.format == WeightFormat::packed && w.bits == 4 &&
      (!w.ratios || (w.group == 128 && w.groups_per_row == w.K / 128)))
    return kTilesInt4;
  return kTilesNone;
}

bool decode_tiles_device() { return tiles_device().sm90; }

void decode_tiles_unpack_int8(const PackedWeightRef& w, const uint8_t* tiles, int8_t* out,
                              cudaStream_t stream) {
  const int kind = decode_tiles_kind(w);
  LOWBIT_CHECK(kind != kTilesNone && tiles, "decode_tiles_unpack_int8", "weight",
               "expected a weight with a decode-tile layout (comfy int4, or packed 4-bit with "
               "group 128), got none");
  const int ipt = static_cast<int>(w.K / kItemCols);
  const int64_t units = (w.N + 15) / 16 * ipt * 64;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((units + threads - 1) / threads,
                                           static_cast<int64_t>(multiprocessor_count()) * 16);
  if (kind == kTilesInt4) {
    unpack_tiles_int8_kernel<kTilesInt4>
        <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(tiles, w.N, ipt, units, out);
  } else {
    unpack_tiles_int8_kernel<kTilesComfy>
        <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(tiles, w.N, ipt, units, out);
  }
  check_launch("decode_tiles_unpack_int8");
}

namespace {
// The tiles proper (codes, then the int4 fold tables), before the GEMM's tables.
int64_t tiles_proper_bytes(const PackedWeightRef& w, int kind) {
  const int64_t items = (w.N + 15) / 16 * (w.K / kItemCols);
  return items * (kind == kTilesInt4 ? kItemBytes + kTableBytes : kItemBytes);
}
int64_t gemm_lut_offset(const PackedWeightRef& w, int kind) {
  return (tiles_proper_bytes(w, kind) + 255) / 256 * 256;
}
int64_t gemm_lut_ld(const PackedWeightRef& w) { return (w.N + 1) / 2 * 2; }
}  // namespace

int64_t decode_tiles_bytes(const PackedWeightRef& w) {
  const int kind = decode_tiles_kind(w);
  if (kind == kTilesNone) return 0;
  if (kind != kTilesInt4) return tiles_proper_bytes(w, kind);
  return gemm_lut_offset(w, kind) + w.K / kItemCols * gemm_lut_ld(w) * 8;
}

const uint8_t* decode_tiles_gemm_lut(const PackedWeightRef& w, const uint8_t* tiles,
                                     int64_t* ld, int64_t* group) {
  const int kind = decode_tiles_kind(w);
  if (!tiles || kind != kTilesInt4) return nullptr;
  *ld = gemm_lut_ld(w);
  *group = kItemCols;
  return tiles + gemm_lut_offset(w, kind);
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
    const int64_t ld = gemm_lut_ld(w), m = ipt * ld;
    build_gemm_lut_kernel<<<static_cast<unsigned>((m + 255) / 256), 256, 0, stream>>>(
        w, ld, m, out + gemm_lut_offset(w, kind));
    check_launch(op);
  }
  int bad = 0;
  check_cuda(cudaMemcpyAsync(&bad, flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream),
             op, "flag copy");
  check_cuda(cudaStreamSynchronize(stream), op, "synchronize");
  return bad == 0;
}

namespace {

template <typename T>
struct Tag {
  using type = T;
};

// Fused call (x in): whether the kernel's register rotation takes x (M <= kTilesFuseLimit,
// rot 256, bf16 / f16, K <= 16 x 512 elements, 16-byte rows, int8 / int4 codes).
bool fused_rotation_fits(const DecodeParams& d) {
  return d.M <= kTilesFuseLimit && d.rot == 256 &&
         (d.x_dtype == DType::bf16 || d.x_dtype == DType::f16) && d.w.K <= 16 * kTilesThreads &&
         (d.act_qmax == 7 || d.act_qmax == 127) && reinterpret_cast<uintptr_t>(d.x) % 16 == 0 &&
         d.x_row_stride % 8 == 0;
}

// Multicast activation copy (d.cluster 2 / 4, codes in d.a): 8 < M <= 16 (two n8 tiles), at
// least one whole cluster, the 6-slot ring's layout (the instances built).
bool mcast_fits(const DecodeParams& d) {
  if ((d.cluster != 2 && d.cluster != 4) || d.M <= 8 || d.M > 16) return false;
  const int grid = cluster_grid(d);
  if (grid < d.cluster) return false;
  const TilesLayout L = tiles_layout(d, grid, tiles_device().max_smem);
  return L.depth == kTilesDepthDeep && L.smem <= tiles_device().max_smem;
}

}  // namespace

bool decode_tiles_applies(const DecodeParams& d) {
  if (!d.tiles || d.M < 1 || d.M > 16) return false;
  if (decode_tiles_kind(d.w) == kTilesNone) return false;
  if (reinterpret_cast<uintptr_t>(d.tiles) % 16 != 0) return false;
  if (d.x) {
    if (d.cluster > 0 || !fused_rotation_fits(d)) return false;
  } else if (!d.a || d.lda % 16 != 0 || reinterpret_cast<uintptr_t>(d.a) % 16 != 0) {
    return false;
  } else if (d.cluster > 0 && !(tiles_device().sm90 && mcast_fits(d))) {
    return false;
  }
  const TilesDevice info = tiles_device();
  return info.sm90 && tiles_layout(d, tiles_grid(d), 0).smem <= info.max_smem;
}

namespace {
Guarded<DecodeTilesTuning> g_tuning;  // DecodeTilesTuning{} until a test sets another one
}  // namespace

DecodeTilesTuning layer_tiles_tuning() { return g_tuning.get(); }

void set_layer_tiles_tuning(const DecodeTilesTuning* t) {
  g_tuning.set(t ? *t : DecodeTilesTuning{});
}

void decode_tiles(const DecodeParams& d, cudaStream_t stream) {
  const int grid = tiles_grid(d);
  const TilesLayout L = tiles_layout(d, grid, tiles_device().max_smem);
  if (d.cluster > 0) {  // multicast activation copy (decode_tiles_applies: d.cluster 2 or 4)
    const cudaError_t e = with_cluster_kernel(d, [&](auto kernel, int cl) {
      cudaLaunchConfig_t cfg;
      cudaLaunchAttribute attrs[2];
      cluster_config(cfg, attrs, cl, grid, L.smem, stream, true);
      return cudaLaunchKernelEx(&cfg, kernel, d, L);
    });
    check_cuda(e, "decode_tiles", "cluster launch");
    return;
  }
  const bool two = d.M > 8;  // two n8 tiles of activation rows
  auto launch = [&](auto kind_tag, auto xt_tag) {
    constexpr int KIND = decltype(kind_tag)::value;
    using XT = typename decltype(xt_tag)::type;
    if constexpr (!std::is_void<XT>::value) {  // fused: M <= kTilesFuseLimit, one n8 tile
      launch_tiles<KIND, 1, XT>(d, L, grid, stream);
    } else if (L.depth == kTilesDepthDeep) {
      if (two) {
        launch_tiles<KIND, 2, void, kTilesDepthDeep>(d, L, grid, stream);
      } else {
        launch_tiles<KIND, 1, void, kTilesDepthDeep>(d, L, grid, stream);
      }
    } else if (two) {
      launch_tiles<KIND, 2>(d, L, grid, stream);
    } else {
      launch_tiles<KIND, 1>(d, L, grid, stream);
    }
  };
  auto by_x = [&](auto kind_tag) {
    if (!d.x) {
      launch(kind_tag, Tag<void>{});
    } else if (d.x_dtype == DType::f16) {
      launch(kind_tag, Tag<__half>{});
    } else {
      launch(kind_tag, Tag<__nv_bfloat16>{});
    }
  };
  if (decode_tiles_kind(d.w) == kTilesComfy) {
    by_x(std::integral_constant<int, kTilesComfy>{});
  } else {
    by_x(std::integral_constant<int, kTilesInt4>{});
  }
  check_launch("decode_tiles");
}

void decode_tiles_stream_probe(const DecodeParams& d, cudaStream_t stream) {
  const int64_t items = (d.w.N + 15) / 16 * (d.w.K / kItemCols);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(multiprocessor_count(), items));
  auto go = [&](auto kernel) {
    launch_maybe_pdl(true, kernel, dim3(grid), dim3(kTilesThreads), 0, stream, d.tiles, items,
                     static_cast<uint4*>(nullptr));
  };
  if (decode_tiles_kind(d.w) == kTilesInt4) {
    go(stream_probe_kernel<true>);
  } else {
    go(stream_probe_kernel<false>);
  }
  check_launch("decode_tiles_stream_probe");
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
