// Rows of `lowbit bench` for INT8 prefill attention (SPEC §2), one class for two families:
//  - attention.prefill, the shapes (B, H, N, D): (1, 40, 32760, 128), (2, 24, 16384, 128),
//    (1, 24, 4096, 64); and Flux's (1, 24, 4608, 128) (session 19: through Python, sageattn at
//    (1, 24, 4096, 128) measured 0.42 ms against SDPA's 0.34: the one-call rows split it);
//  - attention.d256 (issue 4): (1, 24, 4096, 256) and (1, 24, 16384, 256). On CUDA the baseline
//    row is the mma.sync kernel by name (session 10's kernel, 16-bit P·V; auto's kernel at D = 256
//    until H200 run 32), then auto (the head-dim-256 wgmma kernel since run 32) with 16-bit and
//    fp8 P·V, each with its output against the mma.sync kernel's (same P·V mode) on the sampled
//    rows.
// Non-causal and causal. TOPS = 4·B·H·N²·D / time (causal counts half). One baseline row per
// shape and mask: the default kernel with 16-bit P·V (bf16 tensor cores; D = 256 on CUDA: the
// mma.sync kernel); the other rows against it in the same run. Torch SDPA (cuDNN / flash) is
// timed by bench/attention_sdpa.py.
// Accuracy: against fp64 softmax(q k^T) v on 64 sampled query rows of batch 0, heads 0 and H-1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "bench/bench.h"
#include "lowbit/attention.h"
#include "lowbit/prologue.h"
#include "lowbit/runtime.h"
#include "src/core/prologue_internal.h"  // detail::PrologueCudaTuning (the seg_fast row)
#include "src/cpu/attention_backend.h"  // detail::AttentionCudaTuning (the ring_cons = 3 row)
#include "tests/harness/harness.h"      // harness::rope_table

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

// Kernel-level q / k operands (B, Nq / Nkv, H, D): random INT8 codes (uniform bytes, std ~74,
// seeds seed and seed + 1) with scale 1/74, so the dequantized q, k have unit variance;
// per-block scales (q 128 rows, k 64 rows).
struct KernelCodes {
  DeviceTensor q8, k8, qs, ks;
  QuantizedRows q() const { return {q8.view, qs.view, ScaleLayout::per_block, 128}; }
  QuantizedRows k() const { return {k8.view, ks.view, ScaleLayout::per_block, 64}; }
};
KernelCodes kernel_codes(Device dev, int64_t B, int64_t Nq, int64_t Nkv, int64_t H, int64_t D,
                         uint64_t seed) {
  KernelCodes c;
  c.q8 = make_tensor(dev, DType::i8, {B, Nq, H, D}, seed);
  c.k8 = make_tensor(dev, DType::i8, {B, Nkv, H, D}, seed + 1);
  const int64_t nqs = scale_count(ScaleLayout::per_block, 128, Nq);
  const int64_t nks = scale_count(ScaleLayout::per_block, 64, Nkv);
  c.qs = make_empty(dev, DType::f32, {B, H, nqs});
  c.ks = make_empty(dev, DType::f32, {B, H, nks});
  const std::vector<float> a(static_cast<size_t>(B * H * std::max(nqs, nks)), 1.f / 74.f);
  if (dev == Device::cuda) {
    Context ctx;
    copy_to_device(c.qs.view.data, a.data(), static_cast<size_t>(B * H * nqs) * 4, ctx);
    copy_to_device(c.ks.view.data, a.data(), static_cast<size_t>(B * H * nks) * 4, ctx);
    synchronize(ctx);
  } else {
    std::copy(a.begin(), a.begin() + B * H * nqs, c.qs.view.ptr<float>());
    std::copy(a.begin(), a.begin() + B * H * nks, c.ks.view.ptr<float>());
  }
  return c;
}

// fp64 reference rows and lowbit's rows on a sample: batch 0, heads {0, H-1}, 32 rows each.
struct HostQkv {
  std::vector<float> q, k, v;
};
// The sampled rows' fp64 reference (computed once per shape and mask, shared by the rows).
std::vector<double> sampled_reference(const Shape& s, bool causal, const HostQkv& in) {
  const std::vector<float>&hq = in.q, &hk = in.k, &hv = in.v;
  const int64_t N = s.N, H = s.H, D = s.D;
  auto at = [&](const std::vector<float>& t, int64_t n, int64_t h, int64_t d) {
    return static_cast<double>(t[static_cast<size_t>((n * H + h) * D + d)]);
  };
  std::vector<double> ref, sc(static_cast<size_t>(N));
  const double sm = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t h : {int64_t{0}, H - 1})
    for (int r = 0; r < 32; ++r) {
      const int64_t i = (N - 1) * r / 31;
      const int64_t end = causal ? i + 1 : N;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < end; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += at(hq, i, h, d) * at(hk, j, h, d);
        sc[static_cast<size_t>(j)] = dot * sm;
        m = std::max(m, dot * sm);
      }
      double l = 0;
      for (int64_t j = 0; j < end; ++j) {
        sc[static_cast<size_t>(j)] = std::exp(sc[static_cast<size_t>(j)] - m);  // p_j, once
        l += sc[static_cast<size_t>(j)];
      }
      for (int64_t d = 0; d < D; ++d) {
        double a = 0;
        for (int64_t j = 0; j < end; ++j) a += sc[static_cast<size_t>(j)] * at(hv, j, h, d);
        ref.push_back(a / l);
      }
    }
  return ref;
}
// lowbit's sampled rows (as sampled_reference) of out (B, N, H, D).
// Session 26: a summary of round 3's per-CTA stamps (detail::AttentionCudaTuning::trace; the
// word layout is attention_wgmma.cu's r3_trace): mean microseconds per CTA of each phase.
std::string cta_stamps_note(const std::vector<unsigned long long>& h, int64_t ctas) {
  const int W = detail::kAttentionTraceWords;
  double cyc = 0, ns = 0, start = 0, first = 0, tiles = 0, loop = 0, epi = 0, skew = 0;
  int64_t n = 0;
  std::vector<std::vector<std::pair<unsigned long long, unsigned long long>>> per_sm;
  for (int64_t c = 0; c < ctas; ++c) {
    const unsigned long long* w = &h[static_cast<size_t>(c * W)];
    if (w[1] == 0 || w[7] == 0 || w[11] == 0 || w[3] == 0) continue;  // not stamped / no tile
    auto d = [](unsigned long long a, unsigned long long b) { return static_cast<double>(a - b); };
    cyc += d(w[7], w[2]);
    ns += d(w[12], w[1]);
    start += 0.5 * (d(w[4], w[2]) + d(w[8], w[2]));
    first += 0.5 * (d(w[5], w[4]) + d(w[9], w[8]));
    loop += 0.5 * (d(w[6], w[5]) + d(w[10], w[9]));
    tiles += static_cast<double>(w[3]);
    epi += 0.5 * (d(w[7], w[6]) + d(w[11], w[10]));
    skew += std::fabs(static_cast<double>(w[7]) - static_cast<double>(w[11]));
    const size_t sm = static_cast<size_t>(w[0]);
    if (per_sm.size() <= sm) per_sm.resize(sm + 1);
    per_sm[sm].push_back({w[1], std::max(w[12], w[13])});
    ++n;
  }
  if (n == 0 || cyc <= 0) return "no stamps";
  double gap = 0;
  int64_t gaps = 0;
  for (auto& v : per_sm) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i].first > v[i - 1].second)
        gap += static_cast<double>(v[i].first - v[i - 1].second), ++gaps;
  }
  const double us = ns / cyc / 1000.0 / static_cast<double>(n);  // us per cycle, over n CTAs
  char b[320];
  std::snprintf(b, sizeof b,
                "per CTA (us, %lld CTAs, %.2f GHz): start -> consumers %.2f, first q k^T %.2f, "
                "%.1f tiles %.2f (%.3f per tile), epilogue %.2f, consumer end skew %.2f; SM gap "
                "between CTAs %.2f",
                static_cast<long long>(n), cyc / ns, start * us, first * us, tiles / n, loop * us,
                loop / tiles * us * n, epi * us, skew * us, gaps ? gap / gaps / 1000.0 : 0.0);
  return b;
}

