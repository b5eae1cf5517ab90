// Split-K decode kernel over contiguous key tiles of several KV heads (DecodePlan::bulk_copy, the
// streaming plan's default where the cache layout allows it): int4 / fp8 / f16 caches, D 64 or
// 128, up to 16 query rows of one KV head per warp. Issue 7, session 3; docs/decode.md "Bulk
// kernel".
//
// Why: the H200 times of the ring kernel (decode_ring.cu) scale with the number of cache rows, not
// their bytes (int4 80-byte rows 0.83 TB/s, fp8 128-byte rows 1.3 TB/s, f16 256-byte rows 1.8 TB/s
// at B 64, L 8192): each warp reads its own head's rows, i.e. 80-256-byte pieces 640-2048 bytes
// apart. Here one CTA reads a tile of 16 keys of HB (up to 8) adjacent heads, which in both cache
// layouts ((B, L, Hkv, Dp) and the (rows, Hkv, Dp) page pool) is one contiguous HB * row-bytes
// piece per key (640 bytes for 8 heads of int4 g4 D 128), with cp.async.bulk (TMA, one
// instruction per piece, completion counted in bytes on an mbarrier).
//   - CTA = (split, block of HB heads [x row chunk], batch); warp w computes head h0 + w over the
//     whole split, 16 keys per tile; tiles stream through NST stages (a stage: 16 K pieces, 16 V
//     pieces, for fp8 16 + 16 scale/shift pieces). After a CTA barrier every warp issues its
//     share of tile it + NST's copies into the stage freed by tile it and arms the stage's
//     mbarrier (HB arrivals) with their bytes; every thread waits on the stage's parity.
//   - Keys on the mma's M side: S^T (16 keys x 8 rows) = K (16 x D) q^T, one m16n8k16 per k-step
//     and 8 query rows (two n-tiles for 9-16 rows), K dequantized to f16 in the A fragment, q in
//     the B fragment (registers). P^T goes back to the PV B fragment with movmatrix.trans;
//     O^T (D x rows) += V^T P^T with V^T as A (dims on M): D/16 mma per tile and n-tile.
//   - Dequantization (exact: every K/V value is code * scale + shift rounded once to f16, as in
//     the ring kernel): int4 (x & 0x000f000f) | 0x64006400 = 1024 + code (hsub2) and
//     (x & 0x00f000f0) | 0x64006400 = 1024 + 16 code (hfma2 by 1/16, -64), then hfma2(scale,
//     shift); V pairs two keys per f16x2 (prmt of the two keys' code bytes first) so the scales
//     are per-key pairs. fp8: cvt e4m3x2 -> f16x2 + hfma2. f16: the words (V: prmt).
//   - Online softmax in base 2 per row; the O rescale is skipped when no row's max moved.
//   - Absent keys (past the split, out-of-range page, past the pool) are not copied: their scores
//     are -inf (select) and their V rows are stale values of an earlier tile or the zeros the ring
//     starts with (finite), times P = 0.
// The per-warp (m, l, O) is the head's split partial: no cross-warp merge.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstring>
#include <type_traits>

#include "src/core/convert_elem.h"
#include "src/core/dispatch.h"
#include "src/cuda/decode_common.cuh"

namespace lowbit {
namespace cuda {
namespace decode_detail {
namespace {

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxHeads = 8;   // HB: heads (warps) per CTA
constexpr int kMaxStages = 8;  // (DecodePlan::bulk_stages within 113 KB; automatic: <= 4)
constexpr int kOneCtaSmem = 220 * 1024;  // a ring's bytes at one CTA per multiprocessor

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  return __byte_perm(a, b, sel);
}
// f16x2 of two e4m3 bytes (low byte -> low half).
__device__ __forceinline__ uint32_t e4m3x2(uint32_t v16) {
  const __half2_raw r =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v16 & 0xffffu), __NV_E4M3);
  return h2_bits(__half2(r));
}
// Both halves of a word of four e4m3 bytes: lo = f16x2 (b0, b1), hi = f16x2 (b2, b3). The same
// conversion as e4m3x2(w), e4m3x2(w >> 16), but ptxas reads the high half as an operand selector
// (F2FP ... R.H1) instead of a separate SHF per word (the sm_90a SASS of the fp8 instantiation
// had SHF + F2FP + F2FP per word: 32 of ~310 instructions per tile and warp).
__device__ __forceinline__ void e4m3x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = e4m3x2(w);
  hi = e4m3x2(w >> 16);
#endif
}
// (x & M) | C in one LOP3 (written as C++ the compiler emits an AND and an OR: two ALU-pipe
// instructions per f16x2 in H200 run 5's profile of the int4 instantiation).
template <uint32_t M, uint32_t C>
__device__ __forceinline__ uint32_t and_or(uint32_t x) {
  uint32_t y;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(y) : "r"(x), "n"(M), "n"(C));
  return y;
}
// 2^x with subnormal results flushed to 0 (one MUFU; exp2f adds a range fix-up of 4 instructions).
// Only p = 2^(s - max) < 2^-126 differ, which round to f16 0 in P anyway.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// ldmatrix x4 (b16): lane l gives the address of row l % 8 of matrix l / 8 (16 bytes); register i
// gets matrix i's (row g, 32-bit word t) (plain) or (rows 2t, 2t + 1; 16-bit column g) (trans).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t addr, uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
// R[c] = r[(c - s) mod 5] (s in 0..3): two rounds of selects (rotate by 1, by 2) (kFlat: the
// registers of ldmatrix rows whose 16-byte column was rotated by the lane's key class).
__device__ __forceinline__ void unrot5(const uint32_t (&r)[5], int s, uint32_t (&R)[5]) {
  const bool b0 = (s & 1) != 0, b1 = (s & 2) != 0;
  uint32_t T[5];
#pragma unroll
  for (int c = 0; c < 5; ++c) T[c] = b0 ? r[(c + 4) % 5] : r[c];
#pragma unroll
  for (int c = 0; c < 5; ++c) R[c] = b1 ? T[(c + 3) % 5] : T[c];
}
// Word v of lane (b & 28) | (lane & 3): shfl.sync.idx with segment mask 3 (bits 0-1 of the source
// lane from the reading lane, bits 2-4 from b) and clamp 31 (kFlat: with b a constant, an
// immediate source lane, no per-lane index register).
__device__ __forceinline__ uint32_t shfl_quadcol(uint32_t v, uint32_t b) {
  uint32_t d;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x31f, 0xffffffff;\n" : "=r"(d) : "r"(v), "r"(b));
  return d;
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Shared-memory loads at a 32-bit shared address (kDiet: the stage's offsets are compile-time
// constants added to one per-lane register, where generic pointers made the compiler re-derive
// the shared window base and the stage offset for every load at the 128-register cap).
__device__ __forceinline__ uint32_t lds32_s(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ void lds128_s(uint32_t a, uint32_t (&v)[4]) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(a));
}
// fmaxf's own max.f32 (same bits) as one value the compiler keeps: NVVM re-derived
// fmaxf(m_run, mx) at each use and again in the rescale block, so ptxas kept a copy of the old
// m_run, made on every tile (kFlat: 2 moves per tile on the main path).
__device__ __forceinline__ float fmax_once(float a, float b) {
  float y;
  asm("max.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
// A loop-invariant lane value held in a register: an identity shuffle is a value ptxas cannot
// rematerialize, so at the 128-register cap it stays put instead of being rebuilt from the
// thread id in every tile (kFlat, kF8Solo).
__device__ __forceinline__ uint32_t kept(uint32_t x, int lane) {
  return static_cast<uint32_t>(__shfl_sync(0xffffffffu, x, lane));
}
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  return h2_bits(__hmul2(bits_h2(a), bits_h2(b)));
}
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// ---- mbarrier + bulk copy: the shared wrappers of src/cuda/ptx.cuh (sm_90; the host launches
// this kernel only on sm_90 and later, and its body is a trap on older targets) ----
using ptx::bulk_g2s;
using ptx::fence_proxy_async;
using ptx::mbar_arrive;
using ptx::mbar_arrive_expect_tx;
using ptx::mbar_init;
using ptx::mbar_try;
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try(bar, parity)) {
  }
}

// Shared-memory offset of key i's piece inside a stage's K (or V) block: i * kstr plus 0-96
// bytes so that (offset mod 128) / 32 = ((i >> 1) + 2 (i & 1)) mod 4. Then the QK reads (lanes
// g = 0..7 read keys g; within a quarter warp keys g, g + 1, 64 bytes each) and the PV reads
// (within a half warp keys 2t, t = 0..3, 32 bytes each) hit disjoint banks. kstr is a multiple of
// 32 and >= piece bytes + 96, so pieces never overlap.
__host__ __device__ __forceinline__ int key_offset(int i, int kstr) {
  const int want = (((i >> 1) & 3) + 2 * (i & 1)) & 3;
  const int pad = (want - i * (kstr / 32)) & 3;
  return i * kstr + 32 * pad;
}

// The folded int4 layout (ldmatrix reads 16-byte rows of 8 keys at once): (offset mod 128) / 16 =
// i mod 8, so the 8 rows of one ldmatrix phase hit disjoint banks. kstr: a multiple of 16, >= piece
// bytes + 112.
__host__ __device__ __forceinline__ int key_offset16(int i, int kstr) {
  const int pad = ((i & 7) - i * (kstr / 16)) & 7;
  return i * kstr + 16 * pad;
}

struct BulkArgs {
  int hb = 1;            // heads per CTA (= warps)
  int nst = 2;           // stages
  int kstr = 0;          // stage stride of key pieces, bytes
  int stage_bytes = 0;   // K block, V block (16 * kstr each), fp8: kss, vss blocks (16 * hb words)
  // fp8: the scale/shift pieces of consecutive keys are adjacent (key stride = hb words, i.e. all
  // Hkv heads in the CTA): one copy per tile for K's and one for V's instead of 16 each.
  bool ss_block = false;
  // Folded int4: keys 2i and 2i + 1 are adjacent in global memory (key stride = hb * row bytes) and
  // copied together into pair i (stride 2 kstr): 16 copies per tile instead of 32. Stage row r
  // (the mma's key row) holds key 2 (r % 8) + r / 8, so the 8 rows of an ldmatrix phase are 8
  // different pairs (disjoint banks by key_offset16 over pairs).
  bool pairs = false;
  // DecodePlan::bulk_issue = 1 ("solo"): tile n's copies are all issued by warp n mod HB (its
  // lanes, one or two copies each), which arms the stage's `full` mbarrier alone (count 1); each
  // thread releases a stage by arriving on its `empty` mbarrier (count 32 HB) when done reading
  // it, and the next issuer waits on that instead of a CTA barrier per tile. Cuts the per-tile
  // copy-issue code every warp ran (~85 of ~376 SASS instructions per tile and warp at int4 g4
  // fold) to one warp in HB, and lets warps drift apart by up to a stage.
  bool solo = false;
  // Shared issue (solo false): warps 0 .. issuers - 1 issue the tile's copies (copy ci: warp
  // ci mod issuers, lane ci / issuers); every warp still arms `full` (HB arrivals, the others
  // with 0 bytes), so the issue path has no per-warp branch (run 12's `if (issuer)` around it
  // likely moved the loop's stage / parity bookkeeping off the uniform datapath: int4 +9 %,
  // paged fp8 +3..7 %).
  // HB by default; DecodePlan::bulk_issue 2: min(HB, 4) (each issuing warp pays
  // ~50 instructions of per-tile setup besides ~10 per copy: int4 g4 fold spent ~85 of ~384
  // instructions per tile and warp on the issue with 8 issuers).
  int issuers = 1;
  bool pdl = false;  // DecodePlan::launch_pdl (host side only)
  // The K / V pieces of a tile's 16 keys are one contiguous block each (key stride = HB * row
  // bytes: heads per CTA = Hkv; fp8: with ss_block), so a tile can be copied whole (blocks).
  bool contig = false;
  bool probe = false;  // DecodePlan::bulk_probe != 0 (host side: the kProbe instantiation)
  // DecodePlan::bulk_probe (session 11; read by kProbe instantiations only): kProbeCopies,
  // kProbeFlat (kTma4: a full tile's K / V by one 1-D bulk copy each), kProbeEmpty (no reads).
  int probe_mode = 0;
  bool blocks = false;  // fp8 with contig: stage = the tile's blocks (kBlocks8)
  // Folded int4, DecodePlan::bulk_tma (kTma4): a full tile's K and V by one tensor-map copy each
  // into a stage of key stride kstr = piece + 16 (piece / 16 even) or piece, i.e. an odd number
  // of 16-byte units: the rows of an ldmatrix phase (8 consecutive keys) hit 8 different 16-byte
  // bank groups. The box's last 16 bytes lie past the map's first dimension (zero-filled, never
  // read). Partial tiles: per-key bulk copies into the same layout.
  bool tma = false;
  // DecodePlan::bulk_stage_out (session 9; the kStage instantiations: kTma4, fp8 kBlocks8 solo):
  // the partial rows through shared memory, then whole rows by 16-byte stores (host: only where
  // the workspace is 16-byte aligned and the ring holds HB x 8 NR rows of D + 4 floats).
  bool stage_out = false;
  // DecodePlan::bulk_lean_start (session 9; honoured by the kTma4 / kBlocks8 instantiations).
  bool lean = false;
  // DecodePlan::bulk_diet (session 10): the kTma4 | kDiet instantiation; set only with tma, 8
  // heads per CTA, 80-byte rows, kstr 656 and 4 stages (its compile-time geometry), and not with
  // stage_out.
  bool diet = false;
  // DecodePlan::bulk_flat (session 14; any non-zero value): the kTma4 | kDiet | kFlat
  // instantiation; set only with diet and contig (a tile's K / V block is contiguous: heads per
  // CTA = Hkv), kstr 640.
  bool flat = false;
};

