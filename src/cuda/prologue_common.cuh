// Device helpers shared by the CUDA prologue kernels (src/cuda/prologue.cu: first-generation and
// round-2 kernels; src/cuda/prologue_v3.cu: round-3 kernels; src/cuda/prologue_short.cu: the
// short k path). Internal to those files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "src/core/check.h"
#include "src/core/prologue_internal.h"
#include "src/cuda/common.cuh"
#include "src/cuda/ptx.cuh"
#include "src/cuda/rsqrt_rn.cuh"

namespace lowbit {
namespace cuda {
namespace {

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

enum RopeKind : int { kRopeNone = 0, kRopePaired = 1, kRopeInterleaved = 2 };

inline int rope_kind_of(const PrologueArgs& a) {
  if (!a.rotate) return kRopeNone;
  return a.interleaved ? kRopeInterleaved : kRopePaired;
}

// Calls f(D, BF16, ROPE) with compile-time constants (std::integral_constant<int, D>,
// std::true_type for bf16 x, std::integral_constant<int, RopeKind>) for the prologue kernels'
// head dims on CUDA (64, 128, 256); any other head dim fails for `op`.
template <typename F>
void dispatch_prologue(const PrologueArgs& a, const char* op, F&& f) {
  auto by_rope = [&](auto d, auto bf) {
    switch (rope_kind_of(a)) {
      case kRopePaired:
        f(d, bf, std::integral_constant<int, kRopePaired>{});
        break;
      case kRopeInterleaved:
        f(d, bf, std::integral_constant<int, kRopeInterleaved>{});
        break;
      default:
        f(d, bf, std::integral_constant<int, kRopeNone>{});
        break;
    }
  };
  auto by_dim = [&](auto bf) {
    if (a.dim == 64)
      by_rope(std::integral_constant<int, 64>{}, bf);
    else if (a.dim == 128)
      by_rope(std::integral_constant<int, 128>{}, bf);
    else if (a.dim == 256)
      by_rope(std::integral_constant<int, 256>{}, bf);
    else
      check::fail(op, "x",
                  "head dim on cuda: expected 64, 128 or 256, got " + std::to_string(a.dim));
  };
  if (a.x_dtype == DType::bf16)
    by_dim(std::true_type{});
  else
    by_dim(std::false_type{});
}

// Two values rounded to the activation dtype and read back (one packed conversion).
template <bool BF16>
__device__ __forceinline__ void round_pair(float& a, float& b) {
  if constexpr (BF16) {  // one packed cvt; the halves read back with a shift and a mask
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const uint32_t bits = *reinterpret_cast<const uint32_t*>(&h);
    a = __uint_as_float(bits << 16);
    b = __uint_as_float(bits & 0xffff0000u);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    a = __low2float(h);
    b = __high2float(h);
  }
}


// Four int32 codes to four int8 (saturating), byte k = code k.
__device__ __forceinline__ uint32_t pack_s8x4(int c0, int c1, int c2, int c3) {
  uint32_t hi, out;
  asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, 0;" : "=r"(hi) : "r"(c3), "r"(c2));
  asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(c1), "r"(c0), "r"(hi));
  return out;
}

__device__ __forceinline__ int round_code(float q) {
  return __float2int_rz(__fadd_rn(q, copysignf(0.5f, q)));
}


// Programmatic dependent launch: ptx.cuh's griddep_wait / griddep_launch_dependents.
using ptx::griddep_launch_dependents;
using ptx::griddep_wait;

// bar.sync on barrier 1 + team (team < 8, warp-uniform) for `threads` threads, the id an
// immediate: for a register id (bar.sync %r, n) ptxas reserves all 16 of the CTA's barriers,
// which caps the resident CTAs per SM at 4 (ncu: "Block Limit Barriers"); ids 1..8 reserve 9.
__device__ __forceinline__ void team_barrier(int team, int threads) {
  switch (team) {
    case 0: asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory"); break;
    case 1: asm volatile("bar.sync 2, %0;" ::"r"(threads) : "memory"); break;
    case 2: asm volatile("bar.sync 3, %0;" ::"r"(threads) : "memory"); break;
    case 3: asm volatile("bar.sync 4, %0;" ::"r"(threads) : "memory"); break;
    case 4: asm volatile("bar.sync 5, %0;" ::"r"(threads) : "memory"); break;
    case 5: asm volatile("bar.sync 6, %0;" ::"r"(threads) : "memory"); break;
    case 6: asm volatile("bar.sync 7, %0;" ::"r"(threads) : "memory"); break;
    default: asm volatile("bar.sync 8, %0;" ::"r"(threads) : "memory"); break;
  }
}

// Software pipeline over `count` units: the loads of units u+1 .. u+DEPTH are issued before unit
// u is processed. The ring is fully unrolled, so the buffers stay in registers. `start` runs
// once, after the first DEPTH loads are issued and before the first unit is processed (all
// threads call it: it may hold a barrier), so that the CTA's setup (shared-memory stores that
// wait on their own loads, a barrier) overlaps the first x loads instead of delaying them.
// A unit is NV 16-byte words.
template <int DEPTH, int NV = 2, typename Load, typename Proc, typename Start>
__device__ __forceinline__ void pipeline(int count, Load&& load, Proc&& proc, Start&& start) {
  uint4 buf[DEPTH + 1][NV];
#pragma unroll
  for (int k = 0; k < DEPTH; ++k)
    if (k < count) load(k, buf[k]);
  start();
  for (int u0 = 0; u0 < count; u0 += DEPTH + 1) {
#pragma unroll
    for (int k = 0; k <= DEPTH; ++k) {
      const int u = u0 + k;
      if (u < count) {
        if (u + DEPTH < count) load(u + DEPTH, buf[(k + DEPTH) % (DEPTH + 1)]);
        proc(u, buf[k]);
      }
    }
  }
}

// 16 bytes of shared memory, read where the code stands (volatile: never hoisted into registers
// that would live across the head loop).
__device__ __forceinline__ float4 lds16(const float4* p) {
  float4 v;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr));
  return v;
}

