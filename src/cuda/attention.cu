// CUDA backend of the attention family (SPEC §2): the mma.sync kernel (sm_89/sm_90; INT8
// m16n8k32 for q k^T, e4m3 m16n8k32 or bf16/f16 m16n8k16 for P V) and V quantization to fp8.
// q and k come quantized from the prologue (SPEC §1).
//
// Attention kernel: one CTA = 8 warps = 128 query rows of one (batch, head); 64 keys per step,
// K/V tiles double-buffered in shared memory with cp.async; each warp owns 16 rows and keeps
// their logits, online-softmax state and output accumulator in registers. Head dim 64, 128 and
// 256 (D = 256: the only CUDA kernel for it; 128 fp32 accumulators per lane, so the q fragments
// are read from shared memory per 64-channel step instead of held in registers, 16-bit P·V
// packs all of P before its channel loop, and fp8 P·V runs on f16 tensor cores: the CTA widens
// each V tile to f16 in shared memory once, P is rounded to e4m3 then widened).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "lowbit/attention.h"
#include "lowbit/dtype.h"
#include "src/core/dispatch.h"
#include "src/cpu/attention_backend.h"
#include "src/cuda/attention_common.cuh"
#include "src/cuda/common.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace {

using attn::AttnParams;
using attn::cta_tiles;
using attn::CtaTiles;
using attn::fast_exp2;
using attn::kLn2;
using attn::kLog2_448;
using attn::kLog2e;
using attn::pack_16x2;
using attn::pack_e4m3x4;
using attn::scale_index_dev;
using attn::store_rows;
using attn::to_f32;
using attn::visible_end;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_e4m3;
using ptx::mma_s8;

constexpr int kWarps = 8;  // warps per CTA
constexpr int kRowsPerCta = 16 * kWarps;
constexpr int kKvTile = 64;  // keys per step (the oracle's tile)
constexpr int kThreads = 32 * kWarps;

// ---- small PTX wrappers ----------------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}

template <typename T16>
__device__ __forceinline__ void mma_16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  if constexpr (std::is_same<T16, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, and lane l receives
// row l/4, b16 columns 2(l%4), 2(l%4)+1 of each (for 8-bit data: bytes 4(l%4)..4(l%4)+3).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// ---- attention kernel --------------------------------------------------------------------------

// Two e4m3 codes (x0 in the low byte) as f16x2 (x0 in the low half); exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(codes)));
  return h;
#else
  const __half2 v = __floats2half2_rn(dt::e4m3_to_f32(static_cast<uint8_t>(codes)),
                                      dt::e4m3_to_f32(static_cast<uint8_t>(codes >> 8)));
  return *reinterpret_cast<const uint32_t*>(&v);
#endif
}

// x0, x1 rounded to e4m3 (nearest even, saturating: the fp8 P of SPEC §2), as f16x2.
__device__ __forceinline__ uint32_t e4m3_rounded_f16x2(float x0, float x1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t e;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(e) : "f"(x1), "f"(x0));
  return e4m3x2_to_f16x2(e);
#else
  return e4m3x2_to_f16x2(uint32_t{dt::f32_to_e4m3(x0)} | (uint32_t{dt::f32_to_e4m3(x1)} << 8));
#endif
}

// O = O r for a pair of 8-channel accumulator groups (D = 256's P·V loops: rows g (r0) and
// g + 8 (r1) of each group).
__device__ __forceinline__ void rescale_pair(float (&a)[4], float (&b)[4], float r0, float r1) {
  a[0] *= r0;
  a[1] *= r0;
  a[2] *= r1;
  a[3] *= r1;
  b[0] *= r0;
  b[1] *= r0;
  b[2] *= r1;
  b[3] *= r1;
}

// scale_index_dev in 32-bit arithmetic (row < 2^31; Nkv is an int).
__device__ __forceinline__ int scale_index32(int layout, int block, int row) {
  const int r = row % block;
  const int group = layout == 1 ? r % 8 : layout == 2 ? (r % 8) / 2 : layout == 3 ? r / 32 : 0;
  const int groups = layout == 0 ? 1 : layout == 1 ? 8 : 4;
  return (row / block) * groups + group;
}

template <int D, bool FP8>
struct Smem {
  static constexpr int kQStride = D + 16;                            // bytes per q/k row
  static constexpr int kVStride = FP8 ? kKvTile + 16 : (D + 8) * 2;  // bytes per V row
  static constexpr int kVRows = FP8 ? D : kKvTile;
  static constexpr int kQBytes = kRowsPerCta * kQStride;
  static constexpr int kKBytes = kKvTile * kQStride;
  static constexpr int kVBytes = kVRows * kVStride;
  static constexpr int kKOff = kQBytes;
  static constexpr int kVOff = kKOff + 2 * kKBytes;
  static constexpr int kSOff = kVOff + 2 * kVBytes;
  // fp8 P·V at D = 256: the current V tile widened to f16, keys in natural order (one buffer).
  static constexpr bool kWideV = FP8 && D > 128;
  static constexpr int kV16Stride = kKvTile * 2 + 16;  // bytes per channel row
  static constexpr int kV16Off = kSOff + 2 * kKvTile * 4;
  static constexpr int kBytes = kV16Off + (kWideV ? D * kV16Stride : 0);
};

