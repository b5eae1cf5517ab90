// Harness cases of the ConvRot GPU paths (SPEC §3.5): every CUDA kernel against the CPU oracle.
// Bit-exact where the arithmetic is fixed (the rotation's butterfly order, codes and scales, int32
// accumulation with the fp32 epilogue in a fixed order, the decode kernel on packed codes); fp8 and
// NVFP4 layer outputs accumulate in fp32 in the tensor core's order and get a tolerance. Sizes are
// small (the CPU runs these too) and odd: M in {1, 16, 17, 127}, K covering rot 16, 64 and 256.
#include <cmath>
#include <string>
#include <vector>

#include "lowbit/linear.h"
#include "tests/cases/linear_case_types.h"
#include "tests/harness/harness.h"
#ifdef LOWBIT_WITH_CUDA
#include "src/cuda/linear_decode_tiles.cuh"
#endif

namespace lowbit {
namespace harness {
namespace {

std::string dt_tag(DType d) { return dtype_name(d); }

// A (rows, cols) view of the first `cols` columns of a (rows, cols + pad) tensor.
TensorView narrow_cols(TensorView v, int64_t cols) {
  v.shape[1] = cols;
  return v;
}

// hadamard_rotate: (M, K) with a padded row stride, f32/bf16/f16 in and out.
class RotateCase : public Case {
 public:
  RotateCase(int64_t m, int64_t k, int block, DType in, DType out, int64_t pad)
      : m_(m), k_(k), block_(block), in_(in), out_(out), pad_(pad) {}
  std::string name() const override {
    return "linear.gpu.rotate." + dt_tag(in_) + "_to_" + dt_tag(out_) + ".M" + std::to_string(m_) +
           ".K" + std::to_string(k_) + ".rot" + std::to_string(block_) + (pad_ ? ".strided" : "");
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor x(in_, {m_, k_ + pad_});
    x.fill_normal(rng, 0.f, 3.f);
    std::vector<HostTensor> v;
    v.push_back(std::move(x));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "out";
    o.dtype = out_;
    o.shape = {m_, k_};
    o.tol = Tolerance::bit_exact();
    return {o};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    hadamard_rotate(narrow_cols(in[0], k_), block_, out[0], ctx);
  }

 private:
  int64_t m_, k_;
  int block_;
  DType in_, out_;
  int64_t pad_;
};

// rotate_quantize_activations: codes and scales bit-exact for every activation format.
class RotateQuantizeCase : public Case {
 public:
  RotateQuantizeCase(QType q, int64_t m, int64_t k, DType in, int64_t pad)
      : q_(q), m_(m), k_(k), in_(in), pad_(pad) {}
  std::string name() const override {
    return std::string("linear.gpu.rotate_quantize.") + qtype_name(q_) + "." + dt_tag(in_) + ".M" +
           std::to_string(m_) + ".K" + std::to_string(k_) + (pad_ ? ".strided" : "");
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor x(in_, {m_, k_ + pad_});
    x.fill_normal(rng, 0.f, 2.f);
    // An all-zero row (scale 1 rule) and one outlier row (a wide amax).
    if (m_ > 2) {
      for (int64_t c = 0; c < k_ + pad_; ++c) x.set(1 * (k_ + pad_) + c, 0.f);
      x.set(2 * (k_ + pad_) + 3, 900.f);
    }
    std::vector<HostTensor> v;
    v.push_back(std::move(x));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec codes, scales;
    codes.name = "codes";
    scales.name = "scales";
    codes.shape = {m_, k_};
    codes.tol = Tolerance::bit_exact();
    scales.tol = Tolerance::bit_exact();
    if (q_ == QType::convrot4) {
      codes.dtype = DType::e2m1x2;
      scales.dtype = DType::e4m3;
      scales.shape = {m_, k_ / 16};
    } else {
      codes.dtype = q_ == QType::convrot_fp8 ? DType::e4m3 : DType::i8;
      scales.dtype = DType::f32;
      scales.shape = {m_};
    }
    return {codes, scales};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    rotate_quantize_activations(narrow_cols(in[0], k_), q_, rotation_block(k_), out[0], out[1],
                                ctx);
  }

 private:
  QType q_;
  int64_t m_, k_;
  DType in_;
  int64_t pad_;
};

// The full layer: quantize W (O, K) on the host, forward x (M, K) [+ bias] on the backend.
// M <= 16 runs the fused decode kernel on CUDA, M > 16 the prefill GEMM: both against the CPU.
class ForwardCase : public Case {
 public:
  ForwardCase(QType q, int64_t m, int64_t o, int64_t k, DType act, bool bias)
      : q_(q), m_(m), o_(o), k_(k), act_(act), bias_(bias) {}
  std::string unsupported(Device d) const override {
    return d == Device::cuda && q_ == QType::convrot_fp8 ? cuda_lacks_fp8() : "";
  }
  std::string name() const override {
    return std::string("linear.gpu.forward.") + qtype_name(q_) + "." + dt_tag(act_) + ".M" +
           std::to_string(m_) + ".O" + std::to_string(o_) + ".K" + std::to_string(k_) +
           (bias_ ? ".bias" : "");
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor x(act_, {m_, k_}), w(DType::f32, {o_, k_}), b(act_, {o_});
    x.fill_normal(rng, 0.f, 1.f);
    w.fill_normal(rng, 0.f, 1.f / std::sqrt(static_cast<float>(k_)));
    b.fill_normal(rng, 0.f, 0.5f);
    std::vector<HostTensor> v;
    v.push_back(std::move(x));
    v.push_back(std::move(w));
    v.push_back(std::move(b));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "out";
    o.dtype = act_;
    o.shape = {m_, o_};
    if (q_ == QType::convrot_fp8 || q_ == QType::convrot4) {
      // fp32 accumulation in the tensor core's order vs the CPU's: a few fp32 ulps of the sum,
      // then one rounding to the output dtype (2^-8 relative for bf16).
      o.tol = Tolerance::allclose(1e-2, 1e-2);
    } else {
      o.tol = Tolerance::bit_exact();
    }
    return {o};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    QuantizedLinear layer = QuantizedLinear::quantize(in[1], q_, ctx);
    layer.forward(in[0], bias_ ? &in[2] : nullptr, out[0], ctx);
  }

