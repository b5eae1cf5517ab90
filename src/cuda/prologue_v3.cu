// Round-3 CUDA prologue kernels (SPEC §1): 32 channels per thread.
//
// The round-2 kernels (src/cuda/prologue.cu) give a row of D channels to D/16 lanes, 16 channels
// each. Every per-row step that does not scale with the channels (the correctly rounded rsqrt,
// the shuffle tree of the sum of squares, the group maximum, the scale and its reciprocal, the
// pipeline's address math) was paid once per 16 values: ncu measured ~23 SASS instructions per
// element for the q path, issue-bound at 50-65 % of the issue slots. Here a row is held by
// D/32 lanes (4 at D = 128, 2 at D = 64), four 16-byte chunks per lane, so those steps are paid
// once per 32 values and the shuffle trees are one level shorter.
//
// Lane l of a row holds chunks l + LANES * i, i = 0..3 (channels 8 * chunk + j): every LANES
// lanes of a row read 16 * LANES contiguous bytes per load (sector-aligned), the split-half RoPE
// partner of chunk i < 2 is chunk i + 2 of the same lane (no exchange), and interleaved pairs
// never leave a chunk. Sum of squares (the CPU's order): each chunk in channel order, then for
// each i an xor-shuffle tree over the LANES lanes (chunks LANES*i .. LANES*i + LANES-1 as a
// pairwise tree), then ((S0 + S1) + (S2 + S3)): the pairwise tree over all D/8 chunks.
#include <algorithm>
#include <type_traits>
#include <utility>

#include "src/core/check.h"
#include "src/core/prologue_internal.h"
#include "src/cuda/common.cuh"
#include "src/cuda/prologue_common.cuh"

namespace lowbit {
namespace cuda {
namespace {

constexpr int kV3MaxWarps = 16;     // quantize CTA: at most 16 warps of rows
// Quantize: the x ring is a cp.async ring in shared memory (each thread's own slots), 2 heads
// ahead in <= 96 registers: 5 CTAs of 4 warps per SM (GPU run 6, Wan q: register ring 0.175 ms,
// cp.async 3 heads ahead 0.157 ms, 2 ahead in 96 registers 0.156 ms; the other two deleted in
// session 8). The opt-in attribute for dynamic shared memory is set for every launch (run 3:
// launches with exactly 48 KB of it failed without). Session 8's bulk-copy ring (one
// cp.async.bulk per row and head into mbarrier stages) lost in GPU run 19 (Wan q 0.1692 vs
// 0.1553 ms, k quantize pass 0.1889 vs 0.1773, the same bits): cp.async.bulk takes uniform
// operands, so ptxas serializes a warp's 8 row copies in an R2UR / BRA.U.ANY loop (ncu: 16 %
// more warp instructions in an issue-bound kernel). Deleted; see docs/prologue.md.
constexpr int kV3Async96Ahead = 2;
constexpr int kV3Async96Regs = 96;
// The lean per-row arithmetic (bf16; GPU run 6: bits equal to the plain arithmetic's on every
// bench output, 0.5-1.5 % faster) is the only form for bf16 since session 8.
// THREAD_K 64 at D = 128 on 4-warp CTAs over half blocks (tuning `split_blocks`): GPU run 7,
// Wan / Flux k path 0.2988 / 0.0433 ms vs 0.3068 / 0.0450 on 8-warp CTAs (the same bits): the
// default since session 5.
constexpr bool kV3DefaultSplit = true;
// The group maximum by redux.sync (tuning `max_reduce`) and the quantize launch with PDL
// (`quant_pdl`): GPU run 9, Wan q 0.1548 -> 0.1517 ms (redux), Wan / Flux k 0.2999 / 0.0429 ->
// 0.2911 / 0.0420 (both), every bit equal: the defaults since session 5.
constexpr bool kV3DefaultRedux = true;
constexpr bool kV3DefaultQuantPdl = true;
// The quantize CTA's mean rows in shared memory (tuning `mean_smem`; 0 = this default). GPU run
// 12 (the same bits): the k quantize pass alone at Wan 0.1853 ms with the mean from L1, 0.1752
// with the mean rows in shared memory (k path Wan 0.2875 -> 0.2750, Flux 0.0416 -> 0.0414): the
// default since session 6. (Wide rows, 2 lanes per row with 64 values per thread, lost
// everywhere in runs 12-13: k pass alone 0.2576 / 0.2062 ms with 16-byte stores, q 0.2169 /
// 0.1715 vs 0.1548; 10 warps per SM left the schedulers idle. Deleted in session 7.)
constexpr int kV3DefaultMeanSmem = detail::kMeanSmemRing;  // session 7: see below
// mean_smem = kMeanSmemRing (session 7): the mean rows in a ring of kMeanRingRows rows, refilled
// kMeanRingChunk heads at a time (cp.async, one CTA barrier per chunk), so the head group is not
// capped by shared memory (Wan k: 8 heads per CTA with the staged rows, 20 for q; the CTA's setup
// is paid per head group). Run 16 (k, the same bits): Wan 0.2766 vs 0.2762 ms, Flux 0.0408 vs
// 0.0403, quantize pass alone 0.1782 vs 0.1794 - but both ran 20 heads on 4 CTAs per SM (the
// barrier limit below). The default for run 17, with 5 CTAs per SM: it keeps run 16's head group
// (20) where the staged rows would cap it at 7.
// 3 heads per chunk, 6 rows (3 KB at D = 128): 8 rows (4 KB) would miss 5 CTAs per SM by 128
// bytes. The refill rides on the x ring's commit groups, so it needs kMeanRingChunk > AHEAD
// (the 96-register ring: 2 heads ahead).
constexpr int kMeanRingChunk = 3, kMeanRingRows = 6;
// The scale groups' team barriers have immediate ids 1..8 (team_barrier; session 7). With the
// id in a register ptxas reserves all 16 of a CTA's barriers, and the SM's barriers then hold
// every quantize kernel to 4 resident CTAs (ncu run 16: "Block Limit Barriers 4"); run 17:
// Wan q 0.1554 vs 0.1585 ms, k 0.2746 vs 0.2775 (the register form deleted in session 8).
// The quantize pass of the fused k path (norm_rope_mean_quantize) issues its x, weight and table
// loads before its PDL wait (tuning `quant_early`; 0 = this default there; a lone
// norm_rope_quantize waits first unless the knob forces kEarlyOn). GPU run 12, measured behind
// the two-call k path: Wan 0.2750 -> 0.2725 ms, Flux 0.0414 -> 0.0400, the same bits.
constexpr bool kV3DefaultEarlyFused = true;
// The round-4 mean with 5 CTAs per SM (tuning `mean_ctas`) by default from this many rows
// (batch * tokens * heads) up: GPU run 9, Wan k 0.2999 -> 0.2904 ms, Flux k 0.0429 -> 0.0450 (at
// Flux the wave model then gives each warp fewer tokens).
constexpr int64_t kV4OccMinRows = int64_t{1} << 20;
// Session 9: the tight forms (tuning `quant_tight`; kTightOff forces the generic quantize
// kernel): the quantize kernel of 4-warp CTAs with its thread count a template constant and
// running offsets for the ring slot, the x / q / scale pointers and the mean row, and the round-4
// mean kernel's 32-bit slot addresses; both with v3_row's branch-free norm (ncu run 16, k pass at
// Wan: ~70 of ~670 warp instructions per head were the ring's, the table's and the pointers'
// address math, ~15 register moves at v3_row's norm branch). GPU run 24, the same bits: Wan q
// 0.1547 -> 0.1460 ms (82 % of copy), k 0.2743 -> 0.2612 (0.2629 with the generic mean kernel),
// k quantize pass alone 0.1772 -> 0.1671; Flux q 0.0225 -> 0.0216, k 0.0411 -> 0.0398. The
// default since (re-confirmed in run 26); session 10 deleted the generic mean form (the generic
// quantize form stays: it serves CTAs of other than 4 warps).
constexpr bool kV3DefaultTight = true;
constexpr int kTightThreads = 128;
// Session 11: the tight kernel specialized to a scale group of kSpecQRows (THREAD_Q 32, no mean)
// or kSpecKRows rows (THREAD_K 64, the mean rows in shared memory) at compile time, its codes
// without float-to-int conversions (quantize32_fq); the same bits. GPU run 32: Wan q 0.1441 ->
// 0.1419 ms, k 0.2571 -> 0.2517, k quantize pass alone 0.1625 -> 0.1573; Flux q 0.0204 ->
// 0.0205, k 0.0384 -> 0.0376. The default for those launches since (tuning quant_tight =
// kTightPlain: the unspecialized tight kernel).
constexpr bool kV3DefaultSpec = true;
// Session 14: round 5 of the specialized q kernel (v5_quantize_pair_kernel; tuning `quant_pair`)
// by default from this many rows (batch * tokens * heads) up. H200 run 51 (the same bits; ms
// round 5 / round 3 forced): Wan q 0.1402 / 0.1411 (85.7 % of copy), Flux q 0.0228 / 0.0206 (its
// 16-row tiles: twice the CTAs of the short grid).
constexpr int64_t kV3PairMinRows = int64_t{1} << 20;
constexpr int kSpecQRows = 4, kSpecKRows = 16;
// Session 23: the round-5 THREAD_K kernel (v5_quantize_kpair_kernel; tuning `quant_kpair`) for
// the specialized k launches, its codes with the sign in the magic number by default. H200,
// session 23 call 2 (the same bits; ms, A/B/A/B in one call): the k quantize pass alone at Wan
// 0.1524 / 0.1523 (signed codes), 0.1569 / 0.1570 (byte permutes) against round 3's 0.1591 /
// 0.1590; the fused k path 0.2460 / 0.2461 (byte permutes) against 0.2485 / 0.2482, Flux
// 0.0356 / 0.0356 against 0.0353 / 0.0353.
constexpr bool kV3DefaultKPair = true;
// Session 23: its CTA-wide exchange barrier with the mean ring's refill folded in (D = 128;
// tuning `kpair_sync` = kSyncCta). H200, session 24 call 1 (the same bits; ms, Wan, A/B twice in
// one call): k quantize pass alone 0.1463 / 0.1467 against the team barriers' 0.1519 / 0.1516;
// k path 0.2340 / 0.2339 against 0.2392 (86 % of copy against 84 %). The default since (D = 128).
// (Session 24's hybrid form, the CTA barrier only at the ring's refill heads and the 2-warp team
// barriers between, measured 0.1489 / 0.1483 and 0.2362 / 0.2361: deleted in session 25.)
constexpr int kV3DefaultKPairSync = detail::kSyncCta;
// Session 16: the specialized q kernel at 6 CTAs per SM (v3_quantize_kernel_occ6, tuning
// `quant_occ6`): 80 registers, the x ring 1 head ahead; by default from kV3Occ6MinRows rows
// (batch * tokens * heads) up to kV3PairMinRows (round 5 from there). H200 runs 1-2 of session
// 16 (the same bits; ms, signed codes): Flux q 0.0196-0.0199 vs 0.0202-0.0204 at 5 CTAs per SM;
// Flux heads at 64 tokens 0.0066-0.0067 vs 0.0062-0.0064 (48 CTAs of one head: the 3 spilled
// registers, nothing to hide); Wan with round 3 forced 0.1570 vs 0.1415 (3 rounds of CTAs: one
// head ahead does not cover the loads).
// The specialized kernels' codes with the sign in the magic number (quantize_fqs_n; tuning
// `quant_codes`): the default for the q kernels (round 3, occ6, round 5), not for the THREAD_K
// kernel. Same runs: Flux q 0.0202-0.0204 vs 0.0206-0.0209 (round 3), Wan q 0.1375 vs 0.1407
// (round 5); the k quantize pass alone at Wan 0.1588 / 0.1591 vs 0.1578 / 0.1580 (A, B, A, B),
// the Flux k path 0.0361 / 0.0357 vs 0.0362 / 0.0362.
constexpr int kV3Occ6Regs = 80, kV3Occ6Ahead = 1;
constexpr int64_t kV3Occ6MinRows = int64_t{1} << 16;
// Session 10: the balanced quantize grid. A grid of CTAs of equal work fills the SMs unevenly
// when it is less than a few rounds: Flux q / k quantize, 576 CTAs of 6 heads on 660 slots = 48
// SMs with 5 CTAs and 84 with 4, and the kernel lasts as long as the 5-CTA SMs (37.5 head-times
// with the setup's 1.5 per CTA, vs 32.7 on average). Balanced: the wave model's grid rounded to
// a whole number of rounds of resident CTAs, each token tile split into q or q + 1 head groups
// (Flux: 660 CTAs of 6 or 4-5 heads, 25-27 head-times per SM; the tiles of fewer, larger
// groups first in the grid). The same arithmetic per row: the same bits. GPU run 29: Flux q
// 0.0216 -> 0.0205 ms (73 -> 77 % of copy), k 0.0396 -> 0.0380, k quantize pass alone 0.0240
// -> 0.0225; at Wan (3.1 rounds: 68 tiles of one 40-head group, the rest 2 x 20) q 0.1452 ->
// 0.1455, k 0.2589 -> 0.2612. The default for grids of at most kV3BalancedMaxRounds rounds
// since (Flux: 0.87; Wan: 3.1, unchanged); run 30: Flux q 0.0220 -> 0.0209 (75 %), k 0.0388 ->
// 0.0380, k quantize pass alone 0.0238 -> 0.0223, Wan q 0.1436 / 0.1441, k 0.2578 / 0.2576.
// Tuning heads_per_cta = kKnobBalanced forces it at any size, kKnobUnbalanced the wave model's
// grid (run 29's default), a positive value that head group (unbalanced). (Session 10's
// balanced mean chunks, q or q + 1 tokens per warp, changed the mean's fp32 sum order, i.e. its
// bits, for -1 % at Flux k: not adopted, deleted; see docs/prologue.md.)
constexpr bool kV3DefaultBalanced = true;
constexpr double kV3BalancedMaxRounds = 2.0;

// p advanced by an unsigned 32-bit byte count (64-bit address arithmetic, no sign word).
template <typename T>
__device__ __forceinline__ T* bump(T* p, uint32_t bytes) {
  using Byte = std::conditional_t<std::is_const<T>::value, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + bytes);
}

// Chunk i (0..3) of lane `lane_in_row`; channel of value 8 * i + j is 8 * chunk + j.
template <int D>
__device__ __forceinline__ int v3_chunk(int lane_in_row, int i) {
  return lane_in_row + (D / 32) * i;
}

// 16 bytes through L1, read where the code stands (volatile: not hoisted into registers that
// would live across the unit).
__device__ __forceinline__ float4 ldg16_l1(const float* p) {
  float4 v;
  asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p));
  return v;
}

// 16 bytes global -> shared, asynchronous, bypassing L1 (x is read once).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  ptx::cp_async16(ptx::smem_u32(smem), gmem);
}
using ptx::cp_async_commit;
using ptx::cp_async_wait;
// 16 bytes of shared memory, read where the code stands.
__device__ __forceinline__ uint4 lds16u(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ uint4 lds16u(const uint4* p) { return lds16u(ptx::smem_u32(p)); }

// cos / sin of 4 consecutive pairs starting at `pair` (a multiple of 4).
__device__ __forceinline__ void load_table4(const PrologueArgs& a, int mode, int64_t row_off,
                                            int pair, float* cs, float* sn) {
  if (mode == kTablePairsF32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.rope) + row_off +
                                                      2 * static_cast<int64_t>(pair));
    const float4 t0 = __ldg(p), t1 = __ldg(p + 1);
    cs[0] = t0.x, sn[0] = t0.y, cs[1] = t0.z, sn[1] = t0.w;
    cs[2] = t1.x, sn[2] = t1.y, cs[3] = t1.z, sn[3] = t1.w;
  } else if (mode == kTableMatrixF32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.rope) + row_off +
                                                      4 * static_cast<int64_t>(pair));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 t = __ldg(p + i);
      cs[i] = t.x, sn[i] = t.z;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t o = row_off + static_cast<int64_t>(pair + i) * a.r_sp;
      const bool in = pair + i < a.pairs;
      cs[i] = in ? load_any(a.rope, o, a.r_dtype) : 1.f;
      sn[i] = in ? load_any(a.rope, o + a.r_sc, a.r_dtype) : 0.f;
    }
  }
}

