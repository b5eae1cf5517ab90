// Attention prologue (SPEC §1) on the CPU backend: hand-computed vectors for the rounding rule,
// each layout's row grouping, the THREAD_Q padding, norm / rope / mean; an fp64 reference on
// random inputs; and one test per argument error proving nothing was written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <random>
#include <vector>

#include "lowbit/dtype.h"
#include "lowbit/prologue.h"
#include "src/core/prologue_internal.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace {

// A contiguous (B, N, H, D) f32 tensor with its data.
struct Act {
  std::vector<float> data;
  TensorView view;
  Act(int64_t B, int64_t N, int64_t H, int64_t D, float fill = 0.f)
      : data(static_cast<size_t>(B * N * H * D), fill) {
    view = make_view(data.data(), DType::f32, {B, N, H, D});
  }
  float& at(int64_t b, int64_t n, int64_t h, int64_t c) {
    const auto& s = view.stride;
    return data[b * s[0] + n * s[1] + h * s[2] + c];
  }
};

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scale;
  TensorView qv, sv;
  Quantized(int64_t B, int64_t N, int64_t H, int64_t D, ScaleLayout layout, int block)
      : q(static_cast<size_t>(B * N * H * D), int8_t{-99}),
        scale(static_cast<size_t>(B * H * prologue_scale_count(N, layout, block)), -1.f) {
    qv = make_view(q.data(), DType::i8, {B, N, H, D});
    sv = make_view(scale.data(), DType::f32, {B, H, prologue_scale_count(N, layout, block)});
  }
};

Prologue plain(ScaleLayout layout, int block, float scale_eps) {
  Prologue p;
  p.layout = layout;
  p.block = block;
  p.scale_eps = scale_eps;
  return p;
}

TEST(prologue, scale_count_and_padding_rule) {
  EXPECT_EQ(prologue_scale_count(1, ScaleLayout::per_block, 128), 1);
  EXPECT_EQ(prologue_scale_count(129, ScaleLayout::per_block, 128), 2);
  // THREAD_Q pads to 128 rows: 1 token -> one 128-row tile -> 4 blocks of 32 -> 32 scales.
  EXPECT_EQ(prologue_scale_count(1, ScaleLayout::thread_q, 32), 32);
  EXPECT_EQ(prologue_scale_count(129, ScaleLayout::thread_q, 32), 64);
  EXPECT_EQ(prologue_scale_count(128, ScaleLayout::thread_q, 16), 64);
  EXPECT_EQ(prologue_scale_count(65, ScaleLayout::thread_k, 64), 8);
  EXPECT_EQ(prologue_scale_count(1000, ScaleLayout::warp_q, 128), 32);
  EXPECT_THROW(prologue_scale_count(10, ScaleLayout::thread_q, 48), Error);
  EXPECT_THROW(prologue_scale_count(10, ScaleLayout::per_block, 12), Error);
}

// Rounding: amax 127 gives scale exactly 1 with scale_eps 0, so the codes are the values rounded
// half away from zero.
TEST(prologue, rounding_ties_negatives_half_away_from_zero) {
  const int D = 16;
  Act x(1, 1, 1, D);
  const float vals[D] = {127.f, 2.5f, -2.5f, 0.5f, -0.5f, 1.49f, -1.5f, 0.f,
                         126.5f, -0.49f, 3.5f, -127.f, 0.51f, -3.5f, 1.f, -0.f};
  const int8_t want[D] = {127, 3, -3, 1, -1, 1, -2, 0, 127, 0, 4, -127, 1, -4, 1, 0};
  for (int c = 0; c < D; ++c) x.at(0, 0, 0, c) = vals[c];
  Quantized out(1, 1, 1, D, ScaleLayout::per_block, 8);
  Context ctx;
  norm_rope_quantize(x.view, plain(ScaleLayout::per_block, 8, 0.f), out.qv, out.sv, ctx);
  EXPECT_EQ(out.scale[0], 1.f);
  for (int c = 0; c < D; ++c) EXPECT_EQ(out.q[c], want[c]) << "channel " << c;
}

// With the default scale_eps the scale is 1 + 2^-23 (1 + 1e-7 rounded), so 2.5 / scale rounds to
// 2.5 - 2^-22 and the tie is no longer a tie: code 2. 127 / scale lies just below 127 -> 127.
TEST(prologue, rounding_with_scale_eps_breaks_exact_ties) {
  const int D = 16;
  Act x(1, 1, 1, D);
  x.at(0, 0, 0, 0) = 127.f;
  x.at(0, 0, 0, 1) = 2.5f;
  x.at(0, 0, 0, 2) = -2.5f;
  Quantized out(1, 1, 1, D, ScaleLayout::per_block, 8);
  Context ctx;
  norm_rope_quantize(x.view, plain(ScaleLayout::per_block, 8, 1e-7f), out.qv, out.sv, ctx);
  EXPECT_EQ(out.scale[0], 1.f + std::ldexp(1.f, -23));
  EXPECT_EQ(out.q[0], 127);
  EXPECT_EQ(out.q[1], 2);
  EXPECT_EQ(out.q[2], -2);
}

TEST(prologue, zero_group_gives_zero_codes_even_without_scale_eps) {
  const int D = 16;
  Act x(1, 8, 1, D);  // all zero, and one row of negative zeros
  for (int c = 0; c < D; ++c) x.at(0, 3, 0, c) = -0.f;
  Quantized out(1, 8, 1, D, ScaleLayout::thread_q, 8);
  Context ctx;
  norm_rope_quantize(x.view, plain(ScaleLayout::thread_q, 8, 0.f), out.qv, out.sv, ctx);
  for (float s : out.scale) EXPECT_EQ(s, 0.f);
  for (int8_t q : out.q) EXPECT_EQ(q, 0);
}

TEST(prologue, non_finite_amax_gives_non_finite_scale) {
  const int D = 16;
  Act x(1, 2, 1, D, 1.f);
  x.at(0, 0, 0, 5) = std::nanf("");
  x.at(0, 1, 0, 7) = INFINITY;
  Quantized out(1, 2, 1, D, ScaleLayout::thread_q, 8);
  Context ctx;
  norm_rope_quantize(x.view, plain(ScaleLayout::thread_q, 8, 1e-7f), out.qv, out.sv, ctx);
  EXPECT_TRUE(std::isnan(out.scale[0]));  // row 0 -> group 0
  EXPECT_TRUE(std::isinf(out.scale[1]));  // row 1 -> group 1
  EXPECT_EQ(out.q[5], 0);                 // NaN -> 0
  EXPECT_EQ(out.q[D + 7], 0);             // inf / inf = NaN -> 0
  EXPECT_EQ(out.q[D + 0], 0);             // 1 / inf = 0
}

// Row r of token n holds the constant n + 1, so the scale of a group names its largest row:
// scale = (largest token + 1) / 127.
struct GroupingCase {
  ScaleLayout layout;
  int block;
  int64_t tokens;
};

float row_value(int64_t n) { return static_cast<float>(n + 1); }

