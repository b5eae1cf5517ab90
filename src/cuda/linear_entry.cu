// CUDA entry points of the rotated quantized linear family (src/core/linear_backend.h; SPEC §3.5).
// src/core/linear.cpp has validated every argument; these choose the kernels and launch them:
//   prefill (M > 16): rotate+quantize -> [unpack] -> int8 GEMM with the fused epilogue (CUTLASS
//                     on sm_90a, else wgmma / mma.sync)
//   decode  (M <= 16, int8-grid qtypes): rotate+quantize -> decode GEMV on the packed codes (ring
//           kernel); 4-bit weights on sm_90: the tiled GEMV on their decode layout, for M <= 2
//           ONE launch per layer (every CTA rotates + quantizes x itself), else rotate kernel
//           (PDL) + GEMV
//   convrot4 on sm_90: NVFP4 dequantized to f16 (exact) -> f16 mma GEMM, pts in the epilogue;
//            on sm_100: the block-scaled fp4 GEMM (src/cuda/gemm_nvfp4_sm100.h)
// Temporary buffers come from the stream-ordered allocator (cudaMallocAsync on the caller's
// stream).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "lowbit/linear.h"
#include "src/core/backends.h"
#include "src/core/check.h"
#include "src/core/linear_backend.h"
#include "src/cuda/common.cuh"
#include "src/cuda/gemm_nvfp4_sm100.h"
#include "src/cuda/linear_decode_ring.cuh"
#include "src/cuda/linear_decode_tiles.cuh"
#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {

namespace {

using linear::ActFormat;
using linear::WeightFormat;

ActFormat act_format(QType q) {
  switch (q) {
    case QType::convrot_fp8:
      return ActFormat::e4m3;
    case QType::convrot4:
      return ActFormat::nvfp4;
    case QType::convrot_comfy_w4a4:
      return ActFormat::int4;
    default:
      return ActFormat::int8;
  }
}

// True for the qtypes whose GEMM runs on the int8 grid (int32 accumulation).
bool int8_grid(QType q) { return q != QType::convrot_fp8 && q != QType::convrot4; }

linear::PackedWeightRef weight_ref(const PackedWeightView& w) {
  linear::PackedWeightRef r;
  r.codes = static_cast<const uint8_t*>(w.codes.data);
  r.N = w.out_features;
  r.K = w.in_features;
  r.bits = w.bits;
  switch (w.qtype) {
    case QType::convrot8:
      r.format = WeightFormat::int8;
      r.bits = 8;
      break;
    case QType::convrot_bitnet:
      r.format = WeightFormat::ternary;
      break;
    case QType::convrot_comfy_w4a4:
      r.format = WeightFormat::comfy_int4;
      break;
    default:
      r.format = WeightFormat::packed;
  }
  r.row_bytes = linear::packed_row_bytes(r.format, r.K, r.bits);
  if (w.ratios.data) {
    r.ratios = static_cast<const float*>(w.ratios.data);
    r.group = static_cast<int>(w.group);
    r.groups_per_row = w.in_features / w.group;
    while ((1 << r.group_shift) < r.group) ++r.group_shift;
  }
  return r;
}

void check_k_fits(const char* op, int64_t K) {
  const int64_t max_k = linear::rotate_quantize_max_k();
  LOWBIT_CHECK(K <= max_k, op, "x",
               "expected in_features <= " + std::to_string(max_k) +
                   " (the fused CUDA rotation stages one row in shared memory), got " +
                   std::to_string(K));
}

// Rotates + quantizes x (M, K) into codes / scales (raw pointers, contiguous rows).
void launch_rotate_quantize(const TensorView& x, int rot, ActFormat fmt, void* codes,
                            int64_t codes_row_bytes, void* scales, cudaStream_t s, bool pdl = false,
                            uint16_t* x16 = nullptr, bool x16_permuted = false) {
  linear::RotateQuantParams p;
  p.pdl = pdl;
  p.x = x.data;
  p.x_dtype = x.dtype;
  p.x_row_stride = x.ndim > 1 ? x.stride[0] : x.shape[0];
  p.M = x.ndim > 1 ? x.shape[0] : 1;
  p.K = x.shape[x.ndim - 1];
  p.rot = rot;
  p.fmt = fmt;
  p.codes = codes;
  p.codes_row_stride = codes_row_bytes;
  if (fmt == ActFormat::nvfp4) {
    p.block_scales = static_cast<uint8_t*>(scales);
    p.x16 = x16;
    p.x16_permuted = x16_permuted;
  } else {
    p.scales = static_cast<float*>(scales);
  }
  linear::rotate_quantize(p, s);
}

// cuBLASLt's GEMM for g (linear::gemm_cublaslt) with its workspace from the scratch pool; false,
// nothing launched, when cuBLASLt refuses the arguments.
bool cublaslt_gemm(const linear::GemmParams& g, cudaStream_t s, const char* op) {
  Scratch ws(linear::gemm_cublaslt_workspace_bytes(), s, op);
  return linear::gemm_cublaslt(g, ws.as<void>(), linear::gemm_cublaslt_workspace_bytes(), s);
}

// Row stride in bytes of a contiguous-row tensor of codes (packed dtypes count elements / 2).
int64_t row_bytes_of(const TensorView& t) {
  const int64_t stride = t.ndim > 1 ? t.stride[0] : t.shape[0];
  return dtype_is_packed(t.dtype) ? stride / 2 : stride * (dtype_bits(t.dtype) / 8);
}

// cuBLASLt handle for the fp32 backward GEMM (created once per process).
cublasLtHandle_t lt_handle(const char* op) {
  static std::once_flag once;
  static cublasLtHandle_t handle = nullptr;
  static cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  std::call_once(once, [] { status = cublasLtCreate(&handle); });
  LOWBIT_CHECK(
      status == CUBLAS_STATUS_SUCCESS, op, "cuBLASLt",
      "expected a cuBLASLt handle, got status " + std::to_string(static_cast<int>(status)));
  return handle;
}

void lt_ok(cublasStatus_t st, const char* op, const char* what) {
  LOWBIT_CHECK(
      st == CUBLAS_STATUS_SUCCESS, op, what,
      "expected CUBLAS_STATUS_SUCCESS, got status " + std::to_string(static_cast<int>(st)));
}

// Row-major fp32 C(M, N) = A(M, Kd) · B(Kd, N), fp32 compute (no TF32).
void sgemm_nn(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t Kd,
              cudaStream_t s, const char* op) {
  cublasLtHandle_t h = lt_handle(op);
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  lt_ok(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), op, "matmul desc");
  // Column-major view: C^T (N, M) = B^T (N, Kd) · A^T (Kd, M).
  lt_ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, N, Kd, N), op, "layout");
  lt_ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, Kd, M, Kd), op, "layout");
  lt_ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N), op, "layout");
  const float one = 1.f, zero = 0.f;
  cublasStatus_t st =
      cublasLtMatmul(h, desc, &one, B, la, A, lb, &zero, C, lc, C, lc, nullptr, nullptr, 0, s);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  lt_ok(st, op, "cublasLtMatmul");
}

