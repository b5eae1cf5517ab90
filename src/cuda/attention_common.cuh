// Shared by the two INT8 attention kernels (SPEC §2): the launch parameters, the scale-layout
// index rule of SPEC §1, the causal visibility rule and the small conversions both kernels use.
// attention.cu holds the mma.sync kernel (sm_89/sm_90) and the host entry; attention_wgmma.cu the
// sm_90a wgmma kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "lowbit/dtype.h"
#include "lowbit/tensor.h"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2_448 = 8.807354922057604f;

struct AttnParams {
  const int8_t* q;  // (B, Nq, Hq, D) int8
  int64_t q_sb, q_sn, q_sh;
  const float* q_scale;  // (B, Hq, S)
  int64_t qs_sb, qs_sh, qs_ss;
  int q_layout, q_block;
  const int8_t* k;  // (B, Nkv, Hkv, D) int8
  int64_t k_sb, k_sn, k_sh;
  const float* k_scale;  // (B, Hkv, S)
  int64_t ks_sb, ks_sh, ks_ss;
  int k_layout, k_block;
  const void* v;             // fp8: (B, Hkv, D, npad) e4m3; 16-bit: (B, Nkv, Hkv, D)
  int64_t v_sb, v_sn, v_sh;  // 16-bit mode strides (elements)
  int64_t npad;
  const float* v_scale;  // (B, Hkv, D) or null (16-bit)
  const float* v_mean;   // (B, Hkv, D) or null
  const float* k_mean;   // (B, Hkv, D) or null
  void* out;             // (B, Nq, Hq, D) 16-bit
  int64_t o_sb, o_sn, o_sh;
  float* lse;  // (B, Hq, Nq) or null
  int64_t l_sb, l_sh, l_sn;
  int Nq, Nkv, Hq, Hkv, G;
  int causal;  // 0 none; else keys j < i + shift + 1 are visible
  int64_t shift;
  // Padded varlen batches (session 51, attention_varlen's buckets): batch item b holds kv_lens[b]
  // keys (the rest of its Nkv rows are padding, never visible) and q_lens[b] query rows (rows
  // past it are computed, not used; a CTA wholly past it skips its key tiles); with
  // shift_per_item, the causal shift of item b is kv_lens[b] - q_lens[b] (bottom-right). Null:
  // Nkv / Nq for every item.
  const int* kv_lens = nullptr;
  const int* q_lens = nullptr;
  bool shift_per_item = false;
  // With q_lens: out / lse rows of item b start at packed row q_rows[b] (out + q_rows[b] * o_sn,
  // lse + q_rows[b] * l_sn; o_sb / l_sb unused), and only its q_lens[b] rows are stored. Null:
  // item b at b * o_sb / b * l_sb.
  const int* q_rows = nullptr;
  float scale_log2, sm_scale;
  int causal_heads = 1;  // causal: heads per group of cta_work's longest-first walk (>= 1)
  // Bench only (null otherwise): round 3's per-CTA stamps, kAttnTraceWords words per CTA at its
  // linear block index (attention_wgmma.cu: r3_trace).
  unsigned long long* trace = nullptr;
  // Host only (launch_r3): the round-3 kernel's output rows through shared memory (kVar bit 9)
  // where it applies.
  bool staged_epilogue = false;
  // Host only (launch_r3; the bench's A/B, session 27): round 3 at D = 128 with the staged
  // epilogue releasing ring stages by each consumer warp's lane 0 after __syncwarp (kVar bit 11).
  bool lane0_release = false;
  // attention()'s q quantized inside the fp8 one-consumer kernel (session 57; kVar bit 13 of
  // the round-3 kernel): q16 (B, Nq, Hq, D) of the output's type (bf16 or f16) at element strides
  // q16_s*, no norm or rope, SPEC §1's THREAD_Q groups of 32-row blocks with sm_scale q16_sm_scale
  // and scale_eps q16_eps, the prologue pass's arithmetic value for value (the same codes and
  // scales). p.q and p.q_scale are not read then. Null: the codes and scales come from p.q /
  // p.q_scale.
  const void* q16 = nullptr;
  int64_t q16_sb = 0, q16_sn = 0, q16_sh = 0;
  float q16_sm_scale = 1.f, q16_eps = 0.f;
  // (> 0) the CTA this many linear block indices ahead gets its q rows prefetched into L2 by
  // producer warp 1 at this CTA's start (session 58's default; session 59: causal grids too,
  // the CTA's work read through cta_work_at; tuning fused_q)
  int q16_ahead = 0;
  // Host only (launch_r3): the one-consumer kernel's non-causal grid with the heads fastest
  // (kVar bit 14) where it applies.
  bool heads_inner = false;
};
constexpr int kAttnTraceWords = 16;

