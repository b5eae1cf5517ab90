// sm_90a INT8 attention (SPEC §2) at head dim 256 on warpgroup MMAs (wgmma): the design at the end
// of docs/attention.md, on round 3's structure (attention_wgmma.cu). Same arithmetic as the
// mma.sync kernel and the CPU oracle: int32 q k^T, fp32 logits, base-2 online softmax over the
// oracle's 64-key tiles, P and V in e4m3 with the two-level fp32 accumulation (fp8 P·V), or P in
// V's 16-bit type accumulated straight into O (16-bit P·V).
//
//  - One CTA = 128 query rows of one (batch, head): a producer warpgroup (one warp works: TMA and
//    the k scales, setmaxnreg 24) and two consumer warpgroups of 64 rows (setmaxnreg 240).
//  - A ring of 64-key stages on mbarriers (fp8 P·V 5 stages, 16-bit 4): K 64 x 256 B in two
//    128-channel boxes (128-byte rows, 128-byte swizzle), V fp8 as quantize_v_fp8 stores it
//    (channel rows of 64 permuted key bytes, one 256 x 64 box in the 64-byte swizzle) or V 16-bit
//    (four 64-channel boxes of 64 key rows, 128-byte swizzle, MN-major), and kc = k scale x
//    scale_log2 per key. Q (128 x 256 B, two 128-channel boxes) travels with stage 0.
//  - q k^T: wgmma m64n64k32 s32.s8.s8, 8 k-steps (the first writes without reading).
//    Accumulator register 4j + 2h + e of thread (warp i, lane 4g + t): row 16i + g + 8h, key
//    8j + 2t + e. Logits s = float(acc) (x kc per key unless kc is constant over the thread's
//    columns); exponent argument one FFMA s * q - (m - log2 448) as round 3.
//  - fp8 P·V: O is 64 x 256 fp32 (128 registers per thread); the two-level sum needs a fresh
//    accumulator per 64-key tile, so the channels go in 2 chunks of 128 (m64n128k32 e4m3, 2
//    k-steps each) into one 64-register accumulator, one chunk at a time (o = o r + c after
//    wgmma.wait_group); the next stage's q k^T is issued after the second chunk's fold, so that
//    no q k^T accumulator is live next to c (0 spills; H200 run 32, 2026-12-01: the fastest of
//    the six fp8 forms measured, see docs/attention.md).
//  - 16-bit P·V: O rescaled (skipped when no row of the warp raised its maximum), then the next
//    stage's q k^T issued and m64n64k16 x D / 64 channel chunks x 4 key steps straight into O;
//    the warpgroup waits for the q k^T only and leaves the P·V in flight under the next stage's
//    softmax (its P fragments in registers nothing writes until then), waiting for it just before
//    O is rescaled (session 13).
//  - Head dim 64 / 128, 16-bit P·V (session 13; auto's 16-bit kernel there on sm_90a): the same
//    kernel with D / 128 chunks (D = 64: int8 rows of 64 bytes in the 64-byte swizzle), up to 8
//    ring stages and three consumer warpgroups (192-row CTAs, 160 registers; D = 64 since
//    session 14: four, 256-row CTAs at 112 registers) (Shape256).
#include <cuda.h>  // CUtensorMap (the encoder comes from the runtime's driver entry point)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "src/cuda/attention_common.cuh"
#include "src/cuda/attention_q16.cuh"  // kQ16: q quantized in the kernel (session 61)
#include "src/cuda/common.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace attn {
namespace {

using ptx::mbar_arrive;
using ptx::mbar_arrive_expect_tx;
using ptx::mbar_fence_init;
using ptx::mbar_init;
using ptx::mbar_wait_bounded;
using ptx::smem_desc;
using ptx::smem_u32;
using ptx::tma_load_3d;
using ptx::tma_load_4d;
using ptx::wgmma_commit;
using ptx::wgmma_fence;
using ptx::wgmma_wait;

constexpr int kKeys = 64;       // keys per ring stage (the oracle's softmax tile)
constexpr int kProdRegs = 24;   // setmaxnreg of the producer warpgroup
// The form per head dim (session 13, H200 runs 39-40, 16-bit P·V, same bits in every form): at
// D 64 / 128 three consumer warpgroups (192 query rows per CTA, consumers at 160 registers:
// 128 x 24 + 384 x 160 <= 64 K) with each stage's P·V left in flight under the next stage's
// softmax (issued after the next q k^T, waited for just before O is rescaled): (1, 40, 32760,
// 128) 32.43 ms = 678 TOPS against two consumers with the P·V waited for 38.11 ms (577), three
// consumers alone 33.44, the late P·V alone 37.91; D = 64 (1, 24, 4096, 64) 0.2721 against
// 0.3380 ms. D = 256 (O is 128 registers): two consumer warpgroups (240 registers), 16-bit P·V
// with the late P·V too (H200 run 40: (1, 24, 4096 / 16384, 256) 748.0 / 769.2 TOPS against
// 677.5 / 727.0 with the P·V waited for, causal 592.1 / 754.6 against 536.9 / 701.6; same bits).
// (Also measured in run 40 and deleted: fp8 P·V at D = 128 on this kernel, three consumers with
// two fresh 64-channel chunks folded as they complete and the next q k^T after the folds: 725.2
// / 695.4 TOPS against round 3's 790.4 / 774.8, causal 703.0 / 654.0 against 766.6 / 740.5.)
// C: consumer warpgroups. Session 14 (H200 run 48, same bits): D = 64 on four (256-row CTAs,
// consumers at 112 registers) 0.2432 ms = 423.8 TOPS at (1, 24, 4096, 64) against three's 0.2860
// (360.4), causal 0.1856 against 0.2026: the default at D = 64 since (launch_attention_wgmma_pv16;
// the tuning knob ring_cons = 3 forces three). (At 120 registers the launch's 640 x 96 could not
// cover the consumers' setmaxnreg: the bench's first call hung.)
// C = 1 (session 54, 16-bit P·V at D = 128 on short items): one consumer warpgroup of 64 rows
// and two CTAs per multiprocessor (each with half of its shared memory), so that one CTA's
// pipeline fill and drain run beside the other's stages (attention_wgmma.cu's kVar bit 12).
constexpr int kSmemMax = 227 * 1024;
template <int D, int C = (D == 64 ? 4 : D < 256 ? 3 : 2)>
struct Shape256 {
  static constexpr int kCons = C;
  static constexpr int kRows = 64 * kCons;            // query rows per CTA
  static constexpr int kThreads = 128 * (kCons + 1);  // the producer warpgroup and the consumers
  static constexpr int kMinCtas = kCons == 1 ? 2 : 1;  // CTAs per multiprocessor (launch bounds)
  // 128 x 24 + (128 kCons) x kConsRegs <= the launch's registers (setmaxnreg moves registers
  // between the CTA's warps: 4 consumers launch at 96 per thread, 640 x 96 = 61440)
  static constexpr int kConsRegs = kCons == 4 ? 112 : kCons == 3 ? 160 : kCons == 2 ? 240 : 232;
  // 96 / 128 / 168 / 128 for 4 / 3 / 2 / 1
  static constexpr int kLaunchRegs = 65536 / (kThreads * kMinCtas) / 8 * 8;
  static_assert(128 * kProdRegs + 128 * kCons * kConsRegs <= kThreads * kLaunchRegs,
                "register split");
  // shared memory a CTA may take (228 KB a multiprocessor, 1 KB of it reserved per CTA)
  static constexpr int kSmemBudget = kMinCtas == 1 ? kSmemMax : 228 * 1024 / kMinCtas - 1024;
};

// Shared memory (bytes from a 1024-aligned base) at head dim D: Q (D / kRowB chunks of 128 rows
// x kRowB bytes), then per stage K (D / kRowB chunks of 64 rows x kRowB bytes) and V, kc per
// stage, the full / empty barriers. kRowB: bytes per int8 row of a chunk, 128 (128-byte swizzle)
// or, at D = 64, 64 (64-byte swizzle).
template <int D, bool FP8, int kRows = 128, int kBudget = kSmemMax>
struct Smem256 {
  static_assert(D == 256 || (!FP8 && (D == 64 || D == 128)), "head dim / P·V mode");
  static constexpr int kRowB = D < 128 ? D : 128;
  static constexpr int kChunks = D / kRowB;
  static constexpr int kQChunk = kRows * kRowB;  // 16 KB (8 KB at D = 64)
  static constexpr int kKChunk = kKeys * kRowB;  // 8 KB (4 KB)
  static constexpr int kKStage = kChunks * kKChunk;
  // fp8: D channel rows of 64 key bytes (64-byte swizzle); 16-bit: D / 64 chunks of 64 key rows
  // x 64 channels (128 B, 128-byte swizzle)
  static constexpr int kVChunk = kKeys * 128;  // 16-bit: one 64-channel chunk
  static constexpr int kVStage = FP8 ? D * kKeys : (D / 64) * kVChunk;
  static constexpr int kQ = 0;
  static constexpr int kK = kChunks * kQChunk;
  static constexpr int kPerStage = kKStage + kVStage + kKeys * 4 + 16;
  // D = 256: fp8 5 stages, 16-bit 4 (what fits); D = 64 / 128 (16-bit): as many as fit, at
  // most 8.
  static constexpr int kFit = (kBudget - kK - kRows - 1024) / kPerStage;
  static constexpr int kStages = D == 256 ? (FP8 ? 5 : 4) : (kFit < 8 ? kFit : 8);
  static constexpr int kV = kK + kStages * kKStage;
  static constexpr int kS = kV + kStages * kVStage;
  static constexpr int kBar = kS + kStages * kKeys * 4;
  static constexpr int kQs = kBar + 2 * kStages * 8;  // kQ16: q group scales, 16 per 64 rows
  static constexpr int kBytes = kQs + kRows + 1024;   // + alignment slack
  static constexpr uint32_t kStageTx = kKStage + kVStage;       // TMA bytes per stage
};
static_assert(Smem256<256, true>::kBytes <= kSmemMax && Smem256<256, false>::kBytes <= kSmemMax &&
                  Smem256<128, false>::kBytes <= kSmemMax &&
                  Smem256<64, false>::kBytes <= kSmemMax &&
                  Smem256<128, false, 192>::kBytes <= kSmemMax &&
                  Smem256<64, false, 256>::kBytes <= kSmemMax,
              "shared memory");

// The high word of ptx::wgmma_desc(addr, lead, stride, swizzle) (stride and swizzle; the low
// word holds the address and the leading byte offset).
constexpr uint64_t desc_hi(uint32_t stride, uint32_t swizzle) {
  return (static_cast<uint64_t>(stride >> 4) << 32) | (static_cast<uint64_t>(swizzle) << 62);
}

// d (64 x 64 s32) (+)= A (64 x 32 s8, shared, K-major) · B (64 x 32 s8, shared, K-major)^T.
// kFirst: d = A·B, d written only (the previous tile's registers are dead once converted).
template <bool kFirst>
__device__ __forceinline__ void wgmma_s8_n64(int32_t (&d)[32], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOWBIT_W256_D32(C)                                                                     \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]),    \
      C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]),          \
      C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]),          \
      C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31])
