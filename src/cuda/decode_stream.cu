// Bandwidth-first split-K decode kernel (DecodePlan::streaming, the default where it applies):
// int4 / fp8 / f16 caches, D 64 or 128, up to 16 query rows of one KV head per CTA.
//
// No shared-memory staging of K/V. Each of the 4 warps of a CTA streams its own 16-key groups of
// the CTA's key range (groups warp, warp + 4, ...) straight from global memory into registers,
// already in the mma fragment order, with vector loads (16 bytes per lane per key for int4 K at
// D = 128). One register set per warp, staggered: the next group's K is loaded right after this
// group's QK (in flight during softmax and PV), its V right after this group's PV. The
// arithmetic is the tensor-core kernel's (decode_mma.cu, validated on the H200): QK and PV with
// mma.sync m16n8k16 (f16 operands, fp32 accumulation), permuted contraction order so that lane
// (g, t) needs key g's elements [t*D/4, (t+1)*D/4) for QK and dims [g*D/8, (g+1)*D/8) of keys
// 2t, 2t+1, 2t+8, 2t+9 for PV; int4 -> f16 by the 0x6400 exponent trick + one hfma2 (scale,
// shift); fp8 by cvt e4m3x2 -> f16x2 + hfma2; q's A fragments sit in shared memory (4 KB at
// D 128). Each warp keeps its own online softmax; at the end the four warps are merged in a small
// shared buffer (16 x D fp32, fixed warp order: deterministic).
// Paged caches: a group of 16 keys starts at a multiple of 16 (split_size is one), and page sizes
// are multiples of 16, so the group lies in one page: one block-table read per group.
// Absent keys (past the split, or an out-of-range page) are not loaded: their words are 0, which
// dequantizes to 0, and their scores are -inf.
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
struct Fmt;
template <>
struct Fmt<KvFormat::int4> {
  static constexpr int kPerWord = 8;
};
template <>
struct Fmt<KvFormat::fp8> {
  static constexpr int kPerWord = 4;
};
template <>
struct Fmt<KvFormat::f16> {
  static constexpr int kPerWord = 2;
};

// Elements 2j, 2j+1 of code word w as dequantized f16x2 (low half = element 2j).
template <KvFormat F>
__device__ __forceinline__ __half2 dequant_pair(uint32_t w, int j, __half2 scale, __half2 shift) {
  if constexpr (F == KvFormat::int4) {
    const uint32_t byte = (w >> (8 * j)) & 0xffu;
    const uint32_t u = (byte & 0xfu) | ((byte & 0xf0u) << 12) | 0x64006400u;  // 1024 + code
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

// N consecutive 32-bit words from global memory at p (aligned to min(VEC, 4N) bytes), read-only
// path, widest loads VEC allows.
template <int N, int VEC>
__device__ __forceinline__ void load_words(const char* p, uint32_t* out) {
  constexpr int W = VEC < 4 * N ? VEC : 4 * N;
#pragma unroll
  for (int i = 0; i < N; i += W / 4) {
    if constexpr (W == 16) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p + 4 * i));
      out[i] = x.x;
      out[i + 1] = x.y;
      out[i + 2] = x.z;
      out[i + 3] = x.w;
    } else if constexpr (W == 8) {
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(p + 4 * i));
      out[i] = x.x;
      out[i + 1] = x.y;
    } else {
      out[i] = __ldg(reinterpret_cast<const unsigned int*>(p + 4 * i));
    }
  }
}

// Raw words of one 16-key group for one lane (g = lane / 4, t = lane % 4).
template <KvFormat F, int D>
struct Raw {
  static constexpr int kPerWord = Fmt<F>::kPerWord;
  static constexpr int KW = (D / 4) / kPerWord;  // QK run: key g (+8), elements [t*D/4, +D/4)
  static constexpr int VW = (D / 8) / kPerWord;  // PV run: keys 2t(+1, +8, +9), dims [g*D/8, +D/8)
  static_assert(KW >= 1 && VW >= 1, "run sizes");
  uint32_t k[2][KW];
  uint32_t kc[2][2];  // int4: the run's coefficient words (2nd = 1st unless 8 groups); fp8: ss
  uint32_t v[4][VW];
  uint32_t vc[4];     // int4: coefficient word; fp8: scale/shift word
  uint32_t present;   // bit q: key 2t + (q & 1) + 8 (q >> 1) is in the split and its page exists
};

