// Harness cases for head dim 256 (issue 4): the attention prologue, V to fp8, the INT8 attention
// kernel (the mma.sync kernel: the wgmma kernels cover 64 / 128 only, and auto picks mma.sync at
// D = 256) and the one-call attention() / attention_varlen, every backend against the CPU oracle
// with the tolerances of prologue_cases.cpp / attention_cases.cpp (fp8 P·V at D = 256 runs on
// f16 tensor cores from a V tile the CTA widens to f16). Names: prologue.d256.* and
// attention.d256.* (`lowbit check --op '\.d256\.'`).
//
// Prologue at D = 256 on CUDA: the first-generation quantize kernel (64-row passes) and the
// round-2 / first-generation mean kernels (src/cuda/prologue.cu; the round-3/4 kernels of
// prologue_v3.cu do not take D = 256). Codes: CUDA divides with div.full.f32, so a code may move
// by one on at most 1 element in 10^4 (plain x * sm_scale: only at an exact rounding tie).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "lowbit/attention.h"
#include "lowbit/prologue.h"
#include "lowbit/runtime.h"
#include "src/core/prologue_internal.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {
namespace {

constexpr int64_t kD = 256;

// ---- prologue ----------------------------------------------------------------------------------

enum class Pass { quantize, mean, fused, store };
enum class Norm { none, per_head, segmented };
enum class RopeKind { none, split, interleaved };

struct PCfg {
  Pass pass = Pass::quantize;
  DType dtype = DType::bf16;
  int64_t B = 1, N = 17, H = 3;
  ScaleLayout layout = ScaleLayout::thread_q;
  int block = 32;
  Norm norm = Norm::per_head;
  DType w_dtype = DType::bf16;
  RopeKind rope = RopeKind::split;
  int64_t pairs = kD / 2;
  bool matrix_table = false;  // (..., pairs, 2, 2)
  bool mean = false;          // subtract a given mean (quantize)
  float sm_scale = 1.f, scale_eps = 1e-7f;
  bool qkv = false;     // x is the k slice of a (B, N, 3, H, D) buffer
  bool legacy = false;  // CUDA: force the first-generation kernels (the mean pass)
  std::string tag;
};

class Prologue256Case : public Case {
 public:
  explicit Prologue256Case(PCfg c) : c_(std::move(c)) {}

  std::string name() const override {
    const char* pass = c_.pass == Pass::quantize ? "quantize"
                       : c_.pass == Pass::mean   ? "mean"
                       : c_.pass == Pass::fused  ? "meanquant"
                                                 : "store";
    std::string s = std::string("prologue.d256.") + pass + "." + c_.tag + "." +
                    dtype_name(c_.dtype) + ".B" + std::to_string(c_.B) + "N" +
                    std::to_string(c_.N) + "H" + std::to_string(c_.H);
    if (c_.pass == Pass::quantize || c_.pass == Pass::fused)
      s += std::string(".") + scale_layout_name(c_.layout) + std::to_string(c_.block);
    return s;
  }

  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    HostTensor x(c_.dtype, c_.qkv ? std::vector<int64_t>{c_.B, c_.N, 3, c_.H, kD}
                                  : std::vector<int64_t>{c_.B, c_.N, c_.H, kD});
    x.fill_normal(rng, 0.3f, 2.f);
    in.push_back(std::move(x));
    const int64_t R = 3;
    HostTensor w(c_.w_dtype, c_.norm == Norm::segmented ? std::vector<int64_t>{R, kD}
                                                        : std::vector<int64_t>{kD});
    w.fill_uniform(rng, 0.25f, 2.f);
    in.push_back(std::move(w));
    HostTensor rows(DType::i32, {c_.N});
    for (int64_t n = 0; n < c_.N; ++n)
      rows.as<int32_t>()[n] = static_cast<int32_t>((n * 7 / 5) % R);
    in.push_back(std::move(rows));
    std::vector<int64_t> ts = {1, c_.N, 1, c_.pairs, 2};
    if (c_.matrix_table) ts.push_back(2);
    HostTensor table(DType::f32, ts);
    std::uniform_real_distribution<float> ang(-3.14159f, 3.14159f);
    for (int64_t i = 0; i < c_.N * c_.pairs; ++i) {
      const float t = ang(rng), co = std::cos(t), si = std::sin(t);
      float* e = table.as<float>() + i * (c_.matrix_table ? 4 : 2);
      if (c_.matrix_table)
        e[0] = co, e[1] = -si, e[2] = si, e[3] = co;
      else
        e[0] = co, e[1] = si;
    }
    in.push_back(std::move(table));
    HostTensor mean(DType::f32, {c_.B, c_.H, kD});
    mean.fill_normal(rng, 0.2f, 0.3f);
    in.push_back(std::move(mean));
    return in;
  }