// The K / V tensor maps of the kTma4 instantiations: u32 elements, dims (piece words, head
// block, key (contiguous) or pool row (paged), batch (contiguous; 1 paged)), box (kstr / 4, 1,
// 16, 1). A kernel parameter (__grid_constant__) of every instantiation, read only by kTma4.
struct BulkMaps {
  CUtensorMap k, v;
};

// FOLD (DecodePlan::fold_scales; int4 with 4 groups at D 128, fp8): the scale / shift leave the
// per-element arithmetic (docs/decode.md "Folded scales"). int4: K and V codes are read with
// ldmatrix (16-byte rows of 8 keys: K plain, V transposed, so that one k-step of QK and one m-tile
// of PV stay inside one 32-dim group) and go to the mma as f16 subnormals (x & 0x000f000f =
// c 2^-24, x & 0x00f000f0 = 16 c 2^-24: one LOP3 per f16x2); S = 2^24 sum_g s_g acc_g +
// sum_g z_g Q_g (one accumulator per group; the z term is one more mma of the raw (scale, shift)
// words against (0, Q_g) split in two f16); O^T += C^T (P s_g) per group (P scaled per key and
// group in f16) with sum_k z_k,g p_k accumulated by one more mma per tile, added at the end. fp8:
// the same with one scale / shift per key (e4m3 -> f16 is exact).
// SOLO: BulkArgs::solo (DecodePlan::bulk_issue = 1) as a template parameter, so that each
// instantiation carries only its own issue path's state (both paths in one kernel pushed the fp8
// fold instantiation past 128 registers).
// KN: session-7 / 8 knobs, compile-time so that the other instantiations (KN = 0) keep their
// registers (run-time flags of session 7's first try pushed the solo fp8 instantiation to 40-56
// bytes of spills): kBlocks8 (1): fp8 where a tile's blocks are contiguous (one copy per kind and
// tile into an unpadded stage; fp8's layout since H200 run 16); kProbe (2, DecodePlan::bulk_probe,
// bench only): the copies, waits and releases of the split, no math; the partial outputs are 0
// with LSE -inf. Session 8: kTma4 (4): folded int4, solo issue, DecodePlan::bulk_tma
// (BulkArgs::tma).
// Session 9: kStage (8, DecodePlan::bulk_stage_out, BulkArgs::stage_out) with kTma4 and with the
// fp8 kBlocks8 solo instantiation (a run-time flag spilled 28 bytes in two others).
// Session 10: kDiet (16, DecodePlan::bulk_diet; plan_decode's int4 g4 kernel since H200 run 30)
// with kTma4 at 8 heads per CTA (int4 g4 D 128: 80-byte rows, key stride 656 bytes in the
// stage) and 4 stages: the stage geometry and stage count as compile-time constants, every stage
// access relative to one per-lane shared address (32-bit ld.shared), the V coefficient words as
// 16-byte loads, the stage / barrier / key-count addresses advanced incrementally (stepped back
// by the ring's size at the wrap), the stage's key count telling a tile that needs no mask
// alone (the issuer adds 32 when the call has a causal mask or a bias), one try_wait before the
// bounded wait loop; and the lagged refill: after its tile it, the issuing warp (the warp whose
// turn it is) refills the stage of tile it - 1 with tile it - 1 + NST instead of tile it's with
// tile it + NST, so its `empty` wait is for every warp to be done with the previous tile (nearly
// always already true) rather than with the one it has just finished itself (run 22's ncu: that
// wait was the largest single stall). Same arithmetic and order as kTma4 (same bits).
// Session 14: kFlat (32, DecodePlan::bulk_flat) with kTma4 | kDiet: full tiles by one 1-D bulk
// copy per kind into an unpadded stage (key stride 640 = 8 heads x 80 bytes), read as described
// at the kernel's "kFlat reads" below. H200 run 49 (same bits): plan_decode's int4 g4 kernel
// since (bulk_flat 2, an XOR-only read with the coefficient rows apart, lost at every shape:
// +6..+9 % over kFlat; deleted).
// Session 14, helper dec2 (run 53: 2-3 % faster, same bits; session 15 folded it into kFlat and
// deleted the first forms): the distribution code is lean: the K scale shuffles within the quad
// by immediate source lane (width 4), the key g + 8 scale as the high half of the shuffled pair
// word (no shift), the V pair shuffles by source lane 8 G | t (shfl_quadcol, immediate): no
// per-lane source-lane registers (the first form re-read the thread id and rebuilt three of them
// every tile at the 128-register cap); a one-pointer ring state: the stage's full / empty barriers
// and key count in one static block (fsync: full at + 8 s, empty at + 32 + 8 s, count at + 64 +
// 8 s), so that one loop-carried barrier address and the stage address replace kDiet's four
// advanced pointers; and the V shift mma's unused A rows g + 8 (zacc [2], [3], never read) fed
// the rows g words instead of zeros (no per-tile zero moves).
// kF8Solo (no flag of its own: the kernel's f8s, every fp8 kBlocks8 instantiation with solo issue
// and folded scales at D 128, i.e. plan_decode's fp8 kernel, contiguous and paged: KN 9, and 1
// without staged rows): the kFlat treatment, same bits (the sm_90a main path of a full, plain,
// lazy tile without the issue 266 -> 209 SASS per warp at KN 9, 268 -> 213 at KN 1; 128
// registers, no spills, as before): the stage's shared address and full barrier carried, the
// lane's four stage-relative offsets kept through identity shuffles, the barriers and key counts
// in fsync (the count + 32 where the call masks or biases: the plain test is a vote on it), the
// issue test a vote on a carried tile index, the lazy bound kept with m_run, and the z mma's
// unused A rows g + 8 fed the scale pairs instead of copies of the shift pairs.
constexpr int kBlocks8 = 1, kProbe = 2, kTma4 = 4, kStage = 8, kDiet = 16, kFlat = 32;
// BulkArgs::probe_mode (DecodePlan::bulk_probe).
// (Run 33 deleted the ld.global.nc and 16-byte cp.async probes and renumbered no-reads 4 -> 3.)
constexpr int kProbeCopies = 1, kProbeFlat = 2, kProbeEmpty = 3;
// The kDiet geometry (BulkArgs::diet is set only where bulk_geometry gives it).
constexpr int kDietHb = 8, kDietRow = 80, kDietKstr = 656, kDietStages = 4;
constexpr int kFlatKstr = kDietHb * kDietRow;  // 640: the cache's own key stride
// kFlat: one kind's 10 rows of a tile (the kernel's "kFlat reads"): ldmatrix x4 at f (keys
// 0-7), x4 at f + 8 x 640 (keys 8-15), x2 at c (the fifth column of both; TRANS: .trans, V),
// then unrotated by s (K: g >> 1, V: t): column 1 + X of keys g / 2t (0-7) -> codes[X / 2][2 (X & 1)],
// of keys g + 8 / 2t + 8 -> [X / 2][2 (X & 1) + 1]; column 0 -> coef[0] / coef[1].
template <bool TRANS>
__device__ __forceinline__ void flat_rows(uint32_t f, uint32_t c, int s, uint32_t (&codes)[2][4],
                                          uint32_t (&coef)[2]) {
  uint32_t a4[4], b4[4], c2[2], x0[5], x1[5];
  if constexpr (TRANS) {
    ldsm_x4_trans(f, a4);
    ldsm_x4_trans(f + 8 * kFlatKstr, b4);
    ldsm_x2_trans(c, c2);
  } else {
    ldsm_x4(f, a4);
    ldsm_x4(f + 8 * kFlatKstr, b4);
    ldsm_x2(c, c2);
  }
  const uint32_t r0[5] = {a4[0], a4[1], a4[2], a4[3], c2[0]};
  const uint32_t r1[5] = {b4[0], b4[1], b4[2], b4[3], c2[1]};
  unrot5(r0, s, x0);
  unrot5(r1, s, x1);
#pragma unroll
  for (int X = 0; X < 4; ++X) {
    codes[X / 2][2 * (X & 1)] = x0[1 + X];
    codes[X / 2][2 * (X & 1) + 1] = x1[1 + X];
  }
  coef[0] = x0[0];
  coef[1] = x1[0];
}
template <KvFormat F, int D, int NR, int VA, int FOLD, bool SOLO, int KN = 0>
__global__ void __launch_bounds__(kMaxHeads * 32, NR == 1 && D <= 128 ? 2 : 1)
    decode_bulk_kernel(const DecodeParams p, const BulkArgs a,
                       const __grid_constant__ BulkMaps m) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // (cp.async.bulk, mbarrier tx counts: sm_90)
