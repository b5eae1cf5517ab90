// Harness cases of the ConvRot family (SPEC §3): every backend against the CPU oracle. Integer
// and format paths are bit-exact (rotation, activation codes and scales, integer-GEMM outputs,
// dequantized weights); the fp8 / NVFP4 GEMMs (a tensor-core sum order differs from the CPU's
// exact sum) and the backward pass are compared with float tolerances.
#include <string>

#include "lowbit/linear.h"
#include "tests/cases/linear_case_types.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {
namespace {

std::string shape_str(std::initializer_list<int64_t> s) {
  std::string r;
  for (int64_t v : s) r += (r.empty() ? "" : "x") + std::to_string(v);
  return r;
}

class RotateCase : public Case {
 public:
  RotateCase(int64_t rows, int64_t K, int block, DType in, DType out)
      : rows_(rows), K_(K), block_(block), in_(in), out_(out) {}
  std::string name() const override {
    return "linear.rotate." + std::to_string(block_) + "." + shape_str({rows_, K_}) + "." +
           dtype_name(in_) + "_to_" + dtype_name(out_);
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor x(in_, {rows_, K_});
    x.fill_normal(rng, 0.f, 2.f);
    std::vector<HostTensor> v;
    v.push_back(std::move(x));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "out";
    o.dtype = out_;
    o.shape = {rows_, K_};
    return {o};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    hadamard_rotate(in[0], block_, out[0], ctx);
  }

 private:
  int64_t rows_, K_;
  int block_;
  DType in_, out_;
};

class ActQuantCase : public Case {
 public:
  ActQuantCase(QType q, int64_t M, int64_t K, DType dt) : q_(q), M_(M), K_(K), dt_(dt) {}
  std::string name() const override {
    return std::string("linear.act_quant.") + qtype_name(q_) + "." + shape_str({M_, K_}) + "." +
           dtype_name(dt_);
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor x(dt_, {M_, K_});
    x.fill_normal(rng);
    if (M_ > 1)  // a zero row (amax 0 -> scale 1, codes 0) and an outlier channel
      for (int64_t k = 0; k < K_; ++k) x.set(k, 0.f);
    if (M_ > 2) x.set(2 * K_ + 5, 300.f);
    std::vector<HostTensor> v;
    v.push_back(std::move(x));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec codes, scales;
    codes.name = "codes";
    codes.dtype = q_ == QType::convrot_fp8 ? DType::e4m3
                  : q_ == QType::convrot4  ? DType::e2m1x2
                                           : DType::i8;
    codes.shape = {M_, K_};
    scales.name = "scales";
    if (q_ == QType::convrot4) {
      scales.dtype = DType::e4m3;
      scales.shape = {M_, K_ / 16};
    } else {
      scales.dtype = DType::f32;
      scales.shape = {M_};
    }
    return {codes, scales};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    rotate_quantize_activations(in[0], q_, rotation_block(K_), out[0], out[1], ctx);
  }