  std::vector<OutputSpec> outputs() const override {
    OutputSpec m;
    m.name = "mean";
    m.shape = {c_.B, c_.H, kD};
    m.tol = Tolerance::allclose(2e-6, 2e-5);  // the GPU adds in another order
    if (c_.pass == Pass::mean) return {m};
    if (c_.pass == Pass::store) {
      OutputSpec y;
      y.name = "y";
      y.dtype = c_.dtype;
      y.shape = {c_.B, c_.N, c_.H, kD};
      y.tol = Tolerance::bit_exact();
      return {y};
    }
    OutputSpec q;
    q.name = "q";
    q.dtype = DType::i8;
    q.shape = {c_.B, c_.N, c_.H, kD};
    q.tol = Tolerance::codes_within(1, 1e-4);
    OutputSpec s;
    s.name = "scale";
    s.shape = {c_.B, c_.H, prologue_scale_count(c_.N, c_.layout, c_.block)};
    s.tol = Tolerance::allclose(0, 1e-6);
    if (c_.pass == Pass::fused) return {q, s, m};
    return {q, s};
  }

  // Plain x * sm_scale (no norm, rope or mean): a code may differ, by one, only where the CPU's
  // exact quotient lies within 4 ulp of a rounding tie (prologue_cases.cpp's rule).
  std::string compare_output(size_t k, const std::vector<OutputSpec>& specs,
                             const std::vector<HostTensor>& inputs,
                             const std::vector<HostTensor>& ref,
                             const std::vector<HostTensor>& got) const override {
    const bool plain = c_.norm == Norm::none && c_.rope == RopeKind::none && !c_.mean &&
                       c_.pass == Pass::quantize;
    if (!plain || k != 0) return Case::compare_output(k, specs, inputs, ref, got);
    const HostTensor &x = inputs[0], &qr = ref[0], &qg = got[0], &scale = ref[1];
    const int64_t n_scales = specs[1].shape[2];
    for (int64_t i = 0; i < qr.numel(); ++i) {
      const float rc = qr.get(i), gc = qg.get(i);
      if (rc == gc) continue;
      const int64_t d = i % kD, h = (i / kD) % c_.H, n = (i / (kD * c_.H)) % c_.N,
                    b = i / (kD * c_.H * c_.N);
      const int64_t xi = c_.qkv ? (((b * c_.N + n) * 3 + 1) * c_.H + h) * kD + d : i;
      const float v = x.get(xi) * c_.sm_scale;
      const float s = scale.get((b * c_.H + h) * n_scales + scale_index(c_.layout, c_.block, n));
      const float qv = std::fabs(v / s);
      const float from_tie = std::fabs(qv - std::floor(qv) - 0.5f);
      if (std::fabs(rc - gc) > 1 || from_tie > std::ldexp(qv, -21))
        return "output 'q' element " + std::to_string(i) + ": expected code " +
               std::to_string(static_cast<int>(rc)) + ", got " +
               std::to_string(static_cast<int>(gc)) + " where the exact quotient " +
               std::to_string(qv) + " is no rounding tie";
    }
    return "";
  }

  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView x = in[0];
    if (c_.qkv) {  // the k slice: channels H*D into each token's (3, H, D) row
      const int64_t e = dtype_bits(x.dtype) / 8;
      x = make_view(static_cast<char*>(in[0].data) + c_.H * kD * e, c_.dtype,
                    {c_.B, c_.N, c_.H, kD}, in[0].device);
      x.stride[0] = c_.N * 3 * c_.H * kD;
      x.stride[1] = 3 * c_.H * kD;
    }
    Rope rope;
    rope.table = in[3];
    rope.interleaved = c_.rope == RopeKind::interleaved;
    Prologue p;
    if (c_.norm != Norm::none) p.norm_weight = &in[1];
    if (c_.norm == Norm::segmented) p.weight_rows = &in[2];
    if (c_.rope != RopeKind::none) p.rope = &rope;
    if (c_.mean) p.mean = &in[4];
    p.sm_scale = c_.sm_scale;
    p.scale_eps = c_.scale_eps;
    p.layout = c_.layout;
    p.block = c_.block;
    struct Tuning {  // the CUDA knob (the CPU ignores it), reset on every exit
      explicit Tuning(bool legacy) {
        detail::PrologueCudaTuning t;
        t.legacy = legacy;
        detail::set_prologue_cuda_tuning(t);
      }
      ~Tuning() { detail::set_prologue_cuda_tuning({}); }
    } tuning(c_.legacy);
    switch (c_.pass) {
      case Pass::mean:
        norm_rope_mean(x, p, out[0], ctx);
        break;
      case Pass::store:
        detail::norm_rope_store(x, p, out[0], ctx);
        break;
      case Pass::fused:
        norm_rope_mean_quantize(x, p, out[2], out[0], out[1], ctx);
        break;
      case Pass::quantize:
        norm_rope_quantize(x, p, out[0], out[1], ctx);
        break;
    }
  }

 private:
  PCfg c_;
};