#else
  constexpr int KS = D / 16;              // k-steps of QK
  constexpr int MT = D / 16;              // m-tiles of PV (16 dims each)
  constexpr int QRUN = D / 4;             // K elements per lane and key (QK)
  constexpr int kPerWord = F == KvFormat::int4 ? 8 : F == KvFormat::fp8 ? 4 : 2;
  constexpr int KW = QRUN / kPerWord;     // K words per lane and key
  constexpr int VWN = 2 * MT / kPerWord;  // V words per lane and key (2 dims per m-tile)
  constexpr int KC = KW < 4 ? KW : 4;     // K words per shared-memory access
  constexpr int VC = VWN < 4 ? VWN : 4;   // V words per shared-memory access
  // Alignment of a lane's K / V run in the stage (VA: of every row's code words).
  constexpr int KA = VA < 4 * KW ? VA : (4 * KW < 16 ? 4 * KW : 16);
  constexpr int VAL = VA < 4 * VWN ? VA : (4 * VWN < 16 ? 4 * VWN : 16);
  constexpr bool kFoldI4 = FOLD != 0 && F == KvFormat::int4;  // ldmatrix layout, 4 groups, D 128
  constexpr bool kFoldF8 = FOLD != 0 && F == KvFormat::fp8;
  constexpr int NG = 4;                   // groups of the folded int4 path (32 dims each)
  static_assert(FOLD == 0 || F == KvFormat::fp8 || (F == KvFormat::int4 && D == 128), "fold");
  static_assert(KW >= 1 && VWN >= 1, "run sizes");
  extern __shared__ __align__(128) char ring_raw[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  __shared__ __align__(8) uint64_t empty[kMaxStages];  // solo issue mode: stage released
  __shared__ int cnt[kMaxStages];
  // kFlat: full 0..3, empty 4..7, counts 8..11 (32-byte aligned: the loop steps the stage in
  // bits 3-4 of the full barrier's address)
  // kF8Solo: full 0..7, empty 8..15, counts 16..23 (the count in the low word of its slot)
  constexpr bool f8s =
      F == KvFormat::fp8 && D == 128 && FOLD != 0 && SOLO && (KN & kBlocks8) != 0 &&
      (KN & kProbe) == 0;
  __shared__ __align__(32) uint64_t fsync[f8s ? 3 * kMaxStages : 12];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int HB = a.hb, kstr = a.kstr, stage_bytes = a.stage_bytes;
  const int split = blockIdx.x;
  const int row_chunks = (p.R + 15) / 16;
  const int h0 = (blockIdx.y / row_chunks) * HB, r0 = (blockIdx.y % row_chunks) * 16;
  const int h = h0 + warp;
  const int64_t b = blockIdx.z;
  const int rows = min(16, p.R - r0);
  const CacheArgs& c = p.c;
  const int rb = c.row_bytes;
  // kTma4: tensor copies land at 128-byte aligned addresses (the host adds 128 bytes of slack).
  constexpr bool tma = kFoldI4 && (KN & kTma4) != 0;
  constexpr bool diet = tma && (KN & kDiet) != 0;  // (HB 8, rb 80, kstr 656, 4 stages)
  constexpr bool flatk = diet && (KN & kFlat) != 0;  // (kstr 640)
  constexpr int kK = flatk ? kFlatKstr : kDietKstr;  // kDiet: the stage's key stride
  const int NST = diet ? kDietStages : a.nst;
  static_assert(!diet || (KN & kStage) == 0, "kDiet: not with staged rows");
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring_raw));
  const uint32_t ring_s = tma ? (raw_s + 127u) & ~127u : raw_s;
  char* const ring = ring_raw + (ring_s - raw_s);
  uint32_t full_s, empty_s;  // (kFlat, kF8Solo: fsync's)
  if constexpr (flatk) {
    full_s = static_cast<uint32_t>(__cvta_generic_to_shared(fsync));
    empty_s = full_s + 32;
  } else if constexpr (f8s) {
    full_s = static_cast<uint32_t>(__cvta_generic_to_shared(fsync));
    empty_s = full_s + 8 * kMaxStages;
  } else {
    full_s = static_cast<uint32_t>(__cvta_generic_to_shared(full));
    empty_s = static_cast<uint32_t>(__cvta_generic_to_shared(empty));
  }
  constexpr bool solo = SOLO;

  // Zero the ring (absent keys' V rows must be finite), init the barriers: before the PDL wait
  // (shared memory only), so that it overlaps the previous kernel's tail.
  // BulkArgs::lean (kTma4 / kBlocks8 only, whose full tiles overwrite every stage byte the math
  // reads): seq_len and (solo, paged) the first block-table entry are loaded first; then the ring
  // is zeroed only where stale rows can be read: paged pools (absent pages), and contiguous
  // splits that end in a partial tile.
  constexpr bool kWhole = tma || (F == KvFormat::fp8 && (KN & kBlocks8) != 0);
  const bool lean = kWhole && a.lean;
  auto zero_ring = [&] {
    for (int i = tid; i < NST * stage_bytes / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(ring)[i] = make_uint4(0u, 0u, 0u, 0u);
  };
  if (!lean) zero_ring();
  if (tid == 0)
    for (int s = 0; s < NST; ++s) {
      mbar_init(full_s + 8 * s, solo ? 1 : HB);  // solo: the issuing warp; else every warp
      mbar_init(empty_s + 8 * s, 32 * HB);       // solo: one release per thread
    }
  if (!lean) fence_proxy_async();
  griddep_wait();  // (PDL) the previous kernel's writes (cache, q, seq_len) are visible
  int64_t len = 0;
  int64_t first_page = 0;  // lean, solo, paged: entry of tile `warp` of a split starting at lo0
  if (lean) {
    len = seq_length(c, b);
    const int64_t lo0 = static_cast<int64_t>(split) * p.split_size;  // lo unless the split is empty
    if (c.block_tables) {
      if (solo && lo0 + 16 * warp < c.capacity)
        first_page = c.block_tables[b * c.bt_st0 + ((lo0 / 16 + warp) / (c.page_size / 16)) *
                                                       c.bt_st1];
      zero_ring();
    }
    fence_proxy_async();
  }
  __syncthreads();
  if (!lean) len = seq_length(c, b);

  const int64_t lo = min(static_cast<int64_t>(split) * p.split_size, len);
  const int64_t hi = split == p.S - 1 ? len : min(lo + p.split_size, len);
  // (kProbe with kProbeEmpty: the ring streams nothing)
  constexpr bool kProbeKn = (KN & kProbe) != 0;
  const bool ring_off = kProbeKn && a.probe_mode == kProbeEmpty;
  const int n_tiles_all = static_cast<int>((hi - lo + 15) / 16);
  const int n_tiles = ring_off ? 0 : n_tiles_all;
  if (lean && !c.block_tables && (hi - lo) % 16 != 0) {  // (CTA-uniform)
    zero_ring();
    fence_proxy_async();
    __syncthreads();
  }

  // Offset of key i's piece in a stage's K (or V) block.
  const bool pairs = kFoldI4 && a.pairs;
  // fp8 blocks (kBlocks8, a.blocks): key i at i * kstr (kstr = the piece: the stage's K / V blocks
  // are the cache's tile blocks, one bulk copy each; QK reads 2-way, PV reads 4-way bank
  // conflicts in exchange for 4 copies per tile instead of 34).
  constexpr bool blk = F == KvFormat::fp8 && (KN & kBlocks8) != 0;
  auto koffset = [&](int i) {
    if (blk || tma) return i * kstr;
    if (pairs) return key_offset16(i & 7, 2 * kstr) + (i >> 3) * HB * rb;
    return kFoldI4 ? key_offset16(i, kstr) : key_offset(i, kstr);
  };

  // ---- producer (all warps): tile n -> stage n % NST ----
  const int piece = HB * rb;                 // bytes of one key's K (or V) piece
  const int ss_piece = 4 * HB;               // fp8: bytes of one key's scale/shift piece
  const char* kbase;
  const char* vbase;
  const uint32_t* kssb = nullptr;
  const uint32_t* vssb = nullptr;
  int64_t kst, vst, kssst = 0, vssst = 0;    // key (contiguous) / pool-row (paged) strides
  if (c.block_tables) {
    kbase = c.k + h0 * c.k_st[1];
    vbase = c.v + h0 * c.v_st[1];
    kst = c.k_st[0];
    vst = c.v_st[0];
    if constexpr (F == KvFormat::fp8) {
      kssb = c.kss + h0 * c.kss_st[1];
      vssb = c.vss + h0 * c.vss_st[1];
      kssst = c.kss_st[0];
      vssst = c.vss_st[0];
    }
  } else {
    kbase = c.k + b * c.k_st[0] + h0 * c.k_st[2];
    vbase = c.v + b * c.v_st[0] + h0 * c.v_st[2];
    kst = c.k_st[1];
    vst = c.v_st[1];
    if constexpr (F == KvFormat::fp8) {
      kssb = c.kss + b * c.kss_st[0] + h0 * c.kss_st[2];
      vssb = c.vss + b * c.vss_st[0] + h0 * c.vss_st[2];
      kssst = c.kss_st[1];
      vssst = c.vss_st[1];
    }
  }
  // Paged: page index and offset of the next tile to issue (tiles are issued in order 0, 1, ...;
  // lo and page_size are multiples of 16, so a tile never crosses a page), advanced by 16 keys per
  // issue instead of a 64-bit division per tile; next_page: its block-table entry, loaded one
  // issue ahead.
  int64_t pidx = 0;
  int poff = 0;
  if (c.block_tables) {
    pidx = lo / c.page_size;
    poff = static_cast<int>(lo % c.page_size);
  }
  int64_t next_page = !solo && c.block_tables && n_tiles > 0
                          ? c.block_tables[b * c.bt_st0 + pidx * c.bt_st1]
                          : 0;
  // Every warp issues its share of the tile's copies (K / V pieces of 16 keys, fp8: + their
  // scale/shift pieces = kCopies): copy ci = warp + HB j goes to lane j (key ci % 16, kind ci / 16:
  // K, V, K scale/shift, V scale/shift), and the warp's lane 0 arms the stage's mbarrier (count =
  // HB arrivals) with the bytes of the warp's own copies. Spreading them matters: the compiler
  // issues a warp's bulk copies one lane at a time (uniform operands), and with warp 0 issuing all
  // 32 the other warps waited at the tile barrier (39 % of stall samples in H200 run 2). One call
  // site (source, stride and destination chosen per lane) so the per-lane loop is not duplicated
  // per kind.
  // fp8 with ss_block: copies 32 / 33 are the tile's whole K / V scale/shift blocks (nk pieces).
  // Folded int4 with pairs: copy ci = K (ci < 8) / V pair ci % 8 (keys 2 (ci % 8), + 1).
  // fp8 blocks (blk): copy ci = the tile's K, V, K scale/shift, V scale/shift block.
  // A copy covers my_n keys from logical key my_key (those < nk).
  const bool ss_block = F == KvFormat::fp8 && a.ss_block;
  const int n_copies = F == KvFormat::fp8 ? (blk ? 4 : ss_block ? 34 : 64) : pairs ? 16 : 32;
  // Copy ci of a tile (< n_copies): its source (at key 0 of the tile), source stride per key,
  // destination in the stage, bytes per key, first key and keys covered.
  struct Copy {
    const char* src;
    int64_t st;
    uint32_t dst, size;
    int key, n;
    bool ok;
  };
  auto copy_of = [&](int ci) {
    Copy d;
    const bool whole = blk || (ss_block && ci >= 32);  // a whole block of the tile
    d.n = whole ? 16 : pairs ? 2 : 1;
    d.key = whole ? 0 : pairs ? 2 * (ci & 7) : ci & 15;
    const int row = pairs ? (ci & 7) : d.key;  // its stage row
    const int kind = blk ? ci : whole ? 2 + (ci - 32) : pairs ? ci >> 3 : ci >> 4;
    d.ok = ci < n_copies;
    d.size = kind < 2 ? static_cast<uint32_t>(piece) : static_cast<uint32_t>(ss_piece);
    if (kind == 0) {
      d.src = kbase;
      d.st = kst;
      d.dst = koffset(row);
    } else if (kind == 1) {
      d.src = vbase;
      d.st = vst;
      d.dst = 16 * kstr + koffset(row);
    } else if (F == KvFormat::fp8) {
      d.src = reinterpret_cast<const char*>(kind == 2 ? kssb : vssb);
      d.st = 4 * (kind == 2 ? kssst : vssst);
      d.dst = 32 * kstr + (kind == 3 ? 16 * ss_piece : 0) + d.key * ss_piece;
    } else {  // no such copies
      d.src = kbase;
      d.st = 0;
      d.dst = 0;
    }
    d.src += d.key * d.st;
    return d;
  };
  // Shared issue (default): copy warp + issuers lane (warps < issuers). Solo: copies lane and (fp8:
  // 34 or 64 copies) lane + 32 of the issuing warp (the second one made at issue time: kept for
  // the whole loop it pushed the fp8 instantiation past 128 registers).
  const int NW = a.issuers;
  const bool issuer = solo || warp < NW;
  const Copy c1 = copy_of(solo ? lane : warp + NW * lane);
  const char* my_src = c1.src;
  const int64_t my_st = c1.st;
  const uint32_t my_dst = c1.dst, my_size = c1.size;
  const int my_key = c1.key, my_n = c1.n;
  const bool my_lane = c1.ok && issuer;
  // Issues tile n (the next in order, n < n_tiles) into stage s (= n mod NST).
  // kTma4: K's (kind 0) or V's (kind 1) box of the tile at key (pool row) `base` into stage s.
  auto tma_tile = [&](int kind, int s, int64_t base, uint32_t bar) {
    ptx::tma_load_4d(ring_s + s * stage_bytes + (kind ? 16 * kstr : 0), kind ? &m.v : &m.k, bar,
                     0, h0 / HB, static_cast<int>(base), c.block_tables ? 0 : static_cast<int>(b));
  };
  auto issue = [&](int n, int s) {  // every warp
    const int64_t k0 = lo + 16 * static_cast<int64_t>(n);
    int64_t base = k0;
    int64_t nk = min(hi - k0, int64_t{16});
    if (c.block_tables) {
      const int64_t page = next_page;
      base = page * c.page_size + poff;
      nk = page < 0 ? 0 : min(nk, c.pool_rows - base);
      poff += 16;
      if (poff == c.page_size) {
        poff = 0;
        ++pidx;
      }
      next_page = n + 1 < n_tiles ? c.block_tables[b * c.bt_st0 + pidx * c.bt_st1] : 0;
    }
    nk = nk < 0 ? 0 : nk;
    const uint32_t bar = full_s + 8 * s;
    const bool mine = my_lane && my_key < nk;
    const uint32_t size = static_cast<uint32_t>(min(nk - my_key, int64_t{my_n})) * my_size;
    const uint32_t bytes = __reduce_add_sync(0xffffffffu, mine ? size : 0u);
    if (lane == 0) {
      if (warp == 0) cnt[s] = static_cast<int>(nk);
      mbar_arrive_expect_tx(bar, bytes);
    }
    __syncwarp();
    if (mine) bulk_g2s(ring_s + s * stage_bytes + my_dst, my_src + base * my_st, size, bar);
  };
  // Solo: tile n is issued by warp n mod HB (the tiles of one warp in increasing order, HB apart).
  // Paged: the page of the warp's next tile comes from the tile index (lo and page_size are
  // multiples of 16) and its block-table entry is loaded one issue ahead (solo_page).
  const int tile0 = static_cast<int>(lo / 16);  // tile index of lo in the sequence
  const int tpp = c.block_tables ? c.page_size / 16 : 1;  // tiles per page
  int64_t solo_page = 0;
  if (solo && c.block_tables && warp < n_tiles)  // (lean: loaded above; n_tiles > warp: lo = lo0)
    solo_page = lean ? first_page
                     : c.block_tables[b * c.bt_st0 + ((tile0 + warp) / tpp) * c.bt_st1];
  auto issue_solo = [&](int n, int s) {  // warp n % HB only
    const int64_t k0 = lo + 16 * static_cast<int64_t>(n);
    int64_t base = k0;
    int64_t nk = min(hi - k0, int64_t{16});
    if (c.block_tables) {
      const int64_t page = solo_page;
      const int tin = tile0 + n;
      base = page * c.page_size + 16 * (tin % tpp);
      nk = page < 0 ? 0 : min(nk, c.pool_rows - base);
      solo_page = n + HB < n_tiles ? c.block_tables[b * c.bt_st0 + ((tin + HB) / tpp) * c.bt_st1]
                                   : 0;
    }
    nk = nk < 0 ? 0 : nk;
    const uint32_t bar = full_s + 8 * s;
    const bool whole = tma && nk == 16;  // kTma4, full tile: lane 0 K's box, lane 1 V's
    const bool m1 = whole ? lane < 2 : c1.ok && c1.key < nk;
    // (kProbeFlat: the tile's K / V block by one 1-D bulk copy of 16 pieces)
    // (kFlat: always; the host sets it only where the block is contiguous)
    const bool flat = flatk || (kProbeKn && tma && a.probe_mode == kProbeFlat);
    const uint32_t s1 = whole ? 16u * static_cast<uint32_t>(flat ? piece : kstr)
                              : static_cast<uint32_t>(min(nk - c1.key, int64_t{c1.n})) * c1.size;
    bool m2 = false;
    uint32_t s2 = 0;
    Copy c2;
    if constexpr (F == KvFormat::fp8) {
      c2 = copy_of(lane + 32);
      m2 = c2.ok && c2.key < nk;
      s2 = static_cast<uint32_t>(min(nk - c2.key, int64_t{c2.n})) * c2.size;
    }
    const uint32_t bytes = __reduce_add_sync(0xffffffffu, (m1 ? s1 : 0u) + (m2 ? s2 : 0u));
    if (lane == 0) {
      // (kDiet: + 32 where the call masks or biases, so that the consumers' plain test is
      // the count alone)
      // (kF8Solo too)
      const int cv = static_cast<int>(nk) + ((diet || f8s) && (p.causal || p.bias) ? 32 : 0);
      if constexpr (flatk) {
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(full_s + 64 + 8 * s), "r"(cv) : "memory");
      } else if constexpr (f8s) {
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(full_s + 16 * kMaxStages + 8 * s), "r"(cv)
                     : "memory");
      } else {
        cnt[s] = cv;
      }
      mbar_arrive_expect_tx(bar, bytes);
    }
    __syncwarp();
    const uint32_t dst = ring_s + s * stage_bytes;
    if (m1) {
      if (whole && flat)
        bulk_g2s(dst + (lane ? 16 * kstr : 0), (lane ? vbase : kbase) + base * (lane ? vst : kst),
                 s1, bar);
      else if (whole) tma_tile(lane, s, base, bar);
      else bulk_g2s(dst + c1.dst, c1.src + base * c1.st, s1, bar);
    }
    if constexpr (F == KvFormat::fp8)
      if (m2) bulk_g2s(dst + c2.dst, c2.src + base * c2.st, s2, bar);
  };
  for (int n = 0; n < NST && n < n_tiles; ++n) {
    if constexpr (!solo) issue(n, n);
    else if (warp == (n & (HB - 1))) issue_solo(n, n);  // (HB: a power of two)
  }

  // ---- q as B fragments: (k-pos 2t, 2t+1 | 2t+8, 2t+9; query row 8 nr + g), f16 ----
  // The contraction order is the K A fragment's: lane t's run [t QRUN, (t+1) QRUN) of the dims;
  // k-step ks holds run positions int4: 8 (ks / 2) + 2 (ks % 2) + {0, 4 | 1, 5}, else 4 ks +
  // {0, 1 | 2, 3}. Folded int4: k-step ks = 2 X + j reads word t of the 16-byte block X (dims
  // 32 X + 8 t + [0, 8)): b0 = dims + 2j + {0, 4} (low nibbles), b1 = dims + 2j + {1, 5} / 16
  // (high nibbles, which arrive as 16 c).
  uint32_t qf[NR][KS][2];
  const bool q_bf16 = p.q_dtype == DType::bf16;
  int mrow[NR][2], grow[NR][2];
  bool rok[NR][2];
  float qsum[NR];   // fold: sum of the row's q as the mma sees it (fp8: row 8 nr + g)
  float qgs[NR][NG];  // fold int4: per group (block) sums of row 8 nr + g