// The group's first row: pool row of key k0 (paged; -1 when its page is out of range) or k0.
__device__ __forceinline__ int64_t group_base(const CacheArgs& c, int64_t b, int64_t k0) {
  if (!c.block_tables) return k0;
  const int64_t page = c.block_tables[b * c.bt_st0 + (k0 / c.page_size) * c.bt_st1];
  return page < 0 ? -1 : page * c.page_size + k0 % c.page_size;
}
__device__ __forceinline__ bool has_key(const CacheArgs& c, int64_t base, int64_t k0, int key,
                                        int64_t hi) {
  return base >= 0 && k0 + key < hi && (!c.block_tables || base + key < c.pool_rows);
}

// K words of the group at k0 for lane (g, t): keys g and g + 8, the QK run.
template <KvFormat F, int D, int VEC>
__device__ __forceinline__ void load_k(const DecodeParams& p, int64_t b, int h, int64_t k0,
                                       int64_t hi, int g, int t, Raw<F, D>& r) {
  using R = Raw<F, D>;
  const CacheArgs& c = p.c;
  const int64_t base = group_base(c, b, k0);
  const int ng = c.n_groups;
  const int code_off = F == KvFormat::int4 ? 4 * ng : 0;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int key = g + 8 * s;
    if (has_key(c, base, k0, key, hi)) {
      const char* row = c.k + row_offset(c, 0, b, base + key, h);
      load_words<R::KW, VEC>(row + code_off + t * (4 * R::KW), r.k[s]);
      if constexpr (F == KvFormat::int4) {
        const int first = (t * (D / 4)) / (D / ng);
        const uint32_t* cw = reinterpret_cast<const uint32_t*>(row);
        r.kc[s][0] = __ldg(cw + first);
        r.kc[s][1] = ng == 8 ? __ldg(cw + first + 1) : r.kc[s][0];
      } else if constexpr (F == KvFormat::fp8) {
        r.kc[s][0] = __ldg(c.kss + ss_offset(c, 0, b, base + key, h));
      }
    } else {
#pragma unroll
      for (int i = 0; i < R::KW; ++i) r.k[s][i] = 0u;
      r.kc[s][0] = r.kc[s][1] = 0u;
    }
  }
}

// V words of the group at k0 for lane (g, t): keys 2t, 2t+1, 2t+8, 2t+9, the PV run; and the
// presence bits of those keys (they are also the keys of the lane's scores).
template <KvFormat F, int D, int VEC>
__device__ __forceinline__ void load_v(const DecodeParams& p, int64_t b, int h, int64_t k0,
                                       int64_t hi, int g, int t, Raw<F, D>& r) {
  using R = Raw<F, D>;
  const CacheArgs& c = p.c;
  const int64_t base = group_base(c, b, k0);
  const int ng = c.n_groups;
  const int code_off = F == KvFormat::int4 ? 4 * ng : 0;
  r.present = 0u;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int key = 2 * t + (q & 1) + 8 * (q >> 1);
    if (has_key(c, base, k0, key, hi)) {
      r.present |= 1u << q;
      const char* row = c.v + row_offset(c, 1, b, base + key, h);
      load_words<R::VW, VEC>(row + code_off + g * (4 * R::VW), r.v[q]);
      if constexpr (F == KvFormat::int4) {
        r.vc[q] = __ldg(reinterpret_cast<const uint32_t*>(row) + (g * (D / 8)) / (D / ng));
      } else if constexpr (F == KvFormat::fp8) {
        r.vc[q] = __ldg(c.vss + ss_offset(c, 1, b, base + key, h));
      }
    } else {
#pragma unroll
      for (int i = 0; i < R::VW; ++i) r.v[q][i] = 0u;
      r.vc[q] = 0u;
    }
  }
}