void check_grouping(const GroupingCase& gc, float scale_eps) {
  const int D = 16;
  Act x(1, gc.tokens, 2, D);
  for (int64_t n = 0; n < gc.tokens; ++n)
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < D; ++c) x.at(0, n, h, c) = (h ? -1.f : 1.f) * row_value(n);
  Quantized out(1, gc.tokens, 2, D, gc.layout, gc.block);
  Context ctx;
  norm_rope_quantize(x.view, plain(gc.layout, gc.block, scale_eps), out.qv, out.sv, ctx);
  const int groups = scale_groups(gc.layout);
  const int64_t count = prologue_scale_count(gc.tokens, gc.layout, gc.block);
  for (int h = 0; h < 2; ++h)
    for (int64_t i = 0; i < count; ++i) {
      const int64_t blk = i / groups, g = i % groups;
      // Hand rule of SPEC §1's table: the rows of this block in group g.
      float amax = 0.f;
      for (int r = 0; r < gc.block; ++r) {
        int gr = gc.layout == ScaleLayout::per_block ? 0
                 : gc.layout == ScaleLayout::thread_q ? r % 8
                 : gc.layout == ScaleLayout::thread_k ? (r % 8) / 2
                                                      : r / 32;
        const int64_t n = blk * gc.block + r;
        if (gr == g && n < gc.tokens) amax = std::max(amax, row_value(n));
      }
      EXPECT_EQ(out.scale[h * count + i], amax / 127.f + scale_eps)
          << scale_layout_name(gc.layout) << " block " << gc.block << " scale " << i;
    }
  // Head 1 holds the negated rows: same scales, negated codes; the largest row of every group
  // quantizes to 127 exactly.
  for (int64_t n = 0; n < gc.tokens; ++n) {
    const int8_t q0 = out.q[(n * 2) * D], q1 = out.q[(n * 2 + 1) * D];
    for (int c = 1; c < D; ++c) ASSERT_EQ(out.q[(n * 2) * D + c], q0);
    EXPECT_EQ(q1, -q0);
    EXPECT_GT(q0, 0);
    const int r = static_cast<int>(n % gc.block);
    const bool last_of_group =
        n + 1 == gc.tokens ||
        (gc.layout == ScaleLayout::per_block && r == gc.block - 1) ||
        (gc.layout == ScaleLayout::thread_q && (r + 8 >= gc.block || n + 8 >= gc.tokens)) ||
        (gc.layout == ScaleLayout::warp_q && (r % 32 == 31 || r == gc.block - 1));
    if (last_of_group && gc.layout != ScaleLayout::thread_k) EXPECT_EQ(q0, 127) << n;
  }
}

TEST(prologue, layout_row_grouping) {
  const GroupingCase cases[] = {
      {ScaleLayout::per_block, 64, 130}, {ScaleLayout::per_block, 8, 17},
      {ScaleLayout::thread_q, 32, 40},   {ScaleLayout::thread_q, 16, 129},
      {ScaleLayout::thread_q, 128, 5},   {ScaleLayout::thread_k, 64, 70},
      {ScaleLayout::thread_k, 128, 200}, {ScaleLayout::thread_k, 8, 9},
      {ScaleLayout::warp_q, 128, 200},   {ScaleLayout::warp_q, 64, 70},
      {ScaleLayout::per_block, 24, 50},
  };
  for (const auto& gc : cases) {
    check_grouping(gc, 0.f);
    check_grouping(gc, 1e-7f);
  }
}

// THREAD_Q, block 32, 40 tokens: pad to 128 rows = 4 blocks. Block 1 has tokens 32..39 (rows
// 0..7, group g = one row: value 33 + g); blocks 2 and 3 are past N and get scale_eps.
TEST(prologue, thread_q_padding_blocks_get_scale_eps) {
  const int D = 16;
  Act x(1, 40, 1, D);
  for (int n = 0; n < 40; ++n)
    for (int c = 0; c < D; ++c) x.at(0, n, 0, c) = static_cast<float>(n + 1);
  Quantized out(1, 40, 1, D, ScaleLayout::thread_q, 32);
  ASSERT_EQ(out.scale.size(), 32u);
  Context ctx;
  norm_rope_quantize(x.view, plain(ScaleLayout::thread_q, 32, 1e-7f), out.qv, out.sv, ctx);
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(out.scale[g], (25.f + g) / 127.f + 1e-7f);  // rows g, g+8, g+16, g+24: max g+25
    EXPECT_EQ(out.scale[8 + g], (33.f + g) / 127.f + 1e-7f);
    EXPECT_EQ(out.scale[16 + g], 1e-7f);
    EXPECT_EQ(out.scale[24 + g], 1e-7f);
  }
  // Token 0 (value 1) in group 0 (max 25): 1 / (25 / 127) = 5.08 -> 5; token 12 (13, group 4,
  // max 29): 13 * 127 / 29 = 56.93 -> 57; token 32 (33, alone in its group) -> 127.
  EXPECT_EQ(out.q[0 * D], 5);
  EXPECT_EQ(out.q[12 * D], 57);
  EXPECT_EQ(out.q[32 * D], 127);
}

// Rows past N must not reach a scale even when a mean is subtracted (they would be -mean).
TEST(prologue, rows_past_n_stay_out_of_scales_with_mean) {
  const int D = 16;
  Act x(1, 3, 1, D, 1.f);
  std::vector<float> mean(D, 5.f);
  TensorView mv = make_view(mean.data(), DType::f32, {1, 1, D});
  Quantized out(1, 3, 1, D, ScaleLayout::per_block, 64);
  Prologue p = plain(ScaleLayout::per_block, 64, 0.f);
  x.at(0, 1, 0, 3) = 9.f;  // 9 - 5 = 4 is the largest |v|; the zero rows would give 5
  p.mean = &mv;
  Context ctx;
  norm_rope_quantize(x.view, p, out.qv, out.sv, ctx);
  EXPECT_EQ(out.scale[0], 4.f / 127.f);
  EXPECT_EQ(out.q[0], -127);       // (1 - 5) / (4/127)
  EXPECT_EQ(out.q[D + 3], 127);    // (9 - 5)
}

TEST(prologue, sm_scale_multiplies_before_quantization) {
  const int D = 16;
  Act x(1, 1, 1, D, 2.f);
  x.at(0, 0, 0, 1) = -1.5f;
  Quantized out(1, 1, 1, D, ScaleLayout::per_block, 8);
  Prologue p = plain(ScaleLayout::per_block, 8, 0.f);
  p.sm_scale = 0.25f;
  Context ctx;
  norm_rope_quantize(x.view, p, out.qv, out.sv, ctx);
  EXPECT_EQ(out.scale[0], 0.5f / 127.f);
  EXPECT_EQ(out.q[0], 127);
  EXPECT_EQ(out.q[1], -95);  // -0.375 / (0.5/127) = -95.25
}

// The mean pass with N = 1 returns the normalized, rotated row itself in fp32.
std::vector<float> single_row(const TensorView& x, const Prologue& p) {
  std::vector<float> m(static_cast<size_t>(x.shape[0] * x.shape[2] * x.shape[3]), -7.f);
  TensorView mv = make_view(m.data(), DType::f32, {x.shape[0], x.shape[2], x.shape[3]});
  Context ctx;
  norm_rope_mean(x, p, mv, ctx);
  return m;
}