#define LOWBIT_W256_RW(x) "+r"(x)
#define LOWBIT_W256_W(x) "=r"(x)
  if constexpr (kFirst) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p;\n}\n"
        : LOWBIT_W256_D32(LOWBIT_W256_W)
        : "l"(desc_a), "l"(desc_b), "r"(0));
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, 1;\n"
        : LOWBIT_W256_D32(LOWBIT_W256_RW)
        : "l"(desc_a), "l"(desc_b));
  }
#undef LOWBIT_W256_W
#undef LOWBIT_W256_RW
#undef LOWBIT_W256_D32
#endif
}

// Channel chunk h (128 channels) of one 64-key tile's fp8 P·V into a fresh c (m64n128k32): 2
// k-steps of 32 keys; dv: the stage's V descriptor (256 channel rows of 64 bytes, 64-byte
// swizzle).
__device__ __forceinline__ void pv_chunk128(float (&c)[64], const uint32_t (&pa)[2][4],
                                            uint32_t dv, int h) {
  constexpr uint64_t kHi = desc_hi(512, 2);  // smem_desc_sw64
  wgmma_fence();
  const uint32_t d = dv + static_cast<uint32_t>(h * ((128 * kKeys) >> 4));
  wgmma_e4m3_n128_first(c, pa[0], kHi | d);
  wgmma_e4m3_n128(c, pa[1], kHi | (d + 2), 1);  // the second 32 keys: +32 bytes
  wgmma_commit();
}