template <KvFormat F, int D, int VEC>
__global__ void __launch_bounds__(kThreads, 3) decode_stream_kernel(const DecodeParams p) {
  using R = Raw<F, D>;
  constexpr int kPerWord = Fmt<F>::kPerWord;
  constexpr int KS = D / 16;   // k-steps of QK
  constexpr int QRUN = D / 4;  // elements of a key per lane (QK)
  constexpr int NT = D / 8;    // n-tiles of PV
  __shared__ float ob[16 * D];
  __shared__ uint4 qs[KS * 32];  // q's A fragments, (k-step, lane)
  __shared__ float mb[kWarps * 16], lb[kWarps * 16];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x;
  const int row_chunks = (p.R + 15) / 16;
  const int h = blockIdx.y / row_chunks, r0 = (blockIdx.y % row_chunks) * 16;
  const int64_t b = blockIdx.z;
  const int rows = min(16, p.R - r0);

  const int64_t len = seq_length(p.c, b);
  const int64_t lo = min64(static_cast<int64_t>(split) * p.split_size, len);
  const int64_t hi = split == p.S - 1 ? len : min64(lo + p.split_size, len);
  const int n_groups = static_cast<int>((hi - lo + 15) / 16);
  const int my_groups = n_groups > warp ? (n_groups - warp + kWarps - 1) / kWarps : 0;

  R cur;
  if (my_groups > 0) {
    load_k<F, D, VEC>(p, b, h, lo + 16 * warp, hi, g, t, cur);
    load_v<F, D, VEC>(p, b, h, lo + 16 * warp, hi, g, t, cur);
  }

  // q as A fragments (rows g, g+8; permuted contraction order), f16, unscaled, kept in shared
  // memory (one 16-byte read per k-step and group; registers go to O and the K/V words).
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
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = ok ? load_f32(p.q, off + e, p.q_dtype) : 0.f;
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

#pragma unroll 1
  for (int it = 0; it < my_groups; ++it) {
    const int64_t k0 = lo + 16 * static_cast<int64_t>(warp + kWarps * it);
    const bool more = it + 1 < my_groups;

    // ---- S = q k^T for keys k0 + [0, 16) ----
    float sacc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const uint4 q4 = qs[ks * 32 + lane];
      const uint32_t qa[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        uint32_t kb[2];  // elements 4ks + {0,1}, 4ks + {2,3} of the lane's run of key nt*8 + g
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int e = 4 * ks + 2 * i;
          const uint32_t cw = F == KvFormat::int4 && e >= QRUN / 2 ? cur.kc[nt][1] : cur.kc[nt][0];
          kb[i] = h2_bits(
              dequant_pair<F>(cur.k[nt][e / kPerWord], (e % kPerWord) / 2, lo_h2(cw), hi_h2(cw)));
        }
        ptx::mma_f16(sacc[nt], qa, kb[0], kb[1]);
      }
    }
    // The next group's K streams in while this group's softmax and PV run.
    if (more) load_k<F, D, VEC>(p, b, h, k0 + 16 * kWarps, hi, g, t, cur);
    // ---- scale, mask, bias (base 2) ----
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int half = c >> 1;
        const int64_t j = k0 + nt * 8 + 2 * t + (c & 1);  // the PV key q = (c & 1) + 2 nt
        float s = -INFINITY;
        const bool key_ok = (cur.present >> ((c & 1) + 2 * nt)) & 1u;
        if (key_ok && rok[half] && (!p.causal || j <= causal_last0 + mrow[half])) {
          s = sacc[nt][c] * p.qk_scale;
          if (p.bias) {
            const int64_t off = b * p.bias_st[0] + h * p.bias_st[1] + grow[half] * p.bias_st[2] +
                                mrow[half] * p.bias_st[3] + j * p.bias_st[4];
            s += load_f32(p.bias, off, p.bias_dtype) * kLog2e;
          }
        }
        sacc[nt][c] = s;
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
        for (int c = 2 * half; c < 2 * half + 2; ++c) {
          const float pr = m_new == -INFINITY ? 0.f : exp2f(sacc[nt][c] - m_new);
          sacc[nt][c] = pr;
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
      if constexpr (F != KvFormat::f16) {
        vscale[q] = lo_h2(cur.vc[q]);
        vshift[q] = hi_h2(cur.vc[q]);
      }
    }
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
      __half2 vk[4];