// The 16 (cos, sin) pairs of a thread's 32 values of row `row_off`: pair t of the thread is
// paired: value 8 i + j (i < 2) with value 8 (i + 2) + j, table pair 8 chunk(i) + j, t = 8 i + j;
// interleaved: values 8 i + 2 m and + 1, table pair 4 chunk(i) + m, t = 4 i + m.
template <int D, int ROPE>
__device__ __forceinline__ void v3_table_row(const PrologueArgs& a, int mode, int64_t row_off,
                                             int lane_in_row, float (&cs)[16], float (&sn)[16]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int pair = ROPE == kRopePaired ? 8 * v3_chunk<D>(lane_in_row, k / 2) + 4 * (k & 1)
                                         : 4 * v3_chunk<D>(lane_in_row, k);
    load_table4(a, mode, row_off, pair, cs + 4 * k, sn + 4 * k);
  }
}

// The norm weight as fp32 quads: w_sh[k][l] = channels 8 chunk(l, k / 2) + 4 (k & 1) + 0..3, the
// weights of values 4k .. 4k + 3 of lane l. Thread tid < 8 * LANES loads quad (tid / LANES,
// tid % LANES); its store and a barrier come later (the setup overlaps the first x loads).
// SEG (segmented weights, seg_fast_ok): thread tid < kSegRows * D / 4 loads quad tid % (D / 4) of
// weight row tid / (D / 4) (rows past R: ones, never read); the rows follow each other in w_sh.
template <int D, bool SEG = false>
__device__ __forceinline__ float4 v3_weight_quad(const PrologueArgs& a, int tid) {
  constexpr int LANES = D / 32, NQ = 8 * LANES;
  float q[4] = {1.f, 1.f, 1.f, 1.f};
  const int row = SEG ? tid / NQ : 0, t = SEG ? tid % NQ : tid;
  if (tid < (SEG ? kSegRows : 1) * NQ && row < a.w_count && a.norm) {
    const int k = t / LANES, l = t % LANES;
    const int c = 8 * v3_chunk<D>(l, k / 2) + 4 * (k & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = load_any(a.w, row * a.w_sr + c + i, a.w_dtype);
  }
  return make_float4(q[0], q[1], q[2], q[3]);
}

// Quad tid at flat index tid of w_sh ([rows][8][D / 32]).
template <int D, bool SEG = false>
__device__ __forceinline__ void v3_store_weight_quad(int tid, float4 q, float4* w_sh) {
  if (tid < (SEG ? kSegRows : 1) * (D / 4)) w_sh[tid] = q;
}

// The first channel of the round-5 layout's weight quad k (k < 4) of lane l: 8 l + 4 k (k < 2),
// D / 2 + 8 l + 4 (k - 2).
template <int D>
__device__ __forceinline__ int pair_quad_channel(int k, int l) {
  return (k < 2 ? 0 : D / 2 - 8) + 8 * l + 4 * k;
}

// NormScope::token (tuning `token_fast`): head h's weight quad k of lane l in the round-5 layout,
// from the f32 weight rows a.token_w (L1-resident; what pair_weight_quad would stage).
template <int D>
__device__ __forceinline__ float4 token_weight_quad(const PrologueArgs& a, int64_t h, int k,
                                                    int l) {
  return __ldg(reinterpret_cast<const float4*>(a.token_w + h * D + pair_quad_channel<D>(k, l)));
}

// The round-5 mean's weight quads: quad (k, l) = tid (k = tid / (D / 16), l = tid % (D / 16),
// tid < D / 4) holds the weights of values 4k .. 4k + 3 of lane l's rows (pair_quad_channel).
template <int D, bool SEG = false>
__device__ __forceinline__ float4 pair_weight_quad(const PrologueArgs& a, int tid) {
  constexpr int NQ = D / 4;
  float q[4] = {1.f, 1.f, 1.f, 1.f};
  const int row = SEG ? tid / NQ : 0, t = SEG ? tid % NQ : tid;
  if (tid < (SEG ? kSegRows : 1) * NQ && row < a.w_count && a.norm) {
    const int c = pair_quad_channel<D>(t / (D / 16), t % (D / 16));
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = load_any(a.w, row * a.w_sr + c + i, a.w_dtype);
  }
  return make_float4(q[0], q[1], q[2], q[3]);
}

// v rounded to bf16 and read back as fp32 in one instruction: cvt.rn.bf16x2.f32 puts bf16(v)
// in the upper half and bf16(0) = 0 in the lower, i.e. the fp32 bits of bf16(v) (round_pair:
// the same conversion, then a shift or a mask per value).
__device__ __forceinline__ float round_bf16_hi(float v) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(v), "f"(0.f));
  return __uint_as_float(d);
}

// rope(norm(x)) of a thread's 32 values of one row (SPEC §1 order; the same bits as the CPU and
// the round-2 kernels). All LANES lanes of the row call it together (shuffles). The weight quad k
// (values 4k .. 4k+3) and the rotary quad k ((cos, sin) of pairs 2k, 2k+1) are read where they are
// used (`wq(k)`, `tq(k)`: shared-memory reads), so they never all sit in registers at once.
// UNIFORM: the norm's multiplies and rounding run whether or not there is a norm (without one,
// inv = 1 and the weights are 1: x * 1 * 1 rounded to x's own dtype is x, the same bits), so no
// branch joins two register assignments of the 32 values (ptxas placed ~15 moves per row there).
template <int D, bool BF16, int ROPE, bool LEAN = false, bool UNIFORM = false, typename WQ,
          typename TQ>
__device__ __forceinline__ void v3_row(bool norm, float eps, WQ&& wq, TQ&& tq,
                                       const uint4 (&raw)[4], float (&v)[32]) {
  constexpr int LANES = D / 32;
  float* x = v;  // in place: each rotation reads its two values before writing them
#pragma unroll
  for (int i = 0; i < 4; ++i) unpack<BF16>(raw[i], x + 8 * i);
  if (norm || UNIFORM) {
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = chunk_squares(x + 8 * i);
#pragma unroll
    for (int o = 1; o < LANES; o <<= 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = __fadd_rn(p[i], __shfl_xor_sync(0xffffffffu, p[i], o));
    }
    const float total = __fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3]));
    static_assert((D & (D - 1)) == 0, "D must be a power of two");  // total / D is exact
    const float ms = __fadd_rn(__fmul_rn(total, 1.f / static_cast<float>(D)), eps);
    float inv;
    if constexpr (UNIFORM) {
      // Session 31: the squares, their tree and the rsqrt's direct steps run whether or not
      // there is a norm, and one rarely taken branch rewrites the scalar inv (no norm: 1, the
      // weights are 1 too; outside the direct range: __frsqrt_rn). ptxas no longer joins two
      // register assignments of the row there (Flux q kernel: 572 -> 548 instructions a head).
      inv = rsqrt_direct(ms);
      if (!norm || !rsqrt_direct_ok(ms)) inv = norm ? __frsqrt_rn(ms) : 1.f;
    } else {
      inv = norm_rsqrt(ms);  // here norm is on
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 w = wq(k);
      x[4 * k] = __fmul_rn(__fmul_rn(x[4 * k], inv), w.x);
      x[4 * k + 1] = __fmul_rn(__fmul_rn(x[4 * k + 1], inv), w.y);
      x[4 * k + 2] = __fmul_rn(__fmul_rn(x[4 * k + 2], inv), w.z);
      x[4 * k + 3] = __fmul_rn(__fmul_rn(x[4 * k + 3], inv), w.w);
      if (LEAN && BF16) {  // one cvt per value, no unpacking (the same bits)
#pragma unroll
        for (int i = 0; i < 4; ++i) x[4 * k + i] = round_bf16_hi(x[4 * k + i]);
      } else {
        round_pair<BF16>(x[4 * k], x[4 * k + 1]);
        round_pair<BF16>(x[4 * k + 2], x[4 * k + 3]);
      }
    }
  }
  auto rotate = [&](float c, float s, int lead, int trail) {
    const float y = x[lead], o = x[trail];
    v[lead] = __fmaf_rn(c, y, -__fmul_rn(s, o));
    v[trail] = __fmaf_rn(s, y, __fmul_rn(c, o));
  };
  if (ROPE == kRopePaired) {  // pair t = 8 i + j (i < 2): value t leads, value t + 16 trails
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 t = tq(k);  // pairs 2k, 2k + 1
      rotate(t.x, t.y, 2 * k, 2 * k + 16);
      rotate(t.z, t.w, 2 * k + 1, 2 * k + 17);
    }
  } else if (ROPE == kRopeInterleaved) {  // pair t = 4 i + m: values 8 i + 2 m and + 1 = 2t, 2t+1
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 t = tq(k);
      rotate(t.x, t.y, 4 * k, 4 * k + 1);
      rotate(t.z, t.w, 4 * k + 2, 4 * k + 3);
    }
  }
}

// The round-5 mean layout (two rows per lane): rope(norm(x)) of the lane's two rows, 16 values
// each. Value 16 r + 8 i + j of row r (0, 1: the lane's two heads) is channel 8 (l + i D / 16) + j
// of lane l of D / 16 lanes per row: the split-half partner of value 16 r + j is 16 r + 8 + j,
// interleaved pairs stay in a chunk, and the sum of squares is chunk l's and chunk l + D / 16's
// xor-shuffle trees over the D / 16 lanes, then their sum: the pairwise tree over the D / 8
// chunks, as v3_row. The weight quad k and the rotary quad k serve both rows (half of v3_row's
// shared-memory reads per value). The same operations per value as v3_row<..., UNIFORM>.
// TQ_ROWS (session 23, the round-5 THREAD_K kernel: the lane's two rows are two tokens of one
// head): the rows have their own rotary quads, tq(k, r); else tq(k) serves both.
// WQ_ROWS (segmented weights in the THREAD_K kernel: two tokens, two weight rows): wq(k, r).
// GIVEN (NormScope::token, tuning `token_fast`): row r's inverse is given_r (its token's, over
// the token's H·D channels: token_norm_inv), no sum of squares; the norm is on.
template <int D, bool BF16, int ROPE, bool LEAN, bool TQ_ROWS = false, bool WQ_ROWS = false,
          bool GIVEN = false, typename WQ, typename TQ>
__device__ __forceinline__ void v4_row_pair(bool norm, float eps, WQ&& wq, TQ&& tq,
                                            const uint4 (&raw)[4], float (&v)[32],
                                            float given0 = 1.f, float given1 = 1.f) {
  constexpr int L2 = D / 16;
  float* x = v;
#pragma unroll
  for (int i = 0; i < 4; ++i) unpack<BF16>(raw[i], x + 8 * i);
  float inv[2];
  if constexpr (GIVEN) {
    inv[0] = given0, inv[1] = given1;
  } else {
    // Session 31 (as v3_row's uniform form): the squares, their trees and both rows' rsqrt
    // direct steps run whether or not there is a norm, and one rarely taken branch rewrites the
    // two scalars (no norm: 1, the weights are 1 too; outside the direct range: __frsqrt_rn).
    float p[4];  // p[2 r + i]: chunk i of row r
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = chunk_squares(x + 8 * i);
#pragma unroll
    for (int o = 1; o < L2; o <<= 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = __fadd_rn(p[i], __shfl_xor_sync(0xffffffffu, p[i], o));
    }
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ms[r] =
          __fadd_rn(__fmul_rn(__fadd_rn(p[2 * r], p[2 * r + 1]), 1.f / static_cast<float>(D)), eps);
      inv[r] = rsqrt_direct(ms[r]);
    }
    if (!norm || !rsqrt_direct_ok(ms[0]) || !rsqrt_direct_ok(ms[1])) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        inv[r] = !norm ? 1.f : rsqrt_direct_ok(ms[r]) ? inv[r] : __frsqrt_rn(ms[r]);
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float4 w;
    if constexpr (!WQ_ROWS) w = wq(k);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (WQ_ROWS) w = wq(k, r);
      const float wk[4] = {w.x, w.y, w.z, w.w};
      float* y = x + 16 * r + 4 * k;
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = __fmul_rn(__fmul_rn(y[e], inv[r]), wk[e]);
      if (LEAN && BF16) {
#pragma unroll
        for (int e = 0; e < 4; ++e) y[e] = round_bf16_hi(y[e]);
      } else {
        round_pair<BF16>(y[0], y[1]);
        round_pair<BF16>(y[2], y[3]);
      }
    }
  }
  auto rotate = [&](float c, float s, int lead, int trail) {
    const float y = x[lead], o = x[trail];
    v[lead] = __fmaf_rn(c, y, -__fmul_rn(s, o));
    v[trail] = __fmaf_rn(s, y, __fmul_rn(c, o));
  };
  if constexpr (ROPE != kRopeNone) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float4 t;
    if constexpr (!TQ_ROWS) t = tq(k);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if constexpr (TQ_ROWS) t = tq(k, r);
      if (ROPE == kRopePaired) {  // pairs 2k, 2k + 1 of the lane: values 2k (+1) lead, + 8 trail
        rotate(t.x, t.y, 16 * r + 2 * k, 16 * r + 2 * k + 8);
        rotate(t.z, t.w, 16 * r + 2 * k + 1, 16 * r + 2 * k + 9);
      } else {  // values 4k .. 4k + 3: two interleaved pairs
        rotate(t.x, t.y, 16 * r + 4 * k, 16 * r + 4 * k + 1);
        rotate(t.z, t.w, 16 * r + 4 * k + 2, 16 * r + 4 * k + 3);
      }
    }
  }
  }
}

// The round-5 mean's table row in shared memory: quad q ((cos, sin) of pairs 2q, 2q + 1) at quad
// position q ^ swz, so that the 8 lanes of a 16-byte load phase hit 8 distinct bank quads. Lane
// l's quad k is 4 l + k (paired: its pairs 8 l .. 8 l + 7) or 2 l + k, D / 8 + 2 l + k - 2
// (interleaved): paired, the lanes l and l + 2 would share banks (quads 64 bytes apart), fixed by
// xoring the quad with (q / 8) % 4 = l / 2; interleaved, lanes l and l + 4, fixed by (q / 8) % 2.
template <int ROPE>
__device__ __forceinline__ int pair_table_pos(int q) {
  return q ^ ((q >> 3) & (ROPE == kRopePaired ? 3 : 1));
}

template <bool LEAN = false>
__device__ __forceinline__ void quantize32(const float (&v)[32], float scale, uint32_t (&out)[8]) {
  quantize_n<32, LEAN>(v, scale, out);
}

// ---- norm_rope_quantize -----------------------------------------------------------------------
//
// CTA: `warps` warps own a tile of whole blocks (tile_rows = warps * RW rows, RW = 32 / LANES) of
// one (batch, tile) for a group of heads; each thread keeps one row for the whole head loop, with
// the x loads of the next kV3QuantPrefetch heads in flight (a register ring). Rows are placed
// group-major exactly as in the round-2 kernel (position p = warp * RW + slot holds row
// group_row(g, i) of block p / block, p % block = g * G + i): a scale group's G rows are in
// consecutive positions, in one warp (xor shuffles over LANES * G lanes) when G <= RW, else in
// wpg = G / RW consecutive warps (their maxima meet in shared memory behind a named barrier of
// those warps, double-buffered by head parity). The maximum is taken before sm_scale.
// Loop invariants live in shared memory (registers go to loads in flight): the weight quads and
// the thread's 16 rotary pairs (dynamic, [8 quads][threads] float4, private to the thread).

struct V3QuantLaunch {
  int tile_rows;   // rows of a CTA tile: whole blocks
  int group_rows;  // G: rows per scale group
  int wpg;         // warps per scale group (1: warp-local)
  int red_lanes;   // lanes of the in-warp max reduction: min(32, LANES * G)
  int head_group;  // heads per CTA
  int table_mode;
  bool mean_vec;   // mean rows 16-byte aligned: float4 loads
  bool reverse;    // tiles in reverse token order (blockIdx.y = 0 takes the last tile)
  bool redux;      // the group maximum by redux.sync (red_lanes 16, 32), else shuffles
  bool mean_smem;  // the head group's mean rows staged in shared memory (needs mean_vec)
  bool mean_ring;  // with mean_smem: a ring of kMeanRingRows rows, refilled
                   // kMeanRingChunk heads at a time behind a CTA barrier (no head-group cap)
  bool early;      // x / weight / table loads before griddepcontrol.wait (behind the mean pass)
  // Balanced grid (grids of at most kV3BalancedMaxRounds rounds, or kKnobBalanced): grid.x =
  // CTAs per batch item, blockIdx.y = 0; the first tiles - bal_r tiles take bal_q head groups
  // each, the last bal_r tiles bal_q + 1; heads split evenly in a tile (head_group = the largest
  // group). Else grid (head groups, tiles, batch).
  bool balanced;
  int tiles, bal_q, bal_r;
};