// The scale group of block-relative row r (SPEC §1 layouts; the inverse of group_row).
__device__ __forceinline__ int group_of_row(ScaleLayout layout, int r) {
  switch (layout) {
    case ScaleLayout::thread_q:
      return r % 8;
    case ScaleLayout::thread_k:
      return (r % 8) / 2;
    case ScaleLayout::warp_q:
      return r / 32;
    default:
      return 0;
  }
}

// Row i of block-relative scale group g (SPEC §1 layouts).
__device__ __forceinline__ int group_row(ScaleLayout layout, int g, int i) {
  switch (layout) {
    case ScaleLayout::thread_q: return g + 8 * i;
    case ScaleLayout::thread_k: return 8 * (i / 2) + 2 * g + (i & 1);
    case ScaleLayout::warp_q: return 32 * g + i;
    default: return i;
  }
}

// The row a quantize thread keeps for its whole head loop, and its pointers at head h0. Rows are
// placed group-major: position P in the padded token order of whole blocks holds row
// group_row(g, i) of block P / block, with P % block = g * group_rows + i, so a scale group's
// rows sit in consecutive positions. Rows past N point at token 0 (in bounds, never stored).
struct QuantRow {
  int64_t n;        // token of the row (>= N past the end)
  int64_t blk;      // block of the row
  int g;            // its scale group in the block
  bool ok;          // a token (< N)
  bool writer;      // stores the group's scale: the first lane of the group's first row
  const uint16_t* x;  // x[b, n, h0, 0]
  int8_t* q;          // q[b, n, h0, 0]
  float* s;           // scale[b, h0, blk * groups + g]
  const float* m;     // mean[b, h0, 0], or null
};