std::vector<float> sampled_rows(const Shape& s, const TensorView& out) {
  const std::vector<float> ho = to_host_f32(out);
  const int64_t N = s.N, H = s.H, D = s.D;
  std::vector<float> got;
  for (int64_t h : {int64_t{0}, H - 1})
    for (int r = 0; r < 32; ++r) {
      const int64_t i = (N - 1) * r / 31;
      for (int64_t d = 0; d < D; ++d) got.push_back(ho[static_cast<size_t>((i * H + h) * D + d)]);
    }
  return got;
}
// lowbit's sampled rows against the reference.
std::string sampled_accuracy(const Shape& s, const std::vector<double>& ref,
                             const TensorView& out) {
  return accuracy(sampled_rows(s, out), ref).str() + " (64 rows)";
}

// attention()'s operands in pieces at one shape: its q / k codes and scales (THREAD_Q 32 with
// sm_scale folded, THREAD_K 64), the K mean, V in fp8 with its scales, and the kernel's options
// (sm_scale 1: folded into q). kp has no mean (norm_rope_mean_quantize computes it); kp_mean
// subtracts km (norm_rope_quantize after norm_rope_mean).
// Session 53: a per-head RMSNorm weight (bf16, D) and a split-half RoPE table ((1, N, 1, D / 2, 2)
// f32), Qwen3-style q / k norm, for the rows that time the prologue with them. Holds the views a
// Prologue points at: made in place, never copied.
struct NormRope {
  DeviceTensor w, tab;
  TensorView wv;
  Rope rope;
  NormRope(Device dev, int64_t N, int64_t D, uint64_t seed)
      : w(make_tensor(dev, DType::bf16, {D}, seed)),
        tab(make_tensor(dev, DType::f32, {1, N, 1, D / 2, 2}, seed + 1)),
        wv(w.view) {
    rope.table = tab.view;
  }
  NormRope(const NormRope&) = delete;
  NormRope& operator=(const NormRope&) = delete;
  // p with the norm (and the rope when `with_rope`)
  Prologue on(Prologue p, bool with_rope) const {
    p.norm_weight = &wv;
    if (with_rope) p.rope = &rope;
    return p;
  }
};

struct Pieces {
  DeviceTensor q8, k8, qs, ks, km, v8, vs;
  TensorView kmv, vsv;
  Prologue qp, kp, kp_mean;
  QuantizedRows qr, kr;
  AttentionOptions inner;
  Pieces(Device dev, const Shape& s)
      : q8(make_empty(dev, DType::i8, {s.B, s.N, s.H, s.D})),
        k8(make_empty(dev, DType::i8, {s.B, s.N, s.H, s.D})),
        qs(make_empty(dev, DType::f32, {s.B, s.H, scale_count(ScaleLayout::thread_q, 32, s.N)})),
        ks(make_empty(dev, DType::f32, {s.B, s.H, scale_count(ScaleLayout::thread_k, 64, s.N)})),
        km(make_empty(dev, DType::f32, {s.B, s.H, s.D})),
        v8(make_empty(dev, DType::e4m3, {s.B, s.H, s.D, (s.N + 63) / 64 * 64})),
        vs(make_empty(dev, DType::f32, {s.B, s.H, s.D})),
        kmv(km.view),
        vsv(vs.view),
        qr{q8.view, qs.view, ScaleLayout::thread_q, 32},
        kr{k8.view, ks.view, ScaleLayout::thread_k, 64} {
    qp.sm_scale = 1.f / std::sqrt(static_cast<float>(s.D));
    qp.layout = ScaleLayout::thread_q;
    qp.block = 32;
    kp.layout = ScaleLayout::thread_k;
    kp.block = 64;
    kp_mean = kp;
    kp_mean.mean = &kmv;
    inner.sm_scale = 1.f;
  }
  Pieces(const Pieces&) = delete;
  Pieces& operator=(const Pieces&) = delete;
};

// attention() fp8 PV in its pieces (what the one-call row's "quantization adds" is made of):
// the q prologue (THREAD_Q 32, sm_scale folded), the K mean + k prologue (THREAD_K 64), the V
// fp8 quantization, and the kernel (auto) on those operands and scale layouts.
void pieces_of_one_call(const Env& env, const Shape& s, const DeviceTensor& q,
                        const DeviceTensor& k, const DeviceTensor& v, const DeviceTensor& out,
                        std::vector<Row>& rows) {
  const int64_t B = s.B, H = s.H, N = s.N, D = s.D;
  const Device dev = env.device;
  Context ctx = env.ctx;
  Pieces P(dev, s);
  auto row = [&](const std::string& what, double bytes, double flops, auto&& fn) {
    Row r;
    r.family = "attention";
    r.op = "attention() piece: " + what;
    r.shape = shape_str(s);
    r.backend = device_name(dev);
    r.bytes = bytes;
    r.flops = flops;
    r.ms = env.time_ms(fn);
    rows.push_back(r);
  };
  const double x = static_cast<double>(B * N * H * D);
  row("q prologue (THREAD_Q 32)", 3 * x, 0,
      [&] { norm_rope_quantize(q.view, P.qp, P.qr.data, P.qr.scale, ctx); });
  row("K mean", 2 * x, 0, [&] { norm_rope_mean(k.view, P.kp, P.kmv, ctx); });
  row("k prologue (THREAD_K 64, minus the mean)", 3 * x, 0,
      [&] { norm_rope_quantize(k.view, P.kp_mean, P.kr.data, P.kr.scale, ctx); });
  // The k path as the one call runs it (norm_rope_mean_quantize: session 52's short k kernel
  // where it applies), and the same with that kernel off (the mean pass + the quantize pass).
  for (int two = 0; two < 2; ++two) {
    detail::PrologueCudaTuning t;
    if (two) t.short_k_tokens = 0;
    detail::set_prologue_cuda_tuning(t);
    row(two ? "k path, two passes (short_k off)" : "k path (norm_rope_mean_quantize)", 3 * x, 0,
        [&] { norm_rope_mean_quantize(k.view, P.kp, P.kmv, P.kr.data, P.kr.scale, ctx); });
    detail::set_prologue_cuda_tuning({});
  }
  // Session 53: the k path with the norm (+ rope): the two passes (the short k kernel takes
  // neither: a form with them lost, docs/prologue.md "Session 53").
  const NormRope nr(dev, N, D, 71);
  const Prologue knorm = nr.on(P.kp, false), knr = nr.on(P.kp, true);
  row("k path + norm (two passes)", 3 * x, 0,
      [&] { norm_rope_mean_quantize(k.view, knorm, P.kmv, P.kr.data, P.kr.scale, ctx); });
  row("k path + norm + rope (two passes)", 3 * x, 0,
      [&] { norm_rope_mean_quantize(k.view, knr, P.kmv, P.kr.data, P.kr.scale, ctx); });
  row("V fp8 (2 reads of V)", 5 * x, 0,
      [&] { quantize_v_fp8(v.view, P.v8.view, P.vsv, nullptr, ctx); });
  TensorView o_view = out.view;
  row("kernel, auto, THREAD_Q/THREAD_K scales + K mean", 5 * x, 4.0 * x * N, [&] {
    attention_int8(P.qr, P.kr, P.v8.view, &P.vsv, nullptr, &P.kmv, o_view, nullptr, P.inner, ctx);
  });
}

