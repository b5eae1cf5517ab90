// Attention family (SPEC §2) on the CPU backend: scale-layout index rules and the fp8 V layout on
// hand-computed vectors, a hand-computed attention row, accuracy of both PV modes against the
// fp64 softmax(q k^T) v reference on fresh N(0, 1) inputs (odd sizes, GQA, causal alignments,
// N_kv != N_q), masked rows, LSE with the K-mean correction, strided HND inputs, and argument
// errors that leave the output untouched.
#include "lowbit/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "lowbit/dtype.h"
#include "lowbit/prologue.h"
#include "src/cpu/amx.h"
#include "src/cpu/rows.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace {

using harness::HostTensor;

struct Metrics {
  double cos = 0, rel_l1 = 0;
};
Metrics metrics(const HostTensor& got, const std::vector<double>& ref) {
  double dot = 0, gg = 0, rr = 0, l1 = 0, r1 = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), r = ref[static_cast<size_t>(i)];
    dot += g * r;
    gg += g * g;
    rr += r * r;
    l1 += std::fabs(g - r);
    r1 += std::fabs(r);
  }
  Metrics m;
  m.cos = dot / std::sqrt(gg * rr + 1e-300);
  m.rel_l1 = l1 / (r1 + 1e-300);
  return m;
}

std::mt19937_64 rng_for(const char* name) { return std::mt19937_64(harness::case_seed(name)); }

struct Problem {
  int64_t B, Nq, Nkv, Hq, Hkv, D;
  AttentionOptions opt;
};

struct Outcome {
  HostTensor q, k, v, out, lse;
  std::vector<double> ref, lse_ref;
};

Outcome run_one_call(const Problem& p, std::mt19937_64& rng, DType dt = DType::bf16,
                     float k_mean_offset = 0.f, float v_mean_offset = 0.f) {
  Outcome r;
  r.q = HostTensor(dt, {p.B, p.Nq, p.Hq, p.D});
  r.k = HostTensor(dt, {p.B, p.Nkv, p.Hkv, p.D});
  r.v = HostTensor(dt, {p.B, p.Nkv, p.Hkv, p.D});
  r.q.fill_normal(rng);
  r.k.fill_normal(rng, k_mean_offset);
  r.v.fill_normal(rng, v_mean_offset);
  r.out = HostTensor(dt, {p.B, p.Nq, p.Hq, p.D});
  r.lse = HostTensor(DType::f32, {p.B, p.Hq, p.Nq});
  Context ctx;
  TensorView lse = r.lse.view();
  attention(r.q.view(), r.k.view(), r.v.view(), r.out.view(), &lse, p.opt, ctx);
  r.ref.resize(static_cast<size_t>(r.out.numel()));
  r.lse_ref.resize(static_cast<size_t>(r.lse.numel()));
  attention_reference_f64(r.q.view(), r.k.view(), r.v.view(), p.opt, r.ref.data(),
                          r.lse_ref.data());
  return r;
}

// ---- scale layouts (SPEC §1 table), hand-computed ----------------------------------------------

TEST(Attention, ScaleIndexFollowsTheLayoutTable) {
  EXPECT_EQ(scale_index(ScaleLayout::per_block, 64, 130), 2);
  EXPECT_EQ(scale_index(ScaleLayout::thread_q, 32, 0), 0);
  EXPECT_EQ(scale_index(ScaleLayout::thread_q, 32, 9), 1);
  EXPECT_EQ(scale_index(ScaleLayout::thread_q, 32, 25), 1);  // rows r, r+8, r+16, r+24
  EXPECT_EQ(scale_index(ScaleLayout::thread_q, 32, 33), 9);
  EXPECT_EQ(scale_index(ScaleLayout::thread_k, 64, 2), 1);  // row pairs
  EXPECT_EQ(scale_index(ScaleLayout::thread_k, 64, 7), 3);
  EXPECT_EQ(scale_index(ScaleLayout::thread_k, 64, 64 + 9), 4 + 0);
  EXPECT_EQ(scale_index(ScaleLayout::warp_q, 128, 40), 1);
  EXPECT_EQ(scale_index(ScaleLayout::warp_q, 128, 128 + 127), 4 + 3);
  EXPECT_EQ(scale_count(ScaleLayout::thread_q, 32, 1), 32);  // padded to 128 rows
  EXPECT_EQ(scale_count(ScaleLayout::thread_q, 16, 129), 128);
  EXPECT_EQ(scale_count(ScaleLayout::thread_k, 64, 65), 8);
  EXPECT_EQ(scale_count(ScaleLayout::per_block, 128, 128), 1);
}

// ---- fp8 V: scales, codes and the fragment order of keys ---------------------------------------

TEST(Attention, QuantizeVFp8ScalesCodesAndKeyOrder) {
  const int64_t N = 40, D = 16;
  HostTensor v(DType::f32, {1, N, 1, D});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) v.set(n * D + d, 0.f);
  // channel 0: key n holds n / 8 (max 39/8 = 4.875); channel 1 all zero; channel 2 one -3.5.
  for (int64_t n = 0; n < N; ++n) v.set(n * D + 0, static_cast<float>(n) / 8.f);
  v.set(5 * D + 2, -3.5f);
  HostTensor codes(DType::e4m3, {1, 1, D, 64}), scale(DType::f32, {1, 1, D});
  std::mt19937_64 poison(1);
  codes.fill_random_bytes(poison);  // every code must be written
  Context ctx;
  quantize_v_fp8(v.view(), codes.view(), scale.view(), nullptr, ctx);
  EXPECT_FLOAT_EQ(scale.get(0), 4.875f / 448.f);
  EXPECT_EQ(scale.get(1), 0.f);
  EXPECT_FLOAT_EQ(scale.get(2), 3.5f / 448.f);
  const uint8_t* c = codes.as<uint8_t>();
  // key -> position within a 32-key group: 16*h + 4*t + i for key 16*h + 8*(i/2) + 2*t + i%2.
  const int key_pos[][2] = {{0, 0},  {1, 1},   {8, 2},   {9, 3},   {2, 4},   {3, 5},
                            {10, 6}, {16, 16}, {25, 19}, {31, 31}, {33, 33}, {39, 32 + 4 * 3 + 1}};
  for (auto& kp : key_pos) {
    const float x = static_cast<float>(kp[0]) / 8.f;
    EXPECT_EQ(c[kp[1]], dt::f32_to_e4m3(x / (4.875f / 448.f))) << "key " << kp[0];
  }
  EXPECT_EQ(c[45], 0x7e);  // key 39, the channel maximum, maps to 448
  for (int64_t n = 0; n < 64; ++n) EXPECT_EQ(c[1 * 64 + n], 0) << "zero channel, pos " << n;
  EXPECT_EQ(c[2 * 64 + 9], 0x80 | 0x7e);  // key 5 = 2*2 + 1 -> position 4*2 + 1, -448
  for (int64_t n = N; n < 64; ++n) {      // padding keys, at their fragment positions
    const int64_t r = n % 32, w = r % 16;
    const int64_t pos = n - r + 16 * (r / 16) + 4 * ((w % 8) / 2) + (w / 8) * 2 + w % 2;
    EXPECT_EQ(c[pos], 0) << "padding key " << n;
  }
}

