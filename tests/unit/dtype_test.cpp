// Bit-exact dtype conversions: hand-computed vectors, exhaustive round trips, and independent
// oracles (the compiler's _Float16, a brute-force nearest-value search over every fp8 code).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <iterator>
#include <random>
#include <vector>

#include "lowbit/core.h"
#include "lowbit/dtype.h"
#include "src/core/convert_elem.h"
#include "src/cpu/linear_kernels.h"
#include "src/cpu/rows.h"

using namespace lowbit;
using namespace lowbit::dt;

namespace {
float pow2(int e) { return std::ldexp(1.f, e); }
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST(Dtype, Bf16HandVectors) {
  EXPECT_EQ(f32_to_bf16(1.f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.f + pow2(-8)), 0x3F80);      // tie -> even
  EXPECT_EQ(f32_to_bf16(1.f + 3 * pow2(-8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.f + pow2(-8) + pow2(-20)), 0x3F81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(kNaN), 0x7FFF);                         // canonical NaN
  EXPECT_EQ(f32_to_bf16(bits_f32(0x7F800001u)), 0x7FFF);
  EXPECT_EQ(f32_to_bf16(bits_f32(0xFF800001u)), 0x7FFF);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

TEST(Dtype, F16HandVectors) {
  EXPECT_EQ(f32_to_f16(1.f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.f), 0xC000);
  EXPECT_EQ(f32_to_f16(65504.f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7C00);  // the tie above the max rounds to inf
  EXPECT_EQ(f32_to_f16(pow2(-14)), 0x0400);
  EXPECT_EQ(f32_to_f16(pow2(-24)), 0x0001);
  EXPECT_EQ(f32_to_f16(pow2(-25)), 0x0000);           // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(f32_to_f16(1.5f * pow2(-25)), 0x0001);
  EXPECT_EQ(f32_to_f16(3.f * pow2(-25)), 0x0002);     // 1.5 units: tie -> 2
  EXPECT_EQ(f32_to_f16(1.f + pow2(-11)), 0x3C00);     // tie -> even
  EXPECT_EQ(f32_to_f16(1.f + 3 * pow2(-11)), 0x3C02);
  EXPECT_EQ(f32_to_f16(-kInf), 0xFC00);
  EXPECT_EQ(f32_to_f16(kNaN), 0x7FFF);
  EXPECT_EQ(f32_to_f16(-kNaN), 0x7FFF);
  EXPECT_EQ(f16_to_f32(0x0001), pow2(-24));
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0xFC00)) && f16_to_f32(0xFC00) < 0);
}

TEST(Dtype, E4m3HandVectors) {
  EXPECT_EQ(f32_to_e4m3(1.f), 0x38);
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.f), 0x7E);  // would round to 480 (not representable): saturates
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-kInf), 0xFE);
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(pow2(-6)), 0x08);       // smallest normal
  EXPECT_EQ(f32_to_e4m3(pow2(-9)), 0x01);       // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(pow2(-10)), 0x00);      // tie with 0 -> 0
  EXPECT_EQ(f32_to_e4m3(3 * pow2(-10)), 0x02);  // tie between 1 and 2 -> 2
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);        // tie between m=0 and m=1 -> 0
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);        // tie between m=1 and m=2 -> 2
  EXPECT_EQ(f32_to_e4m3(240.f), 0x77);
  EXPECT_EQ(f32_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.f);
  EXPECT_EQ(e4m3_to_f32(0x01), pow2(-9));
  EXPECT_EQ(e4m3_to_f32(0xB8), -1.f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)) && std::isnan(e4m3_to_f32(0xFF)));
}

TEST(Dtype, E5m2HandVectors) {
  EXPECT_EQ(f32_to_e5m2(1.f), 0x3C);
  EXPECT_EQ(f32_to_e5m2(57344.f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(kInf), 0x7B);  // satfinite
  EXPECT_EQ(f32_to_e5m2(1.125f), 0x3C);  // tie between 1 and 1.25 -> even (1)
  EXPECT_EQ(f32_to_e5m2(1.375f), 0x3E);  // tie between 1.25 and 1.5 -> 1.5
  EXPECT_EQ(f32_to_e5m2(pow2(-16)), 0x01);
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.f);
}

