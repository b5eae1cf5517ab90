// Unit tests of the ConvRot family (SPEC §3): hand-computed vectors for every format rule,
// the rotation identity against the dense Kronecker product, fp64 references, error paths.
#include "lowbit/linear.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <utility>
#include <vector>

#include "lowbit/dtype.h"
#include "src/core/linear_backend.h"
#include "src/cpu/amx.h"
#include "src/cpu/bits_vbmi.h"
#include "src/cpu/gemm_vnni.h"
#include "src/cpu/linear_gemv.h"
#include "src/cpu/linear_kernels.h"
#include "src/cpu/rows.h"
#include "tests/unit/random_data.h"

namespace lowbit {
namespace {

using namespace cpu::convrot;

// ---- helpers
// ------------------------------------------------------------------------------------- Dense R_n =
// R4^{⊗k} in fp64 (SPEC §3.1).
std::vector<double> dense_r(int n) {
  const double r4[4][4] = {{1, 1, 1, -1}, {1, 1, -1, 1}, {1, -1, 1, 1}, {-1, 1, 1, 1}};
  std::vector<double> r{1.0};
  int m = 1;
  while (m < n) {
    std::vector<double> next(static_cast<size_t>(m * 4 * m * 4));
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j)
        for (int a = 0; a < 4; ++a)
          for (int b = 0; b < 4; ++b)
            next[(i * 4 + a) * (m * 4) + (j * 4 + b)] = r[i * m + j] * r4[a][b] * 0.5;
    r.swap(next);
    m *= 4;
  }
  return r;
}

using testing_data::normal_vec;

// x (R, K) · R_rot per block, fp64.
std::vector<double> rotate_ref(const std::vector<float>& x, int64_t R, int64_t K, int rot) {
  std::vector<double> r = dense_r(rot), y(x.size());
  for (int64_t row = 0; row < R; ++row)
    for (int64_t b = 0; b < K; b += rot)
      for (int j = 0; j < rot; ++j) {
        double s = 0;
        for (int i = 0; i < rot; ++i) s += static_cast<double>(x[row * K + b + i]) * r[i * rot + j];
        y[row * K + b + j] = s;
      }
  return y;
}

// ---- rotation
// -------------------------------------------------------------------------------------
TEST(LinearRotation, FactorizationEqualsKroneckerProduct) {
  for (int n : {4, 16, 64, 256}) {
    int k = 0;
    for (int m = n; m > 1; m /= 4) ++k;
    // D, Sylvester H, P built from their definitions, multiplied densely: D·H·P·D / sqrt(n).
    auto d = [&](int i) {
      int threes = 0;
      for (int t = 0; t < k; ++t) threes += ((i >> (2 * t)) & 3) == 3;
      return (threes % 2) ? -1.0 : 1.0;
    };
    auto h = [&](int i, int j) { return (__builtin_popcount(i & j) % 2) ? -1.0 : 1.0; };
    const int perm4[4] = {0, 2, 1, 3};
    auto p = [&](int i) {
      int r = 0;
      for (int t = 0; t < k; ++t) r += perm4[(i >> (2 * t)) & 3] << (2 * t);
      return r;
    };
    std::vector<double> r = dense_r(n);
    double max_diff = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        // (D H P D)_ij = d_i · H_{i, p^-1(j)} · d_j (P permutation matrix with P[p(j)][j] = 1).
        double v = d(i) * h(i, p(j)) * d(j) / std::sqrt(static_cast<double>(n));
        max_diff = std::max(max_diff, std::fabs(v - r[i * n + j]));
      }
    EXPECT_EQ(max_diff, 0.0) << "n=" << n;
    // R_n symmetric and its own inverse.
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(r[i * n + j], r[j * n + i]);
        double s = 0;
        for (int t = 0; t < n; ++t) s += r[i * n + t] * r[t * n + j];
        EXPECT_NEAR(s, i == j ? 1.0 : 0.0, 1e-12);
      }
  }
}

TEST(LinearRotation, FastTransformMatchesFp64) {
  Context ctx;
  for (int rot : {16, 64, 256}) {
    const int64_t R = 7, K = rot * 3;
    std::vector<float> x = normal_vec(static_cast<size_t>(R * K), 11 + rot, 3.f), y(x.size());
    hadamard_rotate(make_view(x.data(), DType::f32, {R, K}), rot,
                    make_view(y.data(), DType::f32, {R, K}), ctx);
    std::vector<double> ref = rotate_ref(x, R, K, rot);
    double num = 0, den = 0, worst = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      num += (y[i] - ref[i]) * (y[i] - ref[i]);
      den += ref[i] * ref[i];
      worst = std::max(worst, std::fabs(y[i] - ref[i]));
    }
    EXPECT_LE(std::sqrt(num / den), 1e-6) << "rot " << rot;
    // Every element within a few fp32 ulps of the block's scale.
    EXPECT_LE(worst, 1e-5) << "rot " << rot;
    // Self-inverse: rotating twice gives x back (to fp32 rounding), in place.
    hadamard_rotate(make_view(y.data(), DType::f32, {R, K}), rot,
                    make_view(y.data(), DType::f32, {R, K}), ctx);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5 * 3) << i;
  }
}

TEST(LinearRotation, Bf16InputAndOutputRoundOnce) {
  Context ctx;
  const int64_t K = 64;
  std::vector<float> xf = normal_vec(K, 5);
  std::vector<uint16_t> xb(K), yb(K);
  for (int64_t i = 0; i < K; ++i) {
    xb[i] = dt::f32_to_bf16(xf[i]);
    xf[i] = dt::bf16_to_f32(xb[i]);
  }
  hadamard_rotate(make_view(xb.data(), DType::bf16, {K}), 64,
                  make_view(yb.data(), DType::bf16, {K}), ctx);
  std::vector<double> ref = rotate_ref(xf, 1, K, 64);
  for (int64_t i = 0; i < K; ++i) {
    float got = dt::bf16_to_f32(yb[i]);
    EXPECT_LE(std::fabs(got - ref[i]), std::fabs(ref[i]) * (1.0 / 256) + 1e-6) << i;
  }
}

TEST(LinearRotation, Blocks) {
  EXPECT_EQ(rotation_block(4096), 256);
  EXPECT_EQ(rotation_block(3072), 256);  // 3072 = 3 * 1024
  EXPECT_EQ(rotation_block(320), 64);
  EXPECT_EQ(rotation_block(48), 16);
  EXPECT_EQ(rotation_block(40), 4);
  EXPECT_EQ(rotation_block(2), 1);
}

// ---- qtypes and can_quantize
// ---------------------------------------------------------------------
TEST(LinearQType, NamesRoundTrip) {
  const char* names[] = {"convrot8",      "convrotint2",      "convrotint3", "convrotint4",
                         "convrotint5",   "convrotint6",      "convrotint7", "convrotint8",
                         "convrotbitnet", "convrotcomfyw4a4", "convrot4",    "convrotfp8"};
  for (int i = 0; i < kNumQTypes; ++i) {
    EXPECT_EQ(static_cast<int>(parse_qtype(names[i])), i);
    EXPECT_STREQ(qtype_name(static_cast<QType>(i)), names[i]);
  }
  EXPECT_THROW(parse_qtype("convrot3"), Error);
  EXPECT_THROW(parse_qtype("ConvRot8"), Error);
  EXPECT_EQ(qtype_bits(QType::convrot_int5), 5);
  EXPECT_EQ(qtype_group(QType::convrot_int4, 4096), 128);
  EXPECT_EQ(qtype_group(QType::convrot_int4, 320), 64);
  EXPECT_EQ(qtype_group(QType::convrot_int4, 48), 16);
}

TEST(LinearQType, CanQuantizeRules) {
  std::string why;
  EXPECT_TRUE(can_quantize(QType::convrot8, 8, 16, &why));
  EXPECT_FALSE(can_quantize(QType::convrot8, 8, 40, &why));  // K % 16
  EXPECT_NE(why.find("multiple of 16"), std::string::npos);
  EXPECT_FALSE(can_quantize(QType::convrot8, 12, 64, &why));  // O % 8
  EXPECT_FALSE(can_quantize(QType::convrot4, 8, 64, &why));   // NVFP4 O % 16
  EXPECT_TRUE(can_quantize(QType::convrot4, 16, 64, &why));
  EXPECT_TRUE(can_quantize(QType::convrot8, 8, 32, &why));  // K % 16 == 0 implies rot >= 16
  EXPECT_EQ(rotation_block(32), 16);
  EXPECT_FALSE(can_quantize(QType::convrot_comfy_w4a4, 8, 64, &why));
  EXPECT_TRUE(can_quantize(QType::convrot_comfy_w4a4, 8, 512, &why));
  EXPECT_FALSE(can_quantize(QType::convrot8, 0, 64, nullptr));
  // The size bound (shapes read from files): 2^40 weights pass, one more row of 8 does not; each
  // side at most 2^31 - 1; products that would wrap int64 are refused, not computed.
  EXPECT_TRUE(can_quantize(QType::convrot8, int64_t{1} << 24, int64_t{1} << 16, &why)) << why;
  EXPECT_FALSE(can_quantize(QType::convrot8, (int64_t{1} << 24) + 8, int64_t{1} << 16, &why));
  EXPECT_NE(why.find("layer too large"), std::string::npos) << why;
  EXPECT_FALSE(can_quantize(QType::convrot8, 8, (int64_t{1} << 31) + 256, &why));
  EXPECT_FALSE(can_quantize(QType::convrot8, int64_t{1} << 62, int64_t{1} << 20, &why));
  EXPECT_NE(why.find("layer too large"), std::string::npos) << why;
  // packed_weight_parts names the parts of tensors() with their shapes, allocating nothing.
  const auto parts = packed_weight_parts(QType::convrot_int4, int64_t{1} << 24, int64_t{1} << 16);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].first, "codes");
  EXPECT_EQ(parts[0].second.data, nullptr);
  EXPECT_EQ(parts[0].second.numel(), (int64_t{1} << 24) * (int64_t{1} << 15));
  const auto small = make_packed_weight(QType::convrot_int4, 16, 256).tensors();
  const auto small_parts = packed_weight_parts(QType::convrot_int4, 16, 256);
  ASSERT_EQ(small.size(), small_parts.size());
  for (size_t i = 0; i < small.size(); ++i) {
    EXPECT_EQ(small[i].first, small_parts[i].first);
    EXPECT_EQ(small[i].second.dtype, small_parts[i].second.dtype);
    EXPECT_EQ(small[i].second.describe(), small_parts[i].second.describe());
  }
  EXPECT_THROW(packed_weight_parts(QType::convrot8, 12, 64), Error);
}

