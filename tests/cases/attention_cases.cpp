// Harness cases of the attention family (SPEC §2): the kernel-level INT8 attention (q/k codes and
// scales built here, V quantized by quantize_v_fp8 on the backend) and the one-call attention()
// from bf16/f16 q, k, v. The CUDA backend is compared with the CPU oracle: outputs allclose
// (the GPU's ex2.approx and its summation order differ from the CPU's), LSE allclose, masked rows
// exactly 0 / -inf.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "lowbit/attention.h"
#include "lowbit/runtime.h"
#include "src/cpu/attention_backend.h"  // detail::AttentionCudaTuning (kernel variants by knob)
#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {
namespace {

struct Shape {
  int64_t B, Nq, Nkv, Hq, Hkv, D;
};

std::string shape_name(const Shape& s) {
  return "b" + std::to_string(s.B) + ".nq" + std::to_string(s.Nq) + ".nkv" + std::to_string(s.Nkv) +
         ".hq" + std::to_string(s.Hq) + ".hkv" + std::to_string(s.Hkv) + ".d" + std::to_string(s.D);
}
const char* causal_name(AttentionOptions::Causal c) {
  return c == AttentionOptions::none           ? "full"
         : c == AttentionOptions::bottom_right ? "causal_br"
                                               : "causal_tl";
}

// A contiguous (B, H, N, D) tensor seen as (B, N, H, D).
TensorView hnd_as_nhd(TensorView t) {
  std::swap(t.shape[1], t.shape[2]);
  std::swap(t.stride[1], t.stride[2]);
  return t;
}

// A copy of `t` as f32 (the fp64 reference reads any float dtype; this also gives a mutable
// tensor to view).
HostTensor as_f32(const HostTensor& t) {
  HostTensor f(DType::f32, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) f.set(i, t.get(i));
  return f;
}

// The fp64 reference of q against k / v (f32 host tensors, contiguous (B, N, H, D), or (B, H, N,
// D) when `hnd`), in the order of the case's output (the same layout as q).
std::vector<double> exact_out(HostTensor& q, HostTensor& k, HostTensor& v,
                              const AttentionOptions& opt, bool hnd) {
  auto nhd = [&](HostTensor& t) { return hnd ? hnd_as_nhd(t.view()) : t.view(); };
  const TensorView qv = nhd(q);
  const int64_t B = qv.shape[0], Nq = qv.shape[1], Hq = qv.shape[2], D = qv.shape[3];
  std::vector<double> x(static_cast<size_t>(q.numel()));
  attention_reference_f64(qv, nhd(k), nhd(v), opt, x.data(), nullptr);
  if (!hnd) return x;
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < Nq; ++n)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < D; ++d)
          y[((b * Hq + h) * Nq + n) * D + d] = x[((b * Nq + n) * Hq + h) * D + d];
  return y;
}

// ---- kernel level -----------------------------------------------------------------------------

// Input patterns that isolate parts of a kernel (diagnostics for a new kernel):
//   zero_q:  q codes 0, so every visible key gets the same P; out = mean of V over the visible
//            keys (checks P V, V's key order and the masking, independently of q k^T);
//   const_v: V constant over the tokens, so out = that V row whatever P is (checks the
//            accumulator layout and normalization); the LSE still checks q k^T and the masking.
//   early_max: the codes of keys 0..63 tripled (saturated): every row's maximum comes early and
//            later key tiles rarely raise it (exercises the round-3 kernel's folded P·V halves).
enum class Pattern { random, zero_q, const_v, early_max };

// Why an attention case cannot run on `d` ("" = it can): a forced wgmma kernel needs sm_90a
// device code, fp8 P·V e4m3 tensor cores (harness.h).
std::string attention_unsupported(Device d, const AttentionOptions& opt) {
  if (d != Device::cuda) return "";
  if ((opt.kernel == AttentionOptions::wgmma || opt.kernel == AttentionOptions::wgmma_r3) &&
      !cuda_code_sm90a())
    return "forces the wgmma kernel: sm_90a device code only";
  return opt.pv == AttentionOptions::fp8 ? cuda_lacks_fp8() : "";
}

class Int8AttentionCase : public Case {
 public:
  Int8AttentionCase(Shape s, AttentionOptions opt, DType out_dtype, ScaleLayout q_layout,
                    int q_block, ScaleLayout k_layout, int k_block, bool hnd, bool k_mean,
                    Pattern pattern = Pattern::random, std::string tag = "")
      : pattern_(pattern),
        tag_(std::move(tag)),
        s_(s),
        opt_(opt),
        dt_(out_dtype),
        ql_(q_layout),
        qb_(q_block),
        kl_(k_layout),
        kb_(k_block),
        hnd_(hnd),
        k_mean_(k_mean) {}

  // Runs the case under the CUDA tuning knobs `t` (restored afterwards; the CPU ignores them), for
  // kernel variants that have no AttentionOptions::Kernel name. The tag names them.
  void set_tuning(const detail::AttentionCudaTuning& t) {
    tune_ = t;
    has_tune_ = true;
  }

  std::string unsupported(Device d) const override { return attention_unsupported(d, opt_); }
  std::string name() const override {
    std::string n = "attention.int8." +
                    std::string(opt_.pv == AttentionOptions::fp8 ? "fp8" : "f16") + "." +
                    causal_name(opt_.causal) + "." + shape_name(s_) + "." + dtype_name(dt_);
    if (hnd_) n += ".hnd";
    if (opt_.smooth_v) n += ".vmean";
    if (k_mean_) n += ".kmean";
    if (ql_ != ScaleLayout::per_block) n += ".thread_qk";
    if (pattern_ == Pattern::zero_q) n += ".zero_q";
    if (pattern_ == Pattern::const_v) n += ".const_v";
    if (pattern_ == Pattern::early_max) n += ".early_max";
    if (kb_ != 64) n += ".kblock" + std::to_string(kb_);  // (k scales per block of kb_ keys)
    if (opt_.kernel == AttentionOptions::mma_sync) n += ".mma_sync";
    if (opt_.kernel == AttentionOptions::wgmma) n += ".wgmma";
    if (opt_.kernel == AttentionOptions::wgmma_r3) n += ".wgmma_r3";
    if (!tag_.empty()) n += "." + tag_;
    return n;
  }