// O chunk n (registers kN n .. kN n + kN - 1: channels 2 kN n .. of an m64n(2 kN) accumulator)
// = O r + C.
template <int n, int kN>
__device__ __forceinline__ void fold_chunk(float (&o)[2 * kN], const float (&c)[kN], float r0,
                                           float r1) {
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) {
    o[kN * n + 4 * i + 0] = o[kN * n + 4 * i + 0] * r0 + c[4 * i + 0];
    o[kN * n + 4 * i + 1] = o[kN * n + 4 * i + 1] * r0 + c[4 * i + 1];
    o[kN * n + 4 * i + 2] = o[kN * n + 4 * i + 2] * r1 + c[4 * i + 2];
    o[kN * n + 4 * i + 3] = o[kN * n + 4 * i + 3] * r1 + c[4 * i + 3];
  }
}

// The three (four) tensor maps of a launch.
struct Maps256 {
  CUtensorMap q, k, v;
  int q_rows_outer, k_rows_outer, v_rows_outer;  // map dims (D, H, N, B) rather than (D, N, H, B)
};

// kQ16 (session 61, 16-bit P·V at D 64 / 128): q quantized by each consumer warpgroup from 16-bit
// rows of the output's type (p.q16; quantize_q16_rows), not loaded as codes with stage 0; producer
// warp 1 prefetches the q rows of the CTA p.q16_ahead blocks later into L2.
template <int D, bool FP8, typename T16, bool kKcHalf, int kC, bool kQ16 = false>
__global__ void __launch_bounds__(Shape256<D, kC>::kThreads, Shape256<D, kC>::kMinCtas)
    attention_wgmma256_kernel(const AttnParams p, const __grid_constant__ Maps256 maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!kQ16 || (!FP8 && (D == 64 || D == 128)),
                "q in the kernel: 16-bit P·V, D 64 / 128");
  using S = Shape256<D, kC>;
  constexpr int kRows = S::kRows;
  using L = Smem256<D, FP8, kRows, S::kSmemBudget>;
  constexpr int kStages = L::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const sbase = smem_raw + (base - raw);  // generic pointer to `base`
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  const CtaTiles ct = cta_tiles<kRows, kKeys>(p);  // causal: long rows first
  const int h = ct.h, b = ct.b, hk = ct.hk, n_tiles = ct.n_tiles;
  const int64_t q0 = ct.q0;
  const uint32_t full0 = base + L::kBar, empty0 = full0 + kStages * 8;
  float* const skc = reinterpret_cast<float*>(sbase + L::kS);  // [kStages][kKeys] kc

  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbar_init(full0 + st * 8, 32);  // the producer warp's lanes (lane 0 with the tx bytes)
      // every consumer thread, once its wgmmas of the stage completed (each releases its own
      // reads of the stage, its kc among them; session 27: a lane-0 arrival after __syncwarp
      // is ordered through the warp barrier, which compute-sanitizer racecheck does not follow)
      mbar_init(empty0 + st * 8, 128 * S::kCons);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer: one warp; lane 0 issues the TMA boxes, each lane 2 kc
    setmaxnreg_dec<kProdRegs>();
    if constexpr (kQ16) {
      if (warp == 1) prefetch_q16_rows<D, kRows, false, T16>(p, lane);
    }
    if (warp != 0) return;
    const float* ksg = p.k_scale + b * p.ks_sb + hk * p.ks_sh;
    const ScaleIdx kidx(p.k_layout, p.k_block);
    for (int tile = 0; tile < n_tiles; ++tile) {
      const int st = tile % kStages;
      float ks[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int key = tile * kKeys + lane + 32 * i;
        ks[i] = key < ct.nkv ? ksg[static_cast<int64_t>(kidx(key)) * p.ks_ss] : 0.f;
      }
      if (tile >= kStages) mbar_wait_bounded(empty0 + st * 8, ((tile / kStages) - 1) & 1);
#pragma unroll
      for (int i = 0; i < 2; ++i) skc[st * kKeys + lane + 32 * i] = ks[i] * p.scale_log2;
      const uint32_t bar = full0 + st * 8;
      if (lane == 0) {
        mbar_arrive_expect_tx(bar, L::kStageTx + (tile == 0 && !kQ16 ? L::kK : 0u));
        if (tile == 0 && !kQ16) {  // Q (rows past Nq zero-filled), boxes of kRowB channels
          const int r = static_cast<int>(q0);
#pragma unroll
          for (int c = 0; c < L::kChunks; ++c)
            tma_load_4d(base + L::kQ + c * L::kQChunk, &maps.q, bar, L::kRowB * c,
                        maps.q_rows_outer ? h : r, maps.q_rows_outer ? r : h, b);
        }
        const int r = tile * kKeys;  // keys past Nkv: zero (masked by the consumers)
        const uint32_t sk = base + L::kK + st * L::kKStage;
#pragma unroll
        for (int c = 0; c < L::kChunks; ++c)
          tma_load_4d(sk + c * L::kKChunk, &maps.k, bar, L::kRowB * c, maps.k_rows_outer ? hk : r,
                      maps.k_rows_outer ? r : hk, b);
        const uint32_t sv = base + L::kV + st * L::kVStage;
        if constexpr (FP8) {
          tma_load_3d(sv, &maps.v, bar, r, 0, b * p.Hkv + hk);
        } else {
#pragma unroll
          for (int c = 0; c < D / 64; ++c)
            tma_load_4d(sv + c * L::kVChunk, &maps.v, bar, 64 * c, maps.v_rows_outer ? hk : r,
                        maps.v_rows_outer ? r : hk, b);
        }
      } else {
        mbar_arrive(bar);  // this lane's kc are stored
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<S::kConsRegs>();
  const int cw = wg - 1;  // consumer index: rows 64 cw .. 64 cw + 63
  const int g = lane / 4, t = lane % 4;
  const int rl0 = cw * 64 + (warp % 4) * 16 + g;
  int64_t row0 = q0 + rl0, row1 = row0 + 8;
  // Logits are s * q (s = float(acc) x kc; q > 0). kQ16: the scales of the consumer's own
  // quantization of its rows.
  float qm0, qm1;
  consumer_q_scales<D, T16, kQ16>(p, b, h, q0, cw, row0, row1, base + L::kQ + cw * 64 * L::kRowB,
                                  reinterpret_cast<float*>(sbase + L::kQs), tid, qm0, qm1);
  // (the visible ends are recomputed on the stages that need a mask: registers are short)
  auto block_q0 = [&]() { return static_cast<int64_t>(cta_work(p).qb) * kRows; };
  constexpr float kPOffset = FP8 ? kLog2_448 : 0.f;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  // Descriptors by addition (desc(a + off) = desc(a) + off / 16; shared addresses < 2^18), kept
  // as their low words (the high word, strides and swizzle, is a constant): registers are short.
  constexpr bool kSw64 = L::kRowB == 64;  // D = 64: int8 rows of 64 bytes, 64-byte swizzle
  auto desc_k = [](uint32_t a) { return kSw64 ? smem_desc_sw64(a) : smem_desc(a); };
  const uint32_t dq0 = static_cast<uint32_t>(desc_k(base + L::kQ + cw * 64 * L::kRowB));
  const uint32_t dk0 = static_cast<uint32_t>(desc_k(base + L::kK));
  const uint32_t dv0 = static_cast<uint32_t>(FP8 ? smem_desc_sw64(base + L::kV)
                                                 : smem_desc_mn(base + L::kV));
  constexpr uint64_t kHiK = kSw64 ? desc_hi(512, 2) : desc_hi(1024, 1);  // as desc_k
  constexpr uint64_t kHiV = FP8 ? desc_hi(512, 2) : desc_hi(1024, 1);
  auto k_desc = [&](int st) { return dk0 + static_cast<uint32_t>(st * (L::kKStage >> 4)); };
  auto v_desc = [&](int st) { return dv0 + static_cast<uint32_t>(st * (L::kVStage >> 4)); };

  int32_t acc[32];
  uint32_t pl[4][4];  // 16-bit P·V: the P fragments of the P·V in flight
  // Wait for stage `tile`, issue its q k^T into acc: k-step kk reads channels 32 kk.. (chunk
  // kk / kSteps, +32 bytes per step inside it).
  constexpr int kSteps = L::kRowB / 32;
  auto issue_qk = [&](int tile) {
    const int st = tile % kStages;
    mbar_wait_bounded(full0 + st * 8, (tile / kStages) & 1);
    const uint32_t dk = k_desc(st);
    // Q's k-step descriptors are loop invariants that LICM would hoist into 7 registers (they
    // spilled): an opaque copy keeps their adds here.
    uint32_t dq = dq0;
    asm volatile("" : "+r"(dq));
    wgmma_fence();
    wgmma_s8_n64<true>(acc, kHiK | dq, kHiK | dk);
#pragma unroll
    for (int kk = 1; kk < D / 32; ++kk) {
      const uint32_t qoff = (kk / kSteps) * (L::kQChunk >> 4) + 2 * (kk % kSteps);
      const uint32_t koff = (kk / kSteps) * (L::kKChunk >> 4) + 2 * (kk % kSteps);
      wgmma_s8_n64<false>(acc, kHiK | (dq + qoff), kHiK | (dk + koff));
    }
    wgmma_commit();
  };

  if (n_tiles > 0) {
    issue_qk(0);
    wgmma_wait<0>();
    fence_regs(acc);
  }
  auto step = [&](int tile, auto more_c) {
    constexpr bool kMore = decltype(more_c)::value;
    const int st = tile % kStages;
    const int kv0 = tile * kKeys;
    const uint32_t dv = v_desc(st);
    float s[32];
    float q0s = qm0, q1s = qm1;
    if constexpr (kKcHalf) {  // kc constant over this thread's columns of the stage
      const float kc = skc[st * kKeys + 2 * t];
      q0s = fmaxf(kc * qm0, 1.17549435e-38f);
      q1s = fmaxf(kc * qm1, 1.17549435e-38f);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = static_cast<float>(acc[i]);
    } else {
      const float* kc = skc + st * kKeys + 2 * t;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 k2 = *reinterpret_cast<const float2*>(kc + 8 * j);
        s[4 * j + 0] = static_cast<float>(acc[4 * j + 0]) * k2.x;
        s[4 * j + 1] = static_cast<float>(acc[4 * j + 1]) * k2.y;
        s[4 * j + 2] = static_cast<float>(acc[4 * j + 2]) * k2.x;
        s[4 * j + 3] = static_cast<float>(acc[4 * j + 3]) * k2.y;
      }
    }
    const int64_t rq0 = block_q0();
    if (kv0 + kKeys > visible_end(p, ct, rq0 + cw * 64)) {  // the stage crosses a visible end of
      // this warpgroup's rows: column 8 j + 2 t + e is masked when 8 j + e >= end - kv0 - 2 t
      const int lim0 = static_cast<int>(visible_end(p, ct, rq0 + rl0)) - kv0 - 2 * t;
      const int lim1 = static_cast<int>(visible_end(p, ct, rq0 + rl0 + 8)) - kv0 - 2 * t;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (8 * j + e >= lim0) s[4 * j + e] = -INFINITY;
          if (8 * j + e >= lim1) s[4 * j + 2 + e] = -INFINITY;
        }
    }
    // Row maxima in logit units (q > 0), then over the row's quad.
    float mx0 = -INFINITY, mx1 = -INFINITY;
    {
      float a0[8], a1[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        a0[j] = fmaxf(s[4 * j + 0], s[4 * j + 1]);
        a1[j] = fmaxf(s[4 * j + 2], s[4 * j + 3]);
      }
#pragma unroll
      for (int w = 4; w >= 1; w /= 2)
#pragma unroll
        for (int i = 0; i < w; ++i) {
          a0[i] = fmaxf(a0[i], a0[i + w]);
          a1[i] = fmaxf(a1[i], a1[i + w]);
        }
      mx0 = a0[0] * q0s;
      mx1 = a1[0] * q1s;
    }
#pragma unroll
    for (int x = 1; x <= 2; x *= 2) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    float r0, r1;
    const bool same = __all_sync(0xffffffffu, m0 == mn0 && m1 == mn1);
    if (same) {  // no row of the warp moved its maximum: exp2(0) = 1 without the MUFU
      r0 = m0 == -INFINITY ? 0.f : 1.f;
      r1 = m1 == -INFINITY ? 0.f : 1.f;
    } else {
      r0 = m0 == -INFINITY ? 0.f : fast_exp2(m0 - mn0);
      r1 = m1 == -INFINITY ? 0.f : fast_exp2(m1 - mn1);
    }
    m0 = mn0;
    m1 = mn1;
    const float off0 = mn0 == -INFINITY ? 0.f : mn0 - kPOffset;
    const float off1 = mn1 == -INFINITY ? 0.f : mn1 - kPOffset;
    float sum0, sum1;
    exp2_rows8<0>(s, q0s, q1s, off0, off1, sum0, sum1);
    l0 = l0 * r0 + sum0;
    l1 = l1 * r1 + sum1;
    // The row sums before any P·V issue: scheduled after it, they kept the 32 P values live next
    // to both chunk accumulators (spills).
    asm volatile("" : "+f"(l0), "+f"(l1));

    if constexpr (FP8) {
      // P as e4m3 A fragments of the two 32-key k-steps (positions in quantize_v_fp8's order).
      uint32_t pa[2][4];
#pragma unroll
      for (int kh = 0; kh < 2; ++kh) {
        const int j = 4 * kh;
        pa[kh][0] = pack_e4m3x4(s[4 * j + 0], s[4 * j + 1], s[4 * j + 4], s[4 * j + 5]);
        pa[kh][1] = pack_e4m3x4(s[4 * j + 2], s[4 * j + 3], s[4 * j + 6], s[4 * j + 7]);
        pa[kh][2] = pack_e4m3x4(s[4 * j + 8], s[4 * j + 9], s[4 * j + 12], s[4 * j + 13]);
        pa[kh][3] = pack_e4m3x4(s[4 * j + 10], s[4 * j + 11], s[4 * j + 14], s[4 * j + 15]);
      }
      // Two-level accumulation per 128-channel chunk: c fresh, o = o r + c once it completed.
      // The next q k^T after the second fold: issued under it (or with two 64-channel chunks,
      // one in flight while the other is folded), its accumulator next to c spilled and ran
      // slower in H200 run 32.
      float c[64];
      pv_chunk128(c, pa, dv, 0);
      wgmma_wait<0>();
      fence_regs(c);
      fold_chunk<0, 64>(o, c, r0, r1);
      pv_chunk128(c, pa, dv, 1);
      wgmma_wait<0>();
      fence_regs(c);
      fold_chunk<1, 64>(o, c, r0, r1);
      if constexpr (kMore) issue_qk(tile + 1);
    } else {
      // P in V's type (A fragments of the 4 key steps of 16: the accumulator layout), O = O r,
      // then P·V straight into O; the previous stage's P·V (still reading pl and writing O)
      // completes here, before P goes into pl and O is rescaled. The wait is unconditional (at
      // the first tile nothing is in flight): a wait under `tile > 0` made ptxas serialize every
      // wgmma of the kernel with its own injected waits (warning C7517).
      wgmma_wait<0>();
      fence_regs(o);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(pl[kk][i])::"memory");
      if (tile > 0) mbar_arrive(empty0 + ((tile - 1) % kStages) * 8);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int j = 2 * kk;
        pl[kk][0] = pack_16x2<T16>(s[4 * j + 0], s[4 * j + 1]);
        pl[kk][1] = pack_16x2<T16>(s[4 * j + 2], s[4 * j + 3]);
        pl[kk][2] = pack_16x2<T16>(s[4 * j + 4], s[4 * j + 5]);
        pl[kk][3] = pack_16x2<T16>(s[4 * j + 6], s[4 * j + 7]);
      }
      if (!same) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[4 * n + 0] *= r0;
          o[4 * n + 1] *= r0;
          o[4 * n + 2] *= r1;
          o[4 * n + 3] *= r1;
        }
      }  // (same: r is 1, or 0 for a row that has seen no key yet, whose O is still 0)
      if constexpr (kMore) issue_qk(tile + 1);  // acc is free: converted into s
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        // 16 key rows (2048 bytes) per step; chunk n: channels 64 n .. 64 n + 63
        const uint32_t d = dv + static_cast<uint32_t>(kk * ((16 * 128) >> 4));
        wgmma_16<T16, 0>(o, pl[kk], kHiV | d);
        if constexpr (D >= 128) wgmma_16<T16, 32>(o, pl[kk], kHiV | (d + (L::kVChunk >> 4)));
        if constexpr (D >= 256) {
          wgmma_16<T16, 64>(o, pl[kk], kHiV | (d + 2 * (L::kVChunk >> 4)));
          wgmma_16<T16, 96>(o, pl[kk], kHiV | (d + 3 * (L::kVChunk >> 4)));
        }
      }
      wgmma_commit();
      if constexpr (kMore) {
        wgmma_wait<1>();  // the next q k^T (issued first); this P·V stays in flight
        fence_regs(acc);
      } else {
        wgmma_wait<0>();
        fence_regs(o);
        mbar_arrive(empty0 + st * 8);
      }
      return;
    }
    mbar_arrive(empty0 + st * 8);  // (fp8 P·V) this thread's q k^T and P·V of st are done
    if constexpr (kMore) {
      wgmma_wait<0>();  // the next q k^T: nothing in flight across the loop's back edge
      fence_regs(acc);
    }
  };
  for (int tile = 0; tile + 1 < n_tiles; ++tile) step(tile, std::true_type{});
  if (n_tiles > 0) step(n_tiles - 1, std::false_type{});
  row0 = static_cast<int64_t>(cta_work(p).qb) * kRows + rl0;
  row1 = row0 + 8;
  if constexpr (!FP8) {
    wgmma_wait<0>();  // (also when no tile ran: the accumulators' registers are settled)
    fence_regs(o);
  }
  constexpr int kEpiChunk = L::kChunks > 1 ? L::kQChunk : 0;
  epilogue<D, FP8, T16, L::kRowB, kEpiChunk>(p, b, h, hk, rl0, row0, row1, qm0, qm1, t,
                                             sbase + L::kQ, n_tiles > 0, o, m0, m1, l0, l1);