// ---- packing rules (hand-computed bytes)
// ---------------------------------------------------------
TEST(LinearPacking, BitPackHandVectors) {
  struct V {
    int bits;
    int8_t codes[8];
    std::vector<uint8_t> bytes;
  } vs[] = {
      {2, {-1, 0, 1, 1, 0, -1, -1, 1}, {0xa4, 0x81}},
      {3, {3, -3, 0, 1, 2, -1, -2, 3}, {0xc6, 0x58, 0xc5}},
      {4, {-7, 7, 0, 1, -1, 3, -4, 5}, {0xe0, 0x87, 0xa6, 0xc3}},
      {5, {15, -15, 0, 1, -1, 7, -8, 3}, {0x1e, 0x3c, 0xe8, 0xec, 0x91}},
      {6, {31, -31, 0, 1, -1, 16, -17, 9}, {0x3e, 0xf0, 0x81, 0xde, 0xeb, 0xa0}},
      {7, {63, -63, 0, 1, -1, 31, -32, 5}, {0x7e, 0xc0, 0x0f, 0xe8, 0xf3, 0x7e, 0x88}},
      {8, {127, -127, 0, 1, -1, 64, -64, 5}, {0xfe, 0x00, 0x7f, 0x80, 0x7e, 0xbf, 0x3f, 0x84}},
  };
  for (const V& v : vs) {
    std::vector<uint8_t> out(v.bits);
    pack_bits(v.codes, 8, v.bits, out.data());
    EXPECT_EQ(out, v.bytes) << "bits " << v.bits;
    int8_t back[8];
    unpack_bits(out.data(), 8, v.bits, back);
    for (int j = 0; j < 8; ++j) EXPECT_EQ(back[j], v.codes[j]);
    // The same vector 9 times (72 codes: one 64-code step of the AVX-512 VBMI unpack, then the
    // scalar tail): the bytes repeat, and every copy unpacks to the hand codes.
    std::vector<uint8_t> rep;
    for (int r = 0; r < 9; ++r) rep.insert(rep.end(), v.bytes.begin(), v.bytes.end());
    int8_t back9[72];
    unpack_bits(rep.data(), 72, v.bits, back9);
    for (int j = 0; j < 72; ++j)
      EXPECT_EQ(back9[j], v.codes[j % 8]) << "bits " << v.bits << " " << j;
  }
}

TEST(LinearPacking, BitPackRoundTripEveryWidth) {
  std::mt19937_64 rng(3);
  for (int bits = 2; bits <= 8; ++bits)
    // the vector unpacks' steps (VBMI 64 codes, AVX2 32 with its last loads inside the row)
    // and scalar tails
    for (int64_t K : {8, 32, 64, 232, 1024}) {
      const int qmax = (1 << (bits - 1)) - 1;
      std::uniform_int_distribution<int> d(-qmax, qmax);
      std::vector<int8_t> c(K), back(K);
      for (auto& x : c) x = static_cast<int8_t>(d(rng));
      c[0] = static_cast<int8_t>(-qmax);
      c[K - 1] = static_cast<int8_t>(qmax);
      std::vector<uint8_t> p(K / 8 * bits);
      pack_bits(c.data(), K, bits, p.data());
      for (const char* mode : {"simd", "avx2", "scalar"}) {  // AVX2: no VBMI
        force_avx2_kernels(mode[0] == 'a');
        force_scalar_kernels(mode[0] == 's');
        std::fill(back.begin(), back.end(), int8_t{99});
        unpack_bits(p.data(), K, bits, back.data());
        EXPECT_EQ(c, back) << bits << " bits, K " << K << " (" << mode << ")";
      }
      force_avx2_kernels(false);
      force_scalar_kernels(false);
    }
}

TEST(LinearPacking, TernaryHandVectors) {
  // u = c + 1: [2, 0, 1, 2, 2] -> 2 + 0 + 9 + 54 + 162 = 227; tail [0, -1] -> u [1, 0], pad 0 -> 1.
  const int8_t codes[7] = {1, -1, 0, 1, 1, 0, -1};
  uint8_t out[2];
  pack_ternary(codes, 7, out);
  EXPECT_EQ(out[0], 227);
  EXPECT_EQ(out[1], 1);
  int8_t back[7];
  unpack_ternary(out, 7, back);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(back[i], codes[i]);
  const int8_t all_one[5] = {1, 1, 1, 1, 1};
  pack_ternary(all_one, 5, out);
  EXPECT_EQ(out[0], 242);  // 3^5 - 1
  // Every byte value 0..242 and a tail of 1..4 codes round-trip.
  std::vector<int8_t> all(243 * 5 + 3);
  for (int b = 0; b < 243; ++b)
    for (int j = 0, v = b; j < 5; ++j, v /= 3) all[b * 5 + j] = static_cast<int8_t>(v % 3 - 1);
  for (int64_t K : {int64_t{243 * 5}, int64_t{243 * 5 + 3}, int64_t{4}}) {
    std::vector<uint8_t> packed((K + 4) / 5);
    pack_ternary(all.data(), K, packed.data());
    for (int64_t i = 0; i + 5 <= std::min<int64_t>(K, 243 * 5); i += 5)
      ASSERT_EQ(packed[i / 5], i / 5) << i;
    std::vector<int8_t> round(K);
    unpack_ternary(packed.data(), K, round.data());
    EXPECT_EQ(std::vector<int8_t>(all.begin(), all.begin() + K), round) << K;
  }
}

TEST(LinearPacking, SwizzleIndexMatchesReshapeDescription) {
  // SPEC §3.4: pad (R, C) to (rb*128, cb*4), view (rb, 128, cb, 4), permute (0, 2, 1, 3), reshape
  // (-1, 4, 32, 4), swap axes 1 and 2, flatten. Emulated with explicit index arithmetic.
  for (auto rc : {std::pair<int64_t, int64_t>{128, 4}, {200, 7}, {16, 2}, {300, 12}}) {
    const int64_t R = rc.first, C = rc.second, rb = (R + 127) / 128, cb = (C + 3) / 4;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        // After view+permute: coordinates (r/128, c/4, r%128, c%4) in shape (rb, cb, 128, 4).
        int64_t i0 = r / 128, i1 = c / 4, i2 = r % 128, i3 = c % 4;
        // Reshape to (rb*cb, 4, 32, 4): flat position in the permuted tensor, re-split.
        int64_t flat = ((i0 * cb + i1) * 128 + i2) * 4 + i3;
        int64_t a = flat / (4 * 32 * 4), b = flat / (32 * 4) % 4, cc = flat / 4 % 32, d = flat % 4;
        // Swap axes 1 and 2: shape (n, 32, 4, 4), position (a, cc, b, d).
        int64_t want = ((a * 32 + cc) * 4 + b) * 4 + d;
        ASSERT_EQ(swizzle_index(r, c, C), want) << r << "," << c;
        ASSERT_LT(want, rb * 128 * cb * 4);
      }
  }
  // Hand values: (0,0) -> 0, (0,1) -> 1, (1,0) -> 16, (32,0) -> 4, (0,4) -> 512 (second tile).
  EXPECT_EQ(swizzle_index(0, 0, 8), 0);
  EXPECT_EQ(swizzle_index(0, 1, 8), 1);
  EXPECT_EQ(swizzle_index(1, 0, 8), 16);
  EXPECT_EQ(swizzle_index(32, 0, 8), 4);
  EXPECT_EQ(swizzle_index(0, 4, 8), 512);
}