// ---- one hand-computed row ---------------------------------------------------------------------

// The CPU oracle's vector loops (the q . k dots on AMX tiles, AVX-512 VNNI or AVX2, the AVX-512
// scores and P·V, the fp8 P·V on AVX512_BF16, rows::exp2, the e4m3 rounding) and their twins
// without AMX (amx::force_off), AVX2 (rows::force_avx2), scalar (rows::force_scalar) and without
// AVX512_BF16 (rows::force_no_bf16) give the same output and LSE bits: both
// P·V modes, GQA, causal, D 64, 80 and 128, key counts that leave a partial tile.
TEST(Attention, CpuScalarLoopsGiveTheVectorBits) {
  if (!cpu::rows::avx2_on()) GTEST_SKIP() << "no AVX2 on this CPU: only the scalar loops run";
  auto rng = rng_for("Attention.CpuScalarLoopsGiveTheVectorBits");
  // f32 (CPU only): P spread over many binades (k scaled up) and V over 2^-8 .. 2^8, so that
  // the P·V sums round at most steps and any other order of the keys shows in the f32 output.
  for (DType dt : {DType::bf16, DType::f32})
    for (int64_t D : {64, 80, 128})
      for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
        const bool wide_range = dt == DType::f32;
        const int64_t B = 1, Nq = 70, Nkv = 130, Hq = 4, Hkv = 2;
        HostTensor q(dt, {B, Nq, Hq, D}), k(dt, {B, Nkv, Hkv, D}), v(dt, {B, Nkv, Hkv, D});
        q.fill_normal(rng);
        k.fill_normal(rng, wide_range ? 1.5f : 0.3f);
        v.fill_normal(rng);
        if (wide_range) {
          std::uniform_int_distribution<int> e(-8, 8);
          for (int64_t i = 0; i < v.numel(); ++i) v.set(i, std::ldexp(v.get(i), e(rng)));
        }
        AttentionOptions opt;
        opt.pv = pv;
        opt.causal = AttentionOptions::bottom_right;
        std::vector<HostTensor> out, lse;
        for (int mode = 0; mode < 5; ++mode) {  // the widest vectors, AVX2, scalar, no AMX, no BF16
          out.emplace_back(dt, std::vector<int64_t>{B, Nq, Hq, D});
          lse.emplace_back(DType::f32, std::vector<int64_t>{B, Hq, Nq});
          cpu::rows::force_avx2(mode == 1);
          cpu::rows::force_scalar(mode == 2);
          cpu::amx::force_off(mode == 3);
          cpu::rows::force_no_bf16(mode == 4);
          Context ctx;
          TensorView lv = lse.back().view();
          attention(q.view(), k.view(), v.view(), out.back().view(), &lv, opt, ctx);
        }
        cpu::rows::force_avx2(false);
        cpu::rows::force_scalar(false);
        cpu::amx::force_off(false);
        cpu::rows::force_no_bf16(false);
        for (int mode = 1; mode < 5; ++mode) {
          EXPECT_EQ(out[0].bytes, out[mode].bytes)
              << dtype_name(dt) << " D " << D << " pv " << static_cast<int>(pv) << " mode " << mode;
          EXPECT_EQ(lse[0].bytes, lse[mode].bytes)
              << dtype_name(dt) << " D " << D << " pv " << static_cast<int>(pv) << " mode " << mode;
        }
      }
}

TEST(Attention, HandComputedRowFp8) {
  // One query, two keys with equal logits (k = 0): P = 448 * 2^0 for both, rounded to e4m3 448.
  // V channel 0: 1 and 3 -> scale 3/448, codes e4m3(149.33) = 144 and 448.
  // out = (144 + 448) / 2 * 3/448 = 1.98214; channel 1: -2 and 0 -> scale 2/448, out = -1.
  const int64_t D = 16;
  HostTensor q(DType::i8, {1, 1, 1, D}), k(DType::i8, {1, 2, 1, D});
  HostTensor qs(DType::f32, {1, 1, 1}), ks(DType::f32, {1, 1, 1});
  for (int64_t d = 0; d < D; ++d) q.set(d, d == 0 ? 5.f : 0.f);
  for (int64_t i = 0; i < k.numel(); ++i) k.set(i, 0.f);
  qs.set(0, 0.25f);
  ks.set(0, 0.5f);
  HostTensor v(DType::f32, {1, 2, 1, D});
  for (int64_t i = 0; i < v.numel(); ++i) v.set(i, 0.f);
  v.set(0, 1.f);
  v.set(D, 3.f);
  v.set(1, -2.f);
  HostTensor v8(DType::e4m3, {1, 1, D, 64}), vs(DType::f32, {1, 1, D});
  Context ctx;
  quantize_v_fp8(v.view(), v8.view(), vs.view(), nullptr, ctx);
  QuantizedRows qr{q.view(), qs.view(), ScaleLayout::per_block, 64};
  QuantizedRows kr{k.view(), ks.view(), ScaleLayout::per_block, 64};
  HostTensor out(DType::f32, {1, 1, 1, D}), lse(DType::f32, {1, 1, 1});
  TensorView lv = lse.view(), vsv = vs.view();
  AttentionOptions opt;
  attention_int8(qr, kr, v8.view(), &vsv, nullptr, nullptr, out.view(), &lv, opt, ctx);
  EXPECT_NEAR(out.get(0), (144.0 + 448.0) / 2 * 3.0 / 448.0, 1e-5);
  EXPECT_NEAR(out.get(1), -1.0, 1e-6);
  EXPECT_EQ(out.get(2), 0.f);
  EXPECT_NEAR(lse.get(0), std::log(2.0), 1e-5);  // two logits of 0
}

