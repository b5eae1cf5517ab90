// ConvRot rows of `lowbit bench` (SPEC §3.5): the full quantized layer (rotate + quantize + GEMM +
// epilogue) against cuBLASLt's bf16 GEMM with bias at the same shape in the same run, and the
// standalone rotation against a copy of the same bytes.
//
// Timing layers hold random packed codes (the kernels' speed does not depend on code values, and
// quantizing a 13824 x 5120 weight with the MSE searches on the host would dominate the run). The
// accuracy column comes from a real quantization of a 256-row slice of a N(0, 1/K) weight at the
// same K, 8 input rows, against the fp32-exact (fp64-computed) unquantized layer.
#include <cmath>
#include <functional>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "lowbit/linear.h"
#include "lowbit/runtime.h"
#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime.h>

#include "src/cuda/linear_decode_ring.cuh"
#include "src/cuda/linear_decode_tiles.cuh"
#include "src/cuda/linear_kernels.cuh"
#endif

namespace lowbit {
namespace bench {
namespace {

std::string shape_str(int64_t m, int64_t k, int64_t n, DType dt = DType::bf16) {
  return std::to_string(m) + "x" + std::to_string(k) + "->" + std::to_string(n) + " " +
         dtype_name(dt);
}

// A packed weight of (q, O, K) with random codes and benign scales (timing only).
PackedWeight random_packed(QType q, int64_t o, int64_t k, uint64_t seed) {
  PackedWeight w = make_packed_weight(q, o, k);
  std::mt19937_64 rng(seed);
  for (auto& b : w.codes) b = static_cast<uint8_t>(rng());
  if (q == QType::convrot_fp8)  // keep e4m3 codes finite (0x7f / 0xff are NaN)
    for (auto& b : w.codes)
      if ((b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b & 0xfe);
  if (q == QType::convrot_int4)  // codes the quantizer can give: u = c + 7 <= 14, never 15
    for (auto& b : w.codes) b = static_cast<uint8_t>((b & 15) % 15 | ((b >> 4) % 15) << 4);
  auto fill_f32 = [](std::vector<uint8_t>& bytes, float v) {
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) std::memcpy(&bytes[i], &v, 4);
  };
  fill_f32(w.scales, 0.01f);
  fill_f32(w.ratios, 1.f);
  fill_f32(w.tensor_scale, 1.f);
  for (auto& b : w.block_scales) b = 0x38;  // e4m3 1.0
  for (auto& b : w.block_scales_swizzled) b = 0x38;
  return w;
}

// Output relative error of the quantized layer vs the unquantized one: a real quantization of a
// (256, K) slice, 8 rows of N(0, 1) input, reference in fp64 from the bf16-rounded input.
// m: 8 (the decode kernels) or 32 (the prefill GEMM).
std::string layer_accuracy(QType q, int64_t k, const Env& env, int64_t m = 8) {
  const int64_t o = 256;
  DeviceTensor w = make_tensor(Device::cpu, DType::f32, {o, k}, 11, 1.f / std::sqrt(float(k)));
  DeviceTensor x = make_tensor(env.device, DType::bf16, {m, k}, 12);
  DeviceTensor out = make_empty(env.device, DType::bf16, {m, o});
  Context ctx = env.ctx;
  PackedWeight pw = quantize_weight(w.view, q, ctx);
  QuantizedLinear layer = QuantizedLinear::from_packed(pw, env.device, ctx);
  layer.forward(x.view, nullptr, out.view, ctx);
  synchronize(ctx);
  std::vector<float> xs = to_host_f32(x.view), ws = to_host_f32(w.view), got = to_host_f32(out.view);
  std::vector<double> ref(static_cast<size_t>(m * o));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < o; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += double(xs[i * k + c]) * double(ws[j * k + c]);
      ref[i * o + j] = s;
    }
  return accuracy(got, ref).str();
}

// "NN% of copy bandwidth": the row's bytes at its time against the copy of the same bytes.
std::string copy_share(const Row& r) {
  if (!(r.ms > 0) || !(r.baseline_ms > 0)) return "";
  return std::to_string(static_cast<int>(std::lround(100.0 * r.baseline_ms / r.ms))) +
         "% of copy bandwidth";
}

// linear.layer: the shapes, each qtype's default path and its A/B rows;
// linear.layer.variants (session 34, CUDA only): shapes outside the issue's, default paths only:
// the down projection of the same MLP (K 13824 -> 5120: at M 16 the activation codes alone are
// 216 KB) and a Llama-3-8B MLP (4096 -> 14336 -> 4096).
struct LayerShape {
  int64_t m, k, n;
  const char* tag;
  DType dt = DType::bf16;  // x, bias and the output (session 60: f16 rows)
};

class LayerBench : public BenchCase {
 public:
  LayerBench() = default;
  // midm_rows: the session-35 A/B rows of the 16 < M paths (other_path's `midm` rows).
  LayerBench(std::string name, std::vector<LayerShape> cuda_shapes, bool midm_rows = false)
      : name_(std::move(name)),
        variants_(std::move(cuda_shapes)),
        alts_(false),
        midm_rows_(midm_rows) {}
  std::string name() const override { return name_; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    using Shape = LayerShape;
    std::vector<Shape> shapes;
    if (!alts_) {
      if (env.device == Device::cuda && !env.quick) shapes = variants_;
    } else if (env.device == Device::cuda) {
      shapes = {{32768, 5120, 5120, "Wan"},
                {4096, 3072, 12288, "Flux MLP"},
                {16, 5120, 13824, "decode"},
                {8, 5120, 13824, "decode"},
                {1, 5120, 13824, "decode"}};
      if (env.quick) shapes = {{1024, 1024, 1024, "quick"}, {1, 1024, 1024, "quick"}};
    } else {
      shapes = {{16, 256, 256, "cpu tiny"}};
    }
    for (const Shape& s : shapes) {
      if (!env.shape_selected(shape_str(s.m, s.k, s.n, s.dt))) continue;
      const bool decode = s.m <= 16;
      std::vector<QType> qtypes;
      if (decode)
        qtypes = {QType::convrot8, QType::convrot_int4, QType::convrot_comfy_w4a4,
                  QType::convrot_fp8, QType::convrot4};
      else
        qtypes = {QType::convrot8, QType::convrot_fp8, QType::convrot_int4, QType::convrot4};
      if (!decode && midm_rows_) qtypes.push_back(QType::convrot_comfy_w4a4);
      const double base = env.bf16_gemm_ms(s.m, s.n, s.k, true);
      DeviceTensor x = make_tensor(env.device, s.dt, {s.m, s.k}, 21);
      DeviceTensor bias = make_tensor(env.device, s.dt, {s.n}, 22);
      DeviceTensor out = make_empty(env.device, s.dt, {s.m, s.n});
      for (QType q : qtypes) {
        if (q == QType::convrot_comfy_w4a4 && s.k % 256) continue;
        Context ctx = env.ctx;
        Row r;
        r.family = "linear";
        r.op = std::string("QuantizedLinear::forward ") + qtype_name(q) + " (" + s.tag + ")";
        r.shape = shape_str(s.m, s.k, s.n, s.dt);
        r.backend = device_name(env.device);
        r.baseline = "cuBLASLt bf16 GEMM + bias";
        r.baseline_ms = base;
        r.flops = 2.0 * s.m * s.n * s.k;
        std::vector<Row> alts;  // the same layer through other paths (A/B rows)
        try {
          QuantizedLinear layer =
              QuantizedLinear::from_packed(random_packed(q, s.n, s.k, 31), env.device, ctx);
          r.bytes = 2.0 * s.m * s.k + 2.0 * s.m * s.n +
                    static_cast<double>(layer.weights().codes.numel()) * qtype_bits(q) / 8;
          r.ms = env.time_ms([&] { layer.forward(x.view, &bias.view, out.view, ctx); });
          r.accuracy = layer_accuracy(q, s.k, env, decode ? 8 : 32);
          // The same layer through another path (`enter` switches to it, `leave` restores the
          // default, also on a throw): its time, its accuracy at acc_m rows (0: none), and how
          // far the default's output is from it; rows after the default's.
          std::vector<float> first;  // the default's output, read before the first other path
          auto other_path = [&](const std::string& what, const std::function<void()>& enter,
                                const std::function<void()>& leave, int64_t acc_m,
                                bool midm = false) {
            if (!(alts_ || (midm && midm_rows_))) return;
            if (first.empty()) first = to_host_f32(out.view);
            struct Leave {
              const std::function<void()>& f;
              ~Leave() { f(); }
            } restore{leave};
            enter();
            Row f = r;
            f.op += ", " + what;
            f.ms = env.time_ms([&] { layer.forward(x.view, &bias.view, out.view, ctx); });
            const std::vector<float> other = to_host_f32(out.view);
            f.accuracy = (acc_m ? layer_accuracy(q, s.k, env, acc_m) + "; " : std::string()) +
                         "the default's output vs this: " +
                         accuracy(first, std::vector<double>(other.begin(), other.end())).str();
            alts.push_back(f);
          };
#ifdef LOWBIT_WITH_CUDA
          namespace cl = cuda::linear;
          auto layer_tuning = [](cl::DecodeTilesTuning t) {
            return [t] { cl::set_layer_tiles_tuning(&t); };
          };
          const std::function<void()> default_tuning = [] { cl::set_layer_tiles_tuning(nullptr); };
          if (q == QType::convrot_fp8 && decode && env.device == Device::cuda) {
            // Session 17: the ring GEMV on the e4m3 codes (the default up to M 8) against the
            // other path (cuBLASLt's fp8 GEMM below M 9, the ring above); accuracy at M 8.
            const bool ring_default = s.m <= cl::DecodeTilesTuning{}.fp8_ring_max_m;
            cl::DecodeTilesTuning t;
            t.fp8_ring_max_m = ring_default ? 0 : 16;
            other_path(ring_default ? "cuBLASLt fp8 GEMM (fp8_ring_max_m 0: the path before)"
                                    : "ring GEMV (fp8_ring_max_m 16)",
                       layer_tuning(t), default_tuning, 8);
          }
          if (q == QType::convrot4 && decode && env.device == Device::cuda) {
            // Session 17: the NVFP4 decode GEMV on the packed weight (the default up to M 16)
            // against the prefill path (the whole weight dequantized per call).
            cl::DecodeTilesTuning t;
            t.nvfp4_gemv_max_m = 0;
            other_path("dequantize + cuBLASLt (nvfp4_gemv_max_m 0: the path before)",
                       layer_tuning(t), default_tuning, 8);
            // Session 19: the cp.async ring's alternatives (the default: 4 slots, the
            // activations loaded at the step, x16 from the rotate kernel, codes through e4m3).
            auto variant = [&](const std::string& what, void (*set)(cl::DecodeTilesTuning&)) {
              cl::DecodeTilesTuning d;
              set(d);
              other_path(what, layer_tuning(d), default_tuning, 0);
            };
            variant("GEMV, cp.async ring of 2 slots per warp (nvfp4_gemv_slots 2)",
                    [](cl::DecodeTilesTuning& d) { d.nvfp4_gemv_slots = 2; });
            variant("GEMV, next step's activations loaded ahead (nvfp4_gemv_x_ahead on)",
                    [](cl::DecodeTilesTuning& d) { d.nvfp4_gemv_x_ahead = true; });
            variant("GEMV, one 16-row tile per CTA at M > 8 (nvfp4_gemv_tiles16 1: before "
                    "session 20)",
                    [](cl::DecodeTilesTuning& d) { d.nvfp4_gemv_tiles16 = 1; });
            variant("GEMV, two 16-row tiles per CTA at M <= 8 (nvfp4_gemv_tiles8 2)",
                    [](cl::DecodeTilesTuning& d) { d.nvfp4_gemv_tiles8 = 2; });
            variant("GEMV, codes by the 16-entry lookup (nvfp4_gemv_cvt off)",
                    [](cl::DecodeTilesTuning& d) { d.nvfp4_gemv_cvt = false; });
            variant("GEMV, dequant_nvfp4_16 after the rotate kernel (nvfp4_x16_rotate off)",
                    [](cl::DecodeTilesTuning& d) { d.nvfp4_x16_rotate = false; });
            for (int depth : {1, 4}) {
              cl::DecodeTilesTuning d;
              d.nvfp4_gemv_slots = 0;
              d.nvfp4_gemv_depth = depth;
              other_path("GEMV, " + std::to_string(depth) + " step(s) in flight (nvfp4_gemv_depth " +
                             std::to_string(depth) + ")",
                         layer_tuning(d), default_tuning, 0);
            }
          }
          if (!decode && env.device == Device::cuda) {
            // Session 35: each 16 < M path of the 4-bit qtypes against the next one.
            const cl::DecodeTilesTuning def;
            cl::DecodeTilesTuning t;
            std::string what;
            // Session 37: the mixed-input GEMMs' 128 x 64 tile off where it runs by default, on
            // for the next rows.
            auto small_tile_row = [&] {
              cl::DecodeTilesTuning n;
              const bool on = s.m <= def.mixed_small_max_m;
              n.mixed_small_max_m = on ? 0 : 2 * def.mixed_small_max_m;
              other_path(on ? "mixed-input GEMM without the 128 x 64 tile (mixed_small_max_m 0)"
                            : "mixed-input GEMM, 128 x 64 tile (mixed_small_max_m " +
                                  std::to_string(n.mixed_small_max_m) + ")",
                         layer_tuning(n), default_tuning, 0, true);
            };
            if (q == QType::convrot4) {
              // Session 37: the mixed-input GEMM on the e2m1 codes against the paths before.
              if (s.m <= def.nvfp4_row_block_max_m) {
                t.nvfp4_row_block_max_m = 0;
                what = "mixed-input GEMM on the e2m1 codes (nvfp4_row_block_max_m 0)";
              } else {
                t.nvfp4_mixed_max_m = 0;
                what = "dequantize + cuBLASLt (nvfp4_mixed_max_m 0: the path before)";
                if (s.m <= 2 * def.mixed_small_max_m) small_tile_row();
                cl::DecodeTilesTuning n;
                const bool wide = s.m >= def.nvfp4_mixed_wide_min_m;
                n.nvfp4_mixed_wide_min_m = wide ? 0 : 1;
                if (s.m > def.mixed_small_max_m)
                  other_path(wide ? "mixed-input GEMM, 128 x 128 tile (nvfp4_mixed_wide_min_m 0)"
                                  : "mixed-input GEMM, 128 x 256 tile (nvfp4_mixed_wide_min_m 1)",
                             layer_tuning(n), default_tuning, 0, true);
              }
            } else if (q == QType::convrot8 && s.m <= def.int8_weight_a_max_m) {
              t.int8_weight_a_max_m = 0;
              what = "int8 GEMM, activations as A (int8_weight_a_max_m 0: the path before)";
            } else if (q == QType::convrot8 && s.m <= 4 * def.int8_weight_a_max_m) {
              t.int8_weight_a_max_m = 4 * def.int8_weight_a_max_m;
              what = "int8 GEMM, weight as A (int8_weight_a_max_m " +
                     std::to_string(t.int8_weight_a_max_m) + ")";
            } else if (q == QType::convrot_comfy_w4a4) {
              // Session 36: CUTLASS's mixed-input GEMM on the int4 codes against the next path.
              if (s.m <= def.comfy_row_block_max_m) {
                t.comfy_row_block_max_m = 0;
                what = "mixed-input GEMM on the int4 codes (comfy_row_block_max_m 0)";
              } else if (s.m <= def.comfy_mixed_max_m) {
                t.comfy_mixed_max_m = 0;
                what = s.m <= def.row_block_max_m
                           ? "tiled GEMV per 16 rows (comfy_mixed_max_m 0: the path before)"
                           : "unpacked weight + int8 GEMM (comfy_mixed_max_m 0: the path before)";
              } else {
                t.comfy_mixed_max_m = 1 << 30;
                what = "mixed-input GEMM on the int4 codes (comfy_mixed_max_m unbounded)";
              }
              if (s.m > def.comfy_row_block_max_m && s.m <= 2 * def.mixed_small_max_m)
                small_tile_row();
              if (s.m > def.row_block_max_m && s.m < def.comfy_mixed_wide_min_m) {
                cl::DecodeTilesTuning n;
                n.comfy_mixed_wide_min_m = 1;
                other_path("mixed-input GEMM, 128 x 256 tile (comfy_mixed_wide_min_m 1)",
                           layer_tuning(n), default_tuning, 0, true);
              }
              if (s.m >= def.comfy_mixed_wide_min_m && def.comfy_mixed_wide_min_m > 0) {
                cl::DecodeTilesTuning n;
                n.comfy_mixed_max_m = 1 << 30;
                n.comfy_mixed_wide_min_m = 0;
                other_path("mixed-input GEMM, 128 x 128 tile (comfy_mixed_wide_min_m 0)",
                           layer_tuning(n), default_tuning, 0, true);
              }
            } else if (q == QType::convrot_int4) {
              // Session 37: the mixed-input GEMM with the fold tables against the next path.
              if (s.m <= def.int4_row_block_max_m) {
                t.int4_row_block_max_m = 0;
                what = "mixed-input GEMM, fold tables (int4_row_block_max_m 0)";
              } else if (s.m <= def.int4_mixed_max_m) {
                t.int4_mixed_max_m = 0;
                what = s.m <= def.row_block_max_m
                           ? "tiled GEMV per 16 rows (int4_mixed_max_m 0: the path before)"
                           : "unpacked weight + int8 GEMM (int4_mixed_max_m 0: the path before)";
              } else {
                t.int4_mixed_max_m = 1 << 30;
                what = "mixed-input GEMM, fold tables (int4_mixed_max_m unbounded)";
              }
              if (s.m > def.int4_row_block_max_m && s.m <= 2 * def.mixed_small_max_m)
                small_tile_row();
              if (s.m > def.int4_row_block_max_m && s.m < def.int4_mixed_wide_min_m) {
                cl::DecodeTilesTuning n;
                n.int4_mixed_wide_min_m = 1;
                other_path("mixed-input GEMM, fold tables, 128 x 256 tile (int4_mixed_wide_min_m 1)",
                           layer_tuning(n), default_tuning, 0, true);
              }
              if (s.m >= def.int4_mixed_wide_min_m && def.int4_mixed_wide_min_m > 0) {
                cl::DecodeTilesTuning n;
                n.int4_mixed_max_m = 1 << 30;
                n.int4_mixed_wide_min_m = 0;
                other_path("mixed-input GEMM, fold tables, 128 x 128 tile (int4_mixed_wide_min_m 0)",
                           layer_tuning(n), default_tuning, 0, true);
              }
            }
            if (!what.empty()) other_path(what, layer_tuning(t), default_tuning, 0, true);
          }
          if (q == QType::convrot4 && !decode && env.device == Device::cuda) {
            // Session 17: NVFP4 on sm_90 through cuBLASLt's 16-bit GEMM (the default) against
            // the mma.sync f16 kernel (the path before) on the same dequantized operands.
            cl::DecodeTilesTuning t;
            t.nvfp4_cublaslt = false;
            other_path("mma.sync f16 GEMM (nvfp4_cublaslt off: the path before)", layer_tuning(t),
                       default_tuning, 0);
          }
#endif
          if (q == QType::convrot_fp8 && !decode && env.device == Device::cuda)
            // cuBLASLt's full-precision accumulation (the default is fast accumulation).
            other_path(
                "full fp32 accumulation", [&] { layer.set_fp8_fast_accumulation(false); },
                [&] { layer.set_fp8_fast_accumulation(true); }, 0);
        } catch (const std::exception& e) {
          r.note = std::string("failed: ") + e.what();
        }
        rows.push_back(r);
        rows.insert(rows.end(), alts.begin(), alts.end());
      }
    }
    return rows;
  }

