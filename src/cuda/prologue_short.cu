// The k path of short rows in one kernel (session 52; with norm and rope since session 53):
// norm_rope_mean_quantize where each (batch, head) holds at most a few hundred tokens (batches of
// short sequences, attention_varlen's padded buckets).
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
// With norm or rope (NR): the rows stay raw in shared memory and each use of a row makes its
// values again as SPEC §1 orders them (norm over the head: the 8-channel chunks' squares and
// their pairwise tree, the CPU oracle's order; y rounded to the activation dtype; the pairs'
// fmas), once for the mean and once for the codes, where a block's values wait in registers for
// its maximum (2 CTAs an SM).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

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
constexpr int kShortNrSteps = 4;   // with norm or rope: a block's rows per thread held (registers)

// 8 consecutive norm weights at element `off` of a.w (f32, bf16 or f16; 16-byte aligned, which
// short_k_supported checks): two or one vector loads, whatever the dtype, in one small body.
__device__ __forceinline__ void load_w8(const PrologueArgs& a, int64_t off, float (&w)[8]) {
  if (a.w_dtype == DType::f32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.w) + off);
    const float4 lo = __ldg(p), hi = __ldg(p + 1);
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z;
    w[7] = hi.w;
  } else {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.w) + off));
    if (a.w_dtype == DType::bf16)
      unpack<true>(u, w);
    else
      unpack<false>(u, w);
  }
}

// The lane's 8 channels (lane * 8 ...) of item b's row n after the norm and the rotation (SPEC
// §1, as row_values in prologue.cu computes them), from its raw 16 bytes u. All lanes of the row
// call it together (the sum of squares and the split-half partners are shuffles); ok false: a row
// past the item's tokens (the caller discards the values). NORM, ROPE (kRopeNone / kRopePaired:
// split halves / kRopeInterleaved) and the f32 table's MODE are template arguments, and the
// weight and table loads come first and unconditionally (a row past the tokens, or a lane whose
// channels do not rotate, reads a valid address and ignores it): the first form (every choice a
// branch, the table loads inside the rotating lanes' branch after the norm's shuffles) waited for
// each row's table in turn, ~32 L2 round trips a thread in a row, and ran 2x slower than the two
// passes (H100, 64 x 256 tokens).
template <int D, bool BF16, bool NORM, int ROPE, int MODE>
__device__ __forceinline__ void short_norm_rope(const PrologueArgs& a, int64_t b, int n, bool ok,
                                                int lane, uint4 u, float (&v)[8]) {
  constexpr int LANES = D / 8, NP = ROPE == kRopeInterleaved ? 4 : 8;
  const int P = static_cast<int>(a.pairs), c0 = lane * 8;
  // the loads: the token's weight row (segmented) or the shared one, the rotary pairs
  float w[8], cs[NP], sn[NP];
  if constexpr (NORM)
    load_w8(a, (a.w_rows && ok ? static_cast<int64_t>(seg_row(a, b, n)) * a.w_sr : 0) + c0, w);
  const bool lead = c0 < P, rot = c0 < 2 * P;  // (interleaved: pairs c0 / 2 ... < P)
  if constexpr (ROPE != kRopeNone) {
    const int pair = !rot ? 0 : ROPE == kRopeInterleaved ? c0 / 2 : lead ? c0 : c0 - P;
    load_table_n<NP>(a, MODE, ok ? r_item(a, b) + static_cast<int64_t>(n) * a.r_sn : 0, pair, cs,
                     sn);
  }
  float y[8];
  unpack<BF16>(u, y);
  if constexpr (NORM) {
    // (the lanes' pairwise tree over 8-channel chunks: the oracle's kNormChunk order)
    const float total = lane_tree_sum<LANES>(chunk_squares(y));
    static_assert((D & (D - 1)) == 0, "D must be a power of two (total / D exact as a product)");
    const float inv = norm_rsqrt(__fadd_rn(__fmul_rn(total, 1.f / static_cast<float>(D)), a.eps));
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = round_act<BF16>(__fmul_rn(__fmul_rn(y[j], inv), w[j]));
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = y[j];
  if constexpr (ROPE == kRopeInterleaved) {
    // pairs c0 / 2 .. c0 / 2 + 3 (P a multiple of 4: all rotate or none)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float l = __fmaf_rn(cs[i], y[2 * i], -__fmul_rn(sn[i], y[2 * i + 1]));
      const float t = __fmaf_rn(sn[i], y[2 * i], __fmul_rn(cs[i], y[2 * i + 1]));
      v[2 * i] = rot ? l : y[2 * i];
      v[2 * i + 1] = rot ? t : y[2 * i + 1];
    }
  } else if constexpr (ROPE == kRopePaired) {
    // split halves: channel c < P pairs with c + P (P a multiple of 8: a lane's channels all
    // lead, all trail or all pass), the partner lane P / 8 lanes away in the same row
    const int me = static_cast<int>(threadIdx.x % 32);
    const int src = !rot ? me : lead ? me + P / 8 : me - P / 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float o = __shfl_sync(0xffffffffu, y[j], src);
      const float r = lead ? __fmaf_rn(cs[j], y[j], -__fmul_rn(sn[j], o))
                           : __fmaf_rn(sn[j], o, __fmul_rn(cs[j], y[j]));
      v[j] = rot ? r : y[j];
    }
  }
}