template <int D, bool FP8, typename T16>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttnParams p) {
  using S = Smem<D, FP8>;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sQ = smem;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const CtaTiles ct = cta_tiles<kRowsPerCta, kKvTile>(p);  // causal: long rows first
  const int h = ct.h, b = ct.b, hk = ct.hk, n_tiles = ct.n_tiles;
  const int64_t q0 = ct.q0;

  const int8_t* qg = p.q + b * p.q_sb + h * p.q_sh;
  const int8_t* kg = p.k + b * p.k_sb + hk * p.k_sh;
  const float* ksg = p.k_scale + b * p.ks_sb + hk * p.ks_sh;

  // Q tile.
  constexpr int kChunks = D / 16;
  for (int c = tid; c < kRowsPerCta * kChunks; c += kThreads) {
    const int r = c / kChunks, col = c % kChunks;
    const bool ok = q0 + r < p.Nq;
    cp_async16(sQ + r * S::kQStride + col * 16, ok ? qg + (q0 + r) * p.q_sn + col * 16 : p.q, ok);
  }
  auto load_tile = [&](int tile, int buf) {
    const int64_t kv0 = static_cast<int64_t>(tile) * kKvTile;
    uint8_t* sK = smem + S::kKOff + buf * S::kKBytes;
    for (int c = tid; c < kKvTile * kChunks; c += kThreads) {
      const int r = c / kChunks, col = c % kChunks;
      const bool ok = kv0 + r < ct.nkv;
      cp_async16(sK + r * S::kQStride + col * 16, ok ? kg + (kv0 + r) * p.k_sn + col * 16 : p.k,
                 ok);
    }
    uint8_t* sV = smem + S::kVOff + buf * S::kVBytes;
    if constexpr (FP8) {
      const uint8_t* vg = static_cast<const uint8_t*>(p.v) +
                          (static_cast<int64_t>(b) * p.Hkv + hk) * D * p.npad + kv0;
      for (int c = tid; c < D * (kKvTile / 16); c += kThreads) {
        const int d = c / (kKvTile / 16), col = c % (kKvTile / 16);
        cp_async16(sV + d * S::kVStride + col * 16, vg + d * p.npad + col * 16, true);
      }
    } else {
      const T16* vg = static_cast<const T16*>(p.v) + b * p.v_sb + hk * p.v_sh;
      constexpr int kVChunks = D / 8;
      for (int c = tid; c < kKvTile * kVChunks; c += kThreads) {
        const int r = c / kVChunks, col = c % kVChunks;
        const bool ok = kv0 + r < ct.nkv;
        cp_async16(sV + r * S::kVStride + col * 16,
                   ok ? static_cast<const void*>(vg + (kv0 + r) * p.v_sn + col * 8) : p.v, ok);
      }
    }
    if (tid < kKvTile) {  // k scales ride in the same cp.async group (keys past N: 0)
      const int64_t key = kv0 + tid;
      const bool ok = key < ct.nkv;
      // D = 256: 32-bit index math (keys < 2^31), no 64-bit division subroutine in the loop
      // (its call would pin registers the output accumulator needs).
      const int64_t si = D > 128 ? scale_index32(p.k_layout, p.k_block, static_cast<int>(key))
                                 : scale_index_dev(p.k_layout, p.k_block, key);
      cp_async4(reinterpret_cast<float*>(smem + S::kSOff) + buf * kKvTile + tid,
                ok ? ksg + si * p.ks_ss : ksg, ok);
    }
  };
  if (n_tiles > 0) load_tile(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // This thread's two rows, their scales and visible ends.
  const int64_t row0 = q0 + warp * 16 + g, row1 = row0 + 8;
  const float* qsg = p.q_scale + b * p.qs_sb + h * p.qs_sh;
  const float qs0 = row0 < p.Nq ? qsg[scale_index_dev(p.q_layout, p.q_block, row0) * p.qs_ss] : 0.f;
  const float qs1 = row1 < p.Nq ? qsg[scale_index_dev(p.q_layout, p.q_block, row1) * p.qs_ss] : 0.f;
  const int64_t end0 = row0 < p.Nq ? visible_end(p, ct, row0) : 0;
  const int64_t end1 = row1 < p.Nq ? visible_end(p, ct, row1) : 0;

  // Q fragments (A of m16n8k32): rows g / g+8, bytes 4t.. and 16+4t.. of each 32-channel step.
  // D <= 128: all of them in registers for the whole kernel. D = 256: the output accumulator
  // alone takes 128 registers per lane, so the fragments of each pair of 32-channel steps are
  // read from shared memory where they are used (8 registers instead of 32; no spills).
  constexpr bool kQInRegs = D <= 128;
  constexpr int kQRegSteps = kQInRegs ? D / 32 : 2;
  const uint8_t* q_base = sQ + (warp * 16 + g) * S::kQStride;
  auto q_frag = [&](int kk, uint32_t (&f)[4]) {
    f[0] = *reinterpret_cast<const uint32_t*>(q_base + kk * 32 + 4 * t);
    f[1] = *reinterpret_cast<const uint32_t*>(q_base + 8 * S::kQStride + kk * 32 + 4 * t);
    f[2] = *reinterpret_cast<const uint32_t*>(q_base + kk * 32 + 16 + 4 * t);
    f[3] = *reinterpret_cast<const uint32_t*>(q_base + 8 * S::kQStride + kk * 32 + 16 + 4 * t);
  };
  uint32_t qf[kQRegSteps][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) q_frag(kk, qf[kk]);
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float p_offset = FP8 ? kLog2_448 : 0.f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    if (tile + 1 < n_tiles) load_tile(tile + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int64_t kv0 = static_cast<int64_t>(tile) * kKvTile;
    const uint8_t* sK = smem + S::kKOff + buf * S::kKBytes;
    const float* sKs = reinterpret_cast<const float*>(smem + S::kSOff) + buf * kKvTile;
    if constexpr (S::kWideV) {
      // fp8 P·V at D = 256: the CTA widens this tile's V codes to f16 once (exact), un-permuting
      // the keys (word w of a channel row holds keys k0, k0+1, k0+8, k0+9, k0 = 16(w/4) +
      // 2(w%4)); the P·V below then runs the 16-bit path's f16 tensor-core steps on it instead
      // of every warp widening the whole tile (an e4m3 mma.sync is widened to f16 on sm_90
      // anyway, and its fresh two-level accumulator would not fit beside O: 172 B of spills;
      // that form measured 0.90-0.92x of this one in H200 run 30).
      // Read after the barrier before P·V; the previous tile's readers passed the loop's last one.
      const uint8_t* sV8 = smem + S::kVOff + buf * S::kVBytes;
      uint8_t* sV16 = smem + S::kV16Off;
      const int w = tid & 15, k0 = 16 * (w >> 2) + 2 * (w & 3);
#pragma unroll 4
      for (int d = tid >> 4; d < D; d += kThreads / 16) {
        const uint32_t c4 = *reinterpret_cast<const uint32_t*>(sV8 + d * S::kVStride + 4 * w);
        uint8_t* row = sV16 + d * S::kV16Stride;
        *reinterpret_cast<uint32_t*>(row + 2 * k0) = e4m3x2_to_f16x2(c4 & 0xffffu);
        *reinterpret_cast<uint32_t*>(row + 2 * (k0 + 8)) = e4m3x2_to_f16x2(c4 >> 16);
      }
    }

    // S = q k^T in int32 (8 key groups of 8).
    int acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
    // (D = 256: a loop, so that no step's loads are hoisted into another's registers.)
#pragma unroll(kQInRegs ? D / 64 : 1)
    for (int kk = 0; kk < D / 32; kk += 2) {
      const int qa = kQInRegs ? kk : 0;  // qf index of step kk (D = 256: loaded here)
      if constexpr (!kQInRegs) {
        q_frag(kk, qf[0]);
        q_frag(kk + 1, qf[1]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        // Matrix m: keys 8j..8j+7, channel bytes 32kk + 16m..+15 -> b0, b1 of step kk, kk+1.
        uint32_t kb[4];
        ldmatrix_x4(kb, sK + (j * 8 + (lane & 7)) * S::kQStride + kk * 32 + (lane >> 3) * 16);
        mma_s8(acc[j], qf[qa], kb[0], kb[1]);
        mma_s8(acc[j], qf[qa + 1], kb[2], kb[3]);
      }
    }
    // Dequantize to base-2 logits, mask, row maxima.
    float s[8][4];
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = j * 8 + 2 * t + e;
        const int64_t key = kv0 + col;
        const float ks = sKs[col];
        float v0 =
            __fmul_rn(__fmul_rn(static_cast<float>(acc[j][e]), __fmul_rn(qs0, ks)), p.scale_log2);
        float v1 = __fmul_rn(__fmul_rn(static_cast<float>(acc[j][2 + e]), __fmul_rn(qs1, ks)),
                             p.scale_log2);
        v0 = key < end0 ? v0 : -INFINITY;
        v1 = key < end1 ? v1 : -INFINITY;
        s[j][e] = v0;
        s[j][2 + e] = v1;
        mx0 = fmaxf(mx0, v0);
        mx1 = fmaxf(mx1, v1);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float r0 = m0 == -INFINITY ? 0.f : fast_exp2(m0 - mn0);
    const float r1 = m1 == -INFINITY ? 0.f : fast_exp2(m1 - mn1);
    const float off0 = mn0 == -INFINITY ? 0.f : mn0 - p_offset;
    const float off1 = mn1 == -INFINITY ? 0.f : mn1 - p_offset;
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][0] = fast_exp2(s[j][0] - off0);
      s[j][1] = fast_exp2(s[j][1] - off0);
      s[j][2] = fast_exp2(s[j][2] - off1);
      s[j][3] = fast_exp2(s[j][3] - off1);
      sum0 += s[j][0] + s[j][1];
      sum1 += s[j][2] + s[j][3];
    }
    l0 = l0 * r0 + sum0;
    l1 = l1 * r1 + sum1;

    const uint8_t* sV = smem + S::kVOff + buf * S::kVBytes;
    if constexpr (S::kWideV) {
      // P rounded to e4m3 (the fp8 mode's values), widened to f16 (exact); V from the widened
      // tile; products accumulated in fp32 straight into the rescaled O: the two-level sum's
      // values up to fp32 summation order (its point, an fp8 mma.sync's short accumulator, does
      // not arise on f16 tensor cores).
      uint32_t ph[kKvTile / 16][4];  // A fragments of the 4 key steps of 16
#pragma unroll
      for (int kk = 0; kk < kKvTile / 16; ++kk) {
        ph[kk][0] = e4m3_rounded_f16x2(s[2 * kk][0], s[2 * kk][1]);
        ph[kk][1] = e4m3_rounded_f16x2(s[2 * kk][2], s[2 * kk][3]);
        ph[kk][2] = e4m3_rounded_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        ph[kk][3] = e4m3_rounded_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
      __syncthreads();  // the widened V tile is complete
      const uint8_t* sV16 = smem + S::kV16Off;
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        rescale_pair(o[n], o[n + 1], r0, r1);
#pragma unroll
        for (int kk = 0; kk < kKvTile / 16; ++kk) {
          // Matrix m: channels 8(n + m/2).., keys 16kk + 8(m%2)..: b0, b1 of o[n], then o[n+1].
          uint32_t vb[4];
          const int m = lane >> 3;
          ldmatrix_x4(vb, sV16 + (8 * (n + m / 2) + (lane & 7)) * S::kV16Stride +
                              (16 * kk + 8 * (m % 2)) * 2);
          mma_16<__half>(o[n], ph[kk], vb[0], vb[1]);
          mma_16<__half>(o[n + 1], ph[kk], vb[2], vb[3]);
        }
      }
    } else if constexpr (FP8) {
      // P as e4m3 A fragments; keys in the order of the fp8 V layout (attention.h).
      uint32_t pa[2][4];
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int j = 4 * ks;
        pa[ks][0] = pack_e4m3x4(s[j][0], s[j][1], s[j + 1][0], s[j + 1][1]);
        pa[ks][1] = pack_e4m3x4(s[j][2], s[j][3], s[j + 1][2], s[j + 1][3]);
        pa[ks][2] = pack_e4m3x4(s[j + 2][0], s[j + 2][1], s[j + 3][0], s[j + 3][1]);
        pa[ks][3] = pack_e4m3x4(s[j + 2][2], s[j + 2][3], s[j + 3][2], s[j + 3][3]);
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        float c[4] = {0.f, 0.f, 0.f, 0.f};  // two-level accumulation: this tile's P V
        // Matrix m: channels 8n..8n+7, key positions 16m..16m+15 -> b0, b1 of steps 0 and 1.
        uint32_t vb[4];
        ldmatrix_x4(vb, sV + (n * 8 + (lane & 7)) * S::kVStride + (lane >> 3) * 16);
        mma_e4m3(c, pa[0], vb[0], vb[1]);
        mma_e4m3(c, pa[1], vb[2], vb[3]);
        o[n][0] = o[n][0] * r0 + c[0];
        o[n][1] = o[n][1] * r0 + c[1];
        o[n][2] = o[n][2] * r1 + c[2];
        o[n][3] = o[n][3] * r1 + c[3];
      }
    } else if constexpr (D > 128) {
      // D = 256: all of P packed first (16 registers; the fp32 P dies), then per pair of 8-channel
      // groups the 4 key steps in order: each o[n] sees the same operations in the same order as
      // below, with less live at once.
      uint32_t pa[kKvTile / 16][4];
#pragma unroll
      for (int kk = 0; kk < kKvTile / 16; ++kk) {
        pa[kk][0] = pack_16x2<T16>(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack_16x2<T16>(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack_16x2<T16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack_16x2<T16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        rescale_pair(o[n], o[n + 1], r0, r1);
#pragma unroll
        for (int kk = 0; kk < kKvTile / 16; ++kk) {
          uint32_t vb[4];
          const int row = kk * 16 + (lane & 15), col = n * 8 + (lane >> 4) * 8;
          ldmatrix_x4_trans(vb, sV + row * S::kVStride + col * 2);
          mma_16<T16>(o[n], pa[kk], vb[0], vb[1]);
          mma_16<T16>(o[n + 1], pa[kk], vb[2], vb[3]);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= r0;
        o[n][1] *= r0;
        o[n][2] *= r1;
        o[n][3] *= r1;
      }
#pragma unroll
      for (int kk = 0; kk < kKvTile / 16; ++kk) {
        uint32_t pa[4];
        pa[0] = pack_16x2<T16>(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack_16x2<T16>(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack_16x2<T16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack_16x2<T16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t vb[4];
          const int row = kk * 16 + (lane & 15), col = n * 8 + (lane >> 4) * 8;
          ldmatrix_x4_trans(vb, sV + row * S::kVStride + col * 2);
          mma_16<T16>(o[n], pa, vb[0], vb[1]);
          mma_16<T16>(o[n + 1], pa, vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // the buffer is refilled next step
  }

  // Epilogue: full row sums, normalization, V scale and mean, 16-bit stores, LSE.
  store_rows<D, FP8, T16, 8 * S::kQStride>(
      p, b, h, hk, row0, row1, qs0, qs1, t, m0, m1, l0, l1,
      [&](int n, int i) { return o[n][i]; }, true,
      [&] { return reinterpret_cast<const int8_t*>(sQ + (warp * 16 + g) * S::kQStride); },
      [](int d) { return d; });
}

template <int D, bool FP8, typename T16>
void launch_attention(const AttnParams& p, int B, Context& ctx) {
  const char* op = "attention_int8";
  auto kernel = attention_kernel<D, FP8, T16>;
  const int bytes = Smem<D, FP8>::kBytes;
  if (D > 128) {  // D = 256: 145 KB (fp8 P·V, the widened V tile included) / 135 KB (16-bit)
    const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, op);
    if (bytes > optin)
      throw Error(op, "q (head dim)",
                  "head dim " + std::to_string(D) + " with " + (FP8 ? "fp8" : "16-bit") +
                      " P·V: the mma.sync kernel needs " + std::to_string(bytes) +
                      " bytes of shared memory per block, this GPU allows " +
                      std::to_string(optin));
  }
  set_kernel_smem(kernel, bytes, op, "shared memory");
  dim3 grid(ceil_div(p.Nq, kRowsPerCta), p.Hq, B);
  kernel<<<grid, kThreads, bytes, stream_of(ctx)>>>(p);
  check_launch(op);
}

// ---- V to fp8 ----------------------------------------------------------------------------------

// V quantization is memory-bound: each pass below reads V once with 16-byte loads (8 channels of
// one token per thread), every load of a thread issued before its arithmetic.
//
// The mean pass (v_sum_kernel, 256 threads): channel group cg = (tid / 16) % (D / 8) (channels
// 8 cg .. 8 cg + 7), token tid % 16 + 16 (tid / (2 D)), so the 16 lanes of a half-warp share
// channels (shuffle reductions) and a block covers kKeysPerPass = 2048 / D tokens per pass. D =
// 256 (32 channel groups): 8 lanes share channels (VLanes<D>), token tid % 8, 8 tokens per pass.
template <int D>
struct VLanes {
  static constexpr int kGroups = D / 8;
  static constexpr int kLanes = 256 / kGroups < 16 ? 256 / kGroups : 16;  // lanes per group
  static constexpr int kKeysPerPass = 256 / kGroups;
  __device__ static int group(int tid) { return (tid / kLanes) % kGroups; }
  __device__ static int key(int tid) { return tid % kLanes + kLanes * (tid / (kLanes * kGroups)); }
};
// Eight 16-bit elements at p as one 16-byte word (one load when vec, else eight).
template <typename T>
__device__ __forceinline__ uint4 load_raw8(const T* p, bool vec) {
  if (vec) return *reinterpret_cast<const uint4*>(p);
  uint4 u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = p[i];
  return u;
}
template <typename T>
__device__ __forceinline__ float elem8(const uint4& u, int i) {
  return to_f32(reinterpret_cast<const T*>(&u)[i]);
}
template <typename T>
__device__ __forceinline__ void load8(const T* p, bool vec, float (&x)[8]) {
  const uint4 u = load_raw8(p, vec);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = elem8<T>(u, i);
}

constexpr int kVChunk = 512;  // tokens per CTA of the mean pass

// Item b of V for the passes below: the offset of its first row, and its key count in N (a padded
// varlen batch read in place: item b's keys start at packed row rows[b] and number lens[b]; else
// b x the batch stride, N keys).
__device__ __forceinline__ int64_t v_item(int b, int64_t sb, int64_t sn, const int32_t* rows,
                                          const int32_t* lens, int& N) {
  if (lens) N = __ldg(lens + b);
  return rows ? static_cast<int64_t>(__ldg(rows + b)) * sn : b * sb;
}

// One chunk of kVChunk tokens of one (batch, head) (grid x = B*H, y = chunk): per-channel partial
// sums written to partial[(chunk * B*H + bh) * D + d] (fixed order: each thread in token order,
// then the half-warp tree, then the token groups in order: deterministic).
template <typename T, int D>
__global__ void __launch_bounds__(256)
    v_sum_kernel(const T* v, int64_t sb, int64_t sn, int64_t sh, int N, int H, bool vec,
                 float* partial, const int32_t* rows, const int32_t* lens) {
  constexpr int kGroups = D / 8, kKeysPerPass = 256 / kGroups, kLanes = VLanes<D>::kLanes;
  __shared__ float red[256 / kLanes][8];
  const int bh = blockIdx.x, b = bh / H, h = bh % H, chunk = blockIdx.y, tid = threadIdx.x;
  const int cg = VLanes<D>::group(tid), kl = VLanes<D>::key(tid);
  // (a varlen item's chunks past its keys add zeros: the sum's bits of the item's own call)
  const T* base = v + v_item(b, sb, sn, rows, lens, N) + h * sh + cg * 8;
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  const int n0 = chunk * kVChunk, n1 = min(N, n0 + kVChunk);
#pragma unroll 4
  for (int n = n0 + kl; n < n1; n += kKeysPerPass) {
    float x[8];
    load8(base + n * sn, vec, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += x[i];
  }
#pragma unroll
  for (int off = 1; off < kLanes; off *= 2)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
  if (tid % kLanes == 0)
#pragma unroll
    for (int i = 0; i < 8; ++i) red[tid / kLanes][i] = acc[i];
  __syncthreads();
  if (tid < D) {
    const int c = tid / 8, i = tid % 8;
    float r = 0.f;
    for (int kg = 0; kg < kKeysPerPass / kLanes; ++kg) r += red[kg * kGroups + c][i];
    partial[(static_cast<int64_t>(chunk) * gridDim.x + bh) * D + tid] = r;
  }
}

// mean[i] = (sum of the chunks' partial sums, in chunk order) / N, i over B*H*D (lens: item b =
// i / hd has N = lens[b]).
__global__ void v_mean_finish(const float* partial, int chunks, int64_t n, int N, float* mean,
                              const int32_t* lens, int64_t hd) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (lens) N = __ldg(lens + i / hd);
  float total = 0.f;
  for (int c = 0; c < chunks; ++c) total += partial[c * n + i];
  mean[i] = N > 0 ? total / static_cast<float>(N) : 0.f;
}

// Tokens per CTA of the scale pass: 8 rows of 256 / (D / 8) tokens (8 loads per thread in flight).
template <int D>
constexpr int v_amax_tokens() {
  return 8 * (256 / (D / 8));
}

// The scale pass (grid x = B*H, y = chunk of v_amax_tokens<D>() tokens; 256 threads: channel
// group cg = tid % (D / 8), token rows tid / (D / 8) + i 256 / (D / 8), so a warp reads whole
// tokens): the chunk's per-channel max |v - mean| (mean may be null; tokens past N count 0, NaN is
// ignored as std::max and fmaxf do), divided by 448 and merged into scale_bits (zeroed before) by
// atomicMax on the non-negative fp32 bits. RN(a / 448) is nondecreasing in a, so the maximum of
// the chunks' RN(a_c / 448) is RN(max a / 448): the CPU's scale, in any order.
template <typename T, int D>
__global__ void __launch_bounds__(256)
    v_amax_kernel(const T* v, int64_t sb, int64_t sn, int64_t sh, int N, int H, bool vec,
                  const float* mean, unsigned* scale_bits, const int32_t* rows,
                  const int32_t* lens) {
  constexpr int kGroups = D / 8, kRows = 256 / kGroups, kPasses = 8;
  static_assert(v_amax_tokens<D>() == kPasses * kRows, "scale pass chunk");
  __shared__ float red[8][D];
  const int bh = blockIdx.x, b = bh / H, h = bh % H, tid = threadIdx.x;
  const int cg = tid % kGroups, lane = tid % 32, warp = tid / 32;
  const int n0 = static_cast<int>(blockIdx.y) * v_amax_tokens<D>() + tid / kGroups;
  const T* base = v + v_item(b, sb, sn, rows, lens, N) + h * sh + cg * 8;
  uint4 u[kPasses];
#pragma unroll
  for (int ps = 0; ps < kPasses; ++ps) {
    const int n = n0 + ps * kRows;
    u[ps] = n < N ? load_raw8(base + static_cast<int64_t>(n) * sn, vec) : make_uint4(0, 0, 0, 0);
  }
  float mu[8], acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mu[i] = mean ? mean[static_cast<int64_t>(bh) * D + cg * 8 + i] : 0.f;
    acc[i] = 0.f;
  }
#pragma unroll
  for (int ps = 0; ps < kPasses; ++ps) {
    const bool in = n0 + ps * kRows < N;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      acc[i] = fmaxf(acc[i], in ? fabsf(elem8<T>(u[ps], i) - mu[i]) : 0.f);
  }
#pragma unroll
  for (int off = kGroups; off < 32; off *= 2)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaxf(acc[i], __shfl_xor_sync(0xffffffffu, acc[i], off));
  if (lane < kGroups)
#pragma unroll
    for (int i = 0; i < 8; ++i) red[warp][cg * 8 + i] = acc[i];
  __syncthreads();
  if (tid < D) {
    float m = red[0][tid];
#pragma unroll
    for (int w = 1; w < 8; ++w) m = fmaxf(m, red[w][tid]);
    atomicMax(scale_bits + static_cast<int64_t>(bh) * D + tid, __float_as_uint(m / 448.f));
  }
}

// Position of key r (0..63) of a 64-key tile in quantize_v_fp8's layout: within each 32-key
// group, key 16 (r/16) + 8 (i/2) + 2 t + i%2 sits at 16 (r/16) + 4 t + i.
__device__ __forceinline__ int v_key_pos(int key) {
  const int r = key % 32, w = r % 16;
  return key - r + 16 * (r / 16) + 4 * ((w % 8) / 2) + (w / 8) * 2 + (w % 2);
}

// The codes pass: one CTA per 64 keys of one (batch, head), 2 D threads. Thread (channel group
// cg = tid / 16, quad kq = tid % 16) quantizes channels 8 cg .. 8 cg + 7 of the four keys that
// fill output bytes 4 kq .. 4 kq + 3 of the tile (keys 32 (kq / 8) + 16 ((kq / 4) % 2) +
// 2 (kq % 4) + {0, 1, 8, 9}: the layout's positions 16 h + 4 t + i), so a channel's four codes
// are one 32-bit word and the 16 quads of a channel group store its 64 bytes coalesced: no
// shared-memory transpose. code = e4m3(RN((x - mean) / scale)) as the CPU: the reciprocal and two
// corrections (div_rn, bit-equal to IEEE division for these scales; a zero quotient's sign
// restored) when all eight scales allow it, else IEEE division; the hardware conversion rounds
// as dt::f32_to_e4m3, NaN -> 0x7f whatever its sign; code 0 for padding keys and zero scales.
// (Session 20: the previous 256-thread kernel with byte transposes through shared memory and a
// per-element division branch took 30.7 us at (1, 4608, 24, 128), 21 % of DRAM bandwidth.)
// The codes of one quad thread (channel group cg, quad kq of a 64-key tile; keys 8 (i / 2) + i % 2
// past its key0, i < 4, in u[i], kmask 0xff in the bytes of keys < N): channels 8 cg .. 8 cg + 7
// with their scales sc[] and means mu[] (null: 0) into o + j npad as one 32-bit word each.
template <typename T>
__device__ __forceinline__ void v_quad_codes(const uint4 (&u)[4], uint32_t kmask, const float* sc_p,
                                             const float* mu_p, uint8_t* o, int64_t npad) {
  float sc[8], mu[8], rc[8];
  bool fast = true;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sc[j] = sc_p[j];
    mu[j] = mu_p ? mu_p[j] : 0.f;
    rc[j] = __frcp_rn(sc[j]);
    fast = fast && div_rn_applies(sc[j]);
  }
  auto codes = [&](auto fast_c) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float z[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float xi = elem8<T>(u[i], j) - mu[j];
        if constexpr (decltype(fast_c)::value)
          z[i] = copysignf(div_rn(xi, sc[j], rc[j]), xi);
        else
          z[i] = __fdiv_rn(xi, sc[j]);
      }
      uint32_t w = e4m3x2(z[0], z[1]) | (e4m3x2(z[2], z[3]) << 16);
      // NaN codes (0x7f / 0xff: satfinite gives no other code whose 7 low bits are all set) lose
      // their sign bit: the byte's low 7 bits + 1 carry into bit 7 exactly for them.
      w &= ~(((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u);
      *reinterpret_cast<uint32_t*>(o + j * npad) = sc[j] > 0.f ? w & kmask : 0u;
    }
  };
  if (fast)
    codes(std::true_type{});
  else
    codes(std::false_type{});
}

// Quad kq's four keys of the 64-key tile `tile` (keys key0 + 8 (i / 2) + i % 2, key0 = 64 tile +
// 32 (kq / 8) + 16 ((kq / 4) % 2) + 2 (kq % 4)): u[i] = fetch(key) for keys < N, else 0, and kmask
// 0xff in the bytes of keys < N.
template <typename Fetch>
__device__ __forceinline__ void v_quad_keys(int tile, int kq, int N, Fetch&& fetch, uint4 (&u)[4],
                                            uint32_t& kmask) {
  const int key0 = tile * kKvTile + 32 * (kq / 8) + 16 * ((kq / 4) % 2) + 2 * (kq % 4);
  kmask = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int n = key0 + 8 * (i / 2) + i % 2;
    const bool in = n < N;
    u[i] = in ? fetch(n) : make_uint4(0, 0, 0, 0);
    kmask |= in ? 0xffu << (8 * i) : 0u;
  }
}

// The codes pass: one CTA per 64 keys of one (batch, head), 2 D threads. Thread (channel group
// cg = tid / 16, quad kq = tid % 16) quantizes channels 8 cg .. 8 cg + 7 of the four keys that
// fill output bytes 4 kq .. 4 kq + 3 of the tile (keys 32 (kq / 8) + 16 ((kq / 4) % 2) +
// 2 (kq % 4) + {0, 1, 8, 9}: the layout's positions 16 h + 4 t + i), so a channel's four codes
// are one 32-bit word and the 16 quads of a channel group store its 64 bytes coalesced: no
// shared-memory transpose. code = e4m3(RN((x - mean) / scale)) as the CPU: the reciprocal and two
// corrections (div_rn, bit-equal to IEEE division for these scales; a zero quotient's sign
// restored) when all eight scales allow it, else IEEE division; the hardware conversion rounds
// as dt::f32_to_e4m3, NaN -> 0x7f whatever its sign; code 0 for padding keys and zero scales.
// (Session 20: the previous 256-thread kernel with byte transposes through shared memory and a
// per-element division branch took 30.7 us at (1, 4608, 24, 128), 21 % of DRAM bandwidth.)
template <typename T, int D>
__global__ void __launch_bounds__(2 * D)
    v_quant_quad_kernel(const T* v, int64_t sb, int64_t sn, int64_t sh, int N, int H, int64_t npad,
                        bool vec, const float* scale, const float* mean, uint8_t* out,
                        const int32_t* rows, const int32_t* lens) {
  const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int kq = tid % 16, cg = tid / 16;
  const int64_t bh = static_cast<int64_t>(b) * H + h;
  const T* base = v + v_item(b, sb, sn, rows, lens, N) + h * sh + cg * 8;
  uint4 u[4];
  uint32_t kmask;
  v_quad_keys(
      tile, kq, N, [&](int n) { return load_raw8(base + static_cast<int64_t>(n) * sn, vec); }, u,
      kmask);
  v_quad_codes<T>(u, kmask, scale + bh * D + cg * 8, mean ? mean + bh * D + cg * 8 : nullptr,
                  out + (bh * D + cg * 8) * npad + static_cast<int64_t>(tile) * kKvTile + 4 * kq,
                  npad);
}

// Session 52: V of short rows in ONE kernel (no V mean): a CTA per (batch, head) streams the
// head's keys into shared memory once (rows padded by 16 bytes: the codes' reads below meet the
// minimum of 4 wavefronts a warp), each thread keeping the maximum |v| of its channels
// (fmaxf: NaN ignored, as the scale pass), then thread c < D merges the slots' maxima (any order:
// max is exact) into scale RN(max / 448) (the scale pass's bits), and the CTA makes the codes of
// its 64-key tiles from the rows it holds, quad by quad as v_quant_quad_kernel (the same bits).
// Replaces the memset, the scale pass and the codes pass (x read once from DRAM, one launch).
constexpr int kVShortThreads = 256;
template <typename T, int D>
__global__ void __launch_bounds__(kVShortThreads)
    v_short_kernel(const T* v, int64_t sb, int64_t sn, int64_t sh, int N, int H, int64_t npad,
                   float* scale, uint8_t* out, const int32_t* rows, const int32_t* lens) {
  constexpr int LANES = D / 8, SLOTS = kVShortThreads / LANES, RS = LANES + 1, U = 8;
  extern __shared__ uint4 vrows[];  // key r, channels 8 l ..: vrows[r * RS + l]
  __shared__ float red[SLOTS][D];
  __shared__ float sc_sh[D];
  const int tid = threadIdx.x, lane = tid % LANES, slot = tid / LANES;
  const int64_t bh = blockIdx.x;
  const int b = static_cast<int>(bh / H), h = static_cast<int>(bh % H);
  const T* base = v + v_item(b, sb, sn, rows, lens, N) + h * sh + lane * 8;
  float m[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) m[j] = 0.f;
  for (int r0 = slot; r0 < N; r0 += U * SLOTS) {
    uint4 u[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int r = r0 + i * SLOTS;
      u[i] = r < N ? load_raw8(base + static_cast<int64_t>(r) * sn, true) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int r = r0 + i * SLOTS;
      if (r < N) {
        vrows[r * RS + lane] = u[i];
#pragma unroll
        for (int j = 0; j < 8; ++j) m[j] = fmaxf(m[j], fabsf(elem8<T>(u[i], j)));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) red[slot][lane * 8 + j] = m[j];
  __syncthreads();
  if (tid < D) {
    float mm = red[0][tid];
    for (int s = 1; s < SLOTS; ++s) mm = fmaxf(mm, red[s][tid]);
    const float sc = mm / 448.f;
    sc_sh[tid] = sc;
    scale[bh * D + tid] = sc;
  }
  __syncthreads();
  constexpr int TPT = 2 * D, PER = kVShortThreads / TPT;  // threads per tile, tiles per pass
  const int t2 = tid % TPT, kq = t2 % 16, cg = t2 / 16;
  const int tiles = static_cast<int>(npad / kKvTile);
  for (int tile = tid / TPT; tile < tiles; tile += PER) {
    uint4 u[4];
    uint32_t kmask;
    v_quad_keys(
        tile, kq, N, [&](int n) { return vrows[n * RS + cg]; }, u, kmask);
    v_quad_codes<T>(u, kmask, sc_sh + cg * 8, nullptr,
                    out + (bh * D + cg * 8) * npad + static_cast<int64_t>(tile) * kKvTile + 4 * kq,
                    npad);
  }
}

// The codes pass where v_fp8 is not 4-byte aligned: one block per 64 keys of one (batch, head),
// codes transposed to (D, npad) through shared memory, keys in fragment order within each
// 32-key group.
template <typename T, int D>
__global__ void v_quant_kernel(const T* v, int64_t sb, int64_t sn, int64_t sh, int N, int H,
                               int64_t npad, const float* scale, const float* mean, uint8_t* out,
                               const int32_t* rows, const int32_t* lens) {
  __shared__ uint8_t codes[D][kKvTile + 4];
  const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(b) * H + h;
  const int64_t row0 = v_item(b, sb, sn, rows, lens, N);
  for (int i = threadIdx.x; i < kKvTile * D; i += blockDim.x) {
    const int key = i / D, d = i % D;
    const int64_t n = static_cast<int64_t>(tile) * kKvTile + key;
    uint8_t c = 0;
    if (n < N) {
      const float s = scale[bh * D + d];
      const float x = to_f32(v[row0 + n * sn + h * sh + d]) - (mean ? mean[bh * D + d] : 0.f);
      c = s > 0.f ? dt::f32_to_e4m3(__fdiv_rn(x, s)) : 0;
    }
    codes[d][v_key_pos(key)] = c;
  }
  __syncthreads();
  uint8_t* o = out + bh * D * npad + static_cast<int64_t>(tile) * kKvTile;
  for (int i = threadIdx.x; i < kKvTile * D; i += blockDim.x) {
    const int d = i / kKvTile, pos = i % kKvTile;
    o[d * npad + pos] = codes[d][pos];
  }
}

template <typename F>
void with_16bit(DType dt, F&& f) {
  if (dt == DType::bf16)
    f(__nv_bfloat16{});
  else
    f(__half{});
}

// auto at D = 256: the head-dim-256 wgmma kernel (true) or the mma.sync kernel (false; kernel =
// wgmma runs the wgmma kernel and kernel = mma_sync the mma.sync kernel either way). True since
// H200 run 32 (2026-12-01), against the mma.sync kernel of the same P·V mode: (1, 24, 4096, 256)
// 16-bit P·V 0.6042 vs 1.5618 ms (2.58x), fp8 P·V 0.5739 vs 1.6163 ms (2.82x); (1, 24, 16384,
// 256) 9.1605 vs 23.9567 ms (2.62x), 8.0072 vs 24.0347 ms (3.00x); causal 2.46-2.94x (vs 16-bit
// mma.sync); every `.d256` case passed.
constexpr bool kAuto256Wgmma = true;

// auto's 16-bit P·V kernel at D = 64 / 128: the head-dim-256 kernel's structure at that head dim
// (launch_attention_wgmma_pv16: TMA producer warp, ring of 64-key stages, three consumer
// warpgroups (four at D = 64 since session 14), each stage's P·V in flight under the next
// softmax; true) or round 1 (false; still `kernel = wgmma`). Session 13: 677.6 vs 323.5 TOPS at
// (1, 40, 32760, 128) in H200 run 42; session 14, D = 64: 423.8 vs 190 (round 1) in run 48.
constexpr bool kAutoPv16Ring = true;

// auto's fp8 P·V kernel at D = 128 (round 3 + I2FP without turns): its output rows through each
// consumer's Q rows in shared memory (two halves of D / 2 channels) as 16-byte row stores (true;
// kVar bit 9, where the output rows are 16-byte aligned) or by 4-byte stores from the accumulator
// registers (false). Tuning `epilogue` 1 / 2 forces either. H200, session 26 (per-CTA stamps,
// `attention.waves`): the epilogue 2.6-2.9 -> 1.07-1.3 us per CTA (a 32 KB region of its own:
// 1.3-1.5); kernel ms direct / staged: Flux (1, 24, 4608, 128) 0.3961 / 0.3878, causal 0.2223 /
// 0.2124; the issue's long shapes within the calls' noise (+-0.5 %). The same bits.
constexpr bool kAttnStagedEpilogue = true;
// auto's fp8 P·V kernel at D = 128 on one consumer warpgroup per CTA and two CTAs per
// multiprocessor (round3_i2fp_no_turn_c1, session 54) where the keys are at most this many (0:
// never). The same bits. H100, session 54 (`attention.short`, kernel ms, two consumers -> one):
// (64, 24, 256, 256) 0.1887 -> 0.1616 (1.17x), (1, 24, 8192, 256) 0.0906 -> 0.0792, Wan's
// cross-attention (1, 40, 32760, 512) 0.7529 -> 0.6877 (1.09x), (16, 24, 1024, 1024) 0.3693 ->
// 0.3555, 8192 x 1024 0.1900 -> 0.1799, 8192 x 2048 0.3199 -> 0.3179; past it the doubled K / V
// reads (each tile feeds 64 rows, not 128) lose: 8192 x 4096 0.5759 -> 0.5946, Flux (1, 24,
// 4608, 4608) 0.3769 -> 0.3912 (0.96x).
// (Session 56: a persistent form with each (batch, kv head)'s key tiles resident in shared memory
// and two consumers on their own query blocks ran 0.83-0.90x of this one at 256-512 keys:
// docs/attention.md "Session 56", branch s56-res.)
constexpr int64_t kC1MaxKeys = 2048;
// The same form at D = 64 (round 3's three-consumer kernel otherwise) and for 16-bit P·V at
// D = 128 (the TMA-ring kernel's one-consumer instance, attention_wgmma256.cu): where the keys
// are at most this many (0: never). The same bits.
// H100, session 54 (`attention.short`, kernel ms): fp8 P·V at D = 64, three consumers -> one:
// (64, 24, 256, 256) 0.1874 -> 0.1521 (1.23x), (2, 24, 1024, 1024) 0.0564 -> 0.0483 (1.17x),
// (1, 24, 4096, 4096) 0.2207 -> 0.2751 (0.80x); 16-bit P·V at D = 128, three consumers (192-row
// CTAs) -> one: (64, 24, 256, 256) 0.2389 -> 0.1871 (1.28x: 256 rows no longer fill two 192-row
// blocks), (1, 24, 8192, 256) 0.1110 -> 0.1083, (1, 40, 32760, 512) 0.8809 -> 0.8702, (2, 24,
// 1024, 1024) 0.0773 -> 0.0651 (fewer waves), but (16, 24, 1024, 1024) 0.4540 -> 0.4514 against
// the default's 0.4411 and (1, 24, 8192, 1024) 0.2232 -> 0.2385, longer ones 0.85-0.9x.
constexpr int64_t kC1MaxKeysD64 = 1024;
constexpr int64_t kRingC1MaxKeys = 512;
// The fp8 P·V one-consumer kernel's key bound at head dim D (attention_int8's auto choice, which
// attention()'s q-in-kernel form follows).
constexpr int64_t c1_max_keys(int64_t D) { return D == 64 ? kC1MaxKeysD64 : kC1MaxKeys; }
// One consumer warpgroup per CTA, two CTAs per multiprocessor (tuning cons1; by default where
// every item has at most max_keys keys, 0: never): attention_int8's auto choice and the one
// attention()'s q-in-kernel form follows.
bool c1_by_keys(const detail::AttentionCudaTuning& tune, int64_t nkv, int64_t max_keys) {
  return tune.cons1 == 1 || (tune.cons1 == 0 && max_keys > 0 && nkv <= max_keys);
}
// The 16-bit P·V ring kernel's consumers (launch_attention_wgmma_pv16's cons; tuning ring_cons):
// one at D = 128 up to kRingC1MaxKeys keys, else the kernel's default.
int ring_cons_of(const detail::AttentionCudaTuning& tune, int64_t nkv, int64_t D) {
  if (tune.ring_cons != 0) return tune.ring_cons;
  return D == 128 && c1_by_keys(tune, nkv, kRingC1MaxKeys) ? 1 : 0;
}

}  // namespace

namespace {

// The kernels' parameters of attention_int8 (attention_int8_q16: q's codes and scales unread).
AttnParams attn_params(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                       const TensorView* v_scale, const TensorView* v_mean,
                       const TensorView* k_mean, const TensorView& out, const TensorView* lse_out,
                       float sm_scale, const AttentionOptions& options,
                       const detail::VarlenItems* items) {
  const bool fp8 = options.pv == AttentionOptions::fp8;
  AttnParams p{};
  p.q = q.data.ptr<const int8_t>();
  p.q_sb = q.data.stride[0];
  p.q_sn = q.data.stride[1];
  p.q_sh = q.data.stride[2];
  p.q_scale = q.scale.ptr<const float>();
  p.qs_sb = q.scale.stride[0];
  p.qs_sh = q.scale.stride[1];
  p.qs_ss = q.scale.stride[2];
  p.q_layout = static_cast<int>(q.layout);
  p.q_block = q.block;
  p.k = k.data.ptr<const int8_t>();
  p.k_sb = k.data.stride[0];
  p.k_sn = k.data.stride[1];
  p.k_sh = k.data.stride[2];
  p.k_scale = k.scale.ptr<const float>();
  p.ks_sb = k.scale.stride[0];
  p.ks_sh = k.scale.stride[1];
  p.ks_ss = k.scale.stride[2];
  p.k_layout = static_cast<int>(k.layout);
  p.k_block = k.block;
  p.v = v.data;
  if (fp8) {
    p.npad = v.shape[3];
  } else {
    p.v_sb = v.stride[0];
    p.v_sn = v.stride[1];
    p.v_sh = v.stride[2];
  }
  p.v_scale = v_scale ? v_scale->ptr<const float>() : nullptr;
  p.v_mean = v_mean ? v_mean->ptr<const float>() : nullptr;
  p.k_mean = k_mean ? k_mean->ptr<const float>() : nullptr;
  p.out = out.data;
  p.o_sb = out.stride[0];
  p.o_sn = out.stride[1];
  p.o_sh = out.stride[2];
  p.lse = lse_out ? lse_out->ptr<float>() : nullptr;
  if (lse_out) {
    p.l_sb = lse_out->stride[0];
    p.l_sh = lse_out->stride[1];
    p.l_sn = lse_out->stride[2];
  }
  p.Nq = static_cast<int>(q.data.shape[1]);
  p.Nkv = static_cast<int>(k.data.shape[1]);
  p.Hq = static_cast<int>(q.data.shape[2]);
  p.Hkv = static_cast<int>(k.data.shape[2]);
  p.G = p.Hq / p.Hkv;
  p.causal = options.causal != AttentionOptions::none;
  p.shift = options.causal == AttentionOptions::bottom_right ? int64_t{p.Nkv} - p.Nq : 0;
  if (items) {
    p.kv_lens = items->kv_lens, p.q_lens = items->q_lens, p.q_rows = items->q_rows;
    p.shift_per_item = options.causal == AttentionOptions::bottom_right;
  }
  p.sm_scale = sm_scale;
  p.scale_log2 = sm_scale * kLog2e;
  const int D = static_cast<int>(q.data.shape[3]);
  const detail::AttentionCudaTuning tune = detail::attention_cuda_tuning();
  {
    // Causal CTAs start longest-first across groups of heads whose K / V (int8 K, fp8 or 16-bit
    // V: per q head Nkv D (2 or 3) / G bytes) fit in ~30 MB of the L2 together (attn::cta_work).
    // H200, session 25: (1, 24, 4096, 64) and Flux's (1, 24, 4608, 128) are one group.
    const double kv_per_head =
        static_cast<double>(p.Nkv) * D * (v_scale ? 2.0 : 3.0) / static_cast<double>(p.G);
    const int by_l2 = static_cast<int>(std::min<double>(p.Hq, std::floor(30e6 / kv_per_head)));
    p.causal_heads = std::max(1, tune.causal_heads > 0 ? std::min(tune.causal_heads, p.Hq) : by_l2);
  }
  p.trace = tune.trace;
  p.staged_epilogue = tune.epilogue == 0 ? kAttnStagedEpilogue : tune.epilogue == 2;
  p.lane0_release = tune.lane0_release;
  p.heads_inner = tune.heads_inner;
  static_assert(attn::kAttnTraceWords == detail::kAttentionTraceWords, "trace layout");
  return p;
}

}  // namespace

void attention_int8(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                    const TensorView* v_scale, const TensorView* v_mean, const TensorView* k_mean,
                    TensorView out, TensorView* lse_out, float sm_scale,
                    const AttentionOptions& options, Context& ctx,
                    const detail::VarlenItems* items) {
  const bool fp8 = options.pv == AttentionOptions::fp8;
  if (fp8) {
    const std::string missing = fp8_mma_missing();
    if (!missing.empty())
      throw Error("attention_int8", "options.pv",
                  "fp8 PV: expected an sm_89+ GPU and device code for it "
                  "(CMAKE_CUDA_ARCHITECTURES), got " +
                      missing);
  }
  AttnParams p =
      attn_params(q, k, v, v_scale, v_mean, k_mean, out, lse_out, sm_scale, options, items);
  const int B = static_cast<int>(q.data.shape[0]);
  const int D = static_cast<int>(q.data.shape[3]);
  const detail::AttentionCudaTuning tune = detail::attention_cuda_tuning();
  // Kernel choice (AttentionOptions::kernel): wgmma runs round 1, wgmma_r3 round 3 (fp8 P·V; the
  // bench knobs of detail::AttentionCudaTuning pick its variants: no_turn round 3 + I2FP without
  // turns, cons3 (with no_turn) three consumer warpgroups at D = 64; 16-bit P·V runs the TMA-ring
  // kernel of attention_wgmma256.cu), at D = 256 both the head-dim-256 kernel; auto_kernel below.
  const bool wgmma_choice =
      options.kernel == AttentionOptions::wgmma || options.kernel == AttentionOptions::wgmma_r3;
  // One consumer warpgroup per CTA, two CTAs per multiprocessor (kC1MaxKeys / kC1MaxKeysD64
  // keys): the fp8 P·V kernel at D = 128 / 64, and (kRingC1MaxKeys) the 16-bit P·V ring kernel
  // at D = 128 (ring_cons 1).
  const bool one_consumer = c1_by_keys(tune, p.Nkv, c1_max_keys(D));
  const int ring_cons = ring_cons_of(tune, p.Nkv, D);
  if (wgmma_choice && D == 256) {
    // D = 256 (session 11): both wgmma choices run the head-dim-256 wgmma kernel
    // (attention_wgmma256.cu; fp8 and 16-bit P·V); tensors no TMA descriptor can address (e.g.
    // strides that are not multiples of 16 bytes) run the mma.sync kernel below.
    if (!attn::wgmma_attention_available())
      throw Error("attention_int8", "options.kernel",
                  "wgmma / wgmma_r3: expected an sm_90 GPU with the sm_90a build, got head dim "
                  "256 on a GPU without the sm_90a kernel");
    if (attn::launch_attention_wgmma256(p, B, fp8, out.dtype, stream_of(ctx))) return;
  } else if (wgmma_choice) {
    if (!attn::wgmma_attention_applies(D) || !attn::wgmma_attention_available())
      throw Error("attention_int8", "options.kernel",
                  "wgmma / wgmma_r3: expected head dim 64, 128 or 256 on an sm_90 GPU with the "
                  "sm_90a build, got head dim " +
                      std::to_string(D) +
                      (attn::wgmma_attention_applies(D) ? " on a GPU without the sm_90a kernel"
                                                        : ""));
    // 16-bit P·V with wgmma_r3: the TMA-ring kernel (session 13; round 1 where no TMA
    // descriptor addresses the tensors).
    if (!fp8 && options.kernel == AttentionOptions::wgmma_r3 &&
        attn::launch_attention_wgmma_pv16(p, B, D, out.dtype, stream_of(ctx), ring_cons))
      return;
    const attn::WgmmaKernel which =
        options.kernel == AttentionOptions::wgmma ? attn::WgmmaKernel::round1
        : tune.no_turn && tune.cons3              ? attn::WgmmaKernel::round3_i2fp_no_turn_c3
        : tune.no_turn && one_consumer            ? attn::WgmmaKernel::round3_i2fp_no_turn_c1
        : tune.no_turn                            ? attn::WgmmaKernel::round3_i2fp_no_turn
                                                  : attn::WgmmaKernel::round3;
    attn::launch_attention_wgmma(p, B, D, fp8, out.dtype, which, stream_of(ctx));
    return;
  }
  if (options.kernel == AttentionOptions::auto_kernel && attn::wgmma_attention_applies(D) &&
      attn::wgmma_attention_available()) {
    // fp8 P·V: round 3 with I2FP and without the consumers' ping-pong turns, bit-identical to
    // round 3 and the fastest such variant in H200 run 10 (2026-11-30 03:36): D = 128 789.5 /
    // 769.6 TOPS (causal 766.4 / 731.3) vs round 3 + I2FP's 754.1 / 731.1 (734.6 / 691.7) and
    // round 4 + I2FP's 738.7 / 704.8; D = 64 336.7 vs 315.0. Its instantiation covers bf16
    // output with k scales constant per 64-key half (per-block / THREAD_K blocks of 64·n);
    // launch_r3 runs plain round 3 (same bits) for the other cases.
    // D = 64: the same consumer on three warpgroups (192-row CTAs), same bits: H200 run 12
    // (2026-11-30 06:06) 0.2370 ms = 435 TOPS at (1, 24, 4096, 64) vs 0.3062 (1.29x), causal
    // 0.1730 vs 0.1986 ms (1.15x); every `.r3c3` case passed. (D = 128: its three-consumer path
    // is off, see kR3C3At128; the 240-register twin measured 1.00-1.01x, not taken.)
    // D = 64 since run 16 (2026-11-30 08:50): those three consumers fed by a TMA producer warp
    // (Q / K in 64-byte rows, 64-byte swizzle; consumers at 160 registers), same bits: 0.2339
    // vs 0.2376 ms (440.8 vs 433.8 TOPS), causal 0.1697 vs 0.1726 ms; every `.r3c3t` case
    // passed. (It runs for per-half k scales, bf16 output and since session 60 f16; the rest as
    // before.)
    // (Session 8's knobs sum_pv, the row sums on the tensor cores, and quick_max, the quick row
    // maxima: 0.99-1.00x and 0.98-0.99x in run 19, removed. Session 9's D = 128 knobs tile_step,
    // pv_split and poly_exp: 0.92-0.97x in runs 24 and 25, removed.)
    if (!fp8 && kAutoPv16Ring &&
        attn::launch_attention_wgmma_pv16(p, B, D, out.dtype, stream_of(ctx), ring_cons))
      return;
    const attn::WgmmaKernel which = !fp8           ? attn::WgmmaKernel::round1
                                    : one_consumer ? attn::WgmmaKernel::round3_i2fp_no_turn_c1
                                    : D == 64      ? attn::WgmmaKernel::round3_i2fp_no_turn_c3
                                                   : attn::WgmmaKernel::round3_i2fp_no_turn;
    attn::launch_attention_wgmma(p, B, D, fp8, out.dtype, which, stream_of(ctx));
    return;
  }
  // D = 256, fp8 and 16-bit P·V: the head-dim-256 wgmma kernel on an sm_90 GPU with the sm_90a
  // build (kAuto256Wgmma; H200 run 32 above), unless no TMA descriptor addresses the tensors.
  if (options.kernel == AttentionOptions::auto_kernel && D == 256 && kAuto256Wgmma &&
      attn::wgmma_attention_available() &&
      attn::launch_attention_wgmma256(p, B, fp8, out.dtype, stream_of(ctx)))
    return;
  // mma_sync (any D), auto elsewhere (other GPUs, no sm_90a build, tensors no TMA descriptor
  // addresses at D = 256) and the wgmma choices at D = 256 without a TMA descriptor land here.
  dispatch_int<64, 128, 256>(static_cast<int>(q.data.shape[3]), "attention_int8", "q (head dim)",
                        [&](auto Dc) {
                          constexpr int D = decltype(Dc)::value;
                          with_16bit(out.dtype, [&](auto t16) {
                            using T16 = decltype(t16);
                            if (fp8)
                              launch_attention<D, true, T16>(p, B, ctx);
                            else
                              launch_attention<D, false, T16>(p, B, ctx);
                          });
                        });
}

namespace {
// Whether attention()'s q-in-kernel form runs on the one-consumer kernel: the keys of auto's
// choice (c1_by_keys at D = 128 / 64), or any (fused_q 2: that kernel forced).
bool q16_one_consumer(const detail::AttentionCudaTuning& tune, int64_t nkv, int64_t D) {
  return tune.fused_q == 2 || c1_by_keys(tune, nkv, c1_max_keys(D));
}
}  // namespace

bool attention_q16_applies(const TensorView& q, const TensorView& k, const TensorView& out,
                           const AttentionOptions& options) {
  const detail::AttentionCudaTuning tune = detail::attention_cuda_tuning();
  if (tune.fused_q == 1) return false;
  // (Causal calls too since session 59: the prefetch follows the longest-first walk; H100,
  // (16, 32, 1024, 1024) causal 0.6810 -> 0.6473 ms. Session 61: longer keys too, on the
  // long-key kernels, but for fused_q 3 / 4 / 5.)
  const int64_t D = q.shape[3];
  // (16-bit P·V since session 61: auto's TMA-ring kernel quantizes q, under fused_q 0 and 6.)
  const bool fp8 = options.pv == AttentionOptions::fp8;
  const bool keys =
      fp8 ? q16_one_consumer(tune, k.shape[1], D) || tune.fused_q == 0 || tune.fused_q == 6
          : kAutoPv16Ring && (tune.fused_q == 0 || tune.fused_q == 6);
  const bool aligned = reinterpret_cast<uintptr_t>(q.data) % 16 == 0 && q.stride[0] % 8 == 0 &&
                       q.stride[1] % 8 == 0 && q.stride[2] % 8 == 0;
  // (f16 q and output too since session 60: the same kernels as bf16.)
  return keys && aligned && (q.dtype == DType::bf16 || q.dtype == DType::f16) &&
         out.dtype == q.dtype && options.kernel == AttentionOptions::auto_kernel &&
         (D == 128 || D == 64) && q.shape[1] <= INT32_MAX && attn::wgmma_attention_available() &&
         (!fp8 || fp8_mma_missing().empty());
}

bool attention_int8_q16(const TensorView& q, float q_sm_scale, float q_scale_eps,
                        const QuantizedRows& k, const TensorView& v, const TensorView* v_scale,
                        const TensorView* v_mean, const TensorView* k_mean, TensorView out,
                        TensorView* lse_out, const AttentionOptions& options, Context& ctx) {
  QuantizedRows qq;  // q's codes and scales: the kernel's own (SPEC §1 THREAD_Q, 32-row blocks)
  qq.data = q;
  qq.layout = ScaleLayout::thread_q;
  qq.block = 32;
  const float sm =
      options.sm_scale == 0.f ? 1.f / std::sqrt(static_cast<float>(q.shape[3])) : options.sm_scale;
  AttnParams p = attn_params(qq, k, v, v_scale, v_mean, k_mean, out, lse_out, sm, options, nullptr);
  p.q16 = q.data;
  p.q16_sb = q.stride[0];
  p.q16_sn = q.stride[1];
  p.q16_sh = q.stride[2];
  p.q16_sm_scale = q_sm_scale;
  p.q16_eps = q_scale_eps;
  const detail::AttentionCudaTuning tune = detail::attention_cuda_tuning();
  const int64_t D = q.shape[3], nkv = k.data.shape[1];
  const int B = static_cast<int>(q.shape[0]);
  if (options.pv != AttentionOptions::fp8) {
    // (session 61) 16-bit P·V: auto's TMA-ring kernel (attention_int8's consumers), the CTA one
    // wave ahead prefetched (one consumer: 2 CTAs per multiprocessor) but for fused_q 6.
    const int cons = ring_cons_of(tune, nkv, D);
    if (tune.fused_q != 6) p.q16_ahead = (cons == 1 ? 2 : 1) * multiprocessor_count();
    return attn::launch_attention_wgmma_pv16(p, B, static_cast<int>(D), out.dtype, stream_of(ctx),
                                             cons, true);
  }
  const bool one = q16_one_consumer(tune, nkv, D);
  // The heads fastest in the grid (non-causal, one consumer) but for fused_q 3; the q rows of the
  // CTA one wave ahead prefetched into L2 (one consumer: 2 CTAs per multiprocessor) but for
  // fused_q 3, 4 and (the long-key kernels) 6 (A/B only).
  const int form = tune.fused_q;
  p.heads_inner = form != 3;
  if (form != 3 && form != 4 && !(form == 6 && !one))
    p.q16_ahead = (one ? 2 : 1) * multiprocessor_count();
  return attn::launch_attention_wgmma_q16(p, B, static_cast<int>(D), q.dtype, one, stream_of(ctx));
}

void quantize_v_fp8(const TensorView& v, TensorView v_fp8, TensorView v_scale, TensorView* v_mean,
                    Context& ctx, const int32_t* rows, const int32_t* lens) {
  const char* op = "quantize_v_fp8";
  LOWBIT_CHECK(!(rows || lens) || (rows && lens), op, "rows",
               "internal: a padded varlen batch in place takes rows and lens");
  const int B = static_cast<int>(v.shape[0]), N = static_cast<int>(v.shape[1]);
  const int H = static_cast<int>(v.shape[2]), D = static_cast<int>(v.shape[3]);
  const int64_t npad = v_fp8.shape[3];
  const int64_t n = static_cast<int64_t>(B) * H * D;
  float* mean = v_mean ? v_mean->ptr<float>() : nullptr;
  const cudaStream_t stream = stream_of(ctx);
  // 16-byte loads need a 16-byte aligned base and strides that are multiples of 8 elements.
  const bool vec = reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && v.stride[0] % 8 == 0 &&
                   v.stride[1] % 8 == 0 && v.stride[2] % 8 == 0;
  const unsigned chunks = static_cast<unsigned>((N + kVChunk - 1) / kVChunk);
  // Short rows without a mean (session 52): v_short_kernel, where its rows fit shared memory and
  // there are enough heads to fill the GPU.
  const detail::AttentionCudaTuning tune = detail::attention_cuda_tuning();
  const int64_t min_ctas = knob_or_sms(tune.short_v_min_ctas);
  const size_t short_smem = static_cast<size_t>(N) * (D / 8 + 1) * 16;
  const bool short_v = !mean && vec && D <= 128 && N >= 1 && N <= tune.short_v_tokens &&
                       static_cast<int64_t>(B) * H >= min_ctas && short_smem <= 160 * 1024 &&
                       reinterpret_cast<uintptr_t>(v_fp8.data) % 4 == 0;
  with_16bit(v.dtype, [&](auto t16) {
    using T = decltype(t16);
    const T* vp = v.ptr<const T>();
    dispatch_int<64, 128, 256>(D, op, "v (head dim)", [&](auto Dc) {
      constexpr int Dv = decltype(Dc)::value;
      if constexpr (Dv <= 128) {
        if (short_v) {
          auto kernel = v_short_kernel<T, Dv>;
          // (always: the static arrays count toward the 48 KB a launch gets without it)
          set_kernel_smem(kernel, static_cast<int>(short_smem), op, "shared memory");
          kernel<<<static_cast<unsigned>(static_cast<int64_t>(B) * H), kVShortThreads, short_smem,
                   stream>>>(vp, v.stride[0], v.stride[1], v.stride[2], N, H, npad,
                             v_scale.ptr<float>(), v_fp8.ptr<uint8_t>(), rows, lens);
          check_launch(op);
          return;
        }
      }
      if (mean) {
        // Channel means, deterministic two-stage: per-chunk partial sums into v_fp8's memory
        // (chunks * B*H*D floats <= B*H*D*npad bytes: 4 * ceil(N / 512) <= round_up(N, 64);
        // overwritten by the codes below; the base rounded up to 4 bytes, which the margin
        // covers), then a fixed-order sum over the chunks.
        float* partial = reinterpret_cast<float*>(
            (reinterpret_cast<uintptr_t>(v_fp8.data) + 3) & ~uintptr_t{3});
        if (chunks > 0) {
          v_sum_kernel<T, Dv><<<dim3(B * H, chunks), 256, 0, stream>>>(
              vp, v.stride[0], v.stride[1], v.stride[2], N, H, vec, partial, rows, lens);
          check_launch(op);
        }
        v_mean_finish<<<ceil_div(n, 256), 256, 0, stream>>>(
            partial, static_cast<int>(chunks), n, N, mean, lens, static_cast<int64_t>(H) * D);
        check_launch(op);
      }
      // The scales: zero, then each chunk's RN(max |v - mean| / 448) merged by atomicMax.
      check_cuda(cudaMemsetAsync(v_scale.data, 0, static_cast<size_t>(n) * 4, stream), op,
                 "v_scale");
      const unsigned amax_chunks =
          static_cast<unsigned>((N + v_amax_tokens<Dv>() - 1) / v_amax_tokens<Dv>());
      if (amax_chunks > 0) {
        v_amax_kernel<T, Dv><<<dim3(B * H, amax_chunks), 256, 0, stream>>>(
            vp, v.stride[0], v.stride[1], v.stride[2], N, H, vec, mean, v_scale.ptr<unsigned>(),
            rows, lens);
        check_launch(op);
      }
      if (npad == 0) return;
      const dim3 grid(static_cast<unsigned>(npad / kKvTile), H, B);
      if (reinterpret_cast<uintptr_t>(v_fp8.data) % 4 == 0) {
        v_quant_quad_kernel<T, Dv><<<grid, 2 * Dv, 0, stream>>>(
            vp, v.stride[0], v.stride[1], v.stride[2], N, H, npad, vec, v_scale.ptr<const float>(),
            mean, v_fp8.ptr<uint8_t>(), rows, lens);
      } else {
        v_quant_kernel<T, Dv><<<grid, 256, 0, stream>>>(vp, v.stride[0], v.stride[1], v.stride[2],
                                                        N, H, npad, v_scale.ptr<const float>(),
                                                        mean, v_fp8.ptr<uint8_t>(), rows, lens);
      }
      check_launch(op);
    });
  });
}

}  // namespace cuda
}  // namespace lowbit
