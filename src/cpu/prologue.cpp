// CPU attention prologue (SPEC §1): the oracle. Plain loops over rows; each row goes through
// norm -> rope -> mean exactly in the order SPEC §1 writes, in fp32 with IEEE rounding. Threads
// split the (batch, head, block) units (the fused k path: (batch, head), whose rows it computes
// once for the mean and the codes). The row loops are compiled for x86-64-v3 too (cpu_clones.h:
// std::fma as one instruction; the same bits).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "src/core/convert_elem.h"
#include "src/core/parallel.h"
#include "src/core/prologue_internal.h"
#include "src/cpu/cpu_clones.h"
#include "src/cpu/rows.h"

namespace lowbit {
namespace cpu {
namespace {

// Correctly rounded 1 / sqrt(s) for s > 0 in fp64 (53 bits, rounded once more to fp32). The
// harness's `prologue.rsqrt` cases show it equal to the CUDA kernels' (src/cuda/rsqrt_rn.cuh) on
// every float significand.
float rsqrt_rn(float s) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(s))); }

// Sum of squares in the order documented at kNormChunk. `part` is scratch of D / kNormChunk
// floats.
// (The chunks' chains advance side by side, each in its own order: independent fmas.)
LOWBIT_CLONES_FMA float sum_of_squares(const float* x, int64_t D, float* part) {
  const int64_t chunks = D / kNormChunk;
  for (int64_t k = 0; k < chunks; ++k) part[k] = x[k * kNormChunk] * x[k * kNormChunk];
  for (int j = 1; j < kNormChunk; ++j)
    for (int64_t k = 0; k < chunks; ++k)
      part[k] = std::fma(x[k * kNormChunk + j], x[k * kNormChunk + j], part[k]);
  for (int64_t step = 1; step < chunks; step *= 2)
    for (int64_t k = 0; k + step < chunks; k += 2 * step) part[k] = part[k] + part[k + step];
  return part[0];
}

// Scratch of one thread for row_values: x, y, the norm weights (D floats each) and the sum of
// squares' chunk partials.
struct RowScratch {
  explicit RowScratch(int64_t D)
      : x(static_cast<size_t>(D)), y(static_cast<size_t>(D)), w(static_cast<size_t>(D)),
        part(static_cast<size_t>(D / kNormChunk + 1)), h(static_cast<size_t>(D)) {}
  std::vector<float> x, y, w, part;
  std::vector<uint16_t> h;  // the norm output in the activation dtype
  int64_t w_row = -1;  // the weight row held in w (-1: none yet)
};

