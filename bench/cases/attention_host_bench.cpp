// `lowbit bench` family attention.host (CUDA only): the host's time per attention() call and per
// piece, against the GPU's time for the same call. An eager caller (PyTorch without graphs) waits
// on whichever is longer, so a row with host > GPU is host-bound at that shape.
//
// Host time: the stream is held by a host function (cudaLaunchHostFunc) while kCalls calls are
// queued behind it, so the clock sees only the host's work (checks, launches, events, the
// workspace's stream-ordered allocation), none of the GPU's; median of kReps such batches. GPU
// time: env.time_ms (device events, L2 flushed). Floor rows: one launch of an empty kernel.
// Shapes: a small one, (1, 8, 256, 128), where the host matters, and Flux's (1, 24, 4608, 128).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "bench/bench.h"
#include "lowbit/attention.h"
#include "lowbit/prologue.h"
#include "lowbit/runtime.h"

namespace lowbit {
namespace bench {
namespace {

#ifdef LOWBIT_WITH_CUDA
constexpr int kCalls = 16, kReps = 7;

void hold_until_open(void* gate) {
  const auto t0 = std::chrono::steady_clock::now();
  auto* g = static_cast<std::atomic<bool>*>(gate);
  while (!g->load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    std::this_thread::yield();
}

// Milliseconds of host time per call of fn, queued behind a held stream.
double host_ms(const Context& ctx, const std::function<void()>& fn) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.cuda_stream);
  for (int i = 0; i < 3; ++i) fn();  // first-use setup out of the way
  synchronize(ctx);
  std::vector<double> per_call;
  for (int rep = 0; rep < kReps; ++rep) {
    std::atomic<bool> gate{false};
    if (cudaLaunchHostFunc(s, hold_until_open, &gate) != cudaSuccess)
      throw Error("bench attention.host", "stream", "cudaLaunchHostFunc failed");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) fn();
    const auto t1 = std::chrono::steady_clock::now();
    gate = true;
    synchronize(ctx);
    per_call.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / kCalls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

struct Shape {
  int64_t B, H, N, D;
};

class AttentionHostBench : public BenchCase {
 public:
  std::string name() const override { return "attention.host"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    for (const Shape& s : {Shape{1, 8, 256, 128}, Shape{1, 24, 4608, 128}}) {
      const std::string shape = "(" + std::to_string(s.B) + ", " + std::to_string(s.H) + ", " +
                                std::to_string(s.N) + ", " + std::to_string(s.D) + ") bf16";
      if (!env.shape_selected(shape)) continue;
      run_shape(env, s, shape, rows);
    }
    return rows;
  }

 private:
  static void run_shape(const Env& env, const Shape& s, const std::string& shape,
                        std::vector<Row>& rows) {
    const int64_t B = s.B, H = s.H, N = s.N, D = s.D;
    const Device dev = Device::cuda;
    Context ctx = env.ctx;
    DeviceTensor q = make_tensor(dev, DType::bf16, {B, N, H, D}, 1);
    DeviceTensor k = make_tensor(dev, DType::bf16, {B, N, H, D}, 2);
    DeviceTensor v = make_tensor(dev, DType::bf16, {B, N, H, D}, 3);
    DeviceTensor out = make_empty(dev, DType::bf16, {B, N, H, D});
    AttentionOptions opt;  // fp8 P.V, K smoothing: the default one call
    const size_t ws_bytes = attention_workspace_bytes(q.view, k.view, opt);
    DeviceTensor ws = make_empty(dev, DType::u8, {static_cast<int64_t>(ws_bytes)});
    // The pieces, on their own buffers (the layouts attention() uses).
    const int64_t nqs = scale_count(ScaleLayout::thread_q, 32, N);
    const int64_t nks = scale_count(ScaleLayout::thread_k, 64, N);
    DeviceTensor q8 = make_empty(dev, DType::i8, {B, N, H, D});
    DeviceTensor k8 = make_empty(dev, DType::i8, {B, N, H, D});
    DeviceTensor qs = make_empty(dev, DType::f32, {B, H, nqs});
    DeviceTensor ks = make_empty(dev, DType::f32, {B, H, nks});
    DeviceTensor km = make_empty(dev, DType::f32, {B, H, D});
    DeviceTensor v8 = make_empty(dev, DType::e4m3, {B, H, D, (N + 63) / 64 * 64});
    DeviceTensor vs = make_empty(dev, DType::f32, {B, H, D});
    TensorView kmv = km.view, vsv = vs.view, o_view = out.view;
    Prologue qp;
    qp.sm_scale = 1.f / std::sqrt(static_cast<float>(D));
    qp.layout = ScaleLayout::thread_q;
    qp.block = 32;
    Prologue kp;
    kp.layout = ScaleLayout::thread_k;
    kp.block = 64;
    QuantizedRows qr{q8.view, qs.view, ScaleLayout::thread_q, 32};
    QuantizedRows kr{k8.view, ks.view, ScaleLayout::thread_k, 64};
    AttentionOptions inner;
    inner.sm_scale = 1.f;

    auto row = [&](const std::string& what, const std::function<void()>& fn) {
      Row r;
      r.family = "attention";
      r.op = "host time: " + what;
      r.shape = shape;
      r.backend = "cuda";
      r.ms = host_ms(ctx, fn);
      r.baseline = "GPU time of the same call";
      r.baseline_ms = env.time_ms(fn);
      r.note = r.ms > r.baseline_ms ? "host-bound when eager" : "GPU-bound";
      rows.push_back(r);
    };
    row("floor: an empty kernel (<<<>>>)", [&] { launch_empty_kernel(ctx, false); });
    row("floor: an empty kernel (cudaLaunchKernelEx, PDL)", [&] { launch_empty_kernel(ctx, true); });
    row("attention() on a caller's workspace", [&] {
      attention(q.view, k.view, v.view, o_view, nullptr, opt, ws.view.data, ws_bytes, ctx);
    });
    row("attention() making its own (stream-ordered)",
        [&] { attention(q.view, k.view, v.view, o_view, nullptr, opt, ctx); });
    row("q prologue (norm_rope_quantize)",
        [&] { norm_rope_quantize(q.view, qp, qr.data, qr.scale, ctx); });
    row("k path (norm_rope_mean_quantize)",
        [&] { norm_rope_mean_quantize(k.view, kp, kmv, kr.data, kr.scale, ctx); });
    row("V fp8 (quantize_v_fp8)", [&] { quantize_v_fp8(v.view, v8.view, vsv, nullptr, ctx); });
    row("kernel (attention_int8)", [&] {
      attention_int8(qr, kr, v8.view, &vsv, nullptr, &kmv, o_view, nullptr, inner, ctx);
    });
  }
};

LOWBIT_BENCH_CASES(attention_host_bench_cases) {
  cases.push_back(std::make_unique<AttentionHostBench>());
}
#else
LOWBIT_BENCH_CASES(attention_host_bench_cases) {}
#endif

}  // namespace
}  // namespace bench
}  // namespace lowbit