#pragma unroll
  for (int nr = 0; nr < NR; ++nr) {
    const int r = 8 * nr + g;
    const bool ok = r < rows;
    const int rr = r0 + r, m = ok ? rr / p.G : 0, gq = ok ? rr % p.G : 0;
    const int64_t off0 = b * p.q_st[0] + m * p.q_st[1] + h * p.q_st[2] + gq * p.q_st[3];
    const int64_t off = off0 + t * QRUN;
    qsum[nr] = 0.f;
#pragma unroll
    for (int G = 0; G < NG; ++G) qgs[nr][G] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int64_t at;
        if constexpr (kFoldI4) {
          at = off0 + 32 * (ks / 2) + 8 * t + 2 * (ks % 2) + (e >> 1) + 4 * (e & 1);
        } else {
          const int pos = F == KvFormat::int4 ? 8 * (ks / 2) + 2 * (ks % 2) + (e >> 1) + 4 * (e & 1)
                                              : 4 * ks + e;
          at = off + pos;
        }
        // q is f16 or bf16 on CUDA (the front rejects f32): 16-bit loads without a dtype branch
        // per element, so that the loads of the whole prologue can be in flight together
        // (a dtype branch per element serialized 32-64 dependent loads per lane).
        const uint32_t u = ok ? static_cast<const uint16_t*>(p.q)[at] : 0u;
        v[e] = q_bf16 ? __uint_as_float(u << 16)
                      : __half2float(__ushort_as_half(static_cast<unsigned short>(u)));
      }
      if constexpr (kFoldI4) {
        qf[nr][ks][0] = pack_f32x2(v[0], v[1]);
        qf[nr][ks][1] = pack_f32x2(v[2] * 0.0625f, v[3] * 0.0625f);
        const float2 lo2 = __half22float2(bits_h2(qf[nr][ks][0]));
        const float2 hi2 = __half22float2(bits_h2(qf[nr][ks][1]));
        qgs[nr][ks / 2] += (lo2.x + lo2.y) + 16.f * (hi2.x + hi2.y);
      } else {
        qf[nr][ks][0] = pack_f32x2(v[0], v[1]);
        qf[nr][ks][1] = pack_f32x2(v[2], v[3]);
        if constexpr (kFoldF8) {
          const float2 lo2 = __half22float2(bits_h2(qf[nr][ks][0]));
          const float2 hi2 = __half22float2(bits_h2(qf[nr][ks][1]));
          qsum[nr] += (lo2.x + lo2.y) + (hi2.x + hi2.y);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {  // accumulator rows 8 nr + 2t + e
      const int r2 = 8 * nr + 2 * t + e;
      rok[nr][e] = r2 < rows;
      mrow[nr][e] = rok[nr][e] ? (r0 + r2) / p.G : 0;
      grow[nr][e] = rok[nr][e] ? (r0 + r2) % p.G : 0;
    }
  }
  // Fold: the shift terms' B operands / factors.
  //   int4: qz[nr] = (0, Q_t hi) | (0, Q_t lo), Q_t = the group-t sum of row 8 nr + g (the A
  //   operand is the raw (scale, shift) word of group t, so the scale half meets 0);
  //   fp8: qrow[nr][e] = the q sum of accumulator row 8 nr + 2t + e.
  uint32_t qz[NR][2];
  float qrow[NR][2];
#pragma unroll
  for (int nr = 0; nr < NR; ++nr) {
    qz[nr][0] = qz[nr][1] = 0u;
    qrow[nr][0] = qrow[nr][1] = 0.f;
    if constexpr (kFoldI4) {
      float mine = 0.f;
#pragma unroll
      for (int G = 0; G < NG; ++G) {
        float x = qgs[nr][G];
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        mine = G == t ? x : mine;
      }
      const __half qh = __float2half_rn(mine);
      const __half ql = __float2half_rn(mine - __half2float(qh));
      const __half zero = __float2half_rn(0.f);  // (meets the scale half of the A words)
      qz[nr][0] = h2_bits(__halves2half2(zero, qh));
      qz[nr][1] = h2_bits(__halves2half2(zero, ql));
    } else if constexpr (kFoldF8) {
      float x = qsum[nr];
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      qrow[nr][0] = __shfl_sync(0xffffffffu, x, 4 * (2 * t));
      qrow[nr][1] = __shfl_sync(0xffffffffu, x, 4 * (2 * t + 1));
    }
  }

  float o[MT][NR][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) o[mt][nr][0] = o[mt][nr][1] = o[mt][nr][2] = o[mt][nr][3] = 0.f;
  // Fold: sum_k z_k p_k per row (int4: row G of the group's mma = lanes g = G; fp8: every row).
  float zacc[NR][4];
#pragma unroll
  for (int nr = 0; nr < NR; ++nr) zacc[nr][0] = zacc[nr][1] = zacc[nr][2] = zacc[nr][3] = 0.f;
  float m_run[NR][2], l_run[NR][2];  // rows 8 nr + 2t + e; l: this lane's keys only
  // kFlat, kF8Solo (lean_softmax): m_run + 8, the lazy test's bound, updated with m_run (the
  // same fp32 sum, made when m_run moves, not per tile)
  constexpr bool lean_softmax = flatk || f8s;
  float m_lazy[NR][2];
#pragma unroll
  for (int nr = 0; nr < NR; ++nr) {
    m_run[nr][0] = m_run[nr][1] = -INFINITY;
    m_lazy[nr][0] = m_lazy[nr][1] = -INFINITY;  // (-inf + 8)
    l_run[nr][0] = l_run[nr][1] = 0.f;
  }
  const int64_t causal_last0 = len - p.Mq;
  const int ng = c.n_groups;
  const int code_off = F == KvFormat::int4 ? 4 * ng : 0;
  // int4 coefficient words: K run halves of lane t, V dims of lane g (one group: >= 8 dims).
  const int kcoef0 = F == KvFormat::int4 ? (t * QRUN) / (D / ng) : 0;
  const int kcoef1 = F == KvFormat::int4 ? (t * QRUN + QRUN / 2) / (D / ng) : 0;
  const int vcoef = F == KvFormat::int4 ? (g * ng) / 8 : 0;
  // Offsets of this lane's keys in a stage's K / V block (plus the warp's head).
  const int koff[2] = {koffset(g) + warp * rb, koffset(g + 8) + warp * rb};
  int voff[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    voff[q] = 16 * kstr + koffset(2 * t + (q & 1) + 8 * (q >> 1)) + warp * rb;
  // Folded int4: this lane's ldmatrix row address (matrix lane / 8 = keys 0-7 | 8-15 of block
  // (lane / 16)), relative to the stage.
  const int ldm_off =
      koffset((lane & 7) + 8 * ((lane >> 3) & 1)) + warp * rb + code_off + 16 * (lane >> 4);
  // kFlat reads. The unpadded stage holds key k's piece at k * 640 (640 = 5 x 128 bytes: every
  // key of the stage sits on the same banks), the warp's head at + 80 warp: 16-byte column c
  // (0: the four coefficient words, 1 + X: the codes of group X) of ANY key lies in bank group
  // (5 warp + c) mod 8 (bank group = 16-byte unit of the 128-byte bank line). So a warp's head
  // covers only 5 of the 8 bank groups (its 16 keys x 80 bytes per kind lie on 20 banks), two
  // rows of one column in one 8-row phase always conflict, and no 8 distinct rows of one head
  // are read in fewer than 2 wavefronts (the padded stage of the tensor map, 656 = 41 x 16,
  // moved each key by one bank group instead). The 10 rows a lane row needs per kind (keys r,
  // r + 8 x 5 columns) go to 10 ldmatrix matrices (x4: keys 0-7, x4: keys 8-15, x2: the fifth
  // column of both), matrix j, row r (key r or r + 8) at column (j + (r >> 1)) mod 5 (the x2:
  // j = 4): the 4 row pairs of a phase sit in 4 different columns, i.e. 4 bank groups with 2
  // rows each: 2 wavefronts per matrix, 20 per tile and kind = 1280 bytes at 64 per wavefront,
  // the least 16-byte phases allow (kDiet's padded stage: ~46 per tile for both kinds, its
  // 16-byte coefficient loads 1 per 8-lane phase).
  //  - K (plain ldmatrix): lane (g, t) gets word t of the row g of each matrix, i.e. column
  //    (j + (g >> 1)) mod 5 in register j; unrot5 by g >> 1 puts column c in register c:
  //    codes of block X (kDiet's kr) and coefficient word t of keys g, g + 8 (kDiet's zk); the
  //    scales of the other groups come by 4 quad shuffles.
  //  - V (ldmatrix .trans): lane (g, t) gets rows 2t, 2t + 1 (halves g), which share the
  //    column (j + t) mod 5; unrot5 by t: the codes of block G (kDiet's vr) and, from the
  //    coefficient rows, for g = 2G the scale pair of group G (kDiet's s01 / s23), for
  //    g = 2G + 1 the shift pair (its za); quad-column shuffles (lanes 8 G + t, 8 gz + 4 + t)
  //    hand every lane its pairs.
  // Same values into the same mma / hmul2 in the same order: the bits equal kDiet's.
  // (Two per-lane offsets: ldm_f, the x4 rows of K and (+ 16 x 640) V; ldm_c, the x2 rows.)
  int ldm_f = 0, ldm_c = 0;
  if constexpr (flatk) {
    const int r = lane & 7, j = lane >> 3, head = warp * kDietRow;
    ldm_f = r * kFlatKstr + head + 16 * ((j + (r >> 1)) % 5);
    ldm_c = (lane & 15) * kFlatKstr + head + 16 * ((4 + (r >> 1)) % 5);
  }
  const char* ring_c = ring;
  // kDiet: the stage's shared address and its barriers' advance with the stage (no s * stage
  // bytes per access), the lane's stage-relative offsets are loop invariants (koff[0] + 4 t:
  // word t of key g's coefficients; voff[0] + 4 min(g, 3): the V shift words), the other keys'
  // offsets compile-time constants; the warp issues at every HB-th tile from next_iss on.
  uint32_t st_cur = ring_s, fb_cur = full_s, eb_cur = empty_s;
  // kFlat (same bits; the sm_90a main path of a full tile 273 -> 257 SASS per warp): the lane's
  // two ldmatrix addresses in place of the stage address (no stage + offset adds per read), set
  // from the next stage's full-barrier offset (no wrap selects, no s); and, kept, the lane
  // (unrot5's shifts) and zb, the V shift pairs' source lane (below).
  const uint32_t lf0 = ring_s + ldm_f, lc0 = ring_s + ldm_c;
  uint32_t lf_cur = lf0, lc_cur = lc0;
  const int lq = flatk ? static_cast<int>(kept(lane, lane)) : lane;
  const uint32_t zb = flatk ? kept((static_cast<uint32_t>(lane) << 1) | 4u, lane) : 0u;
  const uint32_t cnt_s = static_cast<uint32_t>(__cvta_generic_to_shared(cnt));  // (not kFlat)
  uint32_t cnt_cur = cnt_s;
  // (it - 1 + NST) mod HB = warp, it >= 1 (the lagged refill)
  int next_iss = (warp + 1 - NST) & (kDietHb - 1);
  if (next_iss == 0) next_iss = kDietHb;
  const int koff_t = koff[0] + 4 * t;
  const int voff_z = voff[0] + 4 * (g < NG ? g : NG - 1);
  // kF8Solo: the lane's four stage-relative offsets (K codes of key g and its run of lane t; K
  // scale/shift word of key g; V codes of key 2t, lane g's bytes; V scale/shift word of key 2t),
  // kept, the other keys' at uniform multiples of kstr / 4 HB from them; the warp issues at
  // every HB-th tile from next_f8 on ((it + NST) mod HB = warp).
  uint32_t f8_k = 0, f8_ks = 0, f8_v = 0, f8_vs = 0;
  int next_f8 = 0;
  if constexpr (f8s) {
    f8_k = kept(koff[0] + t * (4 * KW), lane);
    f8_ks = kept(32 * kstr + g * ss_piece + 4 * warp, lane);
    f8_v = kept(voff[0] + g * (4 * VWN), lane);
    f8_vs = kept(32 * kstr + 16 * ss_piece + 2 * t * ss_piece + 4 * warp, lane);
    next_f8 = (warp - NST) & (HB - 1);
  }

  int s = 0;          // stage of tile it (= it mod NST)
  uint32_t phase = 0;  // parity of its use (= (it / NST) mod 2)
  // Done with tile it (stage s): release the stage, issue tile it + NST into it, advance s.
  auto finish_tile = [&](int it) {
    if constexpr (diet) {
      // (kFlat: the empty barrier at + 32 from the full one)
      const uint32_t eb = flatk ? fb_cur + 32 : eb_cur;
      mbar_arrive(eb);
      // (kFlat: as a vote, known warp-uniform: no convergence barrier around it on every tile)
      if (flatk ? __any_sync(0xffffffffu, it == next_iss) : it == next_iss) {
        // tile it - 1 + NST into the stage of tile it - 1
        next_iss += kDietHb;
        if (it - 1 + NST < n_tiles) {
          const int sn = flatk ? it & (kDietStages - 1) : s;  // (kFlat: no s)
          const bool first = sn == 0;  // tile it - 1: the last stage of the previous use
          const uint32_t eb_prev = first ? eb + 8 * (NST - 1) : eb - 8;
          mbar_wait(eb_prev, first ? phase ^ 1u : phase);
          fence_proxy_async();
          issue_solo(it - 1 + NST, first ? NST - 1 : sn - 1);
        }
      }
      if constexpr (flatk) {  // (fsync is 32-byte aligned: bits 3-4 of fb_cur are 8 s)
        const uint32_t mn = (fb_cur + 8) & 24u;  // 8 x the next stage
        fb_cur = mn | (fb_cur & ~24u);
        lf_cur = lf0 + mn * (4 * kK);
        lc_cur = lc0 + mn * (4 * kK);
        if (mn == 0u) phase ^= 1u;  // (wrapped)
        return;
      }
      st_cur += 32 * kK;
      fb_cur += 8;
      if constexpr (!flatk) {
        eb_cur += 8;
        cnt_cur += 4;
      }
      if (++s == NST) {
        s = 0;
        phase ^= 1u;
        // (back by the ring: no shared-window base to re-derive)
        st_cur -= kDietStages * 32 * kK;
        fb_cur -= 8 * kDietStages;
        if constexpr (!flatk) {
          eb_cur -= 8 * kDietStages;
          cnt_cur -= 4 * kDietStages;
        }
      }
      return;
    } else if constexpr (f8s) {  // (as the solo path below, on the carried stage state)
      mbar_arrive(fb_cur + 8 * kMaxStages);
      // (as a vote, known warp-uniform: no convergence barrier around it on every tile)
      if (__any_sync(0xffffffffu, it == next_f8)) {
        next_f8 += HB;
        const int nn = it + NST;
        if (nn < n_tiles) {
          mbar_wait(fb_cur + 8 * kMaxStages, phase);
          fence_proxy_async();
          issue_solo(nn, s);
        }
      }
      fb_cur += 8;
      st_cur += stage_bytes;
      if (++s == NST) {
        s = 0;
        phase ^= 1u;
        fb_cur -= 8 * NST;
        st_cur -= NST * stage_bytes;
      }
      return;
    } else if constexpr (solo) {
      // Release stage s; the issuer of tile it + NST waits until every thread has released it
      // (each lane's arrive releases its own reads of the stage: no reliance on a warp barrier's
      // ordering, which compute-sanitizer's racecheck did not follow in run 27).
      mbar_arrive(empty_s + 8 * s);
      const int nn = it + NST;
      if (nn < n_tiles && warp == (nn & (HB - 1))) {
        mbar_wait(empty_s + 8 * s, phase);
        fence_proxy_async();
        issue_solo(nn, s);
      }
    } else {
      __syncthreads();  // every warp is done with stage s
      if (it + NST < n_tiles) {
        fence_proxy_async();
        issue(it + NST, s);
      }
    }
    if (++s == NST) {
      s = 0;
      phase ^= 1u;
    }
  };
#pragma unroll 1
  for (int it = 0; it < n_tiles; ++it) {
    // kTma4: a bounded wait (a tensor copy whose bytes never complete traps, not hangs).
    if constexpr (diet) {  // one try first: the bounded loop's counter only when not ready
      if (!mbar_try(fb_cur, phase)) ptx::mbar_wait_bounded(fb_cur, phase);
    } else if constexpr (tma) {
      ptx::mbar_wait_bounded(full_s + 8 * s, phase);
    } else {
      mbar_wait(f8s ? fb_cur : full_s + 8 * s, phase);
    }
    if constexpr ((KN & kProbe) != 0) {
      finish_tile(it);
      continue;
    }
    const char* st = ring_c + s * stage_bytes;
    const uint32_t st_s = diet ? st_cur : ring_s + s * stage_bytes;
    const int craw = diet  ? static_cast<int>(lds32_s(flatk ? fb_cur + 64 : cnt_cur))
                     : f8s ? static_cast<int>(lds32_s(fb_cur + 16 * kMaxStages))
                           : cnt[s];
    const int nk = diet || f8s ? craw & 31 : craw;
    const int64_t k0 = lo + 16 * static_cast<int64_t>(it);

    // ---- S^T = K q^T (keys g, g + 8 x rows 8 nr + 2t + {0, 1}) ----
    float sv[NR][4];
    if constexpr (kFoldI4) {
      // K codes: block X, word t of keys g (r[0] / r[2] for X even / odd), g + 8 (r[1] / r[3]).
      uint32_t kr[2][4];
      uint32_t zk0, zk1;
      uint32_t kc[2][4];  // coefficient words (groups 0..3) of keys g, g + 8
      uint32_t zk[2];  // kFlat: coefficient word t of keys g, g + 8
      if constexpr (flatk) {  // (kFlat reads above)
        flat_rows<false>(lf_cur, lc_cur, (lq >> 3) & 3, kr, zk);
      } else {
        ldsm_x4(st_s + ldm_off, kr[0]);
        ldsm_x4(st_s + ldm_off + 32, kr[1]);
      }
      if constexpr (flatk) {
        zk0 = zk1 = 0u;  // (below, from the coefficient rows)
      } else if constexpr (diet) {
        zk0 = lds32_s(st_s + koff_t);
        zk1 = lds32_s(st_s + koff_t + 8 * kDietKstr);
      } else {
        zk0 = lds32(st + koff[0] + 4 * t);
        zk1 = lds32(st + koff[1] + 4 * t);
      }
      float acc[NR][NG][4];
#pragma unroll
      for (int nr = 0; nr < NR; ++nr) {
        sv[nr][0] = sv[nr][1] = sv[nr][2] = sv[nr][3] = 0.f;
        if constexpr (!flatk) {
          const uint32_t za[4] = {zk0, zk1, zk0, zk1};
          ptx::mma_f16(sv[nr], za, qz[nr][0], qz[nr][1]);  // sum_g z_g Q_g
        }
#pragma unroll
        for (int G = 0; G < NG; ++G)
          acc[nr][G][0] = acc[nr][G][1] = acc[nr][G][2] = acc[nr][G][3] = 0.f;
      }
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const int X = ks / 2;
        uint32_t w0 = kr[X / 2][2 * (X & 1)], w1 = kr[X / 2][2 * (X & 1) + 1];
        if (ks & 1) {
          w0 >>= 8;
          w1 >>= 8;
        }
        const uint32_t af[4] = {w0 & 0x000f000fu, w1 & 0x000f000fu, w0 & 0x00f000f0u,
                                w1 & 0x00f000f0u};
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) ptx::mma_f16(acc[nr][X], af, qf[nr][ks][0], qf[nr][ks][1]);
      }
      if constexpr (flatk) {
        // (kFlat: zk is word t of these rows, and the shift mma comes after the group mmas: an
        // accumulator of its own from 0, the same bits; fewer registers live across the loop)
        const uint32_t za[4] = {zk[0], zk[1], zk[0], zk[1]};
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) ptx::mma_f16(sv[nr], za, qz[nr][0], qz[nr][1]);
        // the scales of keys g, g + 8 (low halves of word G: lane 4 g + G), as one pair word
        const uint32_t sp = prmt(zk[0], zk[1], 0x5410);
#pragma unroll
        for (int G = 0; G < NG; ++G)  // (sc below: key g + 8's scale is the high half)
          kc[0][G] = kc[1][G] = __shfl_sync(0xffffffffu, sp, G, 4);
      } else if constexpr (diet) {
        lds128_s(st_s + koff[0], kc[0]);
        lds128_s(st_s + koff[0] + 8 * kDietKstr, kc[1]);
      } else {
        lds_words<4, 16>(st + koff[0], kc[0]);
        lds_words<4, 16>(st + koff[1], kc[1]);
      }
      float sc[2][NG];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int G = 0; G < NG; ++G)
          sc[kk][G] =
              flatk && kk == 1 ? __high2float(bits_h2(kc[kk][G])) : __low2float(bits_h2(kc[kk][G]));
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          // subnormal codes: acc in units of 2^-24
          constexpr float kUnit = 5.9604644775390625e-8f;
          float x = sv[nr][cc] * kUnit;
