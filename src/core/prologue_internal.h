// The attention prologue's resolved arguments (validated by src/core/prologue.cpp) and its
// backend entry points. Shared by src/cpu/prologue.cpp and src/cuda/prologue.cu.
#pragma once

#include <cstdint>

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
  const int32_t* w_rows = nullptr;
  int64_t w_rows_s = 1;
  float eps = 1e-6f;
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
};

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
}  // namespace cpu
namespace cuda {
void norm_rope_mean(const PrologueArgs& a, Context& ctx);
void norm_rope_quantize(const PrologueArgs& a, Context& ctx);
void norm_rope_mean_quantize(const PrologueArgs& a, Context& ctx);
void norm_rope_store(const PrologueArgs& a, void* out, int64_t o_sb, int64_t o_sn, int64_t o_sh,
                     Context& ctx);
}  // namespace cuda

namespace detail {
// Internal knobs of the CUDA prologue kernels, for tests and the bench's A/B rows only (never set
// by library code): `legacy` forces the first-generation kernels (kept as the fallback for
// segmented weights, partial rotary, WARP_Q and blocks the fast kernels do not tile);
// `heads_per_cta` > 0 overrides the head-group heuristic of the fast kernels; `mean_steps` > 0
// overrides the row steps per CTA of the fast mean kernel (how many CTAs share the tokens);
// `round` > 0 forces one generation of the fast kernels where it applies (2: the round-2 kernels,
// 16 channels per thread; 3: the round-3 kernels, 32 channels per thread; 0: the newest);
// `mean_round` > 0 does the same for the mean pass alone (overrides `round` there; 4: the
// round-4 mean kernel, register accumulators, a warp's row slots = heads of one token);
// `ring` picks how the round-3 quantize kernel holds its loads in flight (0: the default,
// kQuantRingRegister: a register ring 1 head ahead, as measured in GPU runs 2-4;
// kQuantRingAsync: a cp.async ring in shared memory, 3 heads ahead; kQuantRingAsync96: the same
// 2 heads ahead held to 96 registers, 5 CTAs per SM instead of 4);
// `tile_order` the order of its token tiles (0: the default, reversed when a mean is subtracted,
// so that the k pass first reads the rows the mean pass read last, still in L2;
// kTilesForward / kTilesReverse force one); `pdl` whether the mean pass's final kernel is
// launched with programmatic dependent launch (0: the default, on; kPdlOff / kPdlOn);
// `mean_ring` how the round-4 mean kernel holds its loads in flight (0 / kQuantRingRegister: a
// register ring 1 token ahead; kQuantRingAsync: a cp.async ring, 3 tokens ahead;
// kMeanRingAsyncTable: the same with the rotary table rows in shared memory too); `lean` the
// round-3 quantize kernel's lean per-row arithmetic for bf16 (kLeanOff / kLeanOn; meant to give
// the same bits: one cvt per rounded value, MUFU.RCP for the reciprocals); `split_blocks`
// (kSplitOn) lets a round-3 quantize CTA tile whole scale groups of a block, not whole blocks;
// `max_reduce` how the round-3 quantize kernel takes a scale group's maximum across lanes
// (kReduceShuffle: an xor-shuffle tree; kReduceRedux: redux.sync.max on the bit patterns of the
// absolute values, one instruction per 32 lanes); `quant_pdl` whether the round-3 quantize
// kernel is launched with programmatic dependent launch (it waits for the previous kernel first
// thing; mean_final lets it launch early) (kPdlOff / kPdlOn); `mean_ctas` the round-4 mean
// kernel's resident CTAs per SM at D = 128 (4: <= 128 registers; 5: <= 96 registers, 20 warps
// per SM; 0: the default, 5 from 2^20 rows up); `mean_fma` (kMeanFmaOn) folds the rotation into the round-4 mean's
// fp32 sums (fma(c, y, fma(-s, o, acc)): the mean's rounding differs like a sum order, within the
// harness's fp32 tolerance; the quantize codes then follow that mean); `mean_smem` (kMeanSmemOn)
// stages the round-3 quantize CTA's mean rows in shared memory once (read per head with
// ld.shared instead of L1 loads; the head group capped so the CTAs per SM stay); `quant_early`
// whether the PDL-launched round-3 quantize kernel issues its x, weight and table loads before
// griddepcontrol.wait (only the mean is read after it): 0 = on in norm_rope_mean_quantize (the
// quantize pass runs behind the mean pass of the same x there) and off in a lone
// norm_rope_quantize; kEarlyOff: off everywhere; kEarlyOn: on everywhere (tests and the bench
// only: correct only where the previous kernel in the stream writes nothing the quantize pass
// reads but the mean).
// `mean_smem` = kMeanSmemRing (with a cp.async quantize ring): the mean rows in a 6-row ring
// refilled 3 heads at a time behind a CTA barrier, so that the head group is not capped by
// shared memory. For `mean_smem`, 0 means the default in src/cuda/prologue_v3.cu
// (kV3DefaultMeanSmem). `barrier_ids` the 96-register quantize kernel's team barriers (THREAD_K /
// PER_BLOCK groups across warps): kBarrierImmediate ids 1..8 as immediates (9 barriers per
// CTA), kBarrierRegister the id in a register (ptxas reserves 16: at most 4 CTAs per SM); 0: the
// default in src/cuda/prologue_v3.cu (kV3DefaultImmBar).
// `ring` = kQuantRingBulk (session 8): the 96-register quantize kernel with its x ring filled
// by bulk copies (cp.async.bulk, one per row and head, issued by the row's first lane) into
// per-warp stages completing on mbarriers; `bulk_stages` its heads per ring (0: the default
// kV3BulkStages in src/cuda/prologue_v3.cu; at least 2).
// None of the others changes a bit of the output.
constexpr int kQuantRingRegister = 1, kQuantRingAsync = 2, kQuantRingAsync96 = 3;
constexpr int kQuantRingBulk = 5;  // ring: bulk copies (TMA) into per-warp stages, 96 registers
constexpr int kMeanRingAsyncTable = 4;  // mean_ring: cp.async ring with the table rows too
constexpr int kTilesForward = 1, kTilesReverse = 2;
constexpr int kPdlOff = 1, kPdlOn = 2;
constexpr int kLeanOff = 1, kLeanOn = 2;
constexpr int kSplitOff = 1, kSplitOn = 2;
constexpr int kReduceShuffle = 1, kReduceRedux = 2;
constexpr int kMeanFmaOff = 1, kMeanFmaOn = 2;
constexpr int kMeanSmemOff = 1, kMeanSmemOn = 2;
constexpr int kMeanSmemRing = 3;  // mean_smem: a 6-row ring refilled 3 heads at a time
constexpr int kEarlyOff = 1, kEarlyOn = 2;
constexpr int kBarrierRegister = 1, kBarrierImmediate = 2;
struct PrologueCudaTuning {
  bool legacy = false;
  int heads_per_cta = 0;
  int mean_steps = 0;
  int round = 0;
  int mean_round = 0;
  int ring = 0;
  int tile_order = 0;
  int pdl = 0;
  int mean_ring = 0;
  int lean = 0;
  int split_blocks = 0;
  int max_reduce = 0;
  int quant_pdl = 0;
  int mean_ctas = 0;
  int mean_fma = 0;
  int mean_smem = 0;
  int quant_early = 0;
  int barrier_ids = 0;
  int bulk_stages = 0;
};
void set_prologue_cuda_tuning(const PrologueCudaTuning& t);
PrologueCudaTuning prologue_cuda_tuning();

// The unfused steps a pipeline without the prologue runs (used by the bench's unfused baseline):
// y = round_to_x_dtype(rope(norm(x))), each part on when the Prologue has it; p.mean, sm_scale
// and the layout are ignored.
//   x  (B, N, H, D) bf16 / f16 (f32 on the CPU);  y  (B, N, H, D) same dtype, channels contiguous
void norm_rope_store(const TensorView& x, const Prologue& p, TensorView y, Context& ctx);
}  // namespace detail

}  // namespace lowbit