// ---- V to fp8 ----------------------------------------------------------------------------------

// Codes and scales bit-exact without the mean (signed zeros and an all-zero channel included);
// with the mean the GPU sums in another order, so a code may move by one step.
class QuantizeV256Case : public Case {
 public:
  QuantizeV256Case(int64_t B, int64_t N, int64_t H, DType dt, bool mean, bool hnd = false)
      : B_(B), N_(N), H_(H), dt_(dt), mean_(mean), hnd_(hnd) {}
  std::string name() const override {
    return "attention.d256.quantize_v_fp8.b" + std::to_string(B_) + ".n" + std::to_string(N_) +
           ".h" + std::to_string(H_) + "." + dtype_name(dt_) + (mean_ ? ".mean" : "") +
           (hnd_ ? ".hnd" : "");
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    in.emplace_back(dt_, hnd_ ? std::vector<int64_t>{B_, H_, N_, kD}
                              : std::vector<int64_t>{B_, N_, H_, kD});
    in[0].fill_normal(rng, mean_ ? 2.f : 0.f, 1.5f);
    if (!mean_ && !hnd_ && N_ >= 3) {
      HostTensor& v = in[0];
      for (int64_t b = 0; b < B_; ++b)
        for (int64_t n = 0; n < N_; ++n)
          for (int64_t h = 0; h < H_; ++h) v.set(((b * N_ + n) * H_ + h) * kD + 200, 0.f);
      v.set((1 * H_) * kD + 1, -0.f);
      v.set((2 * H_) * kD + 255, -0.f);
    }
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    const int64_t npad = (N_ + 63) / 64 * 64;
    OutputSpec c;
    c.name = "v_fp8";
    c.dtype = DType::e4m3;
    c.shape = {B_, H_, kD, npad};
    c.tol = mean_ ? Tolerance::allclose(2e-3, 0.13) : Tolerance::bit_exact();
    OutputSpec sc;
    sc.name = "v_scale";
    sc.dtype = DType::f32;
    sc.shape = {B_, H_, kD};
    sc.tol = mean_ ? Tolerance::allclose(0, 1e-5) : Tolerance::bit_exact();
    std::vector<OutputSpec> o = {c, sc};
    if (mean_) {
      OutputSpec m = sc;
      m.name = "v_mean";
      m.tol = Tolerance::allclose(1e-5, 1e-5);
      o.push_back(m);
    }
    return o;
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView v = in[0];
    if (hnd_) {
      std::swap(v.shape[1], v.shape[2]);
      std::swap(v.stride[1], v.stride[2]);
    }
    TensorView m = mean_ ? out[2] : TensorView{};
    quantize_v_fp8(v, out[0], out[1], mean_ ? &m : nullptr, ctx);
  }