 private:
  QType q_;
  int64_t M_, K_;
  DType dt_;
};

// Shared inputs of the layer cases: x (M, K), weight (O, K) f32, bias (O) f32.
std::vector<HostTensor> layer_inputs(std::mt19937_64& rng, int64_t M, int64_t O, int64_t K,
                                     DType dt) {
  HostTensor x(dt, {M, K}), w(DType::f32, {O, K}), b(DType::f32, {O});
  x.fill_normal(rng);
  w.fill_normal(rng, 0.f, 0.05f);
  b.fill_normal(rng);
  std::vector<HostTensor> v;
  v.push_back(std::move(x));
  v.push_back(std::move(w));
  v.push_back(std::move(b));
  return v;
}

bool exact_gemm(QType q) { return q != QType::convrot_fp8 && q != QType::convrot4; }

class ForwardCase : public Case {
 public:
  ForwardCase(QType q, int64_t M, int64_t O, int64_t K, DType dt, bool bias)
      : q_(q), M_(M), O_(O), K_(K), dt_(dt), bias_(bias) {}
  std::string name() const override {
    return std::string("linear.forward.") + qtype_name(q_) + "." + shape_str({M_, O_, K_}) + "." +
           dtype_name(dt_) + (bias_ ? ".bias" : "");
  }
  std::string unsupported(Device d) const override {
    if (d == Device::cuda && dt_ == DType::f32) return "f32 activations are CPU-only";
    if (d == Device::cuda && q_ == QType::convrot_fp8) return cuda_lacks_fp8();
    return "";
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    return layer_inputs(rng, M_, O_, K_, dt_);
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "out";
    o.dtype = dt_;
    o.shape = {M_, O_};
    // Integer GEMMs: the int32 sum is exact and the epilogue is three fp32 operations: bit-exact.
    // fp8 / NVFP4: the CPU rounds the exact sum once; a tensor-core sum rounds more often.
    o.tol = exact_gemm(q_) ? Tolerance::bit_exact() : Tolerance::allclose(1e-3, 1e-2);
    return {o};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    QuantizedLinear lin = QuantizedLinear::quantize(in[1], q_, ctx);
    lin.forward(in[0], bias_ ? &in[2] : nullptr, out[0], ctx);
  }

 private:
  QType q_;
  int64_t M_, O_, K_;
  DType dt_;
  bool bias_;
};

LOWBIT_HARNESS_CASES(linear_cases) {
  for (int block : {16, 64, 256}) {
    cases.push_back(std::make_unique<RotateCase>(17, block * 3, block, DType::bf16, DType::f32));
    cases.push_back(std::make_unique<RotateCase>(1, block, block, DType::f32, DType::f32));
  }
  cases.push_back(std::make_unique<RotateCase>(127, 3072, 256, DType::f16, DType::f16));
  const QType act_q[] = {QType::convrot8, QType::convrot_comfy_w4a4, QType::convrot_fp8,
                         QType::convrot4};
  for (QType q : act_q) {
    const int64_t K = q == QType::convrot_comfy_w4a4 ? 512 : 320;
    cases.push_back(std::make_unique<ActQuantCase>(q, 1, K, DType::bf16));
    cases.push_back(std::make_unique<ActQuantCase>(q, 17, K, DType::bf16));
    cases.push_back(std::make_unique<ActQuantCase>(q, 127, 3072, DType::f16));
  }
  for (int i = 0; i < kNumQTypes; ++i) {
    QType q = static_cast<QType>(i);
    const int64_t K = q == QType::convrot_comfy_w4a4 ? 512 : 320;
    // Decode (M <= 16) and prefill (M > 16) shapes, odd M.
    cases.push_back(std::make_unique<ForwardCase>(q, 1, 48, K, DType::bf16, true));
    cases.push_back(std::make_unique<ForwardCase>(q, 17, 48, K, DType::bf16, false));
    cases.push_back(std::make_unique<DequantizeCase>(DequantizeSpec{
        std::string("linear.dequantize.") + qtype_name(q) + "." + shape_str({48, K}), q, 48, K,
        true, true, Tolerance::allclose(1e-6, 1e-5)}));
  }
  for (QType q : {QType::convrot8, QType::convrot_int4, QType::convrot4, QType::convrot_fp8}) {
    cases.push_back(std::make_unique<ForwardCase>(q, 127, 256, 3072, DType::bf16, true));
    cases.push_back(std::make_unique<ForwardCase>(q, 5, 32, 256, DType::f16, true));
    cases.push_back(std::make_unique<BackwardInputCase>(BackwardInputSpec{
        std::string("linear.backward_input.") + qtype_name(q) + "." + shape_str({17, 48, 320}) +
            ".bf16",
        q, 17, 48, 320, DType::bf16, DType::bf16, 0.05f, Tolerance::allclose(1e-2, 1e-2)}));
  }
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 3, 16, 64, DType::f32, true));
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