 protected:
  QType q_;
  int64_t m_, o_, k_;
  DType act_;
  bool bias_;
};

// Session 37: the layer re-quantized on its stored scales from a second weight, then forward:
// the weight's device-side layouts (decode tiles, int4's GEMM fold tables, NVFP4's block-scale
// words) must be rebuilt from the rewritten codes and scales.
class RequantForwardCase : public ForwardCase {
 public:
  using ForwardCase::ForwardCase;
  std::string name() const override {
    const std::string n = ForwardCase::name();
    return "linear.gpu.forward_requant" + n.substr(std::string("linear.gpu.forward").size());
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    std::vector<HostTensor> v = ForwardCase::make_inputs(rng);
    HostTensor w2(DType::f32, {o_, k_});
    w2.fill_normal(rng, 0.f, 1.f / std::sqrt(static_cast<float>(k_)));
    v.push_back(std::move(w2));
    return v;
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    QuantizedLinear layer = QuantizedLinear::quantize(in[1], q_, ctx);
    layer.requantize(in[3], false, 0, ctx);
    layer.forward(in[0], bias_ ? &in[2] : nullptr, out[0], ctx);
  }
};

#ifdef LOWBIT_WITH_CUDA
// The layer with a run-time variant of the tiled decode kernel (cuda::linear::DecodeTilesTuning,
// set through the test hook for the CUDA run, restored afterwards): the same bits as the CPU.
class TunedForwardCase : public ForwardCase {
 public:
  TunedForwardCase(std::string variant, cuda::linear::DecodeTilesTuning t, QType q, int64_t m,
                   int64_t o, int64_t k, DType act, bool bias)
      : ForwardCase(q, m, o, k, act, bias), variant_(std::move(variant)), t_(t) {}
  std::string unsupported(Device d) const override {
    // The variants steer sm_90 decode kernels (ring, tiles); in older device code the layer runs
    // its fallbacks, which for convrotfp8 is cuBLASLt's fast-accumulation fp8 GEMM, outside this
    // case's tolerance at K 13824 (the plain forward cases cover that fallback).
    if (d == Device::cuda && q_ == QType::convrot_fp8 && cuda_code_arch() < 90)
      return "steers the sm_90 fp8 ring GEMV: sm_90 device code only";
    return ForwardCase::unsupported(d);
  }
  std::string name() const override {
    std::string n = ForwardCase::name();
    const size_t tail = std::string("linear.gpu.forward").size();
    return "linear.gpu.forward_tiles." + variant_ + n.substr(tail);
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    if (in[0].device != Device::cuda) {
      ForwardCase::run(in, out, ctx);
      return;
    }
    struct Restore {
      ~Restore() { cuda::linear::set_layer_tiles_tuning(nullptr); }
    } restore;
    cuda::linear::set_layer_tiles_tuning(&t_);
    ForwardCase::run(in, out, ctx);
  }

 private:
  std::string variant_;
  cuda::linear::DecodeTilesTuning t_;
};
#endif

std::unique_ptr<Case> gpu_dequantize_case(QType q, int64_t o, int64_t k, bool rotated) {
  return std::make_unique<DequantizeCase>(DequantizeSpec{
      std::string("linear.gpu.dequantize.") + qtype_name(q) + ".O" + std::to_string(o) + ".K" +
          std::to_string(k) + (rotated ? ".rotated" : ".original"),
      q, o, k, rotated, !rotated, Tolerance::bit_exact()});
}

// Re-quantization on stored scales: the int8 codes after requantize (nearest or stochastic).
class RequantizeCase : public Case {
 public:
  RequantizeCase(int64_t o, int64_t k, bool stochastic) : o_(o), k_(k), stochastic_(stochastic) {}
  std::string name() const override {
    return "linear.gpu.requantize.convrot8.O" + std::to_string(o_) + ".K" + std::to_string(k_) +
           (stochastic_ ? ".stochastic" : ".nearest");
  }
  std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const override {
    HostTensor w(DType::f32, {o_, k_}), w2(DType::f32, {o_, k_});
    w.fill_normal(rng, 0.f, 0.05f);
    w2.fill_normal(rng, 0.f, 0.05f);
    std::vector<HostTensor> v;
    v.push_back(std::move(w));
    v.push_back(std::move(w2));
    return v;
  }
  std::vector<OutputSpec> outputs() const override {
    OutputSpec o;
    o.name = "codes";
    o.dtype = DType::i8;
    o.shape = {o_, k_};
    o.tol = Tolerance::bit_exact();
    return {o};
  }
  void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
           Context& ctx) const override {
    QuantizedLinear layer = QuantizedLinear::quantize(in[0], QType::convrot8, ctx);
    layer.requantize(in[1], stochastic_, 0x5eedull, ctx);
    const TensorView& c = layer.weights().codes;
    if (c.device == Device::cuda) {
      copy_device_to_device(out[0].data, c.data, static_cast<size_t>(o_ * k_), ctx);
    } else {
      const auto* src = static_cast<const int8_t*>(c.data);
      auto* dst = static_cast<int8_t*>(out[0].data);
      for (int64_t i = 0; i < o_ * k_; ++i) dst[i] = src[i];
    }
  }