// This CTA's token tile (in walk order, before `reverse`), first head and head count.
__device__ __forceinline__ void quant_cta_work(const V3QuantLaunch& L, int64_t heads, int64_t& tile,
                                               int64_t& h0, int& count) {
  if (!L.balanced) {
    tile = blockIdx.y;
    h0 = static_cast<int64_t>(blockIdx.x) * L.head_group;
    count = static_cast<int>(heads - h0 < L.head_group ? heads - h0 : L.head_group);
    return;
  }
  // 32-bit unsigned math: (bal_q + 1) * heads and the CTA count fit (checked on the host).
  const uint32_t c = blockIdx.x, q = L.bal_q, first = L.tiles - L.bal_r;
  const uint32_t small = first * q;  // CTAs of the tiles with bal_q groups
  uint32_t t, j, n;
  if (c < small) {
    t = c / q, j = c - t * q, n = q;
  } else {
    const uint32_t c2 = c - small, k = c2 / (q + 1);
    t = first + k, j = c2 - k * (q + 1), n = q + 1;
  }
  const uint32_t hb = j * static_cast<uint32_t>(heads) / n;
  const uint32_t he = (j + 1) * static_cast<uint32_t>(heads) / n;
  tile = t, h0 = hb, count = static_cast<int>(he - hb);
}

// The maximum of m (|v|'s maximum: sign bit clear; a NaN is max.NaN's canonical 0x7fffffff) over
// the lane's scale group of `lanes` = 32 or 16 consecutive lanes, by redux.sync on the bit
// patterns: as unsigned integers their order is the float order with NaN above +inf, so the
// integer maximum gives the same bits. 16: one redux per half-warp, the other half contributing 0.
__device__ __forceinline__ float redux_group_max(float m, int lanes, int lane) {
  const uint32_t bits = __float_as_uint(m);
  if (lanes == 32) return __uint_as_float(__reduce_max_sync(0xffffffffu, bits));
  const bool upper = (lane & 16) != 0;
  const uint32_t lo = __reduce_max_sync(0xffffffffu, upper ? 0u : bits);
  const uint32_t hi = __reduce_max_sync(0xffffffffu, upper ? bits : 0u);
  return __uint_as_float(upper ? hi : lo);
}

// The PDL wait (unless `early`), this CTA's work (its tile reversed with L.reverse) and the
// thread's row at position `pos` of the tile, with the pointers at the CTA's first head.
__device__ __forceinline__ QuantRow quant_cta_row(const PrologueArgs& a, const V3QuantLaunch& L,
                                                  int pos, int group_rows, bool first_lane,
                                                  int& count, int64_t* first_head = nullptr) {
  if (!L.early) griddep_wait();
  int64_t tile, h0;
  quant_cta_work(L, a.heads, tile, h0, count);
  if (first_head) *first_head = h0;
  if (L.reverse) tile = L.tiles - 1 - tile;
  return quant_row(a, blockIdx.z, tile * L.tile_rows + pos, group_rows, h0, first_lane);
}

// Mean rows a quantize CTA stages in shared memory (with mean_smem).
__host__ __device__ inline int mean_sh_rows(const V3QuantLaunch& L) {
  return L.mean_ring && L.head_group > kMeanRingRows ? kMeanRingRows : L.head_group;
}

// One refill of the quantize kernels' mean ring: heads h1 .. h1 + kMeanRingChunk - 1 (those
// below count) into ring rows base .. (QR float4 each), thread (rr, rq) copying float4 rq of
// row rr (cp.async, in the caller's commit group); pos(q) places quad q in its row.
template <int QR, typename Pos>
__device__ __forceinline__ void mean_ring_copy(uint32_t mean0, int base, int rr, int rq, int h1,
                                               int count, const float* m, int m_sh, Pos&& pos) {
  const int rows = count - h1 < kMeanRingChunk ? count - h1 : kMeanRingChunk;
  if (rr < rows)
    ptx::cp_async16(mean0 + sizeof(float4) * ((base + rr) * QR + pos(rq)),
                    m + (h1 + rr) * m_sh + 4 * rq);
}

// The cp.async ring: AHEAD heads ahead in AHEAD + 1 shared-memory slots per thread.
// LEAN (bf16): the same bits with fewer instructions per row (round_bf16_hi, rcp_approx for the
// reciprocal of the scale and for 1/127: div.full(m, 127) = m * rcp(127)); GPU run 6: bits equal
// to the non-lean kernel's on every bench output.
// THREADS > 0 (the default for 4-warp CTAs; tuning `quant_tight`): the CTA's thread count is a
// compile-time constant, so every shared-memory address of the ring and the rotary pairs is one
// register plus an immediate; the ring slot, the x / q / scale pointers and the mean row advance
// by running offsets (no per-head u % 3, u * stride products); the 2-warp teams take barrier ids
// 1 / 2 by one compare; v3_row's norm is branch-free (UNIFORM). The same arithmetic, value for
// value: the same bits.
// SG > 0 (session 11, the default where it applies; needs THREADS): the scale group's rows
// G = SG are a compile-time constant, and with them the warps per group, the lanes of the in-warp
// maximum and whether a mean is subtracted (SG = kSpecKRows: the mean rows in shared memory, the
// THREAD_K 64 form; SG = kSpecQRows: no mean, the THREAD_Q 32 form); the host launches it only
// for a launch of exactly that shape with redux and scale_eps >= 0. No runtime dispatch on them
// in the head loop; the ring slots as shared addresses, a one-copy mean-ring refill; the codes by
// quantize32_fq (no float-to-int conversions).
// AHEAD_ (session 16): the ring's heads ahead; 1 only for the specialized q form (the mean
// ring's refill rides on 3-slot rings).
// SIGNED (session 16): the specialized form's codes by quantize_fqs_n (the sign in the magic
// number), else quantize32_fq; the same codes.
template <int D, bool BF16, int ROPE, int THREADS = 0, int SG = 0, int AHEAD_ = kV3Async96Ahead,
          bool SIGNED = false>
__device__ __forceinline__ void v3_quantize_body(const PrologueArgs& a, const V3QuantLaunch& L) {
  constexpr bool TIGHT = THREADS > 0;
  constexpr bool SPEC = SG > 0;
  static_assert(!SPEC || TIGHT, "SG: the tight form only");
  constexpr int AHEAD = AHEAD_;
  static_assert(AHEAD == kV3Async96Ahead || (SPEC && SG == kSpecQRows),
                "AHEAD: other rings only for the specialized q form");
  constexpr bool LEAN = BF16;
  constexpr int SLOTS = AHEAD + 1;
  constexpr int LANES = D / 32, RW = 32 / LANES;
  // SPEC: warps per scale group, lanes of the in-warp maximum, a mean (in shared memory).
  constexpr int S_WPG = SG > RW ? SG / RW : 1;
  constexpr int S_RL = LANES * SG < 32 ? LANES * SG : 32;
  constexpr bool S_MEAN = SG == kSpecKRows;
  static_assert(!SPEC || SG == kSpecKRows || SG == kSpecQRows, "SG: the two library layouts");
  // Dynamic shared memory: the x ring [SLOTS][4 chunks][blockDim.x] uint4 (each
  // thread's own slots), then (rope) [8][blockDim.x] float4: this thread's rotary pairs, then
  // (mean_smem) [head_group or, mean_ring, kMeanRingRows][D / 4] float4: the CTA's mean rows, then
  // [2][kV3MaxWarps] floats:
  // the warps' group maxima (dynamic, so that static shared memory does not take the room the
  // mean rows need: 7 -> 8 heads per CTA at 5 CTAs per SM).
  extern __shared__ float4 dyn_sh[];
  float4* t_sh = dyn_sh + SLOTS * 4 * blockDim.x;
  float4* mean_sh = t_sh + (ROPE != kRopeNone ? 8 * blockDim.x : 0);
  float(*red)[kV3MaxWarps] = reinterpret_cast<float(*)[kV3MaxWarps]>(
      mean_sh + (L.mean_smem ? mean_sh_rows(L) * (D / 4) : 0));
  __shared__ float4 w_sh[8][LANES];
  const int threads = TIGHT ? THREADS : static_cast<int>(blockDim.x);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int slot = lane / LANES, lane_in_row = lane % LANES;
  // Launched with PDL (tuning `quant_pdl`): nothing is read before the previous kernel in the
  // stream has completed (quant_cta_row's wait; a no-op without the attribute). `early` (the
  // fused k path, i.e. behind the mean pass of the same x): the wait comes before the first read
  // of the mean instead.
  const int64_t b = blockIdx.z;
  int count;
  // This thread's row for the whole head loop.
  // Position P in the (padded) token order of whole blocks: a tile is whole blocks, or (knob
  // `split_blocks`) whole scale groups of one block.
  const int p = warp * RW + slot;
  // Pointers at head h0; head offsets fit in 32 bits (checked on the host).
  const QuantRow row = quant_cta_row(a, L, p, L.group_rows, lane_in_row == 0, count);

  // row.ok as an opaque 32-bit flag (session 31): ptxas otherwise derives it again at every head
  // from the 64-bit token index, two registers that occ6's 80 spill and reload.
  uint32_t ok_flag;
  asm volatile("mov.b32 %0, %1;" : "=r"(ok_flag) : "r"(static_cast<uint32_t>(row.ok)));
  const bool row_ok = ok_flag != 0;
  const float4 wq = v3_weight_quad<D>(a, tid);  // blockDim >= 128 >= 8 * LANES
  float tcs[16], tsn[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) tcs[i] = 1.f, tsn[i] = 0.f;
  if (ROPE != kRopeNone && row.ok)
    v3_table_row<D, ROPE>(a, L.table_mode, r_item(a, b) + row.n * a.r_sn, lane_in_row, tcs, tsn);
  auto start = [&] {
    v3_store_weight_quad<D>(tid, wq, &w_sh[0][0]);
    if (ROPE != kRopeNone) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        t_sh[k * threads + tid] =
            make_float4(tcs[2 * k], tsn[2 * k], tcs[2 * k + 1], tsn[2 * k + 1]);
    }
    __syncthreads();
  };
  const int x_sh = static_cast<int>(a.x_sh), q_sh = static_cast<int>(a.q_sh);
  const int s_sh = static_cast<int>(a.s_sh), m_sh = static_cast<int>(a.m_sh);
  const int team = warp / (SPEC ? S_WPG : L.wpg), team_first = team * (SPEC ? S_WPG : L.wpg);
  const int team_threads = 32 * (SPEC ? S_WPG : L.wpg);
  const bool scaled = a.sm_scale != 1.f;  // x * 1 is exact: skipping it changes no bit
  const float abs_sm = fabsf(a.sm_scale);
  const int c0 = 8 * lane_in_row;  // channel of chunk i: c0 + 8 * LANES * i
  const int red_mask = (SPEC ? S_RL : L.red_lanes) - 1;  // red_lanes is a power of two
  const float rcp127 = rcp_approx(127.f);  // LEAN: div.full(m, 127) = m * rcp(127)

  // mean_smem: stage the mean rows of the CTA's heads once (before `start`'s barrier, after the
  // first x loads are issued); the PDL wait (early) comes before the first mean read.
  auto stage_mean = [&] {
    if (L.early) griddep_wait();
    if (!L.mean_smem || !row.m) return;
    constexpr int QR = D / 4;  // float4 per mean row
    const int rows = L.mean_ring && count > kMeanRingRows ? kMeanRingRows : count;
    for (int e = tid; e < rows * QR; e += threads)
      mean_sh[e] = __ldg(reinterpret_cast<const float4*>(row.m + (e / QR) * m_sh) + e % QR);
  };
  // TIGHT: head u's mean row in mean_sh, q and scale pointers, advanced by the head loop.
  int mrow = 0;
  int8_t* qcur = row.q + c0;
  float* scur = row.s;
  auto proc = [&](int u, const uint4(&r)[4]) {
    float v[32];
    v3_row<D, BF16, ROPE, LEAN, TIGHT>(
        a.norm, a.eps, [&](int k) { return lds16(&w_sh[k][lane_in_row]); },
        [&](int k) { return lds16(&t_sh[k * threads + tid]); }, r, v);
    if ((SPEC && S_MEAN) || (!SPEC && row.m && L.mean_smem)) {
      // Quad k: values 4k .. 4k + 3 = channels c0 + 8 LANES (k / 2) + 4 (k & 1); the 4 distinct
      // addresses of a warp are 32 bytes apart (no bank conflict), the row slots broadcast.
      const int mr = TIGHT ? mrow : L.mean_ring ? u % kMeanRingRows : u;
      const float4* mq = mean_sh + mr * (D / 4) + 2 * lane_in_row;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float4 t = lds16(mq + 2 * LANES * (k / 2) + (k & 1));
        v[4 * k] = __fsub_rn(v[4 * k], t.x);
        v[4 * k + 1] = __fsub_rn(v[4 * k + 1], t.y);
        v[4 * k + 2] = __fsub_rn(v[4 * k + 2], t.z);
        v[4 * k + 3] = __fsub_rn(v[4 * k + 3], t.w);
      }
    } else if (!SPEC && row.m) {
      const float* m = row.m + u * m_sh + c0;
      float mv[32];
      if (L.mean_vec) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float4 t = ldg16_l1(m + 8 * LANES * (k / 2) + 4 * (k & 1));
          mv[4 * k] = t.x, mv[4 * k + 1] = t.y, mv[4 * k + 2] = t.z, mv[4 * k + 3] = t.w;
        }
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) mv[j] = __ldg(m + 8 * LANES * (j / 8) + (j & 7));
      }
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = __fsub_rn(v[j], mv[j]);
    }
    // Rows past N are zero (never -mean): they add 0 to the maximum and store nothing.
    // Four independent chains (one per chunk), then a tree: max of |v| is exact in any order,
    // and the dependent chain is 8 + 2 long instead of 32.
    float t[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      t[i] = fabsf(v[8 * i]);
#pragma unroll
      for (int j = 1; j < 8; ++j) t[i] = max_nan(t[i], fabsf(v[8 * i + j]));
    }
    float m = row_ok ? max_nan(max_nan(t[0], t[1]), max_nan(t[2], t[3])) : 0.f;
    if (SPEC || L.redux) {
      // 32 or 16 lanes: redux_group_max; fewer: the shuffle levels below red_lanes only.
      const int rl = SPEC ? S_RL : L.red_lanes;
      if (rl == 32) {
        m = redux_group_max(m, 32, lane);
      } else if (rl == 16) {
        m = redux_group_max(m, 16, lane);
      } else {
#pragma unroll
        for (int o = 1; o < 16; o <<= 1)
          if (o < (SPEC ? S_RL : L.red_lanes)) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
      }
    } else {
      // Branch-free: the levels past red_lanes shuffle with lane mask 0 (the lane itself).
#pragma unroll
      for (int o = 1; o < 32; o <<= 1)
        m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o & red_mask));
    }
    if ((SPEC ? S_WPG : L.wpg) > 1) {
      const int par = u & 1;
      if (lane == 0) red[par][warp] = m;
      if constexpr (TIGHT) {  // 4 warps: teams 0, 1 of 2 warps or team 0 of 4, ids immediate
        static_assert(THREADS == 128, "TIGHT: 4-warp CTAs");
        if (team == 0)
          team_barrier(0, team_threads);
        else
          team_barrier(1, team_threads);
        m = red[par][team_first];
#pragma unroll
        for (int k = 1; k < 4; ++k)
          if (k < (SPEC ? S_WPG : L.wpg)) m = max_nan(m, red[par][team_first + k]);
      } else {
        team_barrier(team, team_threads);
        m = red[par][team_first];
        for (int k = 1; k < L.wpg; ++k) m = max_nan(m, red[par][team_first + k]);
      }
    }
    // The specialized q form multiplies by sm_scale unconditionally (x * 1 is exact, and a NaN
    // comes out of the codes' arithmetic as the same canonical NaN): no predicate or branch.
    constexpr bool ALWAYS_SCALED = SPEC && !S_MEAN;
    if (ALWAYS_SCALED || scaled) m = __fmul_rn(m, abs_sm);
    const float scale =
        __fadd_rn(LEAN ? __fmul_rn(m, rcp127) : div_full(m, 127.f), a.scale_eps);
    if (row.writer) *(TIGHT ? scur : row.s + u * s_sh) = scale;
    if (!row_ok) return;
    if (ALWAYS_SCALED || scaled) {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = __fmul_rn(v[j], a.sm_scale);
    }
    uint32_t packed[8];
    if constexpr (SPEC && SIGNED)
      quantize_fqs_n<32, LEAN>(v, scale, packed);
    else if constexpr (SPEC)
      quantize32_fq<LEAN>(v, scale, packed);
    else
      quantize32<LEAN>(v, scale, packed);
    int8_t* q = TIGHT ? qcur : row.q + u * q_sh + c0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<uint2*>(q + 8 * LANES * i) = make_uint2(packed[2 * i], packed[2 * i + 1]);
  };
  {
    // cp.async ring: the loads of heads u+1 .. u+AHEAD go straight to this thread's shared-memory
    // slots (no registers held), one commit group per head (empty past the end, so that
    // wait_group AHEAD always means "head u has landed"); rows past N read token 0's row (in
    // bounds, never stored). A slot is refilled only after the previous head's values were read
    // back into registers and used (in-order issue).
    uint4* ring = reinterpret_cast<uint4*>(dyn_sh);
    auto issue = [&](int u) {
      const uint16_t* px = row.x + u * x_sh + c0;
      uint4* dst = ring + (u % SLOTS) * 4 * threads + tid;
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async16(dst + i * threads, px + 8 * LANES * i);
    };
#pragma unroll
    for (int k = 0; k < AHEAD; ++k) {
      if (k < count) issue(k);
      cp_async_commit();
    }
    stage_mean();
    start();
    // mean_ring: at head u = k * kMeanRingChunk (k >= 1) every thread is done with heads < u
    // (the barrier), so heads u + kMeanRingChunk .. + 2 kMeanRingChunk - 1 go into the rows that
    // held heads u - kMeanRingChunk ..; they travel in head u's commit group, which every thread
    // has waited for before the barrier at head u + kMeanRingChunk (kMeanRingChunk > AHEAD), so
    // that barrier makes them visible to the CTA.
    static_assert(kMeanRingRows == 2 * kMeanRingChunk);
    constexpr int QR = D / 4;  // float4 per mean row
    auto refill_mean = [&](int u) {
      __syncthreads();
      const int h1 = u + kMeanRingChunk;
      const int rows = count - h1 < kMeanRingChunk ? count - h1 : kMeanRingChunk;
      for (int e = tid; e < rows * QR; e += threads)
        cp_async16(mean_sh + ((h1 + e / QR) % kMeanRingRows) * QR + e % QR,
                   row.m + (h1 + e / QR) * m_sh + 4 * (e % QR));
    };
    const bool refills = L.mean_ring && row.m && count > kMeanRingRows && (!SPEC || S_MEAN);
    if constexpr (TIGHT) {
      // Byte offsets of the slots from this thread's slot 0: 0, SB, .., (SLOTS - 1) SB; head
      // u + AHEAD goes into the slot head u - 1 used (SLOTS = AHEAD + 1). The mean ring refills
      // where u % kMeanRingChunk == 0, i.e. where head u's slot is slot 0.
      static_assert(kMeanRingChunk == SLOTS || AHEAD != kV3Async96Ahead,
                    "TIGHT: refills at slot 0 (the 3-slot rings; others never refill)");
      constexpr uint32_t SB = 4 * THREADS * sizeof(uint4), LAST = (SLOTS - 1) * SB;
      const uint32_t ring0 = ptx::smem_u32(ring + tid);
      const uint16_t* nx = row.x + AHEAD * x_sh + c0;  // the next head to issue (after `issue`'s)
      // Head nx's four chunks into the slot at dst (the callers advance nx).
      auto copy_at = [&](uint32_t dst) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          ptx::cp_async16(dst + i * THREADS * sizeof(uint4), nx + 8 * LANES * i);
      };
      if constexpr (SPEC) {
        // The slots as shared addresses: head u reads `rd`, head u + AHEAD lands in `wr` (the
        // slot head u - 1 read). The mean ring's refill at head u (u % kMeanRingChunk == 0, i.e.
        // rd at slot 0) fills rows (mrow + kMeanRingChunk) % kMeanRingRows + r, r < 3: one
        // 16-byte copy per thread at most (3 rows of D / 4 float4 <= THREADS).
        static_assert(kMeanRingChunk * (D / 4) <= THREADS, "SPEC: one refill copy per thread");
        const uint32_t first = ring0, last = ring0 + LAST;
        uint32_t rd = first, wr = last;
        const uint32_t xb = 2u * static_cast<uint32_t>(x_sh), qb = static_cast<uint32_t>(q_sh),
                       sb = 4u * static_cast<uint32_t>(s_sh);
        const uint32_t mean0 = ptx::smem_u32(mean_sh);
        constexpr int QR = D / 4;
        const int rr = tid / QR, rq = tid % QR;  // the refill row and float4 of this thread
#pragma unroll 1
        for (int u = 0; u < count; ++u) {
          if (S_MEAN && refills && u > 0 && rd == first) {
            __syncthreads();
            mean_ring_copy<QR>(mean0, mrow == 0 ? kMeanRingChunk : 0, rr, rq, u + kMeanRingChunk,
                               count, row.m, m_sh, [](int q) { return q; });
          }
          // The pointers advance by unsigned 32-bit byte steps (the host keeps every stride in
          // [0, 2^30 / heads)): no sign word to hold, and nx advances whether or not it issues.
          if (u + AHEAD < count) copy_at(wr);
          nx = bump(nx, xb);
          cp_async_commit();
          cp_async_wait<AHEAD>();
          uint4 r[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) r[i] = lds16u(rd + i * THREADS * sizeof(uint4));
          proc(u, r);
          if constexpr (SLOTS == 2) {  // the two slots trade places: one XOR each
            rd ^= first ^ last;
            wr ^= first ^ last;
          } else {
            wr = rd;
            rd = rd == last ? first : rd + SB;
          }
          // (Wraps only in the ring: staged rows without it are the whole head group, which
          // the cap lets exceed kMeanRingRows; session 23 fixed a wrap here that read head 0's
          // mean for head 6 with mean_smem = kMeanSmemOn and 7 heads per CTA.)
          if (S_MEAN) mrow = L.mean_ring && mrow == kMeanRingRows - 1 ? 0 : mrow + 1;
          qcur = bump(qcur, qb);
          scur = bump(scur, sb);
        }
        return;
      }
      uint32_t cur = 0;
#pragma unroll 1
      for (int u = 0; u < count; ++u) {
        if (refills && u > 0 && cur == 0) refill_mean(u);
        if (u + AHEAD < count) {
          copy_at(ring0 + (cur == 0 ? LAST : cur - SB));
          nx += x_sh;
        }
        cp_async_commit();
        cp_async_wait<AHEAD>();
        uint4 r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) r[i] = lds16u(ring0 + cur + i * THREADS * sizeof(uint4));
        proc(u, r);
        cur = cur == LAST ? 0 : cur + SB;
        mrow = L.mean_ring && mrow == kMeanRingRows - 1 ? 0 : mrow + 1;
        qcur += q_sh;
        scur += s_sh;
      }
    } else {
#pragma unroll 1
      for (int u = 0; u < count; ++u) {
        if (refills && u > 0 && u % kMeanRingChunk == 0) refill_mean(u);
        if (u + AHEAD < count) issue(u + AHEAD);
        cp_async_commit();
        cp_async_wait<AHEAD>();
        const uint4* src = ring + (u % SLOTS) * 4 * threads + tid;
        uint4 r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) r[i] = lds16u(src + i * threads);
        proc(u, r);
      }
    }
  }
}

