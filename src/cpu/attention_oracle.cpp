// CPU backend of the attention family: the oracle. Plain loops following SageAttention 2's
// arithmetic step by step (SPEC §2), one (batch, head, query row) at a time, threaded over rows.
// Also the fp64 softmax(q k^T) v reference used for accuracy figures.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "lowbit/attention.h"
#include "lowbit/dtype.h"
#include "src/core/convert_elem.h"
#include "src/core/parallel.h"
#include "src/cpu/attention_backend.h"
#include "src/cpu/cpu_clones.h"
#include "src/cpu/rows.h"

namespace lowbit {
namespace cpu {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2_448 = 8.807354922057604f;  // P is scaled into [0, 448] in fp8 mode
constexpr int kKvTile = 64;                      // keys per online-softmax step
constexpr int64_t kRowBlock = 32;                // query rows per task (times the group's heads)

inline int64_t off4(const TensorView& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2] + d * t.stride[3];
}
inline int64_t off3(const TensorView& t, int64_t a, int64_t b, int64_t c) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2];
}

// First key query row i may not see (keys [0, end) are visible).
inline int64_t visible_end(AttentionOptions::Causal causal, int64_t i, int64_t nq, int64_t nkv) {
  if (causal == AttentionOptions::none) return nkv;
  const int64_t shift = causal == AttentionOptions::bottom_right ? nkv - nq : 0;
  return std::max<int64_t>(0, std::min<int64_t>(nkv, i + shift + 1));
}

// Rounds p to the 16-bit dtype of V (identity for f32).
inline float round_to(DType dt, float p) {
  if (dt == DType::bf16) return dt::bf16_to_f32(dt::f32_to_bf16(p));
  if (dt == DType::f16) return dt::f16_to_f32(dt::f32_to_f16(p));
  return p;
}

// Position of key `key` inside its 32-key group of the fp8 V layout (attention.h).
inline int64_t fp8_v_position(int64_t key) {
  const int64_t base = key & ~int64_t{31}, r = key & 31;
  const int64_t h = r / 16, w = r % 16;  // w = 8 * (i / 2) + 2 * t + (i % 2)
  const int64_t i = (w / 8) * 2 + (w % 2), t = (w % 8) / 2;
  return base + 16 * h + 4 * t + i;
}

// D values of a row of t (channel stride t.stride[3]) from element offset `off`, as f32.
void load_row_f32(const TensorView& t, int64_t off, int64_t D, float* dst) {
  const int64_t cs = t.stride[3];
  if (t.dtype == DType::f32) {
    const float* src = static_cast<const float*>(t.data) + off;
    for (int64_t d = 0; d < D; ++d) dst[d] = src[d * cs];
  } else if (t.dtype == DType::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(t.data) + off;
    for (int64_t d = 0; d < D; ++d) dst[d] = dt::bf16_to_f32(src[d * cs]);
  } else if (t.dtype == DType::f16) {
    const uint16_t* src = static_cast<const uint16_t*>(t.data) + off;
    for (int64_t d = 0; d < D; ++d) dst[d] = dt::f16_to_f32(src[d * cs]);
  } else {
    for (int64_t d = 0; d < D; ++d) dst[d] = load_f32(t.data, off + d * cs, t.dtype);
  }
}
// Exact int32 q . k (any summation order gives the same integer).
LOWBIT_CLONES int32_t dot_i8(const int8_t* a, const int8_t* b, int64_t D) {
  int32_t sum = 0;
  for (int64_t d = 0; d < D; ++d) sum += int32_t{a[d]} * int32_t{b[d]};
  return sum;
}
// acc[d] = acc[d] * r + tile[d].
LOWBIT_CLONES void rescale_add(float* acc, float r, const float* tile, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * r + tile[d];
}

}  // namespace

void quantize_v_fp8(const TensorView& v, TensorView v_fp8, TensorView v_scale, TensorView* v_mean,
                    Context& ctx) {
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], D = v.shape[3];
  const int64_t npad = v_fp8.shape[3];
  parallel_for(B * H, 1, ctx, [&](int64_t b0, int64_t b1) {
    std::vector<float> mean(static_cast<size_t>(D)), amax(static_cast<size_t>(D));
    for (int64_t bh = b0; bh < b1; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      std::fill(mean.begin(), mean.end(), 0.f);
      std::fill(amax.begin(), amax.end(), 0.f);
      if (v_mean) {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t d = 0; d < D; ++d) mean[d] += load_f32(v.data, off4(v, b, n, h, d), v.dtype);
        for (int64_t d = 0; d < D; ++d) {
          mean[d] = N > 0 ? mean[d] / static_cast<float>(N) : 0.f;
          v_mean->ptr<float>()[off3(*v_mean, b, h, d)] = mean[d];
        }
      }
      for (int64_t n = 0; n < N; ++n)
        for (int64_t d = 0; d < D; ++d)
          amax[d] = std::max(amax[d],
                             std::fabs(load_f32(v.data, off4(v, b, n, h, d), v.dtype) - mean[d]));
      uint8_t* codes = v_fp8.ptr<uint8_t>() + (b * H + h) * D * npad;
      for (int64_t d = 0; d < D; ++d) {
        const float s = amax[d] / 448.f;
        v_scale.ptr<float>()[off3(v_scale, b, h, d)] = s;
        for (int64_t n = 0; n < npad; ++n) codes[d * npad + n] = 0;
        for (int64_t n = 0; n < N; ++n) {
          const float x = load_f32(v.data, off4(v, b, n, h, d), v.dtype) - mean[d];
          codes[d * npad + fp8_v_position(n)] = s > 0.f ? dt::f32_to_e4m3(x / s) : 0;
        }
      }
    }
  });
}

