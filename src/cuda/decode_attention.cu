// CUDA split-K decode attention over an fp16 / bf16 / int4 / fp8 KV cache.
//
// Grid (split, kv head x row chunk, batch); 128 threads. One CTA reads its chunk of K and V of one
// KV head exactly once, for all G*Mq query rows of that head (up to 16 rows per CTA; more rows run
// as further row chunks). Per tile of 32 keys:
//   load   cp.async (16/8/4-byte, by alignment) of the raw K/V rows into a 3-stage smem ring;
//   scores teams of T lanes per key; each lane dequantizes 16 bytes of the K row in registers and
//          dots them with the query rows (fp32, q pre-scaled by sm_scale*log2 e), shuffles sum;
//   softmax one warp per row: running max / sum in base 2 (online softmax, fp32);
//   PV     each thread owns DV output columns of every row and a stride of the tile's keys; V is
//          dequantized from smem in registers; fp32 accumulation.
// The CTA writes its partial (O, LSE) into the workspace; decode_merge_kernel reduces the splits.
// Keys with no visible query (past seq_len, causal, bias -inf) give p = 0; a split or row with no
// key gives O = 0 and LSE = -inf, never NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "src/core/convert_elem.h"
#include "src/core/dispatch.h"
#include "src/core/indexing.h"
#include "src/cuda/decode_common.cuh"

namespace lowbit {
namespace cuda {
namespace {

using namespace decode_detail;

constexpr int kThreads = 128;
constexpr int kTileKeys = 32;
constexpr int kStages = 3;
constexpr int kMaxRows = 16;  // query rows per CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

// Bytes of one smem row (row_bytes rounded up to 16).
__host__ __device__ __forceinline__ int padded_row(int row_bytes) { return (row_bytes + 15) & ~15; }

template <int D, int ROWS>
struct Smem {
  static size_t bytes(int row_bytes) {
    return sizeof(float) * ROWS * D                                   // q (then the O reduction)
           + static_cast<size_t>(kStages) * 2 * kTileKeys * padded_row(row_bytes)  // K, V ring
           + sizeof(uint32_t) * kStages * 2 * kTileKeys                 // fp8 scale/shift ring
           + sizeof(float) * 2 * ROWS * kTileKeys                       // scores, p^T
           + sizeof(float) * 3 * ROWS;                                  // m, l, alpha
  }
};

// Elements one lane of a score team dequantizes per key: 16 bytes of codes.
template <KvFormat F>
struct Fmt;
template <>
struct Fmt<KvFormat::int4> {
  static constexpr int kPerLane = 32;  // 4 words x 8 nibbles
  static constexpr int kPerWord = 8;
};
template <>
struct Fmt<KvFormat::fp8> {
  static constexpr int kPerLane = 16;
  static constexpr int kPerWord = 4;
};
template <>
struct Fmt<KvFormat::f16> {
  static constexpr int kPerLane = 8;
  static constexpr int kPerWord = 2;
};
template <>
struct Fmt<KvFormat::bf16> {
  static constexpr int kPerLane = 8;
  static constexpr int kPerWord = 2;
};

// Dequantizes the `n` elements of code word `w` starting at element `first` (within the word)
// of a row whose element index of the word's element 0 is `elem0`.
template <KvFormat F>
__device__ __forceinline__ void dequant_word(uint32_t w, const uint32_t* row, uint32_t ss,
                                             int elem0, int group_size, int first, int n,
                                             float* out) {
  if constexpr (F == KvFormat::int4) {
    const uint32_t coef = row[elem0 / group_size];
    const float scale = __half2float(__ushort_as_half(static_cast<unsigned short>(coef & 0xffffu)));
    const float shift = __half2float(__ushort_as_half(static_cast<unsigned short>(coef >> 16)));
    // code as float via the 2^23 magic (exact); code * scale is exact in fp32, so the fma rounds
    // once, like the CPU's multiply-then-add.
#pragma unroll
    for (int e = 0; e < n; ++e) {
      const float code =
          __uint_as_float(((w >> (4 * (first + e))) & 0xfu) | 0x4B000000u) - 8388608.f;
      out[e] = fmaf(code, scale, shift);
    }
  } else if constexpr (F == KvFormat::fp8) {
    const float scale = __half2float(__ushort_as_half(static_cast<unsigned short>(ss & 0xffffu)));
    const float shift = __half2float(__ushort_as_half(static_cast<unsigned short>(ss >> 16)));
    // Hardware e4m3 -> f16 (exact, NaN kept); e4m3 * scale is exact in fp32.
#pragma unroll
    for (int e = 0; e < n; ++e) {
      const __half_raw hr = __nv_cvt_fp8_to_halfraw(
          static_cast<__nv_fp8_storage_t>((w >> (8 * (first + e))) & 0xffu), __NV_E4M3);
      out[e] = fmaf(__half2float(__half(hr)), scale, shift);
    }
  } else if constexpr (F == KvFormat::f16) {
#pragma unroll
    for (int e = 0; e < n; ++e)
      out[e] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> (16 * (first + e)))));
  } else {
#pragma unroll
    for (int e = 0; e < n; ++e)
      out[e] = __uint_as_float((w >> (16 * (first + e))) << 16);
  }
}