// A family of rows: its name, shapes, input seeds (q, k, v, q codes, k codes: seed .. seed + 4)
// and the rows only one of them has.
struct Family {
  std::string name;
  std::vector<Shape> cuda, cuda_quick;
  int64_t cpu_d;  // head dim of the CPU oracle's tiny shape
  uint64_t seed;
  std::string prefix;  // of the kernel and one-call rows' names ("D256 ")
  bool d256;           // D = 256: one V quantization row, the mma.sync baseline row; else the
                       // V-mean row and the one call in pieces
  bool cuda_only = false;  // no CPU row (the family's point is the GPU's waves)
};

class AttentionBench : public BenchCase {
 public:
  explicit AttentionBench(Family f) : f_(std::move(f)) {}
  std::string name() const override { return f_.name; }

  std::vector<Row> run(const Env& env) override {
    std::vector<Shape> shapes;
    if (env.device == Device::cuda) {
      shapes = env.quick ? f_.cuda_quick : f_.cuda;
    } else if (!f_.cuda_only) {
      shapes = {{1, 2, env.quick ? 64 : 128, f_.cpu_d}};  // the CPU oracle: a tiny shape
    }
    const std::string& pre = f_.prefix;
    std::vector<Row> rows;
    for (const Shape& s : shapes) {
      if (!env.shape_selected(shape_str(s))) continue;
      const int64_t B = s.B, H = s.H, N = s.N, D = s.D;
      const Device dev = env.device;
      DeviceTensor q = make_tensor(dev, DType::bf16, {B, N, H, D}, f_.seed);
      DeviceTensor k = make_tensor(dev, DType::bf16, {B, N, H, D}, f_.seed + 1);
      DeviceTensor v = make_tensor(dev, DType::bf16, {B, N, H, D}, f_.seed + 2);
      DeviceTensor out = make_empty(dev, DType::bf16, {B, N, H, D});
      const KernelCodes codes = kernel_codes(dev, B, N, N, H, D, f_.seed + 3);
      const int64_t npad = (N + 63) / 64 * 64;
      DeviceTensor v8 = make_empty(dev, DType::e4m3, {B, H, D, npad});
      DeviceTensor vs = make_empty(dev, DType::f32, {B, H, D});
      Context ctx = env.ctx;
      quantize_v_fp8(v.view, v8.view, vs.view, nullptr, ctx);
      {  // V quantization alone: bytes = the passes' V reads (2 B each) + the fp8 write
        DeviceTensor vm = make_empty(dev, DType::f32, {B, H, D});
        for (bool with_mean : {false, true}) {
          if (with_mean && f_.d256) continue;
          TensorView vmv = vm.view;
          Row r;
          r.family = "attention";
          r.op = with_mean ? "quantize_v_fp8 with mean (3 reads of V)"
                 : f_.d256 ? "quantize_v_fp8 D = 256 (2 reads of V)"
                           : "quantize_v_fp8 (2 reads of V)";
          r.shape = shape_str(s);
          r.backend = device_name(dev);
          r.ms = env.time_ms(
              [&] { quantize_v_fp8(v.view, v8.view, vs.view, with_mean ? &vmv : nullptr, ctx); });
          r.bytes = static_cast<double>(B * N * H * D) * ((with_mean ? 3 : 2) * 2 + 1);
          rows.push_back(r);
        }
        quantize_v_fp8(v.view, v8.view, vs.view, nullptr, ctx);  // the operands below: no mean
      }
      const QuantizedRows qr = codes.q(), kr = codes.k();
      const HostQkv host{to_host_f32(q.view), to_host_f32(k.view), to_host_f32(v.view)};

      for (auto causal : {AttentionOptions::none, AttentionOptions::bottom_right}) {
        const bool is_causal = causal != AttentionOptions::none;
        AttentionOptions fp8;
        fp8.causal = causal;
        AttentionOptions f16 = fp8;
        f16.pv = AttentionOptions::f16;
        const double flops = 4.0 * B * H * static_cast<double>(N) * N * D / (is_causal ? 2 : 1);
        const std::string tag = is_causal ? ", causal" : "";

        // The one baseline row: 16-bit P·V, bf16 tensor cores for P·V: D 64 / 128 on CUDA the
        // round-1 wgmma kernel by name (`kernel = wgmma`; auto's 16-bit kernel until session 13,
        // auto's TMA-ring row below), D = 256 on CUDA the mma.sync kernel by name (auto's rows
        // below), the CPU auto.
        Row b16;
        b16.family = "attention";
        const bool cuda = dev == Device::cuda;
        const bool mma256 = f_.d256 && cuda;
        AttentionOptions f16_base = f16;
        if (mma256) f16_base.kernel = AttentionOptions::mma_sync;
        if (cuda && !f_.d256) f16_base.kernel = AttentionOptions::wgmma;
        b16.op = pre + "attention_int8 16-bit PV " +
                 (mma256 ? "mma.sync (session 10 kernel)"
                  : cuda ? "round 1 (kernel = wgmma)"
                         : "auto") +
                 " (kernel only)" + tag;
        b16.shape = shape_str(s);
        b16.backend = device_name(dev);
        b16.ms = env.time_ms([&] {
          attention_int8(qr, kr, v.view, nullptr, nullptr, nullptr, out.view, nullptr, f16_base,
                         ctx);
        });
        b16.baseline = mma256 ? "lowbit attention_int8 16-bit PV mma.sync"
                       : cuda ? "lowbit attention_int8 16-bit PV round 1"
                              : "lowbit attention_int8 16-bit PV auto";
        b16.baseline_ms = b16.ms;
        b16.flops = flops;
        b16.bytes = static_cast<double>(B * N * H * D) * (1 + 1 + 2 + 2);
        rows.push_back(b16);
        const double base_ms = b16.ms;
        const TensorView vsv = vs.view;
        double f16_kernel_ms = base_ms, fp8_kernel_ms = 0;  // auto's (one-call notes)
        if (mma256) {
          const std::pair<double, double> t =
              auto256_rows(env, s, causal, qr, kr, v, v8, vsv, out, b16, tag, rows);
          f16_kernel_ms = t.first;
          fp8_kernel_ms = t.second;
        } else {
          if (cuda) {  // auto's 16-bit P·V kernel (the TMA ring on sm_90a); accuracy vs round 1
            synchronize(ctx);
            const std::vector<float> r1 = sampled_rows(s, out.view);
            const std::vector<double> ref1(r1.begin(), r1.end());
            Row a16 = b16;
            a16.op = pre + "attention_int8 16-bit PV auto = TMA ring" +
                     (D == 64 ? ", 4 consumer warpgroups" : "") + " (kernel only)" + tag;
            a16.ms = env.time_ms([&] {
              attention_int8(qr, kr, v.view, nullptr, nullptr, nullptr, out.view, nullptr, f16,
                             ctx);
            });
            synchronize(ctx);
            a16.accuracy =
                accuracy(sampled_rows(s, out.view), ref1).str() + " vs round 1 (64 rows)";
            rows.push_back(a16);
            f16_kernel_ms = a16.ms;
            if (D == 64) {  // session 14: four consumer warpgroups (auto) against three
              const std::vector<float> auto_rows = sampled_rows(s, out.view);
              const std::vector<double> ref_auto(auto_rows.begin(), auto_rows.end());
              detail::AttentionCudaTuning c3;
              c3.ring_cons = 3;
              detail::set_attention_cuda_tuning(c3);
              Row r3 = a16;
              r3.op = pre + "attention_int8 16-bit PV, vs TMA ring on 3 consumer warpgroups " +
                      "(session 13 default)" + tag;
              r3.baseline = "TMA ring, 3 consumer warpgroups";
              r3.baseline_ms = env.time_ms([&] {
                attention_int8(qr, kr, v.view, nullptr, nullptr, nullptr, out.view, nullptr, f16,
                               ctx);
              });
              synchronize(ctx);
              detail::set_attention_cuda_tuning({});
              r3.accuracy =
                  accuracy(sampled_rows(s, out.view), ref_auto).str() + " vs auto (64 rows)";
              rows.push_back(r3);
            }
          }
          // fp8 P·V, the default kernel (auto: round 3 + I2FP on sm_90a; the CPU ignores the
          // choice: one row there).
          Row kr8 = b16;
          kr8.op = pre + "attention_int8 fp8 PV auto" +
                   (!cuda     ? ""
                    : D == 64 ? " = round 3 + I2FP, 3 consumer warpgroups, TMA producer"
                              : " = round 3 + I2FP") +
                   " (kernel only)" + tag;
          kr8.ms = env.time_ms([&] {
            attention_int8(qr, kr, v8.view, &vsv, nullptr, nullptr, out.view, nullptr, fp8, ctx);
          });
          kr8.baseline = b16.baseline;
          kr8.baseline_ms = base_ms;
          kr8.bytes = static_cast<double>(B * N * H * D) * (1 + 1 + 1 + 2);
          rows.push_back(kr8);
          fp8_kernel_ms = kr8.ms;
          if (cuda && (D == 128 || D == 64)) {
            // A/B against the default, the same bits: session 26's output rows by 4-byte stores
            // from the registers (tuning epilogue 1; the default stages them through the
            // consumers' Q rows in shared memory); session 27's ring stages released by each
            // consumer warp's lane 0 after __syncwarp (tuning lane0_release; the default: every
            // consumer thread arrives); session 54's one consumer warpgroup per 64-row CTA, two
            // CTAs per multiprocessor (tuning cons1 1; auto's only up to 2048 / 1024 keys).
            synchronize(ctx);
            const std::vector<float> base = to_host_f32(out.view);
            for (int va = D == 128 ? 0 : 2; va < 3; ++va) {
              detail::AttentionCudaTuning t;
              if (va == 0) t.epilogue = 1;
              if (va == 1) t.lane0_release = true;
              if (va == 2) t.cons1 = 1;
              detail::set_attention_cuda_tuning(t);
              Row r = kr8;
              r.op = pre + "attention_int8 fp8 PV auto, " +
                     (va == 0   ? "output rows by 4-byte stores from registers (tuning epilogue 1"
                      : va == 1 ? "stages released by lane 0 after __syncwarp (tuning "
                                  "lane0_release"
                                : "1 consumer / 64-row CTA, 2 CTAs / SM (tuning cons1 1") +
                     "; kernel only)" + tag;
              r.ms = env.time_ms([&] {
                attention_int8(qr, kr, v8.view, &vsv, nullptr, nullptr, out.view, nullptr, fp8,
                               ctx);
              });
              synchronize(ctx);
              detail::set_attention_cuda_tuning({});
              const size_t differ = bits_differ(to_host_f32(out.view), base);
              r.accuracy = differ == 0
                               ? "bits = default"
                               : std::to_string(differ) + " outputs differ from the default";
              rows.push_back(r);
            }
          }
          if (cuda && f_.cuda_only) {
            // Session 25 (attention.waves): the same kernel on q codes all zero: every logit is
            // 0, so no row maximum moves after a row's first tile: the O rescales and unfolded
            // P·V halves of the random rows' early tiles (a row's maximum moves at tile j with
            // probability ~1 / j) are gone. Against kr8 at 36 and 72 tiles per CTA this splits
            // the per-CTA cost into that part and the rest.
            DeviceTensor q0 = make_empty(dev, DType::i8, {B, N, H, D});
            device_memset(q0.view.data, 0, static_cast<size_t>(B * N * H * D), ctx);
            const QuantizedRows q0r{q0.view, codes.qs.view, ScaleLayout::per_block, 128};
            Row z = kr8;
            z.op = pre + "attention_int8 fp8 PV auto, q codes all zero (no row maximum moves " +
                   "after the first tile; kernel only)" + tag;
            z.ms = env.time_ms([&] {
              attention_int8(q0r, kr, v8.view, &vsv, nullptr, nullptr, out.view, nullptr, fp8, ctx);
            });
            rows.push_back(z);
            // Session 26: where the per-CTA cost goes, from round 3's per-CTA stamps (tuning
            // `trace`; the last timed call's): the CTA's start to its consumers' start, their
            // wait for the first q k^T, the key tiles, the epilogue, the two consumers' end skew,
            // and the gap on each SM between a CTA's end and the next one's start.
            for (int e = 0; D == 128 && e <= 1; ++e) {  // default, lane0_release
              const int64_t ctas = (N + 127) / 128 * H * B;
              const size_t words = static_cast<size_t>(ctas) * detail::kAttentionTraceWords;
              DeviceTensor tb = make_empty(dev, DType::u8, {static_cast<int64_t>(words * 8)});
              device_memset(tb.view.data, 0, words * 8, ctx);
              detail::AttentionCudaTuning t;
              t.trace = static_cast<unsigned long long*>(tb.view.data);
              t.lane0_release = e == 1;
              detail::set_attention_cuda_tuning(t);
              Row tr = kr8;
              tr.op = pre + "attention_int8 fp8 PV auto with per-CTA stamps" +
                      (e == 1 ? ", tuning lane0_release" : "") + " (kernel only)" + tag;
              tr.ms = env.time_ms([&] {
                attention_int8(qr, kr, v8.view, &vsv, nullptr, nullptr, out.view, nullptr, fp8,
                               ctx);
              });
              synchronize(ctx);
              detail::set_attention_cuda_tuning({});
              std::vector<unsigned long long> h(words);
              copy_to_host(h.data(), tb.view.data, words * 8, ctx);
              synchronize(ctx);
              tr.note = cta_stamps_note(h, ctas);
              rows.push_back(tr);
            }
          }
        }
        // (No variant under A/B at D 64 / 128 now. Settled and gone: run 11's round 4 + I2FP rows
        // (0.91-0.96x of auto), the D = 64 two-consumer row (0.77x, run 13), the D = 128
        // 240-register row (0.99-1.01x, runs 12 and 13), round 5 without turns (0.82-0.97x, run
        // 13); run 16's D = 64 q k^T before the O update (0.99x); the producerless kernel
        // (0.72-0.76x, runs 16 and 17), the cp.async-fed D = 64 three-consumer row (0.98x, runs 16
        // and 17); run 19's row sums on the tensor cores (0.99-1.00x) and quick row maxima
        // (0.98-0.99x, bits equal); session 9's D = 128 one softmax step per tile (0.95-0.97x, runs
        // 24 and 25), with split P·V halves (0.94-0.96x), and polynomial exp2 (0.92-0.94x); session
        // 10's 192-key ring stages (0.97-0.99x, run 30). Session 11's D = 256 fp8 P·V variants (run
        // 32): the chosen form is the kernel's only one now, the others deleted. A variant row
        // times attention_int8 under detail::set_attention_cuda_tuning against kr8 and compares its
        // output's bits with the default's.)

        // One call from bf16 q, k, v: K mean, q/k INT8, V fp8 (or not), attention.
        std::vector<double> ref;  // the sampled fp64 rows, computed on first use
        for (const AttentionOptions& o : {fp8, f16}) {
          const size_t wb = attention_workspace_bytes(q.view, k.view, o);
          DeviceTensor ws = make_empty(dev, DType::u8, {static_cast<int64_t>(wb) + 256});
          void* wp = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.view.data) + 255) &
                                             ~uintptr_t{255});
          Row r = b16;
          r.baseline = b16.baseline;
          r.baseline_ms = base_ms;
          r.op = pre + "attention() " + (o.pv == AttentionOptions::fp8 ? "fp8" : "16-bit") +
                 " PV, incl. quantization" + tag;
          r.ms = env.time_ms(
              [&] { attention(q.view, k.view, v.view, out.view, nullptr, o, wp, wb, ctx); });
          r.bytes = static_cast<double>(B * N * H * D) * 2 * 4;
          if (ref.empty()) ref = sampled_reference(s, is_causal, host);
          r.accuracy = sampled_accuracy(s, ref, out.view);
          char note[96];
          std::snprintf(note, sizeof note, "quantization adds %.3f ms over the kernel",
                        r.ms - (o.pv == AttentionOptions::fp8 ? fp8_kernel_ms : f16_kernel_ms));
          r.note = note;
          rows.push_back(r);
        }
        if (cuda) {
          // A/B against the default call, whose output bits must not change: (session 21) V's
          // passes in sequence with the q prologue and the k path on the caller's stream, as
          // before V moved to a side stream (small V only: larger V runs in sequence either way);
          // (session 61) q by its own pass rather than quantized in the long-key kernels, and
          // those kernels without the L2 prefetch of the next wave's q.
          const size_t wb = attention_workspace_bytes(q.view, k.view, fp8);
          DeviceTensor ws = make_empty(dev, DType::u8, {static_cast<int64_t>(wb)});  // cudaMalloc'd
          auto call = [&] {
            attention(q.view, k.view, v.view, out.view, nullptr, fp8, ws.view.data, wb, ctx);
          };
          call();
          synchronize(ctx);
          const std::vector<float> forked = to_host_f32(out.view);
          for (int form = 0; form < 3; ++form) {
            if (form > 0 && f_.d256) break;  // (q in the kernel: D 64 / 128)
            detail::AttentionCudaTuning t;
            t.serial_passes = form == 0;
            t.fused_q = form == 1 ? 1 : form == 2 ? 6 : 0;
            detail::set_attention_cuda_tuning(t);
            Row r = b16;
            r.baseline_ms = base_ms;
            r.op = pre +
                   (form == 0   ? "attention() fp8 PV, incl. quantization, passes in sequence "
                                  "(serial_passes)"
                    : form == 1 ? "attention() fp8 PV, q by its own pass, not in the kernel "
                                  "(fused_q 1)"
                                : "attention() fp8 PV, q in the kernel without the L2 prefetch "
                                  "(fused_q 6)") +
                   tag;
            r.ms = env.time_ms(call);
            synchronize(ctx);
            detail::set_attention_cuda_tuning({});
            r.bytes = static_cast<double>(B * N * H * D) * 2 * 4;
            const size_t differ = bits_differ(to_host_f32(out.view), forked);
            r.accuracy = differ == 0 ? "bits = default"
                                     : std::to_string(differ) + " outputs differ from the default";
            rows.push_back(r);
          }
        }
        if (cuda && !is_causal && !f_.d256) norm_rope_rows(env, s, q, k, v, out, fp8, rows);
        if (!is_causal && !f_.d256) pieces_of_one_call(env, s, q, k, v, out, rows);
      }
    }
    return rows;
  }

 private:
  Family f_;

  // The one call with q / k RMSNorm + RoPE (options.q_prologue / k_prologue, session 39): a
  // per-head weight and Flux's 2 x 2 rotary table (interleaved pairs), then segmented weights
  // (joint attention: the first 512 tokens on their own weight row, one index read-back per
  // call; session 40: also without the read-back, check_weight_rows false), then Wan's norm over
  // all heads (session 40: NormScope::token, an (H·D) weight), against the same call without them.
  static void norm_rope_rows(const Env& env, const Shape& s, const DeviceTensor& q,
                             const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& out,
                             const AttentionOptions& fp8, std::vector<Row>& rows) {
    const int64_t N = s.N, D = s.D, pairs = D / 2;
    Context ctx;
    std::mt19937_64 rng(5);
    const harness::HostTensor table = harness::rope_table(1, N, pairs, /*matrix=*/true, rng);
    std::vector<float> w(static_cast<size_t>(2 * D));
    for (int64_t i = 0; i < 2 * D; ++i) w[static_cast<size_t>(i)] = 1.f + 0.01f * (i % 7);
    std::vector<int32_t> seg(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) seg[static_cast<size_t>(n)] = n < 512 ? 1 : 0;
    DeviceTensor tab = make_empty(env.device, DType::f32, {1, N, 1, pairs, 2, 2});
    DeviceTensor wt = make_empty(env.device, DType::f32, {2, D});
    DeviceTensor rw = make_empty(env.device, DType::i32, {N});
    DeviceTensor wh = make_empty(env.device, DType::f32, {s.H * D});
    std::vector<float> whost(static_cast<size_t>(s.H * D));
    for (size_t i = 0; i < whost.size(); ++i) whost[i] = 1.f + 0.01f * static_cast<float>(i % 5);
    copy_to_device(wh.view.data, whost.data(), whost.size() * 4, ctx);
    copy_to_device(tab.view.data, table.bytes.data(), table.bytes.size(), ctx);
    copy_to_device(wt.view.data, w.data(), w.size() * 4, ctx);
    copy_to_device(rw.view.data, seg.data(), seg.size() * 4, ctx);
    synchronize(ctx);
    TensorView w1 = wt.view;  // row 0 as a (D) weight
    w1.ndim = 1;
    w1.shape[0] = D;
    w1.stride[0] = 1;
    const size_t wb = attention_workspace_bytes(q.view, k.view, fp8);
    DeviceTensor ws = make_empty(env.device, DType::u8, {static_cast<int64_t>(wb) + 256});
    void* wp = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.view.data) + 255) &
                                       ~uintptr_t{255});
    const double plain = env.time_ms(
        [&] { attention(q.view, k.view, v.view, out.view, nullptr, fp8, wp, wb, ctx); });
    Rope rope{tab.view, true};
    // per-head weight; segmented on the first-generation kernels (seg_fast off); segmented (the
    // default: seg_fast); segmented unchecked; token norm (the default: q and k passes on the
    // tokens' inverses); token norm staged by two passes (session 40's); q and k staged in one
    // pass each (token_fast off: session 45's first form); k staged (token_fast_k off); token norm
    // (default / q and k staged) with the passes in sequence (serial_passes: no V quantization on
    // a side stream beside them; session 46)
    for (int mode : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
      const bool segmented = mode >= 1 && mode <= 3;
      detail::PrologueCudaTuning pt;
      pt.seg_fast = mode != 1;
      pt.token_two_pass = mode == 5;
      pt.token_fast = mode != 5 && mode != 6 && mode != 9;
      pt.token_fast_k = mode != 7;
      detail::set_prologue_cuda_tuning(pt);
      detail::AttentionCudaTuning at;
      at.serial_passes = mode >= 8;
      detail::set_attention_cuda_tuning(at);
      Prologue p;
      p.norm_weight = segmented ? &wt.view : mode >= 4 ? &wh.view : &w1;
      p.weight_rows = segmented ? &rw.view : nullptr;
      p.check_weight_rows = mode != 3;
      if (mode >= 4) p.norm_scope = NormScope::token;
      p.rope = &rope;
      AttentionOptions o = fp8;
      o.q_prologue = o.k_prologue = &p;
      Row r;
      r.family = "attention";
      r.backend = "cuda";
      r.shape = shape_str(s);
      r.op = std::string("attention() fp8 PV + q / k RMSNorm and RoPE (Flux table)") +
             (mode == 3   ? ", segmented norms (512 text rows, unchecked: no read-back)"
              : segmented ? ", segmented norms (512 text rows, index read-back)"
                          : "") +
             (mode == 1 ? ", first-generation kernels (seg_fast off)" : "") +
             (mode >= 4 ? ", norm over all heads (Wan, norm_scope token)" : "") +
             (mode == 5 ? ", staged by two passes (token_two_pass)" : "") +
             (mode == 6 || mode == 9 ? ", q and k staged (token_fast off)" : "") +
             (mode == 7 ? ", k staged (token_fast_k off)" : "") +
             (mode >= 8 ? ", passes in sequence (serial_passes)" : "");
      r.ms = env.time_ms(
          [&] { attention(q.view, k.view, v.view, out.view, nullptr, o, wp, wb, ctx); });
      synchronize(ctx);
      detail::set_prologue_cuda_tuning({});
      detail::set_attention_cuda_tuning({});
      r.baseline = "attention() fp8 PV without norm / rope";
      r.baseline_ms = plain;
      r.bytes = static_cast<double>(s.B * N * s.H * D) * 2 * 4;
      char note[96];
      std::snprintf(note, sizeof note, "norm + rope add %.4f ms to the call", r.ms - plain);
      r.note = note;
      rows.push_back(r);
    }
  }

  // D = 256 on CUDA: auto (the head-dim-256 wgmma kernel on an sm_90 GPU with the sm_90a build)
  // for both P·V modes after the mma.sync baseline row of the same mask; accuracy: the output
  // against the mma.sync kernel's of the same P·V mode on the sampled rows (one untimed call).
  // Returns auto's 16-bit and fp8 kernel times.
  static std::pair<double, double> auto256_rows(
      const Env& env, const Shape& s, AttentionOptions::Causal causal, const QuantizedRows& qr,
      const QuantizedRows& kr, const DeviceTensor& v, const DeviceTensor& v8, const TensorView& vsv,
      const DeviceTensor& out, const Row& b16, const std::string& tag, std::vector<Row>& rows) {
    Context ctx = env.ctx;
    const int64_t B = s.B, H = s.H, N = s.N, D = s.D;
    double ms[2] = {0, 0};
    for (auto pv : {AttentionOptions::f16, AttentionOptions::fp8}) {
      const bool fp8 = pv == AttentionOptions::fp8;
      AttentionOptions o;
      o.causal = causal;
      o.pv = pv;
      auto call = [&] {
        if (fp8)
          attention_int8(qr, kr, v8.view, &vsv, nullptr, nullptr, out.view, nullptr, o, ctx);
        else
          attention_int8(qr, kr, v.view, nullptr, nullptr, nullptr, out.view, nullptr, o, ctx);
      };
      o.kernel = AttentionOptions::mma_sync;
      call();
      synchronize(ctx);
      const std::vector<float> mma = sampled_rows(s, out.view);
      const std::vector<double> ref(mma.begin(), mma.end());
      o.kernel = AttentionOptions::auto_kernel;
      Row r = b16;
      r.op = std::string("D256 attention_int8 ") + (fp8 ? "fp8" : "16-bit") +
             " PV auto = wgmma (kernel only)" + tag;
      r.ms = env.time_ms(call);
      synchronize(ctx);
      r.accuracy = accuracy(sampled_rows(s, out.view), ref).str() + " vs mma.sync (64 rows)";
      r.bytes = static_cast<double>(B * N * H * D) * (1 + 1 + (fp8 ? 1 : 2) + 2);
      rows.push_back(r);
      ms[fp8 ? 1 : 0] = r.ms;
    }
    return {ms[0], ms[1]};
  }
};

