// Harness case types shared by the ConvRot case lists (linear_cases.cpp: the op-level cases,
// linear_cuda_cases.cpp: the GPU-path cases). Each list names its cases in its own scheme; the
// arithmetic they check is the same, so the case code lives here once.
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/linear.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {

// backward_input: grad_x(M, K) = grad_out(M, O) · W(O, K) from the stored codes, against the CPU.
struct BackwardInputSpec {
  std::string name;
  QType q;
  int64_t m, o, k;
  DType grad_dtype;    // dtype of grad_out (M, O)
  DType out_dtype;     // dtype of grad_x (M, K)
  float w_std;         // the weights' N(0, w_std); <= 0: 1/sqrt(O)
  Tolerance tol;
};

class BackwardInputCase : public Case {
 public:
  explicit BackwardInputCase(BackwardInputSpec s) : s_(std::move(s)) {}
  std::string name() const override { return s_.name; }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor g(s_.grad_dtype, {s_.m, s_.o}), w(DType::f32, {s_.o, s_.k});
    g.fill_normal(rng, 0.f, 1.f);
    const float std = s_.w_std > 0 ? s_.w_std : 1.f / std::sqrt(static_cast<float>(s_.o));
    w.fill_normal(rng, 0.f, std);
    std::vector<HostTensor> v;
    v.push_back(std::move(g));
    v.push_back(std::move(w));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "grad_x";
    o.dtype = s_.out_dtype;
    o.shape = {s_.m, s_.k};
    o.tol = s_.tol;
    return {o};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    QuantizedLinear layer = QuantizedLinear::quantize(in[1], s_.q, ctx);
    layer.backward_input(in[0], out[0], ctx);
  }

 private:
  BackwardInputSpec s_;
};

// dequantize_weight (O, K) f32 in the rotated basis (unpack + scale) and/or the original basis
// (plus the inverse rotation), one output per requested basis.
struct DequantizeSpec {
  std::string name;
  QType q;
  int64_t o, k;
  bool rotated;        // output "rotated_basis"
  bool original;       // output "original_basis"
  Tolerance original_tol;
};

class DequantizeCase : public Case {
 public:
  explicit DequantizeCase(DequantizeSpec s) : s_(std::move(s)) {}
  std::string name() const override { return s_.name; }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor w(DType::f32, {s_.o, s_.k});
    w.fill_normal(rng, 0.f, 0.05f);
    std::vector<HostTensor> v;
    v.push_back(std::move(w));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    std::vector<OutputSpec> v;
    if (s_.rotated) {
      OutputSpec o;
      o.name = "rotated_basis";
      o.dtype = DType::f32;
      o.shape = {s_.o, s_.k};
      o.tol = Tolerance::bit_exact();
      v.push_back(o);
    }
    if (s_.original) {
      OutputSpec o;
      o.name = "original_basis";
      o.dtype = DType::f32;
      o.shape = {s_.o, s_.k};
      o.tol = s_.original_tol;
      v.push_back(o);
    }
    return v;
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    QuantizedLinear layer = QuantizedLinear::quantize(in[0], s_.q, ctx);
    size_t i = 0;
    if (s_.rotated) dequantize_weight(layer.weights(), out[i++], true, ctx);
    if (s_.original) layer.dequantize(out[i], ctx);
  }

 private:
  DequantizeSpec s_;
};

}  // namespace harness
}  // namespace lowbit