// The tokens of batch item b: a.tokens, or its own count in a padded varlen batch.
__device__ __forceinline__ int64_t tokens_of(const PrologueArgs& a, int64_t b) {
  return a.item_tokens ? static_cast<int64_t>(__ldg(a.item_tokens + b)) : a.tokens;
}
// The element offsets of batch item b's token 0 in x and in the rotary table (a padded varlen
// batch read in place: its packed row item_rows[b]).
__device__ __forceinline__ int64_t x_item(const PrologueArgs& a, int64_t b) {
  return a.item_rows && a.item_x ? static_cast<int64_t>(__ldg(a.item_rows + b)) * a.x_sn
                                 : b * a.x_sb;
}
__device__ __forceinline__ int64_t r_item(const PrologueArgs& a, int64_t b) {
  return a.item_rows && a.item_table ? static_cast<int64_t>(__ldg(a.item_rows + b)) * a.r_sn
                                     : b * a.r_sb;
}
// sum / (the item's tokens), 0 for an item without tokens.
__device__ __forceinline__ float mean_of(const PrologueArgs& a, int64_t b, float sum) {
  const int64_t n = tokens_of(a, b);
  return n > 0 ? __fdiv_rn(sum, static_cast<float>(n)) : 0.f;
}

__device__ __forceinline__ QuantRow quant_row(const PrologueArgs& a, int64_t b, int64_t P,
                                              int group_rows, int64_t h0, bool first_lane) {
  QuantRow r;
  r.blk = P / a.block;
  const int rem = static_cast<int>(P - r.blk * a.block);
  r.g = rem / group_rows;
  const int gi = rem % group_rows;
  r.n = r.blk * a.block + group_row(a.layout, r.g, gi);
  r.ok = r.n < tokens_of(a, b);
  r.writer = first_lane && gi == 0 && r.blk < a.n_blocks;
  const int64_t nn = r.ok ? r.n : 0;
  r.x = static_cast<const uint16_t*>(a.x) + x_item(a, b) + nn * a.x_sn + h0 * a.x_sh;
  r.q = a.q + b * a.q_sb + nn * a.q_sn + h0 * a.q_sh;
  r.s = a.scale + b * a.s_sb + h0 * a.s_sh + r.blk * a.groups + r.g;
  r.m = a.mean ? a.mean + b * a.m_sb + h0 * a.m_sh : nullptr;
  return r;
}

// ---- host side --------------------------------------------------------------------------------

// Wave model for the grid shapes: a CTA of `work` units (heads of a tile, or row steps x heads)
// costs `fixed + work` unit-times (fixed: its setup and, for the mean, its final column sums);
// CTAs run in rounds of `resident` at once (the occupancy calculator's count); the grid takes
// ceil(ctas / resident) rounds. Short grids (Flux) want fewer, longer CTAs, long ones a count that
// fills the last round. Among the shapes within 5 % of the best, the one with the most CTAs wins
// (more rounds balance uneven CTAs). `shape(k)` gives (ctas, work) of candidate k, or ctas 0 to
// skip it. `smooth`: a grid of more than 2 rounds takes ctas / resident rounds (CTAs of a long grid
// start as others end, and the few CTAs of a last partial round share an SM with fewer others),
// and the cheapest shape wins (no preference for more, i.e. smaller, CTAs: each pays its setup).
// The quantize kernel at Wan, GPU run 25: 20 heads per CTA, 3.1 rounds, 0.2576 / 0.1439 ms for k
// / q vs the whole-round model's 8 heads, 7.8 rounds, 0.2635 / 0.1462; shorter grids keep whole
// rounds (Flux: 6 heads, 0.87 rounds, beat 8 / 12 heads by 3-17 % in the same run).
template <typename Shape>
int64_t pick_by_waves(int64_t first, int64_t last, int64_t resident, double fixed, Shape&& shape,
                      bool smooth = false) {
  resident = std::max<int64_t>(1, resident);
  auto cost = [&](int64_t ctas, double work) {
    const double rounds = smooth && ctas > 2 * resident
                              ? static_cast<double>(ctas) / static_cast<double>(resident)
                              : static_cast<double>((ctas + resident - 1) / resident);
    return rounds * (fixed + work);
  };
  double best = -1;
  int64_t best_k = first;
  for (int64_t k = first; k <= last; ++k) {
    const auto [ctas, work] = shape(k);
    if (ctas > 0 && (best < 0 || cost(ctas, work) < best)) best = cost(ctas, work), best_k = k;
  }
  if (smooth) return best_k;
  int64_t pick = first, pick_ctas = 0;
  for (int64_t k = first; k <= last; ++k) {
    const auto [ctas, work] = shape(k);
    if (ctas > 0 && cost(ctas, work) <= 1.05 * best && ctas > pick_ctas) pick = k, pick_ctas = ctas;
  }
  return pick;
}