#ifdef LOWBIT_WITH_CUDA
// Family attention.host (CUDA only): the host's time per attention() call and per
// piece, against the GPU's time for the same call. An eager caller (PyTorch without graphs) waits
// on whichever is longer, so a row with host > GPU is host-bound at that shape.
//
// Host time: the stream is held by a host function (cudaLaunchHostFunc) while kCalls calls are
// queued behind it, so the clock sees only the host's work (checks, launches, events, the
// workspace's stream-ordered allocation), none of the GPU's; median of kReps such batches. GPU
// time: env.time_ms (device events, L2 flushed). Floor rows: one launch of an empty kernel.
// Shapes: a small one, (1, 8, 256, 128), where the host matters, and Flux's (1, 24, 4608, 128).
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

// attention.short (session 48): short key sequences, where the fp8 kernel's cost per 128-row
// query block outside its key tiles (start, first q k^T, epilogue: ~4 us against ~1.4 us a key
// tile) weighs: Wan's cross-attention (32760 queries, 512 text keys), a short image sequence,
// 8192 queries over 256..4096 keys, Flux's self-attention, and (session 52) batches of 64 x 256
// and 16 x 1024 tokens with the one call's pieces; (session 54) D = 64 at 64 x 256, 2 x 1024 and
// the (1, 24, 4096, 64), the kernels with one consumer per CTA (two CTAs an SM) or the
// older form forced, and at D = 128 the 16-bit P·V kernel likewise. (B, H, Nq, Nkv, D), TOPS = 4
// B H Nq Nkv D / time. Rows: the kernel (the baseline), then attention() from bf16 q, k, v against
// it (what the quantization passes add). (Session 48's persistent form of the kernel, measured
// with this family, lost: docs/attention.md "Session 48".)
class AttentionShortBench : public BenchCase {
 public:
  std::string name() const override { return "attention.short"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    struct S {
      int64_t B, H, Nq, Nkv, D;
      bool causal = false;  // (session 59) bottom-right causal: LLM prefills of short prompts
      DType dt = DType::bf16;  // (session 60) q, k, v and the output in f16 too (SDXL, fp16 LLMs)
    };
    const std::vector<S> shapes =
        env.quick ? std::vector<S>{{1, 8, 1024, 512, 128}}
                  : std::vector<S>{{1, 40, 32760, 512, 128},
                                   {2, 24, 1024, 1024, 128},
                                   {1, 24, 8192, 256, 128},
                                   {1, 24, 8192, 1024, 128},
                                   {1, 24, 8192, 2048, 128},
                                   {1, 24, 8192, 4096, 128},
                                   {1, 24, 4608, 4608, 128},
                                   {64, 24, 256, 256, 128},
                                   {16, 24, 1024, 1024, 128},
                                   {64, 24, 256, 256, 64},
                                   {2, 24, 1024, 1024, 64},
                                   {1, 24, 4096, 4096, 64},
                                   {16, 32, 1024, 1024, 128, true},
                                   {4, 32, 2048, 2048, 128, true},
                                   {64, 32, 256, 256, 128, true},
                                   // (session 59) SDXL's cross-attention at 1024^2, batch 2
                                   // (CFG): 77 text keys, D 64, 10 / 20 heads
                                   {2, 10, 4096, 77, 64},
                                   {2, 20, 1024, 77, 64},
                                   // (session 60) the same kernels and calls on f16 tensors
                                   {2, 10, 4096, 77, 64, false, DType::f16},
                                   {64, 24, 256, 256, 64, false, DType::f16},
                                   {1, 24, 4096, 4096, 64, false, DType::f16},
                                   {64, 24, 256, 256, 128, false, DType::f16},
                                   {1, 24, 8192, 1024, 128, false, DType::f16},
                                   {1, 24, 4608, 4608, 128, false, DType::f16},
                                   {16, 32, 1024, 1024, 128, true, DType::f16}};
    const Device dev = env.device;
    Context ctx = env.ctx;
    for (const S& s : shapes) {
      const std::string shape = "(" + std::to_string(s.B) + ", " + std::to_string(s.H) + ", " +
                                std::to_string(s.Nq) + ", " + std::to_string(s.Nkv) + ", " +
                                std::to_string(s.D) + ") " + dtype_name(s.dt) +
                                (s.causal ? " causal" : "");
      if (!env.shape_selected(shape)) continue;
      const int64_t B = s.B, H = s.H, Nq = s.Nq, Nkv = s.Nkv, D = s.D;
      DeviceTensor q = make_tensor(dev, s.dt, {B, Nq, H, D}, 51);
      DeviceTensor k = make_tensor(dev, s.dt, {B, Nkv, H, D}, 52);
      DeviceTensor v = make_tensor(dev, s.dt, {B, Nkv, H, D}, 53);
      DeviceTensor out = make_empty(dev, s.dt, {B, Nq, H, D});
      const KernelCodes codes = kernel_codes(dev, B, Nq, Nkv, H, D, 54);
      DeviceTensor v8 = make_empty(dev, DType::e4m3, {B, H, D, (Nkv + 63) / 64 * 64});
      DeviceTensor vs = make_empty(dev, DType::f32, {B, H, D});
      quantize_v_fp8(v.view, v8.view, vs.view, nullptr, ctx);
      const TensorView vsv = vs.view;
      const QuantizedRows qr = codes.q(), kr = codes.k();
      AttentionOptions fp8;
      if (s.causal) fp8.causal = AttentionOptions::bottom_right;
      const size_t wb = attention_workspace_bytes(q.view, k.view, fp8);
      DeviceTensor ws = make_empty(dev, DType::u8, {static_cast<int64_t>(wb)});
      const double flops = 4.0 * B * H * static_cast<double>(Nq) * Nkv * D;
      double kernel_ms = 0;
      AttentionOptions mma = fp8;
      mma.kernel = AttentionOptions::mma_sync;
      AttentionOptions f16 = fp8;
      f16.pv = AttentionOptions::f16;
      // Session 53: q / k norm + rope (NormRope) in the call; keys = queries only (one table).
      const NormRope norm_rope(dev, Nq, D, 55);
      const Prologue nr = norm_rope.on(Prologue{}, true);
      AttentionOptions fp8_nr = fp8;
      fp8_nr.q_prologue = fp8_nr.k_prologue = &nr;
      // the kernel, attention(), then (session 52) the portable mma.sync kernel on the same codes
      // and attention() with the short k path off (the k path's two passes); (session 54) the
      // kernel with one consumer warpgroup per CTA (two CTAs an SM) or the kernel of two (D 128)
      // / three (D 64) forced (tuning cons1), and the 16-bit P·V kernel (auto, and the same two)
      enum Call {
        kernel,
        cons1,
        cons1_heads_inner,
        cons2,
        call,
        mma_sync,
        k_two_passes,
        fork_q_off,
        q_pass,
        q_blocks_outer,
        q_prefetch,
        with_norm_rope,
        pv16,
        pv16_cons1,
        pv16_cons2,
        pv16_call,
        pv16_q_pass
      };
      std::vector<Call> calls = {kernel, cons1,          cons1_heads_inner, cons2,
                                 call,   mma_sync,       k_two_passes,      fork_q_off,
                                 q_pass, q_blocks_outer, q_prefetch};
      if (Nq == Nkv && !s.causal && s.dt == DType::bf16) calls.push_back(with_norm_rope);
      if (D == 128 && !s.causal) calls.insert(calls.end(), {pv16, pv16_cons1, pv16_cons2});
      // causal: the kernel's forms, the call (q in the kernel, prefetched), q's own pass, and q in
      // the kernel without the prefetch
      if (s.causal) calls = {kernel, cons1, cons2, call, q_pass, q_prefetch};
      // (session 61) the 16-bit P·V call: q quantized in its ring kernel, or by its own pass
      calls.insert(calls.end(), {pv16_call, pv16_q_pass});
      for (const Call c : calls) {
        Row r;
        r.family = "attention";
        r.shape = shape;
        r.backend = device_name(dev);
        static const char* const kOps[] = {
            "attention_int8 fp8 PV auto (kernel only)",
            "attention_int8 fp8 PV, 1 consumer / CTA, 2 CTAs / SM (cons1 1)",
            "attention_int8 fp8 PV, 1 consumer / CTA, heads fastest in the grid (heads_inner)",
            "attention_int8 fp8 PV, 2 (D 128) / 3 (D 64) consumers / CTA (cons1 2)",
            "attention() fp8 PV, incl. quantization",
            "attention_int8 fp8 PV mma.sync (kernel only)",
            "attention() fp8 PV, short k path off (short_k_tokens 0)",
            "attention() fp8 PV, q's prologue on the caller's stream (fork_q 1)",
            "attention() fp8 PV, q by its own pass, not in the kernel (fused_q 1)",
            "attention() fp8 PV, q in the kernel, grid's query blocks fastest (fused_q 3)",
            "attention() fp8 PV, q in the kernel, no L2 prefetch of q (fused_q 4)",
            "attention() fp8 PV, q / k norm + rope",
            "attention_int8 16-bit PV auto (kernel only)",
            "attention_int8 16-bit PV, 1 consumer / CTA, 2 CTAs / SM (cons1 1)",
            "attention_int8 16-bit PV, 3 consumers / CTA (cons1 2)",
            "attention() 16-bit PV, incl. quantization",
            "attention() 16-bit PV, q by its own pass, not in the kernel (fused_q 1)"};
        r.op = kOps[c];
        detail::PrologueCudaTuning t;
        if (c == k_two_passes) t.short_k_tokens = 0;
        detail::set_prologue_cuda_tuning(t);
        detail::AttentionCudaTuning at;
        if (c == fork_q_off) at.fork_q = 1;
        if (c == q_pass || c == pv16_q_pass) at.fused_q = 1;
        if (c == q_blocks_outer) at.fused_q = 3;
        if (c == q_prefetch) at.fused_q = 4;
        if (c == cons1 || c == pv16_cons1 || c == cons1_heads_inner) at.cons1 = 1;
        if (c == cons1_heads_inner) at.heads_inner = true;
        if (c == cons2 || c == pv16_cons2) at.cons1 = 2;
        detail::set_attention_cuda_tuning(at);
        const bool one_call = c == call || c == k_two_passes || c == fork_q_off || c == q_pass ||
                              c == q_blocks_outer || c == q_prefetch || c == with_norm_rope ||
                              c == pv16_call || c == pv16_q_pass;
        const bool b16 = c == pv16 || c == pv16_cons1 || c == pv16_cons2;
        r.ms = env.time_ms([&] {
          if (one_call)
            attention(q.view, k.view, v.view, out.view, nullptr,
                      c == with_norm_rope                  ? fp8_nr
                      : c == pv16_call || c == pv16_q_pass ? f16
                                                           : fp8,
                      ws.view.data, wb, ctx);
          else if (b16)
            attention_int8(qr, kr, v.view, nullptr, nullptr, nullptr, out.view, nullptr, f16, ctx);
          else
            attention_int8(qr, kr, v8.view, &vsv, nullptr, nullptr, out.view, nullptr,
                           c == mma_sync ? mma : fp8, ctx);
        });
        detail::set_prologue_cuda_tuning({});
        detail::set_attention_cuda_tuning({});
        if (c == kernel) kernel_ms = r.ms;
        r.flops = flops;
        r.baseline = "the kernel alone";
        r.baseline_ms = kernel_ms;
        rows.push_back(r);
      }
      // Session 52: batches of short sequences (queries = keys), where the passes weigh most:
      // the one call in its pieces.
      if (Nq == Nkv && B > 1 && !s.causal && s.dt == DType::bf16)
        pieces_of_one_call(env, Shape{B, H, Nq, D}, q, k, v, out, rows);
    }
    return rows;
  }
};

