// CPU backend of the decode family: the oracle. Plain loops in fp32 (the order of every sum is
// the obvious one), threaded over independent (batch, head, split) chunks.
#include "lowbit/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/core/convert_elem.h"
#include "src/core/decode_backend.h"
#include "src/core/indexing.h"
#include "src/core/parallel.h"
#include "src/cpu/cpu_clones.h"
#include "src/cpu/rows.h"

namespace lowbit {
namespace cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kDotKeys = 64;  // keys per transposed block of the score loop

// Element offset of (b, logical key j, head h) in a cache tensor of rank 4 (contiguous) or 3
// (paged pool); for scale/shift tensors (one rank less, no D) the same with `t` of that rank.
// Returns -1 when a page index is out of range (validated before on the CPU, so never here).
struct KeyAddress {
  const KvCache& c;
  int64_t row(int64_t b, int64_t j) const {  // physical row for paged, j for contiguous
    if (!c.paged()) return j;
    const int32_t* bt = c.block_tables.ptr<int32_t>();
    const int64_t page = bt[b * c.block_tables.stride[0] + (j / c.page_size) * c.block_tables.stride[1]];
    return page * c.page_size + j % c.page_size;
  }
  int64_t offset(const TensorView& t, int64_t b, int64_t j, int64_t h) const {
    if (!c.paged()) return b * t.stride[0] + j * t.stride[1] + h * t.stride[2];
    return row(b, j) * t.stride[0] + h * t.stride[1];
  }
};

// dots[j] = sum_d q[d] * k[d][j] (k transposed: kt[d * n + j]) for j < n, each key's sum in
// channel order from 0 (the same roundings as a dot taken key by key; the keys side by side).
LOWBIT_CLONES void key_dots(const float* q, const float* kt, int64_t n, int D, float* dots) {
  for (int64_t j = 0; j < n; ++j) dots[j] = 0.f;
  for (int d = 0; d < D; ++d) {
    const float qd = q[d];
    const float* row = kt + d * n;
    for (int64_t j = 0; j < n; ++j) dots[j] += qd * row[j];
  }
}

// out[d] = int4 value of code d (eight 4-bit codes per word, low nibble first), d0 <= d < d0 + n.
LOWBIT_CLONES void int4_group(const uint32_t* words, int d0, int n, float scale, float shift,
                              float* out) {
  for (int d = d0; d < d0 + n; ++d)
    out[d] = kv::int4_value_at((words[d / 8] >> (4 * (d % 8))) & 0xfu, scale, shift);
}

// Dequantizes one row of a head into out (D).
void load_row(const KvCache& c, const TensorView& t, const TensorView& ss, const KeyAddress& a,
              int64_t b, int64_t j, int64_t h, int D, float* out) {
  const int64_t off = a.offset(t, b, j, h);
  switch (c.format) {
    case KvFormat::f16: {
      rows::f16_to_f32(t.ptr<uint16_t>() + off, D, out);
      break;
    }
    case KvFormat::bf16: {
      const uint16_t* p = t.ptr<uint16_t>() + off;
      for (int d = 0; d < D; ++d) out[d] = dt::bf16_to_f32(p[d]);
      break;
    }
    case KvFormat::int4: {  // each group's scale and shift converted once
      const uint32_t* w = t.ptr<uint32_t>() + off;
      const int ng = c.n_groups, per = D / ng;
      for (int g = 0; g < ng; ++g)
        int4_group(w + ng, g * per, per, kv::coef_scale(w[g]), kv::coef_shift(w[g]), out);
      break;
    }
    case KvFormat::fp8: {  // the row's scale and shift converted once
      const uint32_t* w = t.ptr<uint32_t>() + off;
      const uint32_t s = ss.ptr<uint32_t>()[c.paged() ? a.row(b, j) * ss.stride[0] + h * ss.stride[1]
                                                      : b * ss.stride[0] + j * ss.stride[1] +
                                                            h * ss.stride[2]];
      const float scale = kv::coef_scale(s), shift = kv::coef_shift(s);
      const float* e4m3 = rows::e4m3_table();  // kv::fp8_value_at's arithmetic, table decode
      for (int d = 0; d < D; ++d)
        out[d] = e4m3[(w[d / 4] >> (8 * (d % 4))) & 0xffu] * scale + shift;
      break;
    }
  }
}

// Stores one quantized row.
void store_row(const KvCache& c, const TensorView& t, const TensorView& ss, const KeyAddress& a,
               int64_t b, int64_t j, int64_t h, int D, const float* x) {
  const int64_t off = a.offset(t, b, j, h);
  switch (c.format) {
    case KvFormat::f16: {
      uint16_t* p = t.ptr<uint16_t>() + off;
      for (int d = 0; d < D; ++d) p[d] = dt::f32_to_f16(x[d]);
      break;
    }
    case KvFormat::bf16: {
      uint16_t* p = t.ptr<uint16_t>() + off;
      for (int d = 0; d < D; ++d) p[d] = dt::f32_to_bf16(x[d]);
      break;
    }
    case KvFormat::int4:
      kv::quantize_int4_row(x, D, c.n_groups, t.ptr<uint32_t>() + off);
      break;
    case KvFormat::fp8: {
      uint32_t* s = ss.ptr<uint32_t>() + (c.paged() ? a.row(b, j) * ss.stride[0] + h * ss.stride[1]
                                                    : b * ss.stride[0] + j * ss.stride[1] +
                                                          h * ss.stride[2]);
      kv::quantize_fp8_row(x, D, t.ptr<uint32_t>() + off, s);
      break;
    }
  }
}

// Offset of the `row`-th (row-major) index of the leading dims of a (..., D) tensor.
int64_t lead_offset(const TensorView& t, int64_t row, int lead_dims) {
  int64_t off = 0;
  for (int d = lead_dims - 1; d >= 0; --d) {
    off += (row % t.shape[d]) * t.stride[d];
    row /= t.shape[d];
  }
  return off;
}

}  // namespace