 private:
  int64_t B_, N_, H_;
  DType dt_;
  bool mean_, hnd_;
};

// ---- INT8 attention ----------------------------------------------------------------------------

struct Shape {
  int64_t B, Nq, Nkv, Hq, Hkv;
};

std::string shape_name(const Shape& s) {
  return "b" + std::to_string(s.B) + ".nq" + std::to_string(s.Nq) + ".nkv" + std::to_string(s.Nkv) +
         ".hq" + std::to_string(s.Hq) + ".hkv" + std::to_string(s.Hkv);
}
const char* causal_name(AttentionOptions::Causal c) {
  return c == AttentionOptions::none           ? "full"
         : c == AttentionOptions::bottom_right ? "causal_br"
                                               : "causal_tl";
}
const char* kernel_name(AttentionOptions::Kernel k) {
  return k == AttentionOptions::mma_sync ? ".mma_sync" : "";
}

TensorView hnd_as_nhd(TensorView t) {
  std::swap(t.shape[1], t.shape[2]);
  std::swap(t.stride[1], t.stride[2]);
  return t;
}

struct ACfg {
  Shape s;
  AttentionOptions opt;
  DType dt = DType::bf16;
  ScaleLayout ql = ScaleLayout::per_block;
  int qb = 128;
  ScaleLayout kl = ScaleLayout::per_block;
  int kb = 64;
  bool hnd = false, k_mean = false;
  bool zero_q = false;  // q codes 0: out = the mean of V over the visible keys (P·V alone)
};

class Int8Attention256Case : public Case {
 public:
  explicit Int8Attention256Case(ACfg c) : c_(c) {}

  std::string name() const override {
    std::string n = "attention.d256.int8." +
                    std::string(c_.opt.pv == AttentionOptions::fp8 ? "fp8" : "f16") + "." +
                    causal_name(c_.opt.causal) + "." + shape_name(c_.s) + "." + dtype_name(c_.dt);
    if (c_.hnd) n += ".hnd";
    if (c_.opt.smooth_v) n += ".vmean";
    if (c_.k_mean) n += ".kmean";
    if (c_.ql != ScaleLayout::per_block)
      n += std::string(".") + scale_layout_name(c_.ql) + std::to_string(c_.qb);
    if (c_.kl != ScaleLayout::per_block || c_.kb != 64)
      n += std::string(".k") + scale_layout_name(c_.kl) + std::to_string(c_.kb);
    if (c_.zero_q) n += ".zero_q";
    return n + kernel_name(c_.opt.kernel);
  }