// fp32 dequantized weight in the rotated basis, (O, K) contiguous.
void dequantize_rotated(const PackedWeightView& w, float* out, cudaStream_t s, const char* op) {
  const int64_t O = w.out_features, K = w.in_features;
  const float* scales = static_cast<const float*>(w.scales.data);
  switch (w.qtype) {
    case QType::convrot_fp8:
      linear::dequant_e4m3_f32(static_cast<const uint8_t*>(w.codes.data), scales, O, K, out, s);
      return;
    case QType::convrot4:
      linear::dequant_nvfp4_f32(static_cast<const uint8_t*>(w.codes.data),
                                static_cast<const uint8_t*>(w.block_scales.data),
                                static_cast<const float*>(w.tensor_scale.data), O, K, out, s);
      return;
    default: {
      Scratch codes8(static_cast<size_t>(O * K), s, op);
      const linear::PackedWeightRef ref = weight_ref(w);
      const int8_t* c8 = static_cast<const int8_t*>(w.codes.data);
      if (ref.format != WeightFormat::int8) {
        linear::unpack_weight_int8(ref, codes8.as<int8_t>(), s);
        c8 = codes8.as<int8_t>();
      }
      linear::dequant_int8_f32(c8, scales, O, K, out, s);
    }
  }
}

// The CUTLASS int8 GEMM (gemm_cutlass_s8.cu) is the default on sm_90a when its headers were found
// at configure time and the shapes fit TMA; false keeps the older kernels (same bits) everywhere.
constexpr bool kCutlassInt8Gemm = true;
// Decode (M <= 16) of 4-bit weights on the layer's decode-tile layout (linear_decode_tiles.cu,
// session 4) where it exists; false: the ring kernel on the packed codes (session 3).
constexpr bool kUseDecodeTiles = true;
// Session 35: 16 < M <= DecodeTilesTuning::row_block_max_m / nvfp4_row_block_max_m run the
// decode GEMVs once per kRowBlock activation rows (each launch reads the packed weight again)
// instead of unpacking the whole weight to int8 / 16 bits for the prefill GEMM (H200,
// linear.layer.midm at 32 x 5120 -> 13824: convrotint4 0.0996 ms = 0.40x cuBLASLt bf16,
// convrot4 0.1418 = 0.28x before).
constexpr int64_t kRowBlock = 16;