template <KvFormat F, int D, int ROWS>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const DecodeParams p) {
  constexpr int kPerLane = Fmt<F>::kPerLane;
  constexpr int kPerWord = Fmt<F>::kPerWord;
  constexpr int T = D / kPerLane;                       // lanes per key in the score phase
  constexpr int kTeams = kThreads / T;
  constexpr int kWordsPerLane = kPerLane / kPerWord;    // 4
  // PV phase: DV columns per thread (one code word or part of it), KP key strides.
  constexpr int kDvMax = 64 / ROWS < 1 ? 1 : 64 / ROWS;
  constexpr int DV = kPerWord < kDvMax ? kPerWord : kDvMax;
  constexpr int TPR = D / DV;
  constexpr int KP = kThreads / TPR;
  static_assert(T >= 1 && T <= 32 && kThreads % T == 0, "score team");
  static_assert(TPR <= kThreads && kThreads % TPR == 0, "PV mapping");

  extern __shared__ __align__(16) unsigned char smem[];
  const int RB = p.c.row_bytes;
  const int RBP = padded_row(RB);
  float* q_s = reinterpret_cast<float*>(smem);
  unsigned char* kv_s = smem + sizeof(float) * ROWS * D;
  uint32_t* ss_s = reinterpret_cast<uint32_t*>(kv_s + static_cast<size_t>(kStages) * 2 * kTileKeys * RBP);
  float* s_s = reinterpret_cast<float*>(ss_s + kStages * 2 * kTileKeys);
  float* pt_s = s_s + ROWS * kTileKeys;  // (key, row): p transposed for the PV phase
  float* m_s = pt_s + ROWS * kTileKeys;
  float* l_s = m_s + ROWS;
  float* a_s = l_s + ROWS;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x;
  const int row_chunks = (p.R + ROWS - 1) / ROWS;
  const int h = blockIdx.y / row_chunks, chunk = blockIdx.y % row_chunks;
  const int64_t b = blockIdx.z;
  const int r0 = chunk * ROWS;
  const int rows = min(ROWS, p.R - r0);
  const int group_size = D / p.c.n_groups;

  const int64_t len = seq_length(p.c, b);
  const int64_t lo = imin64(static_cast<int64_t>(split) * p.split_size, len);
  const int64_t hi = split == p.S - 1 ? len : imin64(lo + p.split_size, len);

  // q rows (pre-scaled, fp32) into smem; rows past the chunk are 0.
  for (int i = tid; i < ROWS * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float v = 0.f;
    if (r < rows) {
      const int rr = r0 + r, m = rr / p.G, g = rr % p.G;
      const int64_t off = b * p.q_st[0] + m * p.q_st[1] + h * p.q_st[2] + g * p.q_st[3] + d;
      v = load_f32(p.q, off, p.q_dtype) * p.qk_scale;
    }
    q_s[i] = v;
  }
  if (tid < ROWS) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }

  const int64_t n_keys = hi - lo;
  const int n_tiles = static_cast<int>((n_keys + kTileKeys - 1) / kTileKeys);
  const int chunks_per_row = RB / p.vec;

  auto issue = [&](int tile) {
    if (tile < n_tiles) {
      const int stage = tile % kStages;
      const int64_t k0 = lo + static_cast<int64_t>(tile) * kTileKeys;
      const int nk = static_cast<int>(imin64(kTileKeys, hi - k0));
      unsigned char* dst = kv_s + static_cast<size_t>(stage) * 2 * kTileKeys * RBP;
      const int total = 2 * kTileKeys * chunks_per_row;
      for (int i = tid; i < total; i += kThreads) {
        const int which = i / (kTileKeys * chunks_per_row);
        const int rem = i % (kTileKeys * chunks_per_row);
        const int key = rem / chunks_per_row, c = rem % chunks_per_row;
        const char* base = which ? p.c.v : p.c.k;
        int64_t row = key < nk ? physical_row(p.c, b, k0 + key) : -1;
        const char* src = row >= 0 ? base + row_offset(p.c, which, b, row, h) + c * p.vec : base;
        cp_async(dst + (which * kTileKeys + key) * RBP + c * p.vec, src, p.vec, row >= 0 ? p.vec : 0);
      }
      if constexpr (F == KvFormat::fp8) {
        if (tid < 2 * kTileKeys) {
          const int which = tid / kTileKeys, key = tid % kTileKeys;
          const int64_t row = key < nk ? physical_row(p.c, b, k0 + key) : -1;
          const uint32_t* base = which ? p.c.vss : p.c.kss;
          const uint32_t* src = row >= 0 ? base + ss_offset(p.c, which, b, row, h) : base;
          cp_async(ss_s + (stage * 2 + which) * kTileKeys + key, src, 4, row >= 0 ? 4 : 0);
        }
      }
    }
    cp_async_commit();  // an empty group keeps the wait count uniform
  };

  for (int t = 0; t < kStages - 1; ++t) issue(t);

  // PV accumulators.
  const int dgrp = tid % TPR, kp = tid / TPR;
  float o[ROWS][DV];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int e = 0; e < DV; ++e) o[r][e] = 0.f;

  const int64_t causal_last0 = len - p.Mq;  // + m: last visible key of query m (causal)

  for (int t = 0; t < n_tiles; ++t) {
    issue(t + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int stage = t % kStages;
    const unsigned char* k_tile = kv_s + static_cast<size_t>(stage) * 2 * kTileKeys * RBP;
    const unsigned char* v_tile = k_tile + kTileKeys * RBP;
    const uint32_t* kss_t = ss_s + (stage * 2) * kTileKeys;
    const uint32_t* vss_t = kss_t + kTileKeys;
    const int64_t k0 = lo + static_cast<int64_t>(t) * kTileKeys;
    const int nk = static_cast<int>(imin64(kTileKeys, hi - k0));

    // ---- scores ----
    const int team = tid / T, tl = tid % T;
    for (int key = team; key < kTileKeys; key += kTeams) {
      float acc[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
      if (key < nk) {  // uniform within a team
        const uint32_t* row = reinterpret_cast<const uint32_t*>(k_tile + key * RBP);
        const int code0 = F == KvFormat::int4 ? p.c.n_groups : 0;
#pragma unroll
        for (int wi = 0; wi < kWordsPerLane; ++wi) {
          const int elem0 = tl * kPerLane + wi * kPerWord;
          const uint32_t w = row[code0 + elem0 / kPerWord];
          float kv[kPerWord];
          dequant_word<F>(w, row, F == KvFormat::fp8 ? kss_t[key] : 0u, elem0, group_size, 0,
                          kPerWord, kv);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float* qr = q_s + r * D + elem0;  // 8- or 16-byte aligned: vector loads
            if constexpr (kPerWord % 4 == 0) {
#pragma unroll
              for (int e = 0; e < kPerWord; e += 4) {
                const float4 qv = *reinterpret_cast<const float4*>(qr + e);
                acc[r] = fmaf(qv.x, kv[e], acc[r]);
                acc[r] = fmaf(qv.y, kv[e + 1], acc[r]);
                acc[r] = fmaf(qv.z, kv[e + 2], acc[r]);
                acc[r] = fmaf(qv.w, kv[e + 3], acc[r]);
              }
            } else {
              const float2 qv = *reinterpret_cast<const float2*>(qr);
              acc[r] = fmaf(qv.x, kv[0], acc[r]);
              acc[r] = fmaf(qv.y, kv[1], acc[r]);
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int off = T / 2; off >= 1; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
      if (tl == 0) {
        const int64_t j = k0 + key;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          float s = -INFINITY;
          if (key < nk && r < rows) {
            const int rr = r0 + r, m = rr / p.G, g = rr % p.G;
            if (!p.causal || j <= causal_last0 + m) {
              s = acc[r];
              if (p.bias) {
                const int64_t off = b * p.bias_st[0] + h * p.bias_st[1] + g * p.bias_st[2] +
                                    m * p.bias_st[3] + j * p.bias_st[4];
                s += load_f32(p.bias, off, p.bias_dtype) * kLog2e;
              }
            }
          }
          s_s[r * kTileKeys + key] = s;
        }
      }
    }
    __syncthreads();

    // ---- online softmax (base 2), one warp per row ----
    for (int r = warp; r < ROWS; r += kThreads / 32) {
      const float s = s_s[r * kTileKeys + lane];
      float mx = s;
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, mx);
      float pr = 0.f, alpha = 1.f;
      if (m_new != -INFINITY) {
        pr = exp2f(s - m_new);
        alpha = exp2f(m_old - m_new);
      }
      float sum = pr;
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      pt_s[lane * ROWS + r] = pr;
      __syncwarp();
      if (lane == 0) {
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
        a_s[r] = alpha;
      }
    }
    __syncthreads();

    // ---- PV ----
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float alpha = a_s[r];
#pragma unroll
      for (int e = 0; e < DV; ++e) o[r][e] *= alpha;
    }
    {
      const int elem0 = dgrp * DV;
      const int word_elem0 = elem0 - elem0 % kPerWord;
      const int first = elem0 % kPerWord;
      const int code0 = F == KvFormat::int4 ? p.c.n_groups : 0;
      for (int key = kp; key < nk; key += KP) {
        const uint32_t* row = reinterpret_cast<const uint32_t*>(v_tile + key * RBP);
        float vv[DV];
        dequant_word<F>(row[code0 + word_elem0 / kPerWord], row,
                        F == KvFormat::fp8 ? vss_t[key] : 0u, word_elem0, group_size, first, DV, vv);
        float pr[ROWS];
        const float* pk = pt_s + key * ROWS;  // 16-byte aligned for ROWS >= 4
        if constexpr (ROWS % 4 == 0) {
#pragma unroll
          for (int r = 0; r < ROWS; r += 4) {
            const float4 pv = *reinterpret_cast<const float4*>(pk + r);
            pr[r] = pv.x;
            pr[r + 1] = pv.y;
            pr[r + 2] = pv.z;
            pr[r + 3] = pv.w;
          }
        } else {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) pr[r] = pk[r];
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int e = 0; e < DV; ++e) o[r][e] = fmaf(pr[r], vv[e], o[r][e]);
      }
    }
    __syncthreads();  // the stage, s_s and pt_s are reused
  }
  cp_async_wait<0>();

  // Reduce the KP key strides (fixed order: deterministic) through the q buffer, then write.
  float* red = q_s;
  __syncthreads();
  for (int g = KP - 1; g >= 1; --g) {
    if (kp == g) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int e = 0; e < DV; ++e) red[r * D + dgrp * DV + e] = o[r][e];
    }
    __syncthreads();
    if (kp == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int e = 0; e < DV; ++e) o[r][e] += red[r * D + dgrp * DV + e];
    }
    __syncthreads();
  }
  const int64_t base_row = ((b * p.H + h) * p.S + split) * static_cast<int64_t>(p.R) + r0;
  if (kp == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (r >= rows) break;
      const float l = l_s[r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int e = 0; e < DV; ++e) p.part_o[(base_row + r) * D + dgrp * DV + e] = o[r][e] * inv;
    }
  }
  if (tid < rows) {
    const float m = m_s[tid], l = l_s[tid];
    p.part_lse[base_row + tid] = (m == -INFINITY || !(l > 0.f)) ? -INFINITY : (m + log2f(l)) * kLn2;
  }
}