 private:
  int64_t o_, k_;
  bool stochastic_;
};

const QType kAllQTypes[] = {QType::convrot8,           QType::convrot_int2, QType::convrot_int3,
                            QType::convrot_int4,       QType::convrot_int5, QType::convrot_int6,
                            QType::convrot_int7,       QType::convrot_int8, QType::convrot_bitnet,
                            QType::convrot_comfy_w4a4, QType::convrot4,     QType::convrot_fp8};

LOWBIT_HARNESS_CASES(linear_cuda_cases) {
  // Rotation: every block size, odd row counts, a strided input, every in/out dtype pair.
  for (int64_t k : {48, 192, 512, 1280}) {
    const int rot = rotation_block(k);
    for (int64_t m : {1, 17})
      cases.push_back(std::make_unique<RotateCase>(m, k, rot, DType::f32, DType::f32, 0));
    cases.push_back(std::make_unique<RotateCase>(127, k, rot, DType::bf16, DType::f32, 8));
  }
  cases.push_back(std::make_unique<RotateCase>(33, 768, 256, DType::bf16, DType::bf16, 0));
  cases.push_back(std::make_unique<RotateCase>(33, 768, 64, DType::f16, DType::f16, 16));
  cases.push_back(std::make_unique<RotateCase>(5, 256, 16, DType::f32, DType::bf16, 0));

  // Rotate + quantize: each activation format, each block size.
  for (QType q : {QType::convrot8, QType::convrot_comfy_w4a4, QType::convrot_fp8, QType::convrot4})
    for (int64_t k : {48, 192, 512}) {
      if (q == QType::convrot_comfy_w4a4 && k % 256) continue;
      cases.push_back(std::make_unique<RotateQuantizeCase>(q, 17, k, DType::bf16, 0));
      cases.push_back(std::make_unique<RotateQuantizeCase>(q, 1, k, DType::f16, 8));
    }
  cases.push_back(std::make_unique<RotateQuantizeCase>(QType::convrot8, 127, 1280, DType::f32, 0));
  // The register kernel at a production K (320 threads per row), unaligned rows (its scalar load
  // path), and a K past its 16384 limit (the shared-memory kernel's fallback).
  for (QType q : {QType::convrot8, QType::convrot_fp8, QType::convrot4, QType::convrot_comfy_w4a4})
    cases.push_back(std::make_unique<RotateQuantizeCase>(q, 3, 5120, DType::bf16, 0));
  cases.push_back(std::make_unique<RotateQuantizeCase>(QType::convrot8, 5, 320, DType::f16, 3));
  // Many rows (more than the resident CTAs: each loops over rows, the count not dividing evenly),
  // a strided 16-byte aligned input and f16.
  for (QType q : {QType::convrot8, QType::convrot_fp8, QType::convrot_comfy_w4a4}) {
    cases.push_back(std::make_unique<RotateQuantizeCase>(q, 1001, 5120, DType::bf16, 0));
    cases.push_back(std::make_unique<RotateQuantizeCase>(q, 333, 768, DType::f16, 8));
  }
  cases.push_back(std::make_unique<RotateQuantizeCase>(QType::convrot8, 3, 16640, DType::bf16, 0));
  cases.push_back(std::make_unique<RotateCase>(3, 5120, 256, DType::bf16, DType::bf16, 0));
  cases.push_back(std::make_unique<RotateCase>(4, 320, 64, DType::bf16, DType::f16, 5));

  // The layer: every qtype; decode (M = 1, 16) and prefill (M = 17, 127).
  for (QType q : kAllQTypes) {
    const int64_t k = q == QType::convrot_comfy_w4a4 ? 512 : 192;
    for (int64_t m : {1, 16, 17, 127})
      cases.push_back(std::make_unique<ForwardCase>(q, m, 48, k, DType::bf16, m != 16));
    // rot 16 and an O that is not a multiple of the CTA tiles.
    if (q != QType::convrot_comfy_w4a4) {
      cases.push_back(std::make_unique<ForwardCase>(q, 3, 144, 80, DType::f16, true));
      cases.push_back(std::make_unique<ForwardCase>(q, 130, 144, 80, DType::f16, false));
    }
  }
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot8, 129, 264, 1280, DType::bf16, true));
  // The fp8 GEMM over ten 128-deep k-blocks and a ragged M tile.
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_fp8, 300, 264, 1280, DType::bf16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 5, 264, 1280, DType::bf16, true));
  // The streaming decode kernel (K % 128 == 0, group 128): M = 1 and 16, a K that leaves a step's
  // last pieces empty (640 = 5 groups), comfy int4, odd column tiles.
  for (int64_t m : {1, 16}) {
    cases.push_back(
        std::make_unique<ForwardCase>(QType::convrot_int4, m, 264, 1280, DType::bf16, m == 1));
    cases.push_back(
        std::make_unique<ForwardCase>(QType::convrot_int4, m, 40, 640, DType::f16, true));
    cases.push_back(
        std::make_unique<ForwardCase>(QType::convrot_comfy_w4a4, m, 72, 768, DType::bf16, true));
  }
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 7, 8, 2048, DType::bf16, true));
  // More 4-bit table lookups (round 1 failed every 4-bit case here): a single group, f16, odd M.
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot_int4, 2, 24, 128, DType::f16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_comfy_w4a4, 9, 16, 256, DType::f16, false));
  // Enough column tiles that the resident grid gives CTAs several tiles (the cross-tile pipeline
  // and the double-buffered partials): 1 warp per CTA at K <= 256, 3 at K = 1280.
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 1, 24000, 128, DType::bf16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 3, 8000, 1280, DType::f16, false));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_comfy_w4a4, 2, 24008, 256, DType::bf16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot8, 16, 28000, 256, DType::bf16, true));
  // The same kernel on int8 weights (convrot8).
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 1, 264, 1280, DType::bf16, true));
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 16, 40, 640, DType::f16, false));

  // The ring decode kernel (session 3; 4-bit K % 512 == 0, int8 K % 256 == 0): M <= 2 fused
  // (rotation + quantization in the kernel, bf16 and f16 x), M 3..8 (8-row tiles, codes from the
  // rotate kernel), M 9..16 (16-row tiles, the mma's upper rows partly empty); K of one slice
  // and of many (5120: the production K); O from one CTA with one tile to enough rows that every
  // warp of a 132-CTA grid runs several tiles through its ring (O 20000).
  for (int64_t m : {1, 2, 5, 9, 16}) {
    cases.push_back(std::make_unique<ForwardCase>(QType::convrot_int4, m, 264, 1536,
                                                  m % 2 ? DType::bf16 : DType::f16, m != 5));
    cases.push_back(std::make_unique<ForwardCase>(QType::convrot_comfy_w4a4, m, 136, 1024,
                                                  DType::bf16, m != 9));
    cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, m, 72, 768,
                                                  m == 2 ? DType::f16 : DType::bf16, true));
  }
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 1, 264, 5120, DType::bf16, true));
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot_int4, 1, 8, 512, DType::f16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 1, 20000, 512, DType::bf16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 12, 20000, 512, DType::bf16, false));
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 2, 20008, 256, DType::bf16, true));

  // The tiled decode kernel on the layer's decode layout (session 4; 4-bit, K % 128 == 0: every
  // 4-bit case above with M <= 16 takes it too): K % 512 != 0 (where the ring kernel does not
  // apply), a single partial 16-row tile (O 8), O % 16 == 8, items of one tile split over
  // several warps and warps spanning tiles (K 1152 and 1408: 9 and 11 items per tile), many
  // tiles per CTA (O 5000), M 1 / 3 / 8 / 9 / 16 (one and two n8 activation tiles).
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 1, 136, 384, DType::bf16, true));
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot_int4, 9, 8, 3328, DType::f16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 16, 5000, 1408, DType::bf16, false));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_comfy_w4a4, 1, 5000, 768, DType::bf16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_comfy_w4a4, 16, 40, 768, DType::f16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_comfy_w4a4, 3, 1032, 1280, DType::bf16, false));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 8, 1032, 640, DType::f16, true));
  // Session 35, batched decode and chunked prefill: the 4-bit decode GEMVs once per 16 rows
  // (int4 / comfy up to M 64, NVFP4 too; partial last blocks), the int8 GEMM's stream-K
  // configuration (fewer output tiles than SMs: every convrot8 case here, 600 x 520 included),
  // and int4 / comfy past the row blocks (the unpacked weight through the int8 GEMM).
  {
    struct Mid {
      QType q;
      int64_t m, o, k;
      DType act;
      bool bias;
    };
    for (const Mid& c : {Mid{QType::convrot_int4, 33, 1032, 1280, DType::bf16, true},
                         Mid{QType::convrot_comfy_w4a4, 48, 4104, 768, DType::f16, false},
                         Mid{QType::convrot_int4, 64, 520, 5120, DType::bf16, true},
                         Mid{QType::convrot4, 40, 1040, 1280, DType::bf16, true},
                         Mid{QType::convrot8, 64, 1032, 5120, DType::bf16, true},
                         Mid{QType::convrot8, 200, 2056, 2048, DType::bf16, false},
                         Mid{QType::convrot8, 600, 520, 2048, DType::bf16, true},
                         Mid{QType::convrot_int4, 100, 1032, 2048, DType::bf16, true},
                         Mid{QType::convrot_comfy_w4a4, 80, 1040, 1024, DType::bf16, true},
                         Mid{QType::convrot_int4, 520, 1032, 512, DType::f16, false},
                         // Session 36: comfy W4A4 at 32 < M <= 3072 takes CUTLASS's mixed-input
                         // GEMM on the int4 codes (128 x 128 tile; 128 x 256 from 256 rows where
                         // it fills the SMs: M 600 x O 5000), bf16 and f16 output; odd M, N not
                         // a multiple of the tile, K 256 .. 5120, with and without bias; M 3100
                         // keeps the unpacked weight.
                         Mid{QType::convrot_comfy_w4a4, 40, 2056, 1280, DType::bf16, false},
                         Mid{QType::convrot_comfy_w4a4, 65, 1032, 5120, DType::bf16, true},
                         Mid{QType::convrot_comfy_w4a4, 129, 4104, 768, DType::bf16, false},
                         Mid{QType::convrot_comfy_w4a4, 333, 520, 2048, DType::bf16, true},
                         Mid{QType::convrot_comfy_w4a4, 1000, 264, 256, DType::bf16, true},
                         Mid{QType::convrot_comfy_w4a4, 3100, 136, 256, DType::bf16, false},
                         Mid{QType::convrot_comfy_w4a4, 600, 5000, 256, DType::bf16, true},
                         Mid{QType::convrot_comfy_w4a4, 100, 1040, 1024, DType::f16, true},
                         Mid{QType::convrot_comfy_w4a4, 700, 4104, 512, DType::f16, false},
                         // Session 36: convrot8 at 16 < M <= 64 (bf16) with the weight as A.
                         Mid{QType::convrot8, 17, 4104, 768, DType::bf16, true},
                         Mid{QType::convrot8, 40, 520, 2048, DType::bf16, false},
                         Mid{QType::convrot8, 33, 1032, 1024, DType::f16, true},
                         // Session 37: convrotint4 at 16 < M <= 3072 takes the mixed-input GEMM
                         // on its packed codes with the fold tables in the conversion (the
                         // cases above at M 33 / 64 / 100 / 520 too): K 256 .. 5120 (K 384: an
                         // odd number of 128-column groups), N not a multiple of the tile, the
                         // 128 x 256 tile (M 600 x O 5000), f16; M 3100 keeps the unpacked weight.
                         // Up to M 64 both mixed-input GEMMs run the 128 x 64 tile (int4 M 33 /
                         // 40 / 64, comfy M 40 / 48: bf16 and f16), above it 128 x 128 (M 65).
                         Mid{QType::convrot_int4, 17, 1032, 768, DType::bf16, true},
                         Mid{QType::convrot_int4, 31, 2056, 1280, DType::f16, false},
                         Mid{QType::convrot_int4, 40, 4104, 768, DType::f16, true},
                         Mid{QType::convrot_int4, 65, 1032, 5120, DType::bf16, true},
                         Mid{QType::convrot_int4, 129, 2056, 1024, DType::bf16, false},
                         Mid{QType::convrot_int4, 333, 520, 384, DType::bf16, true},
                         Mid{QType::convrot_int4, 600, 5000, 256, DType::bf16, true},
                         Mid{QType::convrot_int4, 1000, 264, 2048, DType::f16, false},
                         Mid{QType::convrot_int4, 3100, 136, 256, DType::bf16, true}})
      cases.push_back(std::make_unique<ForwardCase>(c.q, c.m, c.o, c.k, c.act, c.bias));
  }
  // Session 37: re-quantized layers through the paths that read device-side layouts (the
  // mixed-input GEMMs at M 100, the tiled decode GEMV at M 8).
  for (QType q : {QType::convrot_int4, QType::convrot_comfy_w4a4, QType::convrot4}) {
    cases.push_back(std::make_unique<RequantForwardCase>(q, 100, 1040, 1280, DType::bf16, true));
    cases.push_back(std::make_unique<RequantForwardCase>(q, 8, 528, 1024, DType::f16, false));
  }
