// Backend entry points of the attention family (SPEC §2). The front (src/cpu/attention.cpp)
// validates every argument, then calls the CPU or CUDA version; the backends assume valid input.
// Only public types appear here (the file is plain C++, included by the front and by the CUDA
// backend alike; it lives with the front, src/cpu/attention.cpp).
#pragma once

#include "lowbit/attention.h"

namespace lowbit {
namespace detail {
// A padded varlen batch (CUDA only; session 51, attention_varlen's buckets): item b of the
// (B, N, H, D) operands holds q_lens[b] query rows and kv_lens[b] keys (device int32 arrays;
// its other rows are padding). Its keys past kv_lens[b] are never visible, its query rows past
// q_lens[b] are computed but not stored, and with bottom-right causal masks its shift is
// kv_lens[b] - q_lens[b].
struct VarlenItems {
  const int32_t* q_lens = nullptr;
  const int32_t* kv_lens = nullptr;
  // Read and written in place: item b's rows start at packed row q_rows[b] of q, out and the
  // LSE, at k_rows[b] of k and at v_rows[b] of v (their batch strides unused); null: item b of
  // that tensor at b times its batch stride (a zero-padded copy).
  const int32_t* q_rows = nullptr;
  const int32_t* k_rows = nullptr;
  const int32_t* v_rows = nullptr;
};
}  // namespace detail
namespace cpu {
#include "src/cpu/attention_backend_api.inc"  // NOLINT(build/include)
}  // namespace cpu
namespace cuda {
#include "src/cpu/attention_backend_api.inc"  // NOLINT(build/include)

// attention()'s q quantized inside the attention kernel (src/cuda/attention.cu; session 57):
// whether the call takes that form (bf16 or (session 60) f16 q and out of one type, fp8 P·V, auto
// kernel, D = 128 or (session 59) 64, any key count since session 61 (the one-consumer kernel's
// range, and the long-key kernels past it) and 16-bit P·V too (session 61: its TMA-ring kernel;
// v then the 16-bit V and v_scale null), q 16-byte aligned with strides of multiples of 8,
// an sm_90a GPU; tuning fused_q), and the kernel itself on the raw q with the pass's sm_scale
// and scale_eps (k, V, their scales and means from the call's passes; options with sm_scale 1).
// attention_int8_q16 returns false, launching nothing, where the kernel does not apply after all.
bool attention_q16_applies(const TensorView& q, const TensorView& k, const TensorView& out,
                           const AttentionOptions& options);
bool attention_int8_q16(const TensorView& q, float q_sm_scale, float q_scale_eps,
                        const QuantizedRows& k, const TensorView& v, const TensorView* v_scale,
                        const TensorView* v_mean, const TensorView* k_mean, TensorView out,
                        TensorView* lse_out, const AttentionOptions& options, Context& ctx);

// attention_varlen's padded buckets (src/cuda/varlen.cu; session 51). A bucket of up to
// kVarlenMaxItems sequences: item b's rows start at packed row start[b] and number len[b].
constexpr int kVarlenMaxItems = 64;
struct VarlenSpans {
  int items = 0;
  int32_t start[kVarlenMaxItems] = {};
  int32_t len[kVarlenMaxItems] = {};
};
// dst (items, L, H, W) 32-bit words, contiguous = the rows of src (packed rows r, heads h at
// src + r * row_stride + h * head_stride bytes, W words each, 4-byte aligned) of each item, zero
// past its length (16-bit P·V's v in a padded bucket).
void varlen_gather(const void* src, int64_t row_stride, int64_t head_stride, int64_t H, int64_t W,
                   const VarlenSpans& spans, int64_t L, void* dst, Context& ctx);
// out (device int32, 4 x items): the q lengths, the kv lengths, the q starts, the kv starts
// (detail::VarlenItems' arrays).
void varlen_items(const VarlenSpans& q, const VarlenSpans& kv, int32_t* out, Context& ctx);
}  // namespace cuda
namespace detail {
// Bench-only A/B knobs of the CUDA attention kernels (not part of the public API; the default is
// what ships). Process-wide, one struct under a mutex.
struct AttentionCudaTuning {
  // wgmma_r3: round 3 + I2FP logits without the consumers' ping-pong turns (same bits as round
  // 3; auto's kernel at D = 128)
  bool no_turn = false;
  // with no_turn on wgmma_r3: three consumer warpgroups (192 rows per CTA) at D = 64 fed by the
  // TMA producer (auto's kernel at D = 64)
  bool cons3 = false;
  // fp8 P·V at D = 128 and 64 (auto, and wgmma_r3 with no_turn): 1 one consumer warpgroup per CTA
  // (64 query rows) and two CTAs per multiprocessor (session 54; also the 16-bit P·V ring kernel
  // at D = 128 unless ring_cons says otherwise), 2 the kernels of two / three consumers per CTA,
  // 0 the default (kC1MaxKeys, kC1MaxKeysD64, kRingC1MaxKeys in attention.cu). The same bits.
  int cons1 = 0;
  // 16-bit P·V on the TMA-ring kernel (auto / wgmma_r3) at D = 64: 3 forces three consumer
  // warpgroups (192 rows per CTA, the default until session 14), 4 four (256 rows, 112 registers
  // each; the default since H200 run 48), 0 the default; at D = 128, 1 one consumer per CTA and
  // two CTAs per multiprocessor (session 54), 3 three consumers (kRingC1MaxKeys in attention.cu)
  int ring_cons = 0;
  // attention(): the q prologue, the k path and V's passes one after another on the caller's
  // stream (before session 21) instead of on side streams beside each other
  bool serial_passes = false;
  // Causal CTA order (session 25): heads per group of the longest-first walk across heads
  // (attn::cta_work); 1 = each head's query blocks longest-first, the heads in order (the order
  // before session 25); 0 = by L2 size (the groups' K / V ~30 MB). The same bits.
  int causal_heads = 0;
  // Bench only: a device buffer of kAttentionTraceWords words per CTA for round 3's per-CTA
  // stamps (see attention_wgmma.cu, r3_trace), or null.
  unsigned long long* trace = nullptr;
  // Round 3 without turns at D = 128 (auto's fp8 P·V kernel): 1 the output rows stored from
  // registers (4-byte stores), 2 through the consumers' Q rows in shared memory as 16-byte row
  // stores (session 26), 0 the default (kAttnStagedEpilogue in attention.cu). The same bits.
  int epilogue = 0;
  // The same kernel (with the staged epilogue), the bench's A/B: true releases each ring stage by
  // each consumer warp's lane 0 after __syncwarp (the form before session 27), false by every
  // consumer thread (the default). The same bits.
  bool lane0_release = false;
  // attention_varlen: every sequence a call of its own (the form before session 50) instead of
  // runs of equal lengths as batches. The same bits.
  bool varlen_each = false;
  // attention_varlen on CUDA: sequences of distinct lengths each a call of their own (the form
  // before session 51) instead of padded buckets of them (varlen_padded). Not the same bits: a
  // bucket's K means add in the padded length's chunks.
  bool varlen_unpadded = false;
  // Bench: padded buckets for every sequence they can hold, the cost model aside.
  bool varlen_pad_all = false;
  // quantize_v_fp8 on CUDA (session 52): V without a mean of at most this many keys a head as ONE
  // kernel, a CTA per (batch, head) holding its rows (the maximum, then the codes from the same
  // rows: V read once, one launch; the same bits), where batch x heads is at least
  // short_v_min_ctas (0: the GPU's multiprocessor count); 0 tokens: the passes always.
  int short_v_tokens = 512;
  int short_v_min_ctas = 0;
  // attention() (session 52): q's prologue on a second side stream beside the k path and V's
  // passes where V forks: 1 off, 2 on, 0 the default (kForkQ in src/cpu/attention.cpp).
  int fork_q = 0;
  // attention()'s q quantized inside the fp8 kernel (sessions 57-61): 0 the default (calls whose
  // keys the one-consumer kernel takes: non-causal grids with the heads fastest; the q rows of
  // the CTA a wave ahead prefetched into L2, along the longest-first walk for causal calls since
  // session 59; session 61: longer keys on the long-key kernels the same way), 1 off (q's own
  // pass), 2 on at any key count (the one-consumer kernel forced), 3 on for the one-consumer
  // kernel's keys with the grid's query blocks fastest and no prefetch, 4 the same with the
  // heads fastest (session 57's form), 5 on for the one-consumer kernel's keys only (sessions
  // 58-60's default), 6 the default without the prefetch at longer keys. 16-bit P·V (session
  // 61, its TMA-ring kernel): q in the kernel under 0 (with the prefetch) and 6 (without) only
  int fused_q = 0;
  // the fp8 one-consumer kernel on codes (session 57's A/B): its non-causal grid with the heads
  // fastest
  bool heads_inner = false;
};
constexpr int kAttentionTraceWords = 16;
void set_attention_cuda_tuning(const AttentionCudaTuning& t);
AttentionCudaTuning attention_cuda_tuning();
}  // namespace detail
}  // namespace lowbit