// The quantize kernel: the cp.async ring 2 heads ahead held to 96 registers (5 CTAs of 4 warps
// per SM at D = 128: 41 KB of shared memory each, 20 warps per SM).
// THREADS: 128 (4-warp CTAs, the tight form: the default), or 0 (blockDim.x: other CTA sizes,
// and 4-warp CTAs with quant_tight = kTightOff); SG: the specialized tight form (the default for
// the two library layouts; quant_tight = kTightPlain: SG = 0).
// SIGNED (session 16, SG > 0 only): the codes by quantize_fqs_n.
template <int D, bool BF16, int ROPE, int THREADS, int SG = 0, bool SIGNED = false>
__global__ void __maxnreg__(kV3Async96Regs)
    v3_quantize_kernel_r96(const PrologueArgs a, const V3QuantLaunch L) {
  v3_quantize_body<D, BF16, ROPE, THREADS, SG, kV3Async96Ahead, SIGNED>(a, L);
}

// Session 16 (tuning `quant_occ6`): the specialized q form (SG = kSpecQRows) held to
// kV3Occ6Regs registers (3 values spilled to local memory, 8-16 bytes of stack) with its x ring
// kV3Occ6Ahead head ahead (2 slots: 32 KB of dynamic shared memory per 4-warp CTA at D = 128
// instead of 40), so that 6 CTAs fit an SM instead of 5: 24 warps to hide the per-row latency
// chain, and a single-wave grid of 792 CTAs at Flux whose longest CTAs carry 5 heads instead of
// 6. The same arithmetic, value for value: the same bits.
template <int D, bool BF16, int ROPE, bool SIGNED>
__global__ void __maxnreg__(kV3Occ6Regs)
    v3_quantize_kernel_occ6(const PrologueArgs a, const V3QuantLaunch L) {
  v3_quantize_body<D, BF16, ROPE, kTightThreads, kSpecQRows, kV3Occ6Ahead, SIGNED>(a, L);
}

// The round-5 k kernel's per-group tail (SPEC §1): |v|'s maximum over a row's 16 values (four
// chains of 4, then a tree: exact in any order), the scale from the group's maximum m (taken
// before sm_scale) and the codes of N values times sm_scale (x * 1 is exact: `scaled` false skips
// it, changing no bit). (The round-5 q kernel has the same steps inline: written with these, its
// PTX changed, so it stays as measured until a GPU check.)
__device__ __forceinline__ float abs_max16(const float* y) {
  float t[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    t[i] = fabsf(y[4 * i]);
#pragma unroll
    for (int j = 1; j < 4; ++j) t[i] = max_nan(t[i], fabsf(y[4 * i + j]));
  }
  return max_nan(max_nan(t[0], t[1]), max_nan(t[2], t[3]));
}
template <bool LEAN>
__device__ __forceinline__ float group_scale(const PrologueArgs& a, float m, bool scaled,
                                             float abs_sm, float rcp127) {
  if (scaled) m = __fmul_rn(m, abs_sm);
  return __fadd_rn(LEAN ? __fmul_rn(m, rcp127) : div_full(m, 127.f), a.scale_eps);
}
template <int N, bool LEAN, bool SIGNED>
__device__ __forceinline__ void scaled_codes(const PrologueArgs& a, bool scaled, float scale,
                                             float* v, uint32_t* packed) {
  if (scaled) {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = __fmul_rn(v[j], a.sm_scale);
  }
  if constexpr (SIGNED)
    quantize_fqs_n<N, LEAN>(v, scale, packed);
  else
    quantize_fq_n<N, LEAN>(v, scale, packed);
}

// The round-5 quantize kernels' loop invariants into shared memory, then the CTA barrier: the
// weight quads (threads < D / 4: pair_weight_quad's) and this thread's QUADS rotary quads (quad
// k = (cos, sin) of its pairs 2 k, 2 k + 1) at t_sh[k * THREADS + tid].
template <int D, int ROPE, int QUADS, int THREADS, int NW = D / 4>
__device__ __forceinline__ void pair_store_invariants(int tid, float4 wq, float4* w_sh,
                                                      float4* t_sh, const float* tcs,
                                                      const float* tsn) {
  if (tid < NW) w_sh[tid] = wq;
  if (ROPE != kRopeNone) {
#pragma unroll
    for (int k = 0; k < QUADS; ++k)
      t_sh[k * THREADS + tid] = make_float4(tcs[2 * k], tsn[2 * k], tcs[2 * k + 1], tsn[2 * k + 1]);
  }
  __syncthreads();
}

// ---- norm_rope_quantize, round 5: two rows per lane (THREAD_Q groups of kSpecQRows rows) --------
//
// The specialized tight q kernel (SG = kSpecQRows, no mean) in the round-5 mean kernel's layout
// (session 14, tuning `quant_pair`): a lane holds two heads of its token (heads 2 v, 2 v + 1 of
// the CTA's head group at step v) as 16 values each, chunks l and l + D / 16 of D / 16 lanes per
// row (v4_row_pair), so the weight and rotary quads it reads from shared memory per step serve
// both heads: 4 + 4 quads per 32 values instead of v3's 8 + 8. A warp holds 32 / (D / 16) tokens
// (4 at D = 128), a scale group of kSpecQRows tokens is D / 16 x 4 lanes (the whole warp at
// D = 128, a half-warp at D = 64: one redux each), the CTA tile kSpecQRows-row groups of one
// block (4 warps). Per value the same operations as the round-3 kernel: the same bits.
// SIGNED (session 16): the codes by quantize_fqs_n.
// SEG (session 39): segmented weights, the token's row (the lane's two rows are two heads of one
// token: one weight row) at an offset into kSegRows rows of quads.
// TOKEN (session 45, tuning `token_fast`): NormScope::token; both rows take the token's inverse
// (a.token_inv, read once) and their own head's weight quads from a.token_w (f32, L1-resident;
// the same quads pair_weight_quad would stage): the norm output the staged path writes, in
// registers.
template <int D, bool BF16, int ROPE, bool SIGNED, bool SEG = false, bool TOKEN = false>
__global__ void __maxnreg__(kV3Async96Regs)
    v5_quantize_pair_kernel(const PrologueArgs a, const V3QuantLaunch L) {
  constexpr int THREADS = kTightThreads, AHEAD = kV3Async96Ahead, SLOTS = AHEAD + 1;
  constexpr bool LEAN = BF16;
  constexpr int LANES = D / 16, RW = 32 / LANES;
  constexpr int RL = LANES * kSpecQRows < 32 ? LANES * kSpecQRows : 32;  // lanes of a group
  static_assert(RL == 16 || RL == 32, "a group is a half-warp or a warp");
  // Dynamic shared memory: the x ring [SLOTS][4][THREADS] uint4 (chunks l, l + D / 16 of the
  // step's two heads), then (rope) [4][THREADS] float4: this thread's rotary quads.
  extern __shared__ float4 dyn_sh[];
  float4* t_sh = dyn_sh + SLOTS * 4 * THREADS;
  constexpr int NW = (SEG ? kSegRows : 1) * (D / 4);
  __shared__ float4 w_sh[NW];  // pair_weight_quad's quads: [row][k][l] at row D / 4 + k LANES + l
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int slot = lane / LANES, lane_in_row = lane % LANES;
  const int64_t b = blockIdx.z;
  int count;
  int64_t h0 = 0;
  const QuantRow row =
      quant_cta_row(a, L, warp * RW + slot, kSpecQRows, lane_in_row == 0, count, &h0);
  const float4 wq = pair_weight_quad<D, SEG>(a, tid);
  const int woff = seg_quad_offset<D, SEG>(a, b, row.n, row.ok);
  // TOKEN: the token's inverse (its heads' weight quads: token_weight_quad)
  const float tinv = TOKEN && row.ok ? __ldg(a.token_inv + b * a.tokens + row.n) : 1.f;
  // The lane's rotary pairs: paired 8 l .. 8 l + 7, interleaved 4 l .. 4 l + 3 and D / 4 + 4 l ..;
  // quad k = (cos, sin) of its pairs 2k, 2k + 1.
  float tcs[8], tsn[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) tcs[i] = 1.f, tsn[i] = 0.f;
  if (ROPE != kRopeNone && row.ok) {
    const int64_t off = r_item(a, b) + row.n * a.r_sn;
    const int p0 = ROPE == kRopePaired ? 8 * lane_in_row : 4 * lane_in_row;
    load_table4(a, L.table_mode, off, p0, tcs, tsn);
    load_table4(a, L.table_mode, off, ROPE == kRopePaired ? p0 + 4 : D / 4 + p0, tcs + 4, tsn + 4);
  }
  const int x_sh = static_cast<int>(a.x_sh), q_sh = static_cast<int>(a.q_sh);
  const int s_sh = static_cast<int>(a.s_sh);
  const bool scaled = a.sm_scale != 1.f;  // x * 1 is exact: skipping it changes no bit
  const float abs_sm = fabsf(a.sm_scale);
  const int c0 = 8 * lane_in_row;  // channel of the lane's first chunk (the second: + D / 2)
  const float rcp127 = rcp_approx(127.f);
  const int steps = (count + 1) / 2;  // head pairs (an odd count: the last pair's second head
                                      // re-reads the first and stores nothing)
  constexpr uint32_t SB = 4 * THREADS * sizeof(uint4);
  const uint32_t ring0 = ptx::smem_u32(dyn_sh) + tid * sizeof(uint4);
  const uint16_t* nx = row.x + c0;  // the first head of the next pair to issue
  int issued = 0;
  auto issue_at = [&](uint32_t dst) {
    const uint16_t* second = nx + (2 * issued + 1 < count ? x_sh : 0);
    ptx::cp_async16(dst, nx);
    ptx::cp_async16(dst + THREADS * sizeof(uint4), nx + D / 2);
    ptx::cp_async16(dst + 2 * THREADS * sizeof(uint4), second);
    ptx::cp_async16(dst + 3 * THREADS * sizeof(uint4), second + D / 2);
    nx += 2 * x_sh;
    ++issued;
  };
#pragma unroll
  for (int k = 0; k < AHEAD; ++k) {
    if (k < steps) issue_at(ring0 + k * SB);
    cp_async_commit();
  }
  if (L.early) griddep_wait();  // (forced early: after the first x loads, as the round-3 kernel)
  pair_store_invariants<D, ROPE, 4, THREADS, NW>(tid, wq, w_sh, t_sh, tcs, tsn);
  int8_t* qcur = row.q + c0;
  float* scur = row.s;
  const uint32_t first = ring0, last = ring0 + (SLOTS - 1) * SB;
  uint32_t rd = first, wr = last;
#pragma unroll 1
  for (int v = 0; v < steps; ++v) {
    if (v + AHEAD < steps) issue_at(wr);
    cp_async_commit();
    cp_async_wait<AHEAD>();
    uint4 r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = lds16u(rd + i * THREADS * sizeof(uint4));
    float x[32];
    if constexpr (TOKEN) {
      // heads 2 v, 2 v + 1 of the group (an odd count's last pair: the first twice)
      const int64_t ha = h0 + 2 * v, hb = 2 * v + 1 < count ? ha + 1 : ha;
      v4_row_pair<D, BF16, ROPE, LEAN, false, true, true>(
          true, a.eps,
          [&](int k, int rw) { return token_weight_quad<D>(a, rw ? hb : ha, k, lane_in_row); },
          [&](int k) { return lds16(&t_sh[k * THREADS + tid]); }, r, x, tinv, tinv);
    } else {
      v4_row_pair<D, BF16, ROPE, LEAN>(
          a.norm, a.eps, [&](int k) { return lds16(&w_sh[woff + k * LANES + lane_in_row]); },
          [&](int k) { return lds16(&t_sh[k * THREADS + tid]); }, r, x);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (2 * v + h >= count) break;  // (CTA-uniform)
      float* y = x + 16 * h;
      // |y|'s maximum: four chains of 4, then a tree (exact in any order); rows past N: 0
      float t[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        t[i] = fabsf(y[4 * i]);
#pragma unroll
        for (int j = 1; j < 4; ++j) t[i] = max_nan(t[i], fabsf(y[4 * i + j]));
      }
      float m = redux_group_max(
          row.ok ? max_nan(max_nan(t[0], t[1]), max_nan(t[2], t[3])) : 0.f, RL, lane);
      if (scaled) m = __fmul_rn(m, abs_sm);
      const float scale =
          __fadd_rn(LEAN ? __fmul_rn(m, rcp127) : div_full(m, 127.f), a.scale_eps);
      if (row.writer) scur[h * s_sh] = scale;
      if (!row.ok) continue;
      if (scaled) {
#pragma unroll
        for (int j = 0; j < 16; ++j) y[j] = __fmul_rn(y[j], a.sm_scale);
      }
      uint32_t packed[4];
      if constexpr (SIGNED)
        quantize_fqs_n<16, LEAN>(y, scale, packed);
      else
        quantize_fq_n<16, LEAN>(y, scale, packed);
      int8_t* q = qcur + h * q_sh;
      *reinterpret_cast<uint2*>(q) = make_uint2(packed[0], packed[1]);
      *reinterpret_cast<uint2*>(q + D / 2) = make_uint2(packed[2], packed[3]);
    }
    wr = rd;
    rd = rd == last ? first : rd + SB;
    qcur += 2 * q_sh;
    scur += 2 * s_sh;
  }
}