TEST(Dtype, E2m1BoundaryRule) {
  // SPEC §3.4: index = number of boundaries strictly below |x|; midpoints go to the lower code.
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.2501f), 1);
  EXPECT_EQ(f32_to_e2m1(0.75f), 1);
  EXPECT_EQ(f32_to_e2m1(0.76f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 3);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 5);
  EXPECT_EQ(f32_to_e2m1(5.f), 6);
  EXPECT_EQ(f32_to_e2m1(5.01f), 7);
  EXPECT_EQ(f32_to_e2m1(100.f), 7);
  EXPECT_EQ(f32_to_e2m1(-1.5f), 0xB);
  EXPECT_EQ(f32_to_e2m1(-6.f), 0xF);
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), (c & 8 ? -1 : 1) * mags[c & 7]);
}

TEST(Dtype, IntegersRoundHalfEvenAndClamp) {
  EXPECT_EQ(f32_to_i8(2.5f), 2);
  EXPECT_EQ(f32_to_i8(3.5f), 4);
  EXPECT_EQ(f32_to_i8(-2.5f), -2);
  EXPECT_EQ(f32_to_i8(-0.5f), 0);
  EXPECT_EQ(f32_to_i8(200.f), 127);
  EXPECT_EQ(f32_to_i8(-200.f), -128);
  EXPECT_EQ(f32_to_i8(kNaN), 0);
  EXPECT_EQ(f32_to_i8(kInf), 127);
  EXPECT_EQ(i4_code_to_int(f32_to_i4_code(-7.5f)), -8);
  EXPECT_EQ(i4_code_to_int(f32_to_i4_code(6.5f)), 6);
  EXPECT_EQ(i4_code_to_int(f32_to_i4_code(9.f)), 7);
  EXPECT_EQ(f32_to_i4_code(-1.f), 0xF);
}

TEST(Dtype, ExhaustiveRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_e4m3(v), c) << "e4m3 code " << c;
    float w = e5m2_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(w) || std::isinf(w)) continue;
    EXPECT_EQ(f32_to_e5m2(w), c) << "e5m2 code " << c;
  }
  for (uint32_t c = 0; c < 65536; ++c) {
    uint16_t h = static_cast<uint16_t>(c);
    float v = f16_to_f32(h);
    if (!std::isnan(v)) ASSERT_EQ(f32_to_f16(v), h) << "f16 code " << c;
    float b = bf16_to_f32(h);
    if (!std::isnan(b)) ASSERT_EQ(f32_to_bf16(b), h) << "bf16 code " << c;
  }
}

TEST(Dtype, F16MatchesCompilerFloat16) {
// (GCC before 13 has _Float16 in C++ on x86 only, though it defines __FLT16_MAX__ elsewhere)
#if defined(__FLT16_MAX__) && \
    (defined(__x86_64__) || defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 13))
  std::mt19937 rng(1234);
  for (int i = 0; i < 2000000; ++i) {
    float f = bits_f32(rng());
    if (std::isnan(f)) {
      ASSERT_EQ(f32_to_f16(f), 0x7FFF);
      continue;
    }
    _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(f32_to_f16(f), hb) << "f = " << f << " bits 0x" << std::hex << f32_bits(f);
  }
#else
  GTEST_SKIP() << "compiler has no _Float16";
#endif
}

// Nearest e4m3 / e5m2 value by brute force over every finite code, ties to the even code.
static uint8_t nearest_fp8(float x, bool e4m3) {
  uint8_t best = 0;
  double best_d = INFINITY;
  for (int c = 0; c < 128; ++c) {
    float v = e4m3 ? e4m3_to_f32(static_cast<uint8_t>(c)) : e5m2_to_f32(static_cast<uint8_t>(c));
    if (!std::isfinite(v)) continue;
    double d = std::fabs(std::fabs(static_cast<double>(x)) - v);
    if (d < best_d || (d == best_d && (c & 1) == 0)) best_d = d, best = static_cast<uint8_t>(c);
  }
  return static_cast<uint8_t>(best | (x < 0 ? 0x80 : 0));
}