  // q, q_scale, k, k_scale, v, k_mean.
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    const Shape& s = c_.s;
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> spread(0.8f, 1.2f);
    auto codes = [&](int64_t N, int64_t H) {
      HostTensor t(DType::i8, c_.hnd ? std::vector<int64_t>{s.B, H, N, kD}
                                     : std::vector<int64_t>{s.B, N, H, kD});
      for (int64_t i = 0; i < t.numel(); ++i)
        t.set(i, std::max(-127.f, std::min(127.f, std::nearbyint(normal(rng) * 32.f))));
      return t;
    };
    // Scales ~1/45: q·k over 256 channels has the logit spread of D = 128's cases.
    auto scales = [&](int64_t N, int64_t H, ScaleLayout l, int blk) {
      HostTensor t(DType::f32, {s.B, H, scale_count(l, blk, N)});
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, spread(rng) / 45.f);
      return t;
    };
    std::vector<HostTensor> in;
    in.push_back(codes(s.Nq, s.Hq));
    if (c_.zero_q)
      for (int64_t i = 0; i < in[0].numel(); ++i) in[0].set(i, 0.f);
    in.push_back(scales(s.Nq, s.Hq, c_.ql, c_.qb));
    in.push_back(codes(s.Nkv, s.Hkv));
    in.push_back(scales(s.Nkv, s.Hkv, c_.kl, c_.kb));
    HostTensor v(c_.dt, c_.hnd ? std::vector<int64_t>{s.B, s.Hkv, s.Nkv, kD}
                               : std::vector<int64_t>{s.B, s.Nkv, s.Hkv, kD});
    v.fill_normal(rng, c_.opt.smooth_v ? 3.f : 0.f);
    in.push_back(std::move(v));
    HostTensor km(DType::f32, {s.B, s.Hkv, kD});
    km.fill_normal(rng);
    in.push_back(std::move(km));
    return in;
  }

  std::vector<OutputSpec> outputs() const override {
    const Shape& s = c_.s;
    OutputSpec o;
    o.name = "out";
    o.dtype = c_.dt;
    o.shape = c_.hnd ? std::vector<int64_t>{s.B, s.Hq, s.Nq, kD}
                     : std::vector<int64_t>{s.B, s.Nq, s.Hq, kD};
    o.tol = Tolerance::allclose(2e-2, 2e-2);
    OutputSpec l;
    l.name = "lse";
    l.dtype = DType::f32;
    l.shape = {s.B, s.Hq, s.Nq};
    l.tol = Tolerance::allclose(2e-3, 1e-3);
    l.tol.allow_nonfinite = true;  // -inf for rows that see no key
    return {o, l};
  }

  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    const Shape& s = c_.s;
    auto view = [&](TensorView t) { return c_.hnd ? hnd_as_nhd(t) : t; };
    QuantizedRows q{view(in[0]), in[1], c_.ql, c_.qb};
    QuantizedRows k{view(in[2]), in[3], c_.kl, c_.kb};
    TensorView v = view(in[4]);
    TensorView o = view(out[0]);
    TensorView lse = out[1];
    const TensorView* km = c_.k_mean ? &in[5] : nullptr;
    if (c_.opt.pv == AttentionOptions::f16) {
      attention_int8(q, k, v, nullptr, nullptr, km, o, &lse, c_.opt, ctx);
      return;
    }
    const Device dev = v.device;
    const int64_t npad = (s.Nkv + 63) / 64 * 64;
    Buffer v8(dev, static_cast<size_t>(s.B * s.Hkv * kD * npad));
    Buffer vs(dev, static_cast<size_t>(s.B * s.Hkv * kD) * 4);
    Buffer vm(dev, static_cast<size_t>(s.B * s.Hkv * kD) * 4);
    TensorView v8v = make_view(v8.data(), DType::e4m3, {s.B, s.Hkv, kD, npad}, dev);
    TensorView vsv = make_view(vs.data(), DType::f32, {s.B, s.Hkv, kD}, dev);
    TensorView vmv = make_view(vm.data(), DType::f32, {s.B, s.Hkv, kD}, dev);
    const bool sv = c_.opt.smooth_v;
    quantize_v_fp8(v, v8v, vsv, sv ? &vmv : nullptr, ctx);
    attention_int8(q, k, v8v, &vsv, sv ? &vmv : nullptr, km, o, &lse, c_.opt, ctx);
    synchronize(ctx);  // the scratch buffers are freed on return
  }

 private:
  ACfg c_;
};

// ---- one call ----------------------------------------------------------------------------------

std::vector<OutputSpec> one_call_outputs(DType dt, std::vector<int64_t> out_shape,
                                         std::vector<int64_t> lse_shape) {
  OutputSpec o;
  o.name = "out";
  o.dtype = dt;
  o.shape = std::move(out_shape);
  o.tol = Tolerance::allclose(3e-2, 3e-2);  // INT8 codes may differ by one (div.full.f32)
  OutputSpec l;
  l.name = "lse";
  l.dtype = DType::f32;
  l.shape = std::move(lse_shape);
  l.tol = Tolerance::allclose(1e-2, 1e-3);
  l.tol.allow_nonfinite = true;
  return {o, l};
}