// The query block and head of this CTA in a grid (query blocks, Hq, B). Causal: the hardware
// starts CTAs in linear order (x fastest); read as below, that order is longest-first across a
// group of p.causal_heads heads (every head's longest query block, then every head's second
// longest, ...), the groups one after the other. Each head alone (causal_heads = 1, the order
// before session 25) left the last heads' longest blocks to the last wave. The host sizes a group
// so that its K / V stay in L2 together (attention.cu).
struct CtaWork {
  int qb, h;
};
// kHeadsInner (non-causal): a grid (Hq, query blocks, B), heads fastest, so that the CTAs
// running together read whole query rows of all heads (round 3's kVar bit 14).
// cta_work_at: the same for the CTA at (x, y) of this grid (attention()'s q prefetch reads the
// work of a CTA further on).
template <bool kHeadsInner = false>
__device__ __forceinline__ CtaWork cta_work_at(const AttnParams& p, int x, int y) {
  if (kHeadsInner && !p.causal) return {y, x};
  if (!p.causal) return {x, y};
  const int nqb = static_cast<int>(gridDim.x);
  const int lin = x + nqb * y;
  const int hg = p.causal_heads, g = lin / (nqb * hg), r = lin - g * nqb * hg;
  const int hcount = min(hg, p.Hq - g * hg);  // the last group may be short
  return {nqb - 1 - r / hcount, g * hg + r % hcount};
}
template <bool kHeadsInner = false>
__device__ __forceinline__ CtaWork cta_work(const AttnParams& p) {
  return cta_work_at<kHeadsInner>(p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y));
}

// SPEC §1 scale index of `row` (layout: 0 per_block, 1 thread_q, 2 thread_k, 3 warp_q).
__device__ __forceinline__ int64_t scale_index_dev(int layout, int block, int64_t row) {
  const int64_t r = row % block;
  int64_t group = 0, groups = 1;
  if (layout == 1) {
    group = r % 8;
    groups = 8;
  } else if (layout == 2) {
    group = (r % 8) / 2;
    groups = 4;
  } else if (layout == 3) {
    group = r / 32;
    groups = 4;
  }
  return (row / block) * groups + group;
}

// The q scale of `row` of (batch b, head h), 0 past Nq, raised to the smallest normal float: the
// wgmma kernels' logits are s * q, and a zero q scale (rows past Nq, an all-zero q row) would turn
// masked keys (s = -inf) into NaN; every visible logit is then ~0, as the oracle's exact 0 (the
// K-mean LSE term too).
__device__ __forceinline__ float q_scale_floor(const AttnParams& p, int b, int h, int64_t row) {
  const float* qsg = p.q_scale + b * p.qs_sb + h * p.qs_sh;
  const float qs = row < p.Nq ? qsg[scale_index_dev(p.q_layout, p.q_block, row) * p.qs_ss] : 0.f;
  return fmaxf(qs, 1.17549435e-38f);
}

// What a CTA of kRows query rows works on: its head, batch item and kv head, its first query row,
// the key tiles of kTile keys up to the visible end of its last row (cta_work's order), and its
// batch item's key count and causal shift (p.Nkv / p.shift unless the batch is a padded varlen
// one: AttnParams::kv_lens).
struct CtaTiles {
  int h, b, hk;
  int64_t q0;
  int n_tiles;
  int nkv;
  int64_t shift;
};

// The output rows of batch item b: how many are stored, and the element offsets of its row 0 in
// out and lse (a padded varlen batch: AttnParams::q_lens / q_rows).
struct OutRows {
  int64_t n, out, lse;
};
__device__ __forceinline__ OutRows out_rows(const AttnParams& p, int b) {
  OutRows r{p.Nq, b * p.o_sb, b * p.l_sb};
  if (p.q_lens) r.n = __ldg(p.q_lens + b);
  if (p.q_rows) {
    const int64_t row = __ldg(p.q_rows + b);
    r.out = row * p.o_sn, r.lse = row * p.l_sn;
  }
  return r;
}

// One past the last key query `row` sees (clamped to [0, the item's keys]).
__device__ __forceinline__ int64_t visible_end(const AttnParams& p, const CtaTiles& ct,
                                               int64_t row) {
  if (!p.causal) return ct.nkv;
  int64_t e = row + ct.shift + 1;
  return e < 0 ? 0 : (e > ct.nkv ? ct.nkv : e);
}