TEST(prologue, norm_hand_vectors) {
  const int D = 16;
  Act x(1, 1, 1, D, 2.f);  // sum x^2 / D = 4 -> inv = 0.5
  std::vector<float> w(D);
  for (int c = 0; c < D; ++c) w[c] = static_cast<float>(c + 1);
  TensorView wv = make_view(w.data(), DType::f32, {D});
  Prologue p;
  p.norm_weight = &wv;
  p.eps = 0.f;
  std::vector<float> y = single_row(x.view, p);
  for (int c = 0; c < D; ++c) EXPECT_EQ(y[c], static_cast<float>(c + 1));
  // eps enters under the root: sum/D = 4, eps = 12 -> inv = 1/4.
  p.eps = 12.f;
  y = single_row(x.view, p);
  for (int c = 0; c < D; ++c) EXPECT_EQ(y[c], 0.5f * static_cast<float>(c + 1));
}

TEST(prologue, norm_output_rounds_to_activation_dtype) {
  const int D = 16;
  std::vector<uint16_t> xb(D, dt::f32_to_bf16(1.f));
  TensorView x = make_view(xb.data(), DType::bf16, {1, 1, 1, D});
  std::vector<float> w(D, 1.f / 3.f);  // 0x3EAAAAAB
  TensorView wv = make_view(w.data(), DType::f32, {D});
  Prologue p;
  p.norm_weight = &wv;
  p.eps = 0.f;
  std::vector<float> y = single_row(x, p);
  for (int c = 0; c < D; ++c) EXPECT_EQ(y[c], 0.333984375f);  // bf16 0x3EAB
  std::vector<uint16_t> xh(D, dt::f32_to_f16(1.f));
  TensorView x16 = make_view(xh.data(), DType::f16, {1, 1, 1, D});
  y = single_row(x16, p);
  for (int c = 0; c < D; ++c) EXPECT_EQ(y[c], 0.33325195f);  // f16 0x3555 = 1365/4096
}

// Segmented norm weights (3, D): row r all r + 1.
struct ThreeRowWeights {
  std::vector<float> w;
  TensorView view;
  explicit ThreeRowWeights(int64_t D) : w(static_cast<size_t>(3 * D)) {
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < D; ++c) w[r * D + c] = static_cast<float>(r + 1);
    view = make_view(w.data(), DType::f32, {3, D});
  }
};

TEST(prologue, segmented_norm_weights) {
  const int D = 16;
  Act x(1, 3, 1, D, 1.f);
  ThreeRowWeights weights(D);
  TensorView& wv = weights.view;
  std::vector<int32_t> rows = {2, 0, 2};
  TensorView rv = make_view(rows.data(), DType::i32, {3});
  Prologue p;
  p.norm_weight = &wv;
  p.weight_rows = &rv;
  p.eps = 0.f;
  std::vector<float> m(D);
  TensorView mv = make_view(m.data(), DType::f32, {1, 1, D});
  Context ctx;
  norm_rope_mean(x.view, p, mv, ctx);
  for (int c = 0; c < D; ++c) EXPECT_EQ(m[c], 7.f / 3.f);  // (3 + 1 + 3) / 3
}

void expect_error_on(const char* arg, const char* text, const std::function<void()>& call);

// check_weight_rows false: no range check (no read-back on CUDA), an index out of range takes
// the nearest row: -5 -> row 0, 3 and 9 -> row 2 (weights 1, 2, 3 by row).
TEST(prologue, unchecked_weight_rows_clamp_to_the_nearest_row) {
  const int D = 16;
  Act x(1, 4, 1, D, 1.f);
  ThreeRowWeights weights(D);
  TensorView& wv = weights.view;
  std::vector<int32_t> rows = {-5, 3, 9, 1};
  TensorView rv = make_view(rows.data(), DType::i32, {4});
  Prologue p;
  p.norm_weight = &wv;
  p.weight_rows = &rv;
  p.eps = 0.f;
  std::vector<float> m(D, -1.f);
  TensorView mv = make_view(m.data(), DType::f32, {1, 1, D});
  Context ctx;
  expect_error_on("weight_rows", "token 0: expected a row in [0, 3), got -5",
                  [&] { norm_rope_mean(x.view, p, mv, ctx); });
  for (float v : m) ASSERT_EQ(v, -1.f);
  p.check_weight_rows = false;
  norm_rope_mean(x.view, p, mv, ctx);
  for (int c = 0; c < D; ++c) EXPECT_EQ(m[c], 9.f / 4.f);  // (1 + 3 + 3 + 2) / 4
  // The same codes as the same rows clamped by hand and checked (rows of varied values).
  for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  Quantized a(1, 4, 1, D, ScaleLayout::per_block, 8), b(1, 4, 1, D, ScaleLayout::per_block, 8);
  norm_rope_quantize(x.view, p, a.qv, a.sv, ctx);
  std::vector<int32_t> clamped = {0, 2, 2, 1};
  TensorView cv = make_view(clamped.data(), DType::i32, {4});
  p.weight_rows = &cv;
  p.check_weight_rows = true;
  norm_rope_quantize(x.view, p, b.qv, b.sv, ctx);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.scale, b.scale);
}

// NormScope::token (Wan): one RMS over the token's H·D channels. Head 0 all 1, head 1 all 7 (D 16):
// sum of squares 16 + 784 = 800, / 32 = 25, inv = 0.2; per head the inverses would be 1 and 1/7.
// The weight (H·D) or (H, D): head h reads row h.
TEST(prologue, token_norm_over_all_heads_hand_vector) {
  const int H = 2, D = 16;
  Act x(1, 1, H, D);
  for (int c = 0; c < D; ++c) x.at(0, 0, 0, c) = 1.f, x.at(0, 0, 1, c) = 7.f;
  std::vector<float> w(H * D);
  for (int c = 0; c < D; ++c) w[c] = 2.f, w[D + c] = 0.5f;
  Prologue p;
  p.eps = 0.f;
  p.norm_scope = NormScope::token;
  Context ctx;
  for (bool flat : {true, false}) {
    TensorView wv = flat ? make_view(w.data(), DType::f32, {H * D})
                         : make_view(w.data(), DType::f32, {H, D});
    p.norm_weight = &wv;
    std::vector<float> m(H * D, -1.f);  // N = 1: the mean is the row itself
    norm_rope_mean(x.view, p, make_view(m.data(), DType::f32, {1, H, D}), ctx);
    for (int c = 0; c < D; ++c) {
      EXPECT_EQ(m[c], 0.4f) << c;                // (1 * 0.2) * 2
      EXPECT_EQ(m[D + c], (7.f * 0.2f) * 0.5f) << c;  // 0.7 (to float rounding)
    }
  }
  // The per-head norm of the same row differs: head 0 -> 1 * 1 * 2.
  TensorView w0 = make_view(w.data(), DType::f32, {D});
  p.norm_weight = &w0;
  p.norm_scope = NormScope::head;
  std::vector<float> m(H * D);
  norm_rope_mean(x.view, p, make_view(m.data(), DType::f32, {1, H, D}), ctx);
  EXPECT_EQ(m[0], 2.f);
}