#pragma unroll
          for (int G = 0; G < NG; ++G) x = fmaf(sc[cc >> 1][G], acc[nr][G][cc], x);
          sv[nr][cc] = x * ((1.f / kUnit) * p.qk_scale);  // (2^24 qk_scale: exact)
        }
    } else {
      uint32_t kcw[2][2];  // int4: coefficient words of the run halves; fp8: scale/shift word
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        if constexpr (F == KvFormat::int4) {
          kcw[kk][0] = lds32(st + koff[kk] + 4 * kcoef0);
          kcw[kk][1] = kcoef1 != kcoef0 ? lds32(st + koff[kk] + 4 * kcoef1) : kcw[kk][0];
        } else if constexpr (f8s) {
          kcw[kk][0] = kcw[kk][1] = lds32_s(st_cur + f8_ks + kk * 8 * ss_piece);
        } else if constexpr (F == KvFormat::fp8) {
          kcw[kk][0] = kcw[kk][1] = lds32(st + 32 * kstr + (g + 8 * kk) * 4 * HB + 4 * warp);
        } else {
          kcw[kk][0] = kcw[kk][1] = 0u;
        }
      }
      float sacc[NR][2][4];
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          sacc[nr][j][0] = sacc[nr][j][1] = sacc[nr][j][2] = sacc[nr][j][3] = 0.f;
      uint32_t kbuf[2][KC];
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        // word of the run holding k-step ks
        const int wi = F == KvFormat::int4 ? ks / 2 : F == KvFormat::fp8 ? ks : 2 * ks;
        const bool first_use = F == KvFormat::int4 ? (ks % 2 == 0) : true;
        if (first_use && wi % KC == 0) {
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            if constexpr (f8s) lds128_s(st_cur + f8_k + kk * 8 * kstr + 4 * wi, kbuf[kk]);
            else lds_words<KC, KA>(st + koff[kk] + code_off + t * (4 * KW) + 4 * wi, kbuf[kk]);
          }
        }
        uint32_t af[4];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const uint32_t cw = kcw[kk][ks >= KS / 2 ? 1 : 0];
          const __half2 sc = bits_h2(prmt(cw, 0, 0x1010)), sh = bits_h2(prmt(cw, 0, 0x3232));
          uint32_t p0, p1;
          if constexpr (F == KvFormat::int4) {
            const uint32_t w = kbuf[kk][wi % KC];
            const uint32_t x = (ks & 1) ? (w >> 8) : w;
            const __half2 lo2 = __hsub2(bits_h2(and_or<0x000f000fu, 0x64006400u>(x)),
                                        bits_h2(0x64006400u));
            const __half2 hi2 = __hfma2(bits_h2(and_or<0x00f000f0u, 0x64006400u>(x)),
                                        bits_h2(0x2c002c00u), bits_h2(0xd400d400u));  // * 1/16 - 64
            p0 = h2_bits(__hfma2(lo2, sc, sh));
            p1 = h2_bits(__hfma2(hi2, sc, sh));
          } else if constexpr (F == KvFormat::fp8) {
            const uint32_t w = kbuf[kk][wi % KC];
            e4m3x4(w, p0, p1);
            if constexpr (!kFoldF8) {
              p0 = h2_bits(__hfma2(bits_h2(p0), sc, sh));
              p1 = h2_bits(__hfma2(bits_h2(p1), sc, sh));
            }
          } else {
            p0 = kbuf[kk][wi % KC];
            p1 = kbuf[kk][(wi + 1) % KC];
          }
          af[kk] = p0;       // a0 (key g), a1 (key g + 8): k-pos 2t, 2t+1
          af[2 + kk] = p1;   // a2, a3: k-pos 2t+8, 2t+9
        }