// int8 GEMM with the fused epilogue, the first available of: CUTLASS (sm_90a; 256 x 128 tiles
// for M >= 512, else 128 x 256, stream-K 128 x 128 where those leave SMs idle), wgmma (sm_90a),
// mma.sync. All give the same output bits.
void gemm_s8(const linear::GemmParams& g, cudaStream_t s, const char* op) {
  if (kCutlassInt8Gemm && linear::cutlass_s8_fits(g) && linear::cutlass_s8_available(s)) {
    Scratch scratch(linear::cutlass_s8_scratch_bytes(g), s, op);
    if (linear::gemm_cutlass_s8(g, scratch.as<void>(), s)) return;
  }
  if (linear::wgmma_s8_available(s)) {
    linear::gemm_wgmma_s8(g, s);
  } else {
    linear::gemm(g, s);
  }
}

void rotate_rows(const void* x, DType xdt, int64_t x_stride, int64_t R, int64_t K, int block,
                 void* out, DType odt, int64_t o_stride, cudaStream_t s) {
  linear::RotateQuantParams p;
  p.x = x;
  p.x_dtype = xdt;
  p.x_row_stride = x_stride;
  p.M = R;
  p.K = K;
  p.rot = block;
  p.fmt = ActFormat::rotate_only;
  p.rotated = out;
  p.rotated_dtype = odt;
  p.rotated_row_stride = o_stride;
  linear::rotate_quantize(p, s);
}

}  // namespace

void hadamard_rotate(const TensorView& x, int block, TensorView out, Context& ctx) {
  const char* op = "hadamard_rotate";
  const int64_t K = x.shape[x.ndim - 1];
  const int64_t R = x.ndim > 1 ? x.shape[0] : 1;
  check_k_fits(op, K);
  rotate_rows(x.data, x.dtype, x.ndim > 1 ? x.stride[0] : K, R, K, block, out.data, out.dtype,
              out.ndim > 1 ? out.stride[0] : K, stream_of(ctx));
}

void rotate_quantize_activations(const TensorView& x, QType q, int rot, TensorView codes,
                                 TensorView scales, Context& ctx) {
  check_k_fits("rotate_quantize_activations", x.shape[x.ndim - 1]);
  launch_rotate_quantize(x, rot, act_format(q), codes.data, row_bytes_of(codes), scales.data,
                         stream_of(ctx));
}

