// Tensor-core variant of the split-K decode kernel (DecodePlan::tensor_cores): int4 / fp8 / f16
// caches, D 64 or 128, up to 16 query rows of one KV head per CTA (padded to the mma's M = 16).
//
// 128 threads, tiles of 64 keys through the same 3-stage cp.async ring as the CUDA-core kernel;
// warp w owns keys [16w, 16w + 16) of every tile and keeps its own online softmax (no CTA-wide
// softmax step); the four warps' (m, l, O) are merged in shared memory at the end.
//   QK: mma.sync m16n8k16 (f16 x f16 -> f32). The contraction index is permuted so that lane
//       (g = lane/4, t = lane%4) of the B fragment holds key g's elements [t*D/4, (t+1)*D/4),
//       i.e. one contiguous run of codes (16 bytes of int4 at D = 128): k-step ks uses elements
//       t*D/4 + 4ks + {0,1} (b0) and + {2,3} (b1); q's A fragment is loaded with the same order.
//   Dequantization to f16 in registers: int4 via the 0x6400 exponent trick (exact codes) and one
//       hfma2 with (scale, shift); fp8 via cvt e4m3x2 -> f16x2 and one hfma2; f16 as is.
//   PV: the S accumulators are re-packed as the A operand (the FlashAttention-2 register reuse);
//       output column n of n-tile nt is physical dim n*D/8 + nt, so lane (g, t) dequantizes dims
//       [g*D/8, (g+1)*D/8) of keys 2t, 2t+1, 2t+8, 2t+9 and pairs them across keys.
// Differences from the CPU oracle: K/V values and P are rounded to f16 (one rounding of the exact
// code*scale+shift), q too; sums in fp32.
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
constexpr int kTile = 64;  // keys per tile, 16 per warp
constexpr int kStages = 3;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ __forceinline__ int pad16(int bytes) { return (bytes + 15) & ~15; }

__device__ __forceinline__ __half2 coef_h2(uint16_t bits) {
  const __half h = __ushort_as_half(bits);
  return __halves2half2(h, h);
}

// Elements 2j, 2j+1 of code word w as f16x2 (low half = element 2j), dequantized.
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

template <KvFormat F>
struct Traits;
template <>
struct Traits<KvFormat::int4> {
  static constexpr int kPerWord = 8;
};
template <>
struct Traits<KvFormat::fp8> {
  static constexpr int kPerWord = 4;
};
template <>
struct Traits<KvFormat::f16> {
  static constexpr int kPerWord = 2;
};

// n consecutive elements [e0, e0 + n) of a cache row in smem as n/2 f16x2 (n even, e0 even,
// the run inside one group).
template <KvFormat F, int N>
__device__ __forceinline__ void load_run(const uint32_t* row, int e0, int n_groups, int group_size,
                                         uint32_t ss, uint32_t* out) {
  constexpr int kPerWord = Traits<F>::kPerWord;
  __half2 scale = __float2half2_rn(0.f), shift = scale;
  const int code0 = F == KvFormat::int4 ? n_groups : 0;
  if constexpr (F == KvFormat::fp8) {
    scale = coef_h2(static_cast<uint16_t>(ss & 0xffffu));
    shift = coef_h2(static_cast<uint16_t>(ss >> 16));
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int e = e0 + 2 * i;
    const uint32_t w = row[code0 + e / kPerWord];
    if constexpr (F == KvFormat::int4) {
      const uint32_t coef = row[e / group_size];
      scale = coef_h2(static_cast<uint16_t>(coef & 0xffffu));
      shift = coef_h2(static_cast<uint16_t>(coef >> 16));
    }
    out[i] = h2_bits(dequant_pair<F>(w, (e % kPerWord) / 2, scale, shift));
  }
}