template <int kRows, int kTile, bool kHeadsInner = false>
__device__ __forceinline__ CtaTiles cta_tiles(const AttnParams& p) {
  const CtaWork work = cta_work<kHeadsInner>(p);
  CtaTiles ct;
  ct.h = work.h, ct.b = static_cast<int>(blockIdx.z), ct.hk = work.h / p.G;
  ct.q0 = static_cast<int64_t>(work.qb) * kRows;
  int nq = p.Nq;
  ct.nkv = p.Nkv, ct.shift = p.shift;
  if (p.kv_lens) {
    ct.nkv = __ldg(p.kv_lens + ct.b);
    nq = __ldg(p.q_lens + ct.b);
    if (p.shift_per_item) ct.shift = static_cast<int64_t>(ct.nkv) - nq;
  }
  const int64_t last_row = min(ct.q0 + kRows, static_cast<int64_t>(nq)) - 1;
  const int64_t kv_end = last_row < ct.q0 ? 0 : visible_end(p, ct, last_row);
  ct.n_tiles = static_cast<int>((kv_end + kTile - 1) / kTile);
  return ct;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Scores of the mma fragments' column blocks j = J0 .. J0 + 7 (s[4 j + e]; row g: e = 0, 1, row
// g + 8: e = 2, 3): s <- exp2(s qs - off) with each row's qs / off, and the two rows' sums of
// these 16 values each, added as a pairwise tree (the kernels' fixed order).
template <int J0, int N>
__device__ __forceinline__ void exp2_rows8(float (&s)[N], float qs0, float qs1, float off0,
                                           float off1, float& sum0, float& sum1) {
  static_assert(4 * (J0 + 8) <= N, "column blocks J0 .. J0 + 7 lie in s");
  float a0[8], a1[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = J0 + i;
    s[4 * j + 0] = fast_exp2(fmaf(s[4 * j + 0], qs0, -off0));
    s[4 * j + 1] = fast_exp2(fmaf(s[4 * j + 1], qs0, -off0));
    s[4 * j + 2] = fast_exp2(fmaf(s[4 * j + 2], qs1, -off1));
    s[4 * j + 3] = fast_exp2(fmaf(s[4 * j + 3], qs1, -off1));
    a0[i] = s[4 * j + 0] + s[4 * j + 1];
    a1[i] = s[4 * j + 2] + s[4 * j + 3];
  }
#pragma unroll
  for (int w = 4; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i) {
      a0[i] += a0[i + w];
      a1[i] += a1[i + w];
    }
  sum0 = a0[0];
  sum1 = a1[0];
}

// Four e4m3 codes (round to nearest even, saturating) of x0..x3, x0 in the low byte.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
#else
  return static_cast<uint32_t>(dt::f32_to_e4m3(x0)) | (uint32_t{dt::f32_to_e4m3(x1)} << 8) |
         (uint32_t{dt::f32_to_e4m3(x2)} << 16) | (uint32_t{dt::f32_to_e4m3(x3)} << 24);
#endif
}

template <typename T16>
__device__ __forceinline__ uint32_t pack_16x2(float lo, float hi) {
  if constexpr (std::is_same<T16, __nv_bfloat16>::value) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <typename T16>
__device__ __forceinline__ float to_f32(T16 x) {
  if constexpr (std::is_same<T16, __nv_bfloat16>::value)
    return __bfloat162float(x);
  else
    return __half2float(x);
}

// ---- device helpers of the sm_90a wgmma kernels (attention_wgmma.cu: D 64 / 128;
// attention_wgmma256.cu: D 256). The wgmma wrappers are empty outside sm_90a.

// K-major, 64-byte swizzle (rows of 64 bytes: a D = 64 int8 row, as TMA's SWIZZLE_64B writes
// them; 16-byte chunk c of row r at c ^ ((r >> 1) & 3)), 8-row atoms 512 bytes apart; a 32-byte
// k-step at +32 bytes (+2 in the address field), as with the 128-byte swizzle.
__device__ __forceinline__ uint64_t smem_desc_sw64(uint32_t addr) {
  return ptx::wgmma_desc(addr, 16, 512, 2);
}
// The MN-major 16-bit V tile: 8-key groups 1024 bytes apart; each wgmma there spans one
// 64-channel atom column, so the leading byte offset (the other stride) never matters: 1024 too,
// which is right under either reading of the two fields.
__device__ __forceinline__ uint64_t smem_desc_mn(uint32_t addr) {
  return ptx::wgmma_desc(addr, 1024, 1024, 1);
}

// d (64 x 128 f32) (+)= A (64 x 32 e4m3, registers) · B (128 x 32 e4m3, shared, K-major)^T.
__device__ __forceinline__ void wgmma_e4m3_n128(float (&d)[64], const uint32_t (&a)[4],
                                              uint64_t desc_b, int accumulate) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#endif
}


// d (64 x 128 f32) = A (64 x 32 e4m3, registers) · B (128 x 32 e4m3, shared)^T, d written only.
__device__ __forceinline__ void wgmma_e4m3_n128_first(float (&d)[64], const uint32_t (&a)[4],
                                                      uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]),
        "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]),
        "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]),
        "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]),
        "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]),
        "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]),
        "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]),
        "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]),
        "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]),
        "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
#endif
}


// d (64 x 64 f32) (+)= A (64 x 32 e4m3, registers) · B (64 x 32 e4m3, shared, K-major)^T.
__device__ __forceinline__ void wgmma_e4m3_n64(float (&d)[32], const uint32_t (&a)[4],
                                              uint64_t desc_b, int accumulate) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
#endif
}