void attention_int8(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                    const TensorView* v_scale, const TensorView* v_mean, const TensorView* k_mean,
                    TensorView out, TensorView* lse_out, float sm_scale,
                    const AttentionOptions& options, Context& ctx) {
  const int64_t B = q.data.shape[0], Nq = q.data.shape[1], Hq = q.data.shape[2],
                D = q.data.shape[3];
  const int64_t Nkv = k.data.shape[1], Hkv = k.data.shape[2], G = Hq / Hkv;
  const bool fp8 = options.pv == AttentionOptions::fp8;
  const int64_t npad = fp8 ? v.shape[3] : 0;
  const float scale_log2 = sm_scale * kLog2e;
  const float p_offset = fp8 ? kLog2_448 : 0.f;
  const float inf = std::numeric_limits<float>::infinity();

  // One task: a block of kRowBlock query rows of every head of one KV head's group, so that
  // each key tile's K rows, k scales and V values (fp8 codes decoded) are gathered once for
  // G x kRowBlock rows; each row runs the same steps in the same order as a row on its own.
  const int64_t n_blocks = (Nq + kRowBlock - 1) / kRowBlock;
  parallel_for(B * Hkv * n_blocks, 1, ctx, [&](int64_t t_begin, int64_t t_end) {
    std::vector<int8_t> qbuf, kbuf(static_cast<size_t>(kKvTile * D));
    std::vector<float> ksv(kKvTile), vbuf(static_cast<size_t>(kKvTile * D));
    std::vector<float> s(kKvTile), tile(static_cast<size_t>(D)), accs, ms, ls, qss;
    std::vector<int64_t> ends;
    for (int64_t task = t_begin; task < t_end; ++task) {
      const int64_t ib = task % n_blocks, hk = (task / n_blocks) % Hkv, b = task / (n_blocks * Hkv);
      const int64_t i0 = ib * kRowBlock, n_i = std::min<int64_t>(kRowBlock, Nq - i0);
      const int64_t R = G * n_i;  // row ri: head hk * G + ri / n_i, query i0 + ri % n_i
      qbuf.resize(static_cast<size_t>(R * D));
      accs.assign(static_cast<size_t>(R * D), 0.f);
      ms.assign(static_cast<size_t>(R), -inf);
      ls.assign(static_cast<size_t>(R), 0.f);
      qss.resize(static_cast<size_t>(R));
      ends.resize(static_cast<size_t>(R));
      int64_t max_end = 0;
      for (int64_t ri = 0; ri < R; ++ri) {
        const int64_t hq = hk * G + ri / n_i, i = i0 + ri % n_i;
        for (int64_t d = 0; d < D; ++d)
          qbuf[ri * D + d] = q.data.ptr<const int8_t>()[off4(q.data, b, i, hq, d)];
        qss[ri] =
            q.scale.ptr<const float>()[off3(q.scale, b, hq, scale_index(q.layout, q.block, i))];
        ends[ri] = visible_end(options.causal, i, Nq, Nkv);
        max_end = std::max(max_end, ends[ri]);
      }
      for (int64_t t0 = 0; t0 < max_end; t0 += kKvTile) {
        const int64_t tn = std::min<int64_t>(max_end, t0 + kKvTile) - t0;
        for (int64_t j = 0; j < tn; ++j) {
          const int8_t* krow = k.data.ptr<const int8_t>() + off4(k.data, b, t0 + j, hk, 0);
          if (k.data.stride[3] == 1) {
            std::copy(krow, krow + D, kbuf.begin() + j * D);
          } else {
            for (int64_t d = 0; d < D; ++d) kbuf[j * D + d] = krow[d * k.data.stride[3]];
          }
          ksv[j] =
              k.scale
                  .ptr<const float>()[off3(k.scale, b, hk, scale_index(k.layout, k.block, t0 + j))];
          if (fp8) {
            const uint8_t* col = v.ptr<const uint8_t>() + (b * Hkv + hk) * D * npad;
            const int64_t pos = fp8_v_position(t0 + j);
            for (int64_t d = 0; d < D; ++d) vbuf[j * D + d] = dt::e4m3_to_f32(col[d * npad + pos]);
          } else {
            load_row_f32(v, off4(v, b, t0 + j, hk, 0), D, vbuf.data() + j * D);
          }
        }
        for (int64_t ri = 0; ri < R; ++ri) {
          const int64_t n = std::min<int64_t>(ends[ri] - t0, tn);  // this row's keys here
          if (n <= 0) continue;
          const int8_t* qrow = qbuf.data() + ri * D;
          const float qs = qss[ri];
          float tile_max = -inf;
          for (int64_t j = 0; j < n; ++j) {
            const int32_t dot = dot_i8(qrow, kbuf.data() + j * D, D);
            const float sv = static_cast<float>(dot) * (qs * ksv[j]) * scale_log2;
            s[j] = sv;
            tile_max = std::max(tile_max, sv);
          }
          float& m = ms[ri];
          const float m_new = std::max(m, tile_max);
          const float rescale = m == -inf ? 0.f : std::exp2(m - m_new);
          const float m_off = m_new - p_offset;
          float tile_sum = 0.f;
          std::fill(tile.begin(), tile.end(), 0.f);
          for (int64_t j = 0; j < n; ++j) {
            const float p = std::exp2(s[j] - m_off);
            tile_sum += p;
            // P through the format P·V runs in: e4m3 (fp8 mode) or V's 16-bit dtype
            const float pr = fp8 ? dt::e4m3_to_f32(dt::f32_to_e4m3(p)) : round_to(v.dtype, p);
            rows::add_scaled(tile.data(), pr, vbuf.data() + j * D, D);
          }
          // Two-level accumulation: the tile's P·V (fresh buffer) joins the rescaled accumulator.
          rescale_add(accs.data() + ri * D, rescale, tile.data(), D);
          ls[ri] = ls[ri] * rescale + tile_sum;
          m = m_new;
        }
      }
      for (int64_t ri = 0; ri < R; ++ri) {
        const int64_t hq = hk * G + ri / n_i, i = i0 + ri % n_i;
        const float l = ls[ri], m = ms[ri], qs = qss[ri];
        const float* acc = accs.data() + ri * D;
        for (int64_t d = 0; d < D; ++d) {
          float o = 0.f;
          if (l > 0.f) {
            o = acc[d] / l;
            if (fp8) {
              o *= v_scale->ptr<const float>()[off3(*v_scale, b, hk, d)];
              if (v_mean) o += v_mean->ptr<const float>()[off3(*v_mean, b, hk, d)];
            }
          }
          store_f32(out.data, off4(out, b, i, hq, d), out.dtype, o);
        }
        if (lse_out) {
          float lse = -inf;
          if (l > 0.f) {
            lse = (m + std::log2(l) - p_offset) * kLn2;
            if (k_mean) {
              const float* km = k_mean->ptr<const float>() + off3(*k_mean, b, hk, 0);
              const int8_t* qrow = qbuf.data() + ri * D;
              float dot = 0.f;
              for (int64_t d = 0; d < D; ++d) dot += static_cast<float>(qrow[d]) * qs * km[d];
              lse += dot * sm_scale;
            }
          }
          lse_out->ptr<float>()[off3(*lse_out, b, hq, i)] = lse;
        }
      }
    }
  });
}

}  // namespace cpu

