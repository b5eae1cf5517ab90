// Decode attention over a quantized, paged KV cache (SPEC §4): KV formats (fp16, bf16, int4 in
// xformers' layout, fp8 e4m3 with scale/shift), quantize-and-append, split-K decode attention with
// a host-side plan and a caller-owned workspace, and the LSE merge of partial results (+ its
// backward).
//
// Formats (docs/decode.md restates them with worked examples):
//   int4: each row of a head is int32 words [coef_0 .. coef_{n_groups-1} | D/8 code words];
//         coef_g = fp16 scale (low 16 bits) | fp16 shift (high 16 bits); element 8i+j of the row
//         is bits [4j, 4j+4) of code word i; group g covers elements [g*D/n_groups, (g+1)*D/n_g).
//         value = code * scale + shift.
//   fp8:  D/4 int32 words, element 4i+j at bits [8j, 8j+8) of word i (e4m3fn), plus one int32 per
//         (row, head) in a separate tensor: fp16 scale (low) | fp16 shift (high).
//         value = e4m3 * scale + shift.
// The products code*scale and e4m3*scale are exact in fp32 (4 x 11 significant bits), so the
// dequantized value has one rounding on every backend.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "lowbit/dtype.h"
#include "lowbit/tensor.h"

namespace lowbit {

enum class KvFormat : uint8_t { f16, bf16, int4, fp8 };
const char* kv_format_name(KvFormat);

// A KV cache: non-owning views. Two layouts:
//   contiguous: k, v (B, L, Hkv, Dp); fp8 scale/shift (B, L, Hkv) int32; block_tables unset
//               (ndim 0).
//   paged:      k, v (P * page_size, Hkv, Dp) pools; fp8 scale/shift (P * page_size, Hkv) int32;
//               block_tables (B, max_pages) int32 of page indices in [0, P); page_size a multiple
//               of 16. Logical key j of sequence b is row block_tables[b][j / page_size] *
//               page_size + j % page_size of the pool.
// Dp = D (f16, bf16; dtype f16 / bf16), n_groups + D/8 (int4; dtype i32), D/4 (fp8; dtype i32).
// Only the innermost dimension must be contiguous. Entries of block_tables past a sequence's
// pages are never read (may hold -1).
struct KvCache {
  KvFormat format = KvFormat::f16;
  int n_groups = 1;                      // int4: 1, 2, 4 or 8 (fp8, f16, bf16: 1)
  TensorView k, v;                       // see above
  TensorView k_scale_shift, v_scale_shift;  // fp8 only: (B, L, Hkv) or (P*page, Hkv) int32
  TensorView block_tables;               // (B, max_pages) int32; ndim 0 = contiguous layout
  int page_size = 0;                     // paged only
  TensorView seq_len;                    // (B) int32: keys [0, seq_len[b]) are valid