// The fp8 V layout's padding (keys Nkv .. round_up(Nkv, 64) - 1) is never read into the output:
// a caller's V whose padding codes are NaN (0x7f, 0xff) or 448 gives the bits of the quantizer's
// zero padding, with the vector loops (the AVX512_BF16 staging of a whole key tile too) and
// without AVX512_BF16.
TEST(Attention, Fp8VPaddingIsNeverRead) {
  auto rng = rng_for("Attention.Fp8VPaddingIsNeverRead");
  for (int64_t Nkv : {1, 37, 64 + 33}) {
    const int64_t D = 64, Nq = 5, npad = (Nkv + 63) / 64 * 64;
    HostTensor q(DType::i8, {1, Nq, 1, D}), k(DType::i8, {1, Nkv, 1, D});
    HostTensor qs(DType::f32, {1, 1, 1}), ks(DType::f32, {1, 1, npad / 64});
    std::uniform_int_distribution<int> code(-127, 127);
    for (int64_t i = 0; i < q.numel(); ++i) q.set(i, static_cast<float>(code(rng)));
    for (int64_t i = 0; i < k.numel(); ++i) k.set(i, static_cast<float>(code(rng)));
    qs.set(0, 1.f / 512);
    for (int64_t i = 0; i < ks.numel(); ++i) ks.set(i, 1.f / 512);
    HostTensor v(DType::f32, {1, Nkv, 1, D});
    v.fill_normal(rng);
    HostTensor v8(DType::e4m3, {1, 1, D, npad}), vs(DType::f32, {1, 1, D});
    Context ctx;
    quantize_v_fp8(v.view(), v8.view(), vs.view(), nullptr, ctx);
    QuantizedRows qr{q.view(), qs.view(), ScaleLayout::per_block, 64};
    QuantizedRows kr{k.view(), ks.view(), ScaleLayout::per_block, 64};
    TensorView vsv = vs.view();
    AttentionOptions opt;
    HostTensor want(DType::f32, {1, Nq, 1, D});
    attention_int8(qr, kr, v8.view(), &vsv, nullptr, nullptr, want.view(), nullptr, opt, ctx);
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_TRUE(std::isfinite(want.get(i))) << i;
    // every position of the layout that holds no key below Nkv: the padding
    std::vector<bool> real(static_cast<size_t>(npad), false);
    for (int64_t n = 0; n < Nkv; ++n) {
      const int64_t r = n % 32, w = r % 16;
      real[static_cast<size_t>(n - r + 16 * (r / 16) + 4 * ((w % 8) / 2) + (w / 8) * 2 + w % 2)] =
          true;
    }
    for (uint8_t pad : {uint8_t{0x7f}, uint8_t{0xff}, uint8_t{0x7e}})
      for (bool no_bf16 : {false, true}) {
        HostTensor v8p = v8;
        uint8_t* c = v8p.as<uint8_t>();
        for (int64_t d = 0; d < D; ++d)
          for (int64_t pos = 0; pos < npad; ++pos)
            if (!real[static_cast<size_t>(pos)]) c[d * npad + pos] = pad;
        cpu::rows::force_no_bf16(no_bf16);
        HostTensor got(DType::f32, {1, Nq, 1, D});
        attention_int8(qr, kr, v8p.view(), &vsv, nullptr, nullptr, got.view(), nullptr, opt, ctx);
        cpu::rows::force_no_bf16(false);
        EXPECT_EQ(got.bytes, want.bytes) << "Nkv " << Nkv << " padding 0x" << std::hex << int(pad)
                                         << (no_bf16 ? " without AVX512_BF16" : "");
      }
  }
}

// 16-bit P·V with bf16 V on AVX512_BF16 (vdpbf16ps reads denormals as 0 and flushes denormal
// results) keeps the fused multiply-adds' bits where a value is tiny. Case 0: channel 0 of V is
// the bf16 denormal 2^-130 at every key. Case 1 (no tiny V): channel 0 is 2^-50 at key 1 only,
// whose P is ~2^-80, so that P v = 2^-130. Either output is a nonzero bf16 denormal, the same
// bits with and without AVX512_BF16 and on the scalar loops.
TEST(Attention, CpuBf16DotsKeepDenormalProducts) {
  const int64_t D = 16, Nkv = 3;
  HostTensor q(DType::i8, {1, 1, 1, D}), k(DType::i8, {1, Nkv, 1, D});
  HostTensor qs(DType::f32, {1, 1, 1}), ks(DType::f32, {1, 1, 1});
  for (int64_t i = 0; i < q.numel(); ++i) q.set(i, i == 0 ? 1.f : 0.f);
  for (int64_t i = 0; i < k.numel(); ++i) k.set(i, 0.f);
  k.set(1 * D, -127.f);  // key 1 (in a key pair): q . k = -127, the others 0
  qs.set(0, 1.f);
  ks.set(0, 1.f);
  QuantizedRows qr{q.view(), qs.view(), ScaleLayout::per_block, 64};
  QuantizedRows kr{k.view(), ks.view(), ScaleLayout::per_block, 64};
  AttentionOptions opt;
  opt.pv = AttentionOptions::f16;
  // scores in base 2: -127 sm_scale log2(e) = -80 for key 1
  opt.sm_scale = static_cast<float>(80.0 / (127.0 * 1.4426950408889634));
  for (int tiny_v = 1; tiny_v >= 0; --tiny_v) {
    HostTensor v(DType::bf16, {1, Nkv, 1, D});
    for (int64_t i = 0; i < v.numel(); ++i) v.set(i, i % D == 0 ? 0.f : 1.f + 0.25f * (i % 3));
    if (tiny_v)
      for (int64_t j = 0; j < Nkv; ++j) v.set(j * D, std::ldexp(1.f, -130));
    else
      v.set(1 * D, std::ldexp(1.f, -50));
    std::vector<HostTensor> out;
    for (int mode = 0; mode < 3; ++mode) {  // the widest vectors, no AVX512_BF16, scalar
      cpu::rows::force_no_bf16(mode == 1);
      cpu::rows::force_scalar(mode == 2);
      out.emplace_back(DType::bf16, std::vector<int64_t>{1, 1, 1, D});
      Context ctx;
      attention_int8(qr, kr, v.view(), nullptr, nullptr, nullptr, out.back().view(), nullptr, opt,
                     ctx);
    }
    cpu::rows::force_no_bf16(false);
    cpu::rows::force_scalar(false);
    if (tiny_v)
      EXPECT_EQ(out[0].get(0), std::ldexp(1.f, -130));  // (2 * 2^-130 + ~0) / 2
    else
      EXPECT_EQ(out[0].get(0), std::ldexp(1.f, -131));  // 2^-130 / 2: P v of key 1 kept
    for (int mode = 1; mode < 3; ++mode)
      EXPECT_EQ(out[0].bytes, out[mode].bytes) << "tiny v " << tiny_v << " mode " << mode;
  }
}

// ---- accuracy against fp64 ----------------------------------------------------------------------

void expect_accuracy(const Problem& p, const char* seed_name, double min_cos, double max_l1) {
  auto rng = rng_for(seed_name);
  Outcome r = run_one_call(p, rng);
  Metrics m = metrics(r.out, r.ref);
  EXPECT_GE(m.cos, min_cos) << seed_name << " rel L1 " << m.rel_l1;
  EXPECT_LE(m.rel_l1, max_l1) << seed_name << " cos " << m.cos;
  for (int64_t i = 0; i < r.lse.numel(); ++i) {
    const double ref = r.lse_ref[static_cast<size_t>(i)];
    if (std::isinf(ref)) {
      EXPECT_TRUE(std::isinf(r.lse.get(i)) && r.lse.get(i) < 0) << "lse " << i;
    } else {
      // A row with one visible key has the LSE of a single INT8 logit (errors ~0.04 seen).
      EXPECT_NEAR(r.lse.get(i), ref, 0.06 + 0.005 * std::fabs(ref)) << seed_name << " lse " << i;
    }
  }
}

// SageAttention 2's fp8 PV arithmetic (e4m3 P and e4m3 per-channel V) measures cos 0.9994-0.9995
// and relative L1 0.033-0.035 on N(0, 1) inputs (SageAttention's own sm_90 kernel: 0.9993 /
// 0.038). SPEC §2's fp8 targets (0.9995 / 0.02) are below what e4m3 rounding of P and V allows
// with zero-mean V; docs/attention.md explains. The bounds here are the measured level plus a
// margin, so a regression (a wrong scale, a lost rescale, double rounding) still fails.
constexpr double kFp8Cos = 0.9992, kFp8RelL1 = 0.04;

