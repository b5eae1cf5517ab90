// The attention prologue (SPEC §1): q/k RMSNorm + RoPE + K-mean smoothing + INT8 quantization in
// SageAttention 2's scale layouts, fused so that q costs one read of x and k two.
//
//   q path:  norm_rope_quantize(q, {norm, rope, sm_scale, layout = thread_q}, q8, q_scale, ctx)
//   k path:  norm_rope_mean_quantize(k, {norm, rope, layout = thread_k}, k_mean, k8, k_scale, ctx)
//            (the same bits as norm_rope_mean(k, p, k_mean, ctx), then p.mean = &k_mean;
//            norm_rope_quantize(k, p, k8, k_scale, ctx))
#pragma once

#include <cstdint>

#include "lowbit/tensor.h"

namespace lowbit {

// Row groups that share one fp32 scale, counted within a block of `block` rows of one
// (batch, head); SPEC §1's table.
enum class ScaleLayout : uint8_t {
  per_block,  // 1 group: every row of the block
  thread_q,   // 8 groups: row r -> r % 8; blocks padded to 128 rows (block must divide 128)
  thread_k,   // 4 groups: row r -> (r % 8) / 2
  warp_q,     // 4 groups: row r -> r / 32 (block <= 128)
};
const char* scale_layout_name(ScaleLayout);
// Scale groups per block of rows: 1, 8, 4, 4.
int scale_groups(ScaleLayout);

// Rotary table: (1 | B, N, 1, pairs, 2) holding (cos, sin), or (1 | B, N, 1, pairs, 2, 2) holding
// [[cos, -sin], [sin, cos]]; f32, bf16 or f16, any strides. The sine is read at the dim-4 stride
// from the cosine, so both shapes work unchanged. A leading dim of 1 shares the table across the
// batch. pairs <= D / 2: the first 2 * pairs channels rotate, the rest pass through.
struct Rope {
  TensorView table;
  bool interleaved = false;  // pairs (2p, 2p + 1); false: split halves (p, p + pairs)
};

// What the RMSNorm's mean of squares spans.
enum class NormScope : uint8_t {
  head,   // each head's D channels (SPEC §1; Flux, SD3, Qwen-Image: per-head QK-norm)
  token,  // all H·D channels of a token (Wan: RMSNorm(dim) of the q / k projection before the
          // head split): inv = rsqrt(sum(x^2) / (H·D) + eps), the sum of squares in fp32 over the
          // token's channels head by head (chunks of 8 in channel order, added as SPEC §1's
          // pairwise tree over the H·D / 8 chunks); the weight is (H·D) or (H, D), head h reads
          // row h. The rest (rounding of the norm output, rope, mean, codes) as for `head`.
};

struct Prologue {
  // Weighted RMSNorm, off when null: (D), or (R, D) together with weight_rows; f32, bf16 or f16,
  // channels contiguous. With norm_scope token: (H·D) or (H, D), no weight_rows.
  const TensorView* norm_weight = nullptr;
  // (N) int32: the row of a (R, D) norm_weight each token uses (segmented weights); values in
  // [0, R).
  const TensorView* weight_rows = nullptr;
  // Whether weight_rows' index range is checked: on CUDA read back on ctx's stream (one
  // synchronization per call, so the call cannot be captured in a CUDA graph). false: not read,
  // the caller vouches for the range; no synchronization, capturable; an index outside [0, R)
  // then takes the nearest row (clamped), on both backends, and nothing reads out of bounds.
  bool check_weight_rows = true;
  float eps = 1e-6f;
  NormScope norm_scope = NormScope::head;
  const Rope* rope = nullptr;  // off when null
  // (B, H, D) f32, channels contiguous: subtracted after the rotation (the K smoothing mean, e.g.
  // from norm_rope_mean). Ignored by norm_rope_mean.
  const TensorView* mean = nullptr;
  float sm_scale = 1.f;     // v = (y - mean) * sm_scale before quantization
  float scale_eps = 1e-7f;  // scale = max|v| / 127 + scale_eps (>= 0)
  ScaleLayout layout = ScaleLayout::per_block;
  int block = 64;  // rows per block, a multiple of 8
};

// Blocks of rows per (batch, head) times the groups per block: the last dim of scale_out.
// n_blocks = ceil(N / pad) * (pad / block), pad = 128 for thread_q and `block` otherwise.
int64_t prologue_scale_count(int64_t n_tokens, ScaleLayout layout, int block);

// mean_out = the mean over the N tokens of the normalized, rotated rows of x (fp32 partial sums per
// block of 64 tokens, then their sum divided by N). p.mean, p.sm_scale and the layout are ignored.
//   x         (B, N, H, D) bf16 / f16 (f32 on the CPU), channels contiguous, other strides free
//   mean_out  (B, H, D) f32, channels contiguous
void norm_rope_mean(const TensorView& x, const Prologue& p, TensorView mean_out, Context& ctx);

// INT8 codes and fp32 scales of v = (rope(norm(x)) - mean) * sm_scale, SPEC §1 arithmetic.
//   x          (B, N, H, D) bf16 / f16 (f32 on the CPU), channels contiguous, other strides free
//   q_out      (B, N, H, D) int8, channels contiguous, other strides free
//   scale_out  (B, H, prologue_scale_count(N, layout, block)) f32, last dim contiguous
// On CUDA: D in {64, 128, 256}, bf16 / f16, x 16-byte and q_out 8-byte aligned (pointers and the
// strides of batch, token and head).
void norm_rope_quantize(const TensorView& x, const Prologue& p, TensorView q_out,
                        TensorView scale_out, Context& ctx);

// The k path in one call: mean_out = norm_rope_mean(x, p), then the codes and scales of
// norm_rope_quantize(x, p) with p.mean = mean_out: the same bits as those two calls on the same
// backend. p.mean must be null (the mean is computed here). On CUDA the quantize pass starts
// reading x while the mean pass finishes (a lone norm_rope_quantize cannot know that nothing
// between the two calls writes x).
//   x          (B, N, H, D) as for norm_rope_quantize
//   mean_out   (B, H, D) f32, channels contiguous; must not overlap x, q_out or scale_out
//   q_out      (B, N, H, D) int8, as for norm_rope_quantize
//   scale_out  (B, H, prologue_scale_count(N, layout, block)) f32, last dim contiguous
void norm_rope_mean_quantize(const TensorView& x, const Prologue& p, TensorView mean_out,
                             TensorView q_out, TensorView scale_out, Context& ctx);

}  // namespace lowbit