  // Inputs: q, q_scale, k, k_scale, v, k_mean.
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::uniform_real_distribution<float> spread(0.8f, 1.2f);
    auto codes = [&](int64_t B, int64_t N, int64_t H) {
      HostTensor t(DType::i8, hnd_ ? std::vector<int64_t>{B, H, N, s_.D}
                                   : std::vector<int64_t>{B, N, H, s_.D});
      const std::vector<float> normal = normal_floats(rng, t.numel());
      for (int64_t i = 0; i < t.numel(); ++i)
        t.as<int8_t>()[i] = static_cast<int8_t>(
            std::max(-127.f, std::min(127.f, std::nearbyint(normal[i] * 32.f))));
      return t;
    };
    // Scales ~1/32, over sqrt(D / 128) beyond D = 128 (1/45 at D = 256): q·k over D channels
    // keeps the logit spread of D = 128.
    const float unit = 32.f * std::sqrt(std::max(1.f, static_cast<float>(s_.D) / 128.f));
    auto scales = [&](int64_t B, int64_t H, int64_t N, ScaleLayout l, int blk) {
      HostTensor t(DType::f32, {B, H, scale_count(l, blk, N)});
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, spread(rng) / unit);
      return t;
    };
    std::vector<HostTensor> in;
    in.push_back(codes(s_.B, s_.Nq, s_.Hq));
    if (pattern_ == Pattern::zero_q)
      for (int64_t i = 0; i < in[0].numel(); ++i) in[0].set(i, 0.f);
    in.push_back(scales(s_.B, s_.Hq, s_.Nq, ql_, qb_));
    in.push_back(codes(s_.B, s_.Nkv, s_.Hkv));
    if (pattern_ == Pattern::early_max) {  // (B, N, H, D) or HND: key index per element
      HostTensor& k = in.back();
      for (int64_t i = 0; i < k.numel(); ++i) {
        const int64_t key = hnd_ ? (i / s_.D) % s_.Nkv : (i / (s_.D * s_.Hkv)) % s_.Nkv;
        if (key < 64) k.set(i, std::max(-127.f, std::min(127.f, 3.f * k.get(i))));
      }
    }
    in.push_back(scales(s_.B, s_.Hkv, s_.Nkv, kl_, kb_));
    HostTensor v(dt_, hnd_ ? std::vector<int64_t>{s_.B, s_.Hkv, s_.Nkv, s_.D}
                           : std::vector<int64_t>{s_.B, s_.Nkv, s_.Hkv, s_.D});
    v.fill_normal(rng, opt_.smooth_v ? 3.f : 0.f);
    if (pattern_ == Pattern::const_v) {  // every token takes token 0's values (NHD only)
      const int64_t row = s_.Hkv * s_.D;
      for (int64_t b = 0; b < s_.B; ++b)
        for (int64_t n = 1; n < s_.Nkv; ++n)
          for (int64_t i = 0; i < row; ++i)
            v.set((b * s_.Nkv + n) * row + i, v.get(b * s_.Nkv * row + i));
    }
    in.push_back(std::move(v));
    HostTensor km(DType::f32, {s_.B, s_.Hkv, s_.D});
    km.fill_normal(rng);
    in.push_back(std::move(km));
    return in;
  }

  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "out";
    o.dtype = dt_;
    o.shape = hnd_ ? std::vector<int64_t>{s_.B, s_.Hq, s_.Nq, s_.D}
                   : std::vector<int64_t>{s_.B, s_.Nq, s_.Hq, s_.D};
    o.tol = Tolerance::allclose(2e-2, 2e-2);
    o.accuracy_row_len = s_.D;  // rows judged by accuracy where allclose fails (exact_output)
    OutputSpec l;
    l.name = "lse";
    l.dtype = DType::f32;
    l.shape = {s_.B, s_.Hq, s_.Nq};
    l.tol = Tolerance::allclose(2e-3, 1e-3);
    l.tol.allow_nonfinite = true;  // -inf for rows that see no key
    return {o, l};
  }

  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    auto view = [&](TensorView t) { return hnd_ ? hnd_as_nhd(t) : t; };
    QuantizedRows q{view(in[0]), in[1], ql_, qb_};
    QuantizedRows k{view(in[2]), in[3], kl_, kb_};
    TensorView v = view(in[4]);
    TensorView o = view(out[0]);
    TensorView lse = out[1];
    const TensorView* km = k_mean_ ? &in[5] : nullptr;
    const Device dev = v.device;
    if (opt_.pv == AttentionOptions::f16) {
      attention_int8(q, k, v, nullptr, nullptr, km, o, &lse, opt_, ctx);
      return;
    }
    struct Tuned {  // the knobs for this case's launch, restored on every exit
      explicit Tuned(const detail::AttentionCudaTuning* t) : on(t != nullptr) {
        if (on) detail::set_attention_cuda_tuning(*t);
      }
      ~Tuned() {
        if (on) detail::set_attention_cuda_tuning({});
      }
      bool on;
    } tuned(has_tune_ ? &tune_ : nullptr);
    const int64_t npad = (s_.Nkv + 63) / 64 * 64;
    Buffer v8(dev, static_cast<size_t>(s_.B * s_.Hkv * s_.D * npad));
    Buffer vs(dev, static_cast<size_t>(s_.B * s_.Hkv * s_.D) * 4);
    Buffer vm(dev, static_cast<size_t>(s_.B * s_.Hkv * s_.D) * 4);
    TensorView v8v = make_view(v8.data(), DType::e4m3, {s_.B, s_.Hkv, s_.D, npad}, dev);
    TensorView vsv = make_view(vs.data(), DType::f32, {s_.B, s_.Hkv, s_.D}, dev);
    TensorView vmv = make_view(vm.data(), DType::f32, {s_.B, s_.Hkv, s_.D}, dev);
    quantize_v_fp8(v, v8v, vsv, opt_.smooth_v ? &vmv : nullptr, ctx);
    attention_int8(q, k, v8v, &vsv, opt_.smooth_v ? &vmv : nullptr, km, o, &lse, opt_, ctx);
    synchronize(ctx);  // the scratch buffers are freed on return
  }

  // The exact reference of `out`: q and k dequantized (code x its row's scale; k's mean only
  // shifts each row's logits, which softmax ignores), V as given.
  std::vector<double> exact_output(size_t k, const std::vector<HostTensor>& in) const override {
    if (k != 0) return {};
    // codes x scale in the codes' own layout (NHD, or HND with hnd_)
    auto dequant = [&](const HostTensor& c, const HostTensor& sc, int64_t N, int64_t H,
                       ScaleLayout l, int blk) {
      HostTensor f(DType::f32, c.shape);
      const int64_t cnt = sc.shape[2];
      for (int64_t b = 0; b < s_.B; ++b)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t h = 0; h < H; ++h) {
            const float scale = sc.get((b * H + h) * cnt + scale_index(l, blk, n));
            const int64_t at = hnd_ ? ((b * H + h) * N + n) * s_.D : ((b * N + n) * H + h) * s_.D;
            for (int64_t d = 0; d < s_.D; ++d) f.set(at + d, c.get(at + d) * scale);
          }
      return f;
    };
    HostTensor q = dequant(in[0], in[1], s_.Nq, s_.Hq, ql_, qb_);
    HostTensor kk = dequant(in[2], in[3], s_.Nkv, s_.Hkv, kl_, kb_);
    HostTensor v = as_f32(in[4]);
    return exact_out(q, kk, v, opt_, hnd_);
  }

 private:
  Pattern pattern_;
  std::string tag_;  // name suffix (cases that differ from another only in what they exercise)
  Shape s_;
  AttentionOptions opt_;
  DType dt_;
  ScaleLayout ql_;
  int qb_;
  ScaleLayout kl_;
  int kb_;
  bool hnd_, k_mean_;
  detail::AttentionCudaTuning tune_{};
  bool has_tune_ = false;
};

// ---- V to fp8
// ------------------------------------------------------------------------------------

// Codes (in the fragment order of keys) and scales: bit-exact without the mean; with the mean the
// GPU sums the tokens in another order, so a code may move by one.
class QuantizeVCase : public Case {
 public:
  // specials: +-inf and NaN in some channels (no mean): scales of inf, codes 0 / -0 for finite
  // values over an infinite scale, 0x7f for NaN quotients (inf / inf, NaN / s), NaN ignored by
  // the maximum.
  QuantizeVCase(int64_t B, int64_t N, int64_t H, int64_t D, DType dt, bool mean,
                bool hnd = false, bool specials = false)
      : B_(B), N_(N), H_(H), D_(D), dt_(dt), mean_(mean), hnd_(hnd), specials_(specials) {}
  std::string name() const override {
    return "attention.quantize_v_fp8.b" + std::to_string(B_) + ".n" + std::to_string(N_) + ".h" +
           std::to_string(H_) + ".d" + std::to_string(D_) + "." + dtype_name(dt_) +
           (mean_ ? ".mean" : "") + (hnd_ ? ".hnd" : "") + (specials_ ? ".specials" : "");
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    in.emplace_back(dt_, hnd_ ? std::vector<int64_t>{B_, H_, N_, D_}
                              : std::vector<int64_t>{B_, N_, H_, D_});
    in[0].fill_normal(rng, mean_ ? 2.f : 0.f, 1.5f);
    if (!mean_ && !hnd_ && N_ >= 3) {  // signed zeros (e4m3 keeps -0: code 0x80) and an all-zero channel
      HostTensor& v = in[0];
      for (int64_t b = 0; b < B_; ++b)
        for (int64_t n = 0; n < N_; ++n)
          for (int64_t h = 0; h < H_; ++h) v.set(((b * N_ + n) * H_ + h) * D_ + 0, 0.f);
      v.set((1 * H_) * D_ + 1, -0.f);  // batch 0, token 1, head 0, channel 1
      v.set((2 * H_) * D_ + 2, 0.f);
      v.set((2 * H_) * D_ + 3, -0.f);
    }
    if (specials_ && !mean_ && !hnd_ && N_ >= 3) {  // batch 0, head 0, channels 4..7
      const float inf = std::numeric_limits<float>::infinity();
      const float nan = std::numeric_limits<float>::quiet_NaN();
      HostTensor& v = in[0];
      auto at = [&](int64_t n, int64_t d) { return (n * H_) * D_ + d; };
      v.set(at(1, 4), inf);        // channel 4: scale inf, the rest 0 / -0, this one NaN
      v.set(at(2, 5), nan);        // channel 5: NaN ignored by the maximum, its code 0x7f
      v.set(at(0, 6), -inf);       // channel 6: -inf and +inf
      v.set(at(N_ - 1, 6), inf);
      v.set(at(1, 7), nan);        // channel 7: NaN next to an inf
      v.set(at(2, 7), -inf);
    }
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    const int64_t npad = (N_ + 63) / 64 * 64;
    OutputSpec c;
    c.name = "v_fp8";
    c.dtype = DType::e4m3;
    c.shape = {B_, H_, D_, npad};
    // one e4m3 step is at most 1/8 of the value (2^-9 below the normal range)
    c.tol = mean_ ? Tolerance::allclose(2e-3, 0.13) : Tolerance::bit_exact();
    OutputSpec sc;
    sc.name = "v_scale";
    sc.dtype = DType::f32;
    sc.shape = {B_, H_, D_};
    sc.tol = mean_ ? Tolerance::allclose(0, 1e-5) : Tolerance::bit_exact();
    c.tol.allow_nonfinite = sc.tol.allow_nonfinite = specials_;  // NaN codes, infinite scales
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
    TensorView m = mean_ ? out[2] : TensorView{};
    quantize_v_fp8(hnd_ ? hnd_as_nhd(in[0]) : in[0], out[0], out[1], mean_ ? &m : nullptr, ctx);
  }

 private:
  int64_t B_, N_, H_, D_;
  DType dt_;
  bool mean_;
  bool hnd_;
  bool specials_ = false;
};

// ---- one call -----------------------------------------------------------------------------------

// Outputs of attention() / attention_varlen against the CPU: out and the LSE (-inf allowed).
std::vector<OutputSpec> one_call_outputs(DType dt, std::vector<int64_t> out_shape,
                                         std::vector<int64_t> lse_shape) {
  OutputSpec o;
  o.name = "out";
  o.dtype = dt;
  o.shape = std::move(out_shape);
  // CPU (IEEE division) and CUDA (div.full.f32) INT8 codes may differ by one, rarely.
  o.tol = Tolerance::allclose(3e-2, 3e-2);
  o.accuracy_row_len = o.shape.back();  // rows judged by accuracy where allclose fails
  OutputSpec l;
  l.name = "lse";
  l.dtype = DType::f32;
  l.shape = std::move(lse_shape);
  l.tol = Tolerance::allclose(1e-2, 1e-3);
  l.tol.allow_nonfinite = true;
  return {o, l};
}