// Pins accumulator registers after wgmma.wait_group: the compiler sees a wgmma's outputs as
// defined at its issue, so without this it could move their reads above the wait.
template <int N>
__device__ __forceinline__ void fence_regs(int32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// d[kOff .. kOff + 31] (64 x 64 f32) += A (64 x 16 bf16, registers) · B (16 x 64 bf16, shared,
// MN-major: imm-trans-b = 1).
template <int kOff, int kN>
__device__ __forceinline__ void wgmma_bf16_n64(float (&d)[kN], const uint32_t (&a)[4],
                                              uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[kOff + 0]), "+f"(d[kOff + 1]), "+f"(d[kOff + 2]), "+f"(d[kOff + 3]),
        "+f"(d[kOff + 4]), "+f"(d[kOff + 5]), "+f"(d[kOff + 6]), "+f"(d[kOff + 7]),
        "+f"(d[kOff + 8]), "+f"(d[kOff + 9]), "+f"(d[kOff + 10]), "+f"(d[kOff + 11]),
        "+f"(d[kOff + 12]), "+f"(d[kOff + 13]), "+f"(d[kOff + 14]), "+f"(d[kOff + 15]),
        "+f"(d[kOff + 16]), "+f"(d[kOff + 17]), "+f"(d[kOff + 18]), "+f"(d[kOff + 19]),
        "+f"(d[kOff + 20]), "+f"(d[kOff + 21]), "+f"(d[kOff + 22]), "+f"(d[kOff + 23]),
        "+f"(d[kOff + 24]), "+f"(d[kOff + 25]), "+f"(d[kOff + 26]), "+f"(d[kOff + 27]),
        "+f"(d[kOff + 28]), "+f"(d[kOff + 29]), "+f"(d[kOff + 30]), "+f"(d[kOff + 31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
#endif
}

// d[kOff .. kOff + 31] (64 x 64 f32) += A (64 x 16 f16, registers) · B (16 x 64 f16, shared,
// MN-major: imm-trans-b = 1).
template <int kOff, int kN>
__device__ __forceinline__ void wgmma_f16_n64(float (&d)[kN], const uint32_t (&a)[4],
                                              uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[kOff + 0]), "+f"(d[kOff + 1]), "+f"(d[kOff + 2]), "+f"(d[kOff + 3]),
        "+f"(d[kOff + 4]), "+f"(d[kOff + 5]), "+f"(d[kOff + 6]), "+f"(d[kOff + 7]),
        "+f"(d[kOff + 8]), "+f"(d[kOff + 9]), "+f"(d[kOff + 10]), "+f"(d[kOff + 11]),
        "+f"(d[kOff + 12]), "+f"(d[kOff + 13]), "+f"(d[kOff + 14]), "+f"(d[kOff + 15]),
        "+f"(d[kOff + 16]), "+f"(d[kOff + 17]), "+f"(d[kOff + 18]), "+f"(d[kOff + 19]),
        "+f"(d[kOff + 20]), "+f"(d[kOff + 21]), "+f"(d[kOff + 22]), "+f"(d[kOff + 23]),
        "+f"(d[kOff + 24]), "+f"(d[kOff + 25]), "+f"(d[kOff + 26]), "+f"(d[kOff + 27]),
        "+f"(d[kOff + 28]), "+f"(d[kOff + 29]), "+f"(d[kOff + 30]), "+f"(d[kOff + 31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
#endif
}

template <typename T16, int kOff, int kN>
__device__ __forceinline__ void wgmma_16(float (&d)[kN], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (std::is_same<T16, __nv_bfloat16>::value)
    wgmma_bf16_n64<kOff>(d, a, desc);
  else
    wgmma_f16_n64<kOff>(d, a, desc);
}

// float(x) for |x| <= 2^22 without the conversion unit (I2F runs at a quarter of the FP32
// rate on sm_90, on the pipe ex2 also needs): 0x4B400000 is 1.5 * 2^23, so its bits plus x are
// the float 1.5 * 2^23 + x exactly, and subtracting 1.5 * 2^23 is exact. Bit-identical to
// static_cast<float>(x) in that range; q k^T of int8 codes is within it for D <= 256
// (|acc| <= D * 128 * 128).
__device__ __forceinline__ float exact_i2f(int32_t x) {
  return __fsub_rn(__int_as_float(x + 0x4B400000), 12582912.f);
}

// scale_index_dev for the producers (rows >= 0, < 2^31): set up once per CTA, then shifts and
// masks when the block is a power of two (every SPEC §1 quantizer's), one 32-bit division
// otherwise. Run 4 -> run 6: round 3 went from 548 to 679 TOPS at (1, 40, 32760, 128) when its TMA
// producer warp's per-tile 64-bit div/mod (4 keys per lane) became 32-bit: the producer warp
// shares a scheduler with two consumer warps and delayed every tile's publication.
struct ScaleIdx {
  int layout, block, shift, mask;
  bool pow2;
  __device__ __forceinline__ explicit ScaleIdx(int l, int blk)
      : layout(l), block(blk), shift(0), mask(blk - 1), pow2((blk & (blk - 1)) == 0) {
#if defined(__CUDA_ARCH__)
    shift = __popc(blk - 1);  // log2(blk) when blk is a power of two
#endif
  }
  __device__ __forceinline__ int operator()(int row) const {
    int q, r;
    if (pow2) {
      q = row >> shift;
      r = row & mask;
    } else {
      q = row / block;
      r = row - q * block;
    }
    if (layout == 1) return q * 8 + (r & 7);
    if (layout == 2) return q * 4 + ((r & 7) >> 1);
    if (layout == 3) return q * 4 + (r >> 5);
    return q;
  }
};

// Named barrier `id` over `threads` threads (sync: arrive and wait; arrive: do not wait).
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// d (64 x 64 f32) = A (64 x 32 e4m3, registers) · B (64 x 32 e4m3, shared)^T, d written only.
__device__ __forceinline__ void wgmma_e4m3_n64_first(float (&d)[32], const uint32_t (&a)[4],
                                                     uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]),
        "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]),
        "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]),
        "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
        "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]),
        "=f"(d[30]), "=f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
#endif
}

// True in every thread of the `threads`-thread group synchronizing on named barrier `id` when
// `pred` holds in all of them (bar.red.and: also a barrier for those threads).
__device__ __forceinline__ bool wg_all(bool pred, int id) {
  int r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.and.pred q, %2, 128, p;\n"
      "selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<int>(pred)), "r"(id)
      : "memory");
  return r != 0;
}

