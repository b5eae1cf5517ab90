// INT8 prefill attention (SPEC §2): SageAttention 2's arithmetic. INT8 q and k with fp32 scales in
// the layouts of SPEC §1, an online softmax in base 2, and P·V either on fp8 e4m3 (per-channel V
// scales, P scaled into [0, 448]) or in 16 bits.
//
// Layouts: every (B, N, H, D) tensor below is a strided view. NHD storage is the natural
// contiguous view; HND storage (B, H, N, D) is passed as the same logical shape with its strides
// permuted (stride[1] = D, stride[2] = N * D). Only the channel dimension must be contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lowbit/prologue.h"
#include "lowbit/tensor.h"

namespace lowbit {

// ScaleLayout and scale_groups() come from the prologue (lowbit/prologue.h).
// Scale index of row `row` (within one (batch, head)) for a layout and block.
int64_t scale_index(ScaleLayout layout, int block, int64_t row);
// Scales per (batch, head) for `rows` rows: n_blocks * groups with SPEC §1's padding.
int64_t scale_count(ScaleLayout layout, int block, int64_t rows);

// INT8 rows with their scales, as the prologue writes them.
struct QuantizedRows {
  TensorView data;   // (B, N, H, D) int8, channels contiguous
  TensorView scale;  // (B, H, >= scale_count(layout, block, N)) f32, last dim contiguous or not
  ScaleLayout layout = ScaleLayout::per_block;
  int block = 64;  // rows per block, a multiple of 8
};

struct AttentionOptions {
  // Natural-log softmax scale applied to the dequantized q·k. In attention() (bf16/f16 inputs),
  // 0 means 1/sqrt(D). In attention_int8() it multiplies whatever q_scale * k_scale give: pass 1
  // when the prologue already folded sm_scale into q (and 0 still means 1/sqrt(D)).
  float sm_scale = 0.f;
  enum Causal : uint8_t {
    none,
    bottom_right,  // query i sees keys j <= i + N_kv - N_q (the default causal alignment)
    top_left       // query i sees keys j <= i
  } causal = none;
  enum PV : uint8_t {
    fp8,  // V per-channel e4m3, P e4m3 in [0, 448], two-level fp32 accumulation
    f16   // V and P in the v dtype (bf16 or f16), fp32 accumulation
  } pv = fp8;
  bool smooth_k = true;   // attention(): subtract the per-head K mean before quantizing K
  bool smooth_v = false;  // fp8 PV: subtract the per-channel V mean, added back in the epilogue
  // CUDA kernel choice (the CPU backend ignores it). auto_kernel: on an sm_90 GPU with the
  // sm_90a build and head dim 64 or 128, fp8 PV runs the fastest wgmma kernel measured on the
  // H200 (round 3 without ping-pong turns; three consumer warpgroups at D = 64) and 16-bit PV
  // the TMA-ring kernel (a TMA producer warp, a ring of 64-key stages, three consumer warpgroups,
  // P·V straight into O; round 1 for tensors no TMA descriptor can address); at head dim 256 both
  // PV modes run the head-dim-256 wgmma kernel (below; tensors no TMA descriptor can address run
  // the mma.sync kernel); elsewhere the mma.sync kernel. mma_sync forces the portable kernel
  // (sm_89+ for fp8 PV; D = 256 needs 145 KB (fp8 PV) / 135 KB (16-bit PV) of shared memory per
  // block: sm_80 / sm_90, not sm_89); wgmma the round-1 wgmma kernel (no warp specialization);
  // wgmma_r3 the warp-specialized round 3 (a producer warpgroup, K/V ring on mbarriers, ping-pong
  // consumers; the TMA-ring kernel for 16-bit PV); at head dim 256 both wgmma choices run the
  // head-dim-256 wgmma kernel (a TMA producer warp, a ring of 64-key stages, two consumer
  // warpgroups; both PV modes; tensors no TMA descriptor can address run the mma.sync kernel). All
  // but auto_kernel are an error where they do not apply (no sm_90a kernel). Same arithmetic in
  // every kernel (outputs agree within the harness tolerances).
  enum Kernel : uint8_t { auto_kernel, mma_sync, wgmma, wgmma_r3 } kernel = auto_kernel;
  // attention() / attention_varlen(): q's and k's RMSNorm and RoPE (SPEC §1), fused into their
  // quantization passes, as Flux, Wan or Qwen-Image apply them to q and k before attention: the
  // call then computes softmax(rope(norm(q)) · rope(norm(k))ᵀ · sm_scale) V. Null: none. Only
  // norm_weight, weight_rows, eps, rope and scale_eps are read (the call picks the scale
  // layouts, folds sm_scale into q and takes k's mean itself: `mean` must be null and sm_scale
  // 1). Tables and weight_rows follow q's / k's own tokens (cross-attention has two tables); in
  // attention_varlen their token dim is the packed one (rows of every sequence, batch 1).
  // Segmented weights (weight_rows): their index range is read back once per call on ctx's
  // stream (a synchronization; so such a call cannot be captured in a CUDA graph) unless the
  // Prologue's check_weight_rows is false (indices then clamped to the weight's rows).
  // norm_scope token (Wan: the norm over all heads of a token): on CUDA the call also takes
  // stream-ordered scratch of q's (k's) size for the staged norm output (docs/prologue.md).
  // attention_int8() ignores them (its inputs are quantized already).
  const Prologue* q_prologue = nullptr;
  const Prologue* k_prologue = nullptr;
};

// ---- building blocks ----------------------------------------------------------------------------

// Per-channel fp8 V for the fp8 PV mode.
//   v         (B, N, Hkv, D) bf16/f16/f32, strided, channels contiguous
//   v_fp8     (B, Hkv, D, round_up(N, 64)) e4m3, contiguous. Keys are stored in the order the
//             tensor-core fragments read them: within each group of 32 keys, position
//             p = 16*h + 4*t + i holds key 16*h + 8*(i/2) + 2*t + (i%2) (h < 2, t < 4, i < 4).
//             Padding keys hold code 0.
//   v_scale   (B, Hkv, D) f32: max over tokens of |v - mean| / 448 (0 for an all-zero channel,
//             whose codes are then 0)
//   v_mean    (B, Hkv, D) f32 or null: when given, the per-channel mean is computed, written,
//             and subtracted before quantization (fp32 sum over tokens, divided by N)
// code = e4m3(x / scale) with IEEE fp32 division, round to nearest even, saturating.
void quantize_v_fp8(const TensorView& v, TensorView v_fp8, TensorView v_scale, TensorView* v_mean,
                    Context& ctx);

// Kernel-level attention on quantized operands.
//   q        INT8 q (B, Nq, Hq, D) with its scales; D in {64, 128, 256} on CUDA, a multiple of
//            16 on the CPU
//   k        INT8 k (B, Nkv, Hkv, D) with its scales; Hq % Hkv == 0
//   v        fp8 mode: v_fp8 (B, Hkv, D, round_up(Nkv, 64)) e4m3 from quantize_v_fp8;
//            f16 mode: (B, Nkv, Hkv, D) bf16/f16 strided, the dtype of `out`
//   v_scale  fp8 mode: (B, Hkv, D) f32; f16 mode: null
//   v_mean   fp8 mode with V smoothing: (B, Hkv, D) f32, added to the output; else null
//   k_mean   (B, Hkv, D) f32 or null: the mean subtracted from k before quantization, used only
//            to correct the LSE (lse += q_dequant · k_mean · sm_scale)
//   out      (B, Nq, Hq, D) bf16/f16, strided, channels contiguous
//   lse_out  (B, Hq, Nq) f32 or null: natural-log LSE of the logits; -inf for a row that sees no
//            key (its output row is 0)
// options.sm_scale: see AttentionOptions; options.smooth_k / smooth_v are not read here.
void attention_int8(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                    const TensorView* v_scale, const TensorView* v_mean, const TensorView* k_mean,
                    TensorView out, TensorView* lse_out, const AttentionOptions& options,
                    Context& ctx);

// ---- one call -----------------------------------------------------------------------------------

// Quantizes q (after options.q_prologue's norm and rope, sm_scale folded in, THREAD_Q 32-row
// scales), k (after options.k_prologue's, optionally minus its per-head mean, THREAD_K 64-row
// scales), V (fp8 mode), then runs attention_int8.
//   q    (B, Nq, Hq, D) bf16/f16 (f32 on the CPU), strided, channels contiguous
//   k, v (B, Nkv, Hkv, D), same dtype as q
//   out  (B, Nq, Hq, D) same dtype as q (strided)
//   lse_out (B, Hq, Nq) f32 or null
// This overload makes its workspace per call: on CUDA stream-ordered memory from lowbit's pool
// (cudaMallocFromPoolAsync / cudaFreeAsync on ctx's stream), so it returns as soon as its work is
// queued, like the workspace overload, and a graph capture records the allocation with it. The
// pool keeps the memory it has grown to for the next call (release threshold "never").
void attention(const TensorView& q, const TensorView& k, const TensorView& v, TensorView out,
               TensorView* lse_out, const AttentionOptions& options, Context& ctx);

// Bytes of workspace attention() needs for q (B, Nq, Hq, D), k (B, Nkv, Hkv, D) and options.
size_t attention_workspace_bytes(const TensorView& q, const TensorView& k,
                                 const AttentionOptions& options);
// attention() on a caller-owned workspace (>= attention_workspace_bytes, 256-byte aligned, on
// q's device): no allocation, no synchronization, capturable in a CUDA graph.
void attention(const TensorView& q, const TensorView& k, const TensorView& v, TensorView out,
               TensorView* lse_out, const AttentionOptions& options, void* workspace,
               size_t workspace_bytes, Context& ctx);

// Variable-length batch: n sequences packed along the token dimension, sequence i holding query
// rows [cu_seqlens_q[i], cu_seqlens_q[i+1]) and key rows [cu_seqlens_k[i], cu_seqlens_k[i+1]).
// Each sequence is attended on its own (its own scales, K mean and V scales; causal aligned per
// sequence), exactly as attention() on that sequence alone; an empty query range is skipped, an
// empty key range gives 0 and LSE -inf. Consecutive sequences with equal query and key lengths
// run as one batched attention() call (the same bits; not with segmented norm weight_rows). On
// CUDA, sequences of distinct lengths that are short enough to gain from it (and, with segmented
// weight_rows, any sequences) run as padded buckets: one attention() chain over up to 64 of
// them, each read and written at its own packed rows (the same bits as its own call but for the
// K mean's last bits, which add in the padded length's chunks).
//   q      (Tq, Hq, D) bf16/f16 (f32 on the CPU), strided, channels contiguous
//   k, v   (Tk, Hkv, D), same dtype as q
//   cu_seqlens_q, cu_seqlens_k  host offsets, n + 1 each: 0 first, nondecreasing, Tq / Tk last
//   out    (Tq, Hq, D) same dtype as q (strided)
//   lse_out (Hq, Tq) f32 or null
// Makes one workspace for the largest call, as attention() without one does (stream-ordered on
// CUDA: no synchronization).
void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const std::vector<int64_t>& cu_seqlens_q,
                      const std::vector<int64_t>& cu_seqlens_k, TensorView out, TensorView* lse_out,
                      const AttentionOptions& options, Context& ctx);

// ---- references (CPU only; tests and accuracy columns) -----------------------------------------

// softmax(q k^T * sm_scale) v in fp64 from the inputs as given (any float dtype, CPU views),
// causal/GQA as in options. out_ref (B, Nq, Hq, D) and lse_ref (B, Hq, Nq) as contiguous doubles
// (lse_ref may be null). Masked rows give 0 and -inf.
void attention_reference_f64(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options, double* out_ref, double* lse_ref);

}  // namespace lowbit