// ---- norm_rope_quantize, round 5 for THREAD_K: two tokens per lane (session 23) --------------
//
// The specialized k kernel (SG = kSpecKRows: THREAD_K groups of 16 rows, the mean rows in
// shared memory; tuning `quant_kpair`) in the round-5 lane layout: a lane holds the two tokens of
// a THREAD_K row pair (rows 2 j, 2 j + 1 of a group: adjacent tokens) of one head as 16 values
// each, chunks l and l + D / 16 of D / 16 lanes per row (v4_row_pair with per-row rotary quads).
// The weight quads and the head's mean quads it reads from shared memory per head serve both
// rows: 4 + 4 per 32 values instead of round 3's 8 + 8 (the rotary quads stay 8: one set per
// token). A warp holds 2 * 32 / (D / 16) rows (8 at D = 128: a scale group is 2 warps, their
// maxima meeting in shared memory behind a named barrier as in round 3; 16 at D = 64: one warp),
// the CTA tile 4 warps; the head loop, the x ring (one head per step) and the mean ring are round
// 3's. The mean rows sit in shared memory with their quads swizzled (quad q at q ^ ((q / 8) & 1)
// at D = 128) so that the 8 lanes of a row, 32 bytes apart, hit 8 distinct bank quads. Per value
// the same operations as the round-3 kernel: the same bits.
template <int D>
__device__ __forceinline__ int kpair_mean_pos(int q) {
  return D == 128 ? q ^ ((q >> 3) & 1) : q;
}
// SYNC (tuning `kpair_sync`; D = 128, where a scale group is 2 warps): kSyncTeams, a named
// barrier of the group's 2 warps per head and a CTA barrier per 3-head chunk for the mean ring's
// refill; kSyncCta, the group maximum's exchange behind one barrier of all 4 warps per head and
// the mean ring refilled right behind it with no barrier of its own: at the last head u of a
// 3-head chunk every thread is past that chunk's rows, so heads u + 4 .. u + 6 go into them (head
// u + 1's commit group, complete at head u + 3, made visible by its barrier, read from head
// u + 4). The probes below: the team barrier ~5 %, the ring's ~3 % of
// the pass at Wan.
// PROBE (bench only, detail::kpair_probe; wrong output): kProbeNoTeam / kProbeNoRefill /
// kProbeNoMean drop the cross-warp maximum / the mean ring's barrier and refill / the mean
// subtraction, to time what each costs.
// SEG (session 39): segmented weights, each of the lane's two tokens with its own weight row.
// TOKEN (session 45, tuning `token_fast`): NormScope::token; each of the lane's two tokens with
// its own inverse (a.token_inv, read once), the head's weight quads from a.token_w (f32).
template <int D, bool BF16, int ROPE, bool SIGNED, int SYNC = detail::kSyncTeams, int PROBE = 0,
          bool SEG = false, bool TOKEN = false>
__global__ void __maxnreg__(kV3Async96Regs)
    v5_quantize_kpair_kernel(const PrologueArgs a, const V3QuantLaunch L) {
  constexpr int THREADS = kTightThreads, AHEAD = kV3Async96Ahead, SLOTS = AHEAD + 1;
  constexpr bool LEAN = BF16;
  constexpr int LANES = D / 16, RW = 2 * (32 / LANES);  // lanes per row, rows per warp
  constexpr int WPG = kSpecKRows > RW ? kSpecKRows / RW : 1;
  static_assert(kSpecKRows % RW == 0 || RW == kSpecKRows, "a group is whole warps");
  static_assert(WPG <= 2, "teams of at most 2 warps (barrier ids 1, 2)");
  constexpr int QR = D / 4;                  // float4 per mean row
  // (D = 64: one warp per group, no exchange: kSyncTeams' per-chunk refill)
  constexpr bool CTA = SYNC == detail::kSyncCta && WPG > 1;  // the refill at the exchange
  static_assert(kMeanRingChunk == SLOTS, "the mean ring refills at slot 0 (CTA: at the last)");
  static_assert(kMeanRingChunk * QR <= THREADS, "one refill copy per thread");
  // Dynamic shared memory: the x ring [SLOTS][4][THREADS] uint4 (row 0's chunks l, l + D / 16,
  // then row 1's), (rope) [8][THREADS] float4: the rotary quads k of row r at 4 r + k, the mean
  // rows [mean_sh_rows][QR] float4 (swizzled), then [2][kV3MaxWarps] floats: the warps' maxima.
  extern __shared__ float4 dyn_sh[];
  float4* t_sh = dyn_sh + SLOTS * 4 * THREADS;
  float4* mean_sh = t_sh + (ROPE != kRopeNone ? 8 * THREADS : 0);
  float(*red)[kV3MaxWarps] =
      reinterpret_cast<float(*)[kV3MaxWarps]>(mean_sh + mean_sh_rows(L) * QR);
  constexpr int NW = (SEG ? kSegRows : 1) * (D / 4);
  __shared__ float4 w_sh[NW];  // pair_weight_quad's quads: [row][k][l] at row D / 4 + k LANES + l
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int slot = lane / LANES, l = lane % LANES;
  const int64_t b = blockIdx.z;
  if (!L.early) griddep_wait();
  int64_t tile, h0;
  int count;
  quant_cta_work(L, a.heads, tile, h0, count);
  if (L.reverse) tile = L.tiles - 1 - tile;
  // Row 0: position 2 j of the group (j = the slot's pair); row 1 its THREAD_K partner, the next
  // token (group_row: 8 (i / 2) + 2 g + (i & 1)). Past N: row 0 reads token 0, row 1 row 0's row.
  const QuantRow row =
      quant_row(a, b, tile * L.tile_rows + warp * RW + 2 * slot, kSpecKRows, h0, l == 0);
  const bool ok0 = row.ok, ok1 = row.n + 1 < tokens_of(a, b);
  const int dx = ok1 ? static_cast<int>(a.x_sn) : 0;  // row 1's x from row 0's (host: fits)
  const int dq = static_cast<int>(a.q_sn);
  const float4 wq = pair_weight_quad<D, SEG>(a, tid);
  const int woff0 = seg_quad_offset<D, SEG>(a, b, row.n, ok0);
  const int woff1 = seg_quad_offset<D, SEG>(a, b, row.n + 1, ok1);
  const float tinv0 = TOKEN && ok0 ? __ldg(a.token_inv + b * a.tokens + row.n) : 1.f;
  const float tinv1 = TOKEN && ok1 ? __ldg(a.token_inv + b * a.tokens + row.n + 1) : 1.f;
  float tcs[16], tsn[16];  // row r's pairs at 8 r + 0..7
#pragma unroll
  for (int i = 0; i < 16; ++i) tcs[i] = 1.f, tsn[i] = 0.f;
  if (ROPE != kRopeNone) {
    const int p0 = ROPE == kRopePaired ? 8 * l : 4 * l;
    const int p1 = ROPE == kRopePaired ? p0 + 4 : D / 4 + p0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!(r == 0 ? ok0 : ok1)) continue;
      const int64_t off = r_item(a, b) + (row.n + r) * a.r_sn;
      load_table4(a, L.table_mode, off, p0, tcs + 8 * r, tsn + 8 * r);
      load_table4(a, L.table_mode, off, p1, tcs + 8 * r + 4, tsn + 8 * r + 4);
    }
  }
  const int x_sh = static_cast<int>(a.x_sh), q_sh = static_cast<int>(a.q_sh);
  const int s_sh = static_cast<int>(a.s_sh), m_sh = static_cast<int>(a.m_sh);
  const bool scaled = a.sm_scale != 1.f;  // x * 1 is exact: skipping it changes no bit
  const float abs_sm = fabsf(a.sm_scale);
  const int c0 = 8 * l;  // channel of the lane's first chunk (the second: + D / 2)
  const float rcp127 = rcp_approx(127.f);
  constexpr uint32_t T16 = THREADS * sizeof(uint4), SB = 4 * T16;
  const uint32_t ring0 = ptx::smem_u32(dyn_sh) + tid * sizeof(uint4);
  const uint16_t* nx = row.x + c0;  // the next head to issue
  // Head nx's two rows (two chunks each) into the slot at dst where `on` (the callers advance nx).
  auto copy_at = [&](uint32_t dst, bool on) {
    ptx::cp_async_if<16>(dst, nx, on);
    ptx::cp_async_if<16>(dst + T16, nx + D / 2, on);
    ptx::cp_async_if<16>(dst + 2 * T16, nx + dx, on);
    ptx::cp_async_if<16>(dst + 3 * T16, nx + dx + D / 2, on);
  };
#pragma unroll
  for (int k = 0; k < AHEAD; ++k) {
    if (k < count) {
      copy_at(ring0 + k * SB, true);
      nx += x_sh;
    }
    cp_async_commit();
  }
  // The mean rows of the CTA's first heads (the PDL wait first when early: the mean pass writes
  // them), their quads at kpair_mean_pos.
  if (L.early) griddep_wait();
  const bool refills = L.mean_ring && count > kMeanRingRows;
  {
    const int rows = refills ? kMeanRingRows : count;
    for (int e = tid; e < rows * QR; e += THREADS)
      mean_sh[(e / QR) * QR + kpair_mean_pos<D>(e % QR)] =
          __ldg(reinterpret_cast<const float4*>(row.m + (e / QR) * m_sh) + e % QR);
  }
  pair_store_invariants<D, ROPE, 8, THREADS, NW>(tid, wq, w_sh, t_sh, tcs, tsn);
  // The lane's mean quads k = 0, 1 of a row (channels 8 l + 4 k): positions mo[k], and + D / 8
  // for the second chunk (the same swizzle bit: D / 8 is a multiple of 16 at D = 128).
  const int sw = D == 128 ? (l >> 2) & 1 : 0;
  const int mo0 = 2 * l + sw, mo1 = 2 * l + (sw ^ 1);
  const int rr = tid / QR, rq = tid % QR;  // the refill row and float4 of this thread
  const int team = warp / WPG;
  int8_t* qcur = row.q + c0;
  float* scur = row.s;
  const uint32_t xb = 2u * static_cast<uint32_t>(x_sh), qb = static_cast<uint32_t>(q_sh),
                 sb = 4u * static_cast<uint32_t>(s_sh);
  int mrow = 0;
  const uint32_t first = ring0, last = ring0 + (SLOTS - 1) * SB;
  uint32_t rd = first, wr = last;
#pragma unroll 1
  for (int u = 0; u < count; ++u) {
    if (!CTA && PROBE != detail::kProbeNoRefill && refills && u > 0 && rd == first) {
      // Every thread is done with heads < u: heads u + 3 .. u + 5 go into the half of the ring
      // heads u - 3 .. u - 1 used; they travel in head u's commit group, waited for before the
      // barrier at head u + 3.
      __syncthreads();
      mean_ring_copy<QR>(ptx::smem_u32(mean_sh), mrow == 0 ? kMeanRingChunk : 0, rr, rq,
                         u + kMeanRingChunk, count, row.m, m_sh, kpair_mean_pos<D>);
    }
    {
      // Session 31: the copies predicated inside their asm and nx advanced by an unsigned byte
      // step every head (the host keeps strides in [0, 2^30 / heads)): ptxas had re-derived the
      // predicate a dozen times and advanced the pointer's halves under it.
      copy_at(wr, u + AHEAD < count);
      nx = bump(nx, xb);
    }
    cp_async_commit();
    cp_async_wait<AHEAD>();
    uint4 r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = lds16u(rd + i * T16);
    float v[32];
    if constexpr (TOKEN)
      v4_row_pair<D, BF16, ROPE, LEAN, true, false, true>(
          true, a.eps,
          [&](int k) { return token_weight_quad<D>(a, h0 + u, k, l); },
          [&](int k, int rw) { return lds16(&t_sh[(4 * rw + k) * THREADS + tid]); }, r, v, tinv0,
          tinv1);
    else if constexpr (SEG)
      v4_row_pair<D, BF16, ROPE, LEAN, true, true>(
          a.norm, a.eps,
          [&](int k, int rw) { return lds16(&w_sh[(rw ? woff1 : woff0) + k * LANES + l]); },
          [&](int k, int rw) { return lds16(&t_sh[(4 * rw + k) * THREADS + tid]); }, r, v);
    else
      v4_row_pair<D, BF16, ROPE, LEAN, true>(
          a.norm, a.eps, [&](int k) { return lds16(&w_sh[k * LANES + l]); },
          [&](int k, int rw) { return lds16(&t_sh[(4 * rw + k) * THREADS + tid]); }, r, v);
    // Minus the head's mean: value 16 r + 4 k + e is channel (k / 2) D / 2 + 8 l + 4 (k & 1) + e.
    const float4* mq = mean_sh + mrow * QR;
#pragma unroll
    for (int k = 0; k < (PROBE == detail::kProbeNoMean ? 0 : 4); ++k) {
      const float4 t = lds16(mq + (k >> 1) * (D / 8) + ((k & 1) ? mo1 : mo0));
#pragma unroll
      for (int rw = 0; rw < 2; ++rw) {
        float* y = v + 16 * rw + 4 * k;
        y[0] = __fsub_rn(y[0], t.x);
        y[1] = __fsub_rn(y[1], t.y);
        y[2] = __fsub_rn(y[2], t.z);
        y[3] = __fsub_rn(y[3], t.w);
      }
    }
    // |v|'s maximum over both rows (rows past N: 0).
    const float am0 = abs_max16(v), am1 = abs_max16(v + 16);
    float m = redux_group_max(max_nan(ok0 ? am0 : 0.f, ok1 ? am1 : 0.f), 32, lane);
    if constexpr (WPG > 1 && PROBE != detail::kProbeNoTeam) {
      const int par = u & 1;
      if (lane == 0) red[par][warp] = m;
      if (CTA || team == 0)
        team_barrier(0, CTA ? THREADS : 32 * WPG);
      else
        team_barrier(1, 32 * WPG);
      m = max_nan(red[par][WPG * team], red[par][WPG * team + 1]);
      if (CTA && refills && rd == last && u + kMeanRingChunk + 1 < count) {
        mean_ring_copy<QR>(ptx::smem_u32(mean_sh), mrow - (kMeanRingChunk - 1), rr, rq,
                           u + kMeanRingChunk + 1, count, row.m, m_sh, kpair_mean_pos<D>);
      }
    }
    const float scale = group_scale<LEAN>(a, m, scaled, abs_sm, rcp127);
    if (row.writer) *scur = scale;
    uint32_t packed[8];
    scaled_codes<32, LEAN, SIGNED>(a, scaled, scale, v, packed);
    if (ok0) {
      *reinterpret_cast<uint2*>(qcur) = make_uint2(packed[0], packed[1]);
      *reinterpret_cast<uint2*>(qcur + D / 2) = make_uint2(packed[2], packed[3]);
    }
    if (ok1) {
      *reinterpret_cast<uint2*>(qcur + dq) = make_uint2(packed[4], packed[5]);
      *reinterpret_cast<uint2*>(qcur + dq + D / 2) = make_uint2(packed[6], packed[7]);
    }
    wr = rd;
    rd = rd == last ? first : rd + SB;
    mrow = L.mean_ring && mrow == kMeanRingRows - 1 ? 0 : mrow + 1;
    qcur = bump(qcur, qb);
    scur = bump(scur, sb);
  }
}