TEST(Dtype, Fp8MatchesBruteForceNearest) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> e(-22, 17);
  std::uniform_real_distribution<float> m(-2.f, 2.f);
  for (int i = 0; i < 100000; ++i) {
    float x = m(rng) * pow2(e(rng));
    if (std::fabs(x) <= 448.f) ASSERT_EQ(f32_to_e4m3(x), nearest_fp8(x, true)) << x;
    ASSERT_EQ(f32_to_e5m2(x), nearest_fp8(x, false)) << x;
  }
}

TEST(Convert, ErrorsNameTheArgumentAndWriteNothing) {
  float src[6] = {1, 2, 3, 4, 5, 6};
  uint16_t dst[6] = {7, 7, 7, 7, 7, 7};
  Context ctx;
  TensorView s = make_view(src, DType::f32, {2, 3});
  TensorView d = make_view(dst, DType::bf16, {3, 2});
  try {
    convert(s, d, ctx);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.op(), "convert");
    EXPECT_STREQ(e.argument(), "dst");
    EXPECT_NE(std::string(e.what()).find("(2, 3)"), std::string::npos) << e.what();
  }
  for (uint16_t v : dst) EXPECT_EQ(v, 7);
  TensorView bad = make_view(dst, DType::i32, {2, 3});
  EXPECT_THROW(convert(s, bad, ctx), Error);
  TensorView odd = make_view(dst, DType::i4x2, {1, 3});
  EXPECT_THROW(convert(make_view(src, DType::f32, {1, 3}), odd, ctx), Error);
  for (uint16_t v : dst) EXPECT_EQ(v, 7);
  int64_t shape7[7] = {1, 1, 1, 1, 1, 1, 1};
  EXPECT_THROW(make_view(src, DType::f32, 7, shape7), Error);
}

TEST(Convert, StridedAndPackedMatchScalarRules) {
  float src[8] = {0.3f, -1.2f, 2.5f, -3.5f, 5.5f, -0.1f, 7.9f, -9.f};
  uint8_t packed[4];
  Context ctx;
  convert(make_view(src, DType::f32, {8}), make_view(packed, DType::e2m1x2, {8}), ctx);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(get_nibble(packed, i), f32_to_e2m1(src[i])) << i;
  // Transposed view (2, 4) -> column-major read.
  uint16_t out[8];
  TensorView t = make_view(src, DType::f32, {4, 2});
  std::swap(t.shape[0], t.shape[1]);
  std::swap(t.stride[0], t.stride[1]);
  convert(t, make_view(out, DType::bf16, {2, 4}), ctx);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out[r * 4 + c], f32_to_bf16(src[c * 2 + r]));
}