void kv_append(const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const TensorView& positions, Context& ctx) {
  const int64_t B = k_new.shape[0], n = k_new.shape[1], H = k_new.shape[2];
  const int D = static_cast<int>(k_new.shape[3]);
  const KeyAddress addr{cache};
  parallel_for(B * n * H, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> row(D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i % H, t = (i / H) % n, b = i / (H * n);
      const int64_t j = positions.ptr<int32_t>()[b * positions.stride[0]] + t;
      for (int which = 0; which < 2; ++which) {
        const TensorView& src = which ? v_new : k_new;
        const int64_t base = b * src.stride[0] + t * src.stride[1] + h * src.stride[2];
        for (int d = 0; d < D; ++d) row[d] = load_f32(src.data, base + d, src.dtype);
        store_row(cache, which ? cache.v : cache.k, which ? cache.v_scale_shift : cache.k_scale_shift,
                  addr, b, j, h, D, row.data());
      }
    }
  });
}

void decode_attention(const TensorView& q, const KvCache& cache, const DecodePlan& plan,
                      void* workspace, TensorView out, const TensorView* lse_out,
                      const TensorView* bias, float sm_scale, bool causal, Context& ctx) {
  const int64_t B = plan.batch, H = plan.kv_heads;
  const int Mq = plan.mq, G = plan.group, D = plan.head_dim, S = plan.n_splits;
  const int R = Mq * G;
  float* part_o = static_cast<float*>(workspace);
  float* part_lse = part_o + decode_partial_out_elems(plan);
  const KeyAddress addr{cache};
  const int32_t* seq_len = cache.seq_len.ptr<int32_t>();

  // Pass 1: each (b, h, split) chunk -> (R, D) partial outputs and (R) LSEs.
  parallel_for(B * H * S, 1, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> kf, kt(static_cast<size_t>(kDotKeys) * D), vf,
        qf(static_cast<size_t>(R) * D), dots, scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task % S, h = (task / S) % H, b = task / (S * H);
      const int64_t len = seq_len[b * cache.seq_len.stride[0]];
      const int64_t lo = std::min<int64_t>(s * plan.split_size, len);
      const int64_t hi = s == S - 1 ? len : std::min<int64_t>(lo + plan.split_size, len);
      const int64_t n = hi - lo;
      kf.resize(n * D);
      vf.resize(n * D);
      scores.resize(n);
      dots.resize(static_cast<size_t>(R) * n);
      for (int64_t j = 0; j < n; ++j) {
        load_row(cache, cache.k, cache.k_scale_shift, addr, b, lo + j, h, D, &kf[j * D]);
        load_row(cache, cache.v, cache.v_scale_shift, addr, b, lo + j, h, D, &vf[j * D]);
      }
      for (int r = 0; r < R; ++r) {
        const int m = r / G, g = r % G;
        const int64_t qoff = b * q.stride[0] + m * q.stride[1] + h * q.stride[2] + g * q.stride[3];
        for (int d = 0; d < D; ++d) qf[r * D + d] = load_f32(q.data, qoff + d, q.dtype);
      }
      // Every row's q . k for blocks of kDotKeys keys (the block transposed once, in cache).
      for (int64_t j0 = 0; j0 < n; j0 += kDotKeys) {
        const int64_t nb = std::min<int64_t>(kDotKeys, n - j0);
        for (int64_t j = 0; j < nb; ++j)
          for (int d = 0; d < D; ++d) kt[d * nb + j] = kf[(j0 + j) * D + d];
        for (int r = 0; r < R; ++r) key_dots(&qf[r * D], kt.data(), nb, D, &dots[r * n + j0]);
      }
      float* o_base = part_o + (((b * H + h) * S + s) * R) * D;
      float* l_base = part_lse + ((b * H + h) * S + s) * R;
      for (int m = 0; m < Mq; ++m) {
        for (int g = 0; g < G; ++g) {
          const int r = m * G + g;
          // Keys visible to this query row: j < len, and j <= len - Mq + m when causal.
          const int64_t last = causal ? len - Mq + m : len - 1;
          float mx = kNegInf;
          for (int64_t j = 0; j < n; ++j) {
            float sc = kNegInf;
            if (lo + j <= last) {
              const float dot = dots[r * n + j];
              sc = dot * sm_scale;
              if (bias) {
                const int64_t boff = b * bias->stride[0] + h * bias->stride[1] +
                                     g * bias->stride[2] + m * bias->stride[3] +
                                     (lo + j) * bias->stride[4];
                sc += load_f32(bias->data, boff, bias->dtype);
              }
            }
            scores[j] = sc;
            mx = std::max(mx, sc);
          }
          float* o = o_base + static_cast<int64_t>(r) * D;
          std::fill(o, o + D, 0.f);
          if (mx == kNegInf) {  // no visible key (or every score -inf): 0 and -inf
            l_base[r] = kNegInf;
            continue;
          }
          float sum = 0.f;
          for (int64_t j = 0; j < n; ++j) {
            if (scores[j] == kNegInf) continue;
            const float p = std::exp(scores[j] - mx);
            sum += p;
            rows::add_scaled(o, p, &vf[j * D], D);
          }
          for (int d = 0; d < D; ++d) o[d] /= sum;
          l_base[r] = mx + std::log(sum);
        }
      }
    }
  });

  // Pass 2: merge the splits of every row.
  parallel_for(B * H * R, 8, ctx, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int r = static_cast<int>(i % R);
      const int64_t h = (i / R) % H, b = i / (R * H);
      const int m = r / G, g = r % G;
      const float* lse = part_lse + (b * H + h) * S * R + r;
      float mx = kNegInf;
      for (int s = 0; s < S; ++s) mx = std::max(mx, lse[static_cast<int64_t>(s) * R]);
      const int64_t ooff = b * out.stride[0] + m * out.stride[1] + h * out.stride[2] + g * out.stride[3];
      float total = 0.f;
      std::vector<float> acc(D, 0.f);
      if (mx != kNegInf) {
        for (int s = 0; s < S; ++s) {
          const float w = std::exp(lse[static_cast<int64_t>(s) * R] - mx);
          total += w;
          const float* po = part_o + (((b * H + h) * S + s) * R + r) * D;
          for (int d = 0; d < D; ++d) acc[d] += w * po[d];
        }
        for (int d = 0; d < D; ++d) acc[d] /= total;
      }
      for (int d = 0; d < D; ++d) store_f32(out.data, ooff + d, out.dtype, acc[d]);
      if (lse_out) {
        const int64_t loff = b * lse_out->stride[0] + m * lse_out->stride[1] +
                             h * lse_out->stride[2] + g * lse_out->stride[3];
        lse_out->ptr<float>()[loff] = mx == kNegInf ? kNegInf : mx + std::log(total);
      }
    }
  });
}