#ifdef LOWBIT_WITH_CUDA
  // The tiled kernel's layer paths (DecodeTilesTuning) through the layer. `fused_reg`: the
  // default for M <= 2, one launch per layer, every CTA rotates x (the register rotation; K 8448
  // > 8192 takes the rotate kernel instead). `default`: M 3 / 7 / 9 / 16 (rotate kernel + GEMV,
  // one and two n8 activation tiles) with O = 8 (mod 16): a partial last 16-row tile (the CPU
  // oracle takes O % 8 == 0); 6 ring slots per warp (kTilesDepthDeep) except M 16 at K 8448
  // (int4 and comfy), whose activation rows leave room for 4 only (the 4-slot fallback).
  // `two_kernels` (fuse_max_m 0: the session-6 path for every M, 4 slots at M <= 2).
  {
    namespace cl = cuda::linear;
    auto add = [&](const char* v, const cl::DecodeTilesTuning& t, QType q, int64_t m, int64_t o,
                   int64_t k, DType a, bool bias) {
      cases.push_back(std::make_unique<TunedForwardCase>(v, t, q, m, o, k, a, bias));
    };
    const cl::DecodeTilesTuning def;
    add("fused_reg", def, QType::convrot_int4, 1, 264, 768, DType::bf16, true);
    add("fused_reg", def, QType::convrot_int4, 2, 5000, 1280, DType::f16, false);
    add("fused_reg", def, QType::convrot_comfy_w4a4, 1, 4104, 5120, DType::bf16, true);
    add("fused_reg", def, QType::convrot_comfy_w4a4, 2, 136, 256, DType::f16, true);
    add("fused_reg", def, QType::convrot_int4, 1, 40, 8448, DType::bf16, true);
    add("default", def, QType::convrot_int4, 3, 1032, 1280, DType::bf16, true);
    add("default", def, QType::convrot_comfy_w4a4, 3, 4104, 768, DType::f16, false);
    add("default", def, QType::convrot_int4, 7, 4104, 768, DType::f16, true);
    add("default", def, QType::convrot_comfy_w4a4, 7, 1032, 5120, DType::bf16, true);
    add("default", def, QType::convrot_int4, 9, 2056, 1280, DType::bf16, false);
    add("default", def, QType::convrot_int4, 16, 2056, 1280, DType::bf16, true);
    add("default", def, QType::convrot_comfy_w4a4, 16, 5000, 768, DType::f16, false);
    add("default", def, QType::convrot_int4, 16, 136, 8448, DType::bf16, true);
    add("default", def, QType::convrot_comfy_w4a4, 16, 264, 8448, DType::bf16, true);
    add("default", def, QType::convrot_int4, 5, 1032, 8448, DType::f16, false);
    cl::DecodeTilesTuning two;
    two.fuse_max_m = 0;
    add("two_kernels", two, QType::convrot_int4, 1, 5000, 1280, DType::bf16, true);
    add("two_kernels", two, QType::convrot_comfy_w4a4, 2, 264, 768, DType::f16, false);
    // Session 16 (activation rows as bulk copies, warp-per-row comfy sums, epilogue operands in
    // shared memory): more two-kernel shapes, M 9 / 12 (two n8 tiles, 6 slots) and M 1 (f16).
    add("default", def, QType::convrot_int4, 9, 4104, 5120, DType::bf16, false);
    add("default", def, QType::convrot_comfy_w4a4, 12, 1032, 1280, DType::bf16, true);
    add("two_kernels", two, QType::convrot_comfy_w4a4, 1, 1032, 768, DType::f16, false);
    // Session 17: convrotfp8 decode on the ring GEMV (K % 256 == 0; fp32 sums: the fp8
    // tolerance): one n8 activation tile (M 1 / 3 / 8, the default up to 8) and two (M 9 / 16,
    // fp8_ring_max_m 16 forced), CTA row ranges that end inside a tile (O 1000 / 4104 over the
    // SMs), f16 and bf16, K of 1 to 20 slices; then the same layer through cuBLASLt
    // (fp8_ring_max_m 0), and K % 256 != 0 (the cuBLASLt fallback).
    add("fp8_ring", def, QType::convrot_fp8, 1, 264, 1280, DType::bf16, true);
    add("fp8_ring", def, QType::convrot_fp8, 1, 4104, 5120, DType::bf16, true);
    add("fp8_ring", def, QType::convrot_fp8, 3, 1000, 512, DType::f16, false);
    add("fp8_ring", def, QType::convrot_fp8, 8, 136, 256, DType::bf16, true);
    cl::DecodeTilesTuning r16;
    r16.fp8_ring_max_m = 16;
    add("fp8_ring16", r16, QType::convrot_fp8, 9, 264, 768, DType::bf16, false);
    add("fp8_ring16", r16, QType::convrot_fp8, 16, 4104, 5120, DType::bf16, true);
    add("fp8_ring16", r16, QType::convrot_fp8, 16, 1000, 1280, DType::f16, true);
    cl::DecodeTilesTuning lt;
    lt.fp8_ring_max_m = 0;
    add("fp8_cublaslt", lt, QType::convrot_fp8, 1, 264, 1280, DType::bf16, true);
    add("fp8_cublaslt", lt, QType::convrot_fp8, 16, 1000, 1280, DType::f16, true);
    add("fp8_ring", def, QType::convrot_fp8, 5, 264, 320, DType::bf16, true);
    // Session 34: the ring's K split (a CTA with at most half as many tiles as warps splits each
    // tile's slices over several warps, whose sums meet in shared memory): 5 tiles of 8 rows
    // over 16 warps (3 parts, 8 slices split 2 / 3 / 3) in the dp4a form (M 1) and the mma form
    // (M 6); 3 tiles of 16 rows over 8 warps (2 parts) at M 12 (int8) and M 16 (fp8); one tile
    // per CTA at K 13824 (16 parts of 54 slices; fp8 sums added per item: the tensor cores'
    // own chains were 1.4 % off there). Then fp8's activation windows, where M rows of K codes
    // do not fit beside the ring (K 13824 at M 16 / 12; O 1000: one tile per CTA in 8 parts;
    // O 5120: 3 tiles, 2 parts; the down projection 16 x 13824 -> 5120, where cuBLASLt offers
    // no algorithm), and the integer formats there (`large_k`: the streaming kernel, the tiled
    // kernel's and the ring's rows do not fit).
    add("ring_split", def, QType::convrot8, 1, 5000, 2048, DType::bf16, true);
    add("ring_split", def, QType::convrot8, 6, 5000, 2048, DType::f16, false);
    add("ring_split", def, QType::convrot8, 12, 5000, 2048, DType::bf16, true);
    add("ring_split", r16, QType::convrot_fp8, 16, 5000, 2048, DType::bf16, true);
    add("ring_split", def, QType::convrot_fp8, 8, 5000, 2048, DType::f16, true);
    add("ring_split", def, QType::convrot_fp8, 8, 1000, 13824, DType::bf16, false);
    add("ring_windows", def, QType::convrot_fp8, 16, 5120, 13824, DType::bf16, true);
    add("ring_windows", r16, QType::convrot_fp8, 12, 1000, 13824, DType::f16, false);
    add("large_k", def, QType::convrot8, 16, 1000, 13824, DType::bf16, true);
    add("large_k", def, QType::convrot8, 12, 5120, 14336, DType::f16, false);
    add("large_k", def, QType::convrot_int4, 16, 1000, 13824, DType::bf16, true);
    add("large_k", def, QType::convrot_comfy_w4a4, 16, 600, 14336, DType::bf16, false);
    // Session 17: NVFP4 (convrot4) prefill on sm_90 through cuBLASLt's f16 GEMM (the default;
    // alpha = the tensor scale from the device, BIAS epilogue) and through the mma.sync kernel
    // (nvfp4_cublaslt off); on sm_100 both run the fp4 tensor cores.
    // Session 37: the mixed-input GEMM on the e2m1 codes is the default past the GEMVs, so
    // these run with nvfp4_mixed_max_m 0; the mixed GEMM's own cases follow.
    cl::DecodeTilesTuning dqlt;
    dqlt.nvfp4_mixed_max_m = 0;
    add("nvfp4_lt", dqlt, QType::convrot4, 300, 272, 1280, DType::bf16, true);
    add("nvfp4_lt", dqlt, QType::convrot4, 33, 144, 512, DType::f16, false);
    add("nvfp4_lt", dqlt, QType::convrot4, 17, 1008, 256, DType::bf16, true);
    cl::DecodeTilesTuning mma = dqlt;
    mma.nvfp4_cublaslt = false;
    add("nvfp4_mma", mma, QType::convrot4, 300, 272, 1280, DType::bf16, true);
    add("nvfp4_mma", mma, QType::convrot4, 33, 144, 512, DType::f16, false);
    // Session 17: the NVFP4 decode GEMV on the packed weight (M <= 16, K % 64 == 0): one and two
    // n8 token tiles (M 1 / 3 / 8 and 9 / 16), K of 1 to 80 64-column steps split over 4 warps
    // (1 step: three warps idle; 5 and 7: uneven), f16 and bf16; then the prefill path at M 3
    // (nvfp4_gemv_max_m 0) and at K % 64 != 0 (the GEMV's fallback).
    // Session 19: the same shapes with the codes by the 16-entry lookup (nvfp4_gemv_cvt off; the
    // default converts them through e4m3 and reads x16 permuted); K 16448 (> 16384: the rotate
    // kernel without registers writes no x16 itself, dequant_nvfp4_16 does inside
    // rotate_quantize, and the layer keeps the lookup form in either case).
    struct GemvShape {
      int64_t m, o, k;
      DType a;
      bool bias;
    };
    const GemvShape gemv_shapes[] = {
        {1, 272, 1280, DType::bf16, true}, {1, 4112, 5120, DType::bf16, true},
        {3, 144, 320, DType::f16, false},  {8, 1008, 448, DType::bf16, true},
        {9, 272, 64, DType::f16, true},    {16, 1008, 5120, DType::bf16, false},
        {16, 144, 1024, DType::f16, true}, {2, 144, 96, DType::bf16, true},
        {2, 48, 16448, DType::bf16, true}};
    cl::DecodeTilesTuning lut;
    lut.nvfp4_gemv_cvt = false;
    // Session 20: one and two 16-row weight tiles per CTA (nvfp4_gemv_tiles16 / tiles8; the
    // default: two at M > 8, one at M <= 8), the other count on each shape (N = 144, 272 and
    // 1008: a last CTA with one tile past N).
    cl::DecodeTilesTuning tt;
    tt.nvfp4_gemv_tiles16 = 1;
    tt.nvfp4_gemv_tiles8 = 2;
    for (const GemvShape& g : gemv_shapes) {
      add("nvfp4_gemv", def, QType::convrot4, g.m, g.o, g.k, g.a, g.bias);
      add("nvfp4_lut", lut, QType::convrot4, g.m, g.o, g.k, g.a, g.bias);
      add("nvfp4_tiles", tt, QType::convrot4, g.m, g.o, g.k, g.a, g.bias);
    }
    cl::DecodeTilesTuning nog;
    nog.nvfp4_gemv_max_m = 0;
    add("nvfp4_nogemv", nog, QType::convrot4, 3, 272, 1280, DType::bf16, true);
    // The register ring (nvfp4_gemv_slots 0, session 17's kernel) at depth 1 and 4; the cp.async
    // ring (the default above: 4 slots, activations loaded at the step, x16 written by the rotate
    // kernel) at 2 slots, with the next step's activations loaded ahead, with dequant_nvfp4_16
    // after the rotate kernel.
    cl::DecodeTilesTuning g1;
    g1.nvfp4_gemv_slots = 0;
    g1.nvfp4_gemv_depth = 1;
    add("nvfp4_gemv1", g1, QType::convrot4, 1, 272, 1280, DType::bf16, true);
    add("nvfp4_gemv1", g1, QType::convrot4, 16, 144, 1024, DType::f16, true);
    cl::DecodeTilesTuning g4;
    g4.nvfp4_gemv_slots = 0;
    g4.nvfp4_gemv_depth = 4;
    add("nvfp4_gemv4", g4, QType::convrot4, 1, 4112, 5120, DType::bf16, true);
    add("nvfp4_gemv4", g4, QType::convrot4, 16, 144, 1024, DType::f16, false);
    cl::DecodeTilesTuning s2;
    s2.nvfp4_gemv_slots = 2;
    add("nvfp4_slots2", s2, QType::convrot4, 1, 272, 1280, DType::bf16, true);
    add("nvfp4_slots2", s2, QType::convrot4, 8, 1008, 448, DType::bf16, true);
    add("nvfp4_slots2", s2, QType::convrot4, 16, 1008, 5120, DType::f16, false);
    cl::DecodeTilesTuning xs;
    xs.nvfp4_gemv_x_ahead = true;
    add("nvfp4_xahead", xs, QType::convrot4, 1, 272, 64, DType::bf16, true);
    add("nvfp4_xahead", xs, QType::convrot4, 9, 1008, 448, DType::f16, true);
    // Session 37: the mixed-input GEMM (past the GEMV per 16 rows: M > 64; from M 17 with
    // nvfp4_row_block_max_m 0): the 128 x 64 tile (M <= 64), 128 x 128, 128 x 256 (M 600 x O
    // 5008), f16 and bf16 output, odd M, N not a multiple of the tile, K 64 .. 5120 (one K tile
    // to many), with and without bias; K % 64 != 0 keeps the dequantized path (K 1040).
    cl::DecodeTilesTuning mx;
    mx.nvfp4_row_block_max_m = 0;
    add("nvfp4_mixed", mx, QType::convrot4, 17, 1008, 256, DType::bf16, true);
    add("nvfp4_mixed", mx, QType::convrot4, 40, 144, 5120, DType::f16, false);
    add("nvfp4_mixed", def, QType::convrot4, 65, 2064, 1280, DType::bf16, true);
    add("nvfp4_mixed", def, QType::convrot4, 129, 272, 64, DType::f16, true);
    add("nvfp4_mixed", def, QType::convrot4, 333, 4112, 768, DType::bf16, false);
    add("nvfp4_mixed", def, QType::convrot4, 600, 5008, 256, DType::bf16, true);
    add("nvfp4_mixed", def, QType::convrot4, 100, 528, 1040, DType::bf16, true);
    cl::DecodeTilesTuning dq;
    dq.nvfp4_x16_rotate = false;
    add("nvfp4_x16kernel", dq, QType::convrot4, 3, 144, 320, DType::bf16, true);
    add("nvfp4_x16kernel", dq, QType::convrot4, 16, 272, 1280, DType::f16, false);
    // Session 17: the multicast activation copy (DecodeTilesTuning::act_mcast 2 / 4, 4 the
    // default; 0 the plain copy; rotate kernel + GEMV, 8 < M <= 16): CTA rank r copies rows r,
    // r + CL, ... into every CTA of its cluster (the `default` cases at M > 8 run clusters of 4).
    // M 16 / 12 / 9 / 13 (rows per rank uneven), f16 and bf16 x, K 5120 / 4096 / 1280 / 768; M 7
    // takes the plain copy. And the epilogue's column-per-thread mapping: more than 32 tiles per
    // CTA (O 70008 on 132 SMs: 33-34 tiles) takes the flat loop.
    for (const int c : {0, 2, 4}) {
      cl::DecodeTilesTuning t;
      t.act_mcast = c;
      const char* v = c == 0 ? "plain_copy" : (c == 2 ? "mcast2" : "mcast4");
      add(v, t, QType::convrot_int4, 16, 4104, 5120, DType::bf16, true);
      add(v, t, QType::convrot_comfy_w4a4, 12, 1032, 4096, DType::bf16, true);
      add(v, t, QType::convrot_int4, 9, 2056, 1280, DType::f16, false);
      add(v, t, QType::convrot_comfy_w4a4, 13, 5000, 768, DType::f16, true);
      add(v, t, QType::convrot_int4, 7, 1032, 1280, DType::bf16, true);
    }
    add("default", def, QType::convrot_int4, 3, 70008, 128, DType::bf16, true);
    add("default", def, QType::convrot_comfy_w4a4, 16, 70008, 256, DType::bf16, false);
  }
