// Core rows of `lowbit bench`: the machine's copy bandwidth and bf16 GEMM rate (the ceilings
// every other row is read against), and dtype conversion against a copy of the same bytes.
#include <cmath>

#include "bench/bench.h"
#include "lowbit/core.h"

namespace lowbit {
namespace bench {
namespace {

class Baselines : public BenchCase {
 public:
  std::string name() const override { return "core.baselines"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    Row copy;
    copy.family = "core";
    copy.op = "copy (read + write)";
    double bytes = env.device == Device::cuda ? 2e9 : (env.quick ? 5e7 : 2e8);
    copy.shape = std::to_string(static_cast<int64_t>(bytes / 1e6)) + " MB";
    copy.backend = device_name(env.device);
    copy.ms = env.copy_ms(bytes);
    copy.bytes = 2 * bytes;
    copy.note = "ceiling for memory-bound rows";
    rows.push_back(copy);
    if (env.device == Device::cuda) {
      for (int64_t s : {8192}) {
        Row g;
        g.family = "core";
        g.op = "cuBLASLt bf16 GEMM";
        g.shape = std::to_string(s) + "x" + std::to_string(s) + "x" + std::to_string(s);
        g.backend = "cuda";
        g.ms = env.bf16_gemm_ms(s, s, s, false);
        g.flops = 2.0 * s * s * s;
        g.note = "ceiling for matrix rows";
        rows.push_back(g);
      }
    }
    return rows;
  }
};

class ConvertBench : public BenchCase {
 public:
  std::string name() const override { return "core.convert"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    int64_t n = env.device == Device::cuda ? (int64_t{1} << 28) : (env.quick ? 1 << 20 : 1 << 23);
    DeviceTensor src = make_tensor(env.device, DType::f32, {n}, 7);
    for (DType d : {DType::bf16, DType::e4m3}) {
      DeviceTensor dst = make_empty(env.device, d, {n});
      Context ctx = env.ctx;
      Row r;
      r.family = "core";
      r.op = std::string("convert f32 -> ") + dtype_name(d);
      r.shape = "(" + std::to_string(n) + ",)";
      r.backend = device_name(env.device);
      r.ms = env.time_ms([&] { convert(src.view, dst.view, ctx); });
      r.bytes = static_cast<double>(n) * (4 + dtype_bits(d) / 8);
      r.baseline = "copy";
      r.baseline_ms = env.copy_ms(r.bytes / 2);
      // Accuracy: relative error of the rounded values against the fp32 input.
      std::vector<float> in = to_host_f32(src.view), out = to_host_f32(dst.view);
      std::vector<double> ref(in.begin(), in.end());
      r.accuracy = accuracy(out, ref).str();
      rows.push_back(r);
    }
    return rows;
  }
};

LOWBIT_BENCH_CASES(core_bench_cases) {
  cases.push_back(std::make_unique<Baselines>());
  cases.push_back(std::make_unique<ConvertBench>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