// NormScope::token against fp64 on random bf16 rows (H 5, D 48: 30 chunks of 8), through the
// store step (the norm output in x's dtype): within one bf16 rounding of the fp64 value.
TEST(prologue, token_norm_random_rows_vs_fp64) {
  const int64_t B = 2, N = 7, H = 5, D = 48;
  std::mt19937_64 rng(11);
  harness::HostTensor x(DType::bf16, {B, N, H, D}), w(DType::f32, {H * D});
  x.fill_normal(rng, 0.5f, 3.f);
  w.fill_uniform(rng, 0.25f, 2.f);
  TensorView wv = w.view();
  Prologue p;
  p.norm_weight = &wv;
  p.norm_scope = NormScope::token;
  harness::HostTensor y(DType::bf16, {B, N, H, D});
  Context ctx;
  detail::norm_rope_store(x.view(), p, y.view(), ctx);
  const harness::HostTensor ref = harness::norm_rope_f64(x, &w, nullptr, 1e-6, nullptr, false, true);
  for (int64_t i = 0; i < y.numel(); ++i)
    ASSERT_NEAR(y.get(i), ref.get(i), std::ldexp(std::fabs(ref.get(i)), -7) + 1e-6) << i;
}
TEST(prologue, rope_quarter_turn_split_interleaved_matrix_partial) {
  const int D = 16;
  Act x(1, 1, 1, D);
  for (int c = 0; c < D; ++c) x.at(0, 0, 0, c) = static_cast<float>(c + 1);
  for (int pairs : {8, 3}) {
    for (bool interleaved : {false, true}) {
      for (bool matrix : {false, true}) {
        std::vector<float> table(static_cast<size_t>(pairs * (matrix ? 4 : 2)));
        for (int pi = 0; pi < pairs; ++pi) {
          if (matrix) {  // [[cos, -sin], [sin, cos]]
            table[pi * 4 + 0] = 0.f, table[pi * 4 + 1] = -1.f;
            table[pi * 4 + 2] = 1.f, table[pi * 4 + 3] = 0.f;
          } else {
            table[pi * 2 + 0] = 0.f, table[pi * 2 + 1] = 1.f;
          }
        }
        Rope rope;
        rope.interleaved = interleaved;
        rope.table = matrix ? make_view(table.data(), DType::f32, {1, 1, 1, pairs, 2, 2})
                            : make_view(table.data(), DType::f32, {1, 1, 1, pairs, 2});
        Prologue p;
        p.rope = &rope;
        std::vector<float> y = single_row(x.view, p);
        for (int c = 0; c < D; ++c) {
          float want = static_cast<float>(c + 1);  // channels >= 2 * pairs pass through
          if (c < 2 * pairs) {
            if (interleaved)
              want = c % 2 == 0 ? -static_cast<float>(c + 2) : static_cast<float>(c);
            else
              want = c < pairs ? -static_cast<float>(c + pairs + 1)
                               : static_cast<float>(c - pairs + 1);
          }
          EXPECT_EQ(y[c], want) << "pairs " << pairs << " interleaved " << interleaved
                                << " matrix " << matrix << " channel " << c;
        }
      }
    }
  }
}

// Per-batch tables: batch 0 identity, batch 1 a half turn (cos -1, sin 0); a general angle
// against the fp64 rotation.
TEST(prologue, rope_per_batch_table_and_general_angle) {
  const int D = 16;
  Act x(3, 1, 1, D);
  for (int b = 0; b < 3; ++b)
    for (int c = 0; c < D; ++c) x.at(b, 0, 0, c) = static_cast<float>(c + 1);
  std::vector<float> table(3 * 8 * 2);
  for (int pi = 0; pi < 8; ++pi) {
    table[(0 * 8 + pi) * 2] = 1.f, table[(0 * 8 + pi) * 2 + 1] = 0.f;
    table[(1 * 8 + pi) * 2] = -1.f, table[(1 * 8 + pi) * 2 + 1] = 0.f;
    table[(2 * 8 + pi) * 2] = 0.6f, table[(2 * 8 + pi) * 2 + 1] = 0.8f;
  }
  Rope rope;
  rope.table = make_view(table.data(), DType::f32, {3, 1, 1, 8, 2});
  Prologue p;
  p.rope = &rope;
  std::vector<float> y = single_row(x.view, p);
  for (int c = 0; c < D; ++c) {
    EXPECT_EQ(y[c], static_cast<float>(c + 1));
    EXPECT_EQ(y[D + c], -static_cast<float>(c + 1));
    const double a = c < 8 ? c + 1 : c - 7, o = c < 8 ? c + 9 : c + 1;
    const double want = c < 8 ? 0.6 * a - 0.8 * o : 0.8 * a + 0.6 * o;
    EXPECT_NEAR(y[2 * D + c], want, 1e-5) << c;
  }
}

// A rope table read through strides (cos and sin of a pair 4 floats apart, sin 2 after cos) gives
// the bits of the same values in the contiguous (..., pairs, 2) table, which the CPU reads by a
// loop with the strides fixed (the mean of 37 random rows after norm and rope, both pairings).
TEST(prologue, strided_rope_table_gives_the_contiguous_bits) {
  const int64_t B = 2, N = 37, H = 3, D = 64, P = D / 2;
  std::mt19937_64 rng(20261207);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> angle(-3.2f, 3.2f);
  Act x(B, N, H, D);
  for (float& e : x.data) e = nd(rng);
  std::vector<float> tight(static_cast<size_t>(B * N * P * 2)), wide(tight.size() * 2, 9.f);
  for (size_t i = 0; i < tight.size() / 2; ++i) {
    const float a = angle(rng);
    tight[2 * i] = wide[4 * i] = std::cos(a);
    tight[2 * i + 1] = wide[4 * i + 2] = std::sin(a);
  }
  std::vector<float> w(static_cast<size_t>(D));
  for (float& e : w) e = 1.f + 0.25f * nd(rng);
  TensorView wv = make_view(w.data(), DType::f32, {D});
  for (bool interleaved : {false, true}) {
    Rope r_tight, r_wide;
    r_tight.table = make_view(tight.data(), DType::f32, {B, N, 1, P, 2});
    r_wide.table = make_view(wide.data(), DType::f32, {B, N, 1, P, 2});
    const int64_t wide_stride[5] = {N * P * 4, P * 4, P * 4, 4, 2};
    std::copy(wide_stride, wide_stride + 5, r_wide.table.stride);
    r_tight.interleaved = r_wide.interleaved = interleaved;
    Prologue p;
    p.norm_weight = &wv;
    p.rope = &r_tight;
    const std::vector<float> want = single_row(x.view, p);
    p.rope = &r_wide;
    const std::vector<float> got = single_row(x.view, p);
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
        << (interleaved ? "interleaved" : "split halves");
  }
}

TEST(prologue, mean_over_blocks_of_64) {
  const int D = 16, N = 130;
  Act x(1, N, 2, D);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < D; ++c) x.at(0, n, 0, c) = static_cast<float>(n), x.at(0, n, 1, c) = -1.f;
  std::vector<float> m(2 * D);
  TensorView mv = make_view(m.data(), DType::f32, {1, 2, D});
  Prologue p;
  Context ctx;
  norm_rope_mean(x.view, p, mv, ctx);
  for (int c = 0; c < D; ++c) {
    EXPECT_EQ(m[c], 64.5f);
    EXPECT_EQ(m[D + c], -1.f);
  }
}