TEST(Attention, Fp8PvAccuracy) {
  for (auto causal : {AttentionOptions::none, AttentionOptions::bottom_right}) {
    Problem p{1, 257, 257, 2, 2, 128, {}};
    p.opt.causal = causal;
    expect_accuracy(p, "attention.unit.fp8.d128", kFp8Cos, kFp8RelL1);
    p = Problem{2, 127, 127, 4, 2, 64, {}};  // GQA
    p.opt.causal = causal;
    expect_accuracy(p, "attention.unit.fp8.gqa", kFp8Cos, kFp8RelL1);
  }
}

TEST(Attention, F16PvMeetsSpecAccuracy) {
  for (auto causal : {AttentionOptions::none, AttentionOptions::top_left}) {
    Problem p{1, 200, 200, 2, 1, 128, {}};
    p.opt.pv = AttentionOptions::f16;
    p.opt.causal = causal;
    expect_accuracy(p, "attention.unit.f16.d128", 0.9999, 0.012);
    p = Problem{1, 127, 127, 3, 3, 64, {}};
    p.opt.pv = AttentionOptions::f16;
    p.opt.causal = causal;
    expect_accuracy(p, "attention.unit.f16.d64", 0.9999, 0.012);
  }
}

TEST(Attention, OddShapesAndKvLongerThanQ) {
  const int64_t shapes[][2] = {{1, 1}, {17, 17}, {1, 127}, {17, 127}, {127, 65}};
  for (auto& s : shapes)
    for (auto causal :
         {AttentionOptions::none, AttentionOptions::bottom_right, AttentionOptions::top_left})
      for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
        Problem p{1, s[0], s[1], 2, 1, 64, {}};
        p.opt.causal = causal;
        p.opt.pv = pv;
        // Short rows average few keys: the output is as noisy as single fp8 products, and the
        // INT8 logit error of a nearly one-hot row is not averaged away. One query row (Nq = 1:
        // 128 outputs per head) is also a small sample: over 60 fresh seeds fp8 PV reached cos
        // 0.99885 / rel L1 0.047 there (0.99875 / 0.050 seen once), 16-bit 0.99987 / 0.0146.
        expect_accuracy(p, "attention.unit.odd", pv == AttentionOptions::fp8 ? 0.997 : 0.9995,
                        pv == AttentionOptions::fp8 ? 0.07 : 0.025);
      }
}

TEST(Attention, RowsThatSeeNoKeyAreZeroWithLseMinusInf) {
  // Bottom-right alignment with N_q > N_kv: query i sees keys j <= i - (N_q - N_kv).
  Problem p{1, 40, 9, 2, 2, 64, {}};
  p.opt.causal = AttentionOptions::bottom_right;
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
    p.opt.pv = pv;
    auto rng = rng_for("attention.unit.masked");
    Outcome r = run_one_call(p, rng);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 40; ++i) {
        const bool masked = i < 40 - 9;
        const float lse = r.lse.get(h * 40 + i);
        EXPECT_EQ(masked, std::isinf(lse) && lse < 0) << "row " << i;
        for (int64_t d = 0; d < 64; ++d) {
          const float o = r.out.get((i * 2 + h) * 64 + d);
          EXPECT_FALSE(std::isnan(o));
          if (masked) EXPECT_EQ(o, 0.f) << "row " << i;
        }
      }
  }
  // N_kv = 0: every row sees nothing.
  Problem e{1, 5, 0, 1, 1, 64, {}};
  auto rng = rng_for("attention.unit.empty");
  Outcome r = run_one_call(e, rng);
  for (int64_t i = 0; i < r.out.numel(); ++i) EXPECT_EQ(r.out.get(i), 0.f);
  for (int64_t i = 0; i < r.lse.numel(); ++i) EXPECT_TRUE(std::isinf(r.lse.get(i)));
}

TEST(Attention, LseIsCorrectedForTheKMean) {
  // K with mean 2: the smoothed kernel sees k - mean; its LSE is right only with q·mean added.
  Problem p{1, 64, 64, 2, 2, 64, {}};
  auto rng = rng_for("attention.unit.kmean");
  Outcome r = run_one_call(p, rng, DType::bf16, 2.f, 0.f);
  for (int64_t i = 0; i < r.lse.numel(); ++i)
    EXPECT_NEAR(r.lse.get(i), r.lse_ref[static_cast<size_t>(i)], 0.08) << i;  // q·mean ~ N(0, 2)
  Metrics m = metrics(r.out, r.ref);
  EXPECT_GE(m.cos, kFp8Cos);
}

TEST(Attention, VMeanSmoothingHelpsOffsetV) {
  Problem p{1, 128, 128, 2, 2, 64, {}};
  p.opt.smooth_v = false;
  auto rng = rng_for("attention.unit.vmean");
  Outcome plain = run_one_call(p, rng, DType::bf16, 0.f, 8.f);
  p.opt.smooth_v = true;
  rng = rng_for("attention.unit.vmean");
  Outcome smooth = run_one_call(p, rng, DType::bf16, 0.f, 8.f);
  // Errors measured on the deviation from the mean, where smoothing keeps fp8 resolution.
  std::vector<double> dev_ref = plain.ref;
  HostTensor dev_plain = plain.out, dev_smooth = smooth.out;
  for (size_t i = 0; i < dev_ref.size(); ++i) {
    dev_ref[i] -= 8.0;
    dev_plain.set(static_cast<int64_t>(i), plain.out.get(static_cast<int64_t>(i)) - 8.f);
    dev_smooth.set(static_cast<int64_t>(i), smooth.out.get(static_cast<int64_t>(i)) - 8.f);
  }
  const double e_plain = metrics(dev_plain, dev_ref).rel_l1;
  const double e_smooth = metrics(dev_smooth, dev_ref).rel_l1;
  EXPECT_LT(e_smooth, e_plain);
  EXPECT_GE(metrics(smooth.out, smooth.ref).cos, 0.9999);
}

TEST(Attention, StridedHndGivesTheSameBitsAsNhd) {
  const int64_t N = 33, H = 2, D = 64;
  auto rng = rng_for("attention.unit.hnd");
  HostTensor q(DType::bf16, {1, N, H, D}), k(DType::bf16, {1, N, H, D}),
      v(DType::bf16, {1, N, H, D});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  // The same values stored head-major (B, H, N, D).
  auto to_hnd = [&](const HostTensor& x) {
    HostTensor y(DType::bf16, {1, H, N, D});
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) y.set((h * N + n) * D + d, x.get((n * H + h) * D + d));
    return y;
  };
  auto as_nhd_view = [&](HostTensor& y) {
    TensorView t = y.view();
    t.shape[1] = N;
    t.shape[2] = H;
    t.stride[1] = D;
    t.stride[2] = N * D;
    return t;
  };
  HostTensor qh = to_hnd(q), kh = to_hnd(k), vh = to_hnd(v);
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
    AttentionOptions opt;
    opt.pv = pv;
    opt.causal = AttentionOptions::bottom_right;
    Context ctx;
    HostTensor o1(DType::bf16, {1, N, H, D}), o2(DType::bf16, {1, H, N, D});
    attention(q.view(), k.view(), v.view(), o1.view(), nullptr, opt, ctx);
    attention(as_nhd_view(qh), as_nhd_view(kh), as_nhd_view(vh), as_nhd_view(o2), nullptr, opt,
              ctx);
    HostTensor back = to_hnd(o1);
    EXPECT_EQ(back.bytes, o2.bytes);
  }
}