// ---- rounding rules
// ------------------------------------------------------------------------------
TEST(LinearRounding, Int8RowTiesToEvenAndZeroRow) {
  // amax 127 -> scale exactly 1: the quotients are the values themselves.
  float w[16] = {127,  0.5f,  1.5f,   2.5f,  -0.5f, -1.5f, -2.5f, 3.5f,
                 -127, 0.49f, 126.5f, -3.5f, 0,     0,     0,     0};
  int8_t c[16];
  EXPECT_EQ(quantize_row_int(w, 16, 127, c), 1.f);
  const int8_t want[16] = {127, 0, 2, 2, 0, -2, -2, 4, -127, 0, 126, -4, 0, 0, 0, 0};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(c[i], want[i]) << i;
  float z[16] = {};
  EXPECT_EQ(quantize_row_int(z, 16, 127, c), 1.f);  // amax 0 -> scale 1
  for (int i = 0; i < 16; ++i) EXPECT_EQ(c[i], 0);
  // comfy activations: qmax 7, amax 14 -> scale 2; 5 -> 2.5 -> 2; 3 -> 1.5 -> 2; -1 -> -0.5 -> 0.
  float a[16] = {14, 5, 3, -1, -14, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(quantize_row_int(a, 16, 7, c), 2.f);
  const int8_t want7[6] = {7, 2, 2, 0, -7, 4};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c[i], want7[i]) << i;
  // A NaN gives a NaN scale and code 0 for every element, never a crash.
  float n[16] = {1, NAN, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_TRUE(std::isnan(quantize_row_int(n, 16, 127, c)));
  EXPECT_EQ(c[0], 0);
}

TEST(LinearRounding, Fp8RowScale) {
  float w[16] = {448, 1, -2, 0.3f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t c[16];
  EXPECT_EQ(quantize_row_fp8(w, 16, c), 1.f);
  EXPECT_EQ(c[0], 0x7e);
  EXPECT_EQ(c[1], 0x38);
  EXPECT_EQ(c[2], 0xc0);
  EXPECT_EQ(c[3], 0x2a);  // 0.3 -> 0.3125 = 2^-2 * 1.25: e = 5, m = 2
  float z[16] = {};
  EXPECT_EQ(quantize_row_fp8(z, 16, c), 1.f);
}

TEST(LinearRounding, MseGroupScaleHandVectors) {
  // Expected scales and codes from an independent numpy float32 evaluation of SPEC §3.3 with the
  // docs/linear.md lane order.
  const float w[16] = {1.0f,   0.9f, 0.2f, -0.1f, 0.05f, -0.6f,  0.3f, 0.45f,
                       -0.35f, 0.0f, 0.7f, -0.8f, 0.15f, -0.25f, 0.5f, -0.55f};
  struct V {
    int qmax;
    uint32_t scale_bits;
    int8_t codes[16];
  } vs[] = {
      {1, 0x3f266667u, {1, 1, 0, 0, 0, -1, 0, 1, -1, 0, 1, -1, 0, 0, 1, -1}},
      {3, 0x3e933332u, {3, 3, 1, 0, 0, -2, 1, 2, -1, 0, 2, -3, 1, -1, 2, -2}},
      {7, 0x3e13889du, {7, 6, 1, -1, 0, -4, 2, 3, -2, 0, 5, -6, 1, -2, 3, -4}},
  };
  for (const V& v : vs) {
    int8_t c[16];
    float s = mse_group_quantize(w, 16, v.qmax, c);
    EXPECT_EQ(dt::f32_bits(s), v.scale_bits) << "qmax " << v.qmax << " got " << s;
    for (int i = 0; i < 16; ++i) EXPECT_EQ(c[i], v.codes[i]) << "qmax " << v.qmax << " i " << i;
  }
  // A zero group: amax 0 -> 1; every code 0; refits skipped (num = den = 0).
  float z[16] = {};
  int8_t c[16];
  float s = mse_group_quantize(z, 16, 7, c);
  EXPECT_EQ(s, static_cast<float>(0.2 / 7));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(c[i], 0);
}

// fold_codes (the GEMM's weight rows of grouped qtypes): every code at many ratios, the AVX2 path
// and the scalar one against fold_code element by element (odd lengths: the scalar tail too).
TEST(LinearRounding, FoldCodesMatchFoldCode) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float ratios[] = {1.f, 0.5f, 1.5f, 18.142857f, 0.f, -2.25f, 127.f, 1e-8f, 3e38f, inf, nan};
  std::vector<int8_t> all;
  for (int c = -128; c <= 127; ++c) all.push_back(static_cast<int8_t>(c));
  all.push_back(5);  // 257: an odd length
  for (bool scalar : {false, true}) {
    force_scalar_kernels(scalar);
    for (float r : ratios) {
      std::vector<int8_t> got = all;
      fold_codes(got.data(), static_cast<int64_t>(got.size()), r);
      for (size_t i = 0; i < all.size(); ++i)
        ASSERT_EQ(got[i], fold_code(all[i], r))
            << "code " << int(all[i]) << " ratio " << r << (scalar ? " scalar" : " vector");
    }
  }
  force_scalar_kernels(false);
}

TEST(LinearRounding, GroupFoldOntoRowGrid) {
  // s = {0.1, 0.4}, qmax 7: rscale = 0.4 * float(7/127); ratios = s / rscale.
  const float gs[2] = {0.1f, 0.4f};
  float ratios[2];
  float rs = fold_group_scales(gs, 2, 7, ratios);
  EXPECT_EQ(rs, 0.4f * static_cast<float>(7 / 127.0));
  EXPECT_EQ(ratios[1], 0.4f / rs);
  // The largest group maps qmax to 127 (to fp32 rounding), code 7 -> 127; code -3 -> -54.4 -> -54.
  EXPECT_EQ(fold_code(7, ratios[1]), 127);
  EXPECT_EQ(fold_code(-3, ratios[1]), static_cast<int8_t>(std::nearbyint(-3 * ratios[1])));
  EXPECT_EQ(fold_code(-3, ratios[1]), -54);
  float zr[1];
  const float zero[1] = {0.f};
  EXPECT_EQ(fold_group_scales(zero, 1, 7, zr), 1.f);  // all-zero row: rscale 1
}

TEST(LinearRounding, Nvfp4ActivationBlockHandVector) {
  // amax 6 -> base 1 -> scale e4m3(1) = 0x38; midpoints go to the lower code.
  const float x[16] = {6,    3,    2.9f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f,
                       3.5f, 5.0f, -6,   -0.1f, 0.26f, 4,     1,     0};
  uint8_t s[1], p[8];
  quantize_row_nvfp4_act(x, 16, s, p);
  EXPECT_EQ(s[0], 0x38);
  const uint8_t want[8] = {0x57, 0x05, 0x21, 0x43, 0x65, 0x8f, 0x61, 0x02};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(p[i], want[i]) << i;
  // A huge block clamps the base to 448 first; codes saturate at 6.
  float big[16] = {6000};
  quantize_row_nvfp4_act(big, 16, s, p);
  EXPECT_EQ(s[0], 0x7e);
  EXPECT_EQ(p[0] & 15, 7);
  // A zero block: scale 0, divide by 1, codes 0.
  float zero[16] = {};
  quantize_row_nvfp4_act(zero, 16, s, p);
  EXPECT_EQ(s[0], 0);
  EXPECT_EQ(p[0], 0);
}

// Straightforward re-statement of the SPEC §3.4 weight sweep (scalar, from the text).
void nvfp4_weight_block_ref(const float* w, float pts, uint8_t* scale, uint8_t* codes16) {
  float amax = 0;
  for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(w[i]));
  float base = amax / (6.f * pts);
  int best = -1;
  float best_e = 0;
  uint8_t best_s = 0;
  for (int i = 0; i < 9; ++i) {
    float c = base * static_cast<float>(0.70 + i * 0.05);
    if (c > 448.f) continue;
    uint8_t s8 = dt::f32_to_e4m3(c);
    float den = dt::e4m3_to_f32(s8) * pts;
    if (!(den > 0)) den = 1;
    float lane[16];
    for (int l = 0; l < 16; ++l) {
      float z = std::min(6.f, std::max(-6.f, w[l] / den));
      float d = w[l] - dt::e2m1_to_f32(dt::f32_to_e2m1(z)) * den;
      lane[l] = d * d;
    }
    for (int h = 8; h >= 1; h /= 2)
      for (int l = 0; l < h; ++l) lane[l] += lane[l + h];
    if (best < 0 || lane[0] < best_e) {
      best = i;
      best_e = lane[0];
      best_s = s8;
    }
  }
  *scale = best_s;
  float den = dt::e4m3_to_f32(best_s) * pts;
  if (!(den > 0)) den = 1;
  for (int l = 0; l < 16; ++l)
    codes16[l] = dt::f32_to_e2m1(std::min(6.f, std::max(-6.f, w[l] / den)));
}

TEST(LinearRounding, Nvfp4WeightSweepMatchesStatement) {
  std::vector<float> w = normal_vec(64 * 16, 9);
  for (int i = 0; i < 64; ++i) w[i * 16 + (i % 16)] *= 8.f;  // an outlier per block
  const float pts = 0.0123f;
  std::vector<uint8_t> s(64), p(64 * 8);
  quantize_row_nvfp4_weight(w.data(), 64 * 16, pts, s.data(), p.data());
  int not_amax = 0;
  for (int b = 0; b < 64; ++b) {
    uint8_t rs, rc[16];
    nvfp4_weight_block_ref(w.data() + b * 16, pts, &rs, rc);
    ASSERT_EQ(s[b], rs) << b;
    for (int l = 0; l < 16; ++l) ASSERT_EQ(dt::get_nibble(p.data() + b * 8, l), rc[l]) << b;
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(w[b * 16 + l]));
    not_amax += rs != dt::f32_to_e4m3(amax / (6.f * pts));
  }
  EXPECT_GT(not_amax, 0);  // the sweep does change scales on real data
}

// ---- whole weights through the public API
// ---------------------------------------------------------
const QType kAll[] = {QType::convrot8,           QType::convrot_int2, QType::convrot_int3,
                      QType::convrot_int4,       QType::convrot_int5, QType::convrot_int6,
                      QType::convrot_int7,       QType::convrot_int8, QType::convrot_bitnet,
                      QType::convrot_comfy_w4a4, QType::convrot4,     QType::convrot_fp8};

double rel_weight_error(QType q, const std::vector<float>& w, int64_t O, int64_t K) {
  Context ctx;
  PackedWeight p =
      quantize_weight(make_view(const_cast<float*>(w.data()), DType::f32, {O, K}), q, ctx);
  std::vector<float> d(w.size());
  dequantize_weight(p, make_view(d.data(), DType::f32, {O, K}), false, ctx);
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    num += (double(w[i]) - d[i]) * (double(w[i]) - d[i]);
    den += double(w[i]) * w[i];
  }
  return std::sqrt(num / den);
}

TEST(LinearWeights, RelativeErrorBoundsPerQType) {
  const int64_t O = 32, K = 512;
  std::vector<float> w = normal_vec(static_cast<size_t>(O * K), 21, 0.02f);
  // Bounds for Gaussian rows (a rotation keeps them Gaussian): roughly the step of each grid.
  const double bound[] = {0.012, 0.75,  0.35, 0.16, 0.08, 0.04,
                          0.025, 0.012, 0.75, 0.16, 0.12, 0.04};
  double prev = 1.0;
  for (int i = 0; i < kNumQTypes; ++i) {
    double e = rel_weight_error(kAll[i], w, O, K);
    EXPECT_LT(e, bound[i]) << qtype_name(kAll[i]);
    EXPECT_GT(e, 0.0) << qtype_name(kAll[i]);
    if (i >= 1 && i <= 7) {
      EXPECT_LT(e, prev) << "more bits, less error: " << qtype_name(kAll[i]);
      prev = e;
    }
  }
  // bitnet stores convrotint2's exact codes: same error.
  EXPECT_EQ(rel_weight_error(QType::convrot_bitnet, w, O, K),
            rel_weight_error(QType::convrot_int2, w, O, K));
}

TEST(LinearWeights, ZeroWeightQuantizesToZero) {
  Context ctx;
  const int64_t O = 16, K = 256;
  std::vector<float> w(O * K, 0.f), d(O * K, 1.f);
  for (QType q : kAll) {
    PackedWeight p = quantize_weight(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    dequantize_weight(p, make_view(d.data(), DType::f32, {O, K}), false, ctx);
    for (float v : d) ASSERT_EQ(v, 0.f) << qtype_name(q);
    if (q != QType::convrot4) {
      const float* s = reinterpret_cast<const float*>(p.scales.data());
      for (int64_t o = 0; o < O; ++o) {
        // amax 0 -> 1 (per-row rules); MSE qtypes: the fold gives rscale 1 when every s_g is
        // 0.2/qmax.
        EXPECT_GT(s[o], 0.f) << qtype_name(q);
      }
    } else {
      float pts;
      std::memcpy(&pts, p.tensor_scale.data(), 4);
      EXPECT_EQ(pts, 1.f);
    }
  }
}

TEST(LinearWeights, Convrot8MatchesPlainStatement) {
  // Rotate in fp64 (dense), quantize with the SPEC rule, compare codes: the fast rotation may move
  // a quotient by an ulp, so at most a tie flips (one code, rarely).
  Context ctx;
  const int64_t O = 8, K = 256;
  std::vector<float> w = normal_vec(O * K, 4);
  PackedWeight p = quantize_weight(make_view(w.data(), DType::f32, {O, K}), QType::convrot8, ctx);
  std::vector<double> r = rotate_ref(w, O, K, 256);
  int diff = 0;
  for (int64_t o = 0; o < O; ++o) {
    double amax = 0;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(r[o * K + k]));
    float s = reinterpret_cast<const float*>(p.scales.data())[o];
    EXPECT_NEAR(s, amax / 127, amax / 127 * 1e-6);
    for (int64_t k = 0; k < K; ++k) {
      int want = static_cast<int>(std::nearbyint(r[o * K + k] / (amax / 127)));
      int got = static_cast<int8_t>(p.codes[o * K + k]);
      EXPECT_LE(std::abs(want - got), 1);
      diff += want != got;
    }
  }
  EXPECT_LE(diff, 2);
}