// The fused k path by hand: channel c of token n is base_n + c with bases 137, -117, 73.5, -53.5
// (mean 10), so mean_out = 10 + c and v = base_n - 10 = 127, -127, 63.5, -63.5 (exact): scale 1,
// codes 127, -127, 64, -64 (ties away from zero).
TEST(prologue, mean_quantize_hand_vector) {
  const int D = 16, N = 4;
  const float base[N] = {137.f, -117.f, 73.5f, -53.5f};
  const int8_t want[N] = {127, -127, 64, -64};
  Act x(1, N, 1, D);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < D; ++c) x.at(0, n, 0, c) = base[n] + static_cast<float>(c);
  Quantized out(1, N, 1, D, ScaleLayout::per_block, 8);
  std::vector<float> m(D, -3.f);
  TensorView mv = make_view(m.data(), DType::f32, {1, 1, D});
  Context ctx;
  norm_rope_mean_quantize(x.view, plain(ScaleLayout::per_block, 8, 0.f), mv, out.qv, out.sv, ctx);
  for (int c = 0; c < D; ++c) EXPECT_EQ(m[c], 10.f + static_cast<float>(c)) << "channel " << c;
  EXPECT_EQ(out.scale[0], 1.f);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < D; ++c) EXPECT_EQ(out.q[n * D + c], want[n]) << "token " << n;
}

// norm_rope_mean_quantize gives the bits of norm_rope_mean, then norm_rope_quantize with that
// mean: norm + split-half rope + THREAD_K, strided (a fused QKV slice), odd N, B = 2.
TEST(prologue, mean_quantize_equals_the_two_calls) {
  const int B = 2, N = 37, H = 3, D = 32, P = D / 2;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.3f, 1.5f);
  std::vector<float> qkv(static_cast<size_t>(B * N * 3 * H * D));
  for (float& v : qkv) v = nd(rng);
  TensorView x = make_view(qkv.data() + H * D, DType::f32, {B, N, H, D});
  x.stride[0] = N * 3 * H * D, x.stride[1] = 3 * H * D;
  std::vector<float> w(D), table(static_cast<size_t>(N * P * 2));
  for (float& v : w) v = 0.5f + std::abs(nd(rng));
  for (int i = 0; i < N * P; ++i) {
    const float t = nd(rng);
    table[2 * i] = std::cos(t), table[2 * i + 1] = std::sin(t);
  }
  TensorView wv = make_view(w.data(), DType::f32, {D});
  Rope rope;
  rope.table = make_view(table.data(), DType::f32, {1, N, 1, P, 2});
  for (ScaleLayout layout : {ScaleLayout::thread_k, ScaleLayout::thread_q}) {
    Prologue p = plain(layout, layout == ScaleLayout::thread_k ? 16 : 32, 1e-7f);
    p.norm_weight = &wv;
    p.rope = &rope;
    Quantized fused(B, N, H, D, layout, p.block), two(B, N, H, D, layout, p.block);
    std::vector<float> m_fused(B * H * D, -3.f), m_two(B * H * D, -4.f);
    TensorView mf = make_view(m_fused.data(), DType::f32, {B, H, D});
    TensorView mt = make_view(m_two.data(), DType::f32, {B, H, D});
    Context ctx;
    norm_rope_mean_quantize(x, p, mf, fused.qv, fused.sv, ctx);
    norm_rope_mean(x, p, mt, ctx);
    Prologue pm = p;
    pm.mean = &mt;
    norm_rope_quantize(x, pm, two.qv, two.sv, ctx);
    EXPECT_EQ(std::memcmp(m_fused.data(), m_two.data(), m_two.size() * sizeof(float)), 0);
    EXPECT_EQ(fused.q, two.q);
    EXPECT_EQ(std::memcmp(fused.scale.data(), two.scale.data(), two.scale.size() * sizeof(float)),
              0);
    int nonzero = 0;
    for (int8_t q : fused.q) nonzero += q != 0;
    EXPECT_GT(nonzero, B * N * H * D / 2);  // the mean did not cancel the rows
  }
}

// Strided input (a head slice of a fused QKV buffer) and a strided int8 output inside a larger
// buffer: the padding bytes stay untouched, the codes equal those of contiguous copies.
TEST(prologue, strided_input_and_output) {
  const int B = 2, N = 19, H = 3, D = 32;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> qkv(static_cast<size_t>(B * N * 3 * H * D));
  for (auto& v : qkv) v = dt::f32_to_bf16(nd(rng));
  TensorView k = make_view(qkv.data() + H * D, DType::bf16, {B, N, H, D});  // the k slice
  k.stride[0] = N * 3 * H * D, k.stride[1] = 3 * H * D, k.stride[2] = D, k.stride[3] = 1;
  std::vector<uint16_t> kc(static_cast<size_t>(B * N * H * D));
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < H * D; ++i)
        kc[((b * N + n) * H) * D + i] = qkv[(b * N + n) * 3 * H * D + H * D + i];
  TensorView kcv = make_view(kc.data(), DType::bf16, {B, N, H, D});
  std::vector<int8_t> qbuf(static_cast<size_t>(B * N * H * (D + 8)), int8_t{77});
  TensorView qs = make_view(qbuf.data(), DType::i8, {B, N, H, D});
  qs.stride[0] = N * H * (D + 8), qs.stride[1] = H * (D + 8), qs.stride[2] = D + 8;
  const int64_t sc = prologue_scale_count(N, ScaleLayout::thread_k, 8);
  std::vector<float> s1(B * H * sc), s2(B * H * sc);
  std::vector<int8_t> q2(static_cast<size_t>(B * N * H * D));
  Prologue p = plain(ScaleLayout::thread_k, 8, 1e-7f);
  Context ctx;
  norm_rope_quantize(k, p, qs, make_view(s1.data(), DType::f32, {B, H, sc}), ctx);
  norm_rope_quantize(kcv, p, make_view(q2.data(), DType::i8, {B, N, H, D}),
                     make_view(s2.data(), DType::f32, {B, H, sc}), ctx);
  EXPECT_EQ(s1, s2);
  for (int r = 0; r < B * N * H; ++r)
    for (int c = 0; c < D + 8; ++c) {
      const int8_t got = qbuf[r * (D + 8) + c];
      if (c < D)
        ASSERT_EQ(got, q2[r * D + c]);
      else
        ASSERT_EQ(got, 77) << "padding byte written";
    }
}

// The unfused step the bench runs: rope(norm(x)) stored in x's dtype.
TEST(prologue, unfused_store_step_rounds_to_activation_dtype) {
  const int D = 16;
  std::vector<uint16_t> xb(D);
  for (int c = 0; c < D; ++c) xb[c] = dt::f32_to_bf16(static_cast<float>(c + 1));
  TensorView x = make_view(xb.data(), DType::bf16, {1, 1, 1, D});
  std::vector<float> table(16);
  for (int pi = 0; pi < 8; ++pi) table[2 * pi] = 0.f, table[2 * pi + 1] = 1.f;
  Rope rope;
  rope.table = make_view(table.data(), DType::f32, {1, 1, 1, 8, 2});
  std::vector<float> w(D, 1.f / 3.f);
  TensorView wv = make_view(w.data(), DType::f32, {D});
  Prologue p;
  p.rope = &rope;
  p.norm_weight = &wv;
  p.eps = 0.f;
  std::vector<uint16_t> y(D, 0xffff);
  Context ctx;
  detail::norm_rope_store(x, p, make_view(y.data(), DType::bf16, {1, 1, 1, D}), ctx);
  const std::vector<float> ref = single_row(x, p);  // fp32 rows of the mean pass (N = 1)
  for (int c = 0; c < D; ++c) {
    EXPECT_EQ(y[c], dt::f32_to_bf16(ref[c])) << c;
    EXPECT_NE(y[c], 0xffff);
  }
  // A quarter turn of the normed rows: channel 0 gets -y[8] < 0.
  EXPECT_LT(dt::bf16_to_f32(y[0]), 0.f);
}