// ---- argument errors: reported, nothing written -------------------------------------------------

TEST(Attention, ArgumentErrorsNameTheArgumentAndWriteNothing) {
  const int64_t N = 16, D = 64;
  HostTensor q(DType::i8, {1, N, 4, D}), k(DType::i8, {1, N, 2, D});
  HostTensor qs(DType::f32, {1, 4, 1}), ks(DType::f32, {1, 2, 1});
  HostTensor v(DType::bf16, {1, N, 2, D}), out(DType::bf16, {1, N, 4, D});
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, 7.f);
  const std::vector<uint8_t> before = out.bytes;
  AttentionOptions opt;
  opt.pv = AttentionOptions::f16;
  Context ctx;
  auto expect_error = [&](const char* arg, QuantizedRows qr, QuantizedRows kr, TensorView vv,
                          TensorView o, AttentionOptions op) {
    try {
      attention_int8(qr, kr, vv, nullptr, nullptr, nullptr, o, nullptr, op, ctx);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_STREQ(e.op(), "attention_int8");
      EXPECT_STREQ(e.argument(), arg) << e.what();
    }
    EXPECT_EQ(out.bytes, before) << arg;
  };
  QuantizedRows qr{q.view(), qs.view(), ScaleLayout::per_block, 64};
  QuantizedRows kr{k.view(), ks.view(), ScaleLayout::per_block, 64};
  {  // sanity: the valid call works (and then restore the output)
    attention_int8(qr, kr, v.view(), nullptr, nullptr, nullptr, out.view(), nullptr, opt, ctx);
    out.bytes = before;
  }
  QuantizedRows bad = qr;
  bad.data.dtype = DType::u8;
  expect_error("q", bad, kr, v.view(), out.view(), opt);
  bad = kr;
  bad.data.shape[2] = 3;  // 4 q heads are not a multiple of 3
  bad.scale.shape[1] = 3;
  expect_error("k", qr, bad, v.view(), out.view(), opt);
  bad = qr;
  bad.layout = ScaleLayout::thread_q;
  bad.block = 32;  // needs 32 scales per head, has 1
  expect_error("q_scale", bad, kr, v.view(), out.view(), opt);
  bad = qr;
  bad.block = 12;
  expect_error("q", bad, kr, v.view(), out.view(), opt);
  TensorView badv = v.view();
  badv.dtype = DType::f16;  // out is bf16
  expect_error("v", qr, kr, badv, out.view(), opt);
  TensorView bado = out.view();
  bado.shape[3] = 32;
  expect_error("out", qr, kr, v.view(), bado, opt);
  AttentionOptions fp8 = opt;
  fp8.pv = AttentionOptions::fp8;  // a bf16 V is not an fp8 V
  expect_error("v", qr, kr, v.view(), out.view(), fp8);
  AttentionOptions bad_kernel = opt;
  bad_kernel.kernel = static_cast<AttentionOptions::Kernel>(7);
  expect_error("options.kernel", qr, kr, v.view(), out.view(), bad_kernel);
  {  // the CPU backend ignores the CUDA kernel choice: same bits for every valid choice
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal(0.f, 20.f);
    for (HostTensor* t : {&q, &k})
      for (int64_t i = 0; i < t->numel(); ++i)
        t->set(i, std::max(-127.f, std::min(127.f, std::nearbyint(normal(rng)))));
    for (HostTensor* t : {&qs, &ks})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 0.05f);
    v.fill_normal(rng);
    HostTensor ref(DType::bf16, {1, N, 4, D});
    attention_int8(qr, kr, v.view(), nullptr, nullptr, nullptr, ref.view(), nullptr, opt, ctx);
    for (auto kc : {AttentionOptions::mma_sync, AttentionOptions::wgmma,
                    AttentionOptions::wgmma_r3}) {
      AttentionOptions o = opt;
      o.kernel = kc;
      HostTensor got(DType::bf16, {1, N, 4, D});
      attention_int8(qr, kr, v.view(), nullptr, nullptr, nullptr, got.view(), nullptr, o, ctx);
      EXPECT_EQ(got.bytes, ref.bytes);
    }
    EXPECT_NE(ref.bytes, std::vector<uint8_t>(ref.bytes.size(), 0));  // a real output
  }

  // One-call: mismatched v shape.
  HostTensor qf(DType::bf16, {1, N, 4, D}), kf(DType::bf16, {1, N, 2, D}),
      vf(DType::bf16, {1, N + 1, 2, D});
  try {
    attention(qf.view(), kf.view(), vf.view(), out.view(), nullptr, opt, ctx);
    ADD_FAILURE() << "no error for v shape";
  } catch (const Error& e) {
    EXPECT_STREQ(e.argument(), "v");
  }
  EXPECT_EQ(out.bytes, before);
}

// ---- variable-length batches ---------------------------------------------------------------

// Copies rows [r0, r1) of a packed (T, H, D) tensor into a (1, r1 - r0, H, D) tensor.
HostTensor rows_of(const HostTensor& t, int64_t r0, int64_t r1) {
  const int64_t H = t.shape[1], D = t.shape[2];
  HostTensor r(t.dtype, {1, r1 - r0, H, D});
  for (int64_t i = 0; i < (r1 - r0) * H * D; ++i) r.set(i, t.get(r0 * H * D + i));
  return r;
}

