// Rotated quantized linear layers (ConvRot, SPEC §3): the regular-Hadamard rotation, the qtypes
// and their packed weight formats, the quantized linear forward / backward-input, and
// re-quantization on stored scales. docs/linear.md gives the design and every rounding rule.
//
// Shapes: O = out_features, K = in_features, M = rows (tokens) of the layer's input.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/runtime.h"
#include "lowbit/tensor.h"

namespace lowbit {

// ---- qtypes (SPEC §3.2) -------------------------------------------------------------------------
enum class QType : uint8_t {
  convrot8,      // int8 per row (amax/127), W8A8
  convrot_int2,  // n-bit symmetric, bit-packed (SPEC §3.3), A8
  convrot_int3,
  convrot_int4,
  convrot_int5,
  convrot_int6,
  convrot_int7,
  convrot_int8,        // int8 codes of convrot8, stored offset and bit-packed with bits = 8
  convrot_bitnet,      // convrot_int2's codes and scales, stored base-3 (5 codes per byte)
  convrot_comfy_w4a4,  // ComfyUI convrot_w4a4: int4 per row (MSE row scale), A4, rot 256
  convrot4,            // NVFP4 weights (MSE block scales) and activations
  convrot_fp8,         // e4m3 per row (amax/448), e4m3 activations
};
constexpr int kNumQTypes = 12;

// "convrot8", "convrotint2" .. "convrotint8", "convrotbitnet", "convrotcomfyw4a4", "convrot4",
// "convrotfp8" (the ai-toolkit names; case-sensitive). Unknown names throw lowbit::Error.
QType parse_qtype(const std::string& name);
// The ai-toolkit name of `q` (the inverse of parse_qtype).
const char* qtype_name(QType q);
// Bits per stored weight code: 8, 2..8, 2 (bitnet: ternary), 4 (comfy), 4 (convrot4), 8 (fp8).
int qtype_bits(QType q);
// Elements along K sharing one weight scale for a layer of K in_features: the MSE group (128
// halved until it divides K) for convrot_int2..7 and bitnet, 16 for convrot4, K otherwise.
int64_t qtype_group(QType q, int64_t in_features);

// rot = min(256, largest power of 4 dividing K) (1 when K == 0). Layers with rot < 16 are not
// quantized. comfy W4A4 requires K % 256 == 0, so its rot is 256 too.
int rotation_block(int64_t in_features);
// The largest layer lowbit takes: each of O and K at most kMaxLayerDim, O x K at most
// kMaxLayerWeights (a bound on shapes read from files, far past any model's layer).
constexpr int64_t kMaxLayerDim = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxLayerWeights = int64_t{1} << 40;
// SPEC §3.2 rules: K % 16 == 0, O % 8 == 0 (convrot4: both % 16), rot >= 16; comfy W4A4:
// K % 256 == 0; and the size bound above. When false and why_not is given, *why_not says which
// rule failed.
bool can_quantize(QType q, int64_t out_features, int64_t in_features, std::string* why_not);

// ---- rotation (SPEC §3.1) -----------------------------------------------------------------------
// out = x · R_block on every block of `block` consecutive elements of the last dimension, as the
// fast transform R_n = D·H_n·P·D (docs/linear.md fixes the butterfly order, so every backend gives
// the same bits). block in {16, 64, 256}; x.size(-1) % block == 0.
//   x:   (..., K) f32/bf16/f16, innermost contiguous, other strides free
//   out: (..., K) f32/bf16/f16, same shape (dtype may differ; computed in fp32, rounded once at
//        the end). out may be x itself (in place); otherwise it must not overlap x.
void hadamard_rotate(const TensorView& x, int block, TensorView out, Context& ctx);

// Per-token activation quantization of the layer input after the rotation (the first half of the
// prefill path; public so backends can be compared on it bit for bit).
//   x:      (M, K) f32/bf16/f16, innermost contiguous, row stride free
//   codes:  int8 family (convrot8, convrot_int*, bitnet): (M, K) i8 in [-127, 127]
//           comfy W4A4: (M, K) i8 in [-7, 7]
//           convrot_fp8: (M, K) e4m3
//           convrot4: (M, K) e2m1x2 (two codes per byte, even element in the low nibble)
//   scales: convrot4: (M, K/16) e4m3 block scales (per-tensor scale 1); others: (M) f32
void rotate_quantize_activations(const TensorView& x, QType q, int rot, TensorView codes,
                                 TensorView scales, Context& ctx);

// ---- packed weights -----------------------------------------------------------------------------
// Non-owning views of one layer's packed weight, on one device. Absent parts have data == nullptr.
struct PackedWeightView {
  QType qtype = QType::convrot8;
  int64_t out_features = 0, in_features = 0;
  int rot = 0;        // rotation block
  int bits = 0;       // qtype_bits
  int64_t group = 0;  // qtype_group
  // convrot8:            (O, K) i8 codes
  // convrot_int2..8:     (O, K/8*bits) u8: offset codes u = c + qmax, 8 codes per `bits` bytes,
  //                      code j of each 8 at bits [j*bits, j*bits+bits) of the little-endian word
  // convrot_bitnet:      (O, ceil(K/5)) u8: base 3, u = c + 1, weights 1, 3, 9, 27, 81
  // convrot_comfy_w4a4:  (O, K/2) i8: two signed 4-bit codes, even column in the low nibble
  // convrot4:            (O, K/2) u8: e2m1 codes, even column in the low nibble
  // convrot_fp8:         (O, K) e4m3
  TensorView codes;
  // (O) f32 row scale (w = code8 * scale); absent for convrot4.
  TensorView scales;
  // (O, K/group) f32 group ratios s_g / rscale (convrot_int2..7, bitnet only).
  TensorView ratios;
  // convrot4 only: (O, K/16) e4m3 block scales, the same scales in the cuBLAS 128x4 swizzled
  // layout ((ceil(O/128)*128) * (ceil(K/64)*4) e4m3, flat; padding 0), and (1) f32 per-tensor
  // scale.
  TensorView block_scales;
  TensorView block_scales_swizzled;
  TensorView tensor_scale;
  // Backend-private, derived, built by QuantizedLinear: on a CUDA device the decode kernel's own
  // layout of `codes` (and of the fold tables of `ratios`) for the 4-bit qtypes (convrot_int4
  // with group 128, comfy W4A4); on the host, for convrot_int4 where the CPU runs the decode
  // GEMV (AVX-512 VBMI or AVX2), the fold tables of `ratios` (16 bytes a group); absent (data ==
  // nullptr) otherwise. Whoever rewrites `codes` or `ratios` rebuilds it
  // (QuantizedLinear::requantize does). Not part of a checkpoint.
  TensorView decode_tiles;
  // convrot_fp8 prefill on CUDA (cuBLASLt's e4m3 GEMM): fast accumulation, i.e. the tensor cores'
  // partial sums are not promoted to full fp32 every few k-steps. 1.15x faster on the H200 at
  // 32768x5120->5120 for a relative L1 change of ~1e-3 (the fp8 quantization itself: ~4e-2);
  // false = the full-precision accumulation. Ignored elsewhere.
  bool fp8_fast_accum = true;
};

// An owning host copy of one layer's packed weight (what a checkpoint stores).
class PackedWeight {
 public:
  PackedWeight() = default;
  // Loads from named tensors (the names tensors() gives; all on the host): validates every dtype
  // and shape against (q, out_features, in_features) and copies the bytes. rot / group, when not 0,
  // must equal the values derived from the shape (a file recording others is rejected).
  PackedWeight(QType q, int64_t out_features, int64_t in_features,
               const std::vector<std::pair<std::string, TensorView>>& tensors, int rot = 0,
               int64_t group = 0);

