// The harness's second look at a failed `close` comparison (accept_rows_as_accurate), and the
// exact references the attention cases give it (Case::exact_output).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {
namespace {

// 8 rows of 4: the oracle's values 1 + i / 32, the exact reference 0.1 above each.
struct Rows {
  OutputSpec spec;
  HostTensor ref{DType::f32, {8, 4}}, got{DType::f32, {8, 4}};
  std::vector<double> exact = std::vector<double>(32);
  int calls = 0;
  Rows() {
    spec.name = "out";
    spec.shape = {8, 4};
    spec.tol = Tolerance::allclose(1e-3, 0);
    for (int i = 0; i < 32; ++i) {
      ref.set(i, 1.f + i / 32.f);
      got.set(i, ref.get(i));
      exact[static_cast<size_t>(i)] = ref.get(i) + 0.1;
    }
  }
  std::string judge() {
    const std::string diff = compare(spec, ref, got);
    if (diff.empty()) return diff;
    return accept_rows_as_accurate(diff, spec, ref, got, 4, [&] {
      ++calls;
      return exact;
    });
  }
};

TEST(HarnessAccuracy, RowsAsAccurateAsTheOracleAreAccepted) {
  Rows r;
  r.got.set(5, r.ref.get(5) + 0.15f);   // row 1: 0.05 past the reference instead of 0.1 short
  r.got.set(6, r.ref.get(6) - 0.05f);   // row 1: 0.15 short (the row's error 0.21 <= 1.5 x 0.2)
  r.got.set(30, r.ref.get(30) + 0.1f);  // row 7: exact there
  EXPECT_EQ(r.judge(), "");
  EXPECT_EQ(r.calls, 1);
}

TEST(HarnessAccuracy, LessAccurateRowsAreReported) {
  Rows r;
  r.got.set(9, r.ref.get(9) - 0.5f);  // row 2: 0.6 short in one element
  const std::string d = r.judge();
  EXPECT_NE(d.find("1 of 32 elements differ"), std::string::npos) << d;
  EXPECT_NE(d.find("row 2: error against the exact reference"), std::string::npos) << d;
}

TEST(HarnessAccuracy, ManyRowsAreNotJudgedByAccuracy) {
  Rows r;
  for (int row : {0, 3, 6}) r.got.set(4 * row, r.ref.get(4 * row) + 0.1f);  // 3 rows > max 2
  const std::string d = r.judge();
  EXPECT_NE(d.find("3 of 8 rows; at most 2"), std::string::npos) << d;
  EXPECT_EQ(r.calls, 0);  // the reference is not computed
}

TEST(HarnessAccuracy, NonFiniteOrMissingReferenceKeepsTheFailure) {
  Rows r;
  r.got.set(3, std::numeric_limits<float>::quiet_NaN());
  const std::string d = r.judge();
  EXPECT_FALSE(d.empty());
  EXPECT_EQ(r.calls, 0);
  Rows e;
  e.got.set(3, e.ref.get(3) + 0.1f);
  e.exact.clear();  // the case has no exact reference
  EXPECT_FALSE(e.judge().empty());
}

// Runs a registered case on the CPU; its outputs.
std::vector<HostTensor> run_cpu(const Case& c, std::vector<HostTensor>& in) {
  std::vector<TensorView> iv, ov;
  for (auto& t : in) iv.push_back(t.view());
  std::vector<HostTensor> out;
  for (const OutputSpec& s : c.outputs()) out.emplace_back(s.dtype, s.shape);
  for (auto& t : out) ov.push_back(t.view());
  Context ctx;
  c.run(iv, ov, ctx);
  return out;
}

// Every attention case class's exact reference describes its `out`: the oracle lies within its
// quantization error of it (a transposed layout, a wrong scale row or sequence offset would not).
TEST(HarnessAccuracy, AttentionExactReferencesMatchTheOracle) {
  const std::vector<std::string> names = {
      "attention.int8.fp8.causal_br.b2.nq127.nkv127.hq4.hkv2.d128.bf16",
      "attention.int8.f16.full.b1.nq65.nkv300.hq3.hkv1.d128.bf16",
      "attention.varlen.fp8.causal_br.d128",
      "attention.varlen.f16.full.d64",
  };
  int found = 0, hnd = 0, call = 0;
  for (const auto& c : registry()) {
    const std::string n = c->name();
    const bool pick =
        std::find(names.begin(), names.end(), n) != names.end() ||
        (hnd == 0 && n.find(".hnd") != std::string::npos && n.rfind("attention.int8.fp8", 0) == 0 &&
         n.find(".thread_qk") != std::string::npos) ||
        (call == 0 && n.rfind("attention.call.fp8.causal_br", 0) == 0);
    if (!pick) continue;
    if (n.find(".hnd") != std::string::npos) ++hnd;
    if (n.rfind("attention.call.", 0) == 0) ++call;
    ++found;
    std::mt19937_64 rng(case_seed(n));
    std::vector<HostTensor> in = c->make_inputs(rng);
    const std::vector<HostTensor> out = run_cpu(*c, in);
    const std::vector<double> x = c->exact_output(0, in);
    ASSERT_EQ(static_cast<int64_t>(x.size()), out[0].numel()) << n;
    EXPECT_TRUE(c->exact_output(1, in).empty()) << n;  // the LSE has none
    double e = 0, nx = 0;
    for (int64_t i = 0; i < out[0].numel(); ++i) {
      const double d = out[0].get(i) - x[static_cast<size_t>(i)];
      e += d * d;
      nx += x[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
    }
    const double rel = std::sqrt(e / nx);
    // fp8 P·V: ~0.04 (SPEC §2's format bound); 16-bit: ~0.01
    EXPECT_LT(rel, n.find(".fp8.") != std::string::npos ? 0.08 : 0.03) << n;
    EXPECT_GT(nx, 0) << n;
  }
  EXPECT_EQ(found, static_cast<int>(names.size()) + 2);
  EXPECT_EQ(hnd, 1);
  EXPECT_EQ(call, 1);
}

// The harness's normal generator (normal_floats / fill_normal: the ziggurat) against N(0, 1) on
// 4M draws: mean, variance, kurtosis, the CDF at 25 points (within 0.0015, a Kolmogorov-Smirnov
// distance ~1.4 / sqrt(N) above chance), both tails beyond 3 and 4 sigma, no value beyond 7;
// the same seed gives the same values; mean and stddev map the values.
TEST(HarnessInputs, NormalFloatsAreStandardNormal) {
  std::mt19937_64 rng(case_seed("HarnessInputs.NormalFloatsAreStandardNormal"));
  std::mt19937_64 again = rng;
  const int64_t n = 4 << 20;
  const std::vector<float> x = normal_floats(rng, n);
  EXPECT_EQ(normal_floats(again, n), x);
  double s1 = 0, s2 = 0, s4 = 0;
  int64_t beyond3 = 0, beyond4 = 0;
  float biggest = 0;
  for (float v : x) {
    s1 += v;
    s2 += double(v) * v;
    s4 += double(v) * v * v * v;
    beyond3 += std::fabs(v) > 3.f;
    beyond4 += std::fabs(v) > 4.f;
    biggest = std::max(biggest, std::fabs(v));
  }
  const double mean = s1 / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
  EXPECT_NEAR(mean, 0.0, 0.003);
  EXPECT_NEAR(var, 1.0, 0.004);
  EXPECT_NEAR(kurt, 3.0, 0.03);
  EXPECT_NEAR(double(beyond3) / n, 0.0026998, 0.00025);  // 2 (1 - Phi(3))
  EXPECT_NEAR(double(beyond4) / n, 6.334e-5, 2.5e-5);     // 2 (1 - Phi(4))
  EXPECT_LT(biggest, 7.f);
  std::vector<float> sorted = x;
  std::sort(sorted.begin(), sorted.end());
  for (int k = -12; k <= 12; ++k) {
    const double t = k * 0.25;
    const double want = 0.5 * std::erfc(-t / std::sqrt(2.0));
    const double got =
        double(std::upper_bound(sorted.begin(), sorted.end(), float(t)) - sorted.begin()) / n;
    EXPECT_NEAR(got, want, 0.0015) << "CDF at " << t;
  }
  std::mt19937_64 r2(7), r3(7);
  const std::vector<float> a = normal_floats(r2, 1000), b = normal_floats(r3, 1000, 2.f, 0.5f);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], 2.f + 0.5f * a[i]);
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