void quantized_linear_forward(const PackedWeightView& w, const TensorView& x,
                              const TensorView* bias, TensorView out, Context& ctx) {
  const char* op = "QuantizedLinear::forward";
  cudaStream_t s = stream_of(ctx);
  const int64_t M = x.shape[0], K = w.in_features, O = w.out_features;
  if (M == 0) return;
  check_k_fits(op, K);
  const ActFormat fmt = act_format(w.qtype);
  // The layer's path choices (the defaults, or a test's / bench row's setting).
  const linear::DecodeTilesTuning& tt = linear::layer_tiles_tuning();

  linear::Epilogue ep{};
  ep.a_scale = nullptr;
  ep.w_scale = nullptr;
  ep.w_tensor_scale = nullptr;
  ep.bias = bias ? bias->data : nullptr;
  ep.bias_dtype = bias ? bias->dtype : DType::f32;

  linear::GemmParams g;
  g.M = M;
  g.N = O;
  g.K = K;
  g.bias = ep.bias;
  g.bias_dtype = ep.bias_dtype;
  g.out = out.data;
  g.out_dtype = out.dtype;
  g.ldo = out.stride[0];
  // The weight-as-A GEMMs' parameters (session 36-37): the activations a (M, K) with row
  // stride K and the weight's codes, with g's shape, bias and output.
  auto weight_a_base = [&](const void* a, const uint8_t* w_codes, int64_t w_row_bytes) {
    linear::WeightAGemmParams q;
    q.a = static_cast<const int8_t*>(a);
    q.lda = K;
    q.w_codes = w_codes;
    q.w_row_bytes = w_row_bytes;
    q.M = M;
    q.N = O;
    q.K = K;
    q.bias = g.bias;
    q.bias_dtype = g.bias_dtype;
    q.out = g.out;
    q.out_dtype = g.out_dtype;
    q.ldo = g.ldo;
    return q;
  };
  // Output row r of the layer (the decode GEMVs' blocks of kRowBlock rows start there).
  auto out_row = [&](int64_t r) {
    return static_cast<char*>(out.data) + r * g.ldo * (dtype_bits(out.dtype) / 8);
  };

  if (fmt == ActFormat::nvfp4) {
    Scratch a_codes(static_cast<size_t>(M * K / 2), s, op);
    Scratch a_bs(static_cast<size_t>(M * K / 16), s, op);
#ifdef LOWBIT_HAVE_SM100_NVFP4
    if (linear::nvfp4_sm100_device()) {
      // Blackwell: the block-scaled fp4 tensor cores read the packed codes and scales directly.
      linear::Nvfp4Sm100Gemm f;
      f.M = M;
      f.N = O;
      f.K = K;
      f.a_codes = a_codes.as<uint8_t>();
      f.a_scales = a_bs.as<uint8_t>();
      f.w_codes = static_cast<const uint8_t*>(w.codes.data);
      f.w_scales_swizzled = static_cast<const uint8_t*>(w.block_scales_swizzled.data);
      f.alpha = static_cast<const float*>(w.tensor_scale.data);
      f.bias = ep.bias;
      f.bias_dtype = ep.bias_dtype;
      f.out = out.data;
      f.out_dtype = out.dtype;
      f.ldo = out.stride[0];
      if (K % 32 != 0 || f.ldo % 8 != 0) {
        throw Error(op, "convrot4 on sm_100",
                    "expected K a multiple of 32 and an output row stride a multiple of 8, got K " +
                        std::to_string(K) + ", stride " + std::to_string(f.ldo));
      }
      launch_rotate_quantize(x, w.rot, fmt, a_codes.as<void>(), K / 2, a_bs.as<void>(), s);
      const std::string why = linear::nvfp4_gemm_sm100(f, s);
      if (!why.empty()) throw Error(op, "convrot4 on sm_100", why);
      return;
    }
#endif
    // sm_90 has no fp4 MMA: both operands dequantized (exact) to 16 bits; cuBLASLt's GEMM in the
    // output's type (DecodeTilesTuning::nvfp4_cublaslt), else the mma.sync f16 kernel; the tensor
    // scale (pts) and the bias in the epilogue.
    Scratch a16(static_cast<size_t>(M * K * 2), s, op);
    // Decode: the GEMV on the packed weight, the activation rows dequantized to f16 (exact) by the
    // rotate kernel itself (session 19: one kernel less than dequant_nvfp4_16 after it).
    // M <= 16: one GEMV; 16 < M <= nvfp4_row_block_max_m: one GEMV per 16 rows (session 35).
    const int64_t gemv_max_m = std::min<int64_t>(16, tt.nvfp4_gemv_max_m);
    if (M <= gemv_max_m ||
        (gemv_max_m == 16 && M <= tt.nvfp4_row_block_max_m)) {
      linear::Nvfp4DecodeParams d;
      d.x16 = a16.as<uint16_t>();
      d.M = std::min(M, kRowBlock);
      d.N = O;
      d.K = K;
      d.w_codes = static_cast<const uint8_t*>(w.codes.data);
      d.w_scales = static_cast<const uint8_t*>(w.block_scales.data);
      d.ep.w_tensor_scale = static_cast<const float*>(w.tensor_scale.data);
      d.ep.bias = ep.bias;
      d.ep.bias_dtype = ep.bias_dtype;
      d.out = out.data;
      d.out_dtype = out.dtype;
      d.ldo = out.stride[0];
      if (linear::decode_nvfp4_applies(d)) {
        // The e4m3 conversion reads the activations permuted, which the register rotate kernel
        // writes (session 19; DecodeTilesTuning::nvfp4_gemv_cvt).
        const bool cvt = tt.nvfp4_gemv_cvt && tt.nvfp4_x16_rotate && tt.nvfp4_gemv_slots == 4 &&
                         !tt.nvfp4_gemv_x_ahead && linear::decode_nvfp4_ring_applies(d) &&
                         K <= linear::rotate_quantize_reg_max_k();
        if (tt.nvfp4_x16_rotate) {
          launch_rotate_quantize(x, w.rot, fmt, a_codes.as<void>(), K / 2, a_bs.as<void>(), s,
                                 false, a16.as<uint16_t>(), cvt);
        } else {
          launch_rotate_quantize(x, w.rot, fmt, a_codes.as<void>(), K / 2, a_bs.as<void>(), s);
          linear::dequant_nvfp4_16(a_codes.as<uint8_t>(), a_bs.as<uint8_t>(), M, K,
                                   a16.as<uint16_t>(), DType::f16, s);
        }
        for (int64_t r0 = 0; r0 < M; r0 += kRowBlock) {
          linear::Nvfp4DecodeParams b = d;
          b.M = std::min(kRowBlock, M - r0);
          b.x16 = d.x16 + r0 * K;
          b.out = out_row(r0);
          linear::decode_nvfp4(b, s,
                               tt.nvfp4_gemv_depth > 0 ? tt.nvfp4_gemv_depth : (b.M <= 8 ? 4 : 1),
                               tt.nvfp4_gemv_slots, tt.nvfp4_gemv_x_ahead, cvt,
                               !cvt      ? 1
                               : b.M > 8 ? tt.nvfp4_gemv_tiles16
                                         : tt.nvfp4_gemv_tiles8);
        }
        return;
      }
    }
    // Session 37: past the GEMVs, the mixed-input GEMM on the packed codes (the weight's block
    // scales dequantized in registers; gemm_cutlass_nvfp4_mixed) on the f16 activations.
    if (w.decode_tiles.data && M <= tt.nvfp4_mixed_max_m) {
      linear::WeightAGemmParams q =
          weight_a_base(a16.as<void>(), static_cast<const uint8_t*>(w.codes.data), K / 2);
      q.wide_min_m = tt.nvfp4_mixed_wide_min_m;
      q.small_max_m = tt.mixed_small_max_m;
      linear::nvfp4_mixed_layout_parts(static_cast<const uint8_t*>(w.decode_tiles.data), O, K, &q);
      if (linear::cutlass_nvfp4_mixed_applies(q)) {
        launch_rotate_quantize(x, w.rot, fmt, a_codes.as<void>(), K / 2, a_bs.as<void>(), s, false,
                               a16.as<uint16_t>());
        Scratch ws(linear::cutlass_nvfp4_mixed_scratch_bytes(q), s, op);
        if (linear::gemm_cutlass_nvfp4_mixed(q, ws.as<void>(), s)) return;
      }
    }
    launch_rotate_quantize(x, w.rot, fmt, a_codes.as<void>(), K / 2, a_bs.as<void>(), s);
    Scratch w16(static_cast<size_t>(O * K * 2), s, op);
    auto dequant = [&](DType t) {
      linear::dequant_nvfp4_16(a_codes.as<uint8_t>(), a_bs.as<uint8_t>(), M, K, a16.as<uint16_t>(),
                               t, s);
      linear::dequant_nvfp4_16(static_cast<const uint8_t*>(w.codes.data),
                               static_cast<const uint8_t*>(w.block_scales.data), O, K,
                               w16.as<uint16_t>(), t, s);
      g.kind = t == DType::bf16 ? linear::GemmKind::bf16 : linear::GemmKind::f16;
    };
    g.a = a16.as<void>();
    g.b = w16.as<void>();
    g.lda = K;
    g.ldb = K;
    g.w_tensor_scale = static_cast<const float*>(w.tensor_scale.data);
    const bool lt = tt.nvfp4_cublaslt &&
                    (out.dtype == DType::bf16 || out.dtype == DType::f16);
    dequant(lt ? out.dtype : DType::f16);
    if (lt) {
      if (cublaslt_gemm(g, s, op)) return;
      if (g.kind != linear::GemmKind::f16) dequant(DType::f16);  // the mma.sync kernel's type
    }
    linear::gemm(g, s);
    return;
  }

  const linear::PackedWeightRef ref = weight_ref(w);
  // The decode GEMV's parameters (M <= 16): activation codes (M, K) and scales (M) (null: the
  // kernel rotates + quantizes x itself, with_x), the weight, the epilogue and the output.
  auto decode_params = [&](const int8_t* a_codes, const float* a_scale) {
    linear::DecodeParams d;
    d.a = a_codes;
    d.lda = a_codes ? K : 0;
    d.M = M;
    d.w = ref;
    d.ep = ep;
    d.ep.a_scale = a_scale;
    d.ep.w_scale = static_cast<const float*>(w.scales.data);
    d.out = out.data;
    d.out_dtype = out.dtype;
    d.ldo = out.stride[0];
    // The weight's own decode layout (4-bit qtypes on sm_90): the tiled kernel.
    if (kUseDecodeTiles) d.tiles = static_cast<const uint8_t*>(w.decode_tiles.data);
    return d;
  };
  // ... with x (M, K) for the GEMV to rotate + quantize (the fused modes).
  auto with_x = [&](linear::DecodeParams d) {
    d.x = x.data;
    d.x_dtype = x.dtype;
    d.x_row_stride = x.stride[0];
    d.rot = w.rot;
    d.act_qmax = fmt == ActFormat::int4 ? 7 : 127;
    return d;
  };
  // Decode on the tiles with the rotation inside the GEMV (DecodeTilesTuning::fuse_max_m): every
  // CTA rotates x (M <= kTilesFuseLimit: no scratch, one launch per layer).
  const bool tiles = kUseDecodeTiles && w.decode_tiles.data && fmt != ActFormat::e4m3 && M <= 16;
  // The GEMM with the weight as A (session 36): comfy W4A4's mixed-input GEMM on the int4 codes
  // between comfy_row_block_max_m and comfy_mixed_max_m rows (16-bit output, TMA-addressable
  // shapes), convrot8's int8 GEMM up to int8_weight_a_max_m rows.
  auto weight_a_params = [&](const int8_t* a_codes, const float* a_scale) {
    linear::WeightAGemmParams q = weight_a_base(a_codes, ref.codes, ref.row_bytes);
    q.a_scale = a_scale;
    q.w_scale = static_cast<const float*>(w.scales.data);
    q.wide_min_m = tt.comfy_mixed_wide_min_m;
    q.small_max_m = tt.mixed_small_max_m;
    return q;
  };
  const bool comfy_mixed = ref.format == WeightFormat::comfy_int4 && M > tt.comfy_row_block_max_m &&
                           M <= tt.comfy_mixed_max_m &&
                           linear::cutlass_s8s4_applies(weight_a_params(nullptr, nullptr));
  // convrotint4 (session 37): the same GEMM on the packed codes with the fold tables that end
  // the weight's decode tiles.
  auto int4_lut_params = [&](const int8_t* a_codes, const float* a_scale) {
    linear::WeightAGemmParams q = weight_a_params(a_codes, a_scale);
    q.wide_min_m = tt.int4_mixed_wide_min_m;
    q.w_lut = linear::decode_tiles_gemm_lut(
        ref, static_cast<const uint8_t*>(w.decode_tiles.data), &q.w_lut_ld, &q.w_lut_group);
    return q;
  };
  const bool int4_mixed = ref.format == WeightFormat::packed && ref.bits == 4 &&
                          w.decode_tiles.data && M > tt.int4_row_block_max_m &&
                          M <= tt.int4_mixed_max_m &&
                          linear::cutlass_s8s4_lut_applies(int4_lut_params(nullptr, nullptr));
  // 16 < M <= row_block_max_m: the tiled GEMV once per 16 activation rows (session 35).
  const bool tiles_blocks = kUseDecodeTiles && w.decode_tiles.data && fmt != ActFormat::e4m3 &&
                            M > 16 && M <= tt.row_block_max_m && !comfy_mixed && !int4_mixed;
  if (tiles && M <= std::min(linear::kTilesFuseLimit,
                             static_cast<int64_t>(tt.fuse_max_m))) {
    const linear::DecodeParams d = with_x(decode_params(nullptr, nullptr));
    if (linear::decode_tiles_applies(d)) {
      linear::decode_tiles(d, s);
      return;
    }
  }

  // One temporary for the codes (M, K) and, 256-byte aligned after them, the scales (M).
  const size_t scale_off = (static_cast<size_t>(M * K) + 255) / 256 * 256;
  Scratch act(scale_off + static_cast<size_t>(M * 4), s, op);
  int8_t* a_codes = act.as<int8_t>();
  float* a_scale = reinterpret_cast<float*>(act.as<char>() + scale_off);
  // The rotate kernel goes out with PDL before the tiled GEMV (which triggers its dependents
  // early), so a stream of layers chains GEMV -> rotate -> GEMV with each kernel starting under
  // its predecessor's tail (it waits before touching memory).
  launch_rotate_quantize(x, w.rot, fmt, a_codes, K, a_scale, s, tiles || tiles_blocks);
  g.a_scale = a_scale;
  g.w_scale = static_cast<const float*>(w.scales.data);
  g.a = a_codes;
  g.lda = K;
  g.ldb = K;

  if (fmt == ActFormat::e4m3) {
    // Decode: the ring GEMV streams the e4m3 weight bytes (one byte per weight, as int8's) up
    // to DecodeTilesTuning::fp8_ring_max_m.
    linear::DecodeParams d;
    if (M <= 16) {
      d = decode_params(a_codes, a_scale);
      d.w.format = WeightFormat::int8;
      d.w.bits = 8;
      d.w.row_bytes = K;
      d.tiles = nullptr;
      d.e4m3 = true;
    }
    if (M <= std::min<int64_t>(16, tt.fp8_ring_max_m) &&
        linear::decode_ring_applies(d)) {
      linear::decode_ring(d, s);  // (decode_gemv would check the same again)
      return;
    }
    g.kind = linear::GemmKind::e4m3;
    g.b = w.codes.data;
    g.fp8_fast_accum = w.fp8_fast_accum;
    if (cublaslt_gemm(g, s, op)) return;
    // Session 35: cuBLASLt offers no fast-accumulation algorithm at some shapes where it has the
    // default one (256 x 14336 -> 4096: the mma.sync fallback took 0.255 ms, cuBLASLt 0.040).
    if (g.fp8_fast_accum) {
      g.fp8_fast_accum = false;
      if (cublaslt_gemm(g, s, op)) return;
    }
    // Session 34: where cuBLASLt offers no fp8 algorithm at M <= 16 (e.g. 16 x 13824 -> 5120;
    // the mma.sync kernel ran it in 0.228 ms, 0.19x bf16), the ring GEMV (with activation
    // windows where M rows of K codes do not fit its shared memory).
    if (M <= 16 && linear::decode_ring_applies(d)) {
      linear::decode_ring(d, s);
      return;
    }
    linear::gemm(g, s);
    return;
  }

  // The activation copy by multicast in clusters where it applies (DecodeTilesTuning::act_mcast).
  auto with_mcast = [&](linear::DecodeParams d) {
    if (tt.act_mcast > 0) {
      d.cluster = tt.act_mcast;
      if (!linear::decode_tiles_applies(d)) d.cluster = 0;
    }
    return d;
  };
  if (M <= 16) {
    linear::DecodeParams d = decode_params(a_codes, a_scale);
    if (tiles) d = with_mcast(d);
    linear::decode_gemv(d, s);
    return;
  }
  if (tiles_blocks) {
    // Rows [r0, r0 + 16) of the codes, scales and output as one GEMV's M <= 16 rows.
    auto block = [&](int64_t r0) {
      linear::DecodeParams d = decode_params(a_codes + r0 * K, a_scale + r0);
      d.M = std::min(kRowBlock, M - r0);
      d.out = out_row(r0);
      return with_mcast(d);
    };
    const int64_t last = (M - 1) / kRowBlock * kRowBlock;
    if (linear::decode_tiles_applies(block(0)) && linear::decode_tiles_applies(block(last))) {
      for (int64_t r0 = 0; r0 < M; r0 += kRowBlock) linear::decode_tiles(block(r0), s);
      return;
    }
  }
  g.kind = linear::GemmKind::s8;
  if (ref.format == WeightFormat::int8) {
    // Session 36: few activation rows take the GEMM with the weight as A (gemm_cutlass_s8_t).
    if (M <= tt.int8_weight_a_max_m) {
      const linear::WeightAGemmParams q = weight_a_params(a_codes, a_scale);
      if (linear::cutlass_s8_t_applies(q)) {
        Scratch ws(linear::cutlass_s8_t_scratch_bytes(q), s, op);
        if (linear::gemm_cutlass_s8_t(q, ws.as<void>(), s)) return;
      }
    }
    g.b = w.codes.data;
    gemm_s8(g, s, op);
    return;
  }
  if (comfy_mixed) {
    const linear::WeightAGemmParams q = weight_a_params(a_codes, a_scale);
    if (const size_t bytes = linear::cutlass_s8s4_scratch_bytes(q)) {
      Scratch ws(bytes, s, op);
      if (linear::gemm_cutlass_s8s4(q, ws.as<void>(), s)) return;
    }
  }
  if (int4_mixed) {
    const linear::WeightAGemmParams q = int4_lut_params(a_codes, a_scale);
    if (const size_t bytes = linear::cutlass_s8s4_lut_scratch_bytes(q)) {
      Scratch ws(bytes, s, op);
      if (linear::gemm_cutlass_s8s4_lut(q, ws.as<void>(), s)) return;
    }
  }
  Scratch w8(static_cast<size_t>(O * K), s, op);
  if (kUseDecodeTiles && w.decode_tiles.data && tt.unpack_from_tiles) {
    linear::decode_tiles_unpack_int8(ref, static_cast<const uint8_t*>(w.decode_tiles.data),
                                     w8.as<int8_t>(), s);
  } else {
    linear::unpack_weight_int8(ref, w8.as<int8_t>(), s);
  }
  g.b = w8.as<void>();
  gemm_s8(g, s, op);
}