// ---- norm_rope_mean, round 4 ------------------------------------------------------------------
//
// Rounds 2 and 3 keep one token per row slot and loop over heads, so each thread adds into a
// per-head accumulator in shared memory (round 3: L1/shared 90 % busy, DRAM 36 %). Here a warp's
// row slots are the heads of ONE token: slot s of warp w holds head h0 + s (RW = 32 / LANES heads
// per warp: 8 at D = 128, 16 at D = 64), lane_in_row its 32 channels (v3 placement), and the warp
// walks tokens t0 + w, t0 + w + W, ... of the CTA's chunk. A thread's head and channels never
// change, so its 32 sums stay in registers; the RW slots of a warp read the same rotary values
// (same token, same lane_in_row), so a table line serves 8 (16) heads from L1 (prefetched into L1
// when the token's x loads are issued). A warp's x loads of one token are RW whole head rows
// (2 KB contiguous for a (B, N, H, D) tensor). End of CTA: the W warps' sums meet in shared
// memory, added in warp order, one partial per (batch, head, chunk, channel); launch_mean_final
// adds the chunks in order: deterministic for a given launch shape. The arithmetic per value is
// round 3's (v3_row, then one fp32 add per token): the mean agrees with the other rounds to fp32
// rounding of the sum order.

constexpr int kV4MeanWarps = 4;     // warps per CTA (token interleave)
constexpr int kV4MeanAsyncAhead = 3;  // cp.async ring: tokens ahead
// The round-5 layout (two rows per lane, v4_mean_body's PAIR) as the mean kernel (tuning
// `mean_round` = 4 / 5 forces round 4 / 5). H200 run 46 (the same bits; ms round 5 / round 4):
// mean pass alone Wan 0.0991 / 0.1029, Flux 0.0199 / 0.0215; k path Wan 0.2485 / 0.2527, Flux
// 0.0358 / 0.0376. The default since.
constexpr bool kV4DefaultPair = true;
// The round-4 kernel is the mean pass (GPU run 6, k path, Wan / Flux: round-2 mean 0.369 /
// 0.0508 ms, round 4 0.326 / 0.0457, with the cp.async ring 0.322 / 0.0452) with its cp.async
// ring and the table rows in shared memory (run 7: 0.3003 / 0.0444 vs 0.3068 / 0.0450; the
// same bits). Session 8 deleted the losing forms: its register ring, the ring without the table
// rows (still the no-rope form), the rotation folded into the sums (run 9).

struct V4MeanLaunch {
  int steps;       // tokens per warp (a CTA's chunk: steps * kV4MeanWarps tokens)
  int64_t chunks;  // CTAs along the tokens = partials per (batch, head)
};

// x loads in a cp.async ring in shared memory, AHEAD tokens ahead (AHEAD + 1 slots of 64 bytes
// per thread, dynamic shared memory; the warps' final sums reuse it). TSMEM: the token's rotary
// table row (D floats) copied by the warp's lanes into a per-warp slot of the same ring and read
// with ld.shared (with rope). LEAN: v3_row's one-cvt bf16 rounding (the same bits). The tight
// form (session 9; the only one since session 10): the ring and table slots as 32-bit shared
// addresses from one base each (slot u & 3), and v3_row's branch-free norm. (Session 8's generic
// form, per-token shared-memory windows and the branching norm, the same bits: GPU run 24 k path
// 0.2629 vs 0.2612 ms; deleted in session 10.)
//
// PAIR (round 5, session 14): a lane holds two rows (heads 2 s, 2 s + 1 of its slot s) of 16
// values instead of one of 32 (D / 16 lanes per row, v4_row_pair): the weight and rotary quads a
// lane reads from shared memory per token serve both rows. ncu (H200 run 45, Wan): round 4 is
// bound by the L1 / shared-memory pipe (89 % busy at 73 % of DRAM bandwidth); per warp and
// token it read 8 weight + 8 rotary + 4 x quads per lane, round 5 4 + 4 + 4 (+ 4 shuffles):
// the mean pass 3.7 % (Wan) / 7 % (Flux) faster in H200 run 46.
// SEG (session 39): segmented weights, kSegRows rows of quads; a warp's token of step u (the
// same for its lanes) picks its row.
// TOKEN (session 45, PAIR only, tuning `token_fast`): NormScope::token; the CTA's RW heads' weight
// quads from a.token_w (f32) in shared memory (row = head slot), each token's inverse from
// a.token_inv (one step ahead).
template <int D, bool BF16, int ROPE, bool PAIR = false, bool SEG = false, bool TOKEN = false>
__device__ __forceinline__ void v4_mean_body(const PrologueArgs& a, const V4MeanLaunch& L,
                                             float* partials) {
  static_assert(!TOKEN || (PAIR && !SEG), "the token norm in the round-5 layout only");
  constexpr int AHEAD = kV4MeanAsyncAhead;
  constexpr bool LEAN = BF16, TSMEM = ROPE != kRopeNone;
  // LANES: lanes per row; RW: heads per warp (both layouts: 1024 / D)
  constexpr int LANES = PAIR ? D / 16 : D / 32, RW = (PAIR ? 64 : 32) / LANES, W = kV4MeanWarps;
  constexpr int SLOTS = AHEAD + 1, THREADS = W * 32;
  // round 4: [quad k][lane l] = the weights of values 4k .. 4k + 3 of lane l; round 5 the same
  // D / 4 quads as [k][l], k < 4 (values 4k .. 4k + 3 of each of its rows)
  __shared__ float4 w_sh[(SEG ? kSegRows : TOKEN ? RW : 1) * 8][D / 32];
  static_assert(!SEG || kSegRows * D / 4 <= THREADS, "one weight quad per thread");
  extern __shared__ float4 v4_dyn[];
  // [warp][value j][lane], row stride 36 (see the end); in the dynamic shared memory (after the
  // ring's last use)
  float(*red)[32][36] = reinterpret_cast<float(*)[32][36]>(v4_dyn);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int slot = lane / LANES, lane_in_row = lane % LANES;
  const int64_t b = blockIdx.z, chunk = blockIdx.y;
  const int64_t h = static_cast<int64_t>(blockIdx.x) * RW + (PAIR ? 2 : 1) * slot;
  const int64_t hx = h < a.heads ? h : a.heads - 1;  // slots past H read a real head, unused
  // PAIR: the lane's second head (clamped alike), as an offset from its first head's row
  const int64_t x_pair = PAIR ? ((h + 1 < a.heads ? h + 1 : a.heads - 1) - hx) * a.x_sh : 0;
  const int64_t t_first = chunk * L.steps * W + warp;  // this warp's tokens: + k * W
  const int64_t t_stop = (chunk + 1) * L.steps * W;
  const int64_t nb = tokens_of(a, b);  // (a padded varlen batch: the item's own tokens)
  const int64_t t_end = nb < t_stop ? nb : t_stop;
  const int count = t_first < t_end ? static_cast<int>((t_end - t_first + W - 1) / W) : 0;
  griddep_launch_dependents();  // mean_final may launch (it waits for this grid's end)

  // (stored after the first x loads, `start`)
  const float4 wq = PAIR ? pair_weight_quad<D, SEG>(a, tid) : v3_weight_quad<D, SEG>(a, tid);
  // A (…, pairs, 2) fp32 table. Rotary quad k of the thread (pairs p_k, p_k + 1 in v3_row's
  // order) is one float4 at a compile-time offset from the thread's first pair: paired:
  // p_k = 8 chunk(k / 4) + 2 (k % 4), floats 16 lane_in_row + 16 LANES (k / 4) + 4 (k % 4);
  // interleaved: p_k = 4 chunk(k / 2) + 2 (k % 2), floats
  // 8 lane_in_row + 8 LANES (k / 2) + 4 (k % 2).
  constexpr int kLanePairs = ROPE == kRopePaired ? 8 : 4;  // pairs per chunk of a lane
  const int64_t t_step = static_cast<int64_t>(W) * a.r_sn;
  const int64_t x_step = static_cast<int64_t>(W) * a.x_sn;

  const uint16_t* lx = static_cast<const uint16_t*>(a.x) + x_item(a, b) + t_first * a.x_sn +
                       hx * a.x_sh + 8 * lane_in_row;  // the loading token's row
  float acc[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc[j] = 0.f;
  // TSMEM: table slot s of this warp, D floats, after the x ring.
  static_assert((SLOTS & (SLOTS - 1)) == 0, "ring slots: a power of two");
  const uint32_t tab0 = ptx::smem_u32(reinterpret_cast<float*>(v4_dyn + SLOTS * 4 * THREADS) +
                                      warp * D);                       // table slot 0
  const uint32_t ring0 = ptx::smem_u32(v4_dyn) + tid * sizeof(uint4);  // x slot 0
  constexpr uint32_t kSlotBytes = 4 * THREADS * sizeof(uint4), kTabBytes = W * D * sizeof(float);
  auto proc = [&](int u, const uint4(&r)[4], float tinv) {
    float v[32];
    // (u < count: a real token)
    const int woff = seg_quad_offset<D, SEG>(a, b, t_first + static_cast<int64_t>(u) * W, true);
    auto as_float4 = [](uint4 t) {
      return make_float4(__uint_as_float(t.x), __uint_as_float(t.y), __uint_as_float(t.z),
                         __uint_as_float(t.w));
    };
    if constexpr (PAIR) {
      const uint32_t ts32 = tab0 + sizeof(float) * (u & (SLOTS - 1)) * W * D;
      auto tq = [&](int k) {
        const int q = ROPE == kRopePaired ? 4 * lane_in_row + k
                                          : (k < 2 ? 0 : D / 8 - 2) + 2 * lane_in_row + k;
        return as_float4(lds16u(ts32 + sizeof(float4) * pair_table_pos<ROPE>(q)));
      };
      if constexpr (TOKEN) {
        // row r: head slot 2 slot + r's quads
        auto wqr = [&](int k, int rw) {
          return lds16(&w_sh[0][0] + (2 * slot + rw) * (D / 4) + k * LANES + lane_in_row);
        };
        v4_row_pair<D, BF16, ROPE, LEAN, false, true, true>(true, a.eps, wqr, tq, r, v, tinv, tinv);
      } else {
        auto wqf = [&](int k) { return lds16(&w_sh[0][0] + woff + k * LANES + lane_in_row); };
        v4_row_pair<D, BF16, ROPE, LEAN>(a.norm, a.eps, wqf, tq, r, v);
      }
    } else {
      const uint32_t ts32 = tab0 + sizeof(float) * ((u & (SLOTS - 1)) * W * D +
                                                    2 * kLanePairs * lane_in_row);
      auto tq = [&](int k) {
        const int off = ROPE == kRopePaired ? 16 * LANES * (k / 4) + 4 * (k % 4)
                                            : 8 * LANES * (k / 2) + 4 * (k % 2);
        return as_float4(lds16u(ts32 + sizeof(float) * off));
      };
      auto wqf = [&](int k) { return lds16(&w_sh[0][0] + woff + k * LANES + lane_in_row); };
      v3_row<D, BF16, ROPE, LEAN, true>(a.norm, a.eps, wqf, tq, r, v);
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j] = __fadd_rn(acc[j], v[j]);
  };
  auto start = [&] {
    if constexpr (TOKEN) {  // RW heads' D / 4 quads (pair_weight_quad's channels), heads past H
                            // clamped as hx
      for (int q = tid; q < RW * (D / 4); q += THREADS) {
        const int64_t hh = static_cast<int64_t>(blockIdx.x) * RW + q / (D / 4);
        const int t = q % (D / 4);
        (&w_sh[0][0])[q] =
            token_weight_quad<D>(a, hh < a.heads ? hh : a.heads - 1, t / (D / 16), t % (D / 16));
      }
    } else {
      v3_store_weight_quad<D, SEG>(tid, wq, &w_sh[0][0]);  // quad tid at flat index tid
    }
    __syncthreads();
  };
  {
    // cp.async ring: token u's 4 chunks land in this thread's slot u % SLOTS (no registers
    // held); one commit group per token, empty past the end, so wait_group AHEAD means "token u
    // has landed". A slot is refilled only after its values were read and used.
    // The loading token's table row (TSMEM): lane i < D / 4 copies its floats 4i .. 4i + 3.
    const float* lrow = static_cast<const float*>(a.rope) + r_item(a, b) + t_first * a.r_sn;
    auto issue = [&](int u) {
      const uint32_t dst = ring0 + (u & (SLOTS - 1)) * kSlotBytes;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // PAIR: chunks l, l + D / 16 of the first head, then of the second
        const uint16_t* src = PAIR ? lx + (i >= 2 ? x_pair : 0) + (D / 2) * (i & 1)
                                   : lx + 8 * LANES * i;
        ptx::cp_async16(dst + i * THREADS * sizeof(uint4), src);
      }
      // D / 4 quads of the row: one per lane (D <= 128), two at D 256
#pragma unroll
      for (int qd = lane; qd < (D / 4 > 32 ? D / 4 : 32); qd += 32) {
        const int tpos = PAIR ? pair_table_pos<ROPE>(qd) : qd;
        if (TSMEM && qd < D / 4)
          ptx::cp_async16(tab0 + (u & (SLOTS - 1)) * kTabBytes + 16 * tpos, lrow + 4 * qd);
      }
      if (TSMEM) lrow += t_step;
      lx += x_step;
    };
#pragma unroll
    for (int k = 0; k < AHEAD; ++k) {
      if (k < count) issue(k);
      cp_async_commit();
    }
    start();
    const float* tinv_p = TOKEN ? a.token_inv + b * a.tokens + t_first : nullptr;
    float tinv = TOKEN && count > 0 ? __ldg(tinv_p) : 1.f;
#pragma unroll 1
    for (int u = 0; u < count; ++u) {
      const float tinv_next = TOKEN && u + 1 < count ? __ldg(tinv_p + (u + 1) * W) : 1.f;
      // TSMEM: the table slot refilled now was read by every lane of the warp one token ago.
      if (TSMEM) __syncwarp();
      if (u + AHEAD < count) issue(u + AHEAD);
      cp_async_commit();
      cp_async_wait<AHEAD>();
      if (TSMEM) __syncwarp();  // the other lanes' table copies of token u are visible
      const uint32_t src32 = ring0 + (u & (SLOTS - 1)) * kSlotBytes;
      uint4 r[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) r[i] = lds16u(src32 + i * THREADS * sizeof(uint4));
      proc(u, r, tinv);
      tinv = tinv_next;
    }
    cp_async_wait<0>();
    __syncthreads();  // every thread's ring reads are done before `red` overwrites the ring
  }

  // The warps' sums meet in shared memory [warp][value j][lane] with a row stride of 36
  // floats. Round 4 (the else branch below): the writes and its reads are conflict-free at
  // D = 128 (bank 4 (j % 8) + l % 4 + const over a warp; 2-way at D = 64); output e = (head slot
  // e / D, channel c = e % D), the W
  // warps added in warp order: a warp stores 32 consecutive channels of one head (128 bytes;
  // channel c sits in chunk c / 8 = lane_in_row + LANES * i, value j = 8 i + c % 8 of lane
  // (head slot) * LANES + lane_in_row). Session 10 (GPU runs 29 / 30, the same bits): the
  // earlier stores, lane l's value j to head l / LANES, touched 32 sectors per warp store (1024
  // sector writes of 4 bytes per CTA, 128 now); mean pass alone Flux 0.0214 -> 0.0212 / 0.0212
  // -> 0.0207 ms, Wan 0.1047 -> 0.1038 / 0.1022 -> 0.1022; k path Flux 0.0396 -> 0.0398 /
  // 0.0380 -> 0.0374, Wan 0.2589 -> 0.2600 / 0.2576 -> 0.2572.
#pragma unroll
  for (int j = 0; j < 32; ++j) red[warp][j][lane] = acc[j];
  __syncthreads();
  if constexpr (PAIR) {
    static_assert(W == 4, "PAIR's final sums: one value group of 8 per warp");
    // Session 22: thread (warp w, lane l) adds lane l's value group w — values 8 w .. 8 w + 7 =
    // row r = w / 2 (head slot 2 (l / LANES) + r), chunk i = w % 2 (channels 8 ch .. 8 ch + 7,
    // ch = l % LANES + i LANES) — over the W warps in warp order (the loop below's sums, element
    // for element: the same bits), and stores its 8 channels as two float4 (one 32-byte sector).
    // The loop below spends ~57 instructions per output group on index arithmetic (Nsight
    // Compute at Flux: its 8 iterations and the setup were ~25 % of the kernel's instructions,
    // a warp covering only ~7 tokens there). Reads red[w][j][0..31]: conflict-free.
    const int r = warp / 2, ch = lane_in_row + (warp % 2) * LANES;
    float t[8];
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) t[jj] = red[0][8 * warp + jj][lane];
#pragma unroll
    for (int w = 1; w < W; ++w) {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) t[jj] = __fadd_rn(t[jj], red[w][8 * warp + jj][lane]);
    }
    const int64_t hh = static_cast<int64_t>(blockIdx.x) * RW + 2 * slot + r;
    if (hh < a.heads) {
      float4* o = reinterpret_cast<float4*>(partials +
                                            ((b * a.heads + hh) * L.chunks + chunk) * D + 8 * ch);
      o[0] = make_float4(t[0], t[1], t[2], t[3]);
      o[1] = make_float4(t[4], t[5], t[6], t[7]);
    }
  } else {
#pragma unroll 1
    for (int e = tid; e < 32 * 32; e += W * 32) {
      const int hs = e / D, c = e % D, ch = c / 8;
      const int j = 8 * (ch / LANES) + c % 8;
      const int l = hs * LANES + ch % LANES;
      float t = red[0][j][l];
#pragma unroll
      for (int w = 1; w < W; ++w) t = __fadd_rn(t, red[w][j][l]);
      const int64_t hh = static_cast<int64_t>(blockIdx.x) * RW + hs;
      if (hh < a.heads) partials[((b * a.heads + hh) * L.chunks + chunk) * D + c] = t;
    }
  }
}