// Sums over the four threads of an mma accumulator quad (lanes 4 g .. 4 g + 3), for two values
// at once: xor 1, then xor 2, in that order (every thread gets the same sum).
__device__ __forceinline__ void quad_sum2(float& a, float& b) {
  a += __shfl_xor_sync(0xffffffffu, a, 1);
  a += __shfl_xor_sync(0xffffffffu, a, 2);
  b += __shfl_xor_sync(0xffffffffu, b, 1);
  b += __shfl_xor_sync(0xffffffffu, b, 2);
}

// The LSE (natural log) of this thread's rows row0 and row1 with the K-mean correction
// q_dequant · k_mean (store_rows' q_rows / q_row / q_byte); l0, l1 the rows' full sums.
template <int D, bool FP8, int R1, typename QRow, typename QByte>
__device__ __forceinline__ void store_lse(const AttnParams& p, int b, int h, int64_t hv,
                                          int64_t row0, int64_t row1, float qs0, float qs1, int t,
                                          float m0, float m1, float l0, float l1, bool q_rows,
                                          QRow q_row, QByte q_byte) {
  const float p_offset = FP8 ? kLog2_448 : 0.f;
  if (p.lse) {
    float corr0 = 0.f, corr1 = 0.f;
    if (p.k_mean && q_rows) {  // q_dequant · k_mean: channels t, t+4, ... then the quad sum
      const int8_t* qr0 = q_row();
      const int8_t* qr1 = qr0 + R1;
      const float* km = p.k_mean + hv * D;
#pragma unroll 8
      for (int i = 0; i < D / 4; ++i) {  // (unrolled: the k_mean loads overlap)
        const int d = t + 4 * i;
        const int byte = q_byte(d);
        corr0 += static_cast<float>(qr0[byte]) * qs0 * km[d];
        corr1 += static_cast<float>(qr1[byte]) * qs1 * km[d];
      }
      quad_sum2(corr0, corr1);
    }
    if (t == 0) {
      const OutRows rows = out_rows(p, b);
      float* lg = p.lse + rows.lse + h * p.l_sh;
      if (row0 < rows.n)
        lg[row0 * p.l_sn] =
            l0 > 0.f ? (m0 + log2f(l0) - p_offset) * kLn2 + corr0 * p.sm_scale : -INFINITY;
      if (row1 < rows.n)
        lg[row1 * p.l_sn] =
            l1 > 0.f ? (m1 + log2f(l1) - p_offset) * kLn2 + corr1 * p.sm_scale : -INFINITY;
    }
  }
}

// The epilogue both kernel families share (attention.cu's mma.sync kernel, the wgmma kernels), for
// this thread's rows row0 and row1 = row0 + 8 of an mma accumulator quad (thread t holds channels
// 8 n + 2 t + e): full row sums, normalization, V scale and mean, 16-bit stores, and the LSE
// (natural log) with the K-mean correction q_dequant · k_mean. o_at(n, i): the accumulator of
// channel group n, i = 2 r + e (row r, channel 8 n + 2 t + e). With q_rows (and p.lse, p.k_mean):
// q_row() is row0's int8 Q row in shared memory, row1's lies R1 bytes after it, and q_byte(d) is
// channel d's byte in such a row (the kernel's Q tile layout).
template <int D, bool FP8, typename T16, int R1, int kGroupMax = 8, typename OAt, typename QRow,
          typename QByte>