// Merge row i, rows ordered (b, h, r) with r = m G + g (query row m, GQA member g): its
// coordinates, the start of its partials (split s at + s R [· D]) and its offset in a
// (b, m, h, g)-strided view (the output rows, the LSE).
struct MergeRow {
  int64_t b, h;
  int r, m, g;
  __device__ __forceinline__ int64_t part(int H, int S, int R) const {
    return (b * H + h) * S * static_cast<int64_t>(R) + r;
  }
  __device__ __forceinline__ int64_t off(const StridedIndex& s) const {
    return b * s.stride[0] + m * s.stride[1] + h * s.stride[2] + g * s.stride[3];
  }
};
__device__ __forceinline__ MergeRow merge_row(int64_t i, int H, int G, int Mq) {
  const int R = Mq * G;
  MergeRow w;
  w.r = static_cast<int>(i % R);
  w.h = (i / R) % H;
  w.b = i / (static_cast<int64_t>(R) * H);
  w.m = w.r / G;
  w.g = w.r % G;
  return w;
}
// The merged LSE from the splits' maximum and the total of their weights.
__device__ __forceinline__ float merged_lse(float mx, float total) {
  return mx == -INFINITY ? -INFINITY : mx + logf(total);
}
// acc += w x, component by component (fmaf).
__device__ __forceinline__ void fma4(float4& acc, float w, const float4& x) {
  acc.x = fmaf(w, x.x, acc.x);
  acc.y = fmaf(w, x.y, acc.y);
  acc.z = fmaf(w, x.z, acc.z);
  acc.w = fmaf(w, x.w, acc.w);
}