class AttentionCallCase : public Case {
 public:
  AttentionCallCase(Shape s, AttentionOptions opt, DType dt) : s_(s), opt_(opt), dt_(dt) {}
  std::string unsupported(Device d) const override { return attention_unsupported(d, opt_); }
  std::string name() const override {
    return "attention.call." + std::string(opt_.pv == AttentionOptions::fp8 ? "fp8" : "f16") + "." +
           causal_name(opt_.causal) + "." + shape_name(s_) + "." + dtype_name(dt_) +
           (opt_.smooth_k ? ".smooth_k" : "") + (opt_.smooth_v ? ".smooth_v" : "") +
           (opt_.kernel == AttentionOptions::mma_sync ? ".mma_sync" : "") +
           (opt_.kernel == AttentionOptions::wgmma ? ".wgmma" : "");
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    in.emplace_back(dt_, std::vector<int64_t>{s_.B, s_.Nq, s_.Hq, s_.D});
    in.emplace_back(dt_, std::vector<int64_t>{s_.B, s_.Nkv, s_.Hkv, s_.D});
    in.emplace_back(dt_, std::vector<int64_t>{s_.B, s_.Nkv, s_.Hkv, s_.D});
    in[0].fill_normal(rng);
    in[1].fill_normal(rng, 0.5f);  // a K mean for the smoothing to remove
    in[2].fill_normal(rng);
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    return one_call_outputs(dt_, {s_.B, s_.Nq, s_.Hq, s_.D}, {s_.B, s_.Hq, s_.Nq});
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView lse = out[1];
    attention(in[0], in[1], in[2], out[0], &lse, opt_, ctx);
  }
  std::vector<double> exact_output(size_t k, const std::vector<HostTensor>& in) const override {
    if (k != 0) return {};
    HostTensor q = as_f32(in[0]), kk = as_f32(in[1]), v = as_f32(in[2]);
    return exact_out(q, kk, v, opt_, false);
  }

 private:
  Shape s_;
  AttentionOptions opt_;
  DType dt_;
};

// attention_varlen: packed sequences (odd lengths, an empty query range, an empty key range, GQA).
class AttentionVarlenCase : public Case {
 public:
  AttentionVarlenCase(AttentionOptions opt, int64_t d) : opt_(opt), d_(d) {}
  std::string unsupported(Device d) const override { return attention_unsupported(d, opt_); }
  std::string name() const override {
    return "attention.varlen." + std::string(opt_.pv == AttentionOptions::fp8 ? "fp8" : "f16") +
           "." + causal_name(opt_.causal) + ".d" + std::to_string(d_);
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> in;
    in.emplace_back(DType::bf16, std::vector<int64_t>{cu_q_.back(), kHq, d_});
    in.emplace_back(DType::bf16, std::vector<int64_t>{cu_k_.back(), kHkv, d_});
    in.emplace_back(DType::bf16, std::vector<int64_t>{cu_k_.back(), kHkv, d_});
    in[0].fill_normal(rng);
    in[1].fill_normal(rng, 0.5f);
    in[2].fill_normal(rng);
    return in;
  }
  std::vector<OutputSpec> outputs() const override {  // each sequence is one attention() call
    return one_call_outputs(DType::bf16, {cu_q_.back(), kHq, d_}, {kHq, cu_q_.back()});
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView lse = out[1];
    attention_varlen(in[0], in[1], in[2], cu_q_, cu_k_, out[0], &lse, opt_, ctx);
  }
  // The exact reference of `out` per sequence (a sequence without keys: zero rows).
  std::vector<double> exact_output(size_t k, const std::vector<HostTensor>& in) const override {
    if (k != 0) return {};
    std::vector<double> x(static_cast<size_t>(cu_q_.back() * kHq * d_), 0.0);
    for (size_t i = 0; i + 1 < cu_q_.size(); ++i) {
      const int64_t q0 = cu_q_[i], nq = cu_q_[i + 1] - q0;
      const int64_t k0 = cu_k_[i], nk = cu_k_[i + 1] - k0;
      if (nq == 0 || nk == 0) continue;
      auto slice = [&](const HostTensor& t, int64_t r0, int64_t n, int64_t h) {
        HostTensor f(DType::f32, {1, n, h, d_});
        for (int64_t e = 0; e < f.numel(); ++e) f.set(e, t.get(r0 * h * d_ + e));
        return f;
      };
      HostTensor q = slice(in[0], q0, nq, kHq), kk = slice(in[1], k0, nk, kHkv),
                 v = slice(in[2], k0, nk, kHkv);
      const std::vector<double> y = exact_out(q, kk, v, opt_, false);
      std::copy(y.begin(), y.end(), x.begin() + q0 * kHq * d_);
    }
    return x;
  }

 private:
  static constexpr int64_t kHq = 4, kHkv = 2;
  const std::vector<int64_t> cu_q_ = {0, 1, 130, 130, 200, 457};
  const std::vector<int64_t> cu_k_ = {0, 70, 200, 260, 260, 390};
  AttentionOptions opt_;
  int64_t d_;
};

// attention() / attention_varlen() with q / k RMSNorm and RoPE (options.q_prologue / k_prologue):
// per-head or segmented weights (weight_rows, MM-DiT joint attention), split-half and
// interleaved pairing, (cos, sin) and 2 x 2 tables, partial rotary, separate q and k tables
// (cross-attention); exact reference: SPEC §1's norm and rotation in fp64, then softmax(q kᵀ) V.
struct NormRopeCfg {
  Shape s;
  AttentionOptions::PV pv = AttentionOptions::fp8;
  AttentionOptions::Causal causal = AttentionOptions::none;
  bool q_matrix = false, q_interleaved = false;  // q's table and pairing
  bool k_rope = true;                            // k's table: (cos, sin), split-half
  int64_t k_pairs = 0;                           // 0: D / 2
  bool segmented = false;                        // (2, D) weights with weight_rows
  bool varlen = false;                           // packed sequences (B = 1): cu_q_ / cu_k_
  bool token_norm = false;  // Wan: q / k norms over all heads (NormScope::token), (H·D) weights
};