TEST(Attention, VarlenEqualsEachSequenceAlone) {
  // Sequences with odd lengths, an empty query range and an empty key range; GQA; each causal
  // alignment and both PV modes. Every output and LSE bit equals attention() on that sequence.
  // Sequences 4-6 (64 queries, 67 keys) and 7-8 (1 query, no keys) run as batches of equal
  // lengths (attention_varlen's runs).
  const std::vector<int64_t> cu_q = {0, 17, 17, 50, 51, 115, 179, 243, 244, 245};
  const std::vector<int64_t> cu_k = {0, 33, 40, 73, 73, 140, 207, 274, 274, 274};
  const int64_t Hq = 4, Hkv = 2, D = 64, Tq = cu_q.back(), Tk = cu_k.back();
  auto rng = rng_for("Attention.VarlenEqualsEachSequenceAlone");
  HostTensor q(DType::bf16, {Tq, Hq, D}), k(DType::bf16, {Tk, Hkv, D}),
      v(DType::bf16, {Tk, Hkv, D});
  q.fill_normal(rng);
  k.fill_normal(rng, 0.5f);
  v.fill_normal(rng);
  for (auto causal :
       {AttentionOptions::none, AttentionOptions::bottom_right, AttentionOptions::top_left})
    for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
      AttentionOptions opt;
      opt.causal = causal;
      opt.pv = pv;
      HostTensor out(DType::bf16, {Tq, Hq, D}), lse(DType::f32, {Hq, Tq});
      Context ctx;
      TensorView lv = lse.view();
      attention_varlen(q.view(), k.view(), v.view(), cu_q, cu_k, out.view(), &lv, opt, ctx);
      for (size_t s = 0; s + 1 < cu_q.size(); ++s) {
        const int64_t q0 = cu_q[s], q1 = cu_q[s + 1], k0 = cu_k[s], k1 = cu_k[s + 1];
        if (q1 == q0) continue;
        HostTensor qs = rows_of(q, q0, q1), ks = rows_of(k, k0, k1), vs = rows_of(v, k0, k1);
        HostTensor o(DType::bf16, {1, q1 - q0, Hq, D}), l(DType::f32, {1, Hq, q1 - q0});
        TensorView lsv = l.view();
        attention(qs.view(), ks.view(), vs.view(), o.view(), &lsv, opt, ctx);
        for (int64_t i = 0; i < o.numel(); ++i)
          ASSERT_EQ(o.get(i), out.get(q0 * Hq * D + i)) << "sequence " << s << " element " << i;
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t r = 0; r < q1 - q0; ++r) {
            const float a = l.get(h * (q1 - q0) + r), b = lse.get(h * Tq + q0 + r);
            ASSERT_TRUE(a == b || (std::isinf(a) && std::isinf(b)))
                << "sequence " << s << " head " << h << " row " << r << ": " << a << " vs " << b;
          }
        if (k1 == k0)  // no keys: zeros and -inf
          for (int64_t r = 0; r < q1 - q0; ++r) {
            EXPECT_EQ(out.get((q0 + r) * Hq * D), 0.f);
            EXPECT_TRUE(std::isinf(lse.get(q0 + r)) && lse.get(q0 + r) < 0);
          }
      }
    }
}

TEST(Attention, VarlenOffsetErrorsNameTheArgumentAndWriteNothing) {
  const int64_t Hq = 2, D = 64;
  HostTensor q(DType::bf16, {10, Hq, D}), k(DType::bf16, {12, Hq, D}), v(DType::bf16, {12, Hq, D});
  HostTensor out(DType::bf16, {10, Hq, D});
  auto rng = rng_for("Attention.VarlenOffsetErrors");
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, 7.f);
  const std::vector<uint8_t> before = out.bytes;
  Context ctx;
  AttentionOptions opt;
  auto expect_error = [&](const char* arg, const std::vector<int64_t>& cq,
                          const std::vector<int64_t>& ck, TensorView o) {
    try {
      attention_varlen(q.view(), k.view(), v.view(), cq, ck, o, nullptr, opt, ctx);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_STREQ(e.op(), "attention_varlen");
      EXPECT_STREQ(e.argument(), arg) << e.what();
    }
    EXPECT_EQ(out.bytes, before) << arg;
  };
  expect_error("cu_seqlens_q", {0, 4, 9}, {0, 6, 12}, out.view());         // does not end at 10
  expect_error("cu_seqlens_q", {1, 4, 10}, {0, 6, 12}, out.view());        // does not start at 0
  expect_error("cu_seqlens_q", {0, 6, 4, 10}, {0, 1, 6, 12}, out.view());  // decreasing
  expect_error("cu_seqlens_k", {0, 4, 10}, {0, 6}, out.view());            // count differs
  expect_error("cu_seqlens_k", {0, 4, 10}, {0, 13, 12}, out.view());       // decreasing
  TensorView bad = out.view();
  bad.shape[2] = 32;
  expect_error("out", {0, 4, 10}, {0, 6, 12}, bad);
  // The valid call runs.
  attention_varlen(q.view(), k.view(), v.view(), {0, 4, 10}, {0, 6, 12}, out.view(), nullptr, opt,
                   ctx);
  EXPECT_NE(out.bytes, before);
}

// ---- q / k RMSNorm + RoPE inside the one call (options.q_prologue / k_prologue) -------------

// A cross-attention problem with q's and k's own norms and tables.
struct NormRopeInputs {
  HostTensor q, k, v, wq, wk, tq, tk;
  Rope rq, rk;
  Prologue pq, pk;
  NormRopeInputs(int64_t B, int64_t Nq, int64_t Nkv, int64_t Hq, int64_t Hkv, int64_t D,
                 std::mt19937_64& rng)
      : q(DType::bf16, {B, Nq, Hq, D}),
        k(DType::bf16, {B, Nkv, Hkv, D}),
        v(DType::bf16, {B, Nkv, Hkv, D}),
        wq(DType::bf16, {D}),
        wk(DType::f32, {D}) {
    q.fill_normal(rng, 0.f, 3.f);
    k.fill_normal(rng, 0.5f, 2.f);
    v.fill_normal(rng);
    wq.fill_normal(rng, 1.f, 0.3f);
    wk.fill_normal(rng, 1.f, 0.3f);
    tq = harness::rope_table(B, Nq, D / 2, true, rng);    // 2 x 2, per batch item
    tk = harness::rope_table(1, Nkv, D / 4, false, rng);  // partial rotary
    rq = Rope{tq.view(), true};
    rk = Rope{tk.view(), false};
    pq.norm_weight = &wq_view;
    pk.norm_weight = &wk_view;
    wq_view = wq.view();
    wk_view = wk.view();
    pq.rope = &rq;
    pk.rope = &rk;
  }
  NormRopeInputs(const NormRopeInputs&) = delete;
  TensorView wq_view, wk_view;
};