// Reduce over splits: one CTA of kMergeThreads per (b, h, row); writes out (q dtype) and the LSE.
// Thread (slice, c) owns VEC consecutive dims (c) and the splits s = slice, slice + NSL, ... (in
// increasing order); the NSL slices are then added in slice order (deterministic). Max and total of
// the split LSEs: every warp reduces all splits (lane-strided, xor shuffles, lane 0's total
// broadcast), so the loops are S / 32 long, not S (B 1, L 131072 has 256 splits).
constexpr int kMergeThreads = 256;
template <int VEC>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_kernel(const float* part_o, const float* part_lse, int H, int G, int Mq, int S,
                        int D, void* out, DType out_dtype, StridedIndex out_idx, float* lse_out,
                        StridedIndex lse_idx) {
  __shared__ float red[kMergeThreads * VEC];
  griddep_wait();  // (PDL) the split kernel's partials are complete and visible
  const int R = Mq * G;
  const MergeRow row = merge_row(blockIdx.x, H, G, Mq);
  const int tid = threadIdx.x, lane = tid & 31;
  const float* lse = part_lse + row.part(H, S, R);
  float mx = -INFINITY;
  for (int s = lane; s < S; s += 32) mx = fmaxf(mx, lse[static_cast<int64_t>(s) * R]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float total = 0.f;
  if (mx != -INFINITY) {
    for (int s = lane; s < S; s += 32)
      total += exp2f((lse[static_cast<int64_t>(s) * R] - mx) * kLog2e);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    total = __shfl_sync(0xffffffffu, total, 0);
  }
  const int cols = D / VEC;                 // threads per slice
  const int nsl = kMergeThreads / cols;     // slices
  const int c = tid % cols, slice = tid / cols;
  float acc[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
  if (mx != -INFINITY && slice < nsl) {
    const float* po = part_o + row.part(H, S, R) * D + c * VEC;
    // Unrolled so that several splits' loads are in flight (B 1: 256 splits, 32 per thread);
    // the additions stay in split order.
#pragma unroll 8
    for (int s = slice; s < S; s += nsl) {
      const float w = exp2f((lse[static_cast<int64_t>(s) * R] - mx) * kLog2e);
      const float* src = po + static_cast<int64_t>(s) * R * D;
      if constexpr (VEC == 4) {
        const float4 x = *reinterpret_cast<const float4*>(src);
        acc[0] = fmaf(w, x.x, acc[0]);
        acc[1] = fmaf(w, x.y, acc[1]);
        acc[2] = fmaf(w, x.z, acc[2]);
        acc[3] = fmaf(w, x.w, acc[3]);
      } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = fmaf(w, src[v], acc[v]);
      }
    }
  }
  if (slice < nsl)
#pragma unroll
    for (int v = 0; v < VEC; ++v) red[(slice * cols + c) * VEC + v] = acc[v];
  __syncthreads();
  const int64_t ooff = row.off(out_idx);
  for (int d = tid; d < D; d += kMergeThreads) {
    float sum = 0.f;
    if (mx != -INFINITY) {
      const int cc = d / VEC, v = d % VEC;
      for (int k = 0; k < nsl; ++k) sum += red[(k * cols + cc) * VEC + v];
      sum /= total;
    }
    store_f32(out, ooff + d, out_dtype, sum);
  }
  if (lse_out && tid == 0) lse_out[row.off(lse_idx)] = merged_lse(mx, total);
}

// Wide merge (DecodePlan::merge_wide): one CTA of kMergeThreads per (b, h, row, 32 dims). The
// split LSEs are read once (thread i: splits i, i + 256, ...) into shared memory; their maximum
// and the total of w_s = 2^((lse_s - max) log2 e) are fixed-order block reductions (warp xor
// shuffles, then the 8 warp values in warp order); then thread (slice, c) reads the float4 c of
// the 32 dims for splits slice, slice + 32, ... (at S <= 256 all of a thread's loads are in
// flight at once) and the 32 slices are added in slice order. Deterministic; the rounding
// differs from decode_merge_kernel's (B 1, L 131072: 256 splits; there the narrow merge ran 32
// CTAs whose threads each walked 32 splits in four dependent rounds, after two lane-strided
// passes over the LSEs).
// EARLY (DecodePlan::merge_warp with merge_wide, S <= 256; session 9): each thread loads its
// partial float4s (at most 8: splits slice + 32 k) before the LSE pass instead of after it, so
// the two round trips overlap; the same operations in the same order (the bits equal EARLY off).
constexpr int kWideDims = 32;
constexpr int kWideMaxSplits = 8192;  // shared memory for the weights: 32 KB
constexpr int kWideEarlySplits = 256;  // EARLY: 8 float4 per thread
template <bool EARLY>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_wide_kernel(const float* part_o, const float* part_lse, int H, int G, int Mq,
                             int S, int D, void* out, DType out_dtype, StridedIndex out_idx,
                             float* lse_out, StridedIndex lse_idx) {
  extern __shared__ float wsm[];  // S weights
  __shared__ float wred[2][kMergeThreads / 32];
  __shared__ float4 part[kMergeThreads];
  griddep_wait();  // (PDL) the split kernel's partials are complete and visible
  const int R = Mq * G;
  const int chunks = D / kWideDims;
  const MergeRow row = merge_row(blockIdx.x / chunks, H, G, Mq);
  const int chunk = static_cast<int>(blockIdx.x % chunks);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kMergeThreads / 32;
  const float* lse = part_lse + row.part(H, S, R);
  constexpr int kCols = kWideDims / 4;              // float4 columns
  constexpr int kSlices = kMergeThreads / kCols;    // 32
  const int c = tid % kCols, slice = tid / kCols;
  const float* po = part_o + row.part(H, S, R) * D + chunk * kWideDims + 4 * c;
  constexpr int kEarly = EARLY ? kWideEarlySplits / kSlices : 1;
  float4 xe[kEarly];
  if constexpr (EARLY) {
#pragma unroll
    for (int k = 0; k < kEarly; ++k) {
      const int s = slice + kSlices * k;
      xe[k] = s < S ? *reinterpret_cast<const float4*>(po + static_cast<int64_t>(s) * R * D)
                    : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  float mx = -INFINITY;
  for (int s = tid; s < S; s += kMergeThreads) {
    const float v = lse[static_cast<int64_t>(s) * R];
    wsm[s] = v;
    mx = fmaxf(mx, v);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) wred[0][warp] = mx;
  __syncthreads();
  mx = wred[0][0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, wred[0][w]);
  float tot = 0.f;
  if (mx != -INFINITY) {
    for (int s = tid; s < S; s += kMergeThreads) {  // (only this thread's own entries)
      const float w = exp2f((wsm[s] - mx) * kLog2e);
      wsm[s] = w;
      tot += w;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
  if (lane == 0) wred[1][warp] = tot;
  __syncthreads();  // (also: every weight is in wsm)
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += wred[1][w];
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (mx != -INFINITY) {
    if constexpr (EARLY) {
#pragma unroll
      for (int k = 0; k < kEarly; ++k) {
        const int s = slice + kSlices * k;
        if (s < S) fma4(acc, wsm[s], xe[k]);
      }
    } else {
#pragma unroll 8
      for (int s = slice; s < S; s += kSlices)
        fma4(acc, wsm[s], *reinterpret_cast<const float4*>(po + static_cast<int64_t>(s) * R * D));
    }
  }
  part[tid] = acc;
  __syncthreads();
  const int64_t ooff = row.off(out_idx);
  if (tid < kWideDims) {
    const int cc = tid / 4, v = tid % 4;
    float sum = 0.f;
    if (mx != -INFINITY) {
      for (int k = 0; k < kSlices; ++k) {
        const float4 y = part[k * kCols + cc];
        sum += v == 0 ? y.x : v == 1 ? y.y : v == 2 ? y.z : y.w;
      }
      sum /= total;
    }
    store_f32(out, ooff + chunk * kWideDims + tid, out_dtype, sum);
  }
  if (lse_out && chunk == 0 && tid == 0) lse_out[row.off(lse_idx)] = merged_lse(mx, total);
}

// Warp merge (DecodePlan::merge_warp; D 128, S <= 16): one warp per (b, h, row), 8 rows per CTA.
// Lane l owns dims [4 l, 4 l + 4); the LSE of split l and the partial rows of every split are
// loaded together (one round trip: the partials do not depend on the LSEs), instead of one CTA of
// 256 threads per row (half of them idle at S 4) whose partial loads wait for the LSE pass
// (B 64, L 8192: 2048 CTAs, two waves). The arithmetic mirrors decode_merge_kernel<4> at D 128
// operation for operation (its 8 slices of 32 columns: slice k adds splits k, k + 8 by fmaf in
// order, the slices are summed in order from 0, the LSE sum is lane-strided with the same xor
// tree and lane 0's total), so the bits equal it.
template <int SMAX>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_warp_kernel(const float* part_o, const float* part_lse, int H, int G, int Mq,
                             int S, int64_t rows, void* out, DType out_dtype, StridedIndex out_idx,
                             float* lse_out, StridedIndex lse_idx) {
  constexpr int D = 128, kSlices = 8;  // (decode_merge_kernel<4>: 256 threads / 32 columns)
  griddep_wait();  // (PDL) the split kernel's partials are complete and visible
  const int lane = threadIdx.x & 31;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * (kMergeThreads / 32) + (threadIdx.x >> 5);
  if (i >= rows) return;
  const int R = Mq * G;
  const MergeRow row = merge_row(i, H, G, Mq);
  const float* lse = part_lse + row.part(H, S, R);
  const float* po = part_o + row.part(H, S, R) * D + 4 * lane;
  const float my_lse = lane < S ? lse[static_cast<int64_t>(lane) * R] : -INFINITY;
  float4 x[SMAX];
#pragma unroll
  for (int s = 0; s < SMAX; ++s)
    x[s] = s < S ? *reinterpret_cast<const float4*>(po + static_cast<int64_t>(s) * R * D)
                 : make_float4(0.f, 0.f, 0.f, 0.f);
  float mx = fmaxf(-INFINITY, my_lse);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float total = 0.f;
  if (mx != -INFINITY) {
    if (lane < S) total += exp2f((my_lse - mx) * kLog2e);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    total = __shfl_sync(0xffffffffu, total, 0);
  }
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (mx != -INFINITY) {
#pragma unroll
    for (int k = 0; k < kSlices; ++k) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s = k; s < SMAX; s += kSlices) {
        if (s < S) fma4(acc, exp2f((__shfl_sync(0xffffffffu, my_lse, s) - mx) * kLog2e), x[s]);
      }
      sum.x += acc.x;
      sum.y += acc.y;
      sum.z += acc.z;
      sum.w += acc.w;
    }
    sum.x /= total;
    sum.y /= total;
    sum.z /= total;
    sum.w /= total;
  }
  const int64_t ooff = row.off(out_idx) + 4 * lane;
  store_f32(out, ooff, out_dtype, sum.x);
  store_f32(out, ooff + 1, out_dtype, sum.y);
  store_f32(out, ooff + 2, out_dtype, sum.z);
  store_f32(out, ooff + 3, out_dtype, sum.w);
  if (lse_out && lane == 0) lse_out[row.off(lse_idx)] = merged_lse(mx, total);
}

template <KvFormat F, int D, int ROWS>
void launch_split(const DecodeParams& p, int row_chunks, int64_t B, cudaStream_t stream) {
  const size_t smem = Smem<D, ROWS>::bytes(p.c.row_bytes);
  auto kernel = decode_split_kernel<F, D, ROWS>;
  set_kernel_smem(kernel, static_cast<int>(smem), "decode_attention", "shared memory");
  dim3 grid(p.S, p.H * row_chunks, static_cast<unsigned>(B));
  kernel<<<grid, kThreads, smem, stream>>>(p);
}

template <KvFormat F>
void launch_format(const DecodeParams& p, int D, int64_t B, cudaStream_t stream) {
  const int rows_per_cta = p.R >= kMaxRows ? kMaxRows : p.R;
  dispatch_int<64, 128, 256>(D, "decode_attention", "D", [&](auto d) {
    constexpr int kD = decltype(d)::value;
    const int rows = rows_per_cta <= 1 ? 1 : rows_per_cta <= 2 ? 2 : rows_per_cta <= 4 ? 4
                     : rows_per_cta <= 8 ? 8 : 16;
    dispatch_int<1, 2, 4, 8, 16>(rows, "decode_attention", "rows per CTA", [&](auto r) {
      constexpr int kRows = decltype(r)::value;
      launch_split<F, kD, kRows>(p, (p.R + kRows - 1) / kRows, B, stream);
    });
  });
}

}  // namespace

void decode_attention(const TensorView& q, const KvCache& cache, const DecodePlan& plan,
                      void* workspace, TensorView out, const TensorView* lse_out,
                      const TensorView* bias, float sm_scale, bool causal, Context& ctx) {
  DecodeParams p;
  p.c = make_cache_args(cache);
  p.q = q.data;
  p.q_dtype = q.dtype;
  for (int d = 0; d < 4; ++d) p.q_st[d] = q.stride[d];
  if (bias) {
    p.bias = bias->data;
    p.bias_dtype = bias->dtype;
    for (int d = 0; d < 5; ++d) p.bias_st[d] = bias->stride[d];
  }
  p.part_o = static_cast<float*>(workspace);
  p.part_lse = p.part_o + decode_partial_out_elems(plan);
  p.H = static_cast<int>(plan.kv_heads);
  p.G = plan.group;
  p.Mq = plan.mq;
  p.R = plan.mq * plan.group;
  p.S = plan.n_splits;
  p.split_size = plan.split_size;
  p.qk_scale = sm_scale * kLog2e;
  p.causal = causal;
  p.vec = row_vector_bytes(cache);
  cudaStream_t stream = stream_of(ctx);
  // Session 4: round 1's register-streaming kernel (DecodePlan::stream_registers) and the
  // smem-ring tensor-core kernel (streaming off, tensor_cores on) were retired (slower than the
  // ring kernel at every measured shape, and no plan_decode default reached them): those flags
  // no longer change the kernel. docs/decode.md.
  // (D 256: the bulk kernel at <= 8 rows per KV head only; its 16-row form would spill)
  const bool bulk = plan.streaming && plan.bulk_copy && decode_bulk_supported(cache) &&
                    (plan.head_dim < 256 || p.R <= 8);
  if (bulk) {
    launch_decode_bulk(p, cache, plan, stream);
  } else if (plan.streaming && decode_ring_supported(cache.format, plan.head_dim)) {
    launch_decode_ring(p, cache.format, plan.head_dim, ring_vector_bytes(cache), plan.batch,
                       stream);
  } else {
    const int D = plan.head_dim;
    const int64_t B = plan.batch;
    switch (cache.format) {
      case KvFormat::int4: launch_format<KvFormat::int4>(p, D, B, stream); break;
      case KvFormat::fp8: launch_format<KvFormat::fp8>(p, D, B, stream); break;
      case KvFormat::f16: launch_format<KvFormat::f16>(p, D, B, stream); break;
      case KvFormat::bf16: launch_format<KvFormat::bf16>(p, D, B, stream); break;
    }
  }
  check_launch("decode_attention");
  const int64_t rows = plan.batch * plan.kv_heads * plan.mq * plan.group;
  StridedIndex oi = strided_index_of(out), li{};
  if (lse_out) li = strided_index_of(*lse_out);
  // float4 reads of the partial rows when the workspace allows them (D is a multiple of 4).
  // With DecodePlan::launch_pdl the merge is a programmatic dependent of the split kernel (its
  // launch overlaps the split kernel's tail; it waits for the partials in its first instruction).
  const bool pdl = plan.launch_pdl && bulk;
  float* lse_ptr = lse_out ? lse_out->ptr<float>() : nullptr;
  const bool aligned16 = reinterpret_cast<uintptr_t>(p.part_o) % 16 == 0;
  if (plan.merge_warp && !plan.merge_wide && aligned16 && plan.head_dim == 128 && p.S <= 16) {
    const dim3 grid(static_cast<unsigned>((rows + kMergeThreads / 32 - 1) / (kMergeThreads / 32)));
    auto launch = [&](auto kernel) {
      launch_maybe_pdl(pdl, kernel, grid, dim3(kMergeThreads), 0, stream,
                       static_cast<const float*>(p.part_o), static_cast<const float*>(p.part_lse),
                       p.H, p.G, p.Mq, p.S, rows, out.data, out.dtype, oi, lse_ptr, li);
    };
    if (p.S <= 4) launch(decode_merge_warp_kernel<4>);
    else if (p.S <= 8) launch(decode_merge_warp_kernel<8>);
    else launch(decode_merge_warp_kernel<16>);
  } else if (plan.merge_wide && aligned16 &&
      plan.head_dim % kWideDims == 0 && p.S <= kWideMaxSplits) {
    const int chunks = plan.head_dim / kWideDims;
    const bool early = plan.merge_warp && p.S <= kWideEarlySplits;
    launch_maybe_pdl(pdl, early ? decode_merge_wide_kernel<true> : decode_merge_wide_kernel<false>,
                     dim3(static_cast<unsigned>(rows * chunks)), dim3(kMergeThreads),
                     static_cast<size_t>(p.S) * sizeof(float), stream,
                     static_cast<const float*>(p.part_o), static_cast<const float*>(p.part_lse),
                     p.H, p.G, p.Mq, p.S, plan.head_dim, out.data, out.dtype, oi, lse_ptr, li);
  } else if (reinterpret_cast<uintptr_t>(p.part_o) % 16 == 0 &&
             plan.head_dim <= 4 * kMergeThreads) {
    launch_maybe_pdl(pdl, decode_merge_kernel<4>, dim3(static_cast<unsigned>(rows)),
                     dim3(kMergeThreads), 0, stream, static_cast<const float*>(p.part_o),
                     static_cast<const float*>(p.part_lse), p.H, p.G, p.Mq, p.S, plan.head_dim,
                     out.data, out.dtype, oi, lse_ptr, li);
  } else {
    launch_maybe_pdl(pdl, decode_merge_kernel<1>, dim3(static_cast<unsigned>(rows)),
                     dim3(kMergeThreads), 0, stream, static_cast<const float*>(p.part_o),
                     static_cast<const float*>(p.part_lse), p.H, p.G, p.Mq, p.S, plan.head_dim,
                     out.data, out.dtype, oi, lse_ptr, li);
  }
  check_launch("decode_attention (merge)");
}

}  // namespace cuda
}  // namespace lowbit