// The row path of the CPU convert (rows with a unit innermost stride on both sides, in chunks of
// 2048 through f32 with the F16C / AVX2 row kernels) against the element rules, every pair of
// non-packed dtypes: special values (NaN with payloads, infinities, signed zeros, subnormals,
// values past each format's range, ties) and random bit patterns, a flat tensor longer than two
// chunks and rows of a padded (3, 2500) view; i8 with f32 only (the op's pairs).
TEST(Convert, RowPathMatchesElementRules) {
  const DType types[] = {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::i8};
  auto width = [](DType t) { return t == DType::f32 ? 4 : (t == DType::f16 || t == DType::bf16) ? 2 : 1; };
  auto decode = [](DType t, const uint8_t* p) -> float {
    switch (t) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
      case DType::f16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
      case DType::bf16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
      case DType::e4m3: return e4m3_to_f32(*p);
      case DType::e5m2: return e5m2_to_f32(*p);
      default: return static_cast<float>(static_cast<int8_t>(*p));
    }
  };
  auto encode = [](DType t, float v, uint8_t* p) {
    switch (t) {
      case DType::f32: std::memcpy(p, &v, 4); break;
      case DType::f16: { uint16_t h = f32_to_f16(v); std::memcpy(p, &h, 2); break; }
      case DType::bf16: { uint16_t h = f32_to_bf16(v); std::memcpy(p, &h, 2); break; }
      case DType::e4m3: *p = f32_to_e4m3(v); break;
      case DType::e5m2: *p = f32_to_e5m2(v); break;
      default: *p = static_cast<uint8_t>(f32_to_i8(v)); break;
    }
  };
  const float specials[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, -NAN, 1.f, -1.5f, 448.f, 464.f,
                            480.f, 57344.f, 65504.f, 65520.f, 1e30f, -1e30f, 1e-30f, 127.5f,
                            -128.5f, 0.0009765625f, 0.0029296875f, 6e-8f, 1.0625f, 15.5f};
  std::mt19937 rng(2029);
  Context ctx;
  const int64_t n = 5003, rows = 3, cols = 2500, pitch = 2600;
  for (DType st : types) {
    const int sw = width(st);
    std::vector<uint8_t> src(static_cast<size_t>(rows * pitch) * sw);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < std::size(specials); ++i)  // the specials at the front, in st's bits
      encode(st, specials[i], &src[i * sw]);
    if (st == DType::f32) {  // NaNs with payloads and signaling NaNs
      const uint32_t nans[] = {0x7fc00001u, 0xffc12345u, 0x7f800001u, 0xff812345u};
      for (int i = 0; i < 4; ++i) std::memcpy(&src[(std::size(specials) + i) * 4], &nans[i], 4);
    }
    for (DType dt_ : types) {
      if ((st == DType::i8 || dt_ == DType::i8) && st != DType::f32 && dt_ != DType::f32)
        continue;  // (i8 converts to and from f32 only)
      const int dw = width(dt_);
      for (int mode : {0, 1, 2}) {  // the widest row kernels (AVX-512 / F16C), scalar, AVX2
        const bool scalar = mode == 1;
        cpu::rows::force_scalar(scalar);
        cpu::rows::force_avx2(mode == 2);
        cpu::convrot::force_scalar_kernels(scalar);
        // flat
        std::vector<uint8_t> out(static_cast<size_t>(n) * dw, 0xcd);
        convert(make_view(src.data(), st, {n}), make_view(out.data(), dt_, {n}), ctx);
        for (int64_t i = 0; i < n; ++i) {
          uint8_t want[4];
          encode(dt_, decode(st, &src[i * sw]), want);
          ASSERT_EQ(std::memcmp(&out[i * dw], want, dw), 0)
              << dtype_name(st) << " -> " << dtype_name(dt_) << " element " << i << " mode "
              << mode;
        }
        // rows of a padded view into a dense (rows, cols) output
        TensorView sv = make_view(src.data(), st, {rows, pitch});
        sv.shape[1] = cols;
        std::vector<uint8_t> out2(static_cast<size_t>(rows * cols) * dw, 0xcd);
        convert(sv, make_view(out2.data(), dt_, {rows, cols}), ctx);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            uint8_t want[4];
            encode(dt_, decode(st, &src[(r * pitch + c) * sw]), want);
            ASSERT_EQ(std::memcmp(&out2[(r * cols + c) * dw], want, dw), 0)
                << dtype_name(st) << " -> " << dtype_name(dt_) << " at (" << r << ", " << c << ")";
          }
      }
      cpu::rows::force_scalar(false);
      cpu::rows::force_avx2(false);
      cpu::convrot::force_scalar_kernels(false);
    }
  }
}

// The CPU's e4m3 table (convert's and the fp8 KV decode's per-element decode): every code, bits.
TEST(Dtype, E4m3TableMatchesDecoder) {
  const float* t = cpu::rows::e4m3_table();
  for (int c = 0; c < 256; ++c)
    ASSERT_EQ(f32_bits(t[c]), f32_bits(e4m3_to_f32(static_cast<uint8_t>(c)))) << c;
}

