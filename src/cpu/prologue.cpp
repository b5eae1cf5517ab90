// CPU attention prologue (SPEC §1): the oracle. Plain loops over rows; each row goes through
// norm -> rope -> mean exactly in the order SPEC §1 writes, in fp32 with IEEE rounding. Threads
// split the (batch, head, block) units.
#include <cmath>
#include <cstring>
#include <vector>

#include "src/core/convert_elem.h"
#include "src/core/parallel.h"
#include "src/core/prologue_internal.h"

namespace lowbit {
namespace cpu {
namespace {

// fp32 value rounded to the activation dtype and read back (the norm's stored output).
float round_to_dtype(float v, DType dt) {
  switch (dt) {
    case DType::bf16: return dt::bf16_to_f32(dt::f32_to_bf16(v));
    case DType::f16: return dt::f16_to_f32(dt::f32_to_f16(v));
    default: return v;
  }
}

// Correctly rounded 1 / sqrt(s) for s > 0 (the CUDA kernels use __frsqrt_rn): the double result
// carries 53 bits, and 1/sqrt of a float is never a float rounding midpoint.
float rsqrt_rn(float s) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(s))); }

// Sum of squares in the order documented at kNormChunk.
float sum_of_squares(const float* x, int64_t D) {
  const int64_t chunks = D / kNormChunk;
  std::vector<float> part(static_cast<size_t>(chunks));
  for (int64_t k = 0; k < chunks; ++k) {
    const float* c = x + k * kNormChunk;
    float s = c[0] * c[0];
    for (int j = 1; j < kNormChunk; ++j) s = std::fma(c[j], c[j], s);
    part[k] = s;
  }
  for (int64_t step = 1; step < chunks; step *= 2)
    for (int64_t k = 0; k + step < chunks; k += 2 * step) part[k] = part[k] + part[k + step];
  return part[0];
}