TEST(LinearWeights, PackedWeightTensorsRoundTrip) {
  Context ctx;
  const int64_t O = 32, K = 320;  // rot 64, group 64
  std::vector<float> w = normal_vec(O * K, 8);
  for (QType q : kAll) {
    if (!can_quantize(q, O, K, nullptr)) continue;
    PackedWeight p = quantize_weight(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    EXPECT_EQ(p.rot(), 64);
    auto parts = p.tensors();
    ASSERT_FALSE(parts.empty());
    EXPECT_EQ(parts[0].first, "codes");
    PackedWeight back(q, O, K, parts, p.rot(), p.group());
    EXPECT_EQ(back.codes, p.codes);
    EXPECT_EQ(back.scales, p.scales);
    EXPECT_EQ(back.ratios, p.ratios);
    EXPECT_EQ(back.block_scales_swizzled, p.block_scales_swizzled);
    EXPECT_EQ(back.storage_bytes(), p.storage_bytes());
    // Wrong group, missing part, wrong shape: rejected.
    EXPECT_THROW(PackedWeight(q, O, K, parts, p.rot(), p.group() * 2), Error);
    auto missing = parts;
    missing.pop_back();
    EXPECT_THROW(PackedWeight(q, O, K, missing), Error);
    EXPECT_THROW(PackedWeight(q, O + 8, K, parts), Error);
  }
}

TEST(LinearWeights, SizesPerQType) {
  Context ctx;
  const int64_t O = 16, K = 256;
  std::vector<float> w = normal_vec(O * K, 1);
  auto bytes = [&](QType q) {
    return quantize_weight(make_view(w.data(), DType::f32, {O, K}), q, ctx).codes.size();
  };
  EXPECT_EQ(bytes(QType::convrot8), size_t(O * K));
  EXPECT_EQ(bytes(QType::convrot_int3), size_t(O * K * 3 / 8));
  EXPECT_EQ(bytes(QType::convrot_bitnet), size_t(O * 52));  // ceil(256 / 5)
  EXPECT_EQ(bytes(QType::convrot_comfy_w4a4), size_t(O * K / 2));
  EXPECT_EQ(bytes(QType::convrot4), size_t(O * K / 2));
}

// ---- forward / backward
// --------------------------------------------------------------------------- Decodes the GEMM's
// weight values for row o independently of the library's unpackers: reads the packed bits one by
// one (integer families) and applies the fold in fp32.
std::vector<int> decode_int_codes(const PackedWeight& p, int64_t o) {
  const int64_t K = p.in_features();
  std::vector<int> c(K);
  const QType q = p.qtype();
  if (q == QType::convrot8) {
    for (int64_t k = 0; k < K; ++k) c[k] = static_cast<int8_t>(p.codes[o * K + k]);
  } else if (q == QType::convrot_bitnet) {
    const int64_t bpr = (K + 4) / 5;
    for (int64_t k = 0; k < K; ++k) {
      int v = p.codes[o * bpr + k / 5];
      for (int j = 0; j < k % 5; ++j) v /= 3;
      c[k] = v % 3 - 1;
    }
  } else if (q == QType::convrot_comfy_w4a4) {
    for (int64_t k = 0; k < K; ++k) {
      int nib = (p.codes[o * K / 2 + k / 2] >> (4 * (k % 2))) & 15;
      c[k] = nib >= 8 ? nib - 16 : nib;
    }
  } else {
    const int bits = p.bits(), qmax = (1 << (bits - 1)) - 1;
    const int64_t row = K / 8 * bits;
    for (int64_t k = 0; k < K; ++k) {
      int u = 0;
      for (int b = 0; b < bits; ++b) {
        int64_t bit = (k % 8) * bits + b;  // within the 8-code word
        u |= ((p.codes[o * row + (k / 8) * bits + bit / 8] >> (bit % 8)) & 1) << b;
      }
      c[k] = u - qmax;
    }
  }
  if (!p.ratios.empty()) {
    const float* ratios = reinterpret_cast<const float*>(p.ratios.data());
    const int64_t ng = K / p.group();
    for (int64_t k = 0; k < K; ++k) {
      float v = static_cast<float>(c[k]) * ratios[o * ng + k / p.group()];
      c[k] = static_cast<int>(std::max(-127.f, std::min(127.f, std::nearbyint(v))));
    }
  }
  return c;
}

TEST(LinearForward, IntegerQTypesBitExactAgainstIndependentDecode) {
  Context ctx;
  const int64_t M = 5, O = 24, K = 256;
  std::vector<float> w = normal_vec(O * K, 31, 0.05f), x = normal_vec(M * K, 32),
                     bias = normal_vec(O, 33);
  for (QType q : kAll) {
    if (q == QType::convrot4 || q == QType::convrot_fp8) continue;
    QuantizedLinear lin =
        QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    PackedWeight p = lin.to_packed(ctx);
    std::vector<float> out(M * O);
    TensorView bv = make_view(bias.data(), DType::f32, {O});
    lin.forward(make_view(x.data(), DType::f32, {M, K}), &bv,
                make_view(out.data(), DType::f32, {M, O}), ctx);
    // Activations through the public quantizer (tested by hand vectors above).
    std::vector<int8_t> ac(M * K);
    std::vector<float> as(M);
    rotate_quantize_activations(make_view(x.data(), DType::f32, {M, K}), q, lin.rotation_block(),
                                make_view(ac.data(), DType::i8, {M, K}),
                                make_view(as.data(), DType::f32, {M}), ctx);
    const int amax_code = q == QType::convrot_comfy_w4a4 ? 7 : 127;
    const float* ws = reinterpret_cast<const float*>(p.scales.data());
    for (int64_t o = 0; o < O; ++o) {
      std::vector<int> wc = decode_int_codes(p, o);
      for (int64_t m = 0; m < M; ++m) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          ASSERT_LE(std::abs(ac[m * K + k]), amax_code);
          acc += static_cast<int64_t>(ac[m * K + k]) * wc[k];
        }
        float want = static_cast<float>(acc) * as[m];
        want = want * ws[o];
        want = want + bias[o];
        ASSERT_EQ(dt::f32_bits(out[m * O + o]), dt::f32_bits(want))
            << qtype_name(q) << " " << m << "," << o;
      }
    }
  }
}

TEST(LinearForward, FloatQTypesAgainstFp64OfDequantizedOperands) {
  Context ctx;
  const int64_t M = 3, O = 32, K = 64;
  std::vector<float> w = normal_vec(O * K, 41, 0.05f), x = normal_vec(M * K, 42);
  for (QType q : {QType::convrot_fp8, QType::convrot4}) {
    QuantizedLinear lin =
        QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    std::vector<float> out(M * O);
    lin.forward(make_view(x.data(), DType::f32, {M, K}), nullptr,
                make_view(out.data(), DType::f32, {M, O}), ctx);
    std::vector<float> wd(O * K);
    dequantize_weight(lin.weights(), make_view(wd.data(), DType::f32, {O, K}), true, ctx);
    // Dequantized activations from the public quantizer's codes.
    std::vector<double> xd(M * K), xraw(M * K), wraw(O * K);
    std::vector<float> xs(M, 1.f);
    PackedWeight p = lin.to_packed(ctx);
    for (int64_t i = 0; i < O * K; ++i)
      wraw[i] = q == QType::convrot_fp8
                    ? double(dt::e4m3_to_f32(p.codes[i]))
                    : double(dt::e2m1_to_f32(dt::get_nibble(p.codes.data(), i))) *
                          dt::e4m3_to_f32(p.block_scales[i / 16]);
    if (q == QType::convrot_fp8) {
      std::vector<uint8_t> c(M * K);
      std::vector<float> s(M);
      rotate_quantize_activations(make_view(x.data(), DType::f32, {M, K}), q, 64,
                                  make_view(c.data(), DType::e4m3, {M, K}),
                                  make_view(s.data(), DType::f32, {M}), ctx);
      for (int64_t i = 0; i < M * K; ++i) xd[i] = double(dt::e4m3_to_f32(c[i])) * s[i / K];
      for (int64_t i = 0; i < M * K; ++i) xraw[i] = dt::e4m3_to_f32(c[i]);
      xs = s;
    } else {
      std::vector<uint8_t> c(M * K / 2), s(M * K / 16);
      rotate_quantize_activations(make_view(x.data(), DType::f32, {M, K}), q, 64,
                                  make_view(c.data(), DType::e2m1x2, {M, K}),
                                  make_view(s.data(), DType::e4m3, {M, K / 16}), ctx);
      for (int64_t i = 0; i < M * K; ++i)
        xd[i] = double(dt::e2m1_to_f32(dt::get_nibble(c.data(), i))) * dt::e4m3_to_f32(s[i / 16]);
      xraw = xd;
    }
    float ws_pts = 0;
    if (q == QType::convrot4) std::memcpy(&ws_pts, p.tensor_scale.data(), 4);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o = 0; o < O; ++o) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          ref += xd[m * K + k] * wd[o * K + k];
          mag += std::fabs(xd[m * K + k] * wd[o * K + k]);
        }
        // acc is exact then rounded; the epilogue and the dequantized weight add a few fp32 ulps.
        EXPECT_NEAR(out[m * O + o], ref, 4e-7 * mag + 1e-30)
            << qtype_name(q) << " " << m << "," << o;
        // Bit-exact: the products of the raw operands sum exactly in fp64 here (K = 64), are
        // rounded once to fp32, then the epilogue applies the two scales in order.
        double exact = 0;
        for (int64_t k = 0; k < K; ++k) exact += xraw[m * K + k] * wraw[o * K + k];
        float want = static_cast<float>(exact);
        if (q == QType::convrot_fp8) {
          want = want * xs[m];
          want = want * reinterpret_cast<const float*>(p.scales.data())[o];
        } else {
          want = want * 1.f;
          want = want * ws_pts;
        }
        EXPECT_EQ(dt::f32_bits(out[m * O + o]), dt::f32_bits(want))
            << qtype_name(q) << " " << m << "," << o;
      }
  }
}

TEST(LinearForward, Bf16ActivationsAndBias) {
  Context ctx;
  const int64_t M = 17, O = 16, K = 128;
  std::vector<float> w = normal_vec(O * K, 51, 0.05f), xf = normal_vec(M * K, 52);
  std::vector<uint16_t> x(M * K), out(M * O), bias(O);
  for (int64_t i = 0; i < M * K; ++i) x[i] = dt::f32_to_bf16(xf[i]);
  for (int64_t o = 0; o < O; ++o) bias[o] = dt::f32_to_bf16(0.25f * o);
  QuantizedLinear lin =
      QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), QType::convrot8, ctx);
  TensorView bv = make_view(bias.data(), DType::bf16, {O});
  lin.forward(make_view(x.data(), DType::bf16, {M, K}), &bv,
              make_view(out.data(), DType::bf16, {M, O}), ctx);
  // Against the full-precision layer: the W8A8 error is about 1 % of the output's scale.
  double num = 0, den = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < O; ++o) {
      double ref = 0.25 * o;
      for (int64_t k = 0; k < K; ++k) ref += double(dt::bf16_to_f32(x[m * K + k])) * w[o * K + k];
      double got = dt::bf16_to_f32(out[m * O + o]);
      num += (got - ref) * (got - ref);
      den += ref * ref;
    }
  EXPECT_LT(std::sqrt(num / den), 0.02);
}

