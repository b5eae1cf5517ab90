// Rows of `lowbit bench` for INT8 prefill attention at head dim 256 (issue 4), family
// attention.d256: (B, H, N, D) = (1, 24, 4096, 256) and (1, 24, 16384, 256), non-causal and
// causal. TOPS = 4·B·H·N²·D / time (causal counts half). D = 256 runs the mma.sync kernel (the
// wgmma kernels cover 64 / 128). The baseline row per shape and mask is, as in
// attention.prefill, the default kernel with 16-bit P·V (bf16 tensor cores); the fp8 P·V kernel
// and the one-call attention() (prologue + V quantization + kernel) against it (fp8 P·V at
// D = 256 runs on f16 tensor cores from the CTA-widened V tile; H200 run 30: the e4m3 mma.sync
// two-level form it replaced measured 0.90-0.92x, deleted). Torch SDPA at
// these shapes: bench/attention_sdpa.py. Accuracy of the one-call rows: against fp64
// softmax(q k^T / 16) v on 64 sampled query rows (batch 0, heads 0 and H-1).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "lowbit/attention.h"
#include "lowbit/runtime.h"

namespace lowbit {
namespace bench {
namespace {

struct Shape {
  int64_t B, H, N, D;
};

std::string shape_str(const Shape& s) {
  return "(" + std::to_string(s.B) + ", " + std::to_string(s.H) + ", " + std::to_string(s.N) +
         ", " + std::to_string(s.D) + ") bf16";
}

// The sampled rows: batch 0, heads {0, H-1}, 32 rows each spread over N.
int64_t sample_row(const Shape& s, int r) { return (s.N - 1) * r / 31; }

// fp64 softmax(q k^T / sqrt(D)) v of the sampled rows from the host copies of q, k, v (B, N, H, D).
std::vector<double> sampled_reference(const Shape& s, bool causal, const std::vector<float>& q,
                                      const std::vector<float>& k, const std::vector<float>& v) {
  const int64_t N = s.N, H = s.H, D = s.D;
  auto at = [&](const std::vector<float>& t, int64_t n, int64_t h, int64_t d) {
    return static_cast<double>(t[static_cast<size_t>((n * H + h) * D + d)]);
  };
  const double sm = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> ref, logit(static_cast<size_t>(N)), row(static_cast<size_t>(D));
  for (int64_t h : {int64_t{0}, H - 1})
    for (int r = 0; r < 32; ++r) {
      const int64_t i = sample_row(s, r), end = causal ? i + 1 : N;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < end; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += at(q, i, h, d) * at(k, j, h, d);
        logit[static_cast<size_t>(j)] = dot * sm;
        m = std::max(m, dot * sm);
      }
      double l = 0;
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t j = 0; j < end; ++j) {
        const double p = std::exp(logit[static_cast<size_t>(j)] - m);
        l += p;
        for (int64_t d = 0; d < D; ++d) row[static_cast<size_t>(d)] += p * at(v, j, h, d);
      }
      for (int64_t d = 0; d < D; ++d) ref.push_back(row[static_cast<size_t>(d)] / l);
    }
  return ref;
}

std::string sampled_accuracy(const Shape& s, const std::vector<double>& ref,
                             const TensorView& out) {
  const std::vector<float> ho = to_host_f32(out);
  std::vector<float> got;
  for (int64_t h : {int64_t{0}, s.H - 1})
    for (int r = 0; r < 32; ++r)
      for (int64_t d = 0; d < s.D; ++d)
        got.push_back(ho[static_cast<size_t>((sample_row(s, r) * s.H + h) * s.D + d)]);
  return accuracy(got, ref).str() + " (64 rows)";
}

class Attention256Bench : public BenchCase {
 public:
  std::string name() const override { return "attention.d256"; }