class AttentionNormRopeCase : public Case {
 public:
  explicit AttentionNormRopeCase(NormRopeCfg c) : c_(c) {
    opt_.pv = c.pv;
    opt_.causal = c.causal;
    if (c_.varlen) c_.s.B = 1, c_.s.Nq = cu_q_.back(), c_.s.Nkv = cu_k_.back();
  }
  std::string unsupported(Device d) const override { return attention_unsupported(d, opt_); }
  std::string name() const override {
    return std::string(c_.varlen ? "attention.varlen.normrope." : "attention.call.normrope.") +
           (c_.pv == AttentionOptions::fp8 ? "fp8" : "f16") + "." + causal_name(c_.causal) + "." +
           shape_name(c_.s) + (c_.q_matrix ? ".qmatrix" : "") +
           (c_.q_interleaved ? ".qinterleaved" : "") + (c_.k_rope ? "" : ".knorope") +
           (c_.k_pairs ? ".kpairs" + std::to_string(c_.k_pairs) : "") +
           (c_.segmented ? ".segmented" : "") + (c_.token_norm ? ".tokennorm" : "");
  }
  // q, k, v, q weight, k weight, q table, [k table], [q rows, k rows]
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    const Shape& s = c_.s;
    auto qkv_shape = [&](int64_t n, int64_t h) {
      return c_.varlen ? std::vector<int64_t>{n, h, s.D} : std::vector<int64_t>{s.B, n, h, s.D};
    };
    std::vector<HostTensor> in;
    in.emplace_back(DType::bf16, qkv_shape(s.Nq, s.Hq));
    in.emplace_back(DType::bf16, qkv_shape(s.Nkv, s.Hkv));
    in.emplace_back(DType::bf16, qkv_shape(s.Nkv, s.Hkv));
    in[0].fill_normal(rng, 0.f, 2.f);  // the norm rescales rows
    in[1].fill_normal(rng, 0.5f, 3.f);
    in[2].fill_normal(rng);
    const int64_t R = c_.segmented ? 2 : 1;
    auto weight = [&](DType dt, int64_t heads) {
      HostTensor w(dt, c_.segmented    ? std::vector<int64_t>{R, s.D}
                       : c_.token_norm ? std::vector<int64_t>{heads * s.D}
                                       : std::vector<int64_t>{s.D});
      w.fill_normal(rng, 1.f, 0.3f);
      return w;
    };
    in.push_back(weight(DType::bf16, s.Hq));
    in.push_back(weight(DType::f32, s.Hkv));
    const int64_t tb = c_.varlen ? 1 : s.B;
    in.push_back(rope_table(tb, s.Nq, s.D / 2, c_.q_matrix, rng));
    if (c_.k_rope)
      in.push_back(rope_table(1, s.Nkv, c_.k_pairs ? c_.k_pairs : s.D / 2, false, rng));
    if (c_.segmented) {
      for (int64_t n : {s.Nq, s.Nkv}) {
        HostTensor r(DType::i32, {n});
        for (int64_t i = 0; i < n; ++i) r.set(i, static_cast<float>(i < n / 3 ? 1 : rng() % R));
        in.push_back(std::move(r));
      }
    }
    return in;
  }
  std::vector<OutputSpec> outputs() const override {
    const Shape& s = c_.s;
    if (c_.varlen) return one_call_outputs(DType::bf16, {s.Nq, s.Hq, s.D}, {s.Hq, s.Nq});
    return one_call_outputs(DType::bf16, {s.B, s.Nq, s.Hq, s.D}, {s.B, s.Hq, s.Nq});
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    const size_t rows_at = c_.k_rope ? 7 : 6;
    Rope qr{in[5], c_.q_interleaved}, kr{c_.k_rope ? in[6] : TensorView{}, false};
    TensorView qrows = c_.segmented ? in[rows_at] : TensorView{};
    TensorView krows = c_.segmented ? in[rows_at + 1] : TensorView{};
    Prologue qp, kp;
    qp.norm_weight = &in[3];
    kp.norm_weight = &in[4];
    qp.rope = &qr;
    if (c_.k_rope) kp.rope = &kr;
    if (c_.segmented) qp.weight_rows = &qrows, kp.weight_rows = &krows;
    if (c_.token_norm) qp.norm_scope = kp.norm_scope = NormScope::token;
    AttentionOptions o = opt_;
    o.q_prologue = &qp;
    o.k_prologue = &kp;
    TensorView lse = out[1];
    if (c_.varlen)
      attention_varlen(in[0], in[1], in[2], cu_q_, cu_k_, out[0], &lse, o, ctx);
    else
      attention(in[0], in[1], in[2], out[0], &lse, o, ctx);
  }
  std::vector<double> exact_output(size_t k, const std::vector<HostTensor>& in) const override {
    if (k != 0) return {};
    const Shape& s = c_.s;
    auto as4 = [&](const HostTensor& t) {  // varlen's packed (T, H, D) as (1, T, H, D)
      HostTensor r = t;
      if (r.shape.size() == 3) r.shape.insert(r.shape.begin(), 1);
      return r;
    };
    const size_t rows_at = c_.k_rope ? 7 : 6;
    const HostTensor* qrows = c_.segmented ? &in[rows_at] : nullptr;
    const HostTensor* krows = c_.segmented ? &in[rows_at + 1] : nullptr;
    HostTensor q = norm_rope_f64(as4(in[0]), &in[3], qrows, 1e-6, &in[5], c_.q_interleaved,
                                 c_.token_norm);
    HostTensor kk = norm_rope_f64(as4(in[1]), &in[4], krows, 1e-6, c_.k_rope ? &in[6] : nullptr,
                                  false, c_.token_norm);
    HostTensor v = as_f32(as4(in[2]));
    if (!c_.varlen) return exact_out(q, kk, v, opt_, false);
    std::vector<double> x(static_cast<size_t>(s.Nq * s.Hq * s.D), 0.0);
    for (size_t i = 0; i + 1 < cu_q_.size(); ++i) {
      const int64_t q0 = cu_q_[i], nq = cu_q_[i + 1] - q0;
      const int64_t k0 = cu_k_[i], nk = cu_k_[i + 1] - k0;
      if (nq == 0 || nk == 0) continue;
      auto slice = [&](const HostTensor& t, int64_t r0, int64_t n, int64_t h) {
        HostTensor f(DType::f32, {1, n, h, s.D});
        for (int64_t e = 0; e < f.numel(); ++e) f.set(e, t.get(r0 * h * s.D + e));
        return f;
      };
      HostTensor qi = slice(q, q0, nq, s.Hq), ki = slice(kk, k0, nk, s.Hkv),
                 vi = slice(v, k0, nk, s.Hkv);
      const std::vector<double> y = exact_out(qi, ki, vi, opt_, false);
      std::copy(y.begin(), y.end(), x.begin() + q0 * s.Hq * s.D);
    }
    return x;
  }

 private:
  NormRopeCfg c_;
  AttentionOptions opt_;
  const std::vector<int64_t> cu_q_ = {0, 1, 130, 130, 200, 457};
  const std::vector<int64_t> cu_k_ = {0, 70, 200, 260, 260, 390};
};

AttentionOptions make_opt(AttentionOptions::PV pv, AttentionOptions::Causal c,
                          AttentionOptions::Kernel kernel = AttentionOptions::auto_kernel) {
  AttentionOptions o;
  o.pv = pv;
  o.causal = c;
  o.kernel = kernel;
  return o;
}

