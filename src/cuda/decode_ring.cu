// Split-K decode kernel with a per-warp cp.async ring (DecodePlan::streaming, the default where
// it applies): int4 / fp8 / f16 caches, D 64 or 128, up to 16 query rows of one KV head per CTA.
//
// Round 1's streaming kernel (decode_stream.cu, retired in session 4) loaded K/V straight into
// mma-fragment registers: one group in flight per warp, 160-168 registers (3 CTAs per SM),
// 16-byte loads scattered over rows (22 of 32 bytes used per sector) and a DRAM utilisation of
// 11-47 % on the H200. Here the loads are decoupled from the math:
//   - Each of the 4 warps owns the 16-key groups warp, warp + 4, ... of the CTA's split (as in
//     round 1) and a private ring of NST stages in shared memory; a stage holds the raw rows of one
//     group: 16 K rows, then 16 V rows (stride: row bytes rounded up to 16), then for fp8 the 16 + 16
//     scale/shift words. The warp copies a group with cp.async (16 bytes per lane where the row
//     layout allows, .cg): consecutive lanes copy consecutive chunks of the 32 rows, so every row
//     is read whole and contiguously (int4 g4 D 128: 80-byte rows, 5 chunks each).
//   - No CTA barrier in the loop: per group the warp waits for its own oldest copy
//     (cp.async.wait_group NST - 2, then __syncwarp so every lane sees every lane's bytes), issues
//     the copy of the group NST - 1 ahead into the stage it just freed, and computes. So NST - 1
//     groups per warp are in flight during the math: int4 g4 D 128, NST 4, 4 CTAs of 4 warps per
//     SM: 16 x 3 x 2.5 KB = 120 KB per SM (Little's law at ~4.3 TB/s wants ~40-50 KB).
//   - Keys that are absent (past the split, or on an out-of-range page) are zero-filled by the
//     copy (src-size 0) and their scores are set to -inf, as in round 1. The group's presence mask
//     (16 bits) is computed by the issuing warp and kept in shared memory next to the ring.
//   - Paged caches: a group lies in one page (it starts at a multiple of 16; pages are multiples of
//     16); the block-table entry of the next group to issue is loaded one group ahead, so the
//     issue never waits on it.
// The per-element arithmetic is round 1's: lane (g, t) reads from the stage exactly the words it
// used to load from global memory (K: keys g, g + 8, elements [t*D/4, (t+1)*D/4); V: keys 2t,
// 2t+1, 2t+8, 2t+9, dims [g*D/8, (g+1)*D/8)), dequantizes them to the same f16 values (int4:
// 0x6400 exponent trick + hfma2(scale, shift); fp8: cvt e4m3x2 + hfma2) and runs mma.sync
// m16n8k16 QK and PV, online softmax in base 2, and the same deterministic 4-warp merge. One
// change: int4 pairs nibbles (j, j + 4) of a word into an f16x2 (one shift + one lop3 per pair
// instead of ~4 ops); QK's contraction order follows (q's fragments are loaded in the same order),
// and PV sends each half to the n-tile of its own dim, so every output element sums the same
// products in the same key order as before.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "src/core/convert_elem.h"
#include "src/core/dispatch.h"
#include "src/cuda/decode_common.cuh"