// rows::f32_to_e4m3 (the AVX2 encoder and the forced scalar loop) and rows::store to e4m3 against
// the element rule store_f32 / dt::f32_to_e4m3 of x / divisor: hand-computed codes for every class
// (signed zeros, fp32 subnormals, e4m3 subnormals and ties, normals, ties carrying into the
// exponent, 448 and beyond, infinities, NaNs of either sign with payloads, signalling too); then
// every 61st of the 2^32 patterns (70 M) and +-256 ulp around every e4m3 value and midpoint of
// either sign, divisor 1 (rows::store's) and four others; lengths 0, 1, 7, 8, 9, 31, 1000 at
// many offsets between guard bytes of two poison values. (All 2^32 patterns, divisor 1, AVX2,
// scalar and rows::store, were checked once on 2026-12-03: 0 differences, 23 s, too slow here.)
TEST(Rows, E4m3EncoderMatchesStoreF32) {
  const std::pair<uint32_t, uint8_t> hand[] = {
      {0x00000000u, 0x00}, {0x80000000u, 0x80},  // +-0
      {0x00000001u, 0x00}, {0x807fffffu, 0x80},  // fp32 subnormals
      {0x3a800000u, 0x00}, {0xba800000u, 0x80},  // +-2^-10: the tie with 2^-9 goes to even 0
      {0x3a800001u, 0x01},                       // just above it: the smallest subnormal
      {0x3b400000u, 0x02},                       // 3 * 2^-10: a tie, to the even 2 * 2^-9
      {0x3c7c0000u, 0x08},                       // 2^-6 - 2^-12: rounds up into the normals
      {0x3c800000u, 0x08}, {0x3f800000u, 0x38}, {0xbf800000u, 0xb8},  // 2^-6, +-1
      {0x3f880000u, 0x38},  // 1.0625: a tie, to the even 1
      {0x3f980000u, 0x3a},  // 1.1875: a tie, to the even 1 + 2/8
      {0x41780000u, 0x58},  // 15.5: a tie carrying into the exponent
      {0x43dfffffu, 0x7e}, {0x43e00000u, 0x7e}, {0xc3e00000u, 0xfe},  // below 448, +-448
      {0x43e80000u, 0x7e}, {0x7149f2cau, 0x7e}, {0xf149f2cau, 0xfe},  // 464, +-1e30
      {0x7f800000u, 0x7e}, {0xff800000u, 0xfe},                       // +-inf saturate
      {0x7fc00000u, 0x7f}, {0xffc00000u, 0x7f}, {0x7fc12345u, 0x7f}, {0xffffffffu, 0x7f},
      {0x7f800001u, 0x7f}, {0xff812345u, 0x7f},  // NaNs: 0x7f without the sign, signalling too
  };
  std::vector<float> x;
  auto add = [&](uint32_t bits) { x.push_back(bits_f32(bits)); };
  for (const auto& h : hand) add(h.first);
  const size_t n_hand = x.size();
  for (int c = 0; c < 0x7f; ++c) {  // +-256 ulp around every e4m3 value and midpoint
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    const float mid = (v + e4m3_to_f32(static_cast<uint8_t>(c + 1))) / 2.f;  // exact
    for (float a : {v, mid})
      for (uint32_t sign : {0u, 0x80000000u})
        for (int d = -256; d <= 256; ++d) {
          const int64_t bits = static_cast<int64_t>(f32_bits(a)) + d;
          if (bits >= 0 && bits <= 0x7fffffff) add(static_cast<uint32_t>(bits) | sign);
        }
  }
  const float divisors[] = {1.f, 3.f, 0.0026041667f, 9.5367431640625e-07f /* 2^-20 */, -1.5f};
  // want[i] = the element rule of x[i] / divisor (divisor 1: store_f32 itself).
  auto reference = [](const std::vector<float>& v, float divisor) {
    std::vector<uint8_t> want(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (divisor == 1.f)
        store_f32(want.data(), static_cast<int64_t>(i), DType::e4m3, v[i]);
      else
        want[i] = f32_to_e4m3(v[i] / divisor);
    }
    return want;
  };
  // The whole of v in one call, each path; the first difference reported.
  auto check_all = [&](const std::vector<float>& v, float divisor, const char* what) {
    const std::vector<uint8_t> want = reference(v, divisor);
    const int64_t n = static_cast<int64_t>(v.size());
    // the widest vectors (AVX-512 or AVX2, where the CPU has them), scalar, rows::store, AVX2
    for (int path = 0; path < 4; ++path) {
      cpu::rows::force_scalar(path == 1);
      cpu::rows::force_avx2(path == 3);
      if (divisor == 1.f && path != 2) {  // round_e4m3: the values of the codes
        std::vector<float> rounded(v.size(), -7.f);
        cpu::rows::round_e4m3(v.data(), n, rounded.data());
        for (size_t i = 0; i < v.size(); ++i)
          if (f32_bits(rounded[i]) != f32_bits(cpu::rows::e4m3_table()[want[i]])) {
            ADD_FAILURE() << what << ", round_e4m3 path " << path << ": 0x" << std::hex
                          << f32_bits(v[i]) << " -> 0x" << f32_bits(rounded[i]) << ", want code 0x"
                          << int(want[i]);
            break;
          }
      }
      std::vector<uint8_t> got(v.size(), 0xcd);
      if (path == 2) {
        if (divisor != 1.f) continue;
        cpu::rows::store(v.data(), n, DType::e4m3, got.data(), 0);
      } else {
        cpu::rows::f32_to_e4m3(v.data(), n, divisor, got.data());
      }
      for (size_t i = 0; i < v.size(); ++i)
        if (got[i] != want[i]) {
          ADD_FAILURE() << what << ", divisor " << divisor << ", "
                        << (path == 0   ? "vector"
                            : path == 1 ? "scalar"
                            : path == 2 ? "rows::store"
                                        : "AVX2")
                        << ": 0x" << std::hex << f32_bits(v[i]) << " -> got 0x" << int(got[i])
                        << ", want 0x" << int(want[i]);
          break;
        }
    }
    cpu::rows::force_scalar(false);
    cpu::rows::force_avx2(false);
  };
  // Hand-computed codes (the element rule itself too).
  for (size_t i = 0; i < n_hand; ++i)
    ASSERT_EQ(f32_to_e4m3(x[i]), hand[i].second) << std::hex << hand[i].first;
  {
    const std::vector<float> hx(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n_hand));
    for (bool scalar : {false, true}) {
      cpu::rows::force_scalar(scalar);
      std::vector<uint8_t> got(n_hand, 0xcd), got_store(n_hand, 0xcd);
      cpu::rows::f32_to_e4m3(hx.data(), static_cast<int64_t>(n_hand), 1.f, got.data());
      cpu::rows::store(hx.data(), static_cast<int64_t>(n_hand), DType::e4m3, got_store.data(), 0);
      for (size_t i = 0; i < n_hand; ++i) {
        EXPECT_EQ(got[i], hand[i].second) << std::hex << hand[i].first << (scalar ? " scalar" : "");
        EXPECT_EQ(got_store[i], hand[i].second) << std::hex << hand[i].first << " rows::store";
      }
    }
    cpu::rows::force_scalar(false);
  }
  for (float divisor : divisors) check_all(x, divisor, "specials and e4m3 neighbourhoods");
  // Every 61st pattern of the 2^32, in blocks.
  const int64_t block = 1 << 20, stride = 61;
  std::vector<float> v;
  for (uint64_t b = 0; b < (1ull << 32); b += static_cast<uint64_t>(block) * stride) {
    v.clear();
    for (uint64_t u = b; u < (1ull << 32) && u < b + static_cast<uint64_t>(block) * stride;
         u += stride)
      v.push_back(bits_f32(static_cast<uint32_t>(u)));
    check_all(v, 1.f, "stride 61");
    if ((b / (static_cast<uint64_t>(block) * stride)) % 8 == 0)  // 1/8 of them, other divisors
      for (float divisor : divisors)
        if (divisor != 1.f) check_all(v, divisor, "stride 61");
    if (HasFailure()) return;
  }
  // Lengths at many offsets, between guard bytes: only [0, len) is written.
  const int64_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 1000};
  for (float divisor : {1.f, 3.f}) {
    const std::vector<uint8_t> want = reference(x, divisor);
    for (int mode : {0, 1, 2}) {  // the widest vectors, scalar, AVX2
      const bool scalar = mode == 1;
      cpu::rows::force_scalar(scalar);
      cpu::rows::force_avx2(mode == 2);
      for (int64_t len : lens)
        for (int64_t start = 0; start + len <= static_cast<int64_t>(x.size()); start += len + 97)
          for (uint8_t poison : {uint8_t{0xcd}, uint8_t{0x00}})
            for (bool via_store : {false, true}) {
              if (via_store && divisor != 1.f) continue;
              std::vector<uint8_t> out(static_cast<size_t>(len) + 64, poison);
              if (via_store)
                cpu::rows::store(&x[start], len, DType::e4m3, out.data(), 32);
              else
                cpu::rows::f32_to_e4m3(&x[start], len, divisor, out.data() + 32);
              for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
                const bool inside = i >= 32 && i < 32 + len;
                const uint8_t expect = inside ? want[start + i - 32] : poison;
                ASSERT_EQ(out[i], expect)
                    << "len " << len << " at " << start << ", byte " << i
                    << (inside ? "" : " (a guard)") << ", divisor " << divisor << ", mode " << mode
                    << (via_store ? ", rows::store" : "");
              }
            }
    }
    cpu::rows::force_scalar(false);
    cpu::rows::force_avx2(false);
  }
}