inline int table_mode_of(const PrologueArgs& a) {
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

// Batch item b's token n's weight row (segmented weights), clamped to [0, R): an index the caller
// vouched for (check_weight_rows false) but out of range takes the nearest row, never reads out
// of bounds. The indices are shared by the batch items, or (a padded varlen batch read in place)
// packed: item b's at item_rows[b] + n.
__device__ __forceinline__ int seg_row(const PrologueArgs& a, int64_t b, int64_t n) {
  const int64_t t = a.item_rows ? __ldg(a.item_rows + b) + n : n;
  return min(max(__ldg(a.w_rows + t * a.w_rows_s), 0), static_cast<int>(a.w_count) - 1);
}

// SEG (segmented weights in the fast kernels): item b's token n's weight row as a quad offset
// into a kernel's kSegRows rows of D / 4 weight quads (0 without segments or for a token past N).
template <int D, bool SEG>
__device__ __forceinline__ int seg_quad_offset(const PrologueArgs& a, int64_t b, int64_t n,
                                               bool ok) {
  if (!SEG || !ok) return 0;
  return (D / 4) * seg_row(a, b, n);
}

// ---- codes (moved from prologue_v3.cu in session 52: the short k kernel makes its codes
// with them too) -------------------------------------------------------------------------

// rcp.approx.ftz.f32: one MUFU.RCP. For b in [2^-126, 2^126] (normal b, normal 1/b) it is the
// reciprocal div.full.f32 uses: div.full(a, b) = a * rcp(b) there (the premise of quantize32).
__device__ __forceinline__ float rcp_approx(float b) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return r;
}

// Codes of N values with one scale (SPEC §1 rounding; see quantize16 in prologue.cu for the
// reciprocal: div.full.f32 a / b is a * rcp(b) for b in [2^-126, 2^126]). out[k] = codes 4k..4k+3.
template <int N, bool LEAN>
__device__ __forceinline__ void quantize_n(const float* v, float scale, uint32_t* out) {
  const float as = fabsf(scale);
  int c[N];
  if (as >= 0x1p-126f && as <= 0x1p126f) {
    const float r = LEAN ? rcp_approx(scale) : div_full(1.f, scale);
#pragma unroll
    for (int j = 0; j < N; ++j) c[j] = round_code(__fmul_rn(v[j], r));
  } else if (scale == 0.f) {
#pragma unroll
    for (int j = 0; j < N; ++j) c[j] = 0;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) c[j] = round_code(div_full(v[j], scale));
  }
#pragma unroll
  for (int k = 0; k < N / 4; ++k)
    out[k] = pack_s8x4(c[4 * k], c[4 * k + 1], c[4 * k + 2], c[4 * k + 3]);
}

// prmt.b32 (default mode): byte n of the result is byte (s >> 4n) & 7 of {b, a} (a: bytes 0-3),
// or with bit 3 of the nibble set, that byte's sign bit replicated (0x00 / 0xff).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}