TEST(Attention, OneCallNormRopeEqualsTheParts) {
  // attention() with q / k prologues gives the bits of the building blocks run by hand: q through
  // norm_rope_quantize (THREAD_Q 32, sm_scale folded), k through norm_rope_mean_quantize (THREAD_K
  // 64), V to fp8, attention_int8 with the K mean's LSE correction.
  auto rng = rng_for("Attention.OneCallNormRopeEqualsTheParts");
  const int64_t B = 2, Nq = 37, Nkv = 53, Hq = 4, Hkv = 2, D = 64;
  NormRopeInputs in(B, Nq, Nkv, Hq, Hkv, D, rng);
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16})
    for (auto causal : {AttentionOptions::none, AttentionOptions::bottom_right}) {
      AttentionOptions opt;
      opt.pv = pv;
      opt.causal = causal;
      opt.q_prologue = &in.pq;
      opt.k_prologue = &in.pk;
      Context ctx;
      HostTensor out(DType::bf16, {B, Nq, Hq, D}), lse(DType::f32, {B, Hq, Nq});
      TensorView lv = lse.view();
      attention(in.q.view(), in.k.view(), in.v.view(), out.view(), &lv, opt, ctx);

      HostTensor q8(DType::i8, {B, Nq, Hq, D}), k8(DType::i8, {B, Nkv, Hkv, D});
      HostTensor qs(DType::f32, {B, Hq, prologue_scale_count(Nq, ScaleLayout::thread_q, 32)});
      HostTensor ks(DType::f32, {B, Hkv, prologue_scale_count(Nkv, ScaleLayout::thread_k, 64)});
      HostTensor km(DType::f32, {B, Hkv, D});
      Prologue pq = in.pq, pk = in.pk;
      pq.sm_scale = 1.f / std::sqrt(static_cast<float>(D));
      pq.layout = ScaleLayout::thread_q;
      pq.block = 32;
      pk.layout = ScaleLayout::thread_k;
      pk.block = 64;
      norm_rope_quantize(in.q.view(), pq, q8.view(), qs.view(), ctx);
      norm_rope_mean_quantize(in.k.view(), pk, km.view(), k8.view(), ks.view(), ctx);
      const int64_t npad = (Nkv + 63) / 64 * 64;
      HostTensor v8(DType::e4m3, {B, Hkv, D, npad}), vs(DType::f32, {B, Hkv, D});
      const bool fp8 = pv == AttentionOptions::fp8;
      if (fp8) quantize_v_fp8(in.v.view(), v8.view(), vs.view(), nullptr, ctx);
      AttentionOptions inner;
      inner.pv = pv;
      inner.causal = causal;
      inner.sm_scale = 1.f;
      QuantizedRows qr{q8.view(), qs.view(), ScaleLayout::thread_q, 32};
      QuantizedRows kr{k8.view(), ks.view(), ScaleLayout::thread_k, 64};
      HostTensor ref(DType::bf16, {B, Nq, Hq, D}), ref_lse(DType::f32, {B, Hq, Nq});
      TensorView rl = ref_lse.view(), vsv = vs.view(), kmv = km.view();
      attention_int8(qr, kr, fp8 ? v8.view() : in.v.view(), fp8 ? &vsv : nullptr, nullptr, &kmv,
                     ref.view(), &rl, inner, ctx);
      EXPECT_TRUE(out.bytes == ref.bytes) << "pv " << pv << " causal " << causal;
      EXPECT_TRUE(lse.bytes == ref_lse.bytes) << "pv " << pv << " causal " << causal;
      // ... and not the bits of the call without them (the options are read).
      AttentionOptions plain = opt;
      plain.q_prologue = plain.k_prologue = nullptr;
      HostTensor other(DType::bf16, {B, Nq, Hq, D});
      attention(in.q.view(), in.k.view(), in.v.view(), other.view(), nullptr, plain, ctx);
      EXPECT_TRUE(other.bytes != out.bytes);
    }
}

TEST(Attention, OneCallNormRopeAccuracy) {
  // Against softmax(rope(norm(q)) rope(norm(k))ᵀ / sqrt(D)) V with the norm and rotation in fp64.
  auto rng = rng_for("Attention.OneCallNormRopeAccuracy");
  const int64_t B = 1, Nq = 129, Nkv = 200, Hq = 2, Hkv = 1, D = 128;
  NormRopeInputs in(B, Nq, Nkv, Hq, Hkv, D, rng);
  const HostTensor qr = harness::norm_rope_f64(in.q, &in.wq, nullptr, 1e-6, &in.tq, true);
  const HostTensor kr = harness::norm_rope_f64(in.k, &in.wk, nullptr, 1e-6, &in.tk, false);
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
    AttentionOptions opt;
    opt.pv = pv;
    opt.q_prologue = &in.pq;
    opt.k_prologue = &in.pk;
    Context ctx;
    HostTensor out(DType::bf16, {B, Nq, Hq, D});
    attention(in.q.view(), in.k.view(), in.v.view(), out.view(), nullptr, opt, ctx);
    std::vector<double> ref(static_cast<size_t>(out.numel()));
    HostTensor qv = qr, kv = kr;
    attention_reference_f64(qv.view(), kv.view(), in.v.view(), opt, ref.data(), nullptr);
    const Metrics m = metrics(out, ref);
    // The norm output's bf16 rounding (SPEC §1) adds ~2^-9 relative error to q and k.
    if (pv == AttentionOptions::fp8) {
      EXPECT_GE(m.cos, kFp8Cos) << m.rel_l1;
      EXPECT_LE(m.rel_l1, kFp8RelL1) << m.cos;
    } else {
      EXPECT_GE(m.cos, 0.9998) << m.rel_l1;
      EXPECT_LE(m.rel_l1, 0.02) << m.cos;
    }
  }
}

TEST(Attention, OneCallPrologueErrorsNameTheArgumentAndWriteNothing) {
  auto rng = rng_for("Attention.OneCallPrologueErrors");
  const int64_t B = 1, Nq = 20, Nkv = 30, Hq = 2, Hkv = 2, D = 64;
  NormRopeInputs in(B, Nq, Nkv, Hq, Hkv, D, rng);
  HostTensor out(DType::bf16, {B, Nq, Hq, D});
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, 7.f);
  const std::vector<uint8_t> before = out.bytes;
  Context ctx;
  auto expect_error = [&](const char* arg, const Prologue& pq, const Prologue& pk) {
    AttentionOptions opt;
    opt.q_prologue = &pq;
    opt.k_prologue = &pk;
    try {
      attention(in.q.view(), in.k.view(), in.v.view(), out.view(), nullptr, opt, ctx);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      EXPECT_STREQ(e.op(), "attention");
      EXPECT_STREQ(e.argument(), arg) << e.what();
    }
    EXPECT_EQ(out.bytes, before) << arg;
  };
  // q's table given to k: its token dim is Nq, not Nkv.
  Prologue pk = in.pk;
  pk.rope = &in.rq;
  expect_error("options.k_prologue.rope.table", in.pq, pk);
  Prologue pq = in.pq;
  TensorView w_short = in.wq.view();
  w_short.shape[0] = D / 2;
  pq.norm_weight = &w_short;
  expect_error("options.q_prologue.norm_weight", pq, in.pk);
  pq = in.pq;
  TensorView km = in.wk.view();
  pq.mean = &km;
  expect_error("options.q_prologue.mean", pq, in.pk);
  pq = in.pq;
  pq.sm_scale = 0.5f;
  expect_error("options.q_prologue.sm_scale", pq, in.pk);
  pk = in.pk;
  HostTensor rows(DType::i32, {Nkv});
  TensorView rv = rows.view();
  pk.weight_rows = &rv;  // with a (D) weight
  expect_error("options.k_prologue.weight_rows", in.pq, pk);
  // Segmented weights: an index past the weight's rows, in q's rows and in k's own.
  HostTensor w2(DType::f32, {2, D});
  w2.fill_normal(rng, 1.f, 0.3f);
  TensorView w2v = w2.view();
  HostTensor rq(DType::i32, {Nq}), rk(DType::i32, {Nkv});
  for (int64_t i = 0; i < Nq; ++i) rq.set(i, static_cast<float>(i % 2));
  for (int64_t i = 0; i < Nkv; ++i) rk.set(i, static_cast<float>(i % 2));
  TensorView rqv = rq.view(), rkv = rk.view();
  pq = in.pq;
  pk = in.pk;
  pq.norm_weight = pk.norm_weight = &w2v;
  pq.weight_rows = &rqv;
  pk.weight_rows = &rkv;
  rq.set(Nq - 1, 2.f);
  expect_error("options.q_prologue.weight_rows", pq, pk);
  rq.set(Nq - 1, 1.f);
  rk.set(3, -1.f);
  expect_error("options.k_prologue.weight_rows", pq, pk);
  // Unchecked (check_weight_rows false, the graph-capturable form): no error, each index out of
  // range takes the nearest row, as the same rows clamped by hand and checked.
  rq.set(Nq - 1, 2.f);
  pq.check_weight_rows = pk.check_weight_rows = false;
  AttentionOptions unchecked;
  unchecked.q_prologue = &pq;
  unchecked.k_prologue = &pk;
  HostTensor clamped_out(DType::bf16, {B, Nq, Hq, D});
  attention(in.q.view(), in.k.view(), in.v.view(), clamped_out.view(), nullptr, unchecked, ctx);
  rq.set(Nq - 1, 1.f);
  rk.set(3, 0.f);
  pq.check_weight_rows = pk.check_weight_rows = true;
  HostTensor by_hand(DType::bf16, {B, Nq, Hq, D});
  attention(in.q.view(), in.k.view(), in.v.view(), by_hand.view(), nullptr, unchecked, ctx);
  EXPECT_EQ(clamped_out.bytes, by_hand.bytes);
  // The valid call writes.
  AttentionOptions opt;
  opt.q_prologue = &in.pq;
  opt.k_prologue = &in.pk;
  attention(in.q.view(), in.k.view(), in.v.view(), out.view(), nullptr, opt, ctx);
  EXPECT_NE(out.bytes, before);
}