#pragma unroll
        for (int nr = 0; nr < NR; ++nr)
          ptx::mma_f16(sacc[nr][ks & 1], af, qf[nr][ks][0], qf[nr][ks][1]);
      }
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          float x = sacc[nr][0][cc] + sacc[nr][1][cc];
          if constexpr (kFoldF8) {  // s_key (q . e) + z_key sum(q)
            const uint32_t cw = kcw[cc >> 1][0];
            x = fmaf(x, __low2float(bits_h2(cw)), __high2float(bits_h2(cw)) * qrow[nr][cc & 1]);
          }
          sv[nr][cc] = x * p.qk_scale;
        }
    }
    // ---- mask, bias (base 2); c: key g + 8 (c >> 1), row 8 nr + 2t + (c & 1) ----
    // Plain tiles need no mask at all: a query row past `rows` has q = 0 (its scores are exactly 0
    // and its m, l, O finite or, with a non-finite K entry, NaN in that row only: each row's
    // softmax state is its own, fmaxf drops NaN, and such rows are never written), so the
    // -inf select of session 5 (~8 SASS per tile and warp) only ever touched unused rows.
    // (lean_softmax: as a vote, which ptxas knows to be warp-uniform: no convergence barrier
    // around the mask; every lane reads the same count)
    const bool plain = lean_softmax ? __all_sync(0xffffffffu, craw == 16)
                       : diet ? craw == 16 : nk == 16 && !p.causal && !p.bias;
    if (!plain) {
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
          const int e = cc & 1;
          // the row's key (pairs: row g + 8 (cc >> 1) holds key 2 g + (cc >> 1))
          const int key = pairs ? 2 * g + (cc >> 1) : g + 8 * (cc >> 1);
          float x = sv[nr][cc];
          const int64_t j = k0 + key;
          const bool ok =
              key < nk && rok[nr][e] && (!p.causal || j <= causal_last0 + mrow[nr][e]);
          if (ok && p.bias) {
            const int64_t off = b * p.bias_st[0] + h * p.bias_st[1] + grow[nr][e] * p.bias_st[2] +
                                mrow[nr][e] * p.bias_st[3] + j * p.bias_st[4];
            x += load_f32(p.bias, off, p.bias_dtype) * kLog2e;
          }
          sv[nr][cc] = ok ? x : -INFINITY;
        }
    }
    // ---- online softmax per row: row 8 nr + 2t + e lives in lanes g = 0..7 (xor 4, 8, 16) ----
    // Fold: lazy maximum. While no score of the tile exceeds its row's running maximum by more
    // than 8 (base 2), p = 2^(s - m) with the old m (p <= 256: fine in f16 and fp32; l and O stay
    // relative to m): no cross-lane reduction, no rescale. Otherwise the exact update below.
    bool lazy = false;
    if constexpr (FOLD) {
      bool need = false;
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          need |= fmaxf(sv[nr][e], sv[nr][e + 2]) >
                  (lean_softmax ? m_lazy[nr][e] : m_run[nr][e] + 8.f);
      lazy = !__any_sync(0xffffffffu, need);
    }
    if (lazy) {
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool none = m_run[nr][e] == -INFINITY;  // (then every score is -inf)
          const float p0 = none ? 0.f : ex2(sv[nr][e] - m_run[nr][e]);
          const float p1 = none ? 0.f : ex2(sv[nr][e + 2] - m_run[nr][e]);
          sv[nr][e] = p0;
          sv[nr][e + 2] = p1;
          l_run[nr][e] += p0 + p1;
        }
    } else {
      float alpha[NR][2];
      bool moved = false;
#pragma unroll
      for (int nr = 0; nr < NR; ++nr)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float mx = fmaxf(sv[nr][e], sv[nr][e + 2]);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
          const float m_new =
              lean_softmax ? fmax_once(m_run[nr][e], mx) : fmaxf(m_run[nr][e], mx);
          const bool none = m_new == -INFINITY;
          alpha[nr][e] = none ? 1.f : ex2(m_run[nr][e] - m_new);
          moved |= alpha[nr][e] != 1.f;
          const float p0 = none ? 0.f : ex2(sv[nr][e] - m_new);
          const float p1 = none ? 0.f : ex2(sv[nr][e + 2] - m_new);
          sv[nr][e] = p0;
          sv[nr][e + 2] = p1;
          l_run[nr][e] = l_run[nr][e] * alpha[nr][e] + (p0 + p1);
          m_run[nr][e] = m_new;
          m_lazy[nr][e] = m_new + 8.f;
        }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nr = 0; nr < NR; ++nr) {
            o[mt][nr][0] *= alpha[nr][0];
            o[mt][nr][1] *= alpha[nr][1];
            o[mt][nr][2] *= alpha[nr][0];
            o[mt][nr][3] *= alpha[nr][1];
          }
        if constexpr (FOLD) {
#pragma unroll
          for (int nr = 0; nr < NR; ++nr) {
            zacc[nr][0] *= alpha[nr][0];
            zacc[nr][1] *= alpha[nr][1];
          }
        }
      }
    }
    // P^T as the PV B fragment: (keys 2t, 2t+1 | 2t+8, 2t+9; row 8 nr + g).
    uint32_t pb[NR][2];
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
      pb[nr][0] = movmatrix_trans(pack_f32x2(sv[nr][0], sv[nr][1]));  // keys 0..7
      pb[nr][1] = movmatrix_trans(pack_f32x2(sv[nr][2], sv[nr][3]));  // keys 8..15
    }

    // ---- O^T += V^T P^T: m-tile mt, dim-row g -> dim 2 (g MT + mt), dim-row g + 8 -> + 1 ----
    // (folded int4: dim-row g -> dim 32 (mt / 2) + 4 g + 2 (mt % 2), g + 8 -> that + 1.)
    // Key pairs q2 = 0: (2t, 2t+1), 1: (2t+8, 2t+9); per pair (scale_a, scale_b), (shift_a,
    // shift_b).
    if constexpr (kFoldI4) {
      uint32_t vr[2][4];  // V codes: (keys 2t, 2t+1 | 2t+8, 2t+9) x bytes 2g, 2g+1 of block G
      uint32_t cw[2];  // kFlat: the scale / shift pairs of lane (g, t), shuffled out per group
      if constexpr (flatk) {  // (kFlat reads above)
        flat_rows<true>(lf_cur + 16 * kK, lc_cur + 16 * kK, lq & 3, vr, cw);
      } else {
        const int vblk = diet ? 16 * kDietKstr : 16 * kstr;
        ldsm_x4_trans(st_s + vblk + ldm_off, vr[0]);
        ldsm_x4_trans(st_s + vblk + ldm_off + 32, vr[1]);
      }
      // sum_k z_k,G p_k: A row g = the shifts of group min(g, 3) of the key pairs (rows 8..15 and
      // rows 4..7 unused).
      const int gz = g < NG ? g : NG - 1;
      // kDiet: key q's offset from key 2t's (keys 2t, 2t + 1, 2t + 8, 2t + 9).
      constexpr int kVq[4] = {0, kDietKstr, 8 * kDietKstr, 9 * kDietKstr};
      // kDiet: the four keys' coefficient words as one 16-byte load each, paired per group.
      uint32_t s01d[NG], s23d[NG];
      uint32_t za0, za2;
      if constexpr (flatk) {  // (kFlat reads above: pairs from lanes 8 G + t / 8 gz + 4 + t)
        // zb: lane 8 (g & 3) + 4 + t, 8 gz + 4 + t where g < 4 (rows 4..7 of zacc never read)
        za0 = shfl_quadcol(cw[0], zb);
        za2 = shfl_quadcol(cw[1], zb);
      } else {
        uint32_t zw[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
          zw[q] = diet ? lds32_s(st_s + voff_z + kVq[q]) : lds32(st + voff[q] + 4 * gz);
        za0 = prmt(zw[0], zw[1], 0x7632);
        za2 = prmt(zw[2], zw[3], 0x7632);
      }
      if constexpr (diet && !flatk) {  // (kFlat: the pairs come by shuffles below)
        uint32_t c0[4], c1[4];
        lds128_s(st_s + voff[0], c0);
        lds128_s(st_s + voff[0] + kVq[1], c1);
#pragma unroll
        for (int G = 0; G < NG; ++G) s01d[G] = prmt(c0[G], c1[G], 0x5410);
        lds128_s(st_s + voff[0] + kVq[2], c0);
        lds128_s(st_s + voff[0] + kVq[3], c1);
#pragma unroll
        for (int G = 0; G < NG; ++G) s23d[G] = prmt(c0[G], c1[G], 0x5410);
      }
      // (kFlat: A rows g + 8 = group 0's scale pairs, shuffled here for the G = 0 mma below;
      // their zacc rows are never read)
      uint32_t s01_0 = 0u, s23_0 = 0u;
      if constexpr (flatk) {
        s01_0 = shfl_quadcol(cw[0], 0u);
        s23_0 = shfl_quadcol(cw[1], 0u);
      }
      const uint32_t za[4] = {za0, s01_0, za2, s23_0};
#pragma unroll
      for (int nr = 0; nr < NR; ++nr) ptx::mma_f16(zacc[nr], za, pb[nr][0], pb[nr][1]);
      // P scaled per key pair and group: (s_a, s_b) of the coefficient words (loaded per group:
      // four 4-word loads up front spilled; session 6's 8-byte loads ran 9 % slower on the H200).
#pragma unroll
      for (int G = 0; G < NG; ++G) {
        uint32_t s01, s23;
        if constexpr (flatk) {  // (lane 8 G + t by immediates)
          s01 = G == 0 ? s01_0 : shfl_quadcol(cw[0], 8u * G);
          s23 = G == 0 ? s23_0 : shfl_quadcol(cw[1], 8u * G);
        } else if constexpr (diet) {
          s01 = s01d[G];
          s23 = s23d[G];
        } else {
          uint32_t vc[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) vc[q] = lds32(st + voff[q] + 4 * G);
          s01 = prmt(vc[0], vc[1], 0x5410);
          s23 = prmt(vc[2], vc[3], 0x5410);
        }
        uint32_t pbs[NR][2];
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) {
          pbs[nr][0] = hmul2_bits(pb[nr][0], s01);
          pbs[nr][1] = hmul2_bits(pb[nr][1], s23);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t x0 = vr[G / 2][2 * (G & 1)], x1 = vr[G / 2][2 * (G & 1) + 1];
          if (j) {
            x0 >>= 8;
            x1 >>= 8;
          }
          const uint32_t af[4] = {x0 & 0x000f000fu, x0 & 0x00f000f0u, x1 & 0x000f000fu,
                                  x1 & 0x00f000f0u};
#pragma unroll
          for (int nr = 0; nr < NR; ++nr)
            ptx::mma_f16(o[2 * G + j][nr], af, pbs[nr][0], pbs[nr][1]);
        }
      }
    } else {
      __half2 vs[2], vz[2];
#pragma unroll
      for (int q2 = 0; q2 < 2; ++q2) {
        if constexpr (F == KvFormat::int4) {
          const uint32_t ca = lds32(st + voff[2 * q2] + 4 * vcoef);
          const uint32_t cb = lds32(st + voff[2 * q2 + 1] + 4 * vcoef);
          vs[q2] = bits_h2(prmt(ca, cb, 0x5410));
          vz[q2] = bits_h2(prmt(ca, cb, 0x7632));
        } else if constexpr (f8s) {
          const uint32_t ca = lds32_s(st_cur + f8_vs + 8 * q2 * ss_piece);
          const uint32_t cb = lds32_s(st_cur + f8_vs + (8 * q2 + 1) * ss_piece);
          vs[q2] = bits_h2(prmt(ca, cb, 0x5410));
          vz[q2] = bits_h2(prmt(ca, cb, 0x7632));
        } else if constexpr (F == KvFormat::fp8) {
          const char* ssv = st + 32 * kstr + 16 * 4 * HB + 4 * warp;
          const int ka = 2 * t + 8 * q2;
          const uint32_t ca = lds32(ssv + ka * 4 * HB);
          const uint32_t cb = lds32(ssv + (ka + 1) * 4 * HB);
          vs[q2] = bits_h2(prmt(ca, cb, 0x5410));
          vz[q2] = bits_h2(prmt(ca, cb, 0x7632));
        } else {
          vs[q2] = vz[q2] = __float2half2_rn(0.f);
        }
      }
      uint32_t pbv[NR][2];  // the PV B fragments (fp8 fold: P times the key pairs' scales)
#pragma unroll
      for (int nr = 0; nr < NR; ++nr) {
        pbv[nr][0] = pb[nr][0];
        pbv[nr][1] = pb[nr][1];
        if constexpr (kFoldF8) {
          pbv[nr][0] = hmul2_bits(pb[nr][0], h2_bits(vs[0]));
          pbv[nr][1] = hmul2_bits(pb[nr][1], h2_bits(vs[1]));
          // (kF8Solo: A rows g + 8 = the scale pairs, already in registers: no moves; their zacc
          // elements 2, 3 are never read, and every row of an mma is its own dot product)
          const uint32_t za[4] = {h2_bits(vz[0]), f8s ? h2_bits(vs[0]) : h2_bits(vz[0]),
                                  h2_bits(vz[1]), f8s ? h2_bits(vs[1]) : h2_bits(vz[1])};
          ptx::mma_f16(zacc[nr], za, pb[nr][0], pb[nr][1]);  // sum_k z_k p_k, every row
        }
      }
      uint32_t vbuf[4][VC];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        // word of the lane's V run holding dims 2 (g MT + mt), + 1, and the byte inside it
        const int wi = F == KvFormat::int4 ? mt / 4 : F == KvFormat::fp8 ? mt / 2 : mt;
        const bool first_use = F == KvFormat::int4 ? (mt % 4 == 0)
                               : F == KvFormat::fp8 ? (mt % 2 == 0)
                                                    : true;
        if (first_use && wi % VC == 0) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if constexpr (f8s)  // (keys 2t, 2t + 1, 2t + 8, 2t + 9)
              lds128_s(st_cur + f8_v + ((q & 1) + 8 * (q >> 1)) * kstr + 4 * wi, vbuf[q]);
            else lds_words<VC, VAL>(st + voff[q] + code_off + g * (4 * VWN) + 4 * wi, vbuf[q]);
          }
        }
        uint32_t af[4];