TEST(LinearBackward, InputGradientAgainstFp64) {
  Context ctx;
  const int64_t M = 4, O = 16, K = 320;
  std::vector<float> w = normal_vec(O * K, 61, 0.05f), g = normal_vec(M * O, 62), gx(M * K);
  for (QType q : {QType::convrot8, QType::convrot_int3, QType::convrot4}) {
    QuantizedLinear lin =
        QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    std::vector<float> wd(O * K);
    dequantize_weight(lin.weights(), make_view(wd.data(), DType::f32, {O, K}), true, ctx);
    lin.backward_input(make_view(g.data(), DType::f32, {M, O}),
                       make_view(gx.data(), DType::f32, {M, K}), ctx);
    std::vector<float> t(M * K);
    std::vector<double> rot_in(M * K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t o = 0; o < O; ++o) s += double(g[m * O + o]) * wd[o * K + k];
        t[m * K + k] = static_cast<float>(s);
      }
    std::vector<double> ref = rotate_ref(t, M, K, lin.rotation_block());
    double num = 0, den = 0;
    for (int64_t i = 0; i < M * K; ++i) {
      num += (gx[i] - ref[i]) * (gx[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-6) << qtype_name(q);
  }
}

// ---- re-quantization
// -------------------------------------------------------------------------------
TEST(LinearRequantize, NearestReproducesQuantizedCodes) {
  Context ctx;
  const int64_t O = 16, K = 256;
  std::vector<float> w = normal_vec(O * K, 71, 0.05f);
  for (QType q : kAll) {
    QuantizedLinear lin =
        QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    PackedWeight before = lin.to_packed(ctx);
    lin.requantize(make_view(w.data(), DType::f32, {O, K}), false, 0, ctx);
    PackedWeight after = lin.to_packed(ctx);
    EXPECT_EQ(after.scales, before.scales);
    size_t same = 0;
    for (size_t i = 0; i < before.codes.size(); ++i) same += before.codes[i] == after.codes[i];
    // Grouped qtypes divide by ratio * rscale (not the exact s): a rare tie may move.
    EXPECT_GE(double(same), 0.99 * before.codes.size()) << qtype_name(q);
    if (q == QType::convrot8 || q == QType::convrot_fp8 || q == QType::convrot4 ||
        q == QType::convrot_comfy_w4a4 || q == QType::convrot_int8)
      EXPECT_EQ(after.codes, before.codes) << qtype_name(q);
  }
}

TEST(LinearRequantize, StochasticIsUnbiasedAndSeeded) {
  Context ctx;
  const int64_t O = 8, K = 64;
  std::vector<float> w = normal_vec(O * K, 81, 0.05f);
  QuantizedLinear lin =
      QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), QType::convrot8, ctx);
  // Expected z in the rotated basis: the nearest codes' pre-rounding values.
  std::vector<float> wr(O * K);
  hadamard_rotate(make_view(w.data(), DType::f32, {O, K}), 64,
                  make_view(wr.data(), DType::f32, {O, K}), ctx);
  const float* s = static_cast<const float*>(lin.weights().scales.data);
  std::vector<double> mean(O * K, 0.0);
  const int trials = 400;
  for (int t = 0; t < trials; ++t) {
    lin.requantize(make_view(w.data(), DType::f32, {O, K}), true, 1000 + t, ctx);
    const int8_t* c = static_cast<const int8_t*>(lin.weights().codes.data);
    for (int64_t i = 0; i < O * K; ++i) {
      double z = wr[i] / s[i / K];
      ASSERT_TRUE(c[i] == std::floor(z) || c[i] == std::floor(z) + 1) << i;
      mean[i] += c[i] / double(trials);
    }
  }
  double worst = 0;
  for (int64_t i = 0; i < O * K; ++i)
    worst = std::max(worst, std::fabs(mean[i] - wr[i] / s[i / K]));
  EXPECT_LT(worst, 0.1);  // 400 draws: sd <= 0.025
  // Same seed, same codes.
  lin.requantize(make_view(w.data(), DType::f32, {O, K}), true, 7, ctx);
  PackedWeight a = lin.to_packed(ctx);
  lin.requantize(make_view(w.data(), DType::f32, {O, K}), true, 7, ctx);
  EXPECT_EQ(lin.to_packed(ctx).codes, a.codes);
  EXPECT_EQ(uniform01(7, 0), uniform01(7, 0));
  EXPECT_NE(uniform01(7, 0), uniform01(7, 1));
  // splitmix64 first output for seed 0 is 0xE220A8397B1DCDAF: u = 0xE220A8 / 2^24.
  EXPECT_EQ(uniform01(0, 0), static_cast<float>(0xE220A8) / 16777216.f);
}

TEST(LinearRequantize, StochasticFloatGrids) {
  Context ctx;
  const int64_t O = 16, K = 64;
  std::vector<float> w = normal_vec(O * K, 91, 0.05f);
  for (QType q : {QType::convrot_fp8, QType::convrot4}) {
    QuantizedLinear lin =
        QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    std::vector<float> nearest(O * K), sto(O * K), sum(O * K, 0.f);
    lin.dequantize(make_view(nearest.data(), DType::f32, {O, K}), ctx);
    for (int t = 0; t < 200; ++t) {
      lin.requantize(make_view(w.data(), DType::f32, {O, K}), true, t, ctx);
      lin.dequantize(make_view(sto.data(), DType::f32, {O, K}), ctx);
      for (int64_t i = 0; i < O * K; ++i) sum[i] += sto[i] / 200;
    }
    // The stochastic mean is closer to the true weight than the nearest rounding, on average.
    double e_near = 0, e_mean = 0;
    for (int64_t i = 0; i < O * K; ++i) {
      e_near += (nearest[i] - w[i]) * (nearest[i] - w[i]);
      e_mean += (sum[i] - w[i]) * (sum[i] - w[i]);
    }
    EXPECT_LT(e_mean, e_near) << qtype_name(q);
  }
}

// ---- error paths: named argument, nothing written
// --------------------------------------------------
TEST(LinearErrors, BadArgumentsThrowAndWriteNothing) {
  Context ctx;
  const int64_t O = 16, K = 64;
  std::vector<float> w = normal_vec(O * K, 1);
  QuantizedLinear lin =
      QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), QType::convrot8, ctx);
  std::vector<float> x(4 * K, 1.f), out(4 * O, 7.f);
  auto expect_arg = [&](const std::function<void()>& f, const char* arg) {
    try {
      f();
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_STREQ(e.argument(), arg) << e.what();
    }
    for (float v : out) ASSERT_EQ(v, 7.f);
  };
  expect_arg(
      [&] {
        lin.forward(make_view(x.data(), DType::f32, {4, K - 16}), nullptr,
                    make_view(out.data(), DType::f32, {4, O}), ctx);
      },
      "x");
  expect_arg(
      [&] {
        lin.forward(make_view(x.data(), DType::f32, {4, K}), nullptr,
                    make_view(out.data(), DType::f32, {4, O - 1}), ctx);
      },
      "out");
  expect_arg(
      [&] {
        lin.forward(make_view(x.data(), DType::f32, {4, K}), nullptr,
                    make_view(out.data(), DType::bf16, {4, O}), ctx);
      },
      "out");
  expect_arg(
      [&] {
        lin.forward(make_view(x.data(), DType::i8, {4, K}), nullptr,
                    make_view(out.data(), DType::f32, {4, O}), ctx);
      },
      "x");
  TensorView bad_bias = make_view(w.data(), DType::f32, {O + 1});
  expect_arg(
      [&] {
        lin.forward(make_view(x.data(), DType::f32, {4, K}), &bad_bias,
                    make_view(out.data(), DType::f32, {4, O}), ctx);
      },
      "bias");
  expect_arg(
      [&] {
        hadamard_rotate(make_view(x.data(), DType::f32, {4, K}), 32,
                        make_view(out.data(), DType::f32, {4, K}), ctx);
      },
      "block");
  expect_arg(
      [&] {
        hadamard_rotate(make_view(x.data(), DType::f32, {4, 48}), 64,
                        make_view(out.data(), DType::f32, {4, 48}), ctx);
      },
      "block");
  expect_arg(
      [&] {
        quantize_weight(make_view(w.data(), DType::f32, {O, 40}), QType::convrot8, ctx);
      },
      "qtype");
  expect_arg(
      [&] {
        quantize_weight(make_view(w.data(), DType::f32, {8, 64}), QType::convrot4, ctx);
      },
      "qtype");
  expect_arg([&] { lin.dequantize(make_view(out.data(), DType::f32, {4, O}), ctx); }, "out");
  expect_arg(
      [&] {
        lin.backward_input(make_view(x.data(), DType::f32, {4, O + 8}),
                           make_view(out.data(), DType::f32, {4, K}), ctx);
      },
      "grad_out");
  std::vector<float> codes_f(4 * K);
  expect_arg(
      [&] {
        rotate_quantize_activations(make_view(x.data(), DType::f32, {4, K}), QType::convrot8, 64,
                                    make_view(codes_f.data(), DType::f32, {4, K}),
                                    make_view(out.data(), DType::f32, {4}), ctx);
      },
      "codes");
  QuantizedLinear empty;
  expect_arg(
      [&] {
        empty.forward(make_view(x.data(), DType::f32, {4, K}), nullptr,
                      make_view(out.data(), DType::f32, {4, O}), ctx);
      },
      "this");
  // A view whose parts disagree with its qtype.
  PackedWeightView v = lin.weights();
  v.qtype = QType::convrot_int4;
  v.bits = 4;
  std::vector<float> big(O * K, 7.f);
  expect_arg(
      [&] {
        dequantize_weight(v, make_view(big.data(), DType::f32, {O, K}), true, ctx);
      },
      "w.codes");
  for (float b : big) ASSERT_EQ(b, 7.f);
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// The AVX2 primitives give the scalar loops' bits (ties, zeros, outliers, NaN, every qmax).
TEST(LinearSimd, VectorKernelsMatchScalar) {
  if (!cpu::convrot::simd_kernels_available()) GTEST_SKIP() << "no AVX2 on this CPU";
  using namespace cpu::convrot;
  std::mt19937_64 rng(123);
  std::normal_distribution<float> n(0.f, 1.f);
  const int64_t K = 1024 + 16 * 3;
  std::vector<float> w(K);
  for (int64_t i = 0; i < K; ++i) {
    int kind = static_cast<int>(rng() % 8);
    w[i] = kind == 0 ? 0.f : kind == 1 ? std::nearbyint(n(rng) * 20.f) + 0.5f : n(rng);
  }
  w[17] = 40.f;  // an outlier
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) w[300] = NAN;
    for (int qmax : {1, 3, 7, 15, 31, 63, 127}) {
      std::vector<int8_t> a(K), b(K);
      force_scalar_kernels(true);
      float sa = quantize_row_int(w.data(), K, qmax, a.data());
      float ga = mse_group_quantize(w.data(), 128, qmax, a.data());
      force_scalar_kernels(false);
      float sb = quantize_row_int(w.data(), K, qmax, b.data());
      float gb = mse_group_quantize(w.data(), 128, qmax, b.data());
      EXPECT_EQ(dt::f32_bits(sa), dt::f32_bits(sb)) << qmax;
      EXPECT_EQ(dt::f32_bits(ga), dt::f32_bits(gb)) << qmax;
      EXPECT_EQ(a, b) << qmax;
    }
    std::vector<uint8_t> s1(K / 16), s2(K / 16), p1(K / 2), p2(K / 2);
    force_scalar_kernels(true);
    quantize_row_nvfp4_weight(w.data(), K, 0.0071f, s1.data(), p1.data());
    force_scalar_kernels(false);
    quantize_row_nvfp4_weight(w.data(), K, 0.0071f, s2.data(), p2.data());
    EXPECT_EQ(s1, s2);
    EXPECT_EQ(p1, p2);
  }
  for (int rot : {16, 64, 256}) {  // scalar against the widest (AVX-512) and the AVX2 build
    std::vector<float> x(rot * 4), y1(rot * 4), y2(rot * 4), y3(rot * 4);
    for (auto& v : x) v = n(rng) * 100.f;
    force_scalar_kernels(true);
    rotate_row(x.data(), y1.data(), rot * 4, rot);
    force_scalar_kernels(false);
    rotate_row(x.data(), y2.data(), rot * 4, rot);
    force_avx2_kernels(true);
    rotate_row(x.data(), y3.data(), rot * 4, rot);
    force_avx2_kernels(false);
    for (int i = 0; i < rot * 4; ++i) {
      ASSERT_EQ(dt::f32_bits(y1[i]), dt::f32_bits(y2[i])) << rot << " " << i;
      ASSERT_EQ(dt::f32_bits(y1[i]), dt::f32_bits(y3[i])) << rot << " " << i << " (AVX2)";
    }
  }
}