// grid: (batch x heads); dynamic shared memory: the head's rows, rows_cap x D 16-bit values.
// NORM, ROPE, MODE: short_norm_rope's (NR: either on).
template <int D, bool BF16, bool NORM, int ROPE, int MODE>
__global__ void __launch_bounds__(kShortThreads, NORM || ROPE != kRopeNone ? 2 : 3)
    short_k_kernel(const PrologueArgs a) {
  constexpr bool NR = NORM || ROPE != kRopeNone;
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
  // the row's values (norm, rope) for the mean and the codes
  auto row_vals = [&](uint4 u, int r, bool ok, float(&f)[8]) {
    if constexpr (NR)
      short_norm_rope<D, BF16, NORM, ROPE, MODE>(a, b, r, ok, lane, u, f);
    else
      unpack<BF16>(u, f);
  };

  // The rows into shared memory. Without NR each thread adds its 8 channels as they arrive, in
  // step order; with NR the loads only, then (behind a barrier) each thread makes its rows'
  // values from shared memory and adds them in the same order: a row's norm and rope are a chain
  // of shuffles and table loads that, done as its row arrived, held up the next loads (H100,
  // 64 x 256 tokens: 0.238 ms against 0.127 for the two passes). (The loops' bounds are the
  // CTA's, so that a row's shuffles meet every lane of the warp.)
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  auto add = [&](const float(&f)[8]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], f[j]);
  };
  for (int base = 0; base < N; base += kShortUnroll * SLOTS) {
    uint4 u[kShortUnroll];
#pragma unroll
    for (int i = 0; i < kShortUnroll; ++i) {
      const int r = base + slot + i * SLOTS;
      u[i] = r < N ? load_stream16(x + static_cast<int64_t>(r) * a.x_sn) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kShortUnroll; ++i) {
      const int r = base + slot + i * SLOTS;
      if (r < N) {
        rows_sh[r * LANES + lane] = u[i];
        if constexpr (!NR) {
          float f[8];
          unpack<BF16>(u[i], f);
          add(f);
        }
      }
    }
  }
  if constexpr (NR) {
    __syncthreads();
    constexpr int U = kShortNrSteps;  // rows whose chains overlap
    for (int base = 0; base < N; base += U * SLOTS) {
      float f[U][8];
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int r = base + slot + i * SLOTS;
        const bool ok = r < N;
        row_vals(ok ? rows_sh[r * LANES + lane] : make_uint4(0, 0, 0, 0), r, ok, f[i]);
      }
#pragma unroll
      for (int i = 0; i < U; ++i)
        if (base + slot + i * SLOTS < N) add(f[i]);
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

  // Codes, block by block: the thread's rows blk block + slot + SLOTS i, i < block / SLOTS. The
  // maximum from the rows in shared memory, then the codes: without NR from the rows again (no
  // values held in registers across the block's barrier: 3 CTAs an SM), with NR from the values
  // held (making them costs more than the registers).
  const int g = group_of_row(a.layout, slot);
  uint32_t gslots = 0;  // the slots of the thread's scale group (SLOTS <= 32)
  for (int s = 0; s < SLOTS; ++s) gslots |= group_of_row(a.layout, s) == g ? 1u << s : 0u;
  const bool writer = lane == 0 && (gslots & ((1u << slot) - 1)) == 0;  // the group's first slot
  const int steps = a.block / SLOTS;
  const bool scaled = a.sm_scale != 1.f;
  // v = rope(norm(x)) - mean (x sm_scale), 0 for a row past N (never -mean)
  auto values = [&](int r, float(&v)[8]) {
    const bool ok = r < N;
    float f[8];
    row_vals(ok ? rows_sh[r * LANES + lane] : make_uint4(0, 0, 0, 0), r, ok, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float t = __fsub_rn(f[j], mu[j]);
      if (scaled) t = __fmul_rn(t, a.sm_scale);
      v[j] = ok ? t : 0.f;
    }
  };
  auto store_codes = [&](int r, const float(&v)[8], float scale) {
    // (the quantize pass's codes: one reciprocal per group, no conversion per value; a zero
    // scale gives codes 0, a non-finite one div.full's)
    uint32_t packed[2];
    quantize_fqs_n<8, true>(v, scale, packed);
    int8_t* q = a.q + b * a.q_sb + static_cast<int64_t>(r) * a.q_sn + h * a.q_sh + lane * 8;
    *reinterpret_cast<uint2*>(q) = make_uint2(packed[0], packed[1]);
  };
  // the group's scale from the slots' maxima (one barrier a block)
  auto group_scale = [&](int64_t blk, float m) {
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
    return scale;
    // (slot_max alternates between two buffers: the next block's stores need no barrier here)
  };
  for (int64_t blk = 0; blk < a.n_blocks; ++blk) {
    const int r0 = static_cast<int>(blk * a.block) + slot;
    float m = 0.f;
    if constexpr (NR) {
      float v[kShortNrSteps][8];
#pragma unroll
      for (int i = 0; i < kShortNrSteps; ++i) {
        if (i < steps) {  // (uniform: every lane of a row makes its values)
          values(r0 + i * SLOTS, v[i]);
#pragma unroll
          for (int j = 0; j < 8; ++j) m = max_nan(m, fabsf(v[i][j]));
        }
      }
      const float scale = group_scale(blk, m);
#pragma unroll
      for (int i = 0; i < kShortNrSteps; ++i)
        if (i < steps && r0 + i * SLOTS < N) store_codes(r0 + i * SLOTS, v[i], scale);
    } else {
      for (int i = 0; i < steps; ++i) {
        float v[8];
        values(r0 + i * SLOTS, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) m = max_nan(m, fabsf(v[j]));
      }
      const float scale = group_scale(blk, m);
      for (int i = 0; i < steps; ++i) {
        const int r = r0 + i * SLOTS;
        if (r >= N) break;
        float v[8];
        values(r, v);
        store_codes(r, v, scale);
      }
    }
  }
}