template <KvFormat F, int D>
__global__ void __launch_bounds__(kThreads) decode_mma_kernel(const DecodeParams p) {
  constexpr int KS = D / 16;       // k-steps of QK
  constexpr int QRUN = D / 4;      // elements of a key per lane (QK)
  constexpr int NT = D / 8;        // n-tiles of PV (output column tiles)
  extern __shared__ __align__(16) unsigned char smem[];
  const int RB = p.c.row_bytes, RBP = pad16(RB);
  unsigned char* kv_s = smem;
  uint32_t* ss_s = reinterpret_cast<uint32_t*>(kv_s + static_cast<size_t>(kStages) * 2 * kTile * RBP);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x;
  const int row_chunks = (p.R + 15) / 16;
  const int h = blockIdx.y / row_chunks, r0 = (blockIdx.y % row_chunks) * 16;
  const int64_t b = blockIdx.z;
  const int rows = min(16, p.R - r0);
  const int group_size = D / p.c.n_groups;

  const int64_t len = seq_length(p.c, b);
  const int64_t lo = min64(static_cast<int64_t>(split) * p.split_size, len);
  const int64_t hi = split == p.S - 1 ? len : min64(lo + p.split_size, len);
  const int n_tiles = static_cast<int>((hi - lo + kTile - 1) / kTile);
  const int chunks_per_row = RB / p.vec;

  auto issue = [&](int tile) {
    if (tile < n_tiles) {
      const int stage = tile % kStages;
      const int64_t k0 = lo + static_cast<int64_t>(tile) * kTile;
      const int nk = static_cast<int>(min64(kTile, hi - k0));
      unsigned char* dst = kv_s + static_cast<size_t>(stage) * 2 * kTile * RBP;
      const int total = 2 * kTile * chunks_per_row;
      for (int i = tid; i < total; i += kThreads) {
        const int which = i / (kTile * chunks_per_row);
        const int rem = i % (kTile * chunks_per_row);
        const int key = rem / chunks_per_row, c = rem % chunks_per_row;
        const char* base = which ? p.c.v : p.c.k;
        const int64_t row = key < nk ? physical_row(p.c, b, k0 + key) : -1;
        const char* src = row >= 0 ? base + row_offset(p.c, which, b, row, h) + c * p.vec : base;
        cp_async(dst + (which * kTile + key) * RBP + c * p.vec, src, p.vec, row >= 0 ? p.vec : 0);
      }
      if constexpr (F == KvFormat::fp8) {
        const int which = tid / kTile, key = tid % kTile;  // 128 threads = 2 x 64 words
        const int64_t row = key < nk ? physical_row(p.c, b, k0 + key) : -1;
        const uint32_t* base = which ? p.c.vss : p.c.kss;
        const uint32_t* src = row >= 0 ? base + ss_offset(p.c, which, b, row, h) : base;
        cp_async(ss_s + (stage * 2 + which) * kTile + key, src, 4, row >= 0 ? 4 : 0);
      }
    }
    cp_async_commit();
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  // q as A fragments (rows g, g+8; permuted contraction order), f16, unscaled.
  uint32_t qa[KS][4];
  {
    float qv[2][QRUN];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      const bool ok = r < rows;
      const int rr = r0 + r, m = ok ? rr / p.G : 0, gq = ok ? rr % p.G : 0;
      const int64_t off = b * p.q_st[0] + m * p.q_st[1] + h * p.q_st[2] + gq * p.q_st[3] + t * QRUN;
#pragma unroll
      for (int e = 0; e < QRUN; ++e) qv[half][e] = ok ? load_f32(p.q, off + e, p.q_dtype) : 0.f;
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      qa[ks][0] = pack_f32x2(qv[0][4 * ks], qv[0][4 * ks + 1]);
      qa[ks][1] = pack_f32x2(qv[1][4 * ks], qv[1][4 * ks + 1]);
      qa[ks][2] = pack_f32x2(qv[0][4 * ks + 2], qv[0][4 * ks + 3]);
      qa[ks][3] = pack_f32x2(qv[1][4 * ks + 2], qv[1][4 * ks + 3]);
    }
  }

  float o[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // rows g, g+8 (lane partial l)
  const int64_t causal_last0 = len - p.Mq;

  for (int tile = 0; tile < n_tiles; ++tile) {
    issue(tile + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int stage = tile % kStages;
    const unsigned char* k_tile = kv_s + static_cast<size_t>(stage) * 2 * kTile * RBP;
    const unsigned char* v_tile = k_tile + kTile * RBP;
    const uint32_t* kss_t = ss_s + (stage * 2) * kTile;
    const uint32_t* vss_t = kss_t + kTile;
    const int64_t k0 = lo + static_cast<int64_t>(tile) * kTile;
    const int nk = static_cast<int>(min64(kTile, hi - k0));
    const int wk = warp * 16;  // this warp's first key in the tile

    if (wk < nk) {  // warp-uniform
      // ---- S = q k^T for keys wk + [0, 16) ----
      float sacc[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.f;
        const int key = wk + nt * 8 + g;
        const uint32_t* row = reinterpret_cast<const uint32_t*>(k_tile + key * RBP);
        uint32_t kb[QRUN / 2];
        load_run<F, QRUN>(row, t * QRUN, p.c.n_groups, group_size,
                          F == KvFormat::fp8 ? kss_t[key] : 0u, kb);
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) ptx::mma_f16(sacc[nt], qa[ks], kb[2 * ks], kb[2 * ks + 1]);
      }
      // ---- scale, mask, bias (base 2) ----
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int r = g + 8 * (c >> 1);
          const int key = wk + nt * 8 + 2 * t + (c & 1);
          const int64_t j = k0 + key;
          float s = -INFINITY;
          if (key < nk && r < rows) {
            const int rr = r0 + r, m = rr / p.G, gq = rr % p.G;
            if (!p.causal || j <= causal_last0 + m) {
              s = sacc[nt][c] * p.qk_scale;
              if (p.bias) {
                const int64_t off = b * p.bias_st[0] + h * p.bias_st[1] + gq * p.bias_st[2] +
                                    m * p.bias_st[3] + j * p.bias_st[4];
                s += load_f32(p.bias, off, p.bias_dtype) * kLog2e;
              }
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
      uint32_t vk[4][NT / 2];  // keys 2t, 2t+1, 2t+8, 2t+9: dims [g*NT, (g+1)*NT) as f16x2
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int key = wk + 2 * t + (q & 1) + 8 * (q >> 1);
        const uint32_t* row = reinterpret_cast<const uint32_t*>(v_tile + key * RBP);
        load_run<F, NT>(row, g * NT, p.c.n_groups, group_size, F == KvFormat::fp8 ? vss_t[key] : 0u,
                        vk[q]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int i = nt / 2;
        uint32_t b0, b1;
        if (nt % 2 == 0) {
          b0 = h2_bits(__lows2half2(bits_h2(vk[0][i]), bits_h2(vk[1][i])));
          b1 = h2_bits(__lows2half2(bits_h2(vk[2][i]), bits_h2(vk[3][i])));
        } else {
          b0 = h2_bits(__highs2half2(bits_h2(vk[0][i]), bits_h2(vk[1][i])));
          b1 = h2_bits(__highs2half2(bits_h2(vk[2][i]), bits_h2(vk[3][i])));
        }
        ptx::mma_f16(o[nt], pa, b0, b1);
      }
    }
    __syncthreads();  // the stage is refilled next iteration
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- merge the four warps: (m, l, O) per row through shared memory (reusing the ring) ----
  float* ob = reinterpret_cast<float*>(smem);       // (warps, 16, D)
  float* mb = ob + kWarps * 16 * D;                 // (warps, 16)
  float* lb = mb + kWarps * 16;                     // (warps, 16)
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
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = g + 8 * (c >> 1);
      const int dim = (2 * t + (c & 1)) * NT + nt;
      ob[(warp * 16 + r) * D + dim] = o[nt][c];
    }
  __syncthreads();
  const int64_t base_row = ((b * p.H + h) * p.S + split) * static_cast<int64_t>(p.R) + r0;
  for (int i = tid; i < rows * D; i += kThreads) {
    const int r = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, mb[w * 16 + r]);
    float L = 0.f, acc = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float e = mb[w * 16 + r] == -INFINITY ? 0.f : exp2f(mb[w * 16 + r] - M);
        L += e * lb[w * 16 + r];
        acc += e * ob[(w * 16 + r) * D + d];
      }
    }
    p.part_o[(base_row + r) * D + d] = L > 0.f ? acc / L : 0.f;
    if (d == 0) p.part_lse[base_row + r] = L > 0.f ? (M + log2f(L)) * kLn2 : -INFINITY;
  }
}