  QType qtype() const { return qtype_; }
  int64_t out_features() const { return out_features_; }
  int64_t in_features() const { return in_features_; }
  int rot() const { return rot_; }
  int bits() const { return bits_; }
  int64_t group() const { return group_; }
  // Bytes of all stored parts.
  int64_t storage_bytes() const;

  // The stored parts by name, in a fixed order: "codes", then those present of "scales",
  // "ratios", "block_scales", "block_scales_swizzled", "tensor_scale". Views into this object.
  std::vector<std::pair<std::string, TensorView>> tensors() const;
  PackedWeightView view() const;

  // Raw storage (each part's bytes, empty when absent).
  std::vector<uint8_t> codes, scales, ratios, block_scales, block_scales_swizzled, tensor_scale;

 private:
  friend PackedWeight make_packed_weight(QType q, int64_t out_features, int64_t in_features);
  QType qtype_ = QType::convrot8;
  int64_t out_features_ = 0, in_features_ = 0;
  int rot_ = 0, bits_ = 0;
  int64_t group_ = 0;
};

// An empty (zero-filled) packed weight of the right sizes for (q, O, K); throws when
// can_quantize says no.
PackedWeight make_packed_weight(QType q, int64_t out_features, int64_t in_features);
// The parts such a weight stores, as PackedWeight::tensors() names them, with their dtypes and
// shapes and no data (data == nullptr): nothing is allocated, so a shape read from a file can be
// checked against the file's tensors first. Throws when can_quantize says no.
std::vector<std::pair<std::string, TensorView>> packed_weight_parts(QType q, int64_t out_features,
                                                                    int64_t in_features);

// Rotates w by rotation_block(K), then quantizes and packs it (SPEC §3.2-3.4). Host only.
//   w: (O, K) f32/bf16/f16 on the CPU, innermost contiguous, row stride free
PackedWeight quantize_weight(const TensorView& w, QType q, Context& ctx);

// The weight the quantized GEMM multiplies by, in fp32: code8 * scale (int8 family, with the
// group ratios folded onto the row's int8 grid), code * scale (comfy, fp8), e2m1 * block scale *
// tensor scale (convrot4). rotated_basis = false rotates back to the original basis.
//   out: (O, K) f32, innermost contiguous, on the weight's device
void dequantize_weight(const PackedWeightView& w, TensorView out, bool rotated_basis, Context& ctx);
void dequantize_weight(const PackedWeight& w, TensorView out, bool rotated_basis, Context& ctx);

// Re-quantization of the codes only, on the stored scales (QAT, SPEC §3.5): the weight is rotated,
// divided by its stored scale and rounded to nearest (the qtype's rounding) or stochastically
// (floor(z + u), u uniform [0, 1) from splitmix64: docs/linear.md). Scales are unchanged.
//   weight: (O, K) f32/bf16/f16 in the original basis, on the packed weight's device
void requantize_weight(PackedWeightView& w, const TensorView& weight, bool stochastic,
                       uint64_t seed, Context& ctx);

// ---- the layer ----------------------------------------------------------------------------------
// Owns one layer's packed weights on one device.
class QuantizedLinear {
 public:
  QuantizedLinear() = default;
  QuantizedLinear(QuantizedLinear&&) noexcept = default;
  QuantizedLinear& operator=(QuantizedLinear&&) noexcept = default;