 private:
  std::string name_ = "linear.layer";
  std::vector<LayerShape> variants_;
  bool midm_rows_ = false;
  bool alts_ = true;  // the A/B rows (linear.layer only)
};

class RotateBench : public BenchCase {
 public:
  std::string name() const override { return "linear.rotate"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    const int64_t m = env.device == Device::cuda ? (env.quick ? 4096 : 32768) : 64;
    for (int64_t k : {int64_t{5120}, int64_t{3072}}) {
      DeviceTensor x = make_tensor(env.device, DType::bf16, {m, k}, 41);
      DeviceTensor y = make_empty(env.device, DType::bf16, {m, k});
      DeviceTensor scales = make_empty(env.device, DType::f32, {m});
      Context ctx = env.ctx;
      const int rot = rotation_block(k);
      Row r;
      r.family = "linear";
      r.op = "hadamard_rotate (rot " + std::to_string(rot) + ")";
      r.shape = "(" + std::to_string(m) + ", " + std::to_string(k) + ") bf16 -> bf16";
      r.backend = device_name(env.device);
      r.bytes = 4.0 * m * k;
      r.baseline = "copy";
      r.baseline_ms = env.copy_ms(2.0 * m * k);
      try {
        r.ms = env.time_ms([&] { hadamard_rotate(x.view, rot, y.view, ctx); });
        r.note = copy_share(r);
      } catch (const std::exception& e) {
        r.note = std::string("failed: ") + e.what();
        rows.push_back(r);
        continue;
      }
      {  // accuracy: rotating twice is the identity (R is its own inverse), in fp32
        DeviceTensor xf = make_tensor(env.device, DType::f32, {8, k}, 42);
        DeviceTensor t = make_empty(env.device, DType::f32, {8, k});
        DeviceTensor back = make_empty(env.device, DType::f32, {8, k});
        hadamard_rotate(xf.view, rot, t.view, ctx);
        hadamard_rotate(t.view, rot, back.view, ctx);
        synchronize(ctx);
        std::vector<float> a = to_host_f32(xf.view), b = to_host_f32(back.view);
        r.accuracy = "R·R = I: " + accuracy(b, std::vector<double>(a.begin(), a.end())).str();
      }
      rows.push_back(r);

      for (QType qt : {QType::convrot8, QType::convrot_fp8, QType::convrot_comfy_w4a4}) {
        if (qt == QType::convrot_comfy_w4a4 && rot != 256) continue;
        Row q = r;
        q.op = std::string("rotate_quantize_activations ") + qtype_name(qt) + " (rot " +
               std::to_string(rot) + ")";
        q.shape = "(" + std::to_string(m) + ", " + std::to_string(k) + ") bf16 -> " +
                  (qt == QType::convrot_fp8 ? "e4m3" : "int8");
        q.bytes = 3.0 * m * k + 4.0 * m;
        q.baseline_ms = env.copy_ms(1.5 * m * k);
        q.accuracy = "";
        DeviceTensor c = make_empty(env.device, qt == QType::convrot_fp8 ? DType::e4m3 : DType::i8,
                                    {m, k});
        try {
          q.ms = env.time_ms(
              [&] { rotate_quantize_activations(x.view, qt, rot, c.view, scales.view, ctx); });
          q.note = copy_share(q);
        } catch (const std::exception& e) {
          q.note = std::string("failed: ") + e.what();
        }
        rows.push_back(q);
      }
    }
    return rows;
  }
};

#ifdef LOWBIT_WITH_CUDA
// Decode (M <= 16) kernel A/B at the decode rows' shape, CUDA only: each row is what
// QuantizedLinear::forward launches for one choice of kernels (x bf16 in, bf16 out with bias,
// random codes on the device), against cuBLASLt bf16 GEMM + bias in the same run (both timed
// with a cold L2: Env::time_ms flushes it before every timed call):
//   "rotate + ring"         the rotate kernel, then the ring kernel (PDL): the layer's path for
//                           int8 weights;
//   4-bit: the tiled kernel on the weight's decode layout (tile_rows): rotate kernel + GEMV,
//   the GEMV alone (codes on the device), the fused mode (the layer's for M <= 2: every CTA
//   rotates x), and the stream probe that reads the layout's bytes and nothing else (the
//   roofline). A stream of distinct layers: linear.decode_stream.
class DecodeRingBench : public BenchCase {
 public:
  std::string name() const override { return "linear.decode_ring"; }