namespace lowbit {
namespace cuda {
namespace decode_detail {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = 4;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;


template <KvFormat F>
constexpr int per_word() {
  return F == KvFormat::int4 ? 8 : F == KvFormat::fp8 ? 4 : 2;
}

// Ring depth (stages per warp) and the CTAs per SM the register budget is sized for. Shared memory
// per CTA at D 128 (4 warps x stages x stage): int4 g4 4 x 4 x 2.5 KB = 40 KB (4 CTAs / SM), fp8
// 4 x 3 x 4.6 KB = 55.5 KB (3 CTAs), f16 4 x 3 x 8.5 KB = 102 KB (2 CTAs), plus 4.6 KB static.
template <KvFormat F, int D>
struct RingCfg {
  static constexpr int kStages = F == KvFormat::int4 ? 4 : 3;
  static constexpr int kMinBlocks =
      D == 128 && F == KvFormat::f16 ? 2 : D == 128 && F == KvFormat::fp8 ? 3 : 4;
};

// A pair of elements of code word w as dequantized f16x2. int4: elements j and j + 4 (nibbles j
// and j + 4: one shift and one lop3 per pair; the pairing differs from round 1's (2j, 2j+1), the
// value of each element is the same: (1024 + code) - 1024 exactly, then one hfma2 (scale, shift)).
// fp8: elements 2j, 2j+1. f16: the word. Same arithmetic per element as round 1's kernel.
template <KvFormat F>
__device__ __forceinline__ __half2 dequant_pair(uint32_t w, int j, __half2 scale, __half2 shift) {
  if constexpr (F == KvFormat::int4) {
    const uint32_t u = ((w >> (4 * j)) & 0x000f000fu) | 0x64006400u;  // 1024 + code, twice
    const __half2 code = __hsub2(bits_h2(u), bits_h2(0x64006400u));
    return __hfma2(code, scale, shift);
  } else if constexpr (F == KvFormat::fp8) {
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>((w >> (16 * j)) & 0xffffu), __NV_E4M3);
    return __hfma2(__half2(r), scale, shift);
  } else {
    return bits_h2(w);
  }
}


// cp.async with a "memory" clobber (the compiler must not move shared-memory reads across it).
template <int BYTES>
__device__ __forceinline__ void cp_async_bytes(uint32_t dst, const void* src, int src_bytes) {
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else if constexpr (BYTES == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void commit_group() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Where one warp's groups come from: fixed per (CTA, warp).
struct Src {
  const char* k;         // contiguous: k of (b, 0, h); paged: k of (row 0, h)
  const char* v;
  int64_t krs, vrs;      // bytes between consecutive keys (contiguous) / pool rows (paged)
  const uint32_t* kss;   // fp8: scale/shift words of (b, 0, h) / (row 0, h)
  const uint32_t* vss;
  int64_t kssr, vssr;    // their key / row strides, elements
};

// Copies group k0 (16 keys: its K rows, V rows, fp8 scale/shift words) into stage `st` (shared
// address) and returns the presence mask (bit i: key k0 + i exists). page: the block-table entry
// of the group's page (paged caches; ignored otherwise).
template <KvFormat F, int VEC>
__device__ __forceinline__ uint32_t issue_group(const CacheArgs& c, const Src& s, int64_t k0,
                                                int64_t hi, int64_t page, uint32_t st, int srb,
                                                int cpr, int lane) {
  int64_t base = k0;  // first row of the group: key (contiguous) or pool row (paged)
  int64_t n = min64(hi - k0, 16);
  if (c.block_tables) {
    base = page * c.page_size + k0 % c.page_size;
    n = page < 0 ? 0 : min64(n, c.pool_rows - base);
  }
  n = n < 0 ? 0 : n;
  const uint32_t mask = (1u << n) - 1u;
  // Chunk q = lane + 32 j of 32 rows x cpr chunks: row q / cpr, chunk q % cpr (tracked
  // incrementally: every lane copies exactly cpr chunks).
  int row = lane / cpr, col = lane % cpr;
  const int drow = 32 / cpr, dcol = 32 % cpr;
  for (int j = 0; j < cpr; ++j) {
    const int key = row & 15;
    const bool is_v = row >= 16;
    const bool ok = key < n;
    const char* src = is_v ? s.v + (base + key) * s.vrs : s.k + (base + key) * s.krs;
    cp_async_bytes<VEC>(st + row * srb + col * VEC, ok ? src + col * VEC : c.k, ok ? VEC : 0);
    row += drow;
    col += dcol;
    if (col >= cpr) {
      col -= cpr;
      ++row;
    }
  }
  if constexpr (F == KvFormat::fp8) {
    const int key = lane & 15;
    const bool ok = key < n;
    const uint32_t* src =
        lane >= 16 ? s.vss + (base + key) * s.vssr : s.kss + (base + key) * s.kssr;
    cp_async_bytes<4>(st + 32 * srb + 4 * lane, ok ? src : c.kss, ok ? 4 : 0);
  }
  return mask;
}

template <KvFormat F, int D, int VEC>
__global__ void __launch_bounds__(kThreads, RingCfg<F, D>::kMinBlocks)
    decode_ring_kernel(const DecodeParams p, int srb, int stage_bytes) {
  constexpr int NST = RingCfg<F, D>::kStages;
  constexpr int kPerWord = per_word<F>();
  constexpr int KS = D / 16;                // k-steps of QK
  constexpr int QRUN = D / 4;               // elements of a key per lane (QK)
  constexpr int NT = D / 8;                 // n-tiles of PV
  constexpr int KW = QRUN / kPerWord;       // words of the lane's K run
  constexpr int VW = (D / 8) / kPerWord;    // words of the lane's V run
  constexpr int KC = KW < 4 ? KW : 4;       // K words read per shared-memory access
  constexpr int VC = VW < 4 ? VW : 4;       // V words read per shared-memory access
  static_assert(KW >= 1 && VW >= 1, "run sizes");
  extern __shared__ __align__(16) char ring[];  // [warp][stage] stage_bytes; later ob (16 x D f32)
  __shared__ uint4 qs[KS * 32];                  // q's A fragments, (k-step, lane)
  __shared__ float mb[kWarps * 16], lb[kWarps * 16];
  __shared__ uint32_t gmask[kWarps * NST];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x;
  const int row_chunks = (p.R + 15) / 16;
  const int h = blockIdx.y / row_chunks, r0 = (blockIdx.y % row_chunks) * 16;
  const int64_t b = blockIdx.z;
  const int rows = min(16, p.R - r0);
  const CacheArgs& c = p.c;

  const int64_t len = seq_length(c, b);
  const int64_t lo = min64(static_cast<int64_t>(split) * p.split_size, len);
  const int64_t hi = split == p.S - 1 ? len : min64(lo + p.split_size, len);
  const int n_groups = static_cast<int>((hi - lo + 15) / 16);
  const int my_groups = n_groups > warp ? (n_groups - warp + kWarps - 1) / kWarps : 0;

  Src s;
  if (c.block_tables) {
    s.k = c.k + h * c.k_st[1];
    s.v = c.v + h * c.v_st[1];
    s.krs = c.k_st[0];
    s.vrs = c.v_st[0];
    if constexpr (F == KvFormat::fp8) {
      s.kss = c.kss + h * c.kss_st[1];
      s.vss = c.vss + h * c.vss_st[1];
      s.kssr = c.kss_st[0];
      s.vssr = c.vss_st[0];
    }
  } else {
    s.k = c.k + b * c.k_st[0] + h * c.k_st[2];
    s.v = c.v + b * c.v_st[0] + h * c.v_st[2];
    s.krs = c.k_st[1];
    s.vrs = c.v_st[1];
    if constexpr (F == KvFormat::fp8) {
      s.kss = c.kss + b * c.kss_st[0] + h * c.kss_st[2];
      s.vss = c.vss + b * c.vss_st[0] + h * c.vss_st[2];
      s.kssr = c.kss_st[1];
      s.vssr = c.vss_st[1];
    }
  }
  const int cpr = c.row_bytes / VEC;  // chunks per row
  const uint32_t ring_s =
      static_cast<uint32_t>(__cvta_generic_to_shared(ring)) + warp * NST * stage_bytes;
  const char* ring_w = ring + warp * NST * stage_bytes;
  // Block-table entry of group n of this warp (paged; n < my_groups).
  auto page_of = [&](int n) -> int64_t {
    if (!c.block_tables || n >= my_groups) return 0;
    const int64_t k0 = lo + 16 * static_cast<int64_t>(warp + kWarps * n);
    return c.block_tables[b * c.bt_st0 + (k0 / c.page_size) * c.bt_st1];
  };
  int64_t next_page = page_of(0);
  // Issues group n into its stage (n % NST) when it exists; always commits (uniform counting).
  auto issue = [&](int n) {
    if (n < my_groups) {
      const int64_t page = next_page;
      next_page = page_of(n + 1);
      const int slot = n % NST;
      const int64_t k0 = lo + 16 * static_cast<int64_t>(warp + kWarps * n);
      const uint32_t m = issue_group<F, VEC>(c, s, k0, hi, page, ring_s + slot * stage_bytes, srb,
                                             cpr, lane);
      if (lane == 0) gmask[warp * NST + slot] = m;
    }
    commit_group();
  };
#pragma unroll
  for (int n = 0; n < NST - 1; ++n) issue(n);

  // q as A fragments (rows g, g+8; permuted contraction order), f16, unscaled (round 1's code).
  if (warp == 0) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[4];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = g + 8 * half;
        const bool ok = r < rows;
        const int rr = r0 + r, m = ok ? rr / p.G : 0, gq = ok ? rr % p.G : 0;
        const int64_t off = b * p.q_st[0] + m * p.q_st[1] + h * p.q_st[2] + gq * p.q_st[3] +
                            t * QRUN + 4 * ks;
        // Elements of this k-step in the order of the K pairs: round 1's 4ks + {0, 1, 2, 3};
        // int4 (pairs of nibbles j, j + 4 of word ks / 2, j = 2 (ks % 2) + {0, 1}):
        // 8 (ks / 2) + 2 (ks % 2) + {0, 4, 1, 5}.
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pos = F == KvFormat::int4 ? 8 * (ks / 2) + 2 * (ks % 2) + (e >> 1) + 4 * (e & 1)
                                              : 4 * ks + e;
          v[e] = ok ? load_f32(p.q, off - 4 * ks + pos, p.q_dtype) : 0.f;
        }
        a[half] = pack_f32x2(v[0], v[1]);
        a[2 + half] = pack_f32x2(v[2], v[3]);
      }
      qs[ks * 32 + lane] = make_uint4(a[0], a[1], a[2], a[3]);
    }
  }
  __syncthreads();