void merge_attention(const MergeArgs& a, Context& ctx) {
  const int n = static_cast<int>(a.outs.size());
  const int D = a.head_dim;
  const int lead = a.out.ndim - 1;
  parallel_for(a.rows, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> lse(n), acc(D);
    for (int64_t row = begin; row < end; ++row) {
      float mx = kNegInf;
      for (int i = 0; i < n; ++i) {
        lse[i] = a.lses[i].ptr<float>()[lead_offset(a.lses[i], row, lead)];
        mx = std::max(mx, lse[i]);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float total = 0.f;
      if (mx != kNegInf) {
        for (int i = 0; i < n; ++i) {
          const float w = std::exp(lse[i] - mx);
          total += w;
          const int64_t off = lead_offset(a.outs[i], row, lead);
          for (int d = 0; d < D; ++d) acc[d] += w * load_f32(a.outs[i].data, off + d, a.outs[i].dtype);
        }
        for (int d = 0; d < D; ++d) acc[d] /= total;
      }
      const int64_t ooff = lead_offset(a.out, row, lead);
      for (int d = 0; d < D; ++d) store_f32(a.out.data, ooff + d, a.out.dtype, acc[d]);
      if (a.lse.data)
        a.lse.ptr<float>()[lead_offset(a.lse, row, lead)] =
            mx == kNegInf ? kNegInf : mx + std::log(total);
    }
  });
}

