// The k path of short rows in one kernel (session 52): norm_rope_mean_quantize without norm or
// rope where each (batch, head) holds at most a few hundred tokens (batches of short sequences,
// attention_varlen's padded buckets). With norm or rope the two passes run (session 53: this
// kernel with them, its rows' values made twice in CTAs of one head each, was issue-bound and
// 1.7x slower than the passes; docs/prologue.md "Session 53").
//
// The two passes (the mean kernel + its final sum, then the quantize kernel) read x twice from
// DRAM and, at a few hundred tokens a head, run their CTAs far from memory speed (H100, 64 x 256
// tokens, 24 heads, D 128: the mean pass 0.0705 ms = 1.43 TB/s, the quantize pass 0.054 ms). Here
// one CTA owns one (batch, head): it streams the head's rows into shared memory once, adding each
// thread's channels as they arrive (the mean), then makes the codes from the rows it holds.
//
// Thread mapping: a row of D channels is D / 8 lanes of one 16-byte chunk each ("slot" = the
// thread's row within a step of 256 / (D / 8) rows). The mean: each thread adds its rows in step
// order, then thread c < D adds the slots' sums in slot order and divides by the item's tokens
// (IEEE division, as mean_of): deterministic, not the two passes' order (their mean agrees within
// its last bits). The codes follow SPEC §1 exactly as the quantize pass makes them from that mean:
// v = x - mean (then x sm_scale when it is not 1), the group's scale div.full(max |v|, 127) +
// scale_eps over the layout's rows (max with NaN propagated), the codes by quantize_fqs_n (the
// round-3/5 kernels' form: q = v x rcp(scale), exact for a normal scale); zero scale: codes 0.
// A thread's rows are slot + S i (S = rows per step, a multiple of 8), so its scale group is the
// same in every block for PER_BLOCK, THREAD_Q and THREAD_K: one maximum per slot per block,
// exchanged through shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "src/core/check.h"
#include "src/core/prologue_internal.h"
#include "src/cuda/common.cuh"
#include "src/cuda/prologue_common.cuh"