// rows::exp2 (the CPU attention's P = 2^(s - m)): within 2 ulp of the exact power for normal
// results and 2^-149 for subnormal ones, over every 97th float of [-160, 130] and every float of
// [-1, 1) near 0 and the integers; integers exact; NaN, +-inf and the clamp; the AVX2 + FMA path
// and the scalar one give the same bits; the one-value form the scalar path's.
// rows::round_bf16 (the CPU attention's P in a bf16 V's dtype): hand-computed values, then every
// 257th of the 2^32 patterns and +-4 ulp around every tie of the 2^16 bf16 values, the vector loop
// (AVX-512 where the CPU has it) and the scalar one against dt::f32_to_bf16 and back, lengths that
// leave a tail.
TEST(Rows, RoundBf16MatchesTheElementRule) {
  const std::pair<uint32_t, uint32_t> hand[] = {
      {0x3f800000u, 0x3f800000u}, {0x3f808000u, 0x3f800000u},  // 1; 1 + 2^-8: a tie, to even 1
      {0x3f818000u, 0x3f820000u},                              // a tie with odd lsb: up
      {0x3f808001u, 0x3f810000u}, {0x3f807fffu, 0x3f800000u},  // just above / below the tie
      {0xbf808000u, 0xbf800000u}, {0xbf818000u, 0xbf820000u},  // the same, negative
      {0x7f7fffffu, 0x7f800000u}, {0xff7fffffu, 0xff800000u},  // the largest floats round to inf
      {0x00008000u, 0x00000000u}, {0x00018000u, 0x00020000u},  // subnormal ties
      {0x80000000u, 0x80000000u}, {0x00000000u, 0x00000000u},  // +-0
      {0x7f800000u, 0x7f800000u}, {0xff800000u, 0xff800000u},  // +-inf
      {0x7fc00000u, 0x7fff0000u}, {0xffffffffu, 0x7fff0000u},  // NaNs -> 0x7fff's NaN
      {0x7f800001u, 0x7fff0000u}, {0x7f808000u, 0x7fff0000u},
  };
  std::vector<float> x;
  for (const auto& h : hand) {
    ASSERT_EQ(f32_bits(bf16_to_f32(f32_to_bf16(bits_f32(h.first)))), h.second)
        << std::hex << h.first;  // (the element rule itself)
    x.push_back(bits_f32(h.first));
  }
  const size_t n_hand = x.size();
  for (uint64_t b = 0; b <= 0xffffffffu; b += 257) x.push_back(bits_f32(static_cast<uint32_t>(b)));
  for (uint32_t h = 0; h <= 0xffffu; ++h)
    for (int d = -4; d <= 4; ++d) x.push_back(bits_f32((h << 16) + 0x8000u + d));
  const int64_t n = static_cast<int64_t>(x.size());
  for (bool scalar : {false, true}) {
    cpu::rows::force_scalar(scalar);
    for (int64_t len : {n, static_cast<int64_t>(n_hand), int64_t{37}, int64_t{15}}) {
      std::vector<float> got(static_cast<size_t>(len), -7.f);
      cpu::rows::round_bf16(x.data(), len, got.data());
      for (int64_t i = 0; i < len; ++i) {
        const uint32_t want = static_cast<size_t>(i) < n_hand
                                  ? hand[i].second
                                  : f32_bits(bf16_to_f32(f32_to_bf16(x[static_cast<size_t>(i)])));
        if (f32_bits(got[static_cast<size_t>(i)]) != want) {
          ADD_FAILURE() << (scalar ? "scalar" : "vector") << " length " << len << ": 0x" << std::hex
                        << f32_bits(x[static_cast<size_t>(i)]) << " -> 0x"
                        << f32_bits(got[static_cast<size_t>(i)]) << ", want 0x" << want;
          break;
        }
      }
    }
  }
  cpu::rows::force_scalar(false);
}