template <KvFormat F, int D>
void launch(const DecodeParams& p, int64_t B, cudaStream_t stream) {
  const size_t ring = static_cast<size_t>(kStages) * 2 * kTile * pad16(p.c.row_bytes) +
                      sizeof(uint32_t) * kStages * 2 * kTile;
  const size_t merge = sizeof(float) * (kWarps * 16 * D + 2 * kWarps * 16);
  const size_t smem = ring > merge ? ring : merge;
  auto kernel = decode_mma_kernel<F, D>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)),
             "decode_attention", "shared memory");
  const int row_chunks = (p.R + 15) / 16;
  dim3 grid(p.S, p.H * row_chunks, static_cast<unsigned>(B));
  kernel<<<grid, kThreads, smem, stream>>>(p);
}

}  // namespace

bool decode_mma_supported(KvFormat format, int D) {
  return (format == KvFormat::int4 || format == KvFormat::fp8 || format == KvFormat::f16) &&
         (D == 64 || D == 128);
}

void launch_decode_mma(const DecodeParams& p, KvFormat format, int D, int64_t B,
                       cudaStream_t stream) {
  dispatch_int<64, 128>(D, "decode_attention", "D (tensor-core kernel)", [&](auto d) {
    constexpr int kD = decltype(d)::value;
    switch (format) {
      case KvFormat::int4: launch<KvFormat::int4, kD>(p, B, stream); break;
      case KvFormat::fp8: launch<KvFormat::fp8, kD>(p, B, stream); break;
      case KvFormat::f16: launch<KvFormat::f16, kD>(p, B, stream); break;
      default: check::fail("decode_attention", "cache.format", "no tensor-core kernel for bf16");
    }
  });
}

}  // namespace decode_detail
}  // namespace cuda
}  // namespace lowbit