#pragma unroll
        for (int q2 = 0; q2 < 2; ++q2) {
          const uint32_t wa = vbuf[2 * q2][wi % VC], wb = vbuf[2 * q2 + 1][wi % VC];
          uint32_t dlo, dhi;  // (key a, key b) of dim d and of dim d + 1
          if constexpr (F == KvFormat::int4) {
            constexpr uint32_t kSel[4] = {0x4400u, 0x5511u, 0x6622u, 0x7733u};
            const uint32_t x = prmt(wa, wb, kSel[mt % 4]);  // bytes [a_j, a_j, b_j, b_j]
            const __half2 lo2 = __hsub2(bits_h2(and_or<0x000f000fu, 0x64006400u>(x)),
                                        bits_h2(0x64006400u));
            const __half2 hi2 = __hfma2(bits_h2(and_or<0x00f000f0u, 0x64006400u>(x)),
                                        bits_h2(0x2c002c00u), bits_h2(0xd400d400u));
            dlo = h2_bits(__hfma2(lo2, vs[q2], vz[q2]));
            dhi = h2_bits(__hfma2(hi2, vs[q2], vz[q2]));
          } else if constexpr (F == KvFormat::fp8) {
            // bytes [a_j, b_j, a_j+1, b_j+1], j = 2 (mt % 2)
            const uint32_t x = prmt(wa, wb, (mt % 2) ? 0x7362u : 0x5140u);
            e4m3x4(x, dlo, dhi);
            if constexpr (!kFoldF8) {
              dlo = h2_bits(__hfma2(bits_h2(dlo), vs[q2], vz[q2]));
              dhi = h2_bits(__hfma2(bits_h2(dhi), vs[q2], vz[q2]));
            }
          } else {
            dlo = prmt(wa, wb, 0x5410u);
            dhi = prmt(wa, wb, 0x7632u);
          }
          af[2 * q2] = dlo;      // a0 / a2: dim-row g
          af[2 * q2 + 1] = dhi;  // a1 / a3: dim-row g + 8
        }
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) ptx::mma_f16(o[mt][nr], af, pbv[nr][0], pbv[nr][1]);
      }
    }

    finish_tile(it);
  }

  griddep_launch_dependents();  // (PDL) the merge may launch; it waits for this grid to complete
  // ---- the warp's partial (O, LSE) of head h, rows r0 + 8 nr + 2t + e ----
  const int64_t base_row = ((b * p.H + h) * p.S + split) * static_cast<int64_t>(p.R) + r0;
  // BulkArgs::stage_out: the rows go to the warp's slice of the (now idle) ring first, rows of
  // D + 4 floats, and then to the workspace as whole rows of 16-byte stores.
  constexpr int kStageRow = D + 4;
  constexpr bool stage_out = (KN & kStage) != 0;
  float* const staged = reinterpret_cast<float*>(ring) + warp * (8 * NR) * kStageRow;
  if constexpr (stage_out) __syncthreads();  // every warp is done with the ring
#pragma unroll
  for (int nr = 0; nr < NR; ++nr)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = l_run[nr][e];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      // Fold: the shift term of each group (int4: from lane 4 G + t; fp8: this lane's).
      float zg[NG];
#pragma unroll
      for (int G = 0; G < NG; ++G) {
        zg[G] = 0.f;
        if constexpr (kFoldI4) zg[G] = __shfl_sync(0xffffffffu, zacc[nr][e], 4 * G + t);
        if constexpr (kFoldF8) zg[G] = zacc[nr][e];
      }
      const int r = 8 * nr + 2 * t + e;
      if (r < rows) {
        const float inv = l > 0.f ? 1.f / l : 0.f;
        float* out = stage_out ? staged + r * kStageRow : p.part_o + (base_row + r) * D;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kFoldI4) {  // subnormal codes: c 2^-24 (dim d) and 16 c 2^-24 (d + 1)
            const int d = 32 * (mt / 2) + 4 * g + 2 * (mt % 2);
            out[d] = fmaf(o[mt][nr][e], 16777216.f, zg[mt / 2]) * inv;
            out[d + 1] = fmaf(o[mt][nr][e + 2], 1048576.f, zg[mt / 2]) * inv;
          } else if constexpr (kFoldF8) {
            const int d = 2 * (g * MT + mt);
            out[d] = (o[mt][nr][e] + zg[0]) * inv;
            out[d + 1] = (o[mt][nr][e + 2] + zg[0]) * inv;
          } else {
            const int d = 2 * (g * MT + mt);
            out[d] = o[mt][nr][e] * inv;  // (the workspace is only 4-byte aligned by contract)
            out[d + 1] = o[mt][nr][e + 2] * inv;
          }
        }
        if (g == 0)
          p.part_lse[base_row + r] = l > 0.f ? (m_run[nr][e] + log2f(l)) * kLn2 : -INFINITY;
      }
    }
  if constexpr (stage_out) {
    __syncwarp();
    constexpr int kLanes = D / 4;  // float4 columns of a row
#pragma unroll
    for (int r = 0; r < 8 * NR; ++r)
      if (r < rows && lane < kLanes)
        *reinterpret_cast<float4*>(p.part_o + (base_row + r) * D + 4 * lane) =
            *reinterpret_cast<const float4*>(staged + r * kStageRow + 4 * lane);
  }
#endif  // sm_90
}

template <KvFormat F, int D, int NR, int VA, int FOLD, bool SOLO, int KN = 0>
void launch_nr(const DecodeParams& p, const BulkArgs& a, const BulkMaps& m, int64_t B,
               cudaStream_t stream) {
  auto kernel = decode_bulk_kernel<F, D, NR, VA, FOLD, SOLO, KN>;
  const int smem = a.nst * a.stage_bytes + ((KN & kTma4) ? 128 : 0);
  // The attributes through common.cuh's per-device cache (two host API calls per decode step
  // otherwise). Two CTAs of ~110 KB per multiprocessor need the largest shared-memory carveout.
  set_kernel_smem(kernel, smem, "decode_attention", "shared memory of the bulk kernel");
  set_func_attribute(reinterpret_cast<const void*>(kernel),
                     cudaFuncAttributePreferredSharedMemoryCarveout,
                     cudaSharedmemCarveoutMaxShared, "decode_attention",
                     "shared-memory carveout of the bulk kernel");
  const int row_chunks = (p.R + 15) / 16;
  const int head_blocks = p.H / a.hb;
  dim3 grid(p.S, head_blocks * row_chunks, static_cast<unsigned>(B));
  launch_maybe_pdl(a.pdl, kernel, grid, dim3(32 * a.hb), static_cast<size_t>(smem), stream, p, a,
                   m);
}

template <KvFormat F, int D, int VA, int FOLD>
void launch_rows(const DecodeParams& p, const BulkArgs& a, const BulkMaps& m, int64_t B,
                 cudaStream_t stream) {
  // The session-7 / 8 knobs (KN) exist only for plan_decode's D-128 instantiations at <= 8 rows
  // and two CTAs per multiprocessor: fp8 contiguous (solo issue + fold), fp8 paged (shared issue,
  // no fold), int4 g4 (fold, shared issue: kTma4 and the probe); elsewhere they are ignored.
  constexpr bool kFp8Solo = F == KvFormat::fp8 && FOLD == 1;   // (with a.solo)
  constexpr bool kFp8Shared = F == KvFormat::fp8 && FOLD == 0;  // (with !a.solo)
  constexpr bool kInt4 = F == KvFormat::int4 && FOLD == 1;      // (with !a.solo)
  if constexpr (D == 128 && (kFp8Solo || kFp8Shared || kInt4)) {
    // (int4: the probe under shared issue (key-pair copies) or with tma under solo issue)
    const bool solo_ok = kFp8Solo ? a.solo : a.solo == (kInt4 && a.tma);
    const int x = (a.probe ? kProbe : 0) | (F == KvFormat::fp8 && a.blocks ? kBlocks8 : 0) |
                  (kInt4 && a.tma ? kTma4 : 0);
    if (x != 0 && solo_ok && p.R <= 8) {
      constexpr bool kS = kFp8Solo;
      if (x == kProbe) return launch_nr<F, D, 1, VA, FOLD, kS, kProbe>(p, a, m, B, stream);
      if constexpr (F == KvFormat::fp8) {
        if (x == kBlocks8) {
          if constexpr (kS) {
            if (a.stage_out)
              return launch_nr<F, D, 1, VA, FOLD, kS, kBlocks8 | kStage>(p, a, m, B, stream);
          }
          return launch_nr<F, D, 1, VA, FOLD, kS, kBlocks8>(p, a, m, B, stream);
        }
        return launch_nr<F, D, 1, VA, FOLD, kS, kBlocks8 | kProbe>(p, a, m, B, stream);
      } else {  // (x == kTma4, or kTma4 | kProbe: session 11's probes of its copy pattern)
        if (x == (kTma4 | kProbe)) {
          if (a.diet)
            return launch_nr<F, D, 1, VA, FOLD, true, kTma4 | kDiet | kProbe>(p, a, m, B, stream);
          return launch_nr<F, D, 1, VA, FOLD, true, kTma4 | kProbe>(p, a, m, B, stream);
        }
        if (a.stage_out)
          return launch_nr<F, D, 1, VA, FOLD, true, kTma4 | kStage>(p, a, m, B, stream);
        if (a.flat)
          return launch_nr<F, D, 1, VA, FOLD, true, kTma4 | kDiet | kFlat>(p, a, m, B, stream);
        if (a.diet) return launch_nr<F, D, 1, VA, FOLD, true, kTma4 | kDiet>(p, a, m, B, stream);
        return launch_nr<F, D, 1, VA, FOLD, true, kTma4>(p, a, m, B, stream);
      }
    }
  }
  // int4 g4 D 128 at 9-16 rows (session 33): the flat kernel's 16-row form (each tile
  // dequantized once for both row groups).
  if constexpr (D == 128 && kInt4) {
    if (a.solo && a.tma && a.flat && !a.probe && p.R > 8 && p.R <= 16)
      return launch_nr<F, D, 2, VA, FOLD, true, kTma4 | kDiet | kFlat>(p, a, m, B, stream);
  }
  // fp8 whole-tile copies under solo issue where the block above does not take them (session
  // 33): 9-16 rows (speculative / multi-token decoding; the per-key copies, 34 a tile from one
  // issuing warp, ran it slower than the f16 path) and D 64 (55 % of copy with per-key copies).
  // (D 256's 256-byte rows: not yet; the tried instantiation left dims 128-255 at 0, see
  // docs/decode.md "Session 33".) a.blocks is set only up to 16 rows (launch_decode_bulk).
  if constexpr ((D == 128 || D == 64) && kFp8Solo) {
    if (a.solo && a.blocks && !a.probe) {
      auto whole = [&](auto nr) {
        constexpr int kNR = decltype(nr)::value;
        if (a.stage_out)
          return launch_nr<F, D, kNR, VA, FOLD, true, kBlocks8 | kStage>(p, a, m, B, stream);
        return launch_nr<F, D, kNR, VA, FOLD, true, kBlocks8>(p, a, m, B, stream);
      };
      if (p.R > 8) return whole(std::integral_constant<int, 2>{});
      return whole(std::integral_constant<int, 1>{});
    }
  }
  if constexpr (D == 256) {  // (<= 8 rows: decode_attention's dispatch; 16 rows would spill)
    if (a.solo) launch_nr<F, D, 1, VA, FOLD, true>(p, a, m, B, stream);
    else launch_nr<F, D, 1, VA, FOLD, false>(p, a, m, B, stream);
  } else if (a.solo) {
    if (p.R > 8) launch_nr<F, D, 2, VA, FOLD, true>(p, a, m, B, stream);
    else launch_nr<F, D, 1, VA, FOLD, true>(p, a, m, B, stream);
  } else {
    if (p.R > 8) launch_nr<F, D, 2, VA, FOLD, false>(p, a, m, B, stream);
    else launch_nr<F, D, 1, VA, FOLD, false>(p, a, m, B, stream);
  }
}

// fold (DecodePlan::fold_scales: 0 off, 1 on): only where fold_applies (int4 with 4 groups at
// D 128, whose code words are 16-byte aligned; fp8).
template <KvFormat F, int D>
void launch_fd(const DecodeParams& p, const BulkArgs& a, const BulkMaps& m, int va, int fold,
               int64_t B, cudaStream_t stream) {
  if constexpr (F == KvFormat::int4) {
    if constexpr (D == 128) {
      if (fold) return launch_rows<F, D, 16, 1>(p, a, m, B, stream);
    }
    dispatch_int<4, 8, 16>(va, "decode_attention", "alignment (bulk kernel)", [&](auto v) {
      launch_rows<F, D, decltype(v)::value, 0>(p, a, m, B, stream);
    });
  } else if constexpr (F == KvFormat::fp8) {
    if (fold) launch_rows<F, D, 16, 1>(p, a, m, B, stream);
    else launch_rows<F, D, 16, 0>(p, a, m, B, stream);
  } else {
    launch_rows<F, D, 16, 0>(p, a, m, B, stream);
  }
}

// Heads per CTA and the stage geometry for a cache; hb 0 = the bulk kernel does not apply.
// Compute capability major of the current device (cp.async.bulk and mbarrier tx counts: >= 9),
// 0 where lowbit's device code for it lacks them (code_arch: an older build, or older PTX
// JIT-compiled for this GPU).
int device_major() {
  const CodeArch c = code_arch();  // sm 0 on a CUDA error: the ring kernel runs instead
  return c.ptx >= 90 ? c.sm / 10 : 0;
}