// The round-4 mean kernel: 4 CTAs per SM at D = 128 (<= 128 registers), 3 at D = 64.
template <int D, bool BF16, int ROPE, bool PAIR, bool SEG = false, bool TOKEN = false>
__global__ void __launch_bounds__(kV4MeanWarps * 32, D == 128 ? 4 : 3)
    v4_mean_kernel(const PrologueArgs a, const V4MeanLaunch L, float* partials) {
  v4_mean_body<D, BF16, ROPE, PAIR, SEG, TOKEN>(a, L, partials);
}
// The occupancy variant (tuning `mean_ctas` = 5; the default from kV4OccMinRows rows): one CTA
// per SM more (5 at D = 128: <= 96 registers, 20 warps per SM; 4 at D = 64).
template <int D, bool BF16, int ROPE, bool PAIR, bool SEG = false, bool TOKEN = false>
__global__ void __launch_bounds__(kV4MeanWarps * 32, D == 128 ? 5 : 4)
    v4_mean_kernel_occ(const PrologueArgs a, const V4MeanLaunch L, float* partials) {
  v4_mean_body<D, BF16, ROPE, PAIR, SEG, TOKEN>(a, L, partials);
}

// Resident CTAs of `kernel` on the device (registers, shared memory, threads).
template <typename K>
int64_t resident_ctas(K kernel, int threads, int smem, const char* op) {
  const int per_sm = occupancy_per_sm(reinterpret_cast<const void*>(kernel), threads,
                                      static_cast<size_t>(smem), op);
  return int64_t{std::max(per_sm, 1)} * multiprocessor_count();
}

// Whether the tight quantize kernel runs on 4-warp CTAs (tuning `quant_tight`, else
// kV3DefaultTight; the mean kernel has only its tight form since session 10).
bool tight_forms(const detail::PrologueCudaTuning& t) {
  return t.quant_tight > 0 ? t.quant_tight != detail::kTightOff : kV3DefaultTight;
}

// The round-4 mean kernel's coverage: per-head (or no) norm weight, full rotary with an fp32
// (…, pairs, 2) table, or none; D 64 / 128.
bool v4_mean_supported(const PrologueArgs& a) {
  if ((a.w_rows && !seg_fast_ok(a)) || a.tokens == 0) return false;
  if (a.dim != 64 && a.dim != 128 && a.dim != 256) return false;
  if (!a.rotate) return true;
  if (2 * a.pairs != a.dim) return false;
  return table_mode_of(a) == kTablePairsF32;
}

void v4_norm_rope_mean(const PrologueArgs& a, Context& ctx, ScratchHold* hold) {
  const int lanes = static_cast<int>(a.dim / 32), rw = 32 / lanes;
  V4MeanLaunch L;
  const int64_t head_groups = (a.heads + rw - 1) / rw;
  LOWBIT_CHECK(a.batch <= 65535 && head_groups <= 65535, "norm_rope_mean", "x",
               "cuda grid: expected at most 65535 batch items, got " + std::to_string(a.batch));
  cudaStream_t stream = stream_of(ctx);
  // The cp.async ring, with the table rows in shared memory where there is rope; LEAN for bf16.
  const bool tsmem = a.rotate;
  const int ahead = kV4MeanAsyncAhead;
  const detail::PrologueCudaTuning tuning = detail::prologue_cuda_tuning();
  // The occupancy variant: one more CTA per SM.
  const int ctas_knob = tuning.mean_ctas;  // 4, 5; 0: by size
  const bool occ =
      ctas_knob > 0 ? ctas_knob == 5 : a.batch * a.tokens * a.heads >= kV4OccMinRows;
  const int ctas_per_sm = occ ? 5 : 4;
  // (D = 64: 3 or 4 CTAs by registers, for the carve-out)
  // Dynamic shared memory: the warps' final sums (18 KB: a row stride of 36) or, larger, the
  // cp.async ring (32 KB, and the table ring after it).
  const int smem = static_cast<int>(
      std::max<size_t>(sizeof(float) * kV4MeanWarps * 32 * 36,
                       sizeof(uint4) * (ahead + 1) * 4 * kV4MeanWarps * 32 +
                           (tsmem ? sizeof(float) * (ahead + 1) * kV4MeanWarps * a.dim : 0)));
  dispatch_prologue(a, "norm_rope_mean", [&](auto d, auto bf, auto rope) {
    constexpr int D = decltype(d)::value, ROPE = decltype(rope)::value;
    constexpr bool BF16 = decltype(bf)::value;
    using Kernel = void (*)(const PrologueArgs, const V4MeanLaunch, float*);
    // Round 5 (two rows per lane) or round 4: kV4DefaultPair unless `mean_round` forces one.
    const bool pair = tuning.mean_round > 0 ? tuning.mean_round == 5 : kV4DefaultPair;
    Kernel kernel =
        pair ? (occ ? v4_mean_kernel_occ<D, BF16, ROPE, true> : v4_mean_kernel<D, BF16, ROPE, true>)
             : (occ ? v4_mean_kernel_occ<D, BF16, ROPE, false>
                    : v4_mean_kernel<D, BF16, ROPE, false>);
    // Segmented weights (session 39): the round-5 form with kSegRows weight rows.
    if constexpr (D <= 128) {
      if (a.w_rows)
        kernel = occ ? v4_mean_kernel_occ<D, BF16, ROPE, true, true>
                     : v4_mean_kernel<D, BF16, ROPE, true, true>;
      // NormScope::token (token_mean_supported: the round-5 form)
      if (a.norm_heads)
        kernel = occ ? v4_mean_kernel_occ<D, BF16, ROPE, true, false, true>
                     : v4_mean_kernel<D, BF16, ROPE, true, false, true>;
    }
    set_kernel_smem(kernel, smem, "norm_rope_mean", "shared memory");
    // Carve-out: what the resident CTAs need (17-42 KB each with the reserved 1 KB), the rest of
    // the SM's 256 KB stays L1 for the rotary table.
    const int sm_smem =
        device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, "norm_rope_mean");
    const int64_t need = ctas_per_sm * (int64_t{smem} + 2048);
    const int carveout =
        sm_smem > 0 ? static_cast<int>(std::min<int64_t>(100, (100 * need + sm_smem - 1) / sm_smem))
                    : 100;
    set_func_attribute(reinterpret_cast<const void*>(kernel),
                       cudaFuncAttributePreferredSharedMemoryCarveout, carveout, "norm_rope_mean",
                       "shared memory carve-out");
    // Tokens per warp by the wave model (fixed cost ~3 tokens: setup, the CTA's final sums and
    // partials); at least one full round of CTAs where the tokens allow; at most 65535 chunks.
    // The tuning knob's mean_steps overrides it.
    const int64_t resident = resident_ctas(kernel, kV4MeanWarps * 32, smem, "norm_rope_mean");
    const int64_t per_warp = (a.tokens + kV4MeanWarps - 1) / kV4MeanWarps;
    const int64_t first = std::max<int64_t>(1, (per_warp + 65534) / 65535);
    const int64_t min_chunks = (resident + head_groups * a.batch - 1) / (head_groups * a.batch);
    const int64_t last = std::max(first, (per_warp + min_chunks - 1) / min_chunks);
    const int64_t steps =
        pick_by_waves(first, last, resident, 3.0, [&](int64_t k) {
          const int64_t chunks = (per_warp + k - 1) / k;
          const bool distinct = (per_warp + chunks - 1) / chunks == k;
          return std::pair<int64_t, double>(distinct ? chunks * head_groups * a.batch : 0,
                                            static_cast<double>(k));
        });
    const int forced = tuning.mean_steps;
    L.steps = static_cast<int>(
        forced > 0 ? std::max<int64_t>(first, std::min<int64_t>(forced, per_warp)) : steps);
    L.chunks = (per_warp + L.steps - 1) / L.steps;
    ScratchHold local;
    Scratch& part =
        hold_scratch(hold ? *hold : local,
                     sizeof(float) * static_cast<size_t>(a.batch * a.heads * L.chunks * a.dim),
                     stream, "norm_rope_mean");
    dim3 grid(static_cast<unsigned>(head_groups), static_cast<unsigned>(L.chunks),
              static_cast<unsigned>(a.batch));
    kernel<<<grid, kV4MeanWarps * 32, smem, stream>>>(a, L, part.as<float>());
    check_launch("norm_rope_mean");
    launch_mean_final(a, part.as<float>(), L.chunks, stream);
  });
}

}  // namespace

// Segmented weights in the quantize pass: the round-5 kernels only (their default forms), i.e.
// the attention one call's layouts (THREAD_Q groups of kSpecQRows rows without a mean, THREAD_K
// groups of kSpecKRows rows with one).
// The mean rows as float4 (the quantize kernels' shared-memory mean rows need it).
bool mean_rows_vec(const PrologueArgs& a) {
  return a.mean && reinterpret_cast<uintptr_t>(a.mean) % 16 == 0 && a.m_sb % 4 == 0 &&
         a.m_sh % 4 == 0;
}

bool seg_quantize_supported(const PrologueArgs& a, const detail::PrologueCudaTuning& t) {
  if (!seg_fast_ok(a) || a.scale_eps < 0.f || a.groups <= 0) return false;
  if (t.max_reduce > 0 || t.quant_tight > 0 || t.quant_codes > 0 || t.kpair_sync > 0 ||
      t.kpair_probe > 0 || t.split_blocks > 0)
    return false;  // (tuning knobs steer the kernels under A/B: the legacy path then)
  const int group_rows = a.block / a.groups;
  if (a.layout == ScaleLayout::thread_q && group_rows == kSpecQRows && !a.mean)
    return t.quant_pair != detail::kPairOff;
  if (a.layout == ScaleLayout::thread_k && group_rows == kSpecKRows && a.mean) {
    const int mean_smem = t.mean_smem > 0 ? t.mean_smem : kV3DefaultMeanSmem;
    return t.quant_kpair != detail::kPairOff && kV3DefaultKPair &&
           mean_smem != detail::kMeanSmemOff && mean_rows_vec(a) && a.x_sn <= INT32_MAX &&
           a.q_sn <= INT32_MAX;
  }
  return false;
}

// NormScope::token in the quantize pass (tuning `token_fast`): the round-5 kernels' default forms
// only, D 64 / 128, no knob steering the kernels: the q kernel (THREAD_Q groups of kSpecQRows
// rows, no mean) and the k kernel (THREAD_K groups of kSpecKRows rows, the mean rows in shared
// memory: 16-byte aligned mean rows, token strides in 32 bits).
bool token_quantize_supported(const PrologueArgs& a, const detail::PrologueCudaTuning& t) {
  if (!t.token_fast || !a.norm_heads || a.scale_eps < 0.f || a.groups <= 0) return false;
  if (a.dim != 64 && a.dim != 128) return false;
  if (t.max_reduce > 0 || t.quant_tight > 0 || t.quant_codes > 0 || t.quant_pair > 0 ||
      t.split_blocks > 0 || t.quant_occ6 > 0 || t.quant_kpair > 0 || t.kpair_sync > 0 ||
      t.kpair_probe > 0 || t.mean_smem > 0)
    return false;
  const int64_t group_rows = a.block / a.groups;
  if (!a.mean) return group_rows == kSpecQRows;
  return group_rows == kSpecKRows && a.layout == ScaleLayout::thread_k && mean_rows_vec(a) &&
         a.x_sn <= INT32_MAX && a.q_sn <= INT32_MAX;
}

// NormScope::token in the mean pass (tuning `token_fast`): the round-5 mean kernel (PAIR).
bool token_mean_supported(const PrologueArgs& a, const detail::PrologueCudaTuning& t) {
  if (!t.token_fast || !a.norm_heads) return false;
  if (a.dim != 64 && a.dim != 128) return false;
  return t.mean_round <= 0 || t.mean_round == 5;
}

bool v3_supported(const PrologueArgs& a, bool quantize) {
  const detail::PrologueCudaTuning t = detail::prologue_cuda_tuning();
  if (t.legacy) return false;
  // NormScope::token: the first-generation kernels, but for the token_fast passes (the tokens'
  // inverses and the f32 weight rows given)
  if (a.norm_heads && !(a.token_inv && a.token_w &&
                        (quantize ? token_quantize_supported(a, t) : token_mean_supported(a, t))))
    return false;
  // The mean pass: the round-4 kernel unless `mean_round` = 2 forces src/cuda/prologue.cu's.
  // (Round 3's mean kernel, slower than round 2's in GPU run 2, was deleted in session 8.)
  if (!quantize) return t.mean_round != 2 && v4_mean_supported(a);
  if (a.w_rows && !seg_quantize_supported(a, t)) return false;
  if (a.rotate && 2 * a.pairs != a.dim) return false;
  if (a.dim != 64 && a.dim != 128 && a.dim != 256) return false;
  if (a.tokens == 0) return false;  // rows past N read token 0's row (in bounds, never used)
  const int64_t lim = int64_t{1} << 30;  // head offsets in 32 bits inside the kernels
  for (int64_t st : {a.x_sh, quantize ? a.q_sh : 0, quantize ? a.s_sh : 0, quantize ? a.m_sh : 0})
    if (st < 0 || st * a.heads >= lim) return false;
  if (a.layout == ScaleLayout::warp_q) return false;
  if (a.block <= 0 || (a.block & (a.block - 1)) != 0) return false;
  const int rw = 32 / static_cast<int>(a.dim / 32);
  return a.block <= kV3MaxWarps * rw;
}