TEST(Attention, VarlenNormRopeEqualsEachSequenceAlone) {
  // Packed tables, with and without segmented weight rows: each sequence's bits equal attention()
  // on that sequence with its own rows of the table and of weight_rows. Sequences 3-5 (65
  // queries, 100 keys) run as one batch where there are no weight rows (the table as one of
  // (3, rows) rows).
  const std::vector<int64_t> cu_q = {0, 17, 17, 50, 115, 180, 245};
  const std::vector<int64_t> cu_k = {0, 33, 40, 40, 140, 240, 340};
  const int64_t Hq = 4, Hkv = 2, D = 64, Tq = cu_q.back(), Tk = cu_k.back();
  auto rng = rng_for("Attention.VarlenNormRopeEqualsEachSequenceAlone");
  HostTensor q(DType::bf16, {Tq, Hq, D}), k(DType::bf16, {Tk, Hkv, D}),
      v(DType::bf16, {Tk, Hkv, D});
  q.fill_normal(rng, 0.f, 2.f);
  k.fill_normal(rng, 0.5f, 2.f);
  v.fill_normal(rng);
  HostTensor w(DType::bf16, {2, D}), rows_q(DType::i32, {Tq}), rows_k(DType::i32, {Tk});
  w.fill_normal(rng, 1.f, 0.3f);
  for (int64_t i = 0; i < Tq; ++i) rows_q.set(i, static_cast<float>(i % 3 == 0));
  for (int64_t i = 0; i < Tk; ++i) rows_k.set(i, static_cast<float>(i % 5 == 0));
  HostTensor tq = harness::rope_table(1, Tq, D / 2, false, rng);
  HostTensor tk = harness::rope_table(1, Tk, D / 2, false, rng);
  TensorView wv = w.view(), rqv = rows_q.view(), rkv = rows_k.view();
  Rope rq{tq.view(), false}, rk{tk.view(), true};
  Prologue pq, pk;
  pq.norm_weight = pk.norm_weight = &wv;
  pq.weight_rows = &rqv;
  pk.weight_rows = &rkv;
  pq.rope = &rq;
  pk.rope = &rk;
  AttentionOptions opt;
  opt.causal = AttentionOptions::bottom_right;
  opt.q_prologue = &pq;
  opt.k_prologue = &pk;
  HostTensor out(DType::bf16, {Tq, Hq, D});
  Context ctx;
  HostTensor w1(DType::bf16, {D});  // (the first row of w)
  for (int64_t i = 0; i < D; ++i) w1.set(i, w.get(i));
  TensorView w1v = w1.view();
  for (bool segmented : {true, false}) {
    SCOPED_TRACE(segmented ? "segmented weights" : "one weight");
    pq.weight_rows = segmented ? &rqv : nullptr;
    pk.weight_rows = segmented ? &rkv : nullptr;
    pq.norm_weight = pk.norm_weight = segmented ? &wv : &w1v;
    attention_varlen(q.view(), k.view(), v.view(), cu_q, cu_k, out.view(), nullptr, opt, ctx);
    for (size_t s = 0; s + 1 < cu_q.size(); ++s) {
      const int64_t q0 = cu_q[s], q1 = cu_q[s + 1], k0 = cu_k[s], k1 = cu_k[s + 1];
      if (q1 == q0) continue;
      HostTensor qs = rows_of(q, q0, q1), ks = rows_of(k, k0, k1), vs = rows_of(v, k0, k1);
      auto table_rows = [&](const HostTensor& t, int64_t r0, int64_t r1) {
        HostTensor r(DType::f32, {1, r1 - r0, 1, D / 2, 2});
        for (int64_t i = 0; i < r.numel(); ++i) r.set(i, t.get(r0 * D + i));
        return r;
      };
      auto index_rows = [&](const HostTensor& t, int64_t r0, int64_t r1) {
        HostTensor r(DType::i32, {r1 - r0});
        for (int64_t i = 0; i < r1 - r0; ++i) r.set(i, t.get(r0 + i));
        return r;
      };
      HostTensor tqs = table_rows(tq, q0, q1), tks = table_rows(tk, k0, k1);
      HostTensor rqs = index_rows(rows_q, q0, q1), rks = index_rows(rows_k, k0, k1);
      TensorView rqsv = rqs.view(), rksv = rks.view();
      Rope rqs_r{tqs.view(), false}, rks_r{tks.view(), true};
      Prologue sq = pq, sk = pk;
      sq.rope = &rqs_r;
      sk.rope = &rks_r;
      sq.weight_rows = segmented ? &rqsv : nullptr;
      sk.weight_rows = segmented ? &rksv : nullptr;
      AttentionOptions o = opt;
      o.q_prologue = &sq;
      o.k_prologue = &sk;
      HostTensor got(DType::bf16, {1, q1 - q0, Hq, D});
      attention(qs.view(), ks.view(), vs.view(), got.view(), nullptr, o, ctx);
      for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_EQ(got.get(i), out.get(q0 * Hq * D + i)) << "sequence " << s << " element " << i;
    }
  }
  // A table over the wrong token count names the argument.
  HostTensor wrong = harness::rope_table(1, Tq + 1, D / 2, false, rng);
  Rope rw{wrong.view(), false};
  Prologue bad = pq;
  bad.rope = &rw;
  AttentionOptions ob = opt;
  ob.q_prologue = &bad;
  try {
    attention_varlen(q.view(), k.view(), v.view(), cu_q, cu_k, out.view(), nullptr, ob, ctx);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.op(), "attention_varlen");
    EXPECT_STREQ(e.argument(), "options.q_prologue.rope.table") << e.what();
  }
}

}  // namespace
}  // namespace lowbit