void merge_attention_backward(const MergeBackwardArgs& a, Context& ctx) {
  const MergeArgs& f = a.fwd;
  const int n = static_cast<int>(f.outs.size());
  const int D = f.head_dim;
  const int lead = f.out.ndim - 1;
  parallel_for(f.rows, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> dout(D), o(D);
    for (int64_t row = begin; row < end; ++row) {
      const float lse = f.lse.ptr<float>()[lead_offset(f.lse, row, lead)];
      const float dlse = a.grad_lse.data ? a.grad_lse.ptr<float>()[lead_offset(a.grad_lse, row, lead)] : 0.f;
      const int64_t goff = lead_offset(a.grad_out, row, lead), ooff = lead_offset(f.out, row, lead);
      for (int d = 0; d < D; ++d) {
        dout[d] = load_f32(a.grad_out.data, goff + d, a.grad_out.dtype);
        o[d] = load_f32(f.out.data, ooff + d, f.out.dtype);
      }
      for (int i = 0; i < n; ++i) {
        const float li = f.lses[i].ptr<float>()[lead_offset(f.lses[i], row, lead)];
        const float w = (lse == kNegInf || li == kNegInf) ? 0.f : std::exp(li - lse);
        const int64_t pi = lead_offset(f.outs[i], row, lead);
        const int64_t gi = lead_offset(a.grad_outs[i], row, lead);
        float dot = 0.f;
        for (int d = 0; d < D; ++d) {
          store_f32(a.grad_outs[i].data, gi + d, a.grad_outs[i].dtype, w * dout[d]);
          dot += (load_f32(f.outs[i].data, pi + d, f.outs[i].dtype) - o[d]) * dout[d];
        }
        a.grad_lses[i].ptr<float>()[lead_offset(a.grad_lses[i], row, lead)] = w * (dlse + dot);
      }
    }
  });
}

}  // namespace cpu
}  // namespace lowbit
