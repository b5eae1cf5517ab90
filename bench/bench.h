// Benchmark harness (STYLE habit 8): device-event timing (warm-up, median of many runs, L2
// flushed between runs), host timing on the CPU backend, and the baselines every table carries:
// copy bandwidth and cuBLASLt's bf16 GEMM.
//
// Adding rows: in any file of bench/cases/, write
//   LOWBIT_BENCH_CASES(my_family_bench) { cases.push_back(std::make_unique<MyBench>()); }
// A BenchCase produces rows; each row is one op at one shape against its baseline.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/tensor.h"

namespace lowbit {
namespace bench {

struct Row {
  std::string family;     // "core", "prologue", "attention", "linear", "decode"
  std::string op;         // what lowbit ran, e.g. "norm_rope_quantize q (THREAD_Q)"
  std::string shape;      // e.g. "(1, 32760, 40, 128) bf16"
  std::string backend;    // "cuda" / "cpu"
  double ms = 0;          // median time of lowbit's op
  std::string baseline;   // e.g. "copy", "cuBLASLt bf16 GEMM", "unfused lowbit steps"
  double baseline_ms = 0; // median time of the baseline on the same shape, same run (0 = none)
  double bytes = 0;       // minimal bytes the op must move (problem-counted)
  double flops = 0;       // operations of the problem (counted from the shape)
  std::string accuracy;   // e.g. "cos 0.99953, rel L1 0.0121" or "bit-exact"
  std::string note;
  double speedup() const { return baseline_ms > 0 && ms > 0 ? baseline_ms / ms : 0; }
  double gbps() const { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }
  double tflops() const { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0; }
};

struct Env {
  Device device = Device::cpu;
  Context ctx;
  bool quick = false;    // smaller shapes / fewer iterations (CI smoke runs)
  int warmup = 5;
  int iters = 30;
  // `lowbit bench --shape REGEX`: a case runs only the shapes whose row shape string (Row::shape,
  // e.g. "(1, 24, 4096, 64) bf16") this regular expression finds; empty = every shape.
  std::string shape_filter;
  bool shape_selected(const std::string& shape) const;
  // Median time of fn in milliseconds: device events around each call on CUDA (with an L2 flush
  // before each timed call), the host clock on the CPU.
  double time_ms(const std::function<void()>& fn) const;
  // Baselines measured in this run.
  double copy_ms(double bytes) const;  // device-to-device (or host memcpy) copy of `bytes`
  // bf16 GEMM out(M, N) = a(M, K) b(K, N) [+ bias], cuBLASLt on CUDA; 0 when unavailable.
  double bf16_gemm_ms(int64_t m, int64_t n, int64_t k, bool bias) const;
  // Copy bandwidth in GB/s counting bytes read plus written (cached per run).
  double copy_gbps() const;
};

class BenchCase {
 public:
  virtual ~BenchCase() = default;
  virtual std::string name() const = 0;  // "prologue.wan", "core.convert" ...
  virtual std::vector<Row> run(const Env& env) = 0;
};

std::vector<std::unique_ptr<BenchCase>>& registry();
struct Registrar {
  explicit Registrar(void (*fn)(std::vector<std::unique_ptr<BenchCase>>&));
};
#define LOWBIT_BENCH_CASES(fn)                                                    \
  static void fn(std::vector<std::unique_ptr<::lowbit::bench::BenchCase>>& cases); \
  static ::lowbit::bench::Registrar fn##_registrar_(&fn);                          \
  static void fn(std::vector<std::unique_ptr<::lowbit::bench::BenchCase>>& cases)

// Device buffer helpers for bench cases (random fill happens on the host, then one copy).
struct DeviceTensor {
  std::shared_ptr<void> mem;  // freed with the last copy
  TensorView view;
};
DeviceTensor make_tensor(Device device, DType dtype, std::vector<int64_t> shape, uint64_t seed,
                         float stddev = 1.f);
DeviceTensor make_empty(Device device, DType dtype, std::vector<int64_t> shape);
// Host copy of a tensor as fp32 (any dtype).
std::vector<float> to_host_f32(const TensorView& t);
// How many elements of a and b (the same size) differ in their fp32 bits.
size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b);

// CUDA builds: one launch of an empty kernel on ctx's stream (with the programmatic-dependent-
// launch attribute through cudaLaunchKernelEx when pdl): the host's launch floor.
void launch_empty_kernel(const Context& ctx, bool pdl);

// Accuracy figures against a reference.
struct Accuracy {
  double cos = 0, rel_l1 = 0, rel_l2 = 0, max_abs = 0;
  std::string str() const;
};
Accuracy accuracy(const std::vector<float>& got, const std::vector<double>& ref);

}  // namespace bench
}  // namespace lowbit