// The NVFP4 block codes (AVX2 and scalar) give dt::f32_to_e2m1(clamp(w / den)) on every
// boundary of SPEC §3.4 and its float neighbours, both signs, +-6 and beyond, zeros, NaN and
// infinities, with den 1 and with a den that divides inexactly.
TEST(LinearSimd, Nvfp4CodesMatchTheEncoder) {
  using namespace cpu::convrot;
  std::vector<float> v = {0.f, -0.f, NAN, -NAN, INFINITY, -INFINITY, 6.f, -6.f, 7.f, -1e30f};
  for (float b : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.f, 0.5f, 1.f, 3.f, 4.f})
    for (float s : {1.f, -1.f}) {
      v.push_back(s * b);
      v.push_back(s * std::nextafter(b, 0.f));
      v.push_back(s * std::nextafter(b, 10.f));
    }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-8.f, 8.f);
  while (v.size() % 16 != 0 || v.size() < 4096) v.push_back(u(rng));
  for (float den : {1.f, 0.3f, 1e-3f})
    for (bool scalar : {false, true}) {
      force_scalar_kernels(scalar);
      for (size_t b = 0; b < v.size(); b += 16) {
        uint8_t got[8];
        const std::vector<float> w(v.begin() + static_cast<int64_t>(b),
                                   v.begin() + static_cast<int64_t>(b) + 16);
        std::vector<float> wd(16);
        for (int l = 0; l < 16; ++l) wd[l] = w[l] * den;  // (then / den: near the same values)
        nvfp4_codes(wd.data(), den, got);
        for (int l = 0; l < 16; ++l) {
          float z = wd[l] / den;
          z = z > 6.f ? 6.f : z;
          z = z < -6.f ? -6.f : z;
          const uint8_t want = dt::f32_to_e2m1(z);
          ASSERT_EQ((got[l / 2] >> (4 * (l % 2))) & 0xf, want)
              << "w " << wd[l] << " den " << den << (scalar ? " (scalar)" : "");
        }
      }
    }
  force_scalar_kernels(false);
}

// The e4m3 encoder of the fp8 quantizers (AVX2 and scalar) gives dt::f32_to_e4m3's bits on
// hand-checked codes and on ~1.2 M fp32 patterns: a stride through all 2^32, and +-256 ulp
// around every e4m3 value and every midpoint between neighbours (both signs), with s = 1
// (w / 1 is w itself; NaN stays NaN).
TEST(LinearSimd, E4m3CodesMatchTheEncoder) {
  using namespace cpu::convrot;
  const std::pair<float, uint8_t>
      hand[] =
          {
              {1.f, 0x38},           {-1.f, 0xb8},      {448.f, 0x7e}, {464.f, 0x7e},
              {1e30f, 0x7e},         {-INFINITY, 0xfe}, {0.f, 0x00},   {-0.f, 0x80},
              {0.001953125f, 0x01},   // 2^-9, the smallest subnormal
              {0.0009765625f, 0x00},  // 2^-10: a tie, to the even 0
              {0.0029296875f, 0x02},  // 1.5 x 2^-9: a tie, to the even 2
              {0.015625f, 0x08},      // 2^-6, the smallest normal
              {1.0625f, 0x38},        // 1 + 1/16: a tie, to the even 1
              {1.1875f, 0x3a},        // 1 + 3/16: a tie, to the even 1 + 2/8
              {15.5f, 0x58},          // a tie that carries into the exponent: 16 = 2^(11 - 7)
          };
  std::vector<float> w;
  std::vector<uint8_t> want;
  for (const auto& [v, c] : hand) {
    w.push_back(v);
    want.push_back(c);
  }
  w.push_back(NAN);
  want.push_back(0x7f);
  auto add = [&](uint32_t bits) {
    w.push_back(dt::bits_f32(bits));
    want.push_back(dt::f32_to_e4m3(dt::bits_f32(bits)));
  };
  for (uint64_t b = 0; b < (1ull << 32); b += 4099) add(static_cast<uint32_t>(b));
  for (int c = 0; c < 0x7f; ++c) {  // (0x7e: its midpoint with NaN is NaN, skipped)
    const float v = dt::e4m3_to_f32(static_cast<uint8_t>(c));
    const float mid = (v + dt::e4m3_to_f32(static_cast<uint8_t>(c + 1))) / 2.f;  // exact
    for (float a : {v, mid})
      for (uint32_t sign : {0u, 0x80000000u})
        for (int d = -256; d <= 256; ++d) {
          const int64_t bits = static_cast<int64_t>(dt::f32_bits(a)) + d;
          if (bits >= 0 && bits < 0x7f800000) add(static_cast<uint32_t>(bits) | sign);
        }
  }
  for (bool scalar : {true, false}) {
    force_scalar_kernels(scalar);
    std::vector<uint8_t> got(w.size());
    e4m3_codes(w.data(), static_cast<int64_t>(w.size()), 1.f, got.data());
    int bad = 0;
    for (size_t i = 0; i < w.size() && bad < 5; ++i)
      if (got[i] != want[i]) {
        ++bad;
        ADD_FAILURE() << (scalar ? "scalar" : "vector") << " 0x" << std::hex << dt::f32_bits(w[i])
                      << ": got 0x" << int(got[i]) << ", want 0x" << int(want[i]);
      }
  }
  force_scalar_kernels(false);
  for (const auto& [v, c] : hand) EXPECT_EQ(dt::f32_to_e4m3(v), c) << v;
}

// Rows through f16 / bf16 (the rotation's and backward's loads and stores; AVX2 + F16C or
// scalar) give dt's conversions bit for bit: every f16 pattern in, ~1.1 M f32 patterns out (a
// stride through all 2^32, +-64 ulp around every f16 value's and bf16 rounding boundary of
// the f16 range, the f16 overflow and subnormal edges), NaN -> 0x7fff.
TEST(LinearSimd, RowConversionsMatchDtype) {
  using namespace cpu::convrot;
  std::vector<uint16_t> h(65536 + 5);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> x;
  auto add = [&](int64_t bits) {
    if (bits >= 0 && bits <= 0xffffffffll) x.push_back(dt::bits_f32(static_cast<uint32_t>(bits)));
  };
  for (uint64_t b = 0; b < (1ull << 32); b += 4111) add(static_cast<int64_t>(b));
  for (int c = 0; c < 0x7c00; c += 7) {  // f16 values and the midpoints above them
    const uint32_t v = dt::f32_bits(dt::f16_to_f32(static_cast<uint16_t>(c)));
    const uint32_t mid = dt::f32_bits(
        (dt::f16_to_f32(static_cast<uint16_t>(c)) + dt::f16_to_f32(static_cast<uint16_t>(c + 1))) /
        2.f);
    for (uint32_t a : {v, mid})
      for (int64_t sign : {0ll, 0x80000000ll})
        for (int d = -64; d <= 64; ++d) add((static_cast<int64_t>(a) + d) | sign);
  }
  for (int64_t edge : {0x477ff000ll, 0x38800000ll, 0x33000000ll, 0x7f800000ll, 0x7fc00000ll})
    for (int d = -64; d <= 64; ++d) add(edge + d);
  for (bool scalar : {true, false}) {
    force_scalar_kernels(scalar);
    const char* which = scalar ? "scalar" : "vector";
    std::vector<float> f(h.size());
    cpu::rows::load(h.data(), 0, DType::f16, static_cast<int64_t>(h.size()), f.data());
    for (size_t i = 0; i < h.size(); ++i)
      ASSERT_EQ(dt::f32_bits(f[i]), dt::f32_bits(dt::f16_to_f32(h[i])))
          << which << " f16 0x" << std::hex << h[i];
    std::vector<uint16_t> o16(x.size()), ob16(x.size());
    cpu::rows::store(x.data(), static_cast<int64_t>(x.size()), DType::f16, o16.data(), 0);
    cpu::rows::store(x.data(), static_cast<int64_t>(x.size()), DType::bf16, ob16.data(), 0);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(o16[i], dt::f32_to_f16(x[i]))
          << which << " f32 0x" << std::hex << dt::f32_bits(x[i]);
      ASSERT_EQ(ob16[i], dt::f32_to_bf16(x[i]))
          << which << " f32 0x" << std::hex << dt::f32_bits(x[i]);
    }
  }
  force_scalar_kernels(false);
  // hand-checked codes
  const float v[] = {
      1.f, -2.5f, 65504.f, 65520.f, 5.9604644775390625e-08f, 2.98023223876953125e-08f, NAN};
  const uint16_t f16[] = {0x3c00, 0xc100, 0x7bff, 0x7c00, 0x0001, 0x0000, 0x7fff};
  const uint16_t bf16[] = {0x3f80, 0xc020, 0x4780, 0x4780, 0x3380, 0x3300, 0x7fff};
  std::vector<uint16_t> a(std::size(v)), b(std::size(v));
  cpu::rows::store(v, std::size(v), DType::f16, a.data(), 0);
  cpu::rows::store(v, std::size(v), DType::bf16, b.data(), 0);
  for (size_t i = 0; i < std::size(v); ++i) {
    EXPECT_EQ(a[i], f16[i]) << v[i];
    EXPECT_EQ(b[i], bf16[i]) << v[i];
  }
}