class AttentionCall256Case : public Case {
 public:
  AttentionCall256Case(Shape s, AttentionOptions opt, DType dt) : s_(s), opt_(opt), dt_(dt) {}
  std::string name() const override {
    return "attention.d256.call." +
           std::string(opt_.pv == AttentionOptions::fp8 ? "fp8" : "f16") + "." +
           causal_name(opt_.causal) + "." + shape_name(s_) + "." + dtype_name(dt_) +
           (opt_.smooth_k ? ".smooth_k" : "") + (opt_.smooth_v ? ".smooth_v" : "") +
           kernel_name(opt_.kernel);
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    in.emplace_back(dt_, std::vector<int64_t>{s_.B, s_.Nq, s_.Hq, kD});
    in.emplace_back(dt_, std::vector<int64_t>{s_.B, s_.Nkv, s_.Hkv, kD});
    in.emplace_back(dt_, std::vector<int64_t>{s_.B, s_.Nkv, s_.Hkv, kD});
    in[0].fill_normal(rng);
    in[1].fill_normal(rng, 0.5f);  // a K mean for the smoothing to remove
    in[2].fill_normal(rng);
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    return one_call_outputs(dt_, {s_.B, s_.Nq, s_.Hq, kD}, {s_.B, s_.Hq, s_.Nq});
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView lse = out[1];
    attention(in[0], in[1], in[2], out[0], &lse, opt_, ctx);
  }

 private:
  Shape s_;
  AttentionOptions opt_;
  DType dt_;
};

// Packed sequences: odd lengths, an empty query range, an empty key range, GQA.
class AttentionVarlen256Case : public Case {
 public:
  AttentionVarlen256Case(AttentionOptions opt, DType dt) : opt_(opt), dt_(dt) {}
  std::string name() const override {
    return "attention.d256.varlen." +
           std::string(opt_.pv == AttentionOptions::fp8 ? "fp8" : "f16") + "." +
           causal_name(opt_.causal) + "." + dtype_name(dt_);
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    in.emplace_back(dt_, std::vector<int64_t>{cu_q_.back(), kHq, kD});
    in.emplace_back(dt_, std::vector<int64_t>{cu_k_.back(), kHkv, kD});
    in.emplace_back(dt_, std::vector<int64_t>{cu_k_.back(), kHkv, kD});
    in[0].fill_normal(rng);
    in[1].fill_normal(rng, 0.5f);
    in[2].fill_normal(rng);
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    return one_call_outputs(dt_, {cu_q_.back(), kHq, kD}, {kHq, cu_q_.back()});
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView lse = out[1];
    attention_varlen(in[0], in[1], in[2], cu_q_, cu_k_, out[0], &lse, opt_, ctx);
  }

 private:
  static constexpr int64_t kHq = 4, kHkv = 2;
  const std::vector<int64_t> cu_q_ = {0, 1, 130, 130, 200, 457};
  const std::vector<int64_t> cu_k_ = {0, 70, 200, 260, 260, 390};
  AttentionOptions opt_;
  DType dt_;
};

AttentionOptions make_opt(AttentionOptions::PV pv, AttentionOptions::Causal c,
                          AttentionOptions::Kernel kernel = AttentionOptions::auto_kernel) {
  AttentionOptions o;
  o.pv = pv;
  o.causal = c;
  o.kernel = kernel;
  return o;
}