#endif
}

// (B, N, H, D) rows with strides sn, sh, sb (elements of `elem` bytes) as a 4-D map (D, N, H, B),
// or (D, H, N, B) when the rows are outer (HND storage), with a box of box_d channels (128 bytes;
// 64 in the 64-byte swizzle when sw64) by box_rows rows of one head.
bool rows_map(CUtensorMap* map, const void* ptr, int elem, int D, int64_t n, int64_t hcount,
              int64_t sn, int64_t sh, int64_t sb, int B, uint32_t box_d, uint32_t box_rows,
              bool sw64, int* rows_outer) {
  *rows_outer = sn >= sh ? 1 : 0;
  const uint64_t dims[4] = {
      static_cast<uint64_t>(D), static_cast<uint64_t>(*rows_outer ? hcount : n),
      static_cast<uint64_t>(*rows_outer ? n : hcount), static_cast<uint64_t>(B)};
  const uint64_t strides[3] = {static_cast<uint64_t>((*rows_outer ? sh : sn) * elem),
                               static_cast<uint64_t>((*rows_outer ? sn : sh) * elem),
                               static_cast<uint64_t>(sb * elem)};
  const uint32_t box[4] = {box_d, *rows_outer ? 1u : box_rows, *rows_outer ? box_rows : 1u, 1};
  return encode_tiled_map(map, ptr, elem, 4, dims, strides, box, sw64);
}