// The CPU forward's integer GEMMs (the decode GEMV on AVX-512 VBMI, AMX tiles, AVX-512 VNNI,
// AVX2 blocks; partial blocks, K not a multiple of 64, groups of 16 / 32 / 64 / 128 included)
// give the scalar dots' bits, for the qtypes whose products are int8 codes; the fp8 and NVFP4
// GEMMs those of their exact scalar dots.
TEST(LinearSimd, BlockedGemmMatchesScalarDots) {
  if (!cpu::convrot::simd_kernels_available()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  Context ctx;
  int ran = 0;
  for (QType q :
       {QType::convrot8, QType::convrot_int4, QType::convrot_int3, QType::convrot_comfy_w4a4,
        QType::convrot_bitnet, QType::convrot_fp8, QType::convrot4, QType::convrot_int2,
        QType::convrot_int6, QType::convrot_int5, QType::convrot_int7, QType::convrot_int8}) {
    for (auto [M, O_any, K] : {std::array<int64_t, 3>{1, 8, 256},
                               {2, 24, 512},
                               {3, 40, 768},
                               {17, 8, 1280},
                               {5, 56, 2304},
                               {45, 72, 1024},
                               {27, 40, 512},
                               {9, 40, 320},      // groups of 64 (K % 128 = 64)
                               {13, 24, 352},     // groups of 32, K % 64 = 32
                               {4, 16, 336},      // groups of 16 (no GEMV for 4-bit rows)
                               {17, 24, 1280},    // the 4-bit GEMV's largest row counts
                               {65, 16, 256}}) {  // NVFP4's tiles; a last block of one row
      // (NVFP4 layers have out_features a multiple of 16; comfy W4A4 takes K % 256 == 0.)
      const int64_t O = q == QType::convrot4 ? (O_any + 15) / 16 * 16 : O_any;
      if (!can_quantize(q, O, K, nullptr)) continue;
      ctx.cpu_threads = static_cast<int>(M % 3) + 1;  // thread chunks of odd row counts
      std::vector<float> w(static_cast<size_t>(O * K)), x(static_cast<size_t>(M * K)), bias(O);
      for (auto& v : w) v = nd(rng) * 0.05f;
      for (auto& v : x) v = nd(rng);
      for (auto& v : bias) v = nd(rng);
      QuantizedLinear lin;
      try {
        lin = QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
        continue;
      }
      TensorView bv = make_view(bias.data(), DType::f32, {O});
      // The widest kernels (the decode GEMVs where the CPU has AVX-512 VBMI: convrot8 below 12
      // rows, 4-bit rows below 18, NVFP4 below 64; AMX tiles where the CPU has them: the other
      // int8 codes from 10 rows, fp8 from 10, NVFP4 from 64; AVX-512 VNNI below for int8 codes
      // and fp8), AVX2 alone, the scalar loops, the vector kernels without AMX, without the
      // GEMVs, the GEMV on tables built per call (the weight view without QuantizedLinear's
      // derived tables), the blocked VNNI GEMM at every row count (int8 codes, AVX-512 VNNI:
      // without AMX it runs from 16 rows by default), and AVX2 alone (its GEMVs: convrot8, the
      // 4-, 3-, 2-bit and ternary rows, fp8) on tables built per call, and without its GEMV.
      constexpr int kModes = 9;
      std::vector<float> y[kModes];
      for (int mode = 0; mode < kModes; ++mode) {
        cpu::convrot::force_avx2_kernels(mode == 1 || mode == 7 || mode == 8);
        cpu::convrot::force_scalar_kernels(mode == 2);
        cpu::amx::force_off(mode == 3);
        cpu::convrot::force_gemv_off(mode == 4 || mode == 8);
        cpu::vnni::force(mode == 6);
        y[mode].assign(static_cast<size_t>(M * O), -1.f);
        TensorView xv = make_view(x.data(), DType::f32, {M, K});
        TensorView yv = make_view(y[mode].data(), DType::f32, {M, O});
        if (mode == 5 || mode == 7) {
          PackedWeightView v = lin.weights();
          v.decode_tiles = TensorView{};
          cpu::quantized_linear_forward(v, xv, &bv, yv, ctx);
        } else {
          lin.forward(xv, &bv, yv, ctx);
        }
      }
      cpu::convrot::force_avx2_kernels(false);
      cpu::convrot::force_scalar_kernels(false);
      cpu::amx::force_off(false);
      cpu::convrot::force_gemv_off(false);
      cpu::vnni::force(false);
      // The derived tables exist exactly where the GEMV can take them (4-bit rows with groups a
      // multiple of 32, 2-, 3- and 5-bit rows with groups a multiple of 64).
      const bool bit_tables =
          (q == QType::convrot_int2 || q == QType::convrot_int3 || q == QType::convrot_int5) &&
          K % 64 == 0;
      EXPECT_EQ(lin.weights().decode_tiles.data != nullptr,
                ((q == QType::convrot_int4 && K % 128 != 16 && K % 32 == 0) || bit_tables) &&
                    cpu::convrot::gemv_tables_bytes(lin.weights()) > 0)
          << qtype_name(q) << " K " << K;
      const char* names[kModes] = {
          "widest",           "AVX2",         "scalar",           "no AMX",       "no GEMV",
          "GEMV, own tables", "blocked VNNI", "AVX2, own tables", "AVX2, no GEMV"};
      for (int mode : {0, 1, 3, 4, 5, 6, 7, 8})
        EXPECT_EQ(std::memcmp(y[mode].data(), y[2].data(), y[2].size() * 4), 0)
            << qtype_name(q) << " M " << M << " O " << O << " K " << K << " (" << names[mode]
            << ")";
      ++ran;
    }
  }
  EXPECT_EQ(ran, 141);  // 12 shapes x 12 qtypes, less comfy's 3 with K % 256 != 0
}

// The decode GEMV's dots (gemv_dots, its AVX2 form forced and the widest) are the exact integer
// dots of the rows' GEMM codes with the activation codes, on codes no quantizer writes: every
// nibble, convrot8 codes -128 and ±127 against activations ±127 (the AVX2 form's int16 pair sums
// at their largest), convrotint8 bytes of every value (255: code -128), ternary bytes of every
// value (243..255 included), 2- and 3-bit fields of every value (the codes qmax + 1 included),
// group ratios that tie, clamp, are negative, infinite or NaN, with the fold tables built per call;
// K ending on half a 32-byte step, ternary rows ending inside a block.
TEST(LinearSimd, GemvDotsExactOnExtremeCodes) {
  if (!simd_kernels_available()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(33);
  Context ctx;
  const float odd_ratios[] = {0.f,  -0.f,  1.f,     -1.f,      0.5f,       1.5f,
                              2.5f, -2.5f, 300.f,   -300.f,    1e-30f,     INFINITY,
                              NAN,  18.f,  15.875f, 127.f / 8, 1.0079365f, 0.75f};
  int checked = 0;
  for (auto [q, K] : {std::pair<QType, int64_t>{QType::convrot8, 336},
                      {QType::convrot8, 1024},
                      {QType::convrot_int8, 336},  // every byte: 255 reads as code -128
                      {QType::convrot_int8, 1024},
                      {QType::convrot_int4, 352},   // groups of 32, K % 64 = 32
                      {QType::convrot_int4, 320},   // groups of 64
                      {QType::convrot_int4, 1536},  // groups of 128
                      {QType::convrot_comfy_w4a4, 512},
                      {QType::convrot_bitnet, 960},    // groups of 64, whole 32-byte blocks
                      {QType::convrot_bitnet, 1088},   // groups of 64, a last partial block
                      {QType::convrot_bitnet, 1536},   // groups of 128
                      {QType::convrot_int2, 320},      // groups of 64, half a 32-byte step last
                      {QType::convrot_int2, 1536},     // groups of 128
                      {QType::convrot_int3, 320},      // groups of 64, the last step's bytes short
                      {QType::convrot_int3, 1536}}) {  // groups of 128
    const int64_t O = 16;
    std::vector<float> w(static_cast<size_t>(O * K), 1.f);
    QuantizedLinear lin =
        QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
    PackedWeightView pw = lin.weights();
    pw.decode_tiles = TensorView{};  // tables built per call
    uint8_t* bytes = static_cast<uint8_t*>(pw.codes.data);
    for (int64_t i = 0; i < pw.codes.numel(); ++i) {
      const uint64_t r = rng();
      bytes[i] = static_cast<uint8_t>(r % 4 == 0 ? (r % 8 == 0 ? 0x80 : 0x81) : r >> 8);
    }
    if (pw.ratios.data != nullptr) {
      float* ratios = static_cast<float*>(pw.ratios.data);
      for (int64_t i = 0; i < pw.ratios.numel(); ++i)
        ratios[i] = rng() % 3 == 0 ? std::uniform_real_distribution<float>(-9.f, 9.f)(rng)
                                   : odd_ratios[rng() % std::size(odd_ratios)];
    }
    for (int64_t M : {1, 2, 3}) {
      std::vector<int8_t> act(static_cast<size_t>(M * K));
      for (auto& a : act) {
        const uint64_t r = rng();
        a = static_cast<int8_t>(r % 3 == 0 ? (r % 2 ? 127 : -127)
                                           : static_cast<int>(r % 255) - 127);
      }
      // The exact dots of the scalar GEMM codes.
      std::vector<int64_t> want(static_cast<size_t>(M * O));
      std::vector<int8_t> codes(static_cast<size_t>(K));
      force_scalar_kernels(true);
      for (int64_t o = 0; o < O; ++o) {
        weight_row_gemm_codes(pw, o, codes.data());
        for (int64_t m = 0; m < M; ++m) {
          int64_t d = 0;
          for (int64_t k = 0; k < K; ++k) d += int64_t{codes[k]} * act[m * K + k];
          want[m * O + o] = d;
        }
      }
      force_scalar_kernels(false);
      for (bool avx2 : {true, false}) {
        force_avx2_kernels(avx2);
        if (!gemv_supported(pw)) {  // (the widest form needs AVX-512 VBMI)
          force_avx2_kernels(false);
          continue;
        }
        if (avx2) EXPECT_TRUE(gemv_avx2(pw)) << qtype_name(q);  // (widest: AVX2 without VBMI)
        std::vector<int8_t> packed(static_cast<size_t>(M * gemv_row_bytes(pw)));
        std::vector<int32_t> sums(static_cast<size_t>(M)), dots(static_cast<size_t>(M * O));
        gemv_pack_activations(pw, act.data(), M, packed.data(), sums.data());
        gemv_dots(pw, packed.data(), sums.data(), M, 1, O, dots.data());  // an odd row count
        force_avx2_kernels(false);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t o = 1; o < O; ++o) {
            ASSERT_EQ(dots[m * (O - 1) + o - 1], want[m * O + o])
                << qtype_name(q) << " K " << K << " M " << M << " row " << m << " col " << o
                << (avx2 ? " (AVX2)" : " (widest)");
            ++checked;
          }
      }
    }
  }
  EXPECT_GE(checked, 15 * 6 * 15);  // every (qtype, K), M 1..3, on the AVX2 form at least
}

// The fp8 forward on every e4m3 weight code (NaN codes read as 0, subnormals, ±448), against
// activations of every magnitude: the widest kernels, AVX2 alone (below 12 rows the fp8 GEMV on
// the stored codes, vcvtph2ps decoding) and the blocked fp64 GEMM give the scalar exact dots'
// bits.
TEST(LinearSimd, Fp8ForwardMatchesScalarOnEveryCode) {
  if (!simd_kernels_available()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(41);
  Context ctx;
  for (int64_t K : {16, 1040, 4096}) {
    const int64_t O = 16;
    std::vector<float> w(static_cast<size_t>(O * K));
    for (auto& v : w) v = std::normal_distribution<float>(0.f, 1.f)(rng);
    QuantizedLinear lin =
        QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), QType::convrot_fp8, ctx);
    uint8_t* codes = static_cast<uint8_t*>(lin.weights().codes.data);
    for (int64_t i = 0; i < O * K; ++i) codes[i] = static_cast<uint8_t>((i * 37 + i / 256) % 256);
    for (int64_t M : {1, 3, 14}) {
      std::vector<float> x(static_cast<size_t>(M * K));
      for (auto& v : x)
        v = std::normal_distribution<float>(0.f, 1.f)(rng) *
            std::ldexp(1.f, static_cast<int>(rng() % 24) - 12);
      std::vector<float> y[3];
      for (int mode = 0; mode < 3; ++mode) {
        force_avx2_kernels(mode == 1);
        force_scalar_kernels(mode == 2);
        y[mode].assign(static_cast<size_t>(M * O), -1.f);
        lin.forward(make_view(x.data(), DType::f32, {M, K}), nullptr,
                    make_view(y[mode].data(), DType::f32, {M, O}), ctx);
      }
      force_avx2_kernels(false);
      force_scalar_kernels(false);
      for (int mode : {0, 1})
        EXPECT_EQ(std::memcmp(y[mode].data(), y[2].data(), y[2].size() * 4), 0)
            << "K " << K << " M " << M << (mode ? " (AVX2)" : " (widest)");
    }
  }
}