TEST(Rows, Exp2WithinTwoUlpAndPathsAgree) {
  std::vector<float> x;
  for (uint32_t b = f32_bits(-160.f); b > f32_bits(-0.f); b -= 97) x.push_back(bits_f32(b));
  for (uint32_t b = 0; b < f32_bits(130.f); b += 97) x.push_back(bits_f32(b));
  for (int k = -160; k <= 130; ++k) {
    x.push_back(static_cast<float>(k));
    x.push_back(std::nextafter(static_cast<float>(k), 1e9f));
    x.push_back(std::nextafter(static_cast<float>(k), -1e9f));
    x.push_back(static_cast<float>(k) + 0.5f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 127.99f, 128.f,
                            -149.f, -150.f, -126.f, 8.807354922057604f, -0.f};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> vec(x.size()), avx2(x.size()), sca(x.size());
  cpu::rows::force_scalar(false);
  cpu::rows::exp2(x.data(), n, vec.data());  // the widest vectors (AVX-512 where the CPU has it)
  cpu::rows::force_avx2(true);
  cpu::rows::exp2(x.data(), n, avx2.data());
  cpu::rows::force_avx2(false);
  cpu::rows::force_scalar(true);
  cpu::rows::exp2(x.data(), n, sca.data());
  cpu::rows::force_scalar(false);
  double worst_ulp = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(f32_bits(vec[i]), f32_bits(sca[i])) << "x = " << x[i];
    ASSERT_EQ(f32_bits(avx2[i]), f32_bits(sca[i])) << "x = " << x[i] << " (AVX2)";
    ASSERT_EQ(f32_bits(cpu::rows::exp2(x[i])), f32_bits(sca[i])) << "x = " << x[i];
    const float got = vec[i];
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    const double want = std::exp2(static_cast<double>(x[i]));
    if (want >= 0x1p128) {
      EXPECT_EQ(got, inf) << "x = " << x[i];
    } else if (want < 0x1p-126) {
      EXPECT_LE(std::fabs(got - want), 0x1p-149) << "x = " << x[i];
    } else {
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      const double err = std::fabs(got - want) / ulp;
      worst_ulp = std::max(worst_ulp, err);
      ASSERT_LE(err, 2.0) << "x = " << x[i] << " got " << got << " want " << want;
      if (x[i] == std::floor(x[i])) EXPECT_EQ(static_cast<double>(got), want) << "x = " << x[i];
    }
  }
  EXPECT_LT(worst_ulp, 2.0);
}