// v = rope(norm(x[b, n, h])) - mean[b, h] for one row (D channels), without sm_scale, into `v`.
// Per element the operations and their order are SPEC §1's; the row's loads are dispatched on
// their dtype once per row (the norm weights once per weight row).
LOWBIT_CLONES_FMA void row_values(const PrologueArgs& a, int64_t b, int64_t n, int64_t h,
                                  RowScratch& s, float* v) {
  const int64_t D = a.dim;
  float* x = s.x.data();
  float* y = s.y.data();
  rows::load(a.x, b * a.x_sb + n * a.x_sn + h * a.x_sh, a.x_dtype, D, x);
  if (a.norm) {
    // (NormScope::token: the token's inverse over its H·D channels, computed before the pass)
    const float inv =
        a.token_inv
            ? a.token_inv[b * a.tokens + n]
            : rsqrt_rn(sum_of_squares(x, D, s.part.data()) / static_cast<float>(D) + a.eps);
    // Weight row: the head's (token scope), the token's (segmented; clamped to the weight's rows:
    // an unchecked index out of range takes the nearest row), else the only one.
    const int64_t wr =
        a.norm_heads ? h
        : a.w_rows   ? std::clamp<int64_t>(a.w_rows[n * a.w_rows_s], 0, a.w_count - 1)
                     : 0;
    if (wr != s.w_row) {
      rows::load(a.w, wr * a.w_sr, a.w_dtype, D, s.w.data());
      s.w_row = wr;
    }
    const float* w = s.w.data();
    for (int64_t c = 0; c < D; ++c) y[c] = (x[c] * inv) * w[c];
    // the norm's stored output: rounded to the activation dtype and read back
    if (a.x_dtype == DType::bf16 || a.x_dtype == DType::f16) {
      rows::store(y, D, a.x_dtype, s.h.data(), 0);
      rows::load(s.h.data(), 0, a.x_dtype, D, y);
    }
  } else {
    std::memcpy(y, x, static_cast<size_t>(D) * sizeof(float));
  }
  std::memcpy(v, y, static_cast<size_t>(D) * sizeof(float));
  if (a.rotate) {
    // Pair p: its leading channel (p, or 2p interleaved) and trailing one (p + pairs, or 2p + 1).
    const int64_t P = a.pairs;
    const int64_t ro = b * a.r_sb + n * a.r_sn;
    auto rotate = [&](auto cos_of, auto sin_of) {
      for (int64_t p = 0; p < P; ++p) {
        const int64_t lead = a.interleaved ? 2 * p : p, trail = a.interleaved ? 2 * p + 1 : p + P;
        const float cs = cos_of(p), sn = sin_of(p);
        v[lead] = std::fma(cs, y[lead], -(sn * y[trail]));
        v[trail] = std::fma(sn, y[lead], cs * y[trail]);
      }
    };
    if (a.r_dtype == DType::f32 && a.r_sp == 2 && a.r_sc == 1) {
      // (the (..., pairs, 2) table of a contiguous row: strides the compiler knows, so the
      // loop vectorizes)
      const float* t = static_cast<const float*>(a.rope) + ro;
      rotate([&](int64_t p) { return t[2 * p]; }, [&](int64_t p) { return t[2 * p + 1]; });
    } else if (a.r_dtype == DType::f32) {  // (the table's dtype dispatched once per row)
      const float* t = static_cast<const float*>(a.rope) + ro;
      const int64_t sp = a.r_sp, sc = a.r_sc;
      rotate([&](int64_t p) { return t[p * sp]; }, [&](int64_t p) { return t[p * sp + sc]; });
    } else {
      rotate([&](int64_t p) { return load_f32(a.rope, ro + p * a.r_sp, a.r_dtype); },
             [&](int64_t p) { return load_f32(a.rope, ro + p * a.r_sp + a.r_sc, a.r_dtype); });
    }
  }
  if (a.mean) {
    const float* m = a.mean + b * a.m_sb + h * a.m_sh;
    for (int64_t c = 0; c < D; ++c) v[c] = v[c] - m[c];
  }
}

int group_of_row(ScaleLayout layout, int r) {
  switch (layout) {
    case ScaleLayout::per_block: return 0;
    case ScaleLayout::thread_q: return r % 8;
    case ScaleLayout::thread_k: return (r % 8) / 2;
    case ScaleLayout::warp_q: return r / 32;
  }
  return 0;
}

// max that propagates NaN (a non-finite amax must reach the scale).
float max_nan(float m, float a) { return (a > m || std::isnan(a)) ? a : m; }

// v *= sm_scale over a row; returns max(m, max |v|) (NaN propagates).
// (A row without NaN takes its maximum as 8 running maxima, element-wise selects that vectorize
// (GCC does not vectorize a float max reduction in one variable): the maximum of floats does not
// depend on the order; a row with a NaN runs the element loop, whose NaN wins.)
LOWBIT_CLONES_FMA float scale_row(float* v, int64_t D, float sm_scale, float m) {
  float lane[8] = {};
  int nan[8] = {};
  int64_t c = 0;
  for (; c + 8 <= D; c += 8)
    for (int l = 0; l < 8; ++l) {
      v[c + l] = v[c + l] * sm_scale;
      const float t = std::fabs(v[c + l]);
      lane[l] = t > lane[l] ? t : lane[l];
      nan[l] |= static_cast<int>(t != t);
    }
  for (int l = 0; c < D; ++c, ++l) {
    v[c] = v[c] * sm_scale;
    const float t = std::fabs(v[c]);
    lane[l] = t > lane[l] ? t : lane[l];
    nan[l] |= static_cast<int>(t != t);
  }
  float mx = 0.f;
  int any_nan = 0;
  for (int l = 0; l < 8; ++l) {
    mx = lane[l] > mx ? lane[l] : mx;
    any_nan |= nan[l];
  }
  if (!any_nan) return max_nan(m, mx);
  for (int64_t c = 0; c < D; ++c) m = max_nan(m, std::fabs(v[c]));
  return m;
}