void v3_norm_rope_quantize(const PrologueArgs& a, Context& ctx, bool behind_mean) {
  V3QuantLaunch L;
  const detail::PrologueCudaTuning tuning = detail::prologue_cuda_tuning();
  L.group_rows = a.block / a.groups;
  // >= 4 warps of rows, whole blocks (both powers of two); with `split_blocks`, whole scale groups
  // (THREAD_K 64 at D = 128: 4-warp CTAs on half blocks instead of 8-warp CTAs).
  // Round 5 (v5_quantize_pair_kernel, two rows per lane): the specialized q layout only (THREAD_Q
  // groups of kSpecQRows rows, no mean, redux, scale_eps >= 0, the tight 4-warp CTA) with tuning
  // `quant_pair`, else from kV3PairMinRows rows); its tile: the scale groups of 16 (D = 128) or
  // 32 rows.
  L.redux = (tuning.max_reduce > 0 ? tuning.max_reduce == detail::kReduceRedux
                                   : kV3DefaultRedux);
  // The specialized tight kernel unless quant_tight = kTightPlain (for the layouts below).
  const bool spec_on = tuning.quant_tight > 0 ? tuning.quant_tight != detail::kTightPlain
                                              : kV3DefaultSpec;
  // The specialized kernels' premises: redux, scale_eps >= 0 (quantize32_fq's); the q layout's:
  // THREAD_Q groups of kSpecQRows rows, no mean (round 3 and round 5 alike).
  // D 256 (branch s35-prologue-d256): the plain round-3 forms only (the specialized kernels'
  // refill and team layouts are sized for D <= 128).
  const bool spec_base = spec_on && L.redux && a.scale_eps >= 0.f && a.dim != 256;
  const bool spec_q = spec_base && L.group_rows == kSpecQRows && !a.mean;
  const bool pair_on = tuning.quant_pair > 0 ? tuning.quant_pair == detail::kPairOn
                                             : a.batch * a.tokens * a.heads >= kV3PairMinRows;
  // (segmented weights: round 5 at every size, the only q kernel with them)
  const bool pair = (pair_on || a.w_rows || a.norm_heads) && tight_forms(tuning) && spec_q;
  const int mean_smem = tuning.mean_smem > 0 ? tuning.mean_smem : kV3DefaultMeanSmem;
  L.mean_vec = mean_rows_vec(a);
  L.mean_smem = mean_smem != detail::kMeanSmemOff && L.mean_vec;
  // Session 23: the round-5 THREAD_K kernel (v5_quantize_kpair_kernel, two tokens per lane) for
  // the specialized k layout (THREAD_K groups of kSpecKRows rows, the mean rows in shared memory)
  // with tuning `quant_kpair`, else kV3DefaultKPair; row 1's x and q offsets from row 0's are
  // one token stride in 32 bits.
  const bool spec_k = spec_base && L.group_rows == kSpecKRows && a.mean && L.mean_smem;
  const bool kpair_on =
      tuning.quant_kpair > 0 ? tuning.quant_kpair == detail::kPairOn : kV3DefaultKPair;
  const bool kpair = kpair_on && tight_forms(tuning) && spec_k &&
                     a.layout == ScaleLayout::thread_k && a.x_sn <= INT32_MAX &&
                     a.q_sn <= INT32_MAX;
  // How its exchange and mean-ring refill synchronize (D = 128; tuning `kpair_sync`, else
  // kV3DefaultKPairSync; D = 64 has no exchange).
  const int kpair_sync = a.dim != 128
                             ? detail::kSyncTeams
                             : (tuning.kpair_sync > 0 ? tuning.kpair_sync : kV3DefaultKPairSync);
  const bool split =
      pair || kpair ||
      (tuning.split_blocks > 0 ? tuning.split_blocks == detail::kSplitOn : kV3DefaultSplit);
  const int lanes = static_cast<int>(a.dim / (pair || kpair ? 16 : 32));
  const int rw = (kpair ? 2 : 1) * 32 / lanes;  // rows per warp
  L.tile_rows = std::max(split ? L.group_rows : a.block, 4 * rw);
  L.wpg = L.group_rows > rw ? L.group_rows / rw : 1;
  L.red_lanes = std::min(32, lanes * L.group_rows);
  L.table_mode = table_mode_of(a);
  const int64_t tiles = (a.n_blocks * a.block + L.tile_rows - 1) / L.tile_rows;
  const int warps = L.tile_rows / rw, threads = warps * 32;
  LOWBIT_CHECK(tiles <= 65535 && a.batch <= 65535, "norm_rope_quantize", "x",
               "cuda grid: expected at most 65535 tiles and batch items, got " +
                   std::to_string(tiles) + " and " + std::to_string(a.batch));
  const int ahead = kV3Async96Ahead;
  // Reverse token order when a mean is subtracted: the mean pass just read x in increasing token
  // order, so its last rows are still in L2 (the whole of x at the Flux shape).
  L.reverse = tuning.tile_order > 0 ? tuning.tile_order == detail::kTilesReverse
                                    : a.mean != nullptr;
  const bool pdl = tuning.quant_pdl > 0 ? tuning.quant_pdl == detail::kPdlOn : kV3DefaultQuantPdl;
  L.mean_ring = L.mean_smem && mean_smem == detail::kMeanSmemRing &&
                ahead < kMeanRingChunk;
  // Loads before the PDL wait: by default only behind the mean pass of the same x (the fused k
  // path); kEarlyOn forces it anywhere (tests / bench: valid only where nothing before the kernel
  // in the stream still writes x), kEarlyOff nowhere.
  L.early = pdl && (tuning.quant_early > 0 ? tuning.quant_early == detail::kEarlyOn
                                           : behind_mean && kV3DefaultEarlyFused);
  // The 4-warp form with compile-time addressing.
  const bool tight = tight_forms(tuning) && threads == kTightThreads;
  // The tight kernel specialized to this launch's scale group, where it is one of the two library
  // layouts with redux and scale_eps >= 0 (quantize32_fq's premise), unless quant_tight =
  // kTightPlain (else the tight form).
  int spec = 0;
  if (tight && spec_q)
    spec = kSpecQRows;
  else if (tight && spec_k)
    spec = kSpecKRows;
  // Session 16: the specialized q kernel at 6 CTAs per SM (80 registers, 1 head ahead; D = 128,
  // tuning `quant_occ6`), and the specialized kernels' codes (tuning `quant_codes`).
  const int64_t rows = a.batch * a.tokens * a.heads;
  const bool occ6 = !pair && spec == kSpecQRows && a.dim == 128 &&
                    (tuning.quant_occ6 > 0 ? tuning.quant_occ6 == detail::kOcc6On
                                           : rows >= kV3Occ6MinRows);
  // The q kernels' and the round-5 k kernel's codes signed by default, the round-3 k kernel's by
  // byte permutes (kquant runs of sessions 16 and 23).
  const bool signed_codes = tuning.quant_codes > 0 ? tuning.quant_codes == detail::kCodesSigned
                                                   : spec != kSpecKRows || kpair;
  const int ring_ahead = occ6 ? kV3Occ6Ahead : ahead;
  const int smem = static_cast<int>(sizeof(float4)) * threads *
                       ((a.rotate ? (pair ? 4 : 8) : 0) + 4 * (ring_ahead + 1)) +
                   static_cast<int>(sizeof(float)) * 2 * kV3MaxWarps;  // `red`
  const int mean_row_bytes = static_cast<int>(sizeof(float) * a.dim);
  auto launch = [&](auto kernel) {
    // Always: dynamic + static shared memory above 48 KB needs the opt-in (run 3's failure).
    // mean_smem: the attribute covers the largest head group (set once more below).
    set_kernel_smem(kernel, smem, "norm_rope_quantize", "shared memory");
    // mean_smem: the most heads whose mean rows fit beside the other CTAs' shared memory, so that
    // the resident CTAs per SM stay (5 at D = 128 with the 96-register ring: 8 heads, 4 KB).
    int64_t cap = a.heads;
    if (L.mean_smem) {
      const int64_t base = resident_ctas(kernel, threads, smem, "norm_rope_quantize");
      const char* op = "norm_rope_quantize";
      const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, op);
      const int per_sm_smem = device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, op);
      const int reserved = device_attribute(cudaDevAttrReservedSharedMemoryPerBlock, op);
      const cudaFuncAttributes fa = func_attributes(reinterpret_cast<const void*>(kernel), op);
      const int stat = static_cast<int>(fa.sharedSizeBytes);
      set_kernel_smem(kernel, optin - stat, "norm_rope_quantize", "shared memory");
      const int64_t per_sm = std::max<int64_t>(1, base / multiprocessor_count());
      const int64_t room =
          std::min<int64_t>(per_sm_smem / per_sm - reserved, optin) - stat - smem;
      cap = std::clamp<int64_t>(room / mean_row_bytes, 1, a.heads);
      // (allocation granules: one occupancy call confirms, rarely a second)
      while (cap > 1 && resident_ctas(kernel, threads,
                                      smem + static_cast<int>(cap) * mean_row_bytes,
                                      "norm_rope_quantize") < base)
        --cap;
      // The mean ring holds kMeanRingRows rows whatever the head group (else: capped as above).
      if (L.mean_ring && cap >= kMeanRingRows)
        cap = a.heads;
      else
        L.mean_ring = false;
    }
    // Heads per CTA (balanced groups) by the wave model, fixed cost ~1.5 heads (setup), long
    // grids in fractional rounds (`smooth`; GPU run 25: Wan 20 heads per CTA instead of 8, k /
    // q 2.2 / 1.6 % faster; Flux unchanged at 6); the tuning knob's heads_per_cta overrides it.
    const int forced = tuning.heads_per_cta;
    int64_t hg = std::min<int64_t>(forced, std::min(cap, a.heads));
    const int64_t resident = resident_ctas(kernel, threads, smem, "norm_rope_quantize");
    if (forced <= 0) {
      hg = pick_by_waves(
          1, cap, resident, 1.5,
          [&](int64_t k) {
            const int64_t groups = (a.heads + k - 1) / k;
            const bool balanced = (a.heads + groups - 1) / groups == k;
            return std::pair<int64_t, double>(balanced ? tiles * a.batch * groups : 0,
                                              static_cast<double>(k));
          },
          /*smooth=*/true);
    }
    const int64_t head_groups = (a.heads + hg - 1) / hg;
    L.head_group = static_cast<int>((a.heads + head_groups - 1) / head_groups);
    dim3 grid(static_cast<unsigned>(head_groups), static_cast<unsigned>(tiles),
              static_cast<unsigned>(a.batch));
    L.balanced = false;
    L.tiles = static_cast<int>(tiles);
    L.bal_q = L.bal_r = 0;
    const int64_t ctas = tiles * a.batch * head_groups;
    if (forced == detail::kKnobBalanced ||
        (forced == 0 && kV3DefaultBalanced &&
         static_cast<double>(ctas) <= kV3BalancedMaxRounds * static_cast<double>(resident))) {
      // The wave model's grid rounded to whole rounds of resident CTAs (at least one, at least
      // one head group per tile), its (tile, head) work split evenly over them.
      const int64_t rounds = std::max<int64_t>(1, (ctas + resident / 2) / resident);
      const int64_t cb = std::clamp<int64_t>(rounds * resident / a.batch, tiles, tiles * a.heads);
      const int64_t q = cb / tiles, r = cb % tiles;
      const int64_t largest = (a.heads + q - 1) / q;
      const int64_t lim = int64_t{1} << 31;
      if (largest <= cap && cb < lim && (q + 1) * a.heads < lim) {
        L.balanced = true;
        L.bal_q = static_cast<int>(q), L.bal_r = static_cast<int>(r);
        L.head_group = static_cast<int>(largest);
        grid = dim3(static_cast<unsigned>(cb), 1, static_cast<unsigned>(a.batch));
      }
    }
    const int smem_all = smem + (L.mean_smem ? mean_sh_rows(L) * mean_row_bytes : 0);
    launch_maybe_pdl(pdl, kernel, grid, dim3(threads), smem_all, stream_of(ctx), a, L);
  };
  dispatch_prologue(a, "norm_rope_quantize", [&](auto d, auto bf, auto rope) {
    constexpr int D = decltype(d)::value, ROPE = decltype(rope)::value;
    constexpr bool BF16 = decltype(bf)::value;
    // The specialized kernels in their two code forms (the same signature): signed_codes picks.
    if constexpr (D == 256) {
      if (tight)
        launch(v3_quantize_kernel_r96<D, BF16, ROPE, kTightThreads>);
      else
        launch(v3_quantize_kernel_r96<D, BF16, ROPE, 0>);
    } else if (a.norm_heads) {  // token_quantize_supported: the round-5 kernels, D <= 128
      if (pair) {
        launch(v5_quantize_pair_kernel<D, BF16, ROPE, true, false, true>);
      } else if (kpair && kpair_sync == detail::kSyncCta) {
        if constexpr (D == 128)
          launch(v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncCta, 0, false, true>);
      } else if (kpair) {
        launch(v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncTeams, 0, false, true>);
      } else {
        LOWBIT_CHECK(false, "norm_rope_quantize", "norm_scope",
                     "internal: no kernel for the token norm's quantize pass");
      }
    } else if (a.w_rows) {  // seg_quantize_supported: the default round-5 forms, D <= 128
      if (pair) {
        launch(v5_quantize_pair_kernel<D, BF16, ROPE, true, true>);
      } else if (kpair && kpair_sync == detail::kSyncCta) {
        if constexpr (D == 128)
          launch(v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncCta, 0, true>);
      } else if (kpair) {
        launch(v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncTeams, 0, true>);
      } else {
        check::fail("norm_rope_quantize", "weight_rows",
                    "internal: no round-5 kernel for segmented weights here");
      }
    } else if (pair)
      launch(signed_codes ? v5_quantize_pair_kernel<D, BF16, ROPE, true>
                          : v5_quantize_pair_kernel<D, BF16, ROPE, false>);
    else if (kpair && tuning.kpair_probe > 0) {
      if constexpr (D == 128 && BF16 && ROPE == kRopePaired)
        launch(tuning.kpair_probe == detail::kProbeNoTeam
                   ? v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncTeams,
                                              detail::kProbeNoTeam>
               : tuning.kpair_probe == detail::kProbeNoRefill
                   ? v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncTeams,
                                              detail::kProbeNoRefill>
                   : v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncTeams,
                                              detail::kProbeNoMean>);
      else
        check::fail("norm_rope_quantize", "tuning",
                    "kpair_probe: bf16, D 128, split-half rope only");
    } else if (kpair && kpair_sync == detail::kSyncCta) {
      if constexpr (D == 128)
        launch(signed_codes ? v5_quantize_kpair_kernel<D, BF16, ROPE, true, detail::kSyncCta>
                            : v5_quantize_kpair_kernel<D, BF16, ROPE, false, detail::kSyncCta>);
    } else if (kpair)
      launch(signed_codes ? v5_quantize_kpair_kernel<D, BF16, ROPE, true>
                          : v5_quantize_kpair_kernel<D, BF16, ROPE, false>);
    else if (occ6) {  // D = 128 only (above)
      if constexpr (D == 128)
        launch(signed_codes ? v3_quantize_kernel_occ6<D, BF16, ROPE, true>
                            : v3_quantize_kernel_occ6<D, BF16, ROPE, false>);
    } else if (spec == kSpecQRows)
      launch(signed_codes
                 ? v3_quantize_kernel_r96<D, BF16, ROPE, kTightThreads, kSpecQRows, true>
                 : v3_quantize_kernel_r96<D, BF16, ROPE, kTightThreads, kSpecQRows, false>);
    else if (spec == kSpecKRows)
      launch(signed_codes
                 ? v3_quantize_kernel_r96<D, BF16, ROPE, kTightThreads, kSpecKRows, true>
                 : v3_quantize_kernel_r96<D, BF16, ROPE, kTightThreads, kSpecKRows, false>);
    else if (tight)
      launch(v3_quantize_kernel_r96<D, BF16, ROPE, kTightThreads>);
    else
      launch(v3_quantize_kernel_r96<D, BF16, ROPE, 0>);
  });
  check_launch("norm_rope_quantize");
}

void v3_norm_rope_mean(const PrologueArgs& a, Context& ctx, ScratchHold* hold) {
  v4_norm_rope_mean(a, ctx, hold);
}

bool token_quantize_fast(const PrologueArgs& a, bool with_mean) {
  PrologueArgs t = a;  // (the pointers are not read: placeholders for v3_supported's test)
  alignas(16) static const float placeholder[4] = {};
  if (!t.token_inv) t.token_inv = placeholder;
  if (!t.token_w) t.token_w = placeholder;
  if (!with_mean) return v3_supported(t, true);
  PrologueArgs m = t;  // the mean pass of norm_rope_mean_quantize: no mean subtracted
  m.mean = nullptr;
  return v3_supported(m, false) && v3_supported(t, true);
}

}  // namespace cuda
}  // namespace lowbit