  bool paged() const { return block_tables.ndim != 0; }
  int64_t batch() const;       // B
  int64_t kv_heads() const;    // Hkv
  int64_t capacity() const;    // keys a sequence can hold: L, or max_pages * page_size
  int head_dim() const;        // D, from the packed last dimension and the format
};

// Quantizes k_new, v_new (B, Mnew, Hkv, D) f32/f16/bf16 and writes token t of sequence b at
// logical position positions[b] + t (positions (B) int32). seq_len is not changed: the caller
// advances it. f16/bf16 caches store the values rounded to their dtype. Validation on the CPU
// backend reads positions and block tables (nothing is written on error); the CUDA kernel skips
// tokens whose position or page index falls outside the cache, and never writes out of bounds.
void kv_append(KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const TensorView& positions, Context& ctx);

// Split-K plan: a value type. Splits come from the batch, heads, the cache capacity (or
// max_seq_len when given) and the device's multiprocessor count (queried, never hard-coded) or
// the CPU thread count. Fields are public so a caller (or a test) can pick its own split; the
// run checks them.
struct DecodePlan {
  Device device = Device::cpu;
  int64_t batch = 0, kv_heads = 0, capacity = 0;
  int mq = 1, group = 1, head_dim = 0;  // Mq, G = Hq / Hkv, D
  KvFormat format = KvFormat::f16;
  int n_splits = 1;                     // key chunks per (batch, kv head)
  int64_t split_size = 0;               // keys per chunk, a multiple of 16
  int multiprocessors = 0;              // what the plan was made for (0 on the CPU)
  // CUDA: no effect since session 4 (the smem-ring tensor-core kernel it selected, with
  // streaming off, was retired: slower than the ring / bulk kernels at every measured shape).
  // plan_decode still sets it for fp8 caches; kept for source compatibility.
  bool tensor_cores = false;
  // CUDA: run the streaming kernels (the bulk-copy kernel below, else the per-warp cp.async-ring
  // kernel; int4, fp8, f16 caches; D 64, 128). plan_decode sets it where it applies, with more,
  // shorter splits. False (and D 256, bf16) runs the CUDA-core kernel. docs/decode.md.
  bool streaming = false;
  // CUDA: no effect since session 4 (round 1's register-streaming kernel it selected was
  // retired); kept for source compatibility.
  bool stream_registers = false;
  // CUDA, with streaming: true (default) runs the bulk-copy kernel where the cache layout allows it (int4 / fp8 / f16, D 64 / 128, heads adjacent, 16-byte aligned
  // strides; fp8 needs 4 | Hkv): one CTA streams contiguous 16-key tiles of up to 8 KV heads with
  // cp.async.bulk, one warp per head, keys on the mma's M side. false (or another layout) runs the
  // per-warp cp.async-ring kernel. docs/decode.md "Bulk kernel".
  bool bulk_copy = true;
  // CUDA, bulk kernel only (plan_decode sets 1 for int4 and contiguous fp8 caches, 0 otherwise):
  // fold the dequantization scale / shift out of the per-element arithmetic. int4 (4 groups,
  // D 128) and fp8 caches: K codes go to the mma as exact f16 values (int4: the nibbles as f16
  // subnormals c * 2^-24), the scores are sum_g s_g (q_g . c_g) + sum_g z_g sum(q_g); V codes
  // likewise, with P scaled per key (and group) and sum_k z_k p_k added per row. Different
  // roundings from the default (K/V values are not rounded to f16), same tolerance. Other caches
  // ignore it.
  // 0: off; 1: on (int4: codes as f16 subnormals). Session 8 removed 2 (int4 codes as
  // magic-number f16, H200 run 7: 2.3 % slower) and the rotated tile walk bulk_stagger (within
  // +-3 %). docs/decode.md "Folded scales".
  int fold_scales = 0;
  // CUDA, bulk kernel: who issues a tile's bulk copies. 0: every warp a share of them, after a
  // CTA barrier per tile (session 3). 1 ("solo"): one warp per tile, in turn; each warp releases
  // a stage on an mbarrier when done with it and the next issuer waits on that (no CTA barrier).
  // Same arithmetic and order: the bits equal 0's. plan_decode sets 1 for f16 caches, fp8
  // caches (contiguous since H200 run 9: 6-12 % faster; paged where tiles are copied whole since
  // session 8) and int4 g4 D 128 with bulk_tma (session 8), else 0; docs/decode.md "Solo issue".
  // 2: as 0 (CTA barrier per tile), but only 4 of the CTA's warps issue the copies (fewer
  // per-tile issue setups; plan_decode's choice for the other int4 layouts since H200 run 13;
  // session 8 removed 3, two issuing warps: slower). The bits equal 0's.
  int bulk_issue = 0;
  // CUDA, bulk kernel: stages of its shared-memory ring (0: automatic, as many as fit two CTAs per
  // multiprocessor in ~110 KB each, at most 4: int4 g4 D 128 4, fp8 / f16 D 128 3). 2..8 asks for
  // that many where they still fit two CTAs per multiprocessor (fewer otherwise; session 6's
  // one-CTA rings lost and were removed in session 8). On a grid of at most one CTA per
  // multiprocessor (plan_decode's fp8 plan at D 128 with 8 KV heads since session 33) up to 220
  // KB of ring (fp8 D 128: 6 stages); plan_decode asks 4 there on paged caches. Same arithmetic
  // and order: the bits equal 0's.
  int bulk_stages = 0;
  // CUDA: merge the splits with one CTA per (batch, kv head, query row, 32 dims) whose split
  // weights go through shared memory (all of a thread's partial-output loads in flight at once
  // up to 256 splits) instead of one CTA per row (B 1, L 131072: 256 splits on 32 CTAs).
  // Deterministic; a different rounding order (same tolerance). Up to 8192 splits (else the
  // narrow merge runs).
  bool merge_wide = false;
  // CUDA (session 9; plan_decode sets it since H200 run 24: B 64 -4.1 / -2.5 % int4 / fp8): merge
  // the splits with one warp per (batch, kv head, query row), 8 rows per CTA, where D = 128 and
  // n_splits <= 16 (else the CTA-per-row merge): lane l owns dims [4 l, 4 l + 4) and the LSEs and
  // partial rows are loaded together. The same operations in the same order as the CTA-per-row
  // merge: the bits equal its. merge_wide takes precedence; with merge_wide and <= 256 splits
  // the flag makes the wide merge load its partial rows before its LSE pass (same bits).
  bool merge_warp = false;
  // CUDA, bulk kernel: launch it and the split merge as programmatic dependent launches (sm_90):
  // each becomes resident while the kernel before it finishes and waits for it in its first
  // instruction (hides a launch gap per kernel). Same results; false: ordinary launches.
  bool launch_pdl = true;
  // CUDA, bulk kernel, BENCH ONLY (the output is NOT attention; partial outputs 0, LSE -inf):
  // read-pattern probes of the split kernel's bytes (session 11, issue 7). 0: off. 1: the kernel
  // issues and waits for every copy of the split exactly as plan_decode's kernel, but does no
  // math (int4 g4: the tensor-map tiles under solo issue, with bulk_diet its lagged refill; under
  // bulk_issue 2 the key-pair copies). 2: as 1, but the int4 tensor-map kernel copies a full
  // tile's K and V by one 1-D bulk copy each (the tile's 16 x HB x 80 contiguous bytes; heads
  // per CTA = Hkv), no tensor map (elsewhere as 1). 3: no reads at all (kernel start,
  // partial-row writes and the split merge: the fixed cost of a call). (H200 run 33 deleted the
  // ld.global.nc and cp.async probes, former values 3 and 5; no-reads was 4.) docs/decode.md
  // "Session 11".
  int bulk_probe = 0;
  // CUDA, bulk kernel (session 8): int4 g4 D 128 with folded scales, solo issue (bulk_issue 1),
  // <= 8 query rows: a full tile's K and V each arrive by ONE tensor-map copy (TMA,
  // cp.async.bulk.tensor) issued by warp n mod 8 for tile n, instead of 8 key-pair bulk copies
  // per kind; the box is one key's piece of the CTA's heads plus 16 zero-filled bytes, so the
  // stage keeps a key stride of an odd number of 16-byte units (ldmatrix phases free of bank
  // conflicts) in natural key order (the pair copies' stage permutes the keys: the fp32 sums
  // round differently, about 1 value in 1000 by one f16 ulp). Partial tiles keep per-key copies.
  // plan_decode sets it with bulk_issue 1 for int4 g4 D 128 at <= 8 rows (H200 run 19: 0.7-1.9 %
  // faster than the pair copies with bulk_issue 2); other layouts and the shared issue ignore it;
  // a refused tensor map falls back to the pair copies. docs/decode.md "Tensor-map tiles".
  bool bulk_tma = false;
  // CUDA, bulk kernel (session 9; plan_decode sets it for fp8 since H200 run 25: B 1 -3.1 %,
  // (16, 32768, 64, 8) -4.5 %): each warp writes its partial output rows to shared memory
  // first (the ring is idle by then) and then to the workspace as whole rows of 16-byte stores,
  // instead of two 4-byte stores per fragment element scattered over its rows (8 rows x 8
  // positions per store). int4 g4 D 128 with bulk_tma and fp8 D 128 whole-tile copies (solo +
  // fold) at <= 8 rows, where the workspace is 16-byte aligned; elsewhere ignored. Same values:
  // the bits equal false's.
  bool bulk_stage_out = false;
  // CUDA, bulk kernel (session 9; plan_decode sets it for int4 and contiguous fp8 caches since
  // H200 run 25: 0.4-1 %): a leaner kernel start for int4 g4 D 128 with bulk_tma and fp8
  // D 128 whole-tile copies (<= 8 rows; elsewhere ignored): the sequence length and the first
  // block-table entry are loaded before the ring is zeroed, and contiguous caches zero it only
  // where a split ends in a partial tile (full tiles overwrite every byte the math reads). Same
  // arithmetic: the bits equal false's.
  bool bulk_lean_start = false;
  // CUDA, bulk kernel (session 10, issue 7; plan_decode sets it for int4 g4 D 128 at <= 8 rows
  // since H200 run 30, where it applies: B 64, L 8192 0.1816 -> 0.1726 ms contiguous, 0.1985 ->
  // 0.1831 paged 16; B 1, L 131072 0.0571 -> 0.0539 / 0.0623 -> 0.0572; (16, 32768, 64, 8)
  // 0.1830 -> 0.1753 / 0.2019 -> 0.1863; same bits): the tensor-map kernel (bulk_tma, solo
  // issue) with 8 KV heads per CTA (Hkv a multiple of 8) and 4 stages on a leaner per-tile
  // path: the stage geometry and stage count as compile-time constants with every stage access
  // relative to one per-lane shared address, the V coefficient words as 16-byte loads, the
  // stage / barrier / key-count addresses and the issuing turn advanced incrementally, the
  // no-mask test from the key count alone (SASS: 250 instructions per 16-key tile and warp
  // against 309); and the issuing warp refills the previous tile's stage, not the one it has
  // just finished (its wait for the other warps' release is then nearly always already met).
  // Other layouts, other stage counts and bulk_stage_out: the kernel without it. Same
  // arithmetic: the bits equal false's. docs/decode.md "Session 10".
  bool bulk_diet = false;
  // CUDA, bulk kernel (session 14, issue 7; plan_decode sets 1 wherever it sets bulk_diet; H200
  // run 53, 0 (the tensor-map boxes) / 1, ms: B 64, L 8192 contiguous 0.1723 / 0.1629, paged 16
  // 0.1830 / 0.1696; B 1, L 131072 0.0541 / 0.0516; (16, 32768, 64, 8) 0.1750 / 0.1653; same
  // bits). 1 = the bulk_diet kernel (int4 g4 D 128, 8 KV heads per CTA = Hkv, <= 8 rows, 4
  // stages) with each full tile's K and V fetched by ONE 1-D bulk copy each (cp.async.bulk of the
  // tile's contiguous 16 x 640 bytes, no tensor map) into an unpadded stage (key stride 640
  // bytes, not the box's 656), read by ldmatrix rows whose 16-byte column (coefficients or one of
  // 4 code blocks) is rotated by the lane's key class, so that an 8-row phase spans 4 bank groups
  // (2 wavefronts, the least: a head's 80 bytes cover only 5 of the 8 groups), put back in order
  // by selects; the coefficient words reach the lanes that need them by shuffles from immediate
  // source lanes; the stage's barriers and key count sit in one static block (one advanced
  // barrier address). Same arithmetic in the same order: the bits equal 0's (the tensor-map
  // boxes). Applies where bulk_diet does and the tile's block is contiguous (heads per CTA = Hkv
  // = 8; contiguous caches and paged ones, any page size: a tile never crosses a page); elsewhere
  // (Hkv 16 or more, other kernels) ignored. 0-3: 2 and 3 (session 14's second and third forms,
  // folded into 1 in session 15, whose first form was deleted) are accepted for compatibility and
  // run 1; other values are rejected. docs/decode.md "Session 14", "Session 15".
  int bulk_flat = 0;
};
DecodePlan plan_decode(const KvCache& cache, int Mq, int Hq, int D, Context& ctx,
                       int64_t max_seq_len = 0);
// Bytes of the workspace decode_attention needs (partial outputs and LSEs), on plan.device.
size_t workspace_bytes(const DecodePlan& plan);

// out = softmax(q k^T * sm_scale + bias, masked) v per (batch, kv head), split-K with LSE merge.
//   q       (B, Mq, Hkv, G, D) f16/bf16 (f32 too on the CPU), innermost contiguous
//   out     (B, Mq, Hkv, G, D) same dtype as q, innermost contiguous
//   lse_out (B, Mq, Hkv, G) f32 natural-log LSE of the scaled, biased scores, or nullptr
//   bias    (B, Hkv, G, Mq, Mkv) f32/f16/bf16 additive, Mkv = cache.capacity(), or nullptr
//   sm_scale 0 = 1/sqrt(D). causal (Mq > 1): query i sees keys j <= seq_len - Mq + i.
// Rows with no visible key give out 0 and lse -inf. No allocation and no host synchronization on
// CUDA: capturable in a CUDA graph. workspace: workspace_bytes(plan) bytes on the device.
void decode_attention(const TensorView& q, const KvCache& cache, const DecodePlan& plan,
                      void* workspace, TensorView out, TensorView* lse_out,
                      const TensorView* bias, float sm_scale, bool causal, Context& ctx);

// Merge of partial attention results over disjoint key sets (cascade / context parallel):
//   LSE = log sum_i exp(lse_i),  out = sum_i exp(lse_i - LSE) * out_i; all parts -inf -> 0, -inf.
//   outs[i] (..., D) f32/f16/bf16 with their own strides (innermost contiguous), lses[i] (...) f32,
//   out (..., D) f32/f16/bf16, lse_out (...) f32 or nullptr. Leading shapes agree (rank <= 5).
void merge_attention(const TensorView* outs, const TensorView* lses, int n_parts, TensorView out,
                     TensorView* lse_out, Context& ctx);
// Stacked form: outs (n, ..., D), lses (n, ...).
void merge_attention(const TensorView& outs, const TensorView& lses, TensorView out,
                     TensorView* lse_out, Context& ctx);
// Backward: given the forward's inputs and outputs (out, lse) and the gradients grad_out (..., D)
// and grad_lse (...) (nullptr = 0), writes grad_outs[i] = w_i grad_out and
// grad_lses[i] = w_i (grad_lse + sum_d (out_i - out) grad_out), w_i = exp(lse_i - lse)
// (0 where lse = -inf). Gradients f32 (grad_outs may be f16/bf16 too).
void merge_attention_backward(const TensorView* outs, const TensorView* lses, int n_parts,
                              const TensorView& out, const TensorView& lse,
                              const TensorView& grad_out, const TensorView* grad_lse,
                              TensorView* grad_outs, TensorView* grad_lses, Context& ctx);

// ---- the row codec (host and device; the CPU and CUDA backends share it bit for bit) ----------
namespace kv {

// The fp16 scale (low half) and shift (high half) of an int4 coefficient word or an fp8
// scale/shift word, as fp32.
LOWBIT_HD float coef_scale(uint32_t coef) {
  return dt::f16_to_f32(static_cast<uint16_t>(coef & 0xffffu));
}
LOWBIT_HD float coef_shift(uint32_t coef) { return dt::f16_to_f32(static_cast<uint16_t>(coef >> 16)); }
// Dequantized int4 value: code * scale + shift (the product is exact in fp32); the _at form
// takes the coefficient word's scale and shift already converted.
LOWBIT_HD float int4_value_at(uint32_t code, float scale, float shift) {
  return static_cast<float>(code) * scale + shift;
}
LOWBIT_HD float int4_value(uint32_t code, uint32_t coef) {
  return int4_value_at(code, coef_scale(coef), coef_shift(coef));
}
// Dequantized fp8 value: e4m3 * scale + shift (the product is exact in fp32).
LOWBIT_HD float fp8_value_at(uint32_t byte, float scale, float shift) {
  return dt::e4m3_to_f32(static_cast<uint8_t>(byte)) * scale + shift;
}
LOWBIT_HD float fp8_value(uint32_t byte, uint32_t scale_shift) {
  return fp8_value_at(byte, coef_scale(scale_shift), coef_shift(scale_shift));
}
LOWBIT_HD uint32_t pack_coef(uint16_t scale_f16, uint16_t shift_f16) {
  return static_cast<uint32_t>(scale_f16) | (static_cast<uint32_t>(shift_f16) << 16);
}

// int4 code of x for a group: clamp(floor((x - shift) / scale + 0.5), 0, 15), all fp32; a zero
// scale (constant group) and NaN give 0.
LOWBIT_HD uint32_t int4_code(float x, float scale, float shift) {
  if (!(scale != 0.f)) return 0;
  float t = floorf((x - shift) / scale + 0.5f);
  if (!(t > 0.f)) return 0;  // also NaN
  return t >= 15.f ? 15u : static_cast<uint32_t>(t);
}

// Quantizes one row x (D) into words (n_groups + D/8): per group scale = fp16((max - min) / 15),
// shift = fp16(min).
LOWBIT_HD void quantize_int4_row(const float* x, int D, int n_groups, uint32_t* words) {
  const int per = D / n_groups;
  for (int g = 0; g < n_groups; ++g) {
    float mx = x[g * per], mn = x[g * per];
    for (int e = 1; e < per; ++e) {
      float v = x[g * per + e];
      mx = v > mx ? v : mx;
      mn = v < mn ? v : mn;
    }
    const uint16_t s16 = dt::f32_to_f16((mx - mn) / 15.f);
    const uint16_t h16 = dt::f32_to_f16(mn);
    words[g] = pack_coef(s16, h16);
    const float scale = dt::f16_to_f32(s16), shift = dt::f16_to_f32(h16);
    for (int e = 0; e < per; e += 8) {
      uint32_t w = 0;
      for (int j = 0; j < 8; ++j) w |= int4_code(x[g * per + e + j], scale, shift) << (4 * j);
      words[n_groups + (g * per + e) / 8] = w;
    }
  }
}

// Quantizes one row x (D) into words (D/4) and its scale/shift word: shift = fp16((max+min)/2),
// scale = fp16(max|x - shift| / 448), codes e4m3((x - shift) / scale) (round to nearest even,
// saturating); a zero scale gives codes 0.
LOWBIT_HD void quantize_fp8_row(const float* x, int D, uint32_t* words, uint32_t* scale_shift) {
  float mx = x[0], mn = x[0];
  for (int e = 1; e < D; ++e) {
    mx = x[e] > mx ? x[e] : mx;
    mn = x[e] < mn ? x[e] : mn;
  }
  const uint16_t h16 = dt::f32_to_f16(0.5f * mx + 0.5f * mn);
  const float shift = dt::f16_to_f32(h16);
  float amax = 0.f;
  for (int e = 0; e < D; ++e) {
    float a = fabsf(x[e] - shift);
    amax = a > amax ? a : amax;
  }
  const uint16_t s16 = dt::f32_to_f16(amax / 448.f);
  const float scale = dt::f16_to_f32(s16);
  *scale_shift = pack_coef(s16, h16);
  for (int i = 0; i < D / 4; ++i) {
    uint32_t w = 0;
    for (int j = 0; j < 4; ++j) {
      uint32_t c = scale != 0.f ? dt::f32_to_e4m3((x[4 * i + j] - shift) / scale) : 0u;
      w |= c << (8 * j);
    }
    words[i] = w;
  }
}

}  // namespace kv
}  // namespace lowbit
