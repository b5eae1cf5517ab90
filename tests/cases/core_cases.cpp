// Harness cases of the core: dtype conversion on every backend, against the CPU's software
// rounding (the CUDA backend uses the hardware cvt instructions where they exist).
#include <string>

#include "lowbit/core.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace harness {
namespace {

class ConvertCase : public Case {
 public:
  // transpose: read the source through a transposed (strided) 2-D view.
  ConvertCase(DType src, DType dst, int64_t rows, int64_t cols, bool transpose)
      : src_(src), dst_(dst), rows_(rows), cols_(cols), transpose_(transpose) {}

  std::string name() const override {
    return std::string("core.convert.") + dtype_name(src_) + "_to_" + dtype_name(dst_) + "." +
           std::to_string(rows_) + "x" + std::to_string(cols_) + (transpose_ ? ".strided" : "");
  }

  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor x(src_, {transpose_ ? cols_ : rows_, transpose_ ? rows_ : cols_});
    // A third random bit patterns (NaN, inf, subnormals, every exponent), a third N(0, 1) scaled
    // into the target's range, a third exact ties of the target format.
    std::uniform_int_distribution<int> pick(0, 2);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_int_distribution<int> exp(-12, 10);
    for (int64_t i = 0; i < x.numel(); ++i) {
      int k = pick(rng);
      if (k == 0 && src_ != DType::i8 && !dtype_is_packed(src_)) {
        for (int b = 0; b < dtype_bits(src_) / 8; ++b)
          x.bytes[i * (dtype_bits(src_) / 8) + b] = static_cast<uint8_t>(rng());
      } else if (k == 1 || dtype_is_packed(src_) || src_ == DType::i8) {
        x.set(i, normal(rng) * std::ldexp(1.f, exp(rng)));
      } else {
        // midpoint between two neighbours on a 2^-k grid: exercises ties-to-even.
        x.set(i, (static_cast<float>(static_cast<int>(rng() % 64)) + 0.5f) * std::ldexp(1.f, exp(rng) - 3));
      }
    }
    std::vector<HostTensor> v;
    v.push_back(std::move(x));
    return v;
  }

  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "dst";
    o.dtype = dst_;
    o.shape = {rows_, cols_};
    o.tol = Tolerance::bit_exact();
    o.tol.allow_nonfinite = true;  // NaN/inf inputs convert to NaN/inf by design
    return {o};
  }

  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    TensorView src = in[0];
    if (transpose_) {
      std::swap(src.shape[0], src.shape[1]);
      std::swap(src.stride[0], src.stride[1]);
    }
    convert(src, out[0], ctx);
  }

 private:
  DType src_, dst_;
  int64_t rows_, cols_;
  bool transpose_;
};

LOWBIT_HARNESS_CASES(core_convert_cases) {
  const DType floats[] = {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2};
  for (DType s : floats)
    for (DType d : floats)
      if (s != d) cases.push_back(std::make_unique<ConvertCase>(s, d, 33, 257, false));
  for (DType d : {DType::i8, DType::e2m1x2, DType::i4x2}) {
    cases.push_back(std::make_unique<ConvertCase>(DType::f32, d, 1, 2, false));
    cases.push_back(std::make_unique<ConvertCase>(DType::f32, d, 17, 1000, false));
    cases.push_back(std::make_unique<ConvertCase>(d, DType::f32, 17, 1000, false));
  }
  for (DType d : {DType::bf16, DType::f16, DType::e4m3})
    cases.push_back(std::make_unique<ConvertCase>(DType::f32, d, 127, 129, true));
  cases.push_back(std::make_unique<ConvertCase>(DType::f32, DType::e4m3, 1, 1, false));
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