// Rows per step at head dim d, and the kernel's dynamic shared memory: the tokens rounded up to
// whole steps, d 16-bit values each.
int short_slots(int64_t d) { return kShortThreads / static_cast<int>(d / 8); }
size_t short_k_smem(const PrologueArgs& a) {
  const int64_t slots = short_slots(a.dim);
  return static_cast<size_t>((a.tokens + slots - 1) / slots * slots * a.dim * 2);
}

template <int D, bool BF16, bool NORM, int ROPE, int MODE>
void launch_short_k(const PrologueArgs& a, Context& ctx) {
  const size_t smem = short_k_smem(a);
  auto kernel = short_k_kernel<D, BF16, NORM, ROPE, MODE>;
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
  if (a.tokens < 1 || a.tokens > limit || a.norm_heads || a.token_inv) return false;
  if ((a.norm || a.rotate) && !t.short_k_norm_rope) return false;
  // (a lane's 8 channels rotate all or none: see short_norm_rope; an f32 table read by vector
  // loads; weights 16-byte aligned rows)
  if (a.rotate &&
      ((a.interleaved ? a.pairs % 4 : a.pairs % 8) != 0 || table_mode_of(a) == kTableScalar))
    return false;
  if (a.norm && (a.w_dtype != DType::f32 && a.w_dtype != DType::bf16 && a.w_dtype != DType::f16))
    return false;
  if (a.norm && (!aligned16(a.w) || (a.w_sr * dtype_bits(a.w_dtype) / 8) % 16 != 0)) return false;
  if (a.dim != 64 && a.dim != 128) return false;
  if (a.x_dtype != DType::bf16 && a.x_dtype != DType::f16) return false;
  if (a.layout != ScaleLayout::per_block && a.layout != ScaleLayout::thread_q &&
      a.layout != ScaleLayout::thread_k)
    return false;
  const int slots = short_slots(a.dim);
  const int max_steps = a.norm || a.rotate ? kShortNrSteps : kShortMaxSteps;
  if (a.block % slots != 0 || a.block > max_steps * slots) return false;
  // 16-byte row chunks in, 8-byte code chunks out; one CTA per (batch, head), enough of them to
  // fill the GPU (fewer heads: the two passes split the tokens too).
  if (!aligned16(a.x) || (a.x_sn * 2) % 16 || (a.x_sh * 2) % 16 || (a.x_sb * 2) % 16) return false;
  if (reinterpret_cast<uintptr_t>(a.q) % 8 || a.q_sn % 8 || a.q_sh % 8 || a.q_sb % 8) return false;
  if (!a.mean_out || a.mean != a.mean_out) return false;
  const int64_t min_ctas = t.short_k_min_ctas > 0 ? t.short_k_min_ctas : multiprocessor_count();
  if (a.batch * a.heads < min_ctas || a.batch * a.heads > INT32_MAX) return false;
  return short_k_smem(a) <= 160 * 1024;
}