// ---- fp64 reference on random inputs: every option on, odd sizes, D = 48 (3 x 16) ------------

double round_act_double(double v, DType dt) {
  const float f = static_cast<float>(v);
  return dt == DType::bf16 ? dt::bf16_to_f32(dt::f32_to_bf16(f))
                           : dt == DType::f16 ? dt::f16_to_f32(dt::f32_to_f16(f)) : f;
}

TEST(prologue, random_inputs_against_fp64_reference) {
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ang(-3.f, 3.f);
  struct Cfg {
    DType dt;
    int D, pairs;
    bool interleaved, matrix, mean;
    ScaleLayout layout;
    int block;
  };
  const Cfg cfgs[] = {
      {DType::bf16, 48, 24, false, false, true, ScaleLayout::thread_k, 64},
      {DType::f16, 64, 16, true, true, false, ScaleLayout::thread_q, 16},
      {DType::f32, 32, 5, false, true, true, ScaleLayout::warp_q, 128},
      {DType::bf16, 128, 64, true, false, true, ScaleLayout::per_block, 40},
  };
  for (const Cfg& cf : cfgs) {
    const int B = 2, N = 37, H = 2, D = cf.D, R = 2;
    std::vector<float> xf(B * N * H * D);
    for (auto& v : xf) v = static_cast<float>(round_act_double(nd(rng) * 3.f + 0.5f, cf.dt));
    std::vector<uint16_t> x16(xf.size());
    for (size_t i = 0; i < xf.size(); ++i)
      x16[i] = cf.dt == DType::bf16 ? dt::f32_to_bf16(xf[i]) : dt::f32_to_f16(xf[i]);
    TensorView x = cf.dt == DType::f32 ? make_view(xf.data(), DType::f32, {B, N, H, D})
                                       : make_view(x16.data(), cf.dt, {B, N, H, D});
    std::vector<float> w(R * D);
    for (auto& v : w) v = 0.5f + std::fabs(nd(rng));
    std::vector<int32_t> rows(N);
    for (int n = 0; n < N; ++n) rows[n] = n % 3 == 0 ? 1 : 0;
    TensorView wv = make_view(w.data(), DType::f32, {R, D});
    TensorView rv = make_view(rows.data(), DType::i32, {N});
    const int width = cf.matrix ? 4 : 2;
    std::vector<float> table(B * N * cf.pairs * width);
    std::vector<double> cs(B * N * cf.pairs), sn(B * N * cf.pairs);
    for (int i = 0; i < B * N * cf.pairs; ++i) {
      const float t = ang(rng);
      cs[i] = std::cos(t), sn[i] = std::sin(t);
      float* e = table.data() + i * width;
      if (cf.matrix)
        e[0] = std::cos(t), e[1] = -std::sin(t), e[2] = std::sin(t), e[3] = std::cos(t);
      else
        e[0] = std::cos(t), e[1] = std::sin(t);
      cs[i] = e[0], sn[i] = cf.matrix ? e[2] : e[1];
    }
    Rope rope;
    rope.interleaved = cf.interleaved;
    rope.table = cf.matrix ? make_view(table.data(), DType::f32, {B, N, 1, cf.pairs, 2, 2})
                           : make_view(table.data(), DType::f32, {B, N, 1, cf.pairs, 2});
    Prologue p;
    p.norm_weight = &wv;
    p.weight_rows = &rv;
    p.eps = 1e-6f;
    p.rope = &rope;
    p.sm_scale = 0.7f;
    p.layout = cf.layout;
    p.block = cf.block;
    // fp64 reference of the rows (the norm output rounded to the activation dtype, as SPEC says).
    std::vector<double> ref(xf.size());
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < N; ++n)
        for (int h = 0; h < H; ++h) {
          const float* xr = xf.data() + ((b * N + n) * H + h) * D;
          double ss = 0;
          for (int c = 0; c < D; ++c) ss += double(xr[c]) * xr[c];
          const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
          std::vector<double> y(D), o(D);
          for (int c = 0; c < D; ++c) y[c] = round_act_double(xr[c] * inv * w[rows[n] * D + c], cf.dt);
          o = y;
          for (int pi = 0; pi < cf.pairs; ++pi) {
            const int c0 = cf.interleaved ? 2 * pi : pi, c1 = cf.interleaved ? 2 * pi + 1 : pi + cf.pairs;
            const double co = cs[(b * N + n) * cf.pairs + pi], si = sn[(b * N + n) * cf.pairs + pi];
            o[c0] = co * y[c0] - si * y[c1];
            o[c1] = si * y[c0] + co * y[c1];
          }
          for (int c = 0; c < D; ++c) ref[((b * N + n) * H + h) * D + c] = o[c];
        }
    std::vector<double> mref(B * H * D, 0.0);
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < N; ++n)
        for (int h = 0; h < H; ++h)
          for (int c = 0; c < D; ++c) mref[(b * H + h) * D + c] += ref[((b * N + n) * H + h) * D + c] / N;
    std::vector<float> mean(B * H * D);
    TensorView mv = make_view(mean.data(), DType::f32, {B, H, D});
    Context ctx;
    norm_rope_mean(x, p, mv, ctx);
    for (int i = 0; i < B * H * D; ++i) ASSERT_NEAR(mean[i], mref[i], 2e-3) << i;
    if (cf.mean) p.mean = &mv;
    Quantized out(B, N, H, D, cf.layout, cf.block);
    norm_rope_quantize(x, p, out.qv, out.sv, ctx);
    // Dequantized codes against the fp64 values: within one step (plus the bf16 flips of the
    // norm output, which both sides apply) and exact codes on at least 99 % of the elements.
    const int groups = scale_groups(cf.layout);
    const int64_t count = prologue_scale_count(N, cf.layout, cf.block);
    int64_t exact = 0;
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < N; ++n)
        for (int h = 0; h < H; ++h) {
          const int r = n % cf.block, blk = n / cf.block;
          const int g = cf.layout == ScaleLayout::per_block ? 0
                        : cf.layout == ScaleLayout::thread_q ? r % 8
                        : cf.layout == ScaleLayout::thread_k ? (r % 8) / 2
                                                             : r / 32;
          const double s = out.scale[(b * H + h) * count + blk * groups + g];
          for (int c = 0; c < D; ++c) {
            const int64_t i = ((b * N + n) * H + h) * D + c;
            double v = ref[i] - (cf.mean ? double(mean[(b * H + h) * D + c]) : 0.0);
            v *= 0.7;
            const double qd = v / s;
            const double want = qd >= 0 ? std::floor(qd + 0.5) : -std::floor(-qd + 0.5);
            ASSERT_LE(std::fabs(out.q[i] - want), 1.0) << "element " << i << " qd " << qd;
            ASSERT_LE(std::fabs(want), 127.0);
            exact += out.q[i] == want;
          }
        }
    EXPECT_GE(exact, static_cast<int64_t>(0.99 * B * N * H * D));
  }
}