namespace lowbit {
namespace cuda {
namespace {

constexpr int kShortThreads = 256;
constexpr int kShortMaxSteps = 8;  // rows of one block per thread (block <= 8 x rows per step)
constexpr int kShortUnroll = 8;    // row loads in flight per thread

// grid: (batch x heads); dynamic shared memory: the head's rows, rows_cap x D 16-bit values.
template <int D, bool BF16>
__global__ void __launch_bounds__(kShortThreads, 3) short_k_kernel(const PrologueArgs a) {
  constexpr int LANES = D / 8, SLOTS = kShortThreads / LANES;
  static_assert(SLOTS % 8 == 0, "rows per step: a multiple of 8 (the layouts' row groups)");
  extern __shared__ uint4 rows_sh[];  // row r: rows_sh[r * LANES + lane]
  __shared__ float red[SLOTS][D];
  __shared__ float mean_sh[D];
  __shared__ float slot_max[2][SLOTS];
  const int tid = threadIdx.x, lane = tid % LANES, slot = tid / LANES;
  const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int64_t nb = tokens_of(a, b);  // (a padded varlen batch: the item's own tokens)
  const int N = static_cast<int>(nb);
  const uint16_t* x = static_cast<const uint16_t*>(a.x) + x_item(a, b) + h * a.x_sh + lane * 8;

  // The rows into shared memory, each thread adding its 8 channels in step order.
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  for (int r0 = slot; r0 < N; r0 += kShortUnroll * SLOTS) {
    uint4 u[kShortUnroll];
#pragma unroll
    for (int i = 0; i < kShortUnroll; ++i) {
      const int r = r0 + i * SLOTS;
      u[i] = r < N ? load_stream16(x + static_cast<int64_t>(r) * a.x_sn) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kShortUnroll; ++i) {
      const int r = r0 + i * SLOTS;
      if (r < N) {
        rows_sh[r * LANES + lane] = u[i];
        float f[8];
        unpack<BF16>(u[i], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], f[j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) red[slot][lane * 8 + j] = acc[j];
  __syncthreads();
  if (tid < D) {
    float total = 0.f;
    for (int s = 0; s < SLOTS; ++s) total = __fadd_rn(total, red[s][tid]);
    const float mean = N > 0 ? __fdiv_rn(total, static_cast<float>(N)) : 0.f;
    mean_sh[tid] = mean;
    a.mean_out[b * a.mo_sb + h * a.mo_sh + tid] = mean;
  }
  __syncthreads();
  float mu[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) mu[j] = mean_sh[lane * 8 + j];

  // Codes, block by block: the thread's rows blk block + slot + SLOTS i, i < block / SLOTS; the
  // maximum from the rows in shared memory, then the codes from them again (no values held in
  // registers across the block's barrier: 3 CTAs an SM).
  const int g = group_of_row(a.layout, slot);
  uint32_t gslots = 0;  // the slots of the thread's scale group (SLOTS <= 32)
  for (int s = 0; s < SLOTS; ++s) gslots |= group_of_row(a.layout, s) == g ? 1u << s : 0u;
  const bool writer = lane == 0 && (gslots & ((1u << slot) - 1)) == 0;  // the group's first slot
  const int steps = a.block / SLOTS;
  const bool scaled = a.sm_scale != 1.f;
  // v = x - mean (x sm_scale), 0 for a row past N (never -mean)
  auto values = [&](int64_t r, float(&v)[8]) {
    const bool ok = r < N;
    float f[8];
    unpack<BF16>(ok ? rows_sh[r * LANES + lane] : make_uint4(0, 0, 0, 0), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float t = __fsub_rn(f[j], mu[j]);
      if (scaled) t = __fmul_rn(t, a.sm_scale);
      v[j] = ok ? t : 0.f;
    }
  };
  for (int64_t blk = 0; blk < a.n_blocks; ++blk) {
    const int64_t r0 = blk * a.block + slot;
    float m = 0.f;
    for (int i = 0; i < steps; ++i) {
      float v[8];
      values(r0 + i * SLOTS, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) m = max_nan(m, fabsf(v[j]));
    }
    m = lane_max<LANES>(m);
    float* const sm = slot_max[blk & 1];
    if (lane == 0) sm[slot] = m;
    __syncthreads();
    float gm = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
      if (gslots & (1u << s)) gm = max_nan(gm, sm[s]);
    const float scale = __fadd_rn(div_full(gm, 127.f), a.scale_eps);
    if (writer) a.scale[b * a.s_sb + h * a.s_sh + blk * a.groups + g] = scale;
    for (int i = 0; i < steps; ++i) {
      const int64_t r = r0 + i * SLOTS;
      if (r >= N) break;
      float v[8];
      values(r, v);
      // (the quantize pass's codes: one reciprocal per group, no conversion per value; a zero
      // scale gives codes 0, a non-finite one div.full's)
      uint32_t packed[2];
      quantize_fqs_n<8, true>(v, scale, packed);
      int8_t* q = a.q + b * a.q_sb + r * a.q_sn + h * a.q_sh + lane * 8;
      *reinterpret_cast<uint2*>(q) = make_uint2(packed[0], packed[1]);
    }
    // (slot_max alternates between two buffers: the next block's stores need no barrier here)
  }
}

// Rows per step at head dim d, and the kernel's dynamic shared memory: the tokens rounded up to
// whole steps, d 16-bit values each.
int short_slots(int64_t d) { return kShortThreads / static_cast<int>(d / 8); }
size_t short_k_smem(const PrologueArgs& a) {
  const int64_t slots = short_slots(a.dim);
  return static_cast<size_t>((a.tokens + slots - 1) / slots * slots * a.dim * 2);
}

template <int D, bool BF16>
void launch_short_k(const PrologueArgs& a, Context& ctx) {
  const size_t smem = short_k_smem(a);
  auto kernel = short_k_kernel<D, BF16>;
  // (always: the static arrays count toward the 48 KB a launch gets without it)
  set_kernel_smem(kernel, static_cast<int>(smem), "norm_rope_mean_quantize", "shared memory");
  kernel<<<static_cast<unsigned>(a.batch * a.heads), kShortThreads, smem, stream_of(ctx)>>>(a);
  check_launch("norm_rope_mean_quantize");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool short_k_supported(const PrologueArgs& a) {
  const detail::PrologueCudaTuning t = detail::prologue_cuda_tuning();
  const int64_t limit = t.short_k_tokens;
  if (a.tokens < 1 || a.tokens > limit || a.norm || a.rotate || a.norm_heads || a.token_inv)
    return false;
  if (a.dim != 64 && a.dim != 128) return false;
  if (a.x_dtype != DType::bf16 && a.x_dtype != DType::f16) return false;
  if (a.layout != ScaleLayout::per_block && a.layout != ScaleLayout::thread_q &&
      a.layout != ScaleLayout::thread_k)
    return false;
  const int slots = short_slots(a.dim);
  if (a.block % slots != 0 || a.block > kShortMaxSteps * slots) return false;
  // 16-byte row chunks in, 8-byte code chunks out; one CTA per (batch, head), enough of them to
  // fill the GPU (fewer heads: the two passes split the tokens too).
  if (!aligned16(a.x) || (a.x_sn * 2) % 16 || (a.x_sh * 2) % 16 || (a.x_sb * 2) % 16) return false;
  if (reinterpret_cast<uintptr_t>(a.q) % 8 || a.q_sn % 8 || a.q_sh % 8 || a.q_sb % 8) return false;
  if (!a.mean_out || a.mean != a.mean_out) return false;
  const int64_t min_ctas = knob_or_sms(t.short_k_min_ctas);
  if (a.batch * a.heads < min_ctas || a.batch * a.heads > INT32_MAX) return false;
  return short_k_smem(a) <= 160 * 1024;
}

void short_k_mean_quantize(const PrologueArgs& a, Context& ctx) {
  const bool bf16 = a.x_dtype == DType::bf16;
  if (a.dim == 64)
    bf16 ? launch_short_k<64, true>(a, ctx) : launch_short_k<64, false>(a, ctx);
  else
    bf16 ? launch_short_k<128, true>(a, ctx) : launch_short_k<128, false>(a, ctx);
}

}  // namespace cuda
}  // namespace lowbit