  // Session 4: the tiled kernel on the weight's decode layout (linear_decode_tiles.cu). Codes the
  // quantizer can give (4-bit u <= 14) and positive group ratios, so the layout carries them;
  // the ring kernel on the same bytes is the reference for the accuracy column.
  template <typename RowFn>
  void tile_rows(const cuda::linear::DecodeParams& d, const cuda::linear::DecodeParams& sep,
                 const cuda::linear::RotateQuantParams& rq,
                 RowFn row, std::vector<Row>& rows) {
    namespace cl = cuda::linear;
    cudaStream_t s = static_cast<cudaStream_t>(env_->ctx.cuda_stream);
    const int64_t N = d.w.N, K = d.w.K;
    std::mt19937_64 rng(77);
    std::vector<uint8_t> hc(static_cast<size_t>(N * d.w.row_bytes));
    for (auto& b : hc) {
      const uint32_t v = static_cast<uint32_t>(rng());
      b = static_cast<uint8_t>(d.w.format == cl::WeightFormat::packed
                                   ? ((v & 15) % 15) | (((v >> 4) & 15) % 15) << 4
                                   : v & 0xff);
    }
    std::vector<float> hr(static_cast<size_t>(N * (K / 128)));
    std::uniform_real_distribution<float> ur(0.05f, 18.f);
    for (auto& r : hr) r = ur(rng);
    DeviceTensor tc = make_empty(Device::cuda, DType::u8, {N, d.w.row_bytes});
    DeviceTensor tr = make_empty(Device::cuda, DType::f32, {N, K / 128});
    cudaMemcpy(tc.view.data, hc.data(), hc.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(tr.view.data, hr.data(), hr.size() * 4, cudaMemcpyHostToDevice);
    cl::DecodeParams tv = sep;
    tv.w.codes = static_cast<const uint8_t*>(tc.view.data);
    if (tv.w.ratios) tv.w.ratios = static_cast<const float*>(tr.view.data);
    const int64_t tb = cl::decode_tiles_bytes(tv.w);
    if (tb <= 0) return;
    DeviceTensor tiles = make_empty(Device::cuda, DType::u8, {tb});
    if (!cl::decode_tiles_build(tv.w, static_cast<uint8_t*>(tiles.view.data), s)) {
      Row r = row("tiles: layout refused the codes");
      r.note = "failed: decode_tiles_build returned false on valid codes";
      rows.push_back(r);
      return;
    }
    cl::rotate_quantize(rq, s);  // the codes of x (the reference runs on them)
    cl::decode_ring(tv, s);      // the reference bits (tv.tiles is still null here)
    cudaStreamSynchronize(s);
    const std::vector<float> ref = to_host_f32(make_view(d.out, DType::bf16, {d.M, N},
                                                         Device::cuda, 0));
    tv.tiles = static_cast<const uint8_t*>(tiles.view.data);
    if (!cl::decode_tiles_applies(tv)) return;
    auto compare = [&](Row& c) {
      cudaStreamSynchronize(s);
      const std::vector<float> got =
          to_host_f32(make_view(d.out, DType::bf16, {d.M, N}, Device::cuda, 0));
      size_t diff = 0;
      for (size_t i = 0; i < ref.size(); ++i)
        if (std::memcmp(&ref[i], &got[i], sizeof(float)) != 0) ++diff;
      c.accuracy = diff ? std::to_string(diff) + " outputs differ from the ring"
                        : "bit-identical to the ring";
    };
    // Bytes read: the layout's codes + 8-byte fold tables (packed 4-bit), x and out.
    auto tile_bytes = [&](Row& c) {
      c.bytes -= static_cast<double>(N * d.w.row_bytes);
      if (d.w.format == cl::WeightFormat::packed) c.bytes -= 4.0 * N * (K / 128);
      c.bytes += (N + 15) / 16 * (K / 128) *
                 (1024.0 + (d.w.format == cl::WeightFormat::packed ? 128 : 0));
    };
    // The fused mode: x in, every CTA rotates + quantizes it after its first weight requests.
    cl::DecodeParams fv = tv;
    fv.a = nullptr;
    fv.lda = 0;
    fv.ep.a_scale = nullptr;
    fv.x = rq.x;
    fv.x_dtype = rq.x_dtype;
    fv.x_row_stride = rq.x_row_stride;
    fv.rot = rq.rot;
    struct V {
      const char* name;
      bool rotate;  // the rotate kernel first, else the GEMV alone
      bool fused;   // x in: every CTA rotates + quantizes it (M <= 2)
    };
    // Session 6, H200 run 12 (every row bit-identical): L2 prefetch and the spread split were
    // slower, the async activation copy faster at M = 16 and the early trigger faster in a stream
    // of layers (linear.decode_stream): both always on since. Session 7: the fused mode (register
    // rotation in every CTA, M <= 2): a stream of layers gains, this single cold call does not.
    // Session 8 (run 19): the cooperative rotation for M > 2 lost as a cooperative launch: deleted.
    for (const V& v : {V{"rotate + tiles, smem ring (two kernels: layer default M > 2)", true, false},
                       V{"tiles alone, smem ring (codes on the device)", false, false},
                       V{"tiles fused, register rotation (one kernel; layer default M <= 2)", false,
                         true}}) {
      if (v.fused && !cl::decode_tiles_applies(fv)) continue;
      Row c = row(v.name);
      tile_bytes(c);
      c.ms = env_->time_ms([&] {
        if (v.rotate) cl::rotate_quantize(rq, s);
        cl::decode_tiles(v.fused ? fv : tv, s);
      });
      if (!v.rotate && !v.fused) c.note = "GEMV only: not the layer";
      compare(c);
      rows.push_back(c);
    }
    // The roofline under the same timing: the bytes the GEMV streams, read with its loads, no
    // arithmetic, no prologue or epilogue.
    Row c = row("stream probe: the layout's bytes read, nothing else");
    tile_bytes(c);
    c.ms = env_->time_ms([&] { cl::decode_tiles_stream_probe(tv, s); });
    c.note = "read-only kernel: not the layer";
    rows.push_back(c);
  }

  std::vector<Row> run(const Env& env) override {
    namespace cl = cuda::linear;
    std::vector<Row> rows;
    if (env.device != Device::cuda) return rows;
    env_ = &env;
    const int64_t K = env.quick ? 1024 : 5120, N = env.quick ? 1024 : 13824;
    cudaStream_t s = static_cast<cudaStream_t>(env.ctx.cuda_stream);
    struct Fmt {
      QType q;
      cl::WeightFormat f;
      int bits;
    };
    for (int64_t M : {int64_t{1}, int64_t{2}, int64_t{16}}) {
      const double base = env.bf16_gemm_ms(M, N, K, true);
      DeviceTensor x = make_tensor(Device::cuda, DType::bf16, {M, K}, 21);
      DeviceTensor codes = make_empty(Device::cuda, DType::i8, {M, K});
      DeviceTensor scales = make_empty(Device::cuda, DType::f32, {M});
      DeviceTensor w = make_tensor(Device::cuda, DType::u8, {N, K}, 23);  // int8: the largest
      DeviceTensor ratios = make_tensor(Device::cuda, DType::f32, {N, K / 128}, 24, 2.f);
      DeviceTensor ws = make_tensor(Device::cuda, DType::f32, {N}, 25, 1e-3f);
      DeviceTensor bias = make_tensor(Device::cuda, DType::bf16, {N}, 22);
      DeviceTensor out = make_empty(Device::cuda, DType::bf16, {M, N});
      cl::RotateQuantParams rq =
          cl::rotate_quant_rows(x.view.data, DType::bf16, M, K, cl::ActFormat::int8,
                                codes.view.data, static_cast<float*>(scales.view.data));
      for (const Fmt& f : {Fmt{QType::convrot_int4, cl::WeightFormat::packed, 4},
                           Fmt{QType::convrot_comfy_w4a4, cl::WeightFormat::comfy_int4, 4},
                           Fmt{QType::convrot8, cl::WeightFormat::int8, 8}}) {
        cl::DecodeParams d;
        d.M = M;
        d.w.format = f.f;
        d.w.codes = static_cast<const uint8_t*>(w.view.data);
        d.w.N = N;
        d.w.K = K;
        d.w.bits = f.bits;
        d.w.row_bytes = cl::packed_row_bytes(f.f, K, f.bits);
        if (f.f == cl::WeightFormat::packed) {
          d.w.ratios = static_cast<const float*>(ratios.view.data);
          d.w.group = 128;
          d.w.group_shift = 7;
          d.w.groups_per_row = K / 128;
        }
        d.act_qmax = f.f == cl::WeightFormat::comfy_int4 ? 7 : 127;
        rq.fmt = f.f == cl::WeightFormat::comfy_int4 ? cl::ActFormat::int4 : cl::ActFormat::int8;
        cl::decode_epilogue(d, static_cast<const float*>(ws.view.data), bias.view.data,
                            DType::bf16, out.view.data, DType::bf16);
        cl::DecodeParams sep = d;  // codes from the rotate kernel
        sep.a = static_cast<const int8_t*>(codes.view.data);
        sep.lda = K;
        sep.ep.a_scale = static_cast<const float*>(scales.view.data);
        auto row = [&](const std::string& what) {
          Row r;
          r.family = "linear";
          r.op = std::string("decode ") + qtype_name(f.q) + ": " + what;
          r.shape = shape_str(M, K, N);
          r.backend = "cuda";
          r.bytes = static_cast<double>(N * d.w.row_bytes) + 2.0 * M * K + 2.0 * M * N;
          if (f.f == cl::WeightFormat::packed) r.bytes += 4.0 * N * (K / 128);
          r.flops = 2.0 * M * N * K;
          r.baseline = "cuBLASLt bf16 GEMM + bias";
          r.baseline_ms = base;
          return r;
        };
        try {
          // Session 5 trim: the ring kernel's fused, GEMV-only and transport rows and session 2's
          // streaming kernel are settled (slower; runs 2-7) and gone.
          // Timed for int8 weights only (their layer path); the 4-bit rows compare their bits with
          // the ring's (tile_rows), their layer path is the tiled kernel.
          if (f.f == cl::WeightFormat::int8 && cl::decode_ring_applies(sep)) {
            Row r = row("rotate + ring");
            r.ms = env.time_ms([&] {
              cl::rotate_quantize(rq, s);
              cl::decode_ring(sep, s);
            });
            rows.push_back(r);
          }
          if (f.f != cl::WeightFormat::int8) tile_rows(d, sep, rq, row, rows);
        } catch (const std::exception& e) {
          Row r = row("failed");
          r.note = std::string("failed: ") + e.what();
          rows.push_back(r);
        }
      }
    }
    cudaStreamSynchronize(s);
    return rows;
  }

 private:
  const Env* env_ = nullptr;
};
#endif

LOWBIT_BENCH_CASES(linear_bench_cases) {
  cases.push_back(std::make_unique<LayerBench>());
  cases.push_back(std::make_unique<LayerBench>(
      "linear.layer.variants",
      std::vector<LayerShape>{{16, 13824, 5120, "decode, down projection"},
                              {8, 13824, 5120, "decode, down projection"},
                              {1, 13824, 5120, "decode, down projection"},
                              {1, 4096, 14336, "decode, Llama-3-8B up"},
                              {1, 14336, 4096, "decode, Llama-3-8B down"},
                              {16, 14336, 4096, "decode, Llama-3-8B down"},
                              {4096, 13824, 5120, "prefill, down projection"}}));
  // linear.layer.midm (session 35, CUDA only): the M between decode and prefill that batched
  // decode and chunked prefill run (32 .. 2048 tokens), where neither the GEMV nor a prefill
  // GEMM's large tiles are obviously right.
  cases.push_back(std::make_unique<LayerBench>(
      "linear.layer.midm",
      std::vector<LayerShape>{{32, 5120, 13824, "batched decode"},
                              {64, 5120, 13824, "batched decode"},
                              {128, 5120, 13824, "batched decode"},
                              {256, 5120, 13824, "chunked prefill"},
                              {512, 5120, 13824, "chunked prefill"},
                              {1024, 5120, 13824, "chunked prefill"},
                              {2048, 5120, 13824, "chunked prefill"},
                              {64, 4096, 14336, "batched decode, Llama-3-8B up"},
                              {256, 14336, 4096, "chunked prefill, Llama-3-8B down"},
                              {4096, 3072, 12288, "prefill, Flux MLP"}},
      true));
  // linear.layer.f16 (session 60, CUDA only): f16 activations and output where the int8 GEMM's
  // stream-K and weight-as-A configurations ran for bf16 output only until then (the same shapes
  // in bf16: linear.layer.midm).
  cases.push_back(std::make_unique<LayerBench>(
      "linear.layer.f16",
      std::vector<LayerShape>{{32, 5120, 13824, "batched decode", DType::f16},
                              {64, 5120, 13824, "batched decode", DType::f16},
                              {256, 5120, 13824, "chunked prefill", DType::f16},
                              {512, 5120, 13824, "chunked prefill", DType::f16},
                              {4096, 3072, 12288, "prefill, Flux MLP", DType::f16}}));
  cases.push_back(std::make_unique<RotateBench>());
#ifdef LOWBIT_WITH_CUDA
  cases.push_back(std::make_unique<DecodeRingBench>());
#endif
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