int64_t decode_tiles_bytes(const PackedWeightView& w) {
  // No layout where the kernel cannot run (it would only cost memory), or where it is off.
  if (!kUseDecodeTiles || !linear::decode_tiles_device()) return 0;
  // NVFP4 (session 37): the prefill GEMM's block-scale layout (its decode GEMV reads the
  // checkpoint's own bytes); before, its e2m1 codes were taken for packed int4 ones.
  if (w.qtype == QType::convrot4) return linear::nvfp4_mixed_layout_bytes(w.out_features, w.in_features);
  return linear::decode_tiles_bytes(weight_ref(w));
}

bool build_decode_tiles(const PackedWeightView& w, void* out, Context& ctx) {
  if (w.qtype == QType::convrot4) {
    return linear::nvfp4_mixed_layout_build(
        static_cast<const uint8_t*>(w.block_scales.data),
        static_cast<const float*>(w.tensor_scale.data), w.out_features, w.in_features,
        static_cast<uint8_t*>(out), stream_of(ctx));
  }
  return linear::decode_tiles_build(weight_ref(w), static_cast<uint8_t*>(out), stream_of(ctx));
}

void quantized_linear_backward_input(const PackedWeightView& w, const TensorView& grad_out,
                                     TensorView grad_x, Context& ctx) {
  const char* op = "QuantizedLinear::backward_input";
  cudaStream_t s = stream_of(ctx);
  const int64_t M = grad_out.shape[0], K = w.in_features, O = w.out_features;
  if (M == 0) return;
  check_k_fits(op, K);
  Scratch wf(static_cast<size_t>(O * K * 4), s, op);
  dequantize_rotated(w, wf.as<float>(), s, op);
  // grad_out in fp32 (a copy through the rotation kernel's loader would rotate; convert plainly).
  Scratch g32(static_cast<size_t>(M * O * 4), s, op);
  {
    TensorView src = grad_out;
    TensorView dst =
        make_view(g32.as<void>(), DType::f32, {M, O}, Device::cuda, grad_out.device_index);
    convert(src, dst, ctx);
  }
  Scratch gx(static_cast<size_t>(M * K * 4), s, op);
  sgemm_nn(g32.as<float>(), wf.as<float>(), gx.as<float>(), M, K, O, s, op);
  rotate_rows(gx.as<void>(), DType::f32, K, M, K, w.rot, grad_x.data, grad_x.dtype,
              grad_x.stride[0], s);
}