  // Rotates and packs `weight` (O, K) f32/bf16/f16 (CPU or CUDA; a CUDA weight is quantized on
  // the host and uploaded) and keeps the result on the weight's device.
  static QuantizedLinear quantize(const TensorView& weight, QType q, Context& ctx);
  // Uploads a packed weight (from a checkpoint) to `device`.
  static QuantizedLinear from_packed(const PackedWeight& w, Device device, Context& ctx);

  QType qtype() const { return view_.qtype; }
  // convrot_fp8 on CUDA: cuBLASLt fast accumulation in the prefill GEMM (PackedWeightView::
  // fp8_fast_accum; on by default).
  void set_fp8_fast_accumulation(bool on) { view_.fp8_fast_accum = on; }
  bool fp8_fast_accumulation() const { return view_.fp8_fast_accum; }
  int rotation_block() const { return view_.rot; }
  int64_t out_features() const { return view_.out_features; }
  int64_t in_features() const { return view_.in_features; }
  Device device() const { return device_; }
  bool empty() const { return view_.codes.data == nullptr; }
  const PackedWeightView& weights() const { return view_; }
  // A host copy of the packed weight (for saving).
  PackedWeight to_packed(Context& ctx) const;

  // out = quantize(x · R) · quantize(W·R)ᵀ, epilogue acc * a_scale[row] * w_scale[col] (+ bias)
  // in fp32 in that order, stored in x's dtype.
  //   x:    (M, K) f32/bf16/f16 (f32 on the CPU only), innermost contiguous, row stride free
  //   bias: (O) f32 or x's dtype, or nullptr
  //   out:  (M, O) x's dtype, innermost contiguous, row stride free
  void forward(const TensorView& x, const TensorView* bias, TensorView out, Context& ctx) const;
  // grad_x = (grad_out · dequant(W')) · R, accumulated in fp32 or better, stored in grad_x's dtype.
  //   grad_out: (M, O) f32/bf16/f16;  grad_x: (M, K) f32/bf16/f16
  void backward_input(const TensorView& grad_out, TensorView grad_x, Context& ctx) const;
  // Re-quantizes the codes on the stored scales from a full-precision weight (O, K).
  void requantize(const TensorView& weight, bool stochastic, uint64_t seed, Context& ctx);
  // The dequantized weight back in the original basis.
  //   out: (O, K) f32 on this layer's device, innermost contiguous
  void dequantize(TensorView out, Context& ctx) const;

 private:
  // CUDA: builds view_.decode_tiles (the decode kernel's layout) where the qtype has one.
  void build_decode_tiles(Context& ctx);

  Device device_ = Device::cpu;
  std::vector<Buffer> storage_;  // one buffer per part, on device_
  Buffer decode_tiles_;          // view_.decode_tiles' storage (CUDA, 4-bit qtypes)
  PackedWeightView view_;
};

}  // namespace lowbit