// kQ16: the kernel quantizing q itself (p.q16; no Q map), where the k scales are constant per
// 64-key half (else false, launching nothing).
template <int D, bool FP8, typename T16, int kC = Shape256<D>::kCons, bool kQ16 = false>
bool launch256(const AttnParams& p, int B, cudaStream_t stream) {
  using S = Shape256<D, kC>;
  constexpr int kRows = S::kRows;
  using L = Smem256<D, FP8, kRows, S::kSmemBudget>;
  static_assert(L::kBytes <= S::kSmemBudget, "shared memory");
  const char* op = D == 256 ? "attention_int8 (wgmma, head dim 256)"
                            : "attention_int8 (wgmma TMA ring, 16-bit P·V)";
  constexpr bool kSw64 = L::kRowB == 64;
  Maps256 maps{};
  bool ok = (kQ16 || rows_map(&maps.q, p.q, 1, D, p.Nq, p.Hq, p.q_sn, p.q_sh, p.q_sb, B, L::kRowB,
                              kRows, kSw64, &maps.q_rows_outer)) &&
            rows_map(&maps.k, p.k, 1, D, p.Nkv, p.Hkv, p.k_sn, p.k_sh, p.k_sb, B, L::kRowB, kKeys,
                     kSw64, &maps.k_rows_outer);
  if (FP8) {  // (npad, D, B * Hkv) e4m3, contiguous; boxes of 64 key bytes x 256 channels
    const uint64_t vd[3] = {static_cast<uint64_t>(p.npad), static_cast<uint64_t>(D),
                            static_cast<uint64_t>(B) * p.Hkv};
    const uint64_t vs[2] = {static_cast<uint64_t>(p.npad), static_cast<uint64_t>(p.npad) * D};
    const uint32_t vbox[3] = {kKeys, D, 1};
    ok = ok && encode_tiled_map(&maps.v, p.v, 1, 3, vd, vs, vbox, true);
  } else {  // (B, Nkv, Hkv, D) 16-bit; boxes of 64 channels (128 bytes) x 64 keys
    ok = ok && rows_map(&maps.v, p.v, 2, D, p.Nkv, p.Hkv, p.v_sn, p.v_sh, p.v_sb, B, 64, kKeys,
                        false, &maps.v_rows_outer);
  }
  if (!ok) return false;
  // kc is constant over a thread's columns (8 j + 2 t + e) of a 64-key stage when the k scale
  // is per block of a multiple of 64 keys, or SPEC §1's THREAD_K with such blocks (group t).
  const bool kc_half = (p.k_layout == 0 || p.k_layout == 2) && p.k_block % 64 == 0 &&
                       p.scale_log2 > 0.f;
  using K = void (*)(const AttnParams, const Maps256);
  K kernel = nullptr;
  if constexpr (kQ16) {
    if (!kc_half || !p.q16) return false;
    kernel = attention_wgmma256_kernel<D, FP8, T16, true, kC, true>;
  } else {
    kernel = kc_half ? attention_wgmma256_kernel<D, FP8, T16, true, kC>
                     : attention_wgmma256_kernel<D, FP8, T16, false, kC>;
  }
  constexpr int bytes = L::kBytes;
  set_kernel_smem(kernel, bytes, op, "shared memory");
  if (S::kMinCtas > 1)
    set_func_attribute(reinterpret_cast<const void*>(kernel),
                       cudaFuncAttributePreferredSharedMemoryCarveout,
                       cudaSharedmemCarveoutMaxShared, op, "shared memory carveout");
  const dim3 grid(static_cast<unsigned>(ceil_div(p.Nq, kRows)), static_cast<unsigned>(p.Hq),
                  static_cast<unsigned>(B));
  kernel<<<grid, S::kThreads, bytes, stream>>>(p, maps);
  check_launch(op);
  return true;
}

}  // namespace