void dequantize_weight(const PackedWeightView& w, TensorView out, bool rotated_basis,
                       Context& ctx) {
  const char* op = "dequantize_weight";
  cudaStream_t s = stream_of(ctx);
  const int64_t O = w.out_features, K = w.in_features;
  if (O == 0 || K == 0) return;
  const bool contiguous = out.stride[0] == K;
  Scratch tmp(contiguous ? 0 : static_cast<size_t>(O * K * 4), s, op);
  float* dst = contiguous ? static_cast<float*>(out.data) : tmp.as<float>();
  dequantize_rotated(w, dst, s, op);
  if (!rotated_basis) {
    check_k_fits(op, K);
    rotate_rows(dst, DType::f32, K, O, K, w.rot, out.data, DType::f32, out.stride[0], s);
  } else if (!contiguous) {
    check_cuda(cudaMemcpy2DAsync(out.data, out.stride[0] * 4, dst, K * 4, K * 4, O,
                                 cudaMemcpyDeviceToDevice, s),
               op, "copy");
  }
}

void requantize_weight(const PackedWeightView& w, const TensorView& weight, bool stochastic,
                       uint64_t seed, Context& ctx) {
  const char* op = "requantize_weight";
  cudaStream_t s = stream_of(ctx);
  const int64_t O = w.out_features, K = w.in_features;
  if (O == 0 || K == 0) return;
  check_k_fits(op, K);
  Scratch rot(static_cast<size_t>(O * K * 4), s, op);
  rotate_rows(weight.data, weight.dtype, weight.stride[0], O, K, w.rot, rot.as<void>(), DType::f32,
              K, s);
  linear::RequantParams p;
  p.w_rot = rot.as<float>();
  p.N = O;
  p.K = K;
  p.bits = w.bits;
  p.qmax = w.qtype == QType::convrot8 ? 127 : (1 << (w.bits - 1)) - 1;
  p.scales = static_cast<const float*>(w.scales.data);
  p.ratios = static_cast<const float*>(w.ratios.data);
  p.group = w.group;
  p.block_scales = static_cast<const uint8_t*>(w.block_scales.data);
  p.tensor_scale = static_cast<const float*>(w.tensor_scale.data);
  p.stochastic = stochastic;
  p.seed = seed;
  p.codes = static_cast<uint8_t*>(w.codes.data);
  switch (w.qtype) {
    case QType::convrot8:
      p.format = linear::RequantFormat::int8;
      break;
    case QType::convrot_bitnet:
      p.format = linear::RequantFormat::ternary;
      break;
    case QType::convrot_comfy_w4a4:
      p.format = linear::RequantFormat::comfy_int4;
      break;
    case QType::convrot_fp8:
      p.format = linear::RequantFormat::e4m3;
      break;
    case QType::convrot4:
      p.format = linear::RequantFormat::nvfp4;
      break;
    default:
      p.format = linear::RequantFormat::packed;
  }
  p.row_bytes = w.codes.shape[w.codes.ndim - 1];  // byte-typed (i8 / u8 / e4m3) storage rows
  linear::requantize_codes(p, s);
}

}  // namespace cuda
}  // namespace lowbit