  float o[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // rows g, g+8 (lane partial l)
  const int64_t causal_last0 = len - p.Mq;
  int mrow[2], grow[2];
  bool rok[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    rok[half] = r < rows;
    mrow[half] = rok[half] ? (r0 + r) / p.G : 0;
    grow[half] = rok[half] ? (r0 + r) % p.G : 0;
  }
  const int ng = c.n_groups;
  const int code_off = F == KvFormat::int4 ? 4 * ng : 0;
  // The int4 coefficient words of the lane's runs (word indices within a row).
  const int kcoef0 = F == KvFormat::int4 ? (t * QRUN) / (D / ng) : 0;
  const int vcoef = F == KvFormat::int4 ? (g * (D / 8)) / (D / ng) : 0;

#pragma unroll 1
  for (int it = 0; it < my_groups; ++it) {
    wait_group<NST - 2>();  // this lane's copies of group it are done
    __syncwarp();           // ... and every lane's; stage (it - 1) % NST is free again
    issue(it + NST - 1);
    const int64_t k0 = lo + 16 * static_cast<int64_t>(warp + kWarps * it);
    const char* st = ring_w + (it % NST) * stage_bytes;
    const uint32_t present = gmask[warp * NST + it % NST];

    // ---- S = q k^T for keys k0 + [0, 16) ----
    float sacc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.f;
    uint32_t kcw[2][2];  // coefficient words (int4) / scale-shift word (fp8) of keys g, g + 8
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const char* row = st + (nt * 8 + g) * srb;
      kcw[nt][0] = kcw[nt][1] = 0u;
      if constexpr (F == KvFormat::int4) {
        kcw[nt][0] = lds32(row + 4 * kcoef0);
        kcw[nt][1] = ng == 8 ? lds32(row + 4 * kcoef0 + 4) : kcw[nt][0];
      } else if constexpr (F == KvFormat::fp8) {
        kcw[nt][0] = kcw[nt][1] = lds32(st + 32 * srb + 4 * (nt * 8 + g));
      }
    }
    uint32_t kbuf[2][KC];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int e0 = 4 * ks;
      if (e0 % kPerWord == 0 && (e0 / kPerWord) % KC == 0) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
          lds_words<KC, (VEC < 4 * KC ? VEC : 4 * KC)>(
              st + (nt * 8 + g) * srb + code_off + t * (4 * KW) + 4 * (e0 / kPerWord), kbuf[nt]);
      }
      const uint4 q4 = qs[ks * 32 + lane];
      const uint32_t qa[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        uint32_t kb[2];  // elements 4ks + {0,1}, 4ks + {2,3} of the lane's run of key nt*8 + g
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int e = 4 * ks + 2 * i;
          const uint32_t cw = F == KvFormat::int4 && e >= QRUN / 2 ? kcw[nt][1] : kcw[nt][0];
          kb[i] = h2_bits(dequant_pair<F>(kbuf[nt][(e / kPerWord) % KC], (e % kPerWord) / 2,
                                          lo_h2(cw), hi_h2(cw)));
        }
        ptx::mma_f16(sacc[nt], qa, kb[0], kb[1]);
      }
    }
    // ---- scale, mask, bias (base 2) ----
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        const int half = cc >> 1;
        const int key = nt * 8 + 2 * t + (cc & 1);
        const int64_t j = k0 + key;
        float sc = -INFINITY;
        if (((present >> key) & 1u) && rok[half] &&
            (!p.causal || j <= causal_last0 + mrow[half])) {
          sc = sacc[nt][cc] * p.qk_scale;
          if (p.bias) {
            const int64_t off = b * p.bias_st[0] + h * p.bias_st[1] + grow[half] * p.bias_st[2] +
                                mrow[half] * p.bias_st[3] + j * p.bias_st[4];
            sc += load_f32(p.bias, off, p.bias_dtype) * kLog2e;
          }
        }
        sacc[nt][cc] = sc;
      }
    // ---- online softmax per row (a quad holds one row pair) ----
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = fmaxf(fmaxf(sacc[0][2 * half], sacc[0][2 * half + 1]),
                       fmaxf(sacc[1][2 * half], sacc[1][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[half], mx);
      alpha[half] = m_new == -INFINITY ? 1.f : exp2f(m_run[half] - m_new);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int cc = 2 * half; cc < 2 * half + 2; ++cc) {
          const float pr = m_new == -INFINITY ? 0.f : exp2f(sacc[nt][cc] - m_new);
          sacc[nt][cc] = pr;
          sum += pr;
        }
      l_run[half] = l_run[half] * alpha[half] + sum;
      m_run[half] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
    // ---- O += P V ----
    uint32_t pa[4];
    pa[0] = pack_f32x2(sacc[0][0], sacc[0][1]);
    pa[1] = pack_f32x2(sacc[0][2], sacc[0][3]);
    pa[2] = pack_f32x2(sacc[1][0], sacc[1][1]);
    pa[3] = pack_f32x2(sacc[1][2], sacc[1][3]);
    // keys 2t, 2t+1, 2t+8, 2t+9 (q = 0..3): dims g*NT + 2i, 2i+1 as f16x2, paired across keys
    __half2 vscale[4], vshift[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      vscale[q] = vshift[q] = __float2half2_rn(0.f);
      const int key = 2 * t + (q & 1) + 8 * (q >> 1);
      if constexpr (F == KvFormat::int4) {
        const uint32_t w = lds32(st + (16 + key) * srb + 4 * vcoef);
        vscale[q] = lo_h2(w);
        vshift[q] = hi_h2(w);
      } else if constexpr (F == KvFormat::fp8) {
        const uint32_t w = lds32(st + 32 * srb + 4 * (16 + key));
        vscale[q] = lo_h2(w);
        vshift[q] = hi_h2(w);
      }
    }
    uint32_t vbuf[4][VC];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
      const int e0 = 2 * i;
      if (e0 % kPerWord == 0 && (e0 / kPerWord) % VC == 0) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int key = 2 * t + (q & 1) + 8 * (q >> 1);
          lds_words<VC, (VEC < 4 * VC ? VEC : 4 * VC)>(
              st + (16 + key) * srb + code_off + g * (4 * VW) + 4 * (e0 / kPerWord), vbuf[q]);
        }
      }
      __half2 vk[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        vk[q] = dequant_pair<F>(vbuf[q][(e0 / kPerWord) % VC], (e0 % kPerWord) / 2, vscale[q],
                                vshift[q]);
      // n-tile nt holds dim g*NT + nt: the low halves are dim 2i (int4: 8 (i / 4) + i % 4), the
      // high halves dim 2i + 1 (int4: that + 4).
      constexpr bool kI4 = F == KvFormat::int4;
      const int nlo = kI4 ? 8 * (i / 4) + i % 4 : 2 * i;
      const int nhi = kI4 ? nlo + 4 : 2 * i + 1;
      ptx::mma_f16(o[nlo], pa, h2_bits(__lows2half2(vk[0], vk[1])),
                   h2_bits(__lows2half2(vk[2], vk[3])));
      ptx::mma_f16(o[nhi], pa, h2_bits(__highs2half2(vk[0], vk[1])),
                   h2_bits(__highs2half2(vk[2], vk[3])));
    }
  }
  wait_group<0>();  // only empty groups can be left; the ring becomes ob after the barrier below

  // ---- merge the four warps: (m, l) per row, then O accumulated warp by warp (fixed order) ----
  float* ob = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = l_run[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) {
      mb[warp * 16 + g + 8 * half] = m_run[half];
      lb[warp * 16 + g + 8 * half] = l;
    }
  }
  __syncthreads();
  float wscale[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, mb[w * 16 + r]);
    wscale[half] = m_run[half] == -INFINITY ? 0.f : exp2f(m_run[half] - M);
  }
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int r = g + 8 * (cc >> 1);
          const int dim = (2 * t + (cc & 1)) * NT + nt;
          const float v = o[nt][cc] * wscale[cc >> 1];
          ob[r * D + dim] = w == 0 ? v : ob[r * D + dim] + v;
        }
    }
    __syncthreads();
  }
  const int64_t base_row = ((b * p.H + h) * p.S + split) * static_cast<int64_t>(p.R) + r0;
  for (int i = tid; i < rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, mb[w * 16 + r]);
    float L = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        L += mb[w * 16 + r] == -INFINITY ? 0.f : exp2f(mb[w * 16 + r] - M) * lb[w * 16 + r];
    }
    p.part_o[(base_row + r) * D + d] = L > 0.f ? ob[r * D + d] / L : 0.f;
    if (d == 0) p.part_lse[base_row + r] = L > 0.f ? (M + log2f(L)) * kLn2 : -INFINITY;
  }
}