// quantize32 without float-to-int conversions (session 11, the specialized tight kernel's):
// the same codes by other instructions, for a scale in [2^-126, 2^126] and codes within
// [-127, 127] (scale_eps >= 0: |v| r <= 127 (1 + a few ulp)); else quantize32.
// q = fl(v r), t = fl(q + copysign(0.5, q)) = sign(q) fl(|q| + 0.5) (round to nearest is
// symmetric), code = trunc(t) = sign(q) floor(a) with a = fl(fl(|v| r) + 0.5) (r > 0, so
// |q| = fl(|v| r)). floor(a) is the low byte of fl_rm(a + 2^23) (a < 2^22: the sum lies in
// [2^23, 2^24), whose ulp is 1; round-down is floor). The four magnitudes m of a word are packed
// by prmt, the signs of v (0xff per negative value) by prmt's sign replication, and a negative
// byte becomes (0x80 - m) ^ 0x80 = -m mod 256 (0x80 - m in [1, 0x80] for m <= 127: no borrow
// between bytes; m = 0 gives 0). v = -0 and a NaN never reach this (a NaN or inf |v| makes the
// scale non-finite: the caller's other paths).
// The premise of the conversion-free codes below: a scale in [2^-126, 2^126] (normal, with a
// normal reciprocal); then r = its reciprocal (the one div.full.f32 uses). False: the caller runs
// quantize_n instead.
template <bool LEAN>
__device__ __forceinline__ bool fq_reciprocal(float scale, float& r) {
  const float as = fabsf(scale);
  if (!(as >= 0x1p-126f && as <= 0x1p126f)) return false;
  r = LEAN ? rcp_approx(scale) : div_full(1.f, scale);
  return true;
}
template <int N, bool LEAN>
__device__ __forceinline__ void quantize_fq_n(const float* v, float scale, uint32_t* out) {
  float r;
  if (!fq_reciprocal<LEAN>(scale, r)) {
    quantize_n<N, LEAN>(v, scale, out);
    return;
  }
  constexpr uint32_t H = 0x80808080u;
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    uint32_t c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float a = __fadd_rn(__fmul_rn(fabsf(v[4 * k + i]), r), 0.5f);
      c[i] = __float_as_uint(__fadd_rd(a, 0x1p23f));
    }
    const uint32_t w = prmt(prmt(c[0], c[1], 0x0040u), prmt(c[2], c[3], 0x0040u), 0x5410u);
    const uint32_t s01 = prmt(__float_as_uint(v[4 * k]), __float_as_uint(v[4 * k + 1]), 0x00fbu);
    const uint32_t s23 =
        prmt(__float_as_uint(v[4 * k + 2]), __float_as_uint(v[4 * k + 3]), 0x00fbu);
    const uint32_t sg = prmt(s01, s23, 0x5410u);
    const uint32_t neg = (H - w) ^ H;
    out[k] = (neg & sg) | (w & ~sg);
  }
}
template <bool LEAN>
__device__ __forceinline__ void quantize32_fq(const float (&v)[32], float scale,
                                              uint32_t (&out)[8]) {
  quantize_fq_n<32, LEAN>(v, scale, out);
}