LOWBIT_HARNESS_CASES(attention256_cases) {
  // Prologue: every scale layout, both rope pairings and table shapes, partial rotary, norm on /
  // off / segmented, bf16 / f16, a given mean, the mean pass (round 2 and first generation), the
  // fused k path, at N = 1, 17, 127, 1000.
  auto add_p = [&](const PCfg& c) { cases.push_back(std::make_unique<Prologue256Case>(c)); };
  const float q_scale = 0.0625f * 1.44269504f;  // 1/sqrt(256) * log2(e)
  for (int64_t N : {1, 17, 127, 1000}) {
    PCfg q;  // q path: norm + split-half rope + sm_scale, THREAD_Q 32, fused QKV buffer
    q.tag = "q", q.N = N, q.qkv = true, q.sm_scale = q_scale;
    add_p(q);
    PCfg tq = q;  // THREAD_Q 128 (one tile = 2 passes of 64 rows), f16, interleaved
    tq.tag = "tq128", tq.block = 128, tq.dtype = DType::f16, tq.rope = RopeKind::interleaved;
    tq.qkv = false, tq.H = 2;
    add_p(tq);
    PCfg km;  // k path: the mean pass (interleaved, matrix table), then THREAD_K 64 with it
    km.tag = "k", km.pass = Pass::mean, km.N = N, km.qkv = true, km.dtype = DType::f16;
    km.w_dtype = DType::f32, km.rope = RopeKind::interleaved, km.matrix_table = true;
    add_p(km);
    PCfg k = km;
    k.pass = Pass::quantize, k.mean = true, k.layout = ScaleLayout::thread_k, k.block = 64;
    add_p(k);
    PCfg f;  // the fused k path: bf16 split-half, THREAD_K 64
    f.tag = "kpath", f.pass = Pass::fused, f.N = N, f.B = 2, f.H = 5, f.qkv = true;
    f.layout = ScaleLayout::thread_k, f.block = 64;
    add_p(f);
    PCfg pb;  // PER_BLOCK 64 without rope, a mean
    pb.tag = "pb", pb.N = N, pb.rope = RopeKind::none, pb.layout = ScaleLayout::per_block;
    pb.block = 64, pb.mean = true;
    add_p(pb);
    PCfg w;  // WARP_Q 128, segmented weights, B = 2
    w.tag = "warpq", w.B = 2, w.N = N, w.H = 2, w.norm = Norm::segmented;
    w.layout = ScaleLayout::warp_q, w.block = 128;
    add_p(w);
    w.pass = Pass::mean, w.tag = "segmented";
    add_p(w);  // the first-generation mean kernel (segmented weights)
    PCfg nn;  // no norm, rope only, THREAD_K 128
    nn.tag = "nonorm", nn.N = N, nn.norm = Norm::none, nn.layout = ScaleLayout::thread_k;
    nn.block = 128, nn.dtype = DType::f16;
    add_p(nn);
    nn.pass = Pass::mean;
    add_p(nn);
    PCfg sg;  // SageAttention mode: x * sm_scale only, per-block 128, scale_eps 0
    sg.tag = "sage", sg.N = N, sg.norm = Norm::none, sg.rope = RopeKind::none;
    sg.layout = ScaleLayout::per_block, sg.block = 128, sg.scale_eps = 0.f, sg.sm_scale = q_scale;
    add_p(sg);
    sg.layout = ScaleLayout::thread_q, sg.block = 32, sg.scale_eps = 1e-7f, sg.sm_scale = 1.f;
    sg.dtype = DType::f16;
    add_p(sg);
  }
  // Partial rotary (pairs 64: whole 16-byte chunks; 36: a split chunk), both pairings, quantize
  // and mean; the first-generation mean kernel forced on full rotary; the unfused store.
  for (int64_t pairs : {64, 36})
    for (RopeKind r : {RopeKind::split, RopeKind::interleaved}) {
      PCfg c;
      c.tag = std::string("partial") + std::to_string(pairs) +
              (r == RopeKind::split ? "split" : "interleaved");
      c.N = 127, c.pairs = pairs, c.rope = r, c.block = 16, c.dtype = DType::f16;
      add_p(c);
      c.pass = Pass::mean;
      add_p(c);
    }
  for (int64_t N : {17, 1000}) {
    PCfg lg;
    lg.tag = "legacy", lg.pass = Pass::mean, lg.N = N, lg.legacy = true, lg.H = 5;
    add_p(lg);
    PCfg big;  // the round-2 mean kernel: 11 heads (groups of 6 and 5), B = 2
    big.tag = "hg", big.pass = Pass::mean, big.B = 2, big.N = N, big.H = 11, big.qkv = true;
    add_p(big);
    big.rope = RopeKind::none, big.tag = "hgnorope";
    add_p(big);
    PCfg st;
    st.tag = "normrope", st.pass = Pass::store, st.N = N;
    add_p(st);
    st.tag = "partial36", st.pairs = 36, st.norm = Norm::segmented, st.dtype = DType::f16;
    add_p(st);
  }

  // V to fp8: N = 1, 17, 127, 1000 (+ 1300: several 512-token chunks), mean on / off, HND.
  for (int64_t N : {1, 17, 127, 1000})
    cases.push_back(std::make_unique<QuantizeV256Case>(1, N, 2, N % 2 ? DType::bf16 : DType::f16,
                                                       false));
  cases.push_back(std::make_unique<QuantizeV256Case>(2, 127, 3, DType::bf16, true));
  cases.push_back(std::make_unique<QuantizeV256Case>(2, 1300, 3, DType::f16, true));
  cases.push_back(std::make_unique<QuantizeV256Case>(1, 390, 2, DType::bf16, false, true));

  // INT8 attention (auto = the mma.sync kernel at D = 256): fp8 and 16-bit P·V, three causal
  // modes, N = 1, 17, 127, 390, N_kv < / > N_q, GQA, B = 2.
  using O = AttentionOptions;
  auto add_a = [&](const ACfg& c) { cases.push_back(std::make_unique<Int8Attention256Case>(c)); };
  const Shape shapes[] = {
      {1, 1, 1, 1, 1},     {1, 17, 17, 2, 1},  {2, 127, 127, 4, 2},
      {1, 390, 390, 2, 2}, {1, 200, 77, 2, 2}, {1, 65, 300, 3, 1},
  };
  for (const Shape& s : shapes)
    for (auto pv : {O::fp8, O::f16})
      for (auto c : {O::none, O::bottom_right, O::top_left}) {
        ACfg a;
        a.s = s, a.opt = make_opt(pv, c);
        add_a(a);
      }
  // The kernel by name, longer rows (1100 keys: 18 tiles), P·V alone (zero q).
  for (auto pv : {O::fp8, O::f16})
    for (auto c : {O::none, O::bottom_right}) {
      ACfg a;
      a.s = {1, 257, 1100, 2, 1}, a.opt = make_opt(pv, c, O::mma_sync);
      add_a(a);
      a.s = {1, 257, 390, 2, 1}, a.zero_q = true;
      add_a(a);
    }
  // f16 output, HND, per-thread scale layouts, K-mean LSE; WARP_Q + THREAD_K 128 + GQA; V mean.
  for (auto pv : {O::fp8, O::f16}) {
    ACfg a;
    a.s = {1, 129, 129, 2, 2}, a.opt = make_opt(pv, O::bottom_right), a.dt = DType::f16;
    a.ql = ScaleLayout::thread_q, a.qb = 32, a.kl = ScaleLayout::thread_k, a.kb = 64;
    a.hnd = true, a.k_mean = true;
    add_a(a);
    ACfg w;
    w.s = {2, 70, 130, 4, 1}, w.opt = make_opt(pv, O::none);
    w.ql = ScaleLayout::warp_q, w.qb = 128, w.kl = ScaleLayout::thread_k, w.kb = 128;
    w.k_mean = true;
    add_a(w);
  }
  ACfg vm;
  vm.s = {1, 150, 150, 2, 2}, vm.opt = make_opt(O::fp8, O::top_left);
  vm.opt.smooth_v = true;
  add_a(vm);

  // One call and varlen.
  for (auto pv : {O::fp8, O::f16})
    for (auto c : {O::none, O::bottom_right}) {
      cases.push_back(std::make_unique<AttentionCall256Case>(Shape{1, 150, 150, 2, 1},
                                                             make_opt(pv, c), DType::bf16));
      cases.push_back(std::make_unique<AttentionCall256Case>(Shape{2, 33, 90, 2, 2},
                                                             make_opt(pv, c), DType::f16));
      cases.push_back(std::make_unique<AttentionVarlen256Case>(make_opt(pv, c), DType::bf16));
    }
  O sv = make_opt(O::fp8, O::top_left, O::mma_sync);
  sv.smooth_v = true;
  cases.push_back(std::make_unique<AttentionCall256Case>(Shape{1, 17, 17, 1, 1}, sv, DType::bf16));
  O nk = make_opt(O::f16, O::none);
  nk.smooth_k = false;
  cases.push_back(
      std::make_unique<AttentionCall256Case>(Shape{1, 127, 1000, 4, 1}, nk, DType::bf16));
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