// The codes of a row at one scale, SPEC §1 rounding: q = v / scale, q += 0.5 * sign(q) (sign(0)
// = +1), truncate; a zero scale (an all-zero group) gives 0, NaN gives 0, the result saturates to
// int8. Written without branches (NaN -> 0, the saturation, the truncation) so that the loop
// vectorizes.
LOWBIT_CLONES_FMA void quantize_row(const float* v, int64_t D, float scale, int8_t* q) {
  if (scale == 0.f) {
    std::memset(q, 0, static_cast<size_t>(D));
    return;
  }
  for (int64_t c = 0; c < D; ++c) {
    float t = v[c] / scale;
    t = t + (t >= 0.f ? 0.5f : -0.5f);
    t = t == t ? t : 0.f;
    t = t >= 127.f ? 127.f : t;
    t = t <= -128.f ? -128.f : t;
    q[c] = static_cast<int8_t>(static_cast<int32_t>(t));
  }
}

}  // namespace

namespace {

// Codes and scales of block `blk` of (b, h). row(n, v) writes v = rope(norm(x)) - mean of token
// n (D floats); vs (block x D floats) and amax (groups floats) are scratch.
template <typename RowFn>
void quantize_block(const PrologueArgs& a, int64_t b, int64_t h, int64_t blk, float* vs,
                    float* amax, RowFn&& row) {
  const int64_t D = a.dim;
  std::fill(amax, amax + a.groups, 0.f);
  for (int r = 0; r < a.block; ++r) {
    float* v = vs + r * D;
    const int64_t n = blk * a.block + r;
    if (n >= a.tokens) {  // rows past N are zero and never reach a scale
      std::fill(v, v + D, 0.f);
      continue;
    }
    row(n, v);
    float& m = amax[group_of_row(a.layout, r)];
    m = scale_row(v, D, a.sm_scale, m);
  }
  float* scale = a.scale + b * a.s_sb + h * a.s_sh + blk * a.groups;
  for (int g = 0; g < a.groups; ++g) scale[g] = amax[g] / 127.f + a.scale_eps;
  for (int r = 0; r < a.block; ++r) {
    const int64_t n = blk * a.block + r;
    if (n >= a.tokens) break;
    const float sc = scale[group_of_row(a.layout, r)];
    quantize_row(vs + r * D, D, sc, a.q + b * a.q_sb + n * a.q_sn + h * a.q_sh);
  }
}

// The mean pass's partial sum of one 64-token block (SPEC §1.3): its rows added in token order,
// from zero. row(n) returns rope(norm(x)) of token n (D floats).
template <typename RowFn>
void block_sum(const PrologueArgs& a, int64_t blk, float* sum, RowFn&& row) {
  const int64_t D = a.dim;
  std::fill(sum, sum + D, 0.f);
  const int64_t n1 = std::min(a.tokens, (blk + 1) * kMeanBlockRows);
  for (int64_t n = blk * kMeanBlockRows; n < n1; ++n) {
    const float* v = row(n);
    for (int64_t c = 0; c < D; ++c) sum[c] = sum[c] + v[c];
  }
}

// The mean of one (b, h) from its blocks' sums (nblk x D): added in block order, divided by N.
void finish_mean(const PrologueArgs& a, const float* sums, int64_t nblk, float* out) {
  for (int64_t c = 0; c < a.dim; ++c) {
    float t = 0.f;
    for (int64_t k = 0; k < nblk; ++k) t = t + sums[k * a.dim + c];
    out[c] = t / static_cast<float>(a.tokens);
  }
}

// norm_rope_mean_quantize holds one (b, h)'s rows rope(norm(x)) (N x D floats) while it makes
// the mean and the codes from them, up to this many floats per thread (16 MB: every thread holds
// one head, so a many-core host holds threads x 16 MB; Wan's 32760 x 128 fits); beyond, the two
// passes each compute the rows (the same bits either way).
constexpr int64_t kHeldRowsLimit = int64_t{1} << 22;

}  // namespace

void norm_rope_quantize(const PrologueArgs& a, Context& ctx) {
  const int64_t D = a.dim, units = a.batch * a.heads * a.n_blocks;
  parallel_for(units, 1, ctx, [&](int64_t begin, int64_t end) {
    RowScratch rs(D);
    std::vector<float> vs(static_cast<size_t>(a.block * D)), amax(static_cast<size_t>(a.groups));
    for (int64_t u = begin; u < end; ++u) {
      const int64_t blk = u % a.n_blocks, h = (u / a.n_blocks) % a.heads;
      const int64_t b = u / (a.n_blocks * a.heads);
      quantize_block(a, b, h, blk, vs.data(), amax.data(),
                     [&](int64_t n, float* v) { row_values(a, b, n, h, rs, v); });
    }
  });
}