// A stored row's GEMM codes (weight_row_gemm_codes: the unpack and the group fold in one step on
// AVX-512 VBMI for 2..7 bits and ternary, on AVX2 for 2, 3, 5, 6 and 7 bits by |code| tables,
// lookups for 4 bits and comfy) equal the scalar unpack + fold_code for every n-bit width,
// ternary and comfy, groups of 16 to 128, on the widest kernels and on AVX2 alone. Then every
// byte random (ternary: 243..255 are no five-digit code, both paths take their base-3 digits;
// n-bit: the field 2^n - 1 is code qmax + 1) with ratios at the fold's edges (NaN, inf, ties,
// signs, past the clamp).
TEST(LinearSimd, RowGemmCodesMatchScalar) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  const float odd_ratios[] = {0.f,       -0.f,  1.f,   -1.f,   0.5f,       1.5f,
                              2.5f,      -2.5f, 300.f, -300.f, 1e-30f,     INFINITY,
                              -INFINITY, NAN,   18.f,  0.75f,  4.2333333f, 1.0079365f};
  Context ctx;
  for (QType q : {QType::convrot_int2, QType::convrot_int3, QType::convrot_int4,
                  QType::convrot_int5, QType::convrot_int6, QType::convrot_int7,
                  QType::convrot_int8, QType::convrot_bitnet, QType::convrot_comfy_w4a4})
    for (int64_t K : {256, 320, 352, 1536, 3072}) {  // groups of 128, 64, 32, 128 and 128
      const int64_t O = 24;
      if (!can_quantize(q, O, K, nullptr)) continue;
      std::vector<float> w(static_cast<size_t>(O * K));
      for (auto& v : w) v = nd(rng) * (1.f + 3.f * static_cast<float>(rng() % 4 == 0));
      QuantizedLinear lin =
          QuantizedLinear::quantize(make_view(w.data(), DType::f32, {O, K}), q, ctx);
      const PackedWeightView pw = lin.weights();
      std::vector<int8_t> fast(static_cast<size_t>(K)), slow(static_cast<size_t>(K));
      for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) {  // every byte random, edge ratios
          if (q == QType::convrot_comfy_w4a4) break;
          uint8_t* bytes = static_cast<uint8_t*>(pw.codes.data);
          for (int64_t i = 0; i < pw.codes.numel(); ++i) bytes[i] = static_cast<uint8_t>(rng());
          float* ratios = static_cast<float*>(pw.ratios.data);  // (none for convrotint8)
          for (int64_t i = 0; ratios != nullptr && i < pw.ratios.numel(); ++i)
            ratios[i] = rng() % 3 == 0 ? std::uniform_real_distribution<float>(-9.f, 9.f)(rng)
                                       : odd_ratios[rng() % std::size(odd_ratios)];
        }
        for (int64_t o = 0; o < O; ++o) {
          force_scalar_kernels(true);
          weight_row_gemm_codes(pw, o, slow.data());
          force_scalar_kernels(false);
          for (bool avx2 : {false, true}) {
            force_avx2_kernels(avx2);
            std::fill(fast.begin(), fast.end(), int8_t{99});
            weight_row_gemm_codes(pw, o, fast.data());
            force_avx2_kernels(false);
            ASSERT_EQ(fast, slow) << qtype_name(q) << " K " << K << " row " << o
                                  << (pass ? " (random bytes)" : "") << (avx2 ? " (AVX2)" : "");
          }
        }
      }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// bits::fold_tables' two tables as bytes (t: 128).
LOWBIT_BITS_VBMI void fold_tables_bytes(int nbits, float ratio, uint8_t bias, uint8_t* t) {
  __m512i t0, t1;
  bits::fold_tables(nbits, bits::fold_index(nbits), ratio, bias, t0, t1);
  _mm512_storeu_si512(t, t0);
  _mm512_storeu_si512(t + 64, t1);
}
#endif

// The vector fold tables (the bit-packed GEMV's and unpack's: only codes 0..qmax + 1 computed,
// negated by symmetry, the clamp skipped where |ratio| 2^(n-1) <= 127) equal fold_code entry by
// entry, repeated every 2^n entries below 64: ties (ratios k + 1/2 over a code), ratios that
// clamp, negative, tiny, huge, infinite and NaN ratios, every width.
TEST(LinearSimd, FoldTablesMatchFoldCode) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!__builtin_cpu_supports("avx512vbmi") || !__builtin_cpu_supports("avx512bw"))
    GTEST_SKIP() << "no AVX-512 VBMI on this CPU";
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<float> ud(-3.f, 3.f);
  std::vector<float> ratios = {0.f,      -0.f,     1.f,       -1.f,  0.5f,       1.5f,
                               2.5f,     -2.5f,    0.25f,     0.75f, 127.f / 63, 127.f / 31,
                               2.01587f, 4.1f,     -4.1f,     300.f, 1e-30f,     3e38f,
                               -3e38f,   INFINITY, -INFINITY, NAN,   1.9843750f, 1.0079365f};
  for (int c = 1; c <= 64; ++c)  // c r = k + 1/2 exactly for some k: a tie at code c
    for (int k : {0, 1, 2, 5, 30, 62, 126}) ratios.push_back((static_cast<float>(k) + 0.5f) / c);
  for (int i = 0; i < 200; ++i) ratios.push_back(ud(rng));
  int checked = 0;
  // The ternary GEMV's three-entry tables rest on fold_code(0, r) = 0 and fold_code(-1, r) =
  // -fold_code(1, r) for every ratio.
  for (float r : ratios) {
    EXPECT_EQ(fold_code(0, r), 0) << r;
    EXPECT_EQ(fold_code(-1, r), -fold_code(1, r)) << r;
  }
  for (int nbits = 2; nbits <= 7; ++nbits) {
    const int entries = 1 << nbits, qmax = entries / 2 - 1;
    for (float r : ratios)
      for (uint8_t bias : {uint8_t{0}, uint8_t{128}}) {
        alignas(64) uint8_t t[128];
        fold_tables_bytes(nbits, r, bias, t);
        for (int u = 0; u < (nbits == 7 ? 128 : 64); ++u) {
          const uint8_t want =
              static_cast<uint8_t>(static_cast<uint8_t>(fold_code(u % entries - qmax, r)) + bias);
          ASSERT_EQ(t[u], want) << "bits " << nbits << " ratio " << r << " entry " << u;
          ++checked;
        }
      }
  }
  EXPECT_GT(checked, 100000);
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// The blocked VNNI GEMM's pieces on full-range codes: the panel layout and 128 x the row sums
// against a hand-written transpose, and the dots against int64 sums, K up to the largest it
// takes (2^17 - 4: |a . w| <= K 128^2 < 2^31), partial panels, every row remainder.
TEST(LinearSimd, VnniBlockedGemmGivesExactDots) {
  if (!cpu::vnni::available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937_64 rng(11);
  for (auto [M, n, K] : {std::array<int64_t, 3>{1, 48, 4},
                         {3, 17, 60},
                         {9, 33, 1028},
                         {6, 48, 3072},
                         {5, 1, 64},
                         {2, 16, 131068}}) {
    std::vector<int8_t> w(static_cast<size_t>(cpu::vnni::kPanel * K));
    std::vector<int8_t> a(static_cast<size_t>(M * K));
    for (auto& v : w) v = static_cast<int8_t>(rng());
    for (auto& v : a) v = static_cast<int8_t>(rng());
    if (K == 131068) {  // the extreme dot: -128 x -128 everywhere in row 0 and column 0
      std::fill(a.begin(), a.begin() + K, int8_t{-128});
      std::fill(w.begin(), w.begin() + K, int8_t{-128});
    }
    std::vector<int8_t> panel(static_cast<size_t>(cpu::vnni::panel_bytes(K)), 99);
    uint32_t sum128[cpu::vnni::kPanel];
    cpu::vnni::pack_panel(w.data(), static_cast<int>(n), K, panel.data(), sum128);
    for (int64_t j = 0; j < cpu::vnni::kPanel; ++j) {
      int64_t sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int8_t want = j < n ? w[j * K + k] : 0;
        ASSERT_EQ(panel[((k / 4) * cpu::vnni::kPanel + j) * 4 + k % 4], want)
            << "K " << K << " column " << j << " k " << k;
        sum += want;
      }
      EXPECT_EQ(sum128[j], static_cast<uint32_t>(sum) * 128u) << "K " << K << " column " << j;
    }
    std::vector<uint8_t> biased(a.size());
    for (size_t i = 0; i < a.size(); ++i) biased[i] = static_cast<uint8_t>(a[i] + 128);
    std::vector<int32_t> dots(static_cast<size_t>(M * cpu::vnni::kPanel), -7);
    cpu::vnni::gemm_panel(biased.data(), K, M, panel.data(), sum128, K, dots.data());
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < cpu::vnni::kPanel; ++j) {
        int64_t want = 0;
        for (int64_t k = 0; j < n && k < K; ++k) want += int64_t{a[i * K + k]} * w[j * K + k];
        ASSERT_EQ(dots[i * cpu::vnni::kPanel + j], want)
            << "K " << K << " row " << i << " col " << j;
      }
  }
}

}  // namespace
}  // namespace lowbit