__device__ __forceinline__ void store_rows(const AttnParams& p, int b, int h, int hk, int64_t row0,
                                           int64_t row1, float qs0, float qs1, int t, float m0,
                                           float m1, float l0, float l1, OAt o_at, bool q_rows,
                                           QRow q_row, QByte q_byte) {
  quad_sum2(l0, l1);
  const int64_t hv = static_cast<int64_t>(b) * p.Hkv + hk;
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const OutRows rows = out_rows(p, b);
  T16* og = static_cast<T16*>(p.out) + rows.out + h * p.o_sh;
  // V's scales and means of a group of kGroup channel groups are loaded before that group's
  // stores: the compiler cannot move a load of p.v_scale above a store through og (they may
  // alias), so loading each next to its stores waited one L2 round trip per channel group, 16
  // in a row per thread at D = 128 (H200 Nsight Compute, session 21: the epilogue's FFMAs on
  // long-scoreboard stalls, ~3.5 % of the round-3 kernel's warp samples with 72 key tiles per
  // CTA, a per-CTA cost).
  // (The wgmma kernels: one group of all D / 8 up to D = 128, 64 registers free after their main
  // loop; the mma.sync kernel and D = 256: 8.)
  constexpr int kGroup = D / 8 < kGroupMax ? D / 8 : kGroupMax;
  static_assert((D / 8) % kGroup == 0, "channel groups");
#pragma unroll
  for (int n0 = 0; n0 < D / 8; n0 += kGroup) {
    float sc[kGroup][2], mv[kGroup][2];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int col = (n0 + j) * 8 + 2 * t;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[j][e] = FP8 ? p.v_scale[hv * D + col + e] : 1.f;
        mv[j][e] = FP8 && p.v_mean ? p.v_mean[hv * D + col + e] : 0.f;
      }
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int n = n0 + j, col = n * 8 + 2 * t;
      const float sc0 = sc[j][0], sc1 = sc[j][1], mv0 = mv[j][0], mv1 = mv[j][1];
      if (row0 < rows.n) {
        const float a = l0 > 0.f ? o_at(n, 0) * inv0 * sc0 + mv0 : 0.f;
        const float c = l0 > 0.f ? o_at(n, 1) * inv0 * sc1 + mv1 : 0.f;
        *reinterpret_cast<uint32_t*>(og + row0 * p.o_sn + col) = pack_16x2<T16>(a, c);
      }
      if (row1 < rows.n) {
        const float a = l1 > 0.f ? o_at(n, 2) * inv1 * sc0 + mv0 : 0.f;
        const float c = l1 > 0.f ? o_at(n, 3) * inv1 * sc1 + mv1 : 0.f;
        *reinterpret_cast<uint32_t*>(og + row1 * p.o_sn + col) = pack_16x2<T16>(a, c);
      }
    }
  }
  store_lse<D, FP8, R1>(p, b, h, hv, row0, row1, qs0, qs1, t, m0, m1, l0, l1, q_rows, q_row,
                        q_byte);
}

// store_rows' output values (fp8 P·V) through shared memory (session 26, the round-3 kernel's
// kVar bit 9): a warpgroup's 64 rows x D bf16 / f16 values go into `stage` in kParts parts of
// D / kParts channels (64 rows of 2 D / kParts bytes; 16-byte chunk c of row r at chunk c ^ (r &
// 7), so that the 8 rows of a 4-byte store and the 8 chunks of a 16-byte load each fall on
// distinct banks), each part out after the warpgroup's named barrier `bar_id` as 16-byte stores
// of whole row parts: 2 D / 16 stores per row instead of D / 2 4-byte ones spread over 8 rows
// each (the direct form's 32 stores per thread at D = 128 each touched 8 half-filled sectors).
// Nothing of the warpgroup may read `stage` any more when this starts (a barrier comes first).
// Needs 16-byte aligned output rows (the host checks). wg_row0: the warpgroup's first row; r0:
// this thread's first row within it (its second is r0 + 8); tw: the thread's index in the
// warpgroup; l0, l1: the rows' full sums. The same values as store_rows.
template <int D, typename T16, int kParts>
__device__ __forceinline__ void store_rows_staged(const AttnParams& p, int b, int h, int hk,
                                                  int64_t wg_row0, int r0, int t, int tw, float l0,
                                                  float l1, const float (&o)[D / 2], uint8_t* stage,
                                                  int bar_id) {
  constexpr int kRowBytes = 2 * D / kParts, kChunks = kRowBytes / 16, kGroups = D / 8 / kParts;
  static_assert(kChunks >= 8, "the swizzle needs 8 chunks per row");
  const int64_t hv = static_cast<int64_t>(b) * p.Hkv + hk;
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const float2* vs = reinterpret_cast<const float2*>(p.v_scale + hv * D);
  const float2* vm = p.v_mean ? reinterpret_cast<const float2*>(p.v_mean + hv * D) : nullptr;
  float2 sc[D / 8], mv[D / 8];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {  // all loads first (no store in between: see store_rows)
    sc[n] = vs[4 * n + t];
    mv[n] = vm ? vm[4 * n + t] : make_float2(0.f, 0.f);
  }
  uint8_t* s0 = stage + r0 * kRowBytes + 4 * t;
  uint8_t* s1 = s0 + 8 * kRowBytes;
  const int sw = r0 & 7;  // rows r0 and r0 + 8 share it
  const OutRows rows = out_rows(p, b);
  T16* og = static_cast<T16*>(p.out) + rows.out + h * p.o_sh;
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
    named_bar_sync(bar_id, 128);  // the stage is free (its last reads are done)
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int n = part * kGroups + j;
      const float a0 = l0 > 0.f ? o[4 * n + 0] * inv0 * sc[n].x + mv[n].x : 0.f;
      const float c0 = l0 > 0.f ? o[4 * n + 1] * inv0 * sc[n].y + mv[n].y : 0.f;
      const float a1 = l1 > 0.f ? o[4 * n + 2] * inv1 * sc[n].x + mv[n].x : 0.f;
      const float c1 = l1 > 0.f ? o[4 * n + 3] * inv1 * sc[n].y + mv[n].y : 0.f;
      const int off = (j ^ sw) * 16;
      *reinterpret_cast<uint32_t*>(s0 + off) = pack_16x2<T16>(a0, c0);
      *reinterpret_cast<uint32_t*>(s1 + off) = pack_16x2<T16>(a1, c1);
    }
    named_bar_sync(bar_id, 128);