// v = rope(norm(x[b, n, h])) - mean[b, h] for one row (D channels), without sm_scale.
// `y` and `x` are scratch of D floats each; the result is written to `v`.
void row_values(const PrologueArgs& a, int64_t b, int64_t n, int64_t h, float* x, float* y,
                float* v) {
  const int64_t D = a.dim;
  const int64_t xo = b * a.x_sb + n * a.x_sn + h * a.x_sh;
  for (int64_t c = 0; c < D; ++c) x[c] = load_f32(a.x, xo + c, a.x_dtype);
  if (a.norm) {
    const float inv = rsqrt_rn(sum_of_squares(x, D) / static_cast<float>(D) + a.eps);
    const int64_t wo = a.w_rows ? static_cast<int64_t>(a.w_rows[n * a.w_rows_s]) * a.w_sr : 0;
    for (int64_t c = 0; c < D; ++c) {
      const float w = load_f32(a.w, wo + c, a.w_dtype);
      y[c] = round_to_dtype((x[c] * inv) * w, a.x_dtype);
    }
  } else {
    std::memcpy(y, x, static_cast<size_t>(D) * sizeof(float));
  }
  std::memcpy(v, y, static_cast<size_t>(D) * sizeof(float));
  if (a.rotate) {
    const int64_t P = a.pairs;
    const int64_t ro = b * a.r_sb + n * a.r_sn;
    for (int64_t c = 0; c < 2 * P; ++c) {
      bool leading;
      int64_t partner, pair;
      if (a.interleaved) {
        leading = c % 2 == 0;
        partner = c ^ 1;
        pair = c / 2;
      } else {
        leading = c < P;
        partner = leading ? c + P : c - P;
        pair = leading ? c : c - P;
      }
      const float cs = load_f32(a.rope, ro + pair * a.r_sp, a.r_dtype);
      const float sn = load_f32(a.rope, ro + pair * a.r_sp + a.r_sc, a.r_dtype);
      const float other = y[partner];
      v[c] = leading ? std::fma(cs, y[c], -(sn * other)) : std::fma(sn, other, cs * y[c]);
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

// SPEC §1 rounding: q = v / scale, q += 0.5 * sign(q) (sign(0) = +1), truncate; a zero scale
// (an all-zero group) gives 0, NaN gives 0, the result saturates to int8.
int8_t quantize_code(float v, float scale) {
  if (scale == 0.f) return 0;
  float q = v / scale;
  q = q + (q >= 0.f ? 0.5f : -0.5f);
  if (std::isnan(q)) return 0;
  if (q >= 127.f) return 127;
  if (q <= -128.f) return -128;
  return static_cast<int8_t>(static_cast<int32_t>(q));  // truncation toward zero
}

// max that propagates NaN (a non-finite amax must reach the scale).
float max_nan(float m, float a) { return (a > m || std::isnan(a)) ? a : m; }

}  // namespace

void norm_rope_quantize(const PrologueArgs& a, Context& ctx) {
  const int64_t D = a.dim, units = a.batch * a.heads * a.n_blocks;
  parallel_for(units, 1, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> xs(D), ys(D), vs(static_cast<size_t>(a.block * D));
    std::vector<float> amax(static_cast<size_t>(a.groups));
    for (int64_t u = begin; u < end; ++u) {
      const int64_t blk = u % a.n_blocks, h = (u / a.n_blocks) % a.heads;
      const int64_t b = u / (a.n_blocks * a.heads);
      std::fill(amax.begin(), amax.end(), 0.f);
      for (int r = 0; r < a.block; ++r) {
        float* v = vs.data() + r * D;
        const int64_t n = blk * a.block + r;
        if (n >= a.tokens) {  // rows past N are zero and never reach a scale
          std::fill(v, v + D, 0.f);
          continue;
        }
        row_values(a, b, n, h, xs.data(), ys.data(), v);
        float& m = amax[group_of_row(a.layout, r)];
        for (int64_t c = 0; c < D; ++c) {
          v[c] = v[c] * a.sm_scale;
          m = max_nan(m, std::fabs(v[c]));
        }
      }
      float* scale = a.scale + b * a.s_sb + h * a.s_sh + blk * a.groups;
      for (int g = 0; g < a.groups; ++g) scale[g] = amax[g] / 127.f + a.scale_eps;
      for (int r = 0; r < a.block; ++r) {
        const int64_t n = blk * a.block + r;
        if (n >= a.tokens) break;
        const float s = scale[group_of_row(a.layout, r)];
        int8_t* q = a.q + b * a.q_sb + n * a.q_sn + h * a.q_sh;
        const float* v = vs.data() + r * D;
        for (int64_t c = 0; c < D; ++c) q[c] = quantize_code(v[c], s);
      }
    }
  });
}

void norm_rope_mean(const PrologueArgs& a, Context& ctx) {
  const int64_t D = a.dim;
  const int64_t nblk = (a.tokens + kMeanBlockRows - 1) / kMeanBlockRows;
  const int64_t units = a.batch * a.heads * nblk;
  // Partial sums of each 64-token block: rows added in token order.
  std::vector<float> partial(static_cast<size_t>(units * D));
  parallel_for(units, 1, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> xs(D), ys(D), v(D);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t blk = u % nblk, h = (u / nblk) % a.heads, b = u / (nblk * a.heads);
      float* s = partial.data() + u * D;
      std::fill(s, s + D, 0.f);
      const int64_t n1 = std::min(a.tokens, (blk + 1) * kMeanBlockRows);
      for (int64_t n = blk * kMeanBlockRows; n < n1; ++n) {
        row_values(a, b, n, h, xs.data(), ys.data(), v.data());
        for (int64_t c = 0; c < D; ++c) s[c] = s[c] + v[c];
      }
    }
  });
  // The blocks' sums in block order, divided by N.
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h) {
      float* out = a.mean_out + b * a.mo_sb + h * a.mo_sh;
      const float* base = partial.data() + (b * a.heads + h) * nblk * D;
      for (int64_t c = 0; c < D; ++c) {
        float t = 0.f;
        for (int64_t k = 0; k < nblk; ++k) t = t + base[k * D + c];
        out[c] = t / static_cast<float>(a.tokens);
      }
    }
}

// The two passes one after the other: the oracle of the fused CUDA k path.
void norm_rope_mean_quantize(const PrologueArgs& a, Context& ctx) {
  PrologueArgs m = a;
  m.mean = nullptr;  // the mean pass normalizes and rotates only
  norm_rope_mean(m, ctx);
  norm_rope_quantize(a, ctx);
}

void norm_rope_store(const PrologueArgs& a, void* out, int64_t o_sb, int64_t o_sn, int64_t o_sh,
                     Context& ctx) {
  const int64_t D = a.dim, rows = a.batch * a.tokens * a.heads;
  parallel_for(rows, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> xs(D), ys(D), v(D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i % a.heads, n = (i / a.heads) % a.tokens, b = i / (a.heads * a.tokens);
      row_values(a, b, n, h, xs.data(), ys.data(), v.data());
      const int64_t o = b * o_sb + n * o_sn + h * o_sh;
      for (int64_t c = 0; c < D; ++c) store_f32(out, o + c, a.x_dtype, v[c]);
    }
  });
}

}  // namespace cpu
}  // namespace lowbit