// attention.varlen (session 50): packed batches of sequences. Runs of equal lengths go as one
// batched call each (attention_varlen's runs) against every sequence a call of its own (tuning
// varlen_each, the form before), and against attention() on the same batch as a (B, N, H, D)
// tensor where every length is equal. Sequences (queries = keys), H 24, D 128, fp8 P·V; TOPS =
// 4 H D sum(N^2) / time.
class AttentionVarlenBench : public BenchCase {
 public:
  std::string name() const override { return "attention.varlen"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    struct S {
      std::string what;
      std::vector<int64_t> lens;
    };
    std::vector<S> sets = {{"16 x 1024", std::vector<int64_t>(16, 1024)},
                           {"4 x 4608 (Flux 1024^2, batch 4)", std::vector<int64_t>(4, 4608)},
                           {"64 x 256", std::vector<int64_t>(64, 256)}};
    S mixed{"4 x 4096 + 8 x 1024 + 16 x 256 (three runs)", {}};
    for (auto [n, len] : {std::pair<int, int64_t>{4, 4096}, {8, 1024}, {16, 256}})
      mixed.lens.insert(mixed.lens.end(), static_cast<size_t>(n), len);
    sets.push_back(mixed);
    // Session 51: distinct lengths (LLM-style batches), which attention_varlen gathers into
    // padded buckets: 64 sequences of 192..318 tokens, 16 of 960..1110, and 32 spread over
    // 64..4000 (several buckets and sequences of their own).
    S d64{"64 distinct lengths 192..318", {}}, d16{"16 distinct lengths 960..1110", {}},
        spread{"32 distinct lengths 64..4000", {}};
    for (int i = 0; i < 64; ++i) d64.lens.push_back(192 + 2 * i);
    for (int i = 0; i < 16; ++i) d16.lens.push_back(960 + 10 * i);
    for (int i = 0; i < 32; ++i)
      spread.lens.push_back(static_cast<int64_t>(64.0 * std::pow(4000.0 / 64.0, i / 31.0)));
    sets.push_back(d64);
    sets.push_back(d16);
    sets.push_back(spread);
    if (env.quick)
      sets = {{"4 x 256", std::vector<int64_t>(4, 256)},
              {"4 distinct 250..256", {250, 252, 254, 256}}};
    const Device dev = env.device;
    const int64_t H = 24, D = 128;
    Context ctx = env.ctx;
    for (const S& set : sets) {
      const std::string shape = set.what + ", H 24, D 128, bf16";
      if (!env.shape_selected(shape)) continue;
      std::vector<int64_t> cu = {0};
      double flops = 0;
      for (int64_t n : set.lens) {
        cu.push_back(cu.back() + n);
        flops += 4.0 * H * D * static_cast<double>(n) * static_cast<double>(n);
      }
      const int64_t T = cu.back();
      DeviceTensor q = make_tensor(dev, DType::bf16, {T, H, D}, 61);
      DeviceTensor k = make_tensor(dev, DType::bf16, {T, H, D}, 62);
      DeviceTensor v = make_tensor(dev, DType::bf16, {T, H, D}, 63);
      DeviceTensor out = make_empty(dev, DType::bf16, {T, H, D});
      const AttentionOptions fp8;
      const detail::AttentionCudaTuning saved = detail::attention_cuda_tuning();
      double each_ms = 0;
      for (int form = 0; form < 4; ++form) {
        const bool equal = std::all_of(set.lens.begin(), set.lens.end(),
                                       [&](int64_t n) { return n == set.lens[0]; });
        if ((form == 2 && !equal) || (form == 3 && equal)) continue;
        detail::AttentionCudaTuning t = saved;
        t.varlen_each = form == 0;
        t.varlen_pad_all = form == 3;
        detail::set_attention_cuda_tuning(t);
        Row r;
        r.family = "attention";
        r.shape = shape;
        r.backend = device_name(dev);
        const int64_t B = static_cast<int64_t>(set.lens.size()), N = set.lens[0];
        r.op = form == 0   ? "attention_varlen, every sequence a call (varlen_each)"
               : form == 1 ? (equal ? "attention_varlen, runs of equal lengths batched"
                                    : "attention_varlen, distinct lengths in padded buckets")
               : form == 2 ? "attention() on the same batch as (B, N, H, D)"
                           : "attention_varlen, padded buckets without the cost model";
        r.ms = env.time_ms([&] {
          if (form != 2)
            attention_varlen(q.view, k.view, v.view, cu, cu, out.view, nullptr, fp8, ctx);
          else
            attention(with_shape(q.view, {B, N, H, D}), with_shape(k.view, {B, N, H, D}),
                      with_shape(v.view, {B, N, H, D}), with_shape(out.view, {B, N, H, D}), nullptr,
                      fp8, ctx);
        });
        detail::set_attention_cuda_tuning(saved);
        if (form == 0) each_ms = r.ms;
        r.flops = flops;
        r.baseline = "every sequence a call";
        r.baseline_ms = each_ms;
        rows.push_back(r);
      }
    }
    return rows;
  }

