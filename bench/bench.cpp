#include "bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <random>
#include <regex>
#include <sstream>

#include "lowbit/runtime.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace bench {

#ifdef LOWBIT_WITH_CUDA
// bench/cuda_timing.cu
double cuda_time_ms(const Context& ctx, int warmup, int iters, const std::function<void()>& fn);
double cuda_bf16_gemm_ms(const Env& env, int64_t m, int64_t n, int64_t k, bool bias);
#endif

std::vector<std::unique_ptr<BenchCase>>& registry() {
  static std::vector<std::unique_ptr<BenchCase>> cases;
  return cases;
}
Registrar::Registrar(void (*fn)(std::vector<std::unique_ptr<BenchCase>>&)) { fn(registry()); }

double Env::time_ms(const std::function<void()>& fn) const {
#ifdef LOWBIT_WITH_CUDA
  if (device == Device::cuda) return cuda_time_ms(ctx, warmup, iters, fn);
#endif
  for (int i = 0; i < std::max(1, warmup / 2); ++i) fn();
  std::vector<double> t;
  int n = std::max(3, iters / 3);
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

bool Env::shape_selected(const std::string& shape) const {
  return shape_filter.empty() || std::regex_search(shape, std::regex(shape_filter));
}

double Env::copy_ms(double bytes) const {
  size_t n = static_cast<size_t>(bytes);
  Buffer a(device, n), b(device, n);
  if (device == Device::cuda) {
    device_memset(a.data(), 1, n, ctx);
    return time_ms([&] { copy_device_to_device(b.data(), a.data(), n, ctx); });
  }
  std::memset(a.data(), 1, n);
  return time_ms([&] { std::memcpy(b.data(), a.data(), n); });
}

double Env::copy_gbps() const {
  static double cached[2] = {0, 0};
  double& c = cached[device == Device::cuda];
  if (c == 0) {
    double bytes = device == Device::cuda ? 2e9 : 2e8;
    c = 2 * bytes / (copy_ms(bytes) * 1e-3) / 1e9;
  }
  return c;
}

double Env::bf16_gemm_ms(int64_t m, int64_t n, int64_t k, bool bias) const {
#ifdef LOWBIT_WITH_CUDA
  if (device == Device::cuda) return cuda_bf16_gemm_ms(*this, m, n, k, bias);
#endif
  return 0;
}

DeviceTensor make_empty(Device device, DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  size_t bytes = static_cast<size_t>(dtype_storage_bytes(dtype, n));
  void* p = bytes ? (device == Device::cuda ? device_alloc(bytes) : std::malloc(bytes)) : nullptr;
  DeviceTensor t;
  t.mem = std::shared_ptr<void>(p, [device](void* q) {
    if (!q) return;
    if (device == Device::cuda) device_free(q);
    else std::free(q);
  });
  t.view = make_view(p, dtype, static_cast<int>(shape.size()), shape.data(), device);
  return t;
}

DeviceTensor make_tensor(Device device, DType dtype, std::vector<int64_t> shape, uint64_t seed,
                         float stddev) {
  harness::HostTensor h(dtype, shape);
  std::mt19937_64 rng(seed);
  if (dtype == DType::i8 || dtype == DType::u8 || dtype == DType::i32 || dtype_is_packed(dtype))
    h.fill_random_bytes(rng);
  else
    h.fill_normal(rng, 0.f, stddev);
  DeviceTensor t = make_empty(device, dtype, shape);
  Context ctx;
  if (device == Device::cuda) copy_to_device(t.view.data, h.bytes.data(), h.bytes.size(), ctx);
  else if (!h.bytes.empty()) std::memcpy(t.view.data, h.bytes.data(), h.bytes.size());
  return t;
}

std::vector<float> to_host_f32(const TensorView& t) {
  harness::HostTensor h(t.dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim));
  Context ctx;
  if (t.device == Device::cuda) copy_to_host(h.bytes.data(), t.data, h.bytes.size(), ctx);
  else std::memcpy(h.bytes.data(), t.data, h.bytes.size());
  std::vector<float> out(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) out[i] = h.get(i);
  return out;
}

size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

Accuracy accuracy(const std::vector<float>& got, const std::vector<double>& ref) {
  Accuracy a;
  double dot = 0, ng = 0, nr = 0, l1 = 0, l1r = 0, l2 = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    double g = got[i], r = ref[i], d = g - r;
    dot += g * r;
    ng += g * g;
    nr += r * r;
    l1 += std::fabs(d);
    l1r += std::fabs(r);
    l2 += d * d;
    a.max_abs = std::max(a.max_abs, std::fabs(d));
  }
  a.cos = (ng > 0 && nr > 0) ? dot / std::sqrt(ng * nr) : (ng == nr ? 1 : 0);
  a.rel_l1 = l1r > 0 ? l1 / l1r : l1;
  a.rel_l2 = nr > 0 ? std::sqrt(l2 / nr) : std::sqrt(l2);
  return a;
}

std::string Accuracy::str() const {
  std::ostringstream s;
  s.precision(5);
  s << "cos " << std::fixed << cos << ", rel L1 " << std::setprecision(4) << rel_l1;
  return s.str();
}

}  // namespace bench
}  // namespace lowbit