  std::vector<Row> run(const Env& env) override {
    std::vector<Shape> shapes;
    if (env.device == Device::cuda) {
      shapes = {{1, 24, 4096, 256}, {1, 24, 16384, 256}};
      if (env.quick) shapes = {{1, 24, 4096, 256}};
    } else {
      shapes = {{1, 2, env.quick ? 64 : 128, 256}};  // the CPU oracle: a tiny shape
    }
    std::vector<Row> rows;
    for (const Shape& s : shapes) {
      const int64_t B = s.B, H = s.H, N = s.N, D = s.D;
      const Device dev = env.device;
      DeviceTensor q = make_tensor(dev, DType::bf16, {B, N, H, D}, 21);
      DeviceTensor k = make_tensor(dev, DType::bf16, {B, N, H, D}, 22);
      DeviceTensor v = make_tensor(dev, DType::bf16, {B, N, H, D}, 23);
      DeviceTensor out = make_empty(dev, DType::bf16, {B, N, H, D});
      // Kernel-level operands: random INT8 codes (uniform bytes, std ~74) with scale 1/74, per
      // block scales (q 128 rows, k 64 rows); V from quantize_v_fp8.
      DeviceTensor q8 = make_tensor(dev, DType::i8, {B, N, H, D}, 24);
      DeviceTensor k8 = make_tensor(dev, DType::i8, {B, N, H, D}, 25);
      const int64_t nqs = scale_count(ScaleLayout::per_block, 128, N);
      const int64_t nks = scale_count(ScaleLayout::per_block, 64, N);
      DeviceTensor qs = make_empty(dev, DType::f32, {B, H, nqs});
      DeviceTensor ks = make_empty(dev, DType::f32, {B, H, nks});
      {
        std::vector<float> a(static_cast<size_t>(B * H * std::max(nqs, nks)), 1.f / 74.f);
        Context c;
        if (dev == Device::cuda) {
          copy_to_device(qs.view.data, a.data(), static_cast<size_t>(B * H * nqs) * 4, c);
          copy_to_device(ks.view.data, a.data(), static_cast<size_t>(B * H * nks) * 4, c);
          synchronize(c);
        } else {
          std::copy(a.begin(), a.begin() + B * H * nqs, qs.view.ptr<float>());
          std::copy(a.begin(), a.begin() + B * H * nks, ks.view.ptr<float>());
        }
      }
      const int64_t npad = (N + 63) / 64 * 64;
      DeviceTensor v8 = make_empty(dev, DType::e4m3, {B, H, D, npad});
      DeviceTensor vs = make_empty(dev, DType::f32, {B, H, D});
      Context ctx = env.ctx;
      {
        Row r;
        r.family = "attention";
        r.op = "quantize_v_fp8 D = 256 (2 reads of V)";
        r.shape = shape_str(s);
        r.backend = device_name(dev);
        r.ms = env.time_ms([&] { quantize_v_fp8(v.view, v8.view, vs.view, nullptr, ctx); });
        r.bytes = static_cast<double>(B * N * H * D) * (2 * 2 + 1);
        rows.push_back(r);
      }
      QuantizedRows qr{q8.view, qs.view, ScaleLayout::per_block, 128};
      QuantizedRows kr{k8.view, ks.view, ScaleLayout::per_block, 64};
      const std::vector<float> hq = to_host_f32(q.view), hk = to_host_f32(k.view),
                               hv = to_host_f32(v.view);
      const TensorView vsv = vs.view;

      for (auto causal : {AttentionOptions::none, AttentionOptions::bottom_right}) {
        const bool is_causal = causal != AttentionOptions::none;
        AttentionOptions fp8;
        fp8.causal = causal;
        AttentionOptions f16 = fp8;
        f16.pv = AttentionOptions::f16;
        const double flops = 4.0 * B * H * static_cast<double>(N) * N * D / (is_causal ? 2 : 1);
        const std::string tag = is_causal ? ", causal" : "";
        const std::string kname = dev == Device::cuda ? " = mma.sync" : "";

        // The baseline: 16-bit P·V on the default kernel (bf16 tensor cores for P·V).
        Row b16;
        b16.family = "attention";
        b16.op = "D256 attention_int8 16-bit PV auto" + kname + " (kernel only)" + tag;
        b16.shape = shape_str(s);
        b16.backend = device_name(dev);
        b16.ms = env.time_ms([&] {
          attention_int8(qr, kr, v.view, nullptr, nullptr, nullptr, out.view, nullptr, f16, ctx);
        });
        b16.baseline = "lowbit attention_int8 16-bit PV auto";
        b16.baseline_ms = b16.ms;
        b16.flops = flops;
        b16.bytes = static_cast<double>(B * N * H * D) * (1 + 1 + 2 + 2);
        rows.push_back(b16);

        Row kr8 = b16;
        kr8.op = "D256 attention_int8 fp8 PV auto" +
                 std::string(dev == Device::cuda ? " = V widened to f16" : "") + " (kernel only)" +
                 tag;
        kr8.ms = env.time_ms([&] {
          attention_int8(qr, kr, v8.view, &vsv, nullptr, nullptr, out.view, nullptr, fp8, ctx);
        });
        kr8.bytes = static_cast<double>(B * N * H * D) * (1 + 1 + 1 + 2);
        rows.push_back(kr8);
        // One call from bf16 q, k, v: q/k prologue (K mean), V fp8 (or not), the kernel.
        std::vector<double> ref;
        for (const AttentionOptions& o : {fp8, f16}) {
          const size_t wb = attention_workspace_bytes(q.view, k.view, o);
          DeviceTensor ws = make_empty(dev, DType::u8, {static_cast<int64_t>(wb) + 256});
          void* wp = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.view.data) + 255) &
                                             ~uintptr_t{255});
          Row r = kr8;
          r.op = std::string("D256 attention() ") +
                 (o.pv == AttentionOptions::fp8 ? "fp8" : "16-bit") + " PV, incl. quantization" +
                 tag;
          r.ms = env.time_ms(
              [&] { attention(q.view, k.view, v.view, out.view, nullptr, o, wp, wb, ctx); });
          r.bytes = static_cast<double>(B * N * H * D) * 2 * 4;
          if (ref.empty()) ref = sampled_reference(s, is_causal, hq, hk, hv);
          r.accuracy = sampled_accuracy(s, ref, out.view);
          char note[96];
          std::snprintf(note, sizeof note, "quantization adds %.3f ms over the kernel",
                        r.ms - (o.pv == AttentionOptions::fp8 ? kr8.ms : b16.ms));
          r.note = note;
          rows.push_back(r);
        }
      }
    }
    return rows;
  }
};

LOWBIT_BENCH_CASES(attention256_bench_cases) {
  cases.push_back(std::make_unique<Attention256Bench>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