LOWBIT_HARNESS_CASES(attention_cases) {
  using O = AttentionOptions;
  const Shape shapes[] = {
      {1, 1, 1, 1, 1, 64},    {1, 17, 17, 2, 1, 64},   {2, 127, 127, 4, 2, 128},
      {1, 200, 77, 2, 2, 64}, {1, 65, 300, 3, 1, 128}, {1, 300, 300, 2, 2, 128},
  };
  for (const Shape& s : shapes)
    for (auto pv : {O::fp8, O::f16})
      for (auto c : {O::none, O::bottom_right, O::top_left})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(pv, c), DType::bf16, ScaleLayout::per_block, 128, ScaleLayout::per_block,
            64, false, false));
  // Each CUDA kernel by name (the cases above take the default: wgmma on sm_90a for both P·V
  // modes; `.wgmma` cases force the wgmma kernel, `.mma_sync` ones the portable kernel).
  // The wgmma kernel (128 rows x 128 keys per step): single rows, fewer keys than queries (rows
  // that see no key under bottom-right causal), several key tiles with a partial last one, one
  // and several row blocks, GQA, D 64 and 128. The mma.sync kernel keeps its fp8 coverage here.
  const Shape wgmma_shapes[] = {
      {1, 1, 1, 1, 1, 64},      {1, 17, 17, 2, 1, 64},    {2, 127, 127, 4, 2, 128},
      {1, 200, 77, 2, 2, 64},   {1, 65, 300, 3, 1, 128},  {1, 300, 300, 2, 2, 128},
      {1, 257, 390, 2, 1, 128}, {1, 256, 256, 1, 1, 128}, {1, 333, 129, 2, 1, 64},
  };
  for (const Shape& s : wgmma_shapes)
    for (auto pv : {O::fp8, O::f16})
      for (auto c : {O::none, O::bottom_right, O::top_left})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(pv, c, O::wgmma), DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, 64, false, false));
  // Key counts that wrap the round-3 ring (5 stages) more than once (1000 keys = 8 tiles, 1100 =
  // 9), so both mbarrier parities of most stages are exercised, with causal row blocks of
  // different lengths.
  const Shape ws_extra[] = {{1, 130, 1000, 2, 1, 128}, {1, 300, 1100, 2, 2, 64}};
  // `.auto`: the default kernel choice on the wgmma kernel's shapes plus the ring-wrapping ones
  // (on sm_90a fp8 P·V takes the round-3 kernel: deferred P·V, per-key kc logits, branch-only
  // masking), with its diagnostics.
  for (const Shape& s : wgmma_shapes)
    for (auto c : {O::none, O::bottom_right, O::top_left})
      cases.push_back(std::make_unique<Int8AttentionCase>(
          s, make_opt(O::fp8, c), DType::bf16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 64, false, false, Pattern::random, "auto"));
  for (const Shape& s : ws_extra)
    for (auto c : {O::none, O::bottom_right, O::top_left})
      cases.push_back(std::make_unique<Int8AttentionCase>(
          s, make_opt(O::fp8, c), DType::bf16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 64, false, false, Pattern::random, "auto"));
  for (auto pat : {Pattern::zero_q, Pattern::const_v})
    for (auto c : {O::none, O::bottom_right})
      cases.push_back(std::make_unique<Int8AttentionCase>(
          Shape{1, 257, 390, 2, 1, 128}, make_opt(O::fp8, c), DType::bf16,
          ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false, pat, "auto"));
  // Folded P·V halves on most tiles (early maxima), and the per-key kc path (k scales per 32
  // keys: not constant over a thread's 64-key half) next to the per-half one (per 64 keys).
  for (const Shape& s : ws_extra)
    for (auto c : {O::none, O::bottom_right})
      for (int kb : {32, 64})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(O::fp8, c), DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, kb, false, false, Pattern::early_max,
            "auto"));
  for (const Shape& s : {Shape{1, 257, 390, 2, 1, 128}, Shape{1, 333, 129, 2, 1, 64}})
    for (auto c : {O::none, O::bottom_right, O::top_left})
      cases.push_back(std::make_unique<Int8AttentionCase>(
          s, make_opt(O::fp8, c), DType::bf16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 32, false, false, Pattern::random, "auto"));
  // `.wgmma_r3`: round 3 itself (ping-pong turns, exact_i2f logits; auto's kernels are its
  // I2FP-without-turns twins) on the `.auto` set: every shape of the wgmma set and the
  // ring-wrapping ones x 3 causal modes, the diagnostics, folded halves (early maxima) and k
  // scales per 32 keys (D = 128 then takes the cp.async producer), THREAD_Q/K + HND + f16 + K
  // mean, WARP_Q + GQA, V mean (below), N = 1 / 129 / 257 x 390 / 1000 / 1100 / 3000 keys.
  {
    const O::Kernel r4 = O::wgmma_r3;
    for (const Shape& s : wgmma_shapes)
      for (auto c : {O::none, O::bottom_right, O::top_left})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(O::fp8, c, r4), DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, 64, false, false));
    for (const Shape& s : ws_extra)
      for (auto c : {O::none, O::bottom_right, O::top_left})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(O::fp8, c, r4), DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, 64, false, false));
    // (its diagnostics at 257 x 390: the loop over every kernel below)
    for (const Shape& s : ws_extra)
      for (auto c : {O::none, O::bottom_right})
        for (int kb : {32, 64})
          cases.push_back(std::make_unique<Int8AttentionCase>(
              s, make_opt(O::fp8, c, r4), DType::bf16, ScaleLayout::per_block, 128,
              ScaleLayout::per_block, kb, false, false, Pattern::early_max));
    for (const Shape& s : {Shape{1, 257, 390, 2, 1, 128}, Shape{1, 333, 129, 2, 1, 64}})
      for (auto c : {O::none, O::bottom_right, O::top_left})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(O::fp8, c, r4), DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, 32, false, false, Pattern::random));
    // Longer rows (3000 keys: 24 tiles, the ring wraps 4 times; maxima settle, most tiles fold),
    // both head dims, causal bottom-right with 390 rows.
    for (const Shape& s : {Shape{1, 130, 3000, 1, 1, 128}, Shape{1, 390, 3000, 2, 1, 64}})
      for (auto c : {O::none, O::bottom_right})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(O::fp8, c, r4), DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, 64, false, false));
    // 16-bit P·V by name (session 13): the TMA-ring kernel at D 64 / 128 (auto's 16-bit kernel
    // there on sm_90a; up to 8 64-key stages: 1000 / 1100 keys wrap the ring twice, 3000 keys
    // six times): the wgmma shapes x 3 causal modes, the ring-wrapping and long rows, early
    // maxima with per-stage (64) and per-key (32) kc, f16 output. (Per-thread layouts, HND, K-mean
    // LSE, zero q / constant V: the loops over kernels below.)
    for (const Shape& s : wgmma_shapes)
      for (auto c : {O::none, O::bottom_right, O::top_left})
        cases.push_back(std::make_unique<Int8AttentionCase>(
            s, make_opt(O::f16, c, r4), DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, 64, false, false));
    for (const Shape& s :
         {ws_extra[0], ws_extra[1], Shape{1, 130, 3000, 1, 1, 128}, Shape{1, 390, 3000, 2, 1, 64}})
      for (auto c : {O::none, O::bottom_right})
        for (int kb : {32, 64})
          cases.push_back(std::make_unique<Int8AttentionCase>(
              s, make_opt(O::f16, c, r4), kb == 32 ? DType::f16 : DType::bf16,
              ScaleLayout::per_block, 128, ScaleLayout::per_block, kb, false, false,
              Pattern::early_max));
  }
  // 16-bit P·V, more shapes by name: at D 64 / 128 the TMA-ring kernel (`ring`: three consumer
  // warpgroups, 192-row CTAs, the P·V in flight under the next softmax), at D = 256 the
  // head-dim-256 kernel (`pv16late`: two consumers, the P·V in flight too): 1-3 row blocks with
  // partial ones, fewer / more keys than rows, GQA, the ring wrapping (1100, 3000 keys), 3 causal
  // modes, early maxima with per-stage and per-key kc (k scales per 64 / 32 keys), THREAD_Q/K +
  // K-mean LSE + HND. `ring3` (session 14): the D = 64 set again on three consumer warpgroups
  // (192-row CTAs; tuning knob ring_cons = 3; `ring` at D = 64 runs the default four). `ring1`
  // (session 54): the D = 128 set on one consumer warpgroup per CTA, two CTAs per multiprocessor
  // (tuning cons1 = 1; `ring` at D = 128 keeps three consumers, cons1 = 2).
  detail::AttentionCudaTuning cons3, ring1, ring_three;
  cons3.ring_cons = 3;
  ring1.cons1 = 1;
  ring_three.cons1 = 2;
  struct RingSet {
    int64_t d;
    int cons;  // 3: ring_cons = 3; 1: cons1 = 1; 0: the default (D = 128: cons1 = 2)
  };
  for (const RingSet& rs :
       {RingSet{64, 0}, RingSet{128, 0}, RingSet{256, 0}, RingSet{64, 3}, RingSet{128, 1}}) {
    const int64_t d = rs.d;
    const bool three = rs.cons == 3;
    const std::string tag = three          ? "ring3"
                            : rs.cons == 1 ? "ring1"
                            : d == 256     ? "pv16late"
                                           : "ring";
    auto add = [&](Shape s, O::Causal c, int kb, Pattern pat, bool thread_layouts) {
      auto k = std::make_unique<Int8AttentionCase>(
          s, make_opt(O::f16, c, O::wgmma_r3), DType::bf16,
          thread_layouts ? ScaleLayout::thread_q : ScaleLayout::per_block,
          thread_layouts ? 32 : 128,
          thread_layouts ? ScaleLayout::thread_k : ScaleLayout::per_block, kb, thread_layouts,
          thread_layouts, pat, tag);
      if (three) k->set_tuning(cons3);
      if (rs.cons == 1) k->set_tuning(ring1);
      if (rs.cons == 0 && d == 128) k->set_tuning(ring_three);
      cases.push_back(std::move(k));
    };
    for (const Shape& s :
         {Shape{1, 1, 1, 1, 1, d}, Shape{1, 17, 17, 2, 1, d}, Shape{2, 127, 127, 4, 2, d},
          Shape{1, 200, 77, 2, 2, d}, Shape{1, 65, 300, 3, 1, d}, Shape{1, 400, 1100, 2, 1, d}})
      for (auto c : {O::none, O::bottom_right, O::top_left}) add(s, c, 64, Pattern::random, false);
    for (auto c : {O::none, O::bottom_right})
      for (int kb : {32, 64}) add(Shape{1, 390, 3000, 2, 1, d}, c, kb, Pattern::early_max, false);
    add(Shape{1, 129, 129, 2, 2, d}, O::bottom_right, 64, Pattern::random, true);
  }
  // `.cgrp` (session 25): the causal CTA walk across head groups (attn::cta_work) with groups of
  // 2 heads forced (tuning causal_heads; by L2 size every small case is one group), 5 heads (a
  // short last group) and GQA 6 / 2 with B 2, several query blocks, on every kernel family: auto
  // at D 64 / 128 / 256 for fp8 and 16-bit P·V, and the mma.sync kernel.
  {
    detail::AttentionCudaTuning grp;
    grp.causal_heads = 2;
    for (int64_t d : {64, 128, 256})
      for (auto pv : {O::fp8, O::f16})
        for (auto kern : {O::auto_kernel, O::mma_sync}) {
          if (kern == O::mma_sync && (d != 128 || pv != O::fp8)) continue;
          for (const Shape& s : {Shape{1, 400, 450, 5, 5, d}, Shape{2, 300, 300, 6, 2, d}})
            for (auto c : {O::bottom_right, O::top_left}) {
              if (c == O::top_left && s.B == 2) continue;
              auto k = std::make_unique<Int8AttentionCase>(
                  s, make_opt(pv, c, kern), DType::bf16, ScaleLayout::per_block, 128,
                  ScaleLayout::per_block, 64, false, false, Pattern::random,
                  kern == O::mma_sync ? "cgrp.mma_sync" : "cgrp");
              k->set_tuning(grp);
              cases.push_back(std::move(k));
            }
        }
  }
  // `.direct` / `.staged` (session 26): auto's fp8 kernel at D = 128 with its output rows stored
  // from the accumulator registers (tuning epilogue 1; the form before the staged rows, which
  // every other D = 128 fp8 case runs) or through the consumers' Q rows (2, the default):
  // partial row blocks (1, 65, 130, 257 rows), rows that see no key (bottom-right with fewer keys
  // than queries), GQA at B 2, THREAD_Q/K + HND + K-mean LSE (read from the Q rows before they
  // are overwritten), V mean, early maxima; f16 output and per-32-key k scales take the other
  // kernels.
  for (int e : {1, 2}) {
    detail::AttentionCudaTuning t;
    t.epilogue = e;
    const std::string tag = e == 1 ? "direct" : "staged";
    auto add = [&](Shape s, O::Causal c, DType dt, bool thread, int kb, bool hnd, bool km,
                   bool vmean, Pattern pat) {
      AttentionOptions o = make_opt(O::fp8, c);
      o.smooth_v = vmean;
      auto k = std::make_unique<Int8AttentionCase>(
          s, o, dt, thread ? ScaleLayout::thread_q : ScaleLayout::per_block, thread ? 32 : 128,
          thread ? ScaleLayout::thread_k : ScaleLayout::per_block, kb, hnd, km, pat, tag);
      k->set_tuning(t);
      cases.push_back(std::move(k));
    };
    for (auto c : {O::none, O::bottom_right, O::top_left}) {
      add(Shape{1, 1, 1, 1, 1, 128}, c, DType::bf16, false, 64, false, false, false,
          Pattern::random);
      add(Shape{1, 65, 300, 3, 1, 128}, c, DType::bf16, false, 64, false, false, false,
          Pattern::random);
      add(Shape{2, 257, 390, 4, 2, 128}, c, DType::bf16, false, 64, false, false, false,
          Pattern::random);
    }
    add(Shape{1, 300, 77, 2, 1, 128}, O::bottom_right, DType::bf16, false, 64, false, false, false,
        Pattern::random);
    add(Shape{1, 130, 1000, 2, 1, 128}, O::bottom_right, DType::bf16, false, 64, false, false,
        false, Pattern::early_max);
    add(Shape{1, 257, 390, 2, 1, 128}, O::none, DType::bf16, true, 64, true, true, false,
        Pattern::random);
    add(Shape{1, 257, 390, 2, 1, 128}, O::bottom_right, DType::bf16, false, 64, false, false, true,
        Pattern::random);
    add(Shape{1, 257, 390, 2, 1, 128}, O::none, DType::f16, false, 64, false, false, false,
        Pattern::random);
    add(Shape{1, 257, 390, 2, 1, 128}, O::none, DType::bf16, false, 32, false, false, false,
        Pattern::random);
  }
  // `.r3c3`: round 3 + I2FP without turns on three consumer warpgroups fed by the TMA producer
  // warp (192 query rows per CTA; tuning knobs no_turn + cons3 on wgmma_r3; D = 64 bf16
  // output with per-half k scales, else the two-consumer kernels, same bits): auto's D = 64
  // kernel. Odd row counts over 1-3 row blocks of 192 (N = 1, 17, 200, 333, 390, 400), the ring
  // wrapping (1100, 3000 keys), 3 causal modes, early maxima (folded halves), the diagnostics,
  // THREAD_Q/K + K-mean LSE (the epilogue's Q rows up to 191, 64-byte swizzle), HND maps, V
  // mean, two fallbacks (f16 output, k scales per 32 keys); D = 128 the same way (below).
  {
    detail::AttentionCudaTuning c3;
    c3.no_turn = true;
    c3.cons3 = true;
    c3.cons1 = 2;  // (D = 128: the two-consumer kernel, auto's past kC1MaxKeys keys)
    const detail::AttentionCudaTuning* tune = &c3;
    const char* tag = "r3c3";  // (tune and tag change for the `.r3c1` cases below)
    auto add = [&](Shape s, O o, DType dt, ScaleLayout ql, int qb, ScaleLayout kl, int kb,
                   bool hnd, bool km, Pattern pat) {
      auto c = std::make_unique<Int8AttentionCase>(s, o, dt, ql, qb, kl, kb, hnd, km, pat, tag);
      c->set_tuning(*tune);
      cases.push_back(std::move(c));
    };
    // The D = 64 set.
    auto add_d64 = [&] {
      const Shape c3_shapes[] = {
          {1, 1, 1, 1, 1, 64},       {1, 17, 17, 2, 1, 64},     {1, 200, 77, 2, 2, 64},
          {1, 333, 129, 2, 1, 64},   {2, 400, 257, 2, 1, 64},   {1, 300, 1100, 2, 2, 64},
          {1, 390, 3000, 2, 1, 64},
      };
      for (const Shape& s : c3_shapes)
        for (auto c : {O::none, O::bottom_right, O::top_left})
          add(s, make_opt(O::fp8, c, O::wgmma_r3), DType::bf16, ScaleLayout::per_block, 128,
              ScaleLayout::per_block, 64, false, false, Pattern::random);
      for (auto c : {O::none, O::bottom_right}) {
        add(Shape{1, 300, 1100, 2, 2, 64}, make_opt(O::fp8, c, O::wgmma_r3), DType::bf16,
            ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false,
            Pattern::early_max);
        for (auto pat : {Pattern::zero_q, Pattern::const_v})
          add(Shape{1, 257, 390, 2, 1, 64}, make_opt(O::fp8, c, O::wgmma_r3), DType::bf16,
              ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false, pat);
      }
      add(Shape{2, 70, 130, 4, 1, 64}, make_opt(O::fp8, O::none, O::wgmma_r3), DType::bf16,
          ScaleLayout::warp_q, 128, ScaleLayout::thread_k, 128, false, true, Pattern::random);
      add(Shape{1, 390, 390, 2, 2, 64}, make_opt(O::fp8, O::bottom_right, O::wgmma_r3),
          DType::bf16, ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true,
          Pattern::random);
      O vmc = make_opt(O::fp8, O::top_left, O::wgmma_r3);
      vmc.smooth_v = true;
      add(Shape{1, 250, 250, 2, 2, 64}, vmc, DType::bf16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 64, false, false, Pattern::random);
      add(Shape{1, 250, 250, 2, 2, 64}, make_opt(O::fp8, O::none, O::wgmma_r3), DType::f16,
          ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false, Pattern::random);
      add(Shape{1, 333, 129, 2, 1, 64}, make_opt(O::fp8, O::bottom_right, O::wgmma_r3),
          DType::bf16, ScaleLayout::per_block, 128, ScaleLayout::per_block, 32, false, false,
          Pattern::random);
    };
    add_d64();
    // D = 128 (TMA producer; while kR3C3At128 is off the `.r3c3` ones run the two-consumer auto
    // kernel): 6 shapes x 3 causal modes (N = 65 .. 390, 127 .. 3000 keys, GQA), early maxima,
    // the diagnostics, THREAD_Q/K + HND + K mean, V mean, and a fallback (k scales per 32 keys:
    // no TMA, the two-consumer round 3).
    auto add_d128 = [&] {
      const Shape c3_128[] = {
          {2, 127, 127, 4, 2, 128}, {1, 65, 300, 3, 1, 128},  {1, 300, 300, 2, 2, 128},
          {1, 257, 390, 2, 1, 128}, {1, 130, 1000, 2, 1, 128}, {1, 390, 3000, 1, 1, 128},
      };
      for (const Shape& s : c3_128)
        for (auto c : {O::none, O::bottom_right, O::top_left})
          add(s, make_opt(O::fp8, c, O::wgmma_r3), DType::bf16, ScaleLayout::per_block, 128,
              ScaleLayout::per_block, 64, false, false, Pattern::random);
      for (auto c : {O::none, O::bottom_right}) {
        add(Shape{1, 130, 1000, 2, 1, 128}, make_opt(O::fp8, c, O::wgmma_r3), DType::bf16,
            ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false,
            Pattern::early_max);
        for (auto pat : {Pattern::zero_q, Pattern::const_v})
          add(Shape{1, 257, 390, 2, 1, 128}, make_opt(O::fp8, c, O::wgmma_r3), DType::bf16,
              ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false, pat);
      }
      add(Shape{1, 400, 400, 2, 2, 128}, make_opt(O::fp8, O::bottom_right, O::wgmma_r3),
          DType::bf16, ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true,
          Pattern::random);
      O vmc128 = make_opt(O::fp8, O::top_left, O::wgmma_r3);
      vmc128.smooth_v = true;
      add(Shape{1, 250, 250, 2, 2, 128}, vmc128, DType::bf16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 64, false, false, Pattern::random);
      add(Shape{1, 257, 390, 2, 1, 128}, make_opt(O::fp8, O::none, O::wgmma_r3), DType::bf16,
          ScaleLayout::per_block, 128, ScaleLayout::per_block, 32, false, false, Pattern::random);
    };
    add_d128();
    // `.r3c1` (session 54): the same D = 128 and D = 64 sets on one consumer warpgroup per CTA
    // (64 query rows, two CTAs per multiprocessor; tuning no_turn + cons1 1): odd row counts over
    // 1-7 blocks of 64, the 3-stage ring wrapping (1000 / 1100, 3000 keys), the fallbacks (k
    // scales per 32 keys, f16 output: round 3); then auto with cons1 1 and the direct epilogue.
    detail::AttentionCudaTuning c1;
    c1.no_turn = true;
    c1.cons1 = 1;
    tune = &c1;
    tag = "r3c1";
    add_d128();
    add_d64();  // (D = 64: the same consumer with the next q k^T under the softmax)
    for (auto c : {O::none, O::bottom_right})
      add(Shape{3, 200, 256, 4, 2, 128}, make_opt(O::fp8, c, O::auto_kernel), DType::bf16,
          ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false, Pattern::random);
    detail::AttentionCudaTuning c1_direct = c1;
    c1_direct.epilogue = 1;
    tune = &c1_direct;
    add(Shape{1, 257, 390, 2, 1, 128}, make_opt(O::fp8, O::bottom_right, O::auto_kernel),
        DType::bf16, ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true,
        Pattern::random);
    // `.r3c1hi` (session 60): the grid with the heads fastest (tuning heads_inner), on the
    // one-consumer kernel and where it falls back (k scales per 32 keys: round 3, whose grid
    // keeps the query blocks fastest; until then it kept the swapped grid and read wrong rows)
    detail::AttentionCudaTuning c1_hi = c1;
    c1_hi.heads_inner = true;
    tune = &c1_hi;
    tag = "r3c1hi";
    for (int64_t d : {64, 128})
      for (int kb : {32, 64})
        add(Shape{2, 257, 390, 3, 1, d}, make_opt(O::fp8, O::none, O::auto_kernel),
            kb == 32 ? DType::f16 : DType::bf16, ScaleLayout::per_block, 128,
            ScaleLayout::per_block, kb, false, false, Pattern::random);
  }
  // `.f16out` (session 60): auto's fp8 P·V kernels with f16 output, which ran plain round 3
  // until then and now take the bf16 kernels (one consumer per CTA up to 2048 / 1024 keys at D
  // 128 / 64, past them two consumers at D 128 and three at D 64): 1-6 row blocks with partial
  // ones, GQA, fewer keys than rows, the rings wrapping, 3 causal modes, THREAD_Q/K + HND + K-mean
  // LSE, V mean.
  for (int64_t d : {64, 128}) {
    auto add = [&](Shape s, O o, bool thread) {
      cases.push_back(std::make_unique<Int8AttentionCase>(
          s, o, DType::f16, thread ? ScaleLayout::thread_q : ScaleLayout::per_block,
          thread ? 32 : 128, thread ? ScaleLayout::thread_k : ScaleLayout::per_block, 64, thread,
          thread, Pattern::random, "f16out"));
    };
    for (const Shape& s :
         {Shape{1, 1, 1, 1, 1, d}, Shape{2, 127, 127, 4, 2, d}, Shape{1, 200, 77, 2, 2, d},
          Shape{1, 65, 300, 3, 1, d}, Shape{1, 300, 1100, 2, 2, d}, Shape{1, 130, 2100, 2, 1, d}})
      for (auto c : {O::none, O::bottom_right, O::top_left}) add(s, make_opt(O::fp8, c), false);
    add(Shape{1, 257, 390, 2, 2, d}, make_opt(O::fp8, O::bottom_right), true);
    O vm = make_opt(O::fp8, O::top_left);
    vm.smooth_v = true;
    add(Shape{1, 250, 250, 2, 2, d}, vm, false);
  }
  // Diagnostics (see Pattern), on every kernel: 390 keys = 3 full tiles + a partial one.
  for (auto kernel : {O::mma_sync, O::wgmma, O::wgmma_r3})
    for (auto pv : {O::fp8, O::f16})
      for (auto pat : {Pattern::zero_q, Pattern::const_v})
        for (auto c : {O::none, O::bottom_right})
          cases.push_back(std::make_unique<Int8AttentionCase>(
              Shape{1, 257, 390, 2, 1, 128}, make_opt(pv, c, kernel), DType::bf16,
              ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false, pat));
  for (const Shape& s : shapes)
    for (auto c : {O::none, O::bottom_right, O::top_left})
      cases.push_back(std::make_unique<Int8AttentionCase>(
          s, make_opt(O::fp8, c, O::mma_sync), DType::bf16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 64, false, false));
  // Per-thread scale layouts, K-mean LSE and V smoothing on each kernel by name, both P·V modes
  // (wgmma_r3's 16-bit P·V is the TMA-ring kernel); wgmma_r3 adds a D = 128 top-left case and a
  // D = 64 V-smoothing case.
  for (auto kernel : {O::wgmma_r3, O::mma_sync, O::wgmma}) {
    const bool r4 = kernel == O::wgmma_r3;
    cases.push_back(std::make_unique<Int8AttentionCase>(
        Shape{1, 129, 129, 2, 2, 128}, make_opt(O::fp8, O::bottom_right, kernel), DType::f16,
        ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true));
    cases.push_back(std::make_unique<Int8AttentionCase>(
        Shape{2, 70, 130, 4, 1, 64}, make_opt(O::fp8, O::none, kernel), DType::bf16,
        ScaleLayout::warp_q, 128, ScaleLayout::thread_k, 128, false, true));
    if (r4)
      cases.push_back(std::make_unique<Int8AttentionCase>(
          Shape{2, 70, 130, 4, 1, 128}, make_opt(O::fp8, O::top_left, kernel), DType::bf16,
          ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true));
    {
      // 16-bit P·V: f16 output and V, HND, per-thread layouts, K-mean LSE.
      cases.push_back(std::make_unique<Int8AttentionCase>(
          Shape{1, 129, 129, 2, 2, 128}, make_opt(O::f16, O::bottom_right, kernel), DType::f16,
          ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true));
      cases.push_back(std::make_unique<Int8AttentionCase>(
          Shape{2, 70, 130, 4, 1, 64}, make_opt(O::f16, O::none, kernel), DType::f16,
          ScaleLayout::warp_q, 128, ScaleLayout::thread_k, 128, false, true));
    }
    O vmk = make_opt(O::fp8, O::top_left, kernel);
    vmk.smooth_v = true;
    cases.push_back(std::make_unique<Int8AttentionCase>(
        Shape{1, 150, 150, 2, 2, 128}, vmk, DType::bf16, ScaleLayout::per_block, 128,
        ScaleLayout::per_block, 64, false, false));
    if (r4)
      cases.push_back(std::make_unique<Int8AttentionCase>(
          Shape{1, 150, 150, 2, 2, 64}, vmk, DType::f16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 64, false, false));
  }
  // fp16 output, HND strides, SageAttention's per-thread layouts, LSE K-mean correction, V mean.
  for (auto pv : {O::fp8, O::f16}) {
    cases.push_back(std::make_unique<Int8AttentionCase>(
        Shape{1, 129, 129, 2, 2, 128}, make_opt(pv, O::bottom_right), DType::f16,
        ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true));
    cases.push_back(std::make_unique<Int8AttentionCase>(
        Shape{2, 70, 130, 4, 1, 64}, make_opt(pv, O::none), DType::bf16, ScaleLayout::warp_q, 128,
        ScaleLayout::thread_k, 128, false, true));
  }
  O vm = make_opt(O::fp8, O::none);
  vm.smooth_v = true;
  cases.push_back(std::make_unique<Int8AttentionCase>(Shape{1, 100, 100, 2, 2, 64}, vm, DType::bf16,
                                                      ScaleLayout::per_block, 128,
                                                      ScaleLayout::per_block, 64, false, false));
  cases.push_back(std::make_unique<QuantizeVCase>(1, 1, 1, 64, DType::bf16, false));
  cases.push_back(std::make_unique<QuantizeVCase>(2, 127, 3, 128, DType::bf16, false));
  cases.push_back(std::make_unique<QuantizeVCase>(1, 1000, 2, 64, DType::f16, false));
  cases.push_back(std::make_unique<QuantizeVCase>(1, 300, 2, 128, DType::bf16, true));
  // Several 512-token chunks of the reduction passes (partial last chunk), both head dims.
  cases.push_back(std::make_unique<QuantizeVCase>(2, 1300, 3, 128, DType::bf16, true));
  cases.push_back(std::make_unique<QuantizeVCase>(1, 2000, 2, 64, DType::f16, true));
  cases.push_back(std::make_unique<QuantizeVCase>(1, 1537, 3, 128, DType::f16, false));
  // Session 20: infinities and NaN (the codes pass's word form and the max pass's merge).
  cases.push_back(std::make_unique<QuantizeVCase>(2, 127, 3, 128, DType::bf16, false, false, true));
  cases.push_back(std::make_unique<QuantizeVCase>(1, 70, 2, 64, DType::f16, false, false, true));
  // One call.
  for (auto pv : {O::fp8, O::f16})
    for (auto c : {O::none, O::bottom_right}) {
      cases.push_back(std::make_unique<AttentionCallCase>(Shape{1, 150, 150, 2, 1, 128},
                                                          make_opt(pv, c), DType::bf16));
      cases.push_back(std::make_unique<AttentionCallCase>(Shape{2, 33, 90, 2, 2, 64},
                                                          make_opt(pv, c), DType::f16));
    }
  // (session 60) f16 q, k, v into fp8 P·V: q quantized in the kernel (D 128 up to 2048 keys, D 64
  // up to 1024, on one consumer warpgroup; since session 61 past those on the long-key kernels:
  // two consumers at D 128, three at D 64), bf16 at those key counts too, both P·V modes.
  for (auto c : {O::none, O::bottom_right, O::top_left}) {
    for (const Shape& s : {Shape{1, 150, 150, 2, 1, 128}, Shape{2, 70, 2100, 2, 1, 128},
                           Shape{3, 200, 77, 4, 2, 64}, Shape{1, 130, 1100, 2, 2, 64}}) {
      O o = make_opt(O::fp8, c);
      o.smooth_v = s.Nkv == 77;
      cases.push_back(std::make_unique<AttentionCallCase>(s, o, DType::f16));
    }
    for (const Shape& s : {Shape{2, 300, 2500, 4, 2, 128}, Shape{1, 400, 1500, 2, 1, 64}})
      for (auto pv : {O::fp8, O::f16}) {  // (16-bit P·V: its TMA-ring kernel quantizing q)
        O o = make_opt(pv, c);
        o.smooth_v = c == O::top_left && pv == O::fp8;
        cases.push_back(std::make_unique<AttentionCallCase>(s, o, DType::bf16));
      }
  }
  for (auto pv : {O::fp8, O::f16})
    for (auto c : {O::none, O::bottom_right})
      for (int64_t d : {64, 128})
        cases.push_back(std::make_unique<AttentionVarlenCase>(make_opt(pv, c), d));
  // One call with q / k RMSNorm + RoPE (options.q_prologue / k_prologue).
  for (auto pv : {O::fp8, O::f16})
    for (auto c : {O::none, O::bottom_right}) {
      NormRopeCfg n;
      n.s = Shape{2, 127, 127, 4, 2, 128};
      n.pv = pv;
      n.causal = c;
      cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    }
  {
    NormRopeCfg n;  // cross-attention: q rotated by a 2 x 2 interleaved table, k normed only
    n.s = Shape{1, 300, 77, 2, 2, 64};
    n.q_matrix = n.q_interleaved = true;
    n.k_rope = false;
    cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    n = NormRopeCfg{};  // joint attention: segmented weights, k's partial rotary
    n.s = Shape{1, 200, 200, 2, 2, 128};
    n.segmented = true;
    n.k_pairs = 32;
    cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    n.pv = O::f16;
    cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    n = NormRopeCfg{};  // head dim 256 (the D = 256 kernels on both sides of the call)
    n.s = Shape{1, 130, 130, 2, 1, 256};
    n.causal = O::top_left;
    cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    // Wan's block: q / k norms over all heads (NormScope::token) + interleaved (complex) rope;
    // GQA, fp8 and 16-bit P·V, D 128 and 64, and packed sequences.
    for (auto pv : {O::fp8, O::f16}) {
      n = NormRopeCfg{};
      n.s = Shape{1, 257, 257, 5, 5, 128};
      n.pv = pv;
      n.token_norm = n.q_interleaved = true;
      cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    }
    n = NormRopeCfg{};
    n.s = Shape{2, 65, 130, 4, 2, 64};
    n.token_norm = true;
    n.causal = O::bottom_right;
    cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    n = NormRopeCfg{};
    n.s = Shape{1, 0, 0, 3, 3, 128};
    n.varlen = n.token_norm = true;
    cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    for (int64_t d : {64, 128}) {  // packed sequences: tables and rows over the packed tokens
      n = NormRopeCfg{};
      n.s = Shape{1, 0, 0, 4, 2, d};
      n.varlen = true;
      n.segmented = d == 128;
      n.causal = O::bottom_right;
      cases.push_back(std::make_unique<AttentionNormRopeCase>(n));
    }
  }

  // Head dim 256 (issue 4; `.d256` in the names). Here the mma.sync kernel by name (`.mma_sync`;
  // fp8 P·V runs on f16 tensor cores from a V tile the CTA widens to f16; auto's kernel at
  // D = 256 until session 11, now on other GPUs and for tensors no TMA descriptor addresses):
  // fp8 and 16-bit P·V, three causal modes, N = 1, 17, 127, 390, N_kv < / > N_q, GQA, B = 2;
  // longer rows (1100 keys) and P·V alone (zero q); f16 output, HND, per-thread layouts, K-mean
  // LSE; WARP_Q + THREAD_K 128 + GQA; V mean; V to fp8 (several 512-token chunks, HND); the one
  // call and varlen with auto (the wgmma kernel on the H200).
  {
    const Shape d256[] = {
        {1, 1, 1, 1, 1, 256},     {1, 17, 17, 2, 1, 256},  {2, 127, 127, 4, 2, 256},
        {1, 390, 390, 2, 2, 256}, {1, 200, 77, 2, 2, 256}, {1, 65, 300, 3, 1, 256},
    };
    for (const Shape& s : d256)
      for (auto pv : {O::fp8, O::f16})
        for (auto c : {O::none, O::bottom_right, O::top_left})
          cases.push_back(std::make_unique<Int8AttentionCase>(
              s, make_opt(pv, c, O::mma_sync), DType::bf16, ScaleLayout::per_block, 128,
              ScaleLayout::per_block, 64, false, false));
    for (auto pv : {O::fp8, O::f16})
      for (auto c : {O::none, O::bottom_right}) {
        cases.push_back(std::make_unique<Int8AttentionCase>(
            Shape{1, 257, 1100, 2, 1, 256}, make_opt(pv, c, O::mma_sync), DType::bf16,
            ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false));
        cases.push_back(std::make_unique<Int8AttentionCase>(
            Shape{1, 257, 390, 2, 1, 256}, make_opt(pv, c, O::mma_sync), DType::bf16,
            ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false,
            Pattern::zero_q));
      }
    // f16 output + HND + THREAD_Q / K + K-mean LSE; WARP_Q + THREAD_K 128 + GQA; V mean: on
    // each kernel by name (mma.sync and the wgmma kernel below).
    for (auto kernel : {O::mma_sync, O::wgmma, O::wgmma_r3}) {
      for (auto pv : {O::fp8, O::f16}) {
        cases.push_back(std::make_unique<Int8AttentionCase>(
            Shape{1, 129, 129, 2, 2, 256}, make_opt(pv, O::bottom_right, kernel), DType::f16,
            ScaleLayout::thread_q, 32, ScaleLayout::thread_k, 64, true, true));
        cases.push_back(std::make_unique<Int8AttentionCase>(
            Shape{2, 70, 130, 4, 1, 256}, make_opt(pv, O::none, kernel), DType::bf16,
            ScaleLayout::warp_q, 128, ScaleLayout::thread_k, 128, false, true));
      }
      if (kernel == O::wgmma_r3) continue;
      O vm = make_opt(O::fp8, O::top_left, kernel);
      vm.smooth_v = true;
      cases.push_back(std::make_unique<Int8AttentionCase>(
          Shape{1, 150, 150, 2, 2, 256}, vm, DType::bf16, ScaleLayout::per_block, 128,
          ScaleLayout::per_block, 64, false, false));
    }
    for (int64_t N : {1, 17, 127, 1000})
      cases.push_back(std::make_unique<QuantizeVCase>(1, N, 2, 256,
                                                      N % 2 ? DType::bf16 : DType::f16, false));
    cases.push_back(std::make_unique<QuantizeVCase>(2, 127, 3, 256, DType::bf16, true));
    cases.push_back(std::make_unique<QuantizeVCase>(2, 1300, 3, 256, DType::f16, true));
    cases.push_back(std::make_unique<QuantizeVCase>(1, 390, 2, 256, DType::bf16, false, true));
    for (auto pv : {O::fp8, O::f16})
      for (auto c : {O::none, O::bottom_right}) {
        cases.push_back(std::make_unique<AttentionCallCase>(Shape{1, 150, 150, 2, 1, 256},
                                                            make_opt(pv, c), DType::bf16));
        cases.push_back(std::make_unique<AttentionCallCase>(Shape{2, 33, 90, 2, 2, 256},
                                                            make_opt(pv, c), DType::f16));
        cases.push_back(std::make_unique<AttentionVarlenCase>(make_opt(pv, c), 256));
      }
    // The head-dim-256 wgmma kernel (session 11; auto's kernel at D = 256 on an sm_90 GPU since
    // H200 run 32, and `.wgmma` / `.wgmma_r3` by name): TMA producer, 64-key ring stages (5 fp8 /
    // 4 16-bit: 1100 keys = 18 stages wrap it three times), two consumer warpgroups of 64 rows.
    // Auto: both P·V modes x 3 causal modes on N = 1, 17, 127, 390, fewer / more keys than
    // queries, GQA, B = 2, 1100 keys. By name: per-key kc (k scales per 32 keys) next to the
    // per-stage kc (64), early maxima, zero q / constant V (its per-thread layouts and V mean are
    // in the loop over kernels above). The one call by name on mma.sync (auto's calls above).
    {
      const Shape w256[] = {
          {1, 1, 1, 1, 1, 256},     {1, 17, 17, 2, 1, 256},  {2, 127, 127, 4, 2, 256},
          {1, 390, 390, 2, 2, 256}, {1, 200, 77, 2, 2, 256}, {1, 65, 300, 3, 1, 256},
          {1, 257, 1100, 2, 1, 256},
      };
      for (const Shape& s : w256)
        for (auto pv : {O::fp8, O::f16})
          for (auto c : {O::none, O::bottom_right, O::top_left})
            cases.push_back(std::make_unique<Int8AttentionCase>(
                s, make_opt(pv, c), DType::bf16, ScaleLayout::per_block, 128,
                ScaleLayout::per_block, 64, false, false));
      for (auto pv : {O::fp8, O::f16})
        for (auto c : {O::none, O::bottom_right}) {
          for (int kb : {32, 64})
            cases.push_back(std::make_unique<Int8AttentionCase>(
                Shape{1, 130, 1100, 2, 1, 256}, make_opt(pv, c, O::wgmma), DType::bf16,
                ScaleLayout::per_block, 128, ScaleLayout::per_block, kb, false, false,
                Pattern::early_max));
          for (auto pat : {Pattern::zero_q, Pattern::const_v})
            cases.push_back(std::make_unique<Int8AttentionCase>(
                Shape{1, 257, 390, 2, 1, 256}, make_opt(pv, c, O::wgmma), DType::bf16,
                ScaleLayout::per_block, 128, ScaleLayout::per_block, 64, false, false, pat));
        }
      for (auto pv : {O::fp8, O::f16})
        for (auto c : {O::none, O::bottom_right}) {
          cases.push_back(std::make_unique<AttentionCallCase>(
              Shape{1, 150, 150, 2, 1, 256}, make_opt(pv, c, O::mma_sync), DType::bf16));
          cases.push_back(std::make_unique<AttentionCallCase>(
              Shape{2, 33, 90, 2, 2, 256}, make_opt(pv, c, O::mma_sync), DType::f16));
        }
    }
    O sv = make_opt(O::fp8, O::top_left, O::mma_sync);
    sv.smooth_v = true;
    cases.push_back(
        std::make_unique<AttentionCallCase>(Shape{1, 17, 17, 1, 1, 256}, sv, DType::bf16));
    O nk = make_opt(O::f16, O::none);
    nk.smooth_k = false;
    cases.push_back(
        std::make_unique<AttentionCallCase>(Shape{1, 127, 1000, 4, 1, 256}, nk, DType::bf16));
  }
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