// quantize_fq_n with the sign in the magic number (session 16): the same codes, the code byte
// straight from one round-down add. a = fl(fl(|v| r) + 0.5) in [0.5, 127.5 (1 + a few ulp)] as
// there, m = floor(a) <= 127; M = 2^23 + 256. v >= 0: fl_rd(a + M) = M + m (the sum lies in
// [2^23, 2^24), ulp 1), low byte m. v < 0 (sign bit set, -0 included): fl_rd(a - M) = -(M - m)
// (round-down of a negative sum rounds its magnitude up: M - a < M - m <= M - a + 1, and exact
// for an integer a), magnitude in (2^23, 2^24), low byte (256 - m) mod 256 = the byte of -m (m = 0:
// 256, byte 0). So the byte is the SPEC code trunc(fl(q + 0.5 sign q)) = sign(v) m, and the four
// low bytes of a word are packed by prmt: per value fmul, fadd, the sign's lop3 and the add
// (quantize_fq_n: fmul, two fadds, then 9 integer ops per 4 values for signs and negation;
// SASS of the Flux q kernel: 154 instructions per 32 codes instead of 169).
// sign_or: (s & 0x80000000) | k in one lop3 (the compiler splits the C expression into two).
__device__ __forceinline__ uint32_t sign_or(uint32_t s, uint32_t k) {
  uint32_t d;
  asm("lop3.b32 %0, %1, 0x80000000, %2, 0xea;" : "=r"(d) : "r"(s), "r"(k));
  return d;
}
template <int N, bool LEAN>
__device__ __forceinline__ void quantize_fqs_n(const float* v, float scale, uint32_t* out) {
  float r;
  if (!fq_reciprocal<LEAN>(scale, r)) {
    quantize_n<N, LEAN>(v, scale, out);
    return;
  }
  constexpr uint32_t kMagic = 0x4b000100u;  // 2^23 + 256
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    uint32_t c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x = v[4 * k + i];
      const float a = __fadd_rn(__fmul_rn(fabsf(x), r), 0.5f);
      const float m = __uint_as_float(sign_or(__float_as_uint(x), kMagic));
      c[i] = __float_as_uint(__fadd_rd(a, m));
    }
    out[k] = prmt(prmt(c[0], c[1], 0x0040u), prmt(c[2], c[3], 0x0040u), 0x5410u);
  }
}

}  // namespace

// Where a mean pass keeps its partial sums (a stream-ordered Scratch, freed on the stream when
// the holder goes). A mean pass given a holder leaves them there: the fused k path frees them
// after its quantize launch, so that no free comes between mean_final and the quantize kernel in
// the stream (programmatic dependent launch pairs adjacent kernels). Null: freed at the pass's end.
using ScratchHold = std::unique_ptr<Scratch>;
inline Scratch& hold_scratch(ScratchHold& hold, size_t bytes, cudaStream_t stream,
                             const char* op) {
  hold = std::make_unique<Scratch>(bytes, stream, op);
  return *hold;
}

// Segmented norm weights (weight_rows) in the fast kernels (session 39): up to kSegRows weight
// rows held in shared memory, each token's row read once, D 64 / 128.
constexpr int kSegRows = 4;
// (tuning `seg_fast`: off by default, see PrologueCudaTuning)
inline bool seg_fast_ok(const PrologueArgs& a) {
  return a.w_rows && a.norm && a.w_count >= 1 && a.w_count <= kSegRows &&
         (a.dim == 64 || a.dim == 128) && detail::prologue_cuda_tuning().seg_fast;
}

// Round-3 kernels (src/cuda/prologue_v3.cu): whether they cover `a` (and the tuning knob allows
// them), and their entry points. `behind_mean`: the previous kernels in the stream are the mean
// pass of the same x (the fused k path), so the quantize kernel may read x, the weight and the
// table before its PDL wait (only the mean after it).
bool v3_supported(const PrologueArgs& a, bool quantize);
void v3_norm_rope_quantize(const PrologueArgs& a, Context& ctx, bool behind_mean = false);
void v3_norm_rope_mean(const PrologueArgs& a, Context& ctx, ScratchHold* hold = nullptr);

// The short k path (src/cuda/prologue_short.cu, session 52): whether it covers `a` (the fused
// mean + quantize of norm_rope_mean_quantize), and its launch.
bool short_k_supported(const PrologueArgs& a);
void short_k_mean_quantize(const PrologueArgs& a, Context& ctx);

// The mean pass's second stage (src/cuda/prologue.cu): mean_out[b, h, c] = (the `chunks` fp32
// partials (B, H, chunks, D) of (b, h) added in a fixed order) / N.
void launch_mean_final(const PrologueArgs& a, const float* partials, int64_t chunks,
                       cudaStream_t stream);

}  // namespace cuda
}  // namespace lowbit