 private:
  // The contiguous view t with another shape (the same elements).
  static TensorView with_shape(TensorView t, const std::vector<int64_t>& shape) {
    return make_view(t.data, t.dtype, static_cast<int>(shape.size()), shape.data(), t.device);
  }
};

class AttentionHostBench : public BenchCase {
 public:
  std::string name() const override { return "attention.host"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    for (const Shape& s : {Shape{1, 8, 256, 128}, Shape{1, 24, 4608, 128}}) {
      const std::string shape = shape_str(s);
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
    Pieces P(dev, s);  // the pieces on their own buffers
    TensorView o_view = out.view;
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
    row("floor: an empty kernel (cudaLaunchKernelEx, PDL)",
        [&] { launch_empty_kernel(ctx, true); });
    row("attention() on a caller's workspace", [&] {
      attention(q.view, k.view, v.view, o_view, nullptr, opt, ws.view.data, ws_bytes, ctx);
    });
    row("attention() making its own (stream-ordered)",
        [&] { attention(q.view, k.view, v.view, o_view, nullptr, opt, ctx); });
    row("q prologue (norm_rope_quantize)",
        [&] { norm_rope_quantize(q.view, P.qp, P.qr.data, P.qr.scale, ctx); });
    row("k path (norm_rope_mean_quantize)",
        [&] { norm_rope_mean_quantize(k.view, P.kp, P.kmv, P.kr.data, P.kr.scale, ctx); });
    row("V fp8 (quantize_v_fp8)", [&] { quantize_v_fp8(v.view, P.v8.view, P.vsv, nullptr, ctx); });
    row("kernel (attention_int8)", [&] {
      attention_int8(P.qr, P.kr, P.v8.view, &P.vsv, nullptr, &P.kmv, o_view, nullptr, P.inner, ctx);
    });
  }
};
#endif  // LOWBIT_WITH_CUDA

LOWBIT_BENCH_CASES(attention_bench_cases) {
  cases.push_back(std::make_unique<AttentionBench>(
      Family{"attention.prefill",
             {{1, 40, 32760, 128}, {2, 24, 16384, 128}, {1, 24, 4096, 64}, {1, 24, 4608, 128}},
             {{1, 24, 4096, 64}},
             64,
             11,
             "",
             false}));
  // Session 20: the kernel's fixed cost per CTA at Flux's size (fp8 P·V 630 TOPS at (1, 24, 4608,
  // 128) against ~790 at the shapes). 128-row CTAs, one per SM: (1, 22, 4608, 128) and
  // (1, 11, 9216, 128) are 792 CTAs = 6 full waves on 132 SMs with 36 and 72 key tiles per CTA,
  // so time = 6 (a + tiles b) splits the per-CTA cost a from the per-tile cost b; (1, 24, 4608,
  // 128) (864 CTAs, 6.55 waves) is Flux's.
  {
    Family w{"attention.waves", {{1, 22, 4608, 128}, {1, 11, 9216, 128}}, {{1, 22, 4608, 128}},
             128, 31, "", false};
    w.cuda_only = true;
    cases.push_back(std::make_unique<AttentionBench>(w));
  }
  cases.push_back(std::make_unique<AttentionBench>(
      Family{"attention.d256",
             {{1, 24, 4096, 256}, {1, 24, 16384, 256}},
             {{1, 24, 4096, 256}},
             256,
             21,
             "D256 ",
             true}));
#ifdef LOWBIT_WITH_CUDA
  cases.push_back(std::make_unique<AttentionHostBench>());
  cases.push_back(std::make_unique<AttentionShortBench>());
  cases.push_back(std::make_unique<AttentionVarlenBench>());
#endif
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