void attention_reference_f64(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options, double* out_ref, double* lse_ref) {
  const int64_t B = q.shape[0], Nq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t Nkv = k.shape[1], Hkv = k.shape[2], G = Hq / Hkv;
  const double sm = options.sm_scale != 0.f ? static_cast<double>(options.sm_scale)
                                            : 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(Nkv, 1)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t hk = hq / G;
        const int64_t end = cpu::visible_end(options.causal, i, Nq, Nkv);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < end; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += static_cast<double>(load_f32(q.data, cpu::off4(q, b, i, hq, d), q.dtype)) *
                   load_f32(k.data, cpu::off4(k, b, j, hk, d), k.dtype);
          s[j] = dot * sm;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < end; ++j) {
          s[j] = std::exp(s[j] - m);  // the weights, once per key
          l += s[j];
        }
        double* o = out_ref + ((b * Nq + i) * Hq + hq) * D;
        for (int64_t d = 0; d < D; ++d) {
          double a = 0;
          for (int64_t j = 0; j < end; ++j)
            a += s[j] * load_f32(v.data, cpu::off4(v, b, j, hk, d), v.dtype);
          o[d] = end > 0 ? a / l : 0.0;
        }
        if (lse_ref)
          lse_ref[(b * Hq + hq) * Nq + i] =
              end > 0 ? m + std::log(l) : -std::numeric_limits<double>::infinity();
      }
}

}  // namespace lowbit