void norm_rope_mean(const PrologueArgs& a, Context& ctx) {
  const int64_t D = a.dim;
  const int64_t nblk = (a.tokens + kMeanBlockRows - 1) / kMeanBlockRows;
  const int64_t units = a.batch * a.heads * nblk;
  std::vector<float> partial(static_cast<size_t>(units * D));
  parallel_for(units, 1, ctx, [&](int64_t begin, int64_t end) {
    RowScratch rs(D);
    std::vector<float> v(D);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t blk = u % nblk, h = (u / nblk) % a.heads, b = u / (nblk * a.heads);
      block_sum(a, blk, partial.data() + u * D, [&](int64_t n) {
        row_values(a, b, n, h, rs, v.data());
        return static_cast<const float*>(v.data());
      });
    }
  });
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      finish_mean(a, partial.data() + (b * a.heads + h) * nblk * D, nblk,
                  a.mean_out + b * a.mo_sb + h * a.mo_sh);
}

// The oracle of the fused CUDA k path: norm_rope_mean, then norm_rope_quantize with that mean.
// Per (b, h) the rows rope(norm(x)) are computed once and held for both steps (the same values,
// sums and codes as the two calls), unless they exceed kHeldRowsLimit.
void norm_rope_mean_quantize(const PrologueArgs& a, Context& ctx) {
  PrologueArgs m = a;
  m.mean = nullptr;  // the mean pass normalizes and rotates only
  const int64_t D = a.dim, N = a.tokens;
  if (N * D > kHeldRowsLimit) {
    norm_rope_mean(m, ctx);
    norm_rope_quantize(a, ctx);
    return;
  }
  const int64_t nblk = (N + kMeanBlockRows - 1) / kMeanBlockRows;
  parallel_for(a.batch * a.heads, 1, ctx, [&](int64_t begin, int64_t end) {
    RowScratch rs(D);
    std::vector<float> rows(static_cast<size_t>(N * D)), sums(static_cast<size_t>(nblk * D));
    std::vector<float> vs(static_cast<size_t>(a.block * D)), amax(static_cast<size_t>(a.groups));
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u % a.heads, b = u / a.heads;
      for (int64_t n = 0; n < N; ++n) row_values(m, b, n, h, rs, rows.data() + n * D);
      for (int64_t blk = 0; blk < nblk; ++blk)
        block_sum(a, blk, sums.data() + blk * D,
                  [&](int64_t n) { return static_cast<const float*>(rows.data() + n * D); });
      float* mean = a.mean_out + b * a.mo_sb + h * a.mo_sh;
      finish_mean(a, sums.data(), nblk, mean);
      // row_values' last step with the mean: v = y - mean.
      for (int64_t blk = 0; blk < a.n_blocks; ++blk)
        quantize_block(a, b, h, blk, vs.data(), amax.data(), [&](int64_t n, float* v) {
          const float* y = rows.data() + n * D;
          for (int64_t c = 0; c < D; ++c) v[c] = y[c] - mean[c];
        });
    }
  });
}

void token_norm_inv(const PrologueArgs& a, float* out, Context& ctx) {
  const int64_t D = a.dim, C = a.heads * D;
  parallel_for(a.batch * a.tokens, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(C)), part(static_cast<size_t>(C / kNormChunk + 1));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / a.tokens, n = t % a.tokens;
      for (int64_t h = 0; h < a.heads; ++h)
        rows::load(a.x, b * a.x_sb + n * a.x_sn + h * a.x_sh, a.x_dtype, D, row.data() + h * D);
      out[t] = rsqrt_rn(sum_of_squares(row.data(), C, part.data()) / static_cast<float>(C) + a.eps);
    }
  });
}

void norm_rsqrt(const float* s, float* out, int64_t n, Context& ctx) {
  parallel_for(n, 1 << 14, ctx, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = rsqrt_rn(s[i]);
  });
}

void norm_rope_store(const PrologueArgs& a, void* out, int64_t o_sb, int64_t o_sn, int64_t o_sh,
                     Context& ctx) {
  const int64_t D = a.dim, rows = a.batch * a.tokens * a.heads;
  parallel_for(rows, 16, ctx, [&](int64_t begin, int64_t end) {
    RowScratch rs(D);
    std::vector<float> v(D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i % a.heads, n = (i / a.heads) % a.tokens, b = i / (a.heads * a.tokens);
      row_values(a, b, n, h, rs, v.data());
      const int64_t o = b * o_sb + n * o_sn + h * o_sh;
      for (int64_t c = 0; c < D; ++c) store_f32(out, o + c, a.x_dtype, v[c]);
    }
  });
}

}  // namespace cpu
}  // namespace lowbit