bool launch_attention_wgmma256(const AttnParams& p, int B, bool fp8, DType out_dtype,
                               cudaStream_t stream) {
  if (fp8)
    return out_dtype == DType::bf16 ? launch256<256, true, __nv_bfloat16>(p, B, stream)
                                    : launch256<256, true, __half>(p, B, stream);
  return out_dtype == DType::bf16 ? launch256<256, false, __nv_bfloat16>(p, B, stream)
                                  : launch256<256, false, __half>(p, B, stream);
}

bool launch_attention_wgmma_pv16(const AttnParams& p, int B, int D, DType out_dtype,
                                 cudaStream_t stream, int cons, bool q16) {
  using BF = __nv_bfloat16;
  if (q16) {  // (session 61: the forms auto runs; not D = 64 on three consumers, a tuning knob)
    const bool bf = out_dtype == DType::bf16;
    if (D == 128 && cons == 1)
      return bf ? launch256<128, false, BF, 1, true>(p, B, stream)
                : launch256<128, false, __half, 1, true>(p, B, stream);
    if (D == 128)
      return bf ? launch256<128, false, BF, 3, true>(p, B, stream)
                : launch256<128, false, __half, 3, true>(p, B, stream);
    if (D == 64 && cons != 3)
      return bf ? launch256<64, false, BF, 4, true>(p, B, stream)
                : launch256<64, false, __half, 4, true>(p, B, stream);
    return false;
  }
  if (D == 128 && cons == 1)  // one consumer, two CTAs per multiprocessor (session 54)
    return out_dtype == DType::bf16 ? launch256<128, false, BF, 1>(p, B, stream)
                                    : launch256<128, false, __half, 1>(p, B, stream);
  if (D == 128)
    return out_dtype == DType::bf16 ? launch256<128, false, BF>(p, B, stream)
                                    : launch256<128, false, __half>(p, B, stream);
  if (D == 64 && cons == 3)
    return out_dtype == DType::bf16 ? launch256<64, false, BF, 3>(p, B, stream)
                                    : launch256<64, false, __half, 3>(p, B, stream);
  if (D == 64)
    return out_dtype == DType::bf16 ? launch256<64, false, BF, 4>(p, B, stream)
                                    : launch256<64, false, __half, 4>(p, B, stream);
  return false;
}

}  // namespace attn
}  // namespace cuda
}  // namespace lowbit