template <KvFormat F, int D, int VEC>
void launch_vec(const DecodeParams& p, int64_t B, cudaStream_t stream) {
  constexpr int NST = RingCfg<F, D>::kStages;
  // Row stride in the stage: row bytes rounded up to 16, plus 16 where that is a multiple of 64
  // (fp8 and f16 rows): otherwise the fragment reads of rows g (K) and 2t (V) hit the same banks.
  int srb = (p.c.row_bytes + 15) / 16 * 16;
  if (srb % 64 == 0) srb += 16;
  const int stage_bytes = 32 * srb + (F == KvFormat::fp8 ? 128 : 0);
  const int ring_bytes = kWarps * NST * stage_bytes;
  const int smem = ring_bytes > 16 * D * 4 ? ring_bytes : 16 * D * 4;
  auto kernel = decode_ring_kernel<F, D, VEC>;
  set_kernel_smem(kernel, smem, "decode_attention", "shared memory of the ring kernel");
  const int row_chunks = (p.R + 15) / 16;
  dim3 grid(p.S, p.H * row_chunks, static_cast<unsigned>(B));
  kernel<<<grid, kThreads, smem, stream>>>(p, srb, stage_bytes);
}

template <KvFormat F, int D>
void launch(const DecodeParams& p, int vec, int64_t B, cudaStream_t stream) {
  dispatch_int<4, 8, 16>(vec, "decode_attention", "vector width", [&](auto v) {
    launch_vec<F, D, decltype(v)::value>(p, B, stream);
  });
}

}  // namespace