void short_k_mean_quantize(const PrologueArgs& a, Context& ctx) {
  const bool bf16 = a.x_dtype == DType::bf16;
  const int rope = !a.rotate ? kRopeNone : a.interleaved ? kRopeInterleaved : kRopePaired;
  const int mode = table_mode_of(a);
  // (D, dtype) x norm on / off x (no rope | split / interleaved pairs x pairs / matrix table)
  auto launch = [&](auto d, auto norm, auto rp, auto md) {
    constexpr int kD = decltype(d)::value, kRope = decltype(rp)::value;
    constexpr int kMode = decltype(md)::value;
    constexpr bool kNorm = decltype(norm)::value;
    bf16 ? launch_short_k<kD, true, kNorm, kRope, kMode>(a, ctx)
         : launch_short_k<kD, false, kNorm, kRope, kMode>(a, ctx);
  };
  auto ropes = [&](auto d, auto norm) {
    using Pairs = std::integral_constant<int, kTablePairsF32>;
    using Matrix = std::integral_constant<int, kTableMatrixF32>;
    using Split = std::integral_constant<int, kRopePaired>;
    using Inter = std::integral_constant<int, kRopeInterleaved>;
    if (rope == kRopeNone)
      launch(d, norm, std::integral_constant<int, kRopeNone>{}, Pairs{});
    else if (rope == kRopePaired)
      mode == kTablePairsF32 ? launch(d, norm, Split{}, Pairs{})
                             : launch(d, norm, Split{}, Matrix{});
    else
      mode == kTablePairsF32 ? launch(d, norm, Inter{}, Pairs{})
                             : launch(d, norm, Inter{}, Matrix{});
  };
  auto forms = [&](auto d) { a.norm ? ropes(d, std::true_type{}) : ropes(d, std::false_type{}); };
  if (a.dim == 64)
    forms(std::integral_constant<int, 64>{});
  else
    forms(std::integral_constant<int, 128>{});
}

}  // namespace cuda
}  // namespace lowbit
