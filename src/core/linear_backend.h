// Backend entry points of the rotated quantized linear family (SPEC §3). src/core/linear.cpp
// validates every argument (dtypes, shapes, devices, rot, qtype) before calling these; the
// backends assume valid arguments. Shapes: O = out_features, K = in_features, M = input rows.
// CPU and CUDA never include each other; both implement exactly this list.
#pragma once

#include <cstdint>

#include "lowbit/linear.h"
#include "lowbit/tensor.h"

namespace lowbit {

namespace cpu {
// Rotates `w` (O, K) f32/bf16/f16 (host, innermost contiguous) by out.rot() and fills every part
// of `out` (made by make_packed_weight for the same qtype and shape). CPU only: weights are
// quantized on the host (SPEC §3.2-3.4).
void quantize_weight(const TensorView& w, PackedWeight& out, Context& ctx);
// out = x · R_block per block of the last dim (docs/linear.md fixes the butterfly order).
//   x:   (R, K) f32/bf16/f16, innermost contiguous, row stride x.stride[0]
//   out: (R, K) f32/bf16/f16, innermost contiguous; may be x itself (same data and strides)
// (the front flattens leading dimensions into R rows).
void hadamard_rotate(const TensorView& x, int block, TensorView out, Context& ctx);
// Per-token rotate + quantize of a layer input (linear.h rotate_quantize_activations).
//   x:      (M, K) f32/bf16/f16, innermost contiguous; rot in {16, 64, 256} divides K
//   codes:  (M, K) i8 (int8 family, comfy), e4m3 (fp8) or e2m1x2 (convrot4), contiguous rows
//   scales: (M) f32, or (M, K/16) e4m3 for convrot4
void rotate_quantize_activations(const TensorView& x, QType q, int rot, TensorView codes,
                                 TensorView scales, Context& ctx);
// out = epilogue(quantize(x·R) · Wᵀ): acc * a_scale[m] * w_scale[o] (+ bias[o]) in fp32.
//   w:    packed weight on this backend's device (linear.h PackedWeightView layouts)
//   x:    (M, K) f32/bf16/f16, innermost contiguous
//   bias: (O) f32 or x's dtype, or nullptr
//   out:  (M, O) x's dtype, innermost contiguous
void quantized_linear_forward(const PackedWeightView& w, const TensorView& x,
                              const TensorView* bias, TensorView out, Context& ctx);
// grad_x = (grad_out · dequant(W')) · R.
//   grad_out: (M, O) f32/bf16/f16, innermost contiguous
//   grad_x:   (M, K) f32/bf16/f16, innermost contiguous
void quantized_linear_backward_input(const PackedWeightView& w, const TensorView& grad_out,
                                     TensorView grad_x, Context& ctx);
// out = dequant(W') (rotated_basis) or dequant(W') · R.
//   out: (O, K) f32, innermost contiguous
void dequantize_weight(const PackedWeightView& w, TensorView out, bool rotated_basis, Context& ctx);
// Rewrites w.codes (only) from `weight` on the stored scales; nearest or stochastic.
//   weight: (O, K) f32/bf16/f16 in the original basis, innermost contiguous
void requantize_weight(const PackedWeightView& w, const TensorView& weight, bool stochastic,
                       uint64_t seed, Context& ctx);
}  // namespace cpu

namespace cuda {
// out = x · R_block per block of the last dim (docs/linear.md fixes the butterfly order).
//   x:   (R, K) f32/bf16/f16, innermost contiguous, row stride x.stride[0]
//   out: (R, K) f32/bf16/f16, innermost contiguous; may be x itself (same data and strides)
// (the front flattens leading dimensions into R rows).
void hadamard_rotate(const TensorView& x, int block, TensorView out, Context& ctx);
// Per-token rotate + quantize of a layer input (linear.h rotate_quantize_activations).
//   x:      (M, K) f32/bf16/f16, innermost contiguous; rot in {16, 64, 256} divides K
//   codes:  (M, K) i8 (int8 family, comfy), e4m3 (fp8) or e2m1x2 (convrot4), contiguous rows
//   scales: (M) f32, or (M, K/16) e4m3 for convrot4
void rotate_quantize_activations(const TensorView& x, QType q, int rot, TensorView codes,
                                 TensorView scales, Context& ctx);
// out = epilogue(quantize(x·R) · Wᵀ): acc * a_scale[m] * w_scale[o] (+ bias[o]) in fp32.
//   w:    packed weight on this backend's device (linear.h PackedWeightView layouts)
//   x:    (M, K) f32/bf16/f16, innermost contiguous
//   bias: (O) f32 or x's dtype, or nullptr
//   out:  (M, O) x's dtype, innermost contiguous
void quantized_linear_forward(const PackedWeightView& w, const TensorView& x,
                              const TensorView* bias, TensorView out, Context& ctx);
// grad_x = (grad_out · dequant(W')) · R.
//   grad_out: (M, O) f32/bf16/f16, innermost contiguous
//   grad_x:   (M, K) f32/bf16/f16, innermost contiguous
void quantized_linear_backward_input(const PackedWeightView& w, const TensorView& grad_out,
                                     TensorView grad_x, Context& ctx);
// out = dequant(W') (rotated_basis) or dequant(W') · R.
//   out: (O, K) f32, innermost contiguous
void dequantize_weight(const PackedWeightView& w, TensorView out, bool rotated_basis, Context& ctx);
// Rewrites w.codes (only) from `weight` on the stored scales; nearest or stochastic.
//   weight: (O, K) f32/bf16/f16 in the original basis, innermost contiguous
void requantize_weight(const PackedWeightView& w, const TensorView& weight, bool stochastic,
                       uint64_t seed, Context& ctx);
}  // namespace cuda

}  // namespace lowbit