bool decode_ring_supported(KvFormat format, int D) {
  return (format == KvFormat::int4 || format == KvFormat::fp8 || format == KvFormat::f16) &&
         (D == 64 || D == 128);
}

int ring_vector_bytes(const KvCache& c) {
  const CacheArgs a = make_cache_args(c);
  const int rank = c.paged() ? 3 : 4;
  const int code_off = c.format == KvFormat::int4 ? 4 * c.n_groups : 0;
  int vec = 4;
  for (int v : {16, 8, 4}) {
    bool ok = code_off % v == 0 && reinterpret_cast<uintptr_t>(a.k) % v == 0 &&
              reinterpret_cast<uintptr_t>(a.v) % v == 0;
    for (int d = 0; d < rank - 1; ++d) ok = ok && a.k_st[d] % v == 0 && a.v_st[d] % v == 0;
    if (ok) {
      vec = v;
      break;
    }
  }
  while (vec > 4 && a.row_bytes % vec != 0) vec /= 2;
  return vec;
}

void launch_decode_ring(const DecodeParams& p, KvFormat format, int D, int vec, int64_t B,
                        cudaStream_t stream) {
  dispatch_int<64, 128>(D, "decode_attention", "D (ring kernel)", [&](auto d) {
    constexpr int kD = decltype(d)::value;
    switch (format) {
      case KvFormat::int4: launch<KvFormat::int4, kD>(p, vec, B, stream); break;
      case KvFormat::fp8: launch<KvFormat::fp8, kD>(p, vec, B, stream); break;
      case KvFormat::f16: launch<KvFormat::f16, kD>(p, vec, B, stream); break;
      default: check::fail("decode_attention", "cache.format", "no ring kernel for bf16");
    }
  });
}

}  // namespace decode_detail
}  // namespace cuda
}  // namespace lowbit