#pragma unroll
      for (int q = 0; q < 4; ++q)
        vk[q] = dequant_pair<F>(cur.v[q][(2 * i) / kPerWord], ((2 * i) % kPerWord) / 2, vscale[q],
                                vshift[q]);
      // n-tile 2i holds dims g*NT + 2i (low halves), n-tile 2i+1 dims g*NT + 2i + 1 (high).
      ptx::mma_f16(o[2 * i], pa, h2_bits(__lows2half2(vk[0], vk[1])),
                   h2_bits(__lows2half2(vk[2], vk[3])));
      ptx::mma_f16(o[2 * i + 1], pa, h2_bits(__highs2half2(vk[0], vk[1])),
                   h2_bits(__highs2half2(vk[2], vk[3])));
    }
    // The next group's V streams in while its QK runs.
    if (more) load_v<F, D, VEC>(p, b, h, k0 + 16 * kWarps, hi, g, t, cur);
  }

  // ---- merge the four warps: (m, l) per row, then O accumulated warp by warp (fixed order) ----
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
        for (int c = 0; c < 4; ++c) {
          const int r = g + 8 * (c >> 1);
          const int dim = (2 * t + (c & 1)) * NT + nt;
          const float v = o[nt][c] * wscale[c >> 1];
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

template <KvFormat F, int D>
void launch(const DecodeParams& p, int vec, int64_t B, cudaStream_t stream) {
  const int row_chunks = (p.R + 15) / 16;
  dim3 grid(p.S, p.H * row_chunks, static_cast<unsigned>(B));
  dispatch_int<4, 8, 16>(vec, "decode_attention", "vector width", [&](auto v) {
    constexpr int kVec = decltype(v)::value;
    decode_stream_kernel<F, D, kVec><<<grid, kThreads, 0, stream>>>(p);
  });
}

}  // namespace

bool decode_stream_supported(KvFormat format, int D) {
  return (format == KvFormat::int4 || format == KvFormat::fp8 || format == KvFormat::f16) &&
         (D == 64 || D == 128);
}

int stream_vector_bytes(const KvCache& c) {
  const CacheArgs a = make_cache_args(c);
  const int rank = c.paged() ? 3 : 4;
  const int code_off = c.format == KvFormat::int4 ? 4 * c.n_groups : 0;
  for (int vec : {16, 8, 4}) {
    bool ok = code_off % vec == 0 && reinterpret_cast<uintptr_t>(a.k) % vec == 0 &&
              reinterpret_cast<uintptr_t>(a.v) % vec == 0;
    for (int d = 0; d < rank - 1; ++d) ok = ok && a.k_st[d] % vec == 0 && a.v_st[d] % vec == 0;
    if (ok) return vec;
  }
  return 4;
}

void launch_decode_stream(const DecodeParams& p, KvFormat format, int D, int vec, int64_t B,
                          cudaStream_t stream) {
  dispatch_int<64, 128>(D, "decode_attention", "D (streaming kernel)", [&](auto d) {
    constexpr int kD = decltype(d)::value;
    switch (format) {
      case KvFormat::int4: launch<KvFormat::int4, kD>(p, vec, B, stream); break;
      case KvFormat::fp8: launch<KvFormat::fp8, kD>(p, vec, B, stream); break;
      case KvFormat::f16: launch<KvFormat::f16, kD>(p, vec, B, stream); break;
      default: check::fail("decode_attention", "cache.format", "no streaming kernel for bf16");
    }
  });
}

}  // namespace decode_detail
}  // namespace cuda
}  // namespace lowbit