// ---- argument errors: clear errors, nothing written -------------------------------------------

// `call` throws an Error that names argument `arg` and whose message contains `text`.
void expect_error_on(const char* arg, const char* text, const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << "no error for " << arg;
  } catch (const Error& e) {
    EXPECT_STREQ(e.argument(), arg) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

struct ErrorFixture {
  static constexpr int B = 1, N = 9, H = 2, D = 32;
  Act x{B, N, H, D, 1.f};
  Quantized out{B, N, H, D, ScaleLayout::thread_k, 8};
  std::vector<float> mean = std::vector<float>(B * H * D, -3.f);
  TensorView mv = make_view(mean.data(), DType::f32, {B, H, D});
  Prologue p = plain(ScaleLayout::thread_k, 8, 1e-7f);

  void expect_error(const char* arg, const std::function<void()>& call) {
    expect_error_on(arg, "expected", call);
    for (int8_t q : out.q) ASSERT_EQ(q, -99) << "written despite the error on " << arg;
    for (float s : out.scale) ASSERT_EQ(s, -1.f) << "written despite the error on " << arg;
    for (float m : mean) ASSERT_EQ(m, -3.f) << "written despite the error on " << arg;
  }
  void quantize() {
    Context ctx;
    norm_rope_quantize(x.view, p, out.qv, out.sv, ctx);
  }
  void mean_pass() {
    Context ctx;
    norm_rope_mean(x.view, p, mv, ctx);
  }
  void mean_quantize() { mean_quantize(mv, out.qv, out.sv); }
  void mean_quantize(TensorView m, TensorView q, TensorView s) {
    Context ctx;
    norm_rope_mean_quantize(x.view, p, m, q, s, ctx);
  }
};

TEST(prologue_errors, mean_quantize_arguments) {
  ErrorFixture f;
  f.p.mean = &f.mv;  // the fused call computes the mean itself
  f.expect_error("p.mean", [&] { f.mean_quantize(); });
  f.p.mean = nullptr;
  f.p.block = 12;
  f.expect_error("block", [&] { f.mean_quantize(); });
  f.p.block = 8;
  TensorView bad = f.mv;
  bad.shape[1] = 3;
  f.expect_error("mean_out", [&] { f.mean_quantize(bad, f.out.qv, f.out.sv); });
  TensorView short_scale = f.out.sv;
  short_scale.shape[2] -= 1;
  f.expect_error("scale_out", [&] { f.mean_quantize(f.mv, f.out.qv, short_scale); });
  // mean_out inside x (the quantize pass would read a mean that the mean pass overwrote x with).
  const std::vector<float> x_before = f.x.data;
  TensorView in_x = make_view(f.x.data.data() + 32, DType::f32, {1, 2, 32});
  f.expect_error("mean_out", [&] { f.mean_quantize(in_x, f.out.qv, f.out.sv); });
  EXPECT_EQ(f.x.data, x_before);
  // mean_out inside scale_out (f32 both).
  std::vector<float> big(64 + f.out.scale.size(), -1.f);
  TensorView sv = make_view(big.data(), DType::f32, {1, 2, f.out.sv.shape[2]});
  TensorView mv = make_view(big.data() + 8, DType::f32, {1, 2, 32});
  f.expect_error("mean_out", [&] { f.mean_quantize(mv, f.out.qv, sv); });
  for (float v : big) ASSERT_EQ(v, -1.f);
}

TEST(prologue_errors, pairs_beyond_half_the_head_dim) {
  ErrorFixture f;
  std::vector<float> table(17 * 2 * 9);
  Rope rope;
  rope.table = make_view(table.data(), DType::f32, {1, 9, 1, 17, 2});
  f.p.rope = &rope;
  f.expect_error("rope.table", [&] { f.quantize(); });
  f.expect_error("rope.table", [&] { f.mean_pass(); });
}

TEST(prologue_errors, rope_table_wrong_tokens_or_batch) {
  ErrorFixture f;
  std::vector<float> table(2 * 8 * 2 * 10);
  Rope rope;
  rope.table = make_view(table.data(), DType::f32, {1, 8, 1, 8, 2});
  f.p.rope = &rope;
  f.expect_error("rope.table", [&] { f.quantize(); });
  rope.table = make_view(table.data(), DType::f32, {2, 9, 1, 8, 2});
  f.expect_error("rope.table", [&] { f.quantize(); });
}

TEST(prologue_errors, weight_rows_out_of_range) {
  ErrorFixture f;
  std::vector<float> w(2 * 32, 1.f);
  TensorView wv = make_view(w.data(), DType::f32, {2, 32});
  std::vector<int32_t> rows = {0, 1, 1, 0, 2, 0, 0, 0, 0};
  TensorView rv = make_view(rows.data(), DType::i32, {9});
  f.p.norm_weight = &wv;
  f.p.weight_rows = &rv;
  f.expect_error("weight_rows", [&] { f.quantize(); });
  rows[4] = -1;
  f.expect_error("weight_rows", [&] { f.mean_pass(); });
  f.p.weight_rows = nullptr;  // (R, D) weights need rows
  f.expect_error("weight_rows", [&] { f.quantize(); });
}

// The CUDA backend runs NormScope::token as the store step (the rounded norm output y) and then
// the passes on y with the norm off: the same codes, scales and mean as the fused arithmetic,
// shown here with the public calls on the CPU (k path: mean + quantize, interleaved rope).
TEST(prologue, token_norm_equals_the_staged_norm_output) {
  const int64_t B = 2, N = 70, H = 3, D = 64;
  std::mt19937_64 rng(13);
  harness::HostTensor x(DType::bf16, {B, N, H, D}), w(DType::bf16, {H, D});
  x.fill_normal(rng, 0.3f, 2.f);
  w.fill_uniform(rng, 0.25f, 2.f);
  harness::HostTensor table = harness::rope_table(1, N, D / 2, false, rng);
  TensorView wv = w.view();
  Rope rope{table.view(), true};
  Prologue fused = plain(ScaleLayout::thread_k, 64, 1e-7f);
  fused.norm_weight = &wv;
  fused.norm_scope = NormScope::token;
  fused.rope = &rope;
  const int64_t sc = prologue_scale_count(N, ScaleLayout::thread_k, 64);
  harness::HostTensor q1(DType::i8, {B, N, H, D}), s1(DType::f32, {B, H, sc}),
      m1(DType::f32, {B, H, D});
  harness::HostTensor q2 = q1, s2 = s1, m2 = m1, y(DType::bf16, {B, N, H, D});
  Context ctx;
  norm_rope_mean_quantize(x.view(), fused, m1.view(), q1.view(), s1.view(), ctx);
  Prologue norm_only;
  norm_only.norm_weight = &wv;
  norm_only.norm_scope = NormScope::token;
  detail::norm_rope_store(x.view(), norm_only, y.view(), ctx);
  Prologue rest = fused;
  rest.norm_weight = nullptr;
  norm_rope_mean_quantize(y.view(), rest, m2.view(), q2.view(), s2.view(), ctx);
  EXPECT_EQ(q1.bytes, q2.bytes);
  EXPECT_EQ(s1.bytes, s2.bytes);
  EXPECT_EQ(m1.bytes, m2.bytes);
}

TEST(prologue_errors, token_norm_arguments) {
  ErrorFixture f;  // H 2, D 32
  std::vector<float> w(2 * 32, 1.f);
  TensorView per_head = make_view(w.data(), DType::f32, {32});
  f.p.norm_scope = NormScope::token;
  f.p.norm_weight = &per_head;  // (D): the token scope needs (H·D) or (H, D)
  f.expect_error("norm_weight", [&] { f.quantize(); });
  TensorView three = make_view(w.data(), DType::f32, {3, 16});
  f.p.norm_weight = &three;
  f.expect_error("norm_weight", [&] { f.mean_pass(); });
  TensorView rows2 = make_view(w.data(), DType::f32, {2, 32});
  std::vector<int32_t> rows(9, 0);
  TensorView rv = make_view(rows.data(), DType::i32, {9});
  f.p.norm_weight = &rows2;
  f.p.weight_rows = &rv;  // segmented weights are per-head norms
  f.expect_error("weight_rows", [&] { f.quantize(); });
  f.p.weight_rows = nullptr;
  f.p.norm_scope = static_cast<NormScope>(7);
  f.expect_error("norm_scope", [&] { f.quantize(); });
  f.p.norm_scope = NormScope::token;
  f.quantize();  // (H, D) is valid
  EXPECT_NE(f.out.q[0], -99);
}

TEST(prologue_errors, block_not_a_multiple_of_8) {
  ErrorFixture f;
  f.p.block = 12;
  f.expect_error("block", [&] { f.quantize(); });
  f.p.block = 0;
  f.expect_error("block", [&] { f.quantize(); });
  f.p.layout = ScaleLayout::thread_q;
  f.p.block = 48;  // does not divide the 128-row padding
  f.expect_error("block", [&] { f.quantize(); });
}

TEST(prologue_errors, mismatched_shapes) {
  ErrorFixture f;
  TensorView q = f.out.qv;
  q.shape[2] = 1;  // (B, N, 1, D)
  f.expect_error("q_out", [&] {
    Context ctx;
    norm_rope_quantize(f.x.view, f.p, q, f.out.sv, ctx);
  });
  TensorView s = f.out.sv;
  s.shape[2] -= 1;  // one scale short
  f.expect_error("scale_out", [&] {
    Context ctx;
    norm_rope_quantize(f.x.view, f.p, f.out.qv, s, ctx);
  });
  std::vector<float> w(16, 1.f);
  TensorView wv = make_view(w.data(), DType::f32, {16});  // D = 32 expected
  f.p.norm_weight = &wv;
  f.expect_error("norm_weight", [&] { f.quantize(); });
  f.p.norm_weight = nullptr;
  std::vector<float> m2(2 * 32);
  TensorView mv2 = make_view(m2.data(), DType::f32, {1, 1, 32});  // H = 2 expected
  f.p.mean = &mv2;
  f.expect_error("mean", [&] { f.quantize(); });
  f.p.mean = nullptr;
  TensorView mo = f.mv;
  mo.shape[2] = 16;
  f.expect_error("mean_out", [&] {
    Context ctx;
    norm_rope_mean(f.x.view, f.p, mo, ctx);
  });
}

TEST(prologue_errors, channel_stride_not_one) {
  ErrorFixture f;
  TensorView xs = f.x.view;
  xs.shape[3] = 16;
  xs.stride[3] = 2;
  TensorView q = f.out.qv;
  q.shape[3] = 16;
  f.expect_error("x", [&] {
    Context ctx;
    norm_rope_quantize(xs, f.p, q, f.out.sv, ctx);
  });
  f.expect_error("x", [&] {
    Context ctx;
    norm_rope_mean(xs, f.p, f.mv, ctx);
  });
  TensorView q2 = f.out.qv;
  q2.stride[3] = 2;
  q2.shape[3] = 16;
  xs.stride[3] = 1;
  f.expect_error("q_out", [&] {
    Context ctx;
    norm_rope_quantize(xs, f.p, q2, f.out.sv, ctx);
  });
}

TEST(prologue_errors, head_dim_and_dtype) {
  ErrorFixture f;
  TensorView xs = f.x.view;
  xs.shape[3] = 24;  // not a multiple of 16
  f.expect_error("x", [&] {
    Context ctx;
    norm_rope_mean(xs, f.p, f.mv, ctx);
  });
  TensorView xi = f.x.view;
  xi.dtype = DType::i8;
  f.expect_error("x", [&] { Context ctx; norm_rope_mean(xi, f.p, f.mv, ctx); });
  f.p.scale_eps = -1.f;
  f.expect_error("scale_eps", [&] { f.quantize(); });
}

// detail::norm_rsqrt (the norm's correctly rounded 1 / sqrt, the harness's `prologue.rsqrt` op):
// hand-computed roundings (exact 1 / sqrt in 60-digit decimal, then the nearest float), and bad
// arguments rejected with nothing written.
TEST(PrologueRsqrt, HandValuesAndErrors) {
  const uint32_t s_bits[] = {0x40800000u /* 4 */, 0x3e800000u /* 0.25 */, 0x40000000u /* 2 */,
                             0x40400000u /* 3 */, 0x40a00000u /* 5 */, 0x358637bdu /* 1e-6f */};
  const uint32_t want[] = {0x3f000000u, 0x40000000u, 0x3f3504f3u,
                           0x3f13cd3au, 0x3ee4f92eu, 0x447a0000u};
  constexpr int64_t n = 6;
  std::vector<float> s(n), out(n, -7.f);
  std::memcpy(s.data(), s_bits, sizeof s_bits);
  Context ctx;
  detail::norm_rsqrt(make_view(s.data(), DType::f32, {n}), make_view(out.data(), DType::f32, {n}),
                     ctx);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t got;
    std::memcpy(&got, &out[i], 4);
    EXPECT_EQ(got, want[i]) << "s bits 0x" << std::hex << s_bits[i];
  }
  std::vector<uint16_t> half(n, 0x1234);
  std::vector<float> short_out(n - 1, -7.f);
  auto expect_error = [&](const char* arg, const std::function<void()>& call) {
    expect_error_on(arg, "norm_rsqrt", call);
  };
  expect_error("out", [&] {
    detail::norm_rsqrt(make_view(s.data(), DType::f32, {n}),
                       make_view(half.data(), DType::f16, {n}), ctx);
  });
  expect_error("out", [&] {
    detail::norm_rsqrt(make_view(s.data(), DType::f32, {n}),
                       make_view(short_out.data(), DType::f32, {n - 1}), ctx);
  });
  expect_error("s", [&] {
    detail::norm_rsqrt(make_view(half.data(), DType::f16, {n}),
                       make_view(out.data(), DType::f32, {n}), ctx);
  });
  for (uint16_t h : half) EXPECT_EQ(h, 0x1234);
  for (float v : short_out) EXPECT_EQ(v, -7.f);
}

}  // namespace
}  // namespace lowbit
