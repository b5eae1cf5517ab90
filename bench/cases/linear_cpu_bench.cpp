// CPU rows of the ConvRot family: weight quantization throughput (what `lowbit quantize` spends
// its time on, issue 5 targets: convrot8 >= 100 M weights/s, convrotint4 >= 20 M weights/s) and
// the per-qtype relative weight error on a generated DiT-like layer with outlier channels.
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "lowbit/linear.h"

namespace lowbit {
namespace bench {
namespace {

// A DiT-like projection weight (O, K): N(0, 0.02) entries, 1 % of the input channels scaled by
// 10..40 (the outlier channels activations-smoothing and rotations exist for), and a few rows
// with 4x the norm.
std::vector<float> dit_like_weight(int64_t O, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 0.02f);
  std::uniform_real_distribution<float> u(10.f, 40.f);
  std::vector<float> col_gain(static_cast<size_t>(K), 1.f), w(static_cast<size_t>(O * K));
  for (int64_t k = 0; k < K; ++k)
    if (rng() % 100 == 0) col_gain[k] = u(rng);
  for (int64_t o = 0; o < O; ++o) {
    float row_gain = (rng() % 64 == 0) ? 4.f : 1.f;
    for (int64_t k = 0; k < K; ++k) w[o * K + k] = n(rng) * col_gain[k] * row_gain;
  }
  return w;
}

double rel_error(const std::vector<float>& w, const std::vector<float>& d) {
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    double e = static_cast<double>(w[i]) - d[i];
    num += e * e;
    den += static_cast<double>(w[i]) * w[i];
  }
  return std::sqrt(num / den);
}

double process_cpu_s() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::string fmt_rate(double weights_per_s) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f M weights/s", weights_per_s / 1e6);
  return buf;
}

int thread_count_hint(const Context& ctx) {
  if (ctx.cpu_threads > 0) return ctx.cpu_threads;
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

class QuantizeThroughput : public BenchCase {
 public:
  std::string name() const override { return "linear.cpu.quantize"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cpu) return rows;
    struct Item {
      QType q;
      int64_t O, K;
      double target;
    } items[] = {{QType::convrot8, 1024, 3072, 100e6},
                 {QType::convrot_int4, 512, 3072, 20e6},
                 {QType::convrot_fp8, 1024, 3072, 0},
                 {QType::convrot4, 512, 3072, 0}};
    for (const Item& it : items) {
      std::vector<float> w = dit_like_weight(it.O, it.K, 5);
      TensorView wv = make_view(w.data(), DType::f32, {it.O, it.K});
      Context ctx = env.ctx;
      Row r;
      r.family = "linear";
      r.op = std::string("quantize_weight ") + qtype_name(it.q) + " (rotate+pack)";
      r.shape = "(" + std::to_string(it.O) + ", " + std::to_string(it.K) + ") f32";
      r.backend = "cpu";
      PackedWeight p;
      r.ms = env.time_ms([&] { p = quantize_weight(wv, it.q, ctx); });
      r.bytes = static_cast<double>(w.size()) * 4 + static_cast<double>(p.storage_bytes());
      r.baseline = "copy of the f32 weight";
      r.baseline_ms = env.copy_ms(static_cast<double>(w.size()) * 4);
      std::vector<float> d(w.size());
      dequantize_weight(p, make_view(d.data(), DType::f32, {it.O, it.K}), false, ctx);
      char acc[64];
      std::snprintf(acc, sizeof(acc), "rel weight err %.4f", rel_error(w, d));
      r.accuracy = acc;
      // Wall-clock rate (the row's time) and the rate per CPU-second, which does not depend on
      // how many other processes share the cores (this machine is shared).
      double rate = static_cast<double>(w.size()) / (r.ms * 1e-3);
      const int reps = 3;
      double c0 = process_cpu_s();
      for (int i = 0; i < reps; ++i) p = quantize_weight(wv, it.q, ctx);
      double cpu_rate = static_cast<double>(w.size()) * reps / (process_cpu_s() - c0);
      double load[1] = {0};
      getloadavg(load, 1);
      char note[160];
      std::snprintf(note, sizeof(note), "wall %.1f M w/s at load %.1f; %.1f M w per CPU-s",
                    rate / 1e6, load[0], cpu_rate / 1e6);
      r.note = note;
      if (it.target > 0) {
        r.note += (rate >= it.target ? "; target met (wall)"
                   : cpu_rate * thread_count_hint(ctx) >= it.target
                       ? "; target met per CPU-s x threads, not wall (shared cores)"
                       : "; BELOW target");
        r.note += " " + fmt_rate(it.target);
      }
      rows.push_back(r);
    }
    return rows;
  }
};

class WeightErrorTable : public BenchCase {
 public:
  std::string name() const override { return "linear.cpu.weight_error"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cpu) return rows;
    const int64_t O = 512, K = 3072;
    std::vector<float> w = dit_like_weight(O, K, 11), d(w.size());
    Context ctx = env.ctx;
    for (int i = 0; i < kNumQTypes; ++i) {
      QType q = static_cast<QType>(i);
      Row r;
      r.family = "linear";
      r.op = std::string("weight error ") + qtype_name(q);
      r.shape = "DiT-like (512, 3072), 1% outlier ch.";
      r.backend = "cpu";
      auto t0 = std::chrono::steady_clock::now();
      PackedWeight p = quantize_weight(make_view(w.data(), DType::f32, {O, K}), q, ctx);
      auto t1 = std::chrono::steady_clock::now();
      r.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      dequantize_weight(p, make_view(d.data(), DType::f32, {O, K}), false, ctx);
      char acc[96];
      std::snprintf(acc, sizeof(acc), "rel weight err %.5f", rel_error(w, d));
      r.accuracy = acc;
      char note[96];
      std::snprintf(note, sizeof(note), "%.2f bits/weight; one run",
                    8.0 * static_cast<double>(p.storage_bytes()) / static_cast<double>(O * K));
      r.note = note;
      rows.push_back(r);
    }
    return rows;
  }
};

LOWBIT_BENCH_CASES(linear_cpu_bench_cases) {
  cases.push_back(std::make_unique<QuantizeThroughput>());
  cases.push_back(std::make_unique<WeightErrorTable>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