// Whether DecodePlan::fold_scales changes the arithmetic for this cache.
bool fold_applies(const KvCache& cache) {
  return (cache.format == KvFormat::int4 && cache.n_groups == 4 && cache.head_dim() == 128) ||
         cache.format == KvFormat::fp8;
}

// blocks8: fp8 where tiles are contiguous: one copy per kind and tile into an unpadded stage
// (the launch's choice for its kBlocks8 instantiations). tma4: DecodePlan::bulk_tma (folded
// int4: BulkArgs::tma).
BulkArgs bulk_geometry(const KvCache& cache, bool fold, int stages = 0, bool blocks8 = false,
                       bool tma4 = false) {
  BulkArgs a;
  a.hb = 0;
  if (device_major() < 9) return a;
  const CacheArgs c = make_cache_args(cache);
  const int D = cache.head_dim();
  const KvFormat f = cache.format;
  if (!(f == KvFormat::int4 || f == KvFormat::fp8 || f == KvFormat::f16) ||
      !(D == 64 || D == 128 || D == 256))
    return a;
  const int64_t H = cache.kv_heads();
  const int rank = cache.paged() ? 3 : 4;
  // Heads adjacent (head stride = row bytes), 16-byte aligned bases and key / batch strides.
  const int head_dim_idx = rank - 2;  // (b, j, h) or (row, h): h is the last of the strided dims
  if (c.k_st[head_dim_idx] != c.row_bytes || c.v_st[head_dim_idx] != c.row_bytes) return a;
  if (reinterpret_cast<uintptr_t>(c.k) % 16 || reinterpret_cast<uintptr_t>(c.v) % 16) return a;
  for (int d = 0; d < rank - 2; ++d)
    if (c.k_st[d] % 16 || c.v_st[d] % 16) return a;
  if (f == KvFormat::fp8) {
    if (c.kss_st[head_dim_idx] != 1 || c.vss_st[head_dim_idx] != 1) return a;
    if (reinterpret_cast<uintptr_t>(c.kss) % 16 || reinterpret_cast<uintptr_t>(c.vss) % 16)
      return a;
    for (int d = 0; d < rank - 2; ++d)
      if ((c.kss_st[d] * 4) % 16 || (c.vss_st[d] * 4) % 16) return a;
  }
  int hb = 1;
  while (hb * 2 <= kMaxHeads && H % (hb * 2) == 0 &&
         (hb * 2 * c.row_bytes <= 1024 || (hb * c.row_bytes) % 16 != 0))
    hb *= 2;
  // Pieces must be 16-byte multiples (int4 rows of 68 / 72 bytes: 4 / 2 heads at least).
  if ((hb * c.row_bytes) % 16 != 0) return a;
  if (f == KvFormat::fp8 && (4 * hb) % 16 != 0) return a;  // scale/shift pieces: >= 4 heads
  a.hb = hb;
  if (f == KvFormat::fp8) {
    const int key_dim = rank - 3;  // (b, j, h): j; (row, h): row
    a.ss_block = c.kss_st[key_dim] == hb && c.vss_st[key_dim] == hb;
  }
  // A tile's K / V pieces are one block each (key stride = piece; fp8: scale/shift blocks too).
  const int64_t pc = static_cast<int64_t>(hb) * c.row_bytes;
  a.contig = c.k_st[rank - 3] == pc && c.v_st[rank - 3] == pc &&
             (f != KvFormat::fp8 || a.ss_block);
  // fp8 blocks: key i at i * piece. Folded int4 (ldmatrix): 16-byte key offsets
  // (key_offset16), in pairs of keys where adjacent; else 32-byte ones (key_offset).
  if (blocks8 && f == KvFormat::fp8 && a.contig) {
    a.blocks = true;
    a.kstr = hb * c.row_bytes;
  } else if (tma4 && fold && f == KvFormat::int4 && pc / 4 + 4 <= 256) {
    a.tma = true;  // an odd number of 16-byte units per key (the box: <= 256 elements)
    a.kstr = static_cast<int>((pc / 16) % 2 == 0 ? pc + 16 : pc);
  } else if (fold && f == KvFormat::int4) {
    a.pairs = c.k_st[rank - 3] == pc && c.v_st[rank - 3] == pc;
    if (a.pairs) a.kstr = (2 * hb * c.row_bytes + 112 + 31) / 32 * 16;
    else a.kstr = (hb * c.row_bytes + 112 + 15) / 16 * 16;
  } else {
    a.kstr = (hb * c.row_bytes + 96 + 31) / 32 * 32;
  }
  a.stage_bytes = 32 * a.kstr + (f == KvFormat::fp8 ? 32 * 4 * hb : 0);
  // Stages: as many as fit two CTAs per multiprocessor (~110 KB each), 2..4.
  const int budget = 110 * 1024;
  a.nst = budget / a.stage_bytes;
  a.nst = a.nst > 4 ? 4 : a.nst;
  if (a.nst < 2) a.hb = 0;
  // DecodePlan::bulk_stages: that many stages where they fit two CTAs per multiprocessor (113 KB
  // each, the tensor-map path's 128 bytes of alignment slack included). Session 6's deeper rings
  // with one CTA per multiprocessor lost (fp8 6 stages +14..+57 %) and are gone.
  if (a.hb > 0 && stages > 0) {
    const int most = (113 * 1024 - 128) / a.stage_bytes;
    a.nst = stages < 2 ? 2 : stages;
    a.nst = a.nst > most ? most : a.nst;
  }
  return a;
}

// The K / V tensor maps of BulkArgs::tma (see BulkMaps); false where the driver refuses them.
bool encode_bulk_maps(const KvCache& cache, const BulkArgs& a, BulkMaps* m) {
  const auto enc = tensor_map_encoder();
  if (!enc) return false;
  const CacheArgs c = make_cache_args(cache);
  const bool paged = cache.paged();
  const uint64_t piece = static_cast<uint64_t>(a.hb) * c.row_bytes;
  const uint64_t keys = static_cast<uint64_t>(paged ? cache.k.shape[0] : cache.k.shape[1]);
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(a.kstr / 4), 1, 16, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  for (int which = 0; which < 2; ++which) {
    const int64_t* st = which ? c.v_st : c.k_st;
    const uint64_t key_st = static_cast<uint64_t>(paged ? st[0] : st[1]);
    // (paged: a batch dimension of 1 whose stride only has to be a valid one)
    const uint64_t batch_st = paged ? key_st * keys : static_cast<uint64_t>(st[0]);
    if (batch_st >= (uint64_t{1} << 40)) return false;
    const cuuint64_t dims[4] = {piece / 4, static_cast<cuuint64_t>(cache.kv_heads() / a.hb), keys,
                                paged ? 1 : static_cast<cuuint64_t>(cache.batch())};
    const cuuint64_t strides[3] = {piece, key_st, batch_st};
    if (enc(which ? &m->v : &m->k, CU_TENSOR_MAP_DATA_TYPE_UINT32, 4,
            const_cast<char*>(which ? c.v : c.k), dims, strides, box, unit,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  return true;
}

}  // namespace

bool decode_bulk_supported(const KvCache& cache) { return bulk_geometry(cache, false).hb > 0; }

int decode_bulk_heads(const KvCache& cache) { return bulk_geometry(cache, false).hb; }

bool decode_bulk_folds(const KvCache& cache) {
  return fold_applies(cache) && bulk_geometry(cache, true).hb > 0;
}

void launch_decode_bulk(const DecodeParams& p, const KvCache& cache, const DecodePlan& plan,
                        cudaStream_t stream) {
  const int64_t B = plan.batch;
  const int fold = fold_applies(cache) ? plan.fold_scales : 0;
  const int issue = plan.bulk_issue;
  const bool solo = issue == 1;
  // fp8 blocks change the stage layout: only where launch_rows runs a kBlocks8 instantiation.
  // int4: the probe under shared issue, tensor-map tiles under solo issue (with or without the
  // probe: session 11).
  // fp8 solo + fold at D 64 / 128 up to 16 rows: launch_rows' whole-tile instantiations
  // (session 33; before, D 128 at <= 8 rows only).
  const int D = cache.head_dim();
  const bool fp8_whole = cache.format == KvFormat::fp8 && fold != 0 && solo &&
                         plan.bulk_probe == 0 && p.R <= 16 && (D == 64 || D == 128);
  const bool knobs = fp8_whole ||
                     (D == 128 && p.R <= 8 &&
                      ((cache.format == KvFormat::fp8 && (fold != 0) == solo) ||
                       (cache.format == KvFormat::int4 && fold == 1 &&
                        (solo ? plan.bulk_tma : plan.bulk_probe != 0)))) ||
                     (D == 128 && p.R <= 16 && cache.format == KvFormat::int4 && fold == 1 &&
                      solo && plan.bulk_tma && plan.bulk_probe == 0);
  const bool blocks8 = knobs;  // (fp8 where the tile's blocks are contiguous: bulk_geometry)
  const bool tma4 = knobs && solo && plan.bulk_tma;
  const CacheArgs c = make_cache_args(cache);
  BulkArgs a = bulk_geometry(cache, fold != 0, plan.bulk_stages, blocks8, tma4);
  BulkMaps maps;  // (zero bytes unless a.tma)
  std::memset(&maps, 0, sizeof(maps));
  if (a.tma && a.hb > 0 && !encode_bulk_maps(cache, a, &maps))
    a = bulk_geometry(cache, fold != 0, plan.bulk_stages);
  // The launch's settings on top of the geometry (re-applied below where the geometry changes).
  auto settle = [&](BulkArgs a) {
    // DecodePlan::bulk_stages on a grid of at most one CTA per multiprocessor (plan_decode's fp8
    // plan at D 128 since session 33): the ring may take the multiprocessor's shared memory.
    if (a.hb > 0 && plan.bulk_stages > 0 && !a.tma) {
      const int64_t ctas = int64_t{plan.n_splits} * (p.H / a.hb) * ((p.R + 15) / 16) * B;
      if (ctas <= plan.multiprocessors) {
        const int most = (kOneCtaSmem - 128) / a.stage_bytes;
        const int want = plan.bulk_stages < 2 ? 2 : plan.bulk_stages;
        a.nst = want < most ? want : most;
        a.nst = a.nst > kMaxStages ? kMaxStages : a.nst;
      }
    }
    a.solo = solo;
    a.probe = plan.bulk_probe != 0;
    a.probe_mode = plan.bulk_probe;
    // Issuing warps of the shared mode: all HB (0), 4 (2; enough lanes for fp8's 64 copies per
    // tile with a copy per key and kind).
    a.issuers = issue == 2 ? 4 : a.hb;
    a.issuers = a.issuers > a.hb ? a.hb : a.issuers;
    a.pdl = plan.launch_pdl;
    const int staged_bytes = a.hb * (p.R > 8 ? 16 : 8) * (D + 4) * 4;
    a.stage_out = plan.bulk_stage_out && reinterpret_cast<uintptr_t>(p.part_o) % 16 == 0 &&
                  a.nst * a.stage_bytes >= staged_bytes;
    a.lean = plan.bulk_lean_start;
    LOWBIT_CHECK(a.hb > 0, "decode_attention", "cache", "layout not supported by the bulk kernel");
    // kProbeFlat copies a tile's blocks whole: elsewhere it falls back to the kernel's own copies.
    if (a.probe_mode == kProbeFlat && !(a.tma && a.contig)) a.probe_mode = kProbeCopies;
    // DecodePlan::bulk_diet: kDiet, only at its compile-time geometry (8 heads of 80-byte rows,
    // key stride 656 in the stage, 4 stages).
    a.diet = plan.bulk_diet && a.tma && a.hb == kDietHb && c.row_bytes == kDietRow &&
             a.kstr == kDietKstr && a.nst == kDietStages && !a.stage_out;
    // DecodePlan::bulk_flat (1; 2 and 3, the session-14 forms folded into it, too): kFlat where
    // kDiet runs and a tile's K / V block is contiguous (heads per CTA = Hkv = 8; paged: any page
    // size, a tile never crosses a page); not with the probes. The stage becomes the blocks
    // themselves (key stride 640); elsewhere the kDiet kernel.
    a.flat = plan.bulk_flat != 0 && a.diet && a.contig && !a.probe;
    return a;
  };
  a = settle(a);
  // 9-16 rows: the tensor-map tiles only in the flat kernel's 16-row form (session 33); where it
  // does not apply, the 16-row kernel's own geometry.
  if (a.tma && p.R > 8 && !a.flat) a = settle(bulk_geometry(cache, fold != 0, plan.bulk_stages));
  if (a.flat) {
    a.kstr = kFlatKstr;
    a.stage_bytes = 32 * kFlatKstr;
  }
  // Alignment of every row's code words inside the stage (int4: rows of 4 (groups + D / 8) bytes,
  // codes at byte 4 groups).
  int va = 16;
  while (va > 4 && (c.row_bytes % va != 0 || (4 * c.n_groups) % va != 0)) va /= 2;
  if (cache.format != KvFormat::int4) va = 16;
  dispatch_int<64, 128, 256>(D, "decode_attention", "D (bulk kernel)", [&](auto d) {
    constexpr int kD = decltype(d)::value;
    switch (cache.format) {
      case KvFormat::int4: launch_fd<KvFormat::int4, kD>(p, a, maps, va, fold, B, stream); break;
      case KvFormat::fp8: launch_fd<KvFormat::fp8, kD>(p, a, maps, va, fold, B, stream); break;
      case KvFormat::f16: launch_fd<KvFormat::f16, kD>(p, a, maps, va, 0, B, stream); break;
      default: check::fail("decode_attention", "cache.format", "no bulk kernel for bf16");
    }
  });
}

}  // namespace decode_detail
}  // namespace cuda
}  // namespace lowbit