#pragma unroll
    for (int k = 0; k < 64 * kChunks / 128; ++k) {
      const int c = k * 128 + tw, r = c / kChunks, ch = c % kChunks;
      const uint4 v =
          *reinterpret_cast<const uint4*>(stage + r * kRowBytes + ((ch ^ (r & 7)) * 16));
      const int64_t row = wg_row0 + r;
      if (row < rows.n)
        *reinterpret_cast<uint4*>(og + row * p.o_sn + part * (D / kParts) + ch * 8) = v;
    }
  }
}

// Epilogue of the wgmma kernels for this thread's rows row0 = q0 + rl0 and row1 = row0 + 8 (O in
// the m64nD accumulator layout: registers 4n + 2h + e, row g + 8h, channel 8n + 2t + e), by
// store_rows; the K-mean correction reads the swizzled Q tile at sq when q_loaded. kQRow: bytes
// per Q row in shared memory, 128 (128-byte swizzle) or 64 (64-byte swizzle: the D = 64 TMA
// producer's Q). kQChunk: 0 (a row holds all D channels), or D = 256: channels 128 c .. 128 c +
// 127 in 128-byte rows of chunk c, kQChunk bytes after chunk c - 1.
// kStaged (fp8 P·V, the round-3 kernel): the values through store_rows_staged in kParts parts,
// with this warpgroup's `stage` (64 x 2 D / kParts bytes; it may be the warpgroup's Q rows), its
// first row wg_row0, the thread's index tw in it and the warpgroup's named barrier bar_id.
template <int D, bool FP8, typename T16, int kQRow = 128, int kQChunk = 0, bool kStaged = false,
          int kParts = 1>
__device__ __forceinline__ void epilogue(const AttnParams& p, int b, int h, int hk, int rl0,
                                         int64_t row0, int64_t row1, float qs0, float qs1, int t,
                                         const uint8_t* sq, bool q_loaded, float (&o)[D / 2],
                                         float m0, float m1, float l0, float l1,
                                         uint8_t* stage = nullptr, int64_t wg_row0 = 0, int tw = 0,
                                         int bar_id = 0) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Q rows rl0 and rl0 + 8 share (row & 7), so they share the swizzle pattern.
  static_assert(kQRow == 128 || (kQRow == 64 && D == 64), "Q row layout");
  static_assert(kQChunk == 0 || kQRow == 128, "Q chunks of 128-byte rows");
  static_assert(!kStaged || (FP8 && D <= 128), "staged stores: fp8 P·V, D <= 128");
  auto q_row = [&] { return reinterpret_cast<const int8_t*>(sq + rl0 * kQRow); };
  auto q_byte = [&](int d) {
    const int sw = kQRow == 128 ? (rl0 & 7) : ((rl0 >> 1) & 3);
    return kQChunk == 0 ? ((((d >> 4) ^ sw) << 4) | (d & 15))
                        : (d >> 7) * kQChunk + ((((d >> 4) & 7) ^ sw) << 4) + (d & 15);
  };
  if constexpr (kStaged) {
    quad_sum2(l0, l1);
    // (the LSE first: its K-mean correction reads the Q rows, which may be the stage)
    store_lse<D, FP8, 8 * kQRow>(p, b, h, static_cast<int64_t>(b) * p.Hkv + hk, row0, row1, qs0,
                                 qs1, t, m0, m1, l0, l1, q_loaded, q_row, q_byte);
    store_rows_staged<D, T16, kParts>(p, b, h, hk, wg_row0, rl0 & 63, t, tw, l0, l1, o, stage,
                                      bar_id);
  } else {
    store_rows<D, FP8, T16, 8 * kQRow, (D <= 128 ? 16 : 8)>(
        p, b, h, hk, row0, row1, qs0, qs1, t, m0, m1, l0, l1,
        [&](int n, int i) { return o[4 * n + i]; }, q_loaded, q_row, q_byte);
  }
#endif
}

