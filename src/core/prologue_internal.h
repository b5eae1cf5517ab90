// The attention prologue's resolved arguments (validated by src/core/prologue.cpp) and its
// backend entry points. Shared by src/cpu/prologue.cpp and src/cuda/prologue.cu.
#pragma once

#include <cstdint>
#include <string>

#include "lowbit/prologue.h"
#include "lowbit/tensor.h"

namespace lowbit {

// Every pointer and stride a prologue kernel reads; strides in elements. Plain data, passed to
// CUDA kernels by value.
struct PrologueArgs {
  // x (B, N, H, D), channels contiguous.
  const void* x = nullptr;
  DType x_dtype = DType::bf16;
  int64_t batch = 0, tokens = 0, heads = 0, dim = 0;
  int64_t x_sb = 0, x_sn = 0, x_sh = 0;
  // Norm: weight (R, D) with row stride w_sr (0 for a (D) weight); rows (N) int32 or null.
  bool norm = false;
  const void* w = nullptr;
  DType w_dtype = DType::f32;
  int64_t w_sr = 0;
  int64_t w_count = 1;  // R: the weight's rows
  const int32_t* w_rows = nullptr;
  int64_t w_rows_s = 1;
  float eps = 1e-6f;
  // NormScope::token: head h reads weight row h (w_sr apart); token_inv (B, N) f32 contiguous,
  // the token's inverse RMS over its H·D channels (token_norm_inv), set by src/core/prologue.cpp
  // before the passes run.
  bool norm_heads = false;
  const float* token_inv = nullptr;
  // CUDA, tuning `token_fast`: the weight as f32 (H·D, head h at h·D), for the round-5 q kernel
  // reading each token's inverse instead of a staged norm output (token_norm_inv writes it).
  const float* token_w = nullptr;
  // RoPE: cos of (batch b, token n, pair p) at rope + b*r_sb + n*r_sn + p*r_sp, its sin r_sc
  // further. r_sb = 0 for a shared table.
  bool rotate = false;
  bool interleaved = false;
  const void* rope = nullptr;
  DType r_dtype = DType::f32;
  int64_t pairs = 0;
  int64_t r_sb = 0, r_sn = 0, r_sp = 0, r_sc = 0;
  // Mean (B, H, D) f32 to subtract, or null.
  const float* mean = nullptr;
  int64_t m_sb = 0, m_sh = 0;
  float sm_scale = 1.f, scale_eps = 1e-7f;
  ScaleLayout layout = ScaleLayout::per_block;
  int block = 64, groups = 1;
  int64_t n_blocks = 0;  // per (batch, head); scale_out's last dim is n_blocks * groups
  // Quantize outputs: q (B, N, H, D) int8, scale (B, H, n_blocks * groups) f32.
  int8_t* q = nullptr;
  int64_t q_sb = 0, q_sn = 0, q_sh = 0;
  float* scale = nullptr;
  int64_t s_sb = 0, s_sh = 0;
  // Mean output (B, H, D) f32.
  float* mean_out = nullptr;
  int64_t mo_sb = 0, mo_sh = 0;
  // A padded varlen batch (CUDA, session 51: attention_varlen's buckets): batch item b holds
  // item_tokens[b] (device int32) tokens of its `tokens` rows; the rest are padding, never read.
  // Its mean divides by item_tokens[b] (0 tokens: mean 0) and no padding row reaches a scale.
  // Null: `tokens` for every item.
  const int32_t* item_tokens = nullptr;
  // ... read in place (with item_tokens): item b's token 0 is row item_rows[b] of x and of the
  // rotary table (x + item_rows[b] * x_sn, rope + item_rows[b] * r_sn; x_sb / r_sb unused), and
  // its token n's segmented weight row is w_rows[item_rows[b] + n] (session 52).
  const int32_t* item_rows = nullptr;
  // With item_rows: whether the rotary table is read at the item rows too (true), or is a
  // per-item compacted copy read at b * r_sb (false: the mean pass's compaction of tables other
  // than (…, pairs, 2) f32).
  bool item_table = true;
  // ... and whether x is read at the item rows (true), or is a (B, N, H, D) copy read at b * x_sb
  // (false: a token-scope norm's staged output).
  bool item_x = true;
};

namespace detail {
// The checks norm_rope_quantize makes of x and p's norm / rope parts, for a call that runs the
// prologue inside another op (attention's options.q_prologue / k_prologue): errors name `op` and
// `arg`.<the prologue's argument>; p.mean must be null and p.sm_scale 1 (the call owns them).
// weight_rows' index range is read back on rows_ctx's stream (a synchronization on CUDA), not at
// all where rows_ctx is null (checked already).
void check_prologue_inputs(const char* op, const std::string& arg, const TensorView& x,
                           const Prologue& p, const Context* rows_ctx);
// norm_rope_quantize / norm_rope_mean_quantize for a caller that has checked p.weight_rows'
// index range (check_prologue_inputs): every other check as the public calls, no read-back.
// item_tokens (CUDA, device int32 per batch item, or null): a padded varlen batch
// (PrologueArgs::item_tokens).
void norm_rope_quantize_rows_checked(const TensorView& x, const Prologue& p, TensorView q_out,
                                     TensorView scale_out, Context& ctx,
                                     const int32_t* item_tokens = nullptr,
                                     const int32_t* item_rows = nullptr);
void norm_rope_mean_quantize_rows_checked(const TensorView& x, const Prologue& p,
                                          TensorView mean_out, TensorView q_out,
                                          TensorView scale_out, Context& ctx,
                                          const int32_t* item_tokens = nullptr,
                                          const int32_t* item_rows = nullptr);
}  // namespace detail

// NormScope::token on CUDA: the most channels (H·D) of a token (the token-norm kernel's shared
// memory: 8 warps of H·D / 256 group sums within 48 KB).
constexpr int64_t kTokenNormMaxChannels = 393216;

// Tokens per partial sum of the mean pass (SPEC §1.3).
constexpr int kMeanBlockRows = 64;

// Channels per chunk of the sum of squares: each chunk sums its squares in channel order
// (x0 * x0, then fma), the chunks are then added as a pairwise tree (chunk k with k + 1, then
// pairs of pairs, ...); the CUDA kernels hold one chunk per thread and reduce with xor shuffles,
// which adds in exactly this order.
constexpr int kNormChunk = 8;

// norm_rope_mean_quantize: `a` carries both the mean output (mean_out) and the quantize outputs,
// with a.mean == a.mean_out (the quantize pass subtracts the mean just computed).
namespace cpu {
void norm_rope_mean(const PrologueArgs& a, Context& ctx);
void norm_rope_quantize(const PrologueArgs& a, Context& ctx);
void norm_rope_mean_quantize(const PrologueArgs& a, Context& ctx);
// out (B, N, H, D) in x's dtype, strides o_s*: the rows rope(norm(x)) - mean rounded to x's dtype.
void norm_rope_store(const PrologueArgs& a, void* out, int64_t o_sb, int64_t o_sn, int64_t o_sh,
                     Context& ctx);
void norm_rsqrt(const float* s, float* out, int64_t n, Context& ctx);
// out (B, N) f32: each token's inverse RMS over its H·D channels (NormScope::token).
void token_norm_inv(const PrologueArgs& a, float* out, Context& ctx);
}  // namespace cpu
namespace cuda {
void norm_rope_mean(const PrologueArgs& a, Context& ctx);
void norm_rope_quantize(const PrologueArgs& a, Context& ctx);
void norm_rope_mean_quantize(const PrologueArgs& a, Context& ctx);
void norm_rope_store(const PrologueArgs& a, void* out, int64_t o_sb, int64_t o_sn, int64_t o_sh,
                     Context& ctx);
void norm_rsqrt(const float* s, float* out, int64_t n, Context& ctx);
// w_out (optional, H·D f32): the weight rows converted to f32 (PrologueArgs::token_w).
void token_norm_inv(const PrologueArgs& a, float* out, Context& ctx, float* w_out = nullptr);
// Whether the quantize pass of `a` (NormScope::token) runs a round-5 kernel reading the tokens'
// inverses and token_w (tuning `token_fast` on, the kernels' layouts; token_inv / token_w may be
// null here: they are not read); with_mean: and norm_rope_mean_quantize's mean pass the round-5
// mean kernel.
bool token_quantize_fast(const PrologueArgs& a, bool with_mean);
// NormScope::token's norm output y = round(x * inv * w) (the store step of a norm-only `a`),
// contiguous (B, N, H, D) at y, in one pass that also takes each token's inverse (no
// token_norm_inv first); false (nothing queued) where H·D needs more than kTokenStoreMaxGroups
// groups of 256 channels.
constexpr int64_t kTokenStoreMaxGroups = 24;
bool token_norm_store(const PrologueArgs& a, void* y, Context& ctx);
// Whether the mean passes of `a` would take the round-4/5 mean kernels but for its RoPE table's
// form (full rotary, D 64 / 128 / 256, a table other than (..., pairs, 2) fp32 aligned, e.g.
// Flux's 2 x 2 matrices): then compact_rope_table gives them that form.
bool rope_table_compactable(const PrologueArgs& a);
// out: a's table's (cos, sin) as a contiguous fp32 (TB, N, pairs, 2) table (TB = 1 for a shared
// table, else B), the same values; rope_table_bytes its size.
int64_t rope_table_bytes(const PrologueArgs& a);
void compact_rope_table(const PrologueArgs& a, float* out, Context& ctx);
}  // namespace cuda

namespace detail {
// Internal knobs of the CUDA prologue kernels, for tests and the bench's A/B rows only (never set
// by library code); 0 means the default (constants in src/cuda/prologue_v3.cu / prologue.cu).
// `legacy` forces the first-generation kernels (the path for segmented weights, partial rotary,
// WARP_Q and blocks the round-3 kernels do not tile); `heads_per_cta` > 0 overrides the quantize
// kernel's head group (wave model) and the round-2 mean kernel's; `mean_steps` > 0 the row steps
// per CTA of the mean kernels; `mean_round` = 2 forces the round-2 mean kernel (the fallback for
// tables other than (..., pairs, 2) fp32), 4 the round-4 one (one row of 32 values per lane), 5
// round 5 (round 4 with two rows of 16 values per lane; session 14); 0 the default of the two; `tile_order` the order of the
// quantize kernel's token tiles (reversed when a mean is subtracted, so that the k pass first reads
// the rows the mean pass read last, still in L2; kTilesForward / kTilesReverse force one);
// `pdl` / `quant_pdl` whether mean_final / the quantize kernel are launched with programmatic
// dependent launch (kPdlOff / kPdlOn); `split_blocks` (kSplitOff / kSplitOn) whether a quantize
// CTA tiles whole scale groups of a block or whole blocks; `max_reduce` how it takes a scale
// group's maximum across lanes (kReduceShuffle: an xor-shuffle tree; kReduceRedux: redux.sync.max
// on the bit patterns of the absolute values); `mean_ctas` the round-4 mean kernel's resident
// CTAs per SM at D = 128 (4 or 5; by size by default); `mean_smem` where the quantize CTA reads
// the mean (kMeanSmemOff: L1 loads; kMeanSmemOn: the head group's rows staged in shared memory
// once, the head group capped so the CTAs per SM stay; kMeanSmemRing: a 6-row ring refilled 3
// heads at a time behind a CTA barrier); `quant_early` whether the PDL-launched quantize kernel
// issues its x, weight and table loads before griddepcontrol.wait (default: on in
// norm_rope_mean_quantize, whose quantize pass runs behind the mean pass of the same x, off in a
// lone norm_rope_quantize; kEarlyOn anywhere: tests and the bench only); `quant_tight`
// the tight forms of the quantize kernel of 4-warp CTAs (compile-time thread count, running
// ring / pointer offsets instead of per-head address math) and of the round-4 mean kernel (32-bit
// slot addresses), both with a branch-free norm (default since GPU run 24); by default since
// session 11 (GPU run 32) the tight quantize kernel is specialized to the library's two layouts
// with codes without float-to-int conversions (see kTightPlain); kTightOff runs session 8's
// generic quantize form (session 9; the generic mean form was deleted in session 10).
// `heads_per_cta` = kKnobBalanced forces the balanced quantize grid at any size, kKnobUnbalanced
// the wave model's grid (session 10).
// None of them changes a bit of the output.
// (Deleted in session 8, the losing forms: the register and 3-ahead quantize rings, register
// barrier ids, the plain bf16 arithmetic, the round-2 quantize and round-3 mean kernels, the
// round-4 mean's register ring and its rotation folded into the sums; session 8's bulk-copy
// quantize ring, which lost in GPU run 19.)
constexpr int kTilesForward = 1, kTilesReverse = 2;
constexpr int kPdlOff = 1, kPdlOn = 2;
constexpr int kSplitOff = 1, kSplitOn = 2;
constexpr int kReduceShuffle = 1, kReduceRedux = 2;
constexpr int kMeanSmemOff = 1, kMeanSmemOn = 2;
constexpr int kMeanSmemRing = 3;
constexpr int kEarlyOff = 1, kEarlyOn = 2;
// quant_tight = kTightPlain: the session-9/10 tight quantize kernel (the default in GPU runs
// 24-32) where the default would run the specialized one (session 11: THREAD_Q with 4 rows per
// scale group and no mean, THREAD_K with 16 rows per group and the mean rows in shared memory,
// redux, scale_eps >= 0: the scale group's shape at compile time, codes by fp32 adds with a
// round-down magic number and byte permutes); the same bits. For comparison (tests, bench).
// (Deleted after run 32, measured: the specialized kernel with float-to-int conversions, with
// the norm's bf16 rounding in pairs, with the head loop unrolled by 3; docs/prologue.md.)
constexpr int kTightOff = 1, kTightPlain = 2;
constexpr int kKnobBalanced = -1, kKnobUnbalanced = -2;
struct PrologueCudaTuning {
  bool legacy = false;
  int heads_per_cta = 0;
  int mean_steps = 0;
  int mean_round = 0;
  int tile_order = 0;
  int pdl = 0;
  int split_blocks = 0;
  int max_reduce = 0;
  int quant_pdl = 0;
  int mean_ctas = 0;
  int mean_smem = 0;
  int quant_early = 0;
  int quant_tight = 0;
  // Session 14: `quant_pair` (kPairOff / kPairOn) the specialized q kernel (THREAD_Q groups of
  // 4 rows, no mean) in the round-5 layout, two rows (heads) of 16 values per lane.
  int quant_pair = 0;
  // Session 16: `quant_occ6` (kOcc6Off / kOcc6On) the specialized round-3 q kernel (THREAD_Q
  // groups of 4 rows, no mean; D = 128) held to 80 registers with its x ring 1 head ahead, so
  // that 6 CTAs of 4 warps fit an SM instead of 5 (96 registers, 2 heads ahead; default: on from
  // 2^16 rows, where round 5 does not run); `quant_codes` (kCodesFq / kCodesSigned) how the
  // specialized kernels (round-3 q and k, round-5 q) make their codes: session 11's fp32 adds and
  // byte permutes, or the sign in the round-down magic number (one add gives the two's-complement
  // byte; default: signed for the q kernels, byte permutes for the k kernel). The same bits.
  int quant_occ6 = 0;
  int quant_codes = 0;
  // Session 23: `quant_kpair` (kPairOff / kPairOn) the specialized k kernel (THREAD_K groups of
  // 16 rows, the mean rows in shared memory) in the round-5 layout, two tokens of one head per
  // lane (the THREAD_K row pair) as 16 values each. The same bits.
  int quant_kpair = 0;
  // Session 23, bench only (WRONG output: timing probes of the round-5 k kernel, bf16 D 128
  // split-half rope only; 0 elsewhere): `kpair_probe` kProbeNoTeam skips the scale group's
  // cross-warp maximum (each warp its own), kProbeNoRefill the mean ring's CTA barrier and
  // refill, kProbeNoMean the mean subtraction.
  int kpair_probe = 0;
  // Session 23: `kpair_sync` (kSyncTeams / kSyncCta) how the round-5 k kernel at D = 128 meets
  // its scale group's maximum: a named barrier of the group's 2 warps per head plus a CTA barrier
  // per 3 heads for the mean ring's refill, or one barrier of all 4 warps per head with the
  // refill behind it. The same bits. (Session 24's hybrid of the two lost and was deleted.)
  int kpair_sync = 0;
  // Session 38: the legacy mean kernel (segmented weights, partial rotary, `legacy`) as one CTA
  // per (batch, head) without clusters, the form that device code older than sm_90 runs, on any
  // GPU (tests). The same bits.
  bool mean_no_cluster = false;
  // Session 39: segmented norm weights (weight_rows, R <= kSegRows = 4, D 64 / 128) in the fast
  // kernels instead of the first-generation ones: the round-5 q kernel (THREAD_Q groups of 4 rows,
  // no mean, at every size), the round-5 k kernel (THREAD_K groups of 16 rows with the mean),
  // the round-5 mean kernel ((cos, sin) f32 tables) and the round-2 one (other tables); kSegRows
  // weight rows in shared memory, each token's row index read once (the `prologue.*.seg.*`
  // harness cases run it forced, `.segfast`, and off).
  // Since session 45 (H100: every `.segfast` harness case passed; Wan's segmented-norm call
  // 3.45 -> 1.74 ms of norm + rope, Flux's 0.325 -> 0.305): on by default; false forces the
  // first-generation kernels for segmented weights.
  bool seg_fast = true;
  // Session 45: NormScope::token's staged norm output by the two passes of session 40 (the
  // token's inverse, then the first-generation store kernel) instead of the one fused pass.
  bool token_two_pass = false;
  // Session 45: NormScope::token's q pass (THREAD_Q groups of 4 rows, no mean: the round-5 q
  // kernel's layout) reading each token's inverse and its heads' weight rows (f32) instead of a
  // staged norm output; the token pre-pass first. H100: Wan q path 0.528 -> 0.305 ms (per-head
  // norm 0.185), Flux 0.051 -> 0.035; every `.tokenfast` harness case passed, memcheck clean.
  // false: the passes stage y. The fused k path (norm_rope_mean_quantize: the round-5 mean and
  // k kernels) the same way with token_fast_k too (every k `.tokenfast` harness case passed on
  // the H100, memcheck clean; session 46, H100: Wan k path 0.654 -> 0.442 ms, per-head norm
  // 0.312): on by default since session 46; false stages k's y in one pass.
  bool token_fast = true;
  bool token_fast_k = true;
  // Session 52: the k path (norm_rope_mean_quantize) of short rows without norm or rope as ONE
  // kernel, a CTA per (batch, head) holding the head's rows in shared memory: the mean, then the
  // codes from the same rows (x read once from DRAM, one launch), up to `short_k_tokens` tokens
  // (0: the two passes always). The codes and scales are the quantize pass's for the kernel's mean
  // (its fp32 sum in its own order: within the mean's last bits of the two passes').
  int short_k_tokens = 512;
  // ... where batch x heads is at least this many (0: the GPU's multiprocessor count; fewer
  // heads leave SMs idle, where the two passes split the tokens too).
  int short_k_min_ctas = 0;
};
constexpr int kProbeNoTeam = 1, kProbeNoRefill = 2, kProbeNoMean = 3;
constexpr int kSyncTeams = 1, kSyncCta = 2;
constexpr int kPairOff = 1, kPairOn = 2;
constexpr int kOcc6Off = 1, kOcc6On = 2;
constexpr int kCodesFq = 1, kCodesSigned = 2;
void set_prologue_cuda_tuning(const PrologueCudaTuning& t);
PrologueCudaTuning prologue_cuda_tuning();

// The unfused steps a pipeline without the prologue runs (used by the bench's unfused baseline):
// y = round_to_x_dtype(rope(norm(x))), each part on when the Prologue has it; p.mean, sm_scale
// and the layout are ignored.
//   x  (B, N, H, D) bf16 / f16 (f32 on the CPU);  y  (B, N, H, D) same dtype, channels contiguous
void norm_rope_store(const TensorView& x, const Prologue& p, TensorView y, Context& ctx);

// The norm's inv = 1 / sqrt(s), correctly rounded, element-wise as each backend's kernels compute
// it (CPU: fp64 1 / sqrt rounded once; CUDA: src/cuda/rsqrt_rn.cuh). s, out: contiguous f32 of
// one shape on one device. For the harness's `prologue.rsqrt` cases (the backends' agreement).
void norm_rsqrt(const TensorView& s, TensorView out, Context& ctx);
}  // namespace detail

}  // namespace lowbit