#endif

  // The sm_90a CUTLASS int8 GEMM (128 x 256 x 128 tiles, 2 x 1 clusters): odd M over several
  // CTA rows and an odd number of them, O over partial 256-column tiles, K with a partial 128-byte
  // K tile (TMA zero fill), bf16 and f16 outputs, bf16/f16 bias (converted to fp32 first) and no
  // bias (-0.0 added); packed weights (unpacked to int8 first) take the same GEMM.
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 257, 520, 272, DType::bf16, true));
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 333, 264, 1280, DType::f16, true));
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 401, 136, 64, DType::bf16, false));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot_int4, 201, 392, 384, DType::bf16, true));
  // M >= 512: the 256 x 128 cluster 1 x 2 configuration (odd M: 3 and 4 row tiles, the last
  // partial; f16 out with bias, bf16 out without).
  cases.push_back(std::make_unique<ForwardCase>(QType::convrot8, 521, 136, 272, DType::f16, true));
  cases.push_back(
      std::make_unique<ForwardCase>(QType::convrot8, 777, 264, 128, DType::bf16, false));

  for (QType q : {QType::convrot8, QType::convrot_int3, QType::convrot_fp8, QType::convrot4}) {
    // backward_input: fp32 accumulation on both sides (cuBLASLt fp32 vs the CPU's loop).
    cases.push_back(std::make_unique<BackwardInputCase>(BackwardInputSpec{
        std::string("linear.gpu.backward_input.") + qtype_name(q) + ".M17.O48.K192", q, 17, 48, 192,
        DType::bf16, DType::f32, 0.f, Tolerance::allclose(1e-4, 1e-4)}));
    // Rotated basis (unpack + scale) and original basis (plus the rotation, same butterfly
    // order): both bit-exact.
    cases.push_back(gpu_dequantize_case(q, 48, 192, true));
    cases.push_back(gpu_dequantize_case(q, 48, 192, false));
  }
  cases.push_back(gpu_dequantize_case(QType::convrot_bitnet, 40, 80, true));
  cases.push_back(gpu_dequantize_case(QType::convrot_comfy_w4a4, 40, 256, true));
  cases.push_back(std::make_unique<RequantizeCase>(40, 192, false));
  cases.push_back(std::make_unique<RequantizeCase>(40, 192, true));
}

}  // namespace
}  // namespace harness
}  // namespace lowbit