// ---- the sm_90a wgmma kernel (attention_wgmma.cu) ---------------------------------------------

// True when the current device runs the wgmma kernel: sm_90 with the sm_90a image present.
bool wgmma_attention_available();
// Whether the wgmma kernel covers head dim D (64 or 128; both P·V modes).
inline bool wgmma_attention_applies(int D) { return D == 64 || D == 128; }
// The sm_90a kernels: round1 (two warpgroups, cp.async double buffer; 16-bit P·V always runs
// it) and round3 (fp8 P·V: a producer warpgroup feeding a 5-stage K/V ring on mbarriers, TMA at
// D = 128, two ping-pong consumer warpgroups with few instructions per logit). (Round 2 `ws`,
// rounds 4 and 5 and the biased-logit twins: removed in session 8, all slower than
// round3_i2fp_no_turn.)
enum class WgmmaKernel {
  round1,
  round3,
  // round 3 + I2FP logits without the consumers' ping-pong turns (same bits as round 3; bf16
  // output with per-half k scales, and the TMA producer at D = 128, else round 3): auto at
  // D = 128 since H200 run 10
  round3_i2fp_no_turn,
  // round3_i2fp_no_turn with three consumer warpgroups (192 query rows per CTA) at D = 64, fed
  // by a TMA producer warp (setmaxnreg 24; Q and K in 64-byte rows, 64-byte swizzle) with the
  // consumers at 160 registers; same bits; per-half k scales (any 16-bit output since session
  // 60; bf16 only before), else (and at
  // D = 128) round3_i2fp_no_turn / round 3; bench knob cons3. auto at D = 64 since H200 run 16
  round3_i2fp_no_turn_c3,
  // round3_i2fp_no_turn with one consumer warpgroup (64 query rows per CTA, a 3-stage ring) and
  // two CTAs per multiprocessor at D = 128 and 64 (TMA producer, setmaxnreg 24 / 232); same
  // bits; per-half k scales (bf16 or f16 output), else round3_i2fp_no_turn / round 3; auto up to
  // kC1MaxKeys / kC1MaxKeysD64 keys (attention.cu), tuning knob cons1
  round3_i2fp_no_turn_c1
};
// Launches a wgmma kernel. B batches; D 64 or 128; fp8 or 16-bit P·V; out bf16 or f16 (the
// 16-bit V has out's dtype).
void launch_attention_wgmma(const AttnParams& p, int B, int D, bool fp8, DType out_dtype,
                            WgmmaKernel which, cudaStream_t stream);

// The fp8 P·V kernel at D = 128 or (session 59) 64 quantizing 16-bit q itself (p.q16, session
// 57), q and the output both of `dtype` (bf16, or since session 60 f16): on one consumer
// warpgroup (round3_i2fp_no_turn_c1) where `one_consumer`, else (session 61) the long-key
// kernels auto runs on the codes (round3_i2fp_no_turn at D = 128, its three-consumer form at
// D = 64). False, launching nothing, where it does not apply (k scales not constant per 64-key
// half, a TMA descriptor that cannot be made); the caller then quantizes q and launches the
// kernel on the codes. Needs wgmma_attention_available().
bool launch_attention_wgmma_q16(const AttnParams& p, int B, int D, DType dtype, bool one_consumer,
                                cudaStream_t stream);

// The sm_90a head-dim-256 kernel (attention_wgmma256.cu; fp8 or 16-bit P·V, out bf16 or f16):
// a TMA producer warp feeding a ring of 64-key stages, two consumer warpgroups of 64 rows.
// Returns false without launching when a TMA descriptor cannot be made for these tensors (the
// caller then runs the mma.sync kernel). Needs wgmma_attention_available().
bool launch_attention_wgmma256(const AttnParams& p, int B, bool fp8, DType out_dtype,
                               cudaStream_t stream);
// The same kernel at head dim 64 or 128 for 16-bit P·V (session 13; int8 rows of 64 bytes in the
// 64-byte swizzle at D = 64, up to 8 ring stages): auto's 16-bit P·V kernel at D 64 / 128 on an
// sm_90 GPU with the sm_90a build (kAutoPv16Ring in attention.cu), `kernel = wgmma_r3` by name.
// Returns false without launching when no TMA descriptor addresses the tensors, or D is not 64 /
// 128. Needs wgmma_attention_available(). cons: the consumer warpgroups at D = 64, 3 or 4 (0: the
// default, 4; the tuning knob ring_cons); at D = 128 1 runs one consumer per CTA and two CTAs per
// multiprocessor (session 54), else three. q16 (session 61): the kernel quantizing 16-bit q
// itself (p.q16 of out_dtype; the q-in-kernel form of attention()), false without launching where
// the k scales are not constant per 64-key half or at D = 64 on three consumers.
bool launch_attention_wgmma_pv16(const AttnParams& p, int B, int D, DType out_dtype,
                                 cudaStream_t stream, int cons = 0, bool q16 = false);

}  // namespace attn
}  // namespace cuda
}  // namespace lowbit
