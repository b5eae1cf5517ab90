// Internal interface of the ConvRot CUDA kernels (SPEC §3.5): raw pointers, one params struct per
// kernel, launchers that assume validated arguments (the front in src/core validates). Included by
// the linear_*.cu / gemm_*.cu files and by the CUDA entry points (linear_entry.cu) only.
//
// Layouts (all row-major, innermost contiguous):
//   activations x        (M, K) bf16/f16/f32, row stride x_row_stride elements
//   activation codes     int8 / int4 / e4m3: (M, K) one byte per element (int4 kept as int8 values
//                        in [-7, 7] so the int8 GEMM consumes them), row stride K bytes;
//                        nvfp4: (M, K/2) bytes, two e2m1 codes per byte, even element low nibble
//   activation scales    int8 / int4 / e4m3: (M) fp32 per token;
//                        nvfp4: (M, K/16) e4m3 bytes, linear layout (pts = 1)
//   weight codes         int8 / e4m3: (N, K) bytes; n-bit packed: (N, K/8*bits) bytes (SPEC §3.3);
//                        ternary: (N, ceil(K/5)) bytes; comfy int4: (N, K/2) signed nibbles;
//                        nvfp4: (N, K/2) e2m1 pairs + (N, K/16) e4m3 block scales + fp32 pts
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/tensor.h"

namespace lowbit {
namespace cuda {
namespace linear {

// What the fused rotate+quantize kernel writes.
enum class ActFormat : int {
  rotate_only = 0,  // the rotated values in `rotated_dtype` (hadamard_rotate, backward)
  int8 = 1,         // qmax 127, scale amax/127
  int4 = 2,         // qmax 7, scale amax/7 (comfy W4A4), stored as int8 values
  e4m3 = 3,         // scale amax/448, e4m3 codes
  nvfp4 = 4,        // per-16 e4m3 block scales (base clamped to 448, pts = 1), e2m1 codes
};

struct RotateQuantParams {
  const void* x = nullptr;   // (M, K) x_dtype, row stride x_row_stride elements
  DType x_dtype = DType::bf16;
  int64_t x_row_stride = 0;
  int64_t M = 0, K = 0;
  int rot = 256;             // 16, 64 or 256; K % rot == 0
  ActFormat fmt = ActFormat::int8;
  void* codes = nullptr;     // see the header comment; row stride codes_row_stride bytes
  int64_t codes_row_stride = 0;
  float* scales = nullptr;   // (M) fp32 (int8 / int4 / e4m3)
  uint8_t* block_scales = nullptr;  // (M, K/16) e4m3 (nvfp4), row stride K/16
  // nvfp4 (session 19): also the codes dequantized to f16 (exact), (M, K) row stride K, for the
  // NVFP4 decode GEMV (the register kernel writes them; otherwise dequant_nvfp4_16 after it).
  uint16_t* x16 = nullptr;
  // ... with each 8 columns in the order 0, 2, 4, 6, 1, 3, 5, 7 (decode_nvfp4's cvt form; the
  // register kernel only: rotate_quantize refuses it where that kernel does not run).
  bool x16_permuted = false;
  void* rotated = nullptr;   // rotate_only: (M, K) rotated_dtype, row stride rotated_row_stride
  DType rotated_dtype = DType::bf16;
  int64_t rotated_row_stride = 0;
  // The first kernel (one CTA of 256 threads per row, the row staged in shared memory) instead
  // of the register kernel; the register kernel also needs K <= 16384 and falls back past it.
  bool legacy_kernel = false;
  // Launch the register kernel with programmatic dependent launch: it may start while the
  // previous kernel in the stream runs (if that one triggered early, e.g. a decode GEMV with
  // DecodeTilesTuning::trigger) and waits (griddepcontrol.wait) for it before touching memory.
  // The legacy kernel ignores it.
  bool pdl = false;
  // Bench only (register kernel; null in the library): per CTA kRotateStampWords uint64 of
  // %globaltimer stamps by thread 0: entry, after griddepcontrol.wait, after its last row's
  // stores were issued.
  uint64_t* stamps = nullptr;
};
constexpr int kRotateStampWords = 3;
// Parameters for contiguous rows: x (M, K) x_dtype, codes (M, K) one byte per code (row stride
// K bytes), scales (M) fp32. The callers that rotate + quantize whole contiguous rows (the layer's
// decode step, the bench rows) build them here.
inline RotateQuantParams rotate_quant_rows(const void* x, DType x_dtype, int64_t M, int64_t K,
                                           ActFormat fmt, void* codes, float* scales,
                                           int rot = 256) {
  RotateQuantParams p;
  p.x = x;
  p.x_dtype = x_dtype;
  p.x_row_stride = K;
  p.M = M;
  p.K = K;
  p.rot = rot;
  p.fmt = fmt;
  p.codes = codes;
  p.codes_row_stride = K;
  p.scales = scales;
  return p;
}
// Bytes of shared memory one row needs (the rotated row is staged in fp32): K * 4.
int64_t rotate_quantize_smem_bytes(int64_t K);
// Largest K the fused kernel takes on the current device.
int64_t rotate_quantize_max_k();
// The largest K the register rotate kernel takes (the one that writes x16 itself).
int64_t rotate_quantize_reg_max_k();
void rotate_quantize(const RotateQuantParams& p, cudaStream_t stream);

// Quantized GEMM out(M, N) = epilogue(A(M, K) · B(N, K)ᵀ), both operands K-contiguous.
enum class GemmKind : int {
  s8 = 0,    // int8 x int8 -> int32 (mma.sync m16n8k32 s8)
  e4m3 = 1,  // e4m3 x e4m3 -> fp32 (mma.sync m16n8k32 e4m3)
  f16 = 2,   // f16 x f16 -> fp32 (mma.sync m16n8k16), the sm_90 NVFP4 path after dequantization
  bf16 = 3,  // bf16 x bf16 -> fp32: cuBLASLt only (gemm_cublaslt), the NVFP4 path for bf16 out
};
struct GemmParams {
  GemmKind kind = GemmKind::s8;
  const void* a = nullptr;   // (M, K) row stride lda elements
  const void* b = nullptr;   // (N, K) row stride ldb elements
  int64_t lda = 0, ldb = 0;
  int64_t M = 0, N = 0, K = 0;
  // Epilogue: out = float(acc) * a_scale[row] * w_scale[col] (+ bias[col]), fp32, that order.
  const float* a_scale = nullptr;  // (M) fp32, or null = 1 (multiplication skipped)
  const float* w_scale = nullptr;  // (N) fp32, or null = 1
  const float* w_tensor_scale = nullptr;  // (1) fp32 on the device, multiplied after w_scale
                                          // (NVFP4 weight pts), or null = 1
  const void* bias = nullptr;      // (N) bias_dtype, or null
  DType bias_dtype = DType::bf16;
  void* out = nullptr;             // (M, N) out_dtype, row stride ldo elements
  DType out_dtype = DType::bf16;
  int64_t ldo = 0;
  int32_t* acc_out = nullptr;      // s8 only: when set, the raw int32 sums (M, N) row stride ldo
  // e4m3 through cuBLASLt only: CUBLASLT_MATMUL_DESC_FAST_ACCUM (the tensor cores' partial sums
  // are not promoted to full fp32 every few k-steps; faster, slightly less accurate). The layer
  // passes PackedWeightView::fp8_fast_accum.
  bool fp8_fast_accum = false;
};
void gemm(const GemmParams& p, cudaStream_t stream);
// kind e4m3 through cuBLASLt (sm_90 wgmma kernels; outer-vector scales, BIAS epilogue), or kind
// f16 / bf16 with an output of the same type (no a_scale / w_scale; w_tensor_scale as alpha read
// on the device; session 17). Returns
// false, having launched nothing, when cuBLASLt offers no algorithm for these arguments: the
// caller then runs gemm(). workspace: gemm_cublaslt_workspace_bytes() device bytes.
// candidate: which of cuBLASLt's heuristic candidates for this shape (0 = its first choice, the
// layer's; the bench times the others); false when there are not that many.
bool gemm_cublaslt(const GemmParams& p, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream, int candidate = 0);
// How many candidates cuBLASLt offers for these arguments (0: the path does not apply).
int gemm_cublaslt_candidates(const GemmParams& p, size_t workspace_bytes);
size_t gemm_cublaslt_workspace_bytes();
// kind s8 on sm_90a through wgmma (gemm_wgmma.cu). wgmma_s8_available() says whether the current
// device runs it (sm_90 with an sm_90a kernel image; a static check, nothing runs).
bool wgmma_s8_available(cudaStream_t stream);
void gemm_wgmma_s8(const GemmParams& p, cudaStream_t stream);
// kind s8 on sm_90a through CUTLASS 3.x (gemm_cutlass_s8*.cu; compiled in when the CUTLASS
// headers were found, LOWBIT_HAVE_CUTLASS). cutlass_s8_available(): sm_90 with an sm_90a kernel
// image (a static check: nothing runs, the stream is not synchronized). cutlass_s8_fits(p): out
// bf16/f16, K, lda, ldb multiples of 16, ldo and N multiples of 8, 16-byte aligned pointers, no
// acc_out / tensor scale. gemm_cutlass_s8 (the 256 x 128 cluster 1 x 2 tile for M >= 512, else
// 128 x 256 cluster 2 x 1; 128 x 128 stream-K for bf16 output where those have fewer tiles than
// the GPU has SMs) needs cutlass_s8_scratch_bytes(p) device bytes of scratch (256-byte
// aligned) and returns false, having launched nothing, when CUTLASS refuses the arguments.
bool cutlass_s8_available(cudaStream_t stream);
bool cutlass_s8_fits(const GemmParams& p);
size_t cutlass_s8_scratch_bytes(const GemmParams& p);
bool gemm_cutlass_s8(const GemmParams& p, void* scratch, cudaStream_t stream);
// Each configuration explicitly (bench rows, harness cases; same contract as gemm_cutlass_s8):
// "wide" 128 x 256 cluster 2 x 1, "alt" 256 x 128 cluster 1 x 2.
size_t cutlass_s8_wide_scratch_bytes(const GemmParams& p);
bool gemm_cutlass_s8_wide(const GemmParams& p, void* scratch, cudaStream_t stream);
size_t cutlass_s8_alt_scratch_bytes(const GemmParams& p);
bool gemm_cutlass_s8_alt(const GemmParams& p, void* scratch, cudaStream_t stream);
// 128 x 128, stream-K scheduler, bf16 output only (gemm_cutlass_s8_sk.cu): gemm_cutlass_s8 runs
// it where the shape's own configuration has fewer output tiles than the GPU has SMs.
size_t cutlass_s8_sk_scratch_bytes(const GemmParams& p);
bool gemm_cutlass_s8_sk(const GemmParams& p, void* scratch, cudaStream_t stream);
// comfy W4A4 prefill without an unpacked weight (gemm_cutlass_s8s4.cu, session 36): int8
// activation codes (M, K) x the checkpoint's int4 codes (N, K/2 bytes, two's complement, even
// column in the low nibble) through CUTLASS's mixed-input mainloop, gemm_s8's epilogue (same
// bits as unpack_weight_int8 + gemm_cutlass_s8), bf16 or f16 output. Returns false, having
// launched nothing, where it does not apply (shape, alignment, no sm_90a image); scratch:
// cutlass_s8s4_scratch_bytes(p) device bytes (0: does not apply), 256-byte aligned.
struct WeightAGemmParams {
  const int8_t* a = nullptr;  // (M, K) activation codes, row stride lda bytes
  int64_t lda = 0;
  const uint8_t* w_codes = nullptr;  // (N, K/2) int4 / (N, K) int8 codes, row stride w_row_bytes
  int64_t w_row_bytes = 0;
  int64_t M = 0, N = 0, K = 0;
  const float* a_scale = nullptr;  // (M) or null = 1
  const float* w_scale = nullptr;  // (N) or null = 1
  const void* bias = nullptr;      // (N) bias_dtype, or null
  DType bias_dtype = DType::bf16;
  void* out = nullptr;  // (M, N) out_dtype (bf16 or f16), row stride ldo elements
  DType out_dtype = DType::bf16;
  int64_t ldo = 0;
  int64_t wide_min_m = 0;  // the 128 x 256 tile from this M (0: never)
  int64_t small_max_m = 0;  // mixed-input GEMMs: the 128 x 64 tile up to this M (0: never)
  // convrotint4 (gemm_cutlass_s8s4_lut.cu): the fold tables (K / w_lut_group, N) of 8 bytes,
  // w_lut_ld tables between groups (decode_tiles_gemm_lut); null for the other GEMMs.
  const void* w_lut = nullptr;
  int64_t w_lut_ld = 0;
  int64_t w_lut_group = 0;
};
// The int8 weight as A (gemm_cutlass_s8_t.cu, session 36; w_codes (N, K) int8, row stride
// w_row_bytes): convrot8 at few activation rows, bf16 output only; same contract as
// gemm_cutlass_s8s4.
bool cutlass_s8_t_applies(const WeightAGemmParams& p);
size_t cutlass_s8_t_scratch_bytes(const WeightAGemmParams& p);
bool gemm_cutlass_s8_t(const WeightAGemmParams& p, void* scratch, cudaStream_t stream);
// Whether gemm_cutlass_s8s4 takes p (a null `a`: codes still to be written, 16-byte aligned).
bool cutlass_s8s4_applies(const WeightAGemmParams& p);
size_t cutlass_s8s4_scratch_bytes(const WeightAGemmParams& p);
bool gemm_cutlass_s8s4(const WeightAGemmParams& p, void* scratch, cudaStream_t stream);
// convrotint4 prefill without an unpacked weight (gemm_cutlass_s8s4_lut.cu, session 37): the
// checkpoint's packed 4-bit codes (N, K/2, offset u = c + 7, even column in the low nibble)
// through CUTLASS's mixed-input mainloop with each code converted to the row's int8 grid by its
// (row, group) fold table (p.w_lut: decode_tiles_gemm_lut; group 128) in registers: the values
// unpack_weight_int8 gives, so the same bits as the unpacked path. Same contract as
// gemm_cutlass_s8s4.
bool cutlass_s8s4_lut_applies(const WeightAGemmParams& p);
size_t cutlass_s8s4_lut_scratch_bytes(const WeightAGemmParams& p);
bool gemm_cutlass_s8s4_lut(const WeightAGemmParams& p, void* scratch, cudaStream_t stream);
// NVFP4 (convrot4) prefill on sm_90 without a dequantized weight (gemm_cutlass_nvfp4_mixed.cu,
// session 37): p.a = the activations dequantized to f16 (M, K) (the rotate kernel's x16, pts 1;
// lda in elements), p.w_codes = the (N, K/2) e2m1 codes, p.a_scale null; the weight's block scales
// and its tensor scale come from its layout (nvfp4_mixed_layout_parts). f16 wgmma, fp32 sums, out
// = acc · pts + bias in bf16 / f16. Same contract as gemm_cutlass_s8s4.
// The layout (built once per weight, kept as the weight's decode_tiles): the block scales as
// (K / 64, N) words of four, then N copies of pts; 0 bytes: K % 64 != 0 (or no CUTLASS).
int64_t nvfp4_mixed_layout_bytes(int64_t N, int64_t K);
bool nvfp4_mixed_layout_build(const uint8_t* block_scales, const float* pts, int64_t N, int64_t K,
                              uint8_t* out, cudaStream_t stream);
// Sets p's w_lut, w_lut_ld, w_lut_group and w_scale (= the pts row) from a built layout.
void nvfp4_mixed_layout_parts(const uint8_t* layout, int64_t N, int64_t K, WeightAGemmParams* p);
bool cutlass_nvfp4_mixed_applies(const WeightAGemmParams& p);
size_t cutlass_nvfp4_mixed_scratch_bytes(const WeightAGemmParams& p);
bool gemm_cutlass_nvfp4_mixed(const WeightAGemmParams& p, void* scratch, cudaStream_t stream);

// The epilogue on one accumulator (the same function everywhere, so every path gives the same
// bits: the prefill GEMM, the decode kernel, and the CPU's fp32 order).
struct Epilogue {
  const float* a_scale;
  const float* w_scale;
  const float* w_tensor_scale;
  const void* bias;
  DType bias_dtype;
};

// Weight storage formats the unpack / decode kernels read.
enum class WeightFormat : int {
  int8 = 0,        // (N, K) int8 codes
  packed = 1,      // bit-packed n-bit, offset codes (SPEC §3.3), + group ratios when bits <= 7
  ternary = 2,     // base-3, 5 codes per byte, rows padded to a multiple of 5 codes, + ratios
  comfy_int4 = 3,  // (N, K/2) signed nibbles, even column in the low nibble
};
struct PackedWeightRef {
  WeightFormat format = WeightFormat::int8;
  const uint8_t* codes = nullptr;  // see WeightFormat; row stride row_bytes
  int64_t row_bytes = 0;
  int64_t N = 0, K = 0;
  int bits = 8;                    // packed: 2..8; ternary: 2; comfy: 4
  const float* ratios = nullptr;   // (N, K/group) fp32 group ratio s_g / rscale, or null (none)
  int group = 0;                   // K-group of `ratios` (a power of two, 16..128)
  int group_shift = 0;             // log2(group)
  int64_t groups_per_row = 0;      // K / group
};
// Bytes of one stored row for a format.
int64_t packed_row_bytes(WeightFormat f, int64_t K, int bits);
// Unpack to the row's int8 grid: out (N, K) int8 row stride K (SPEC §3.3 fold).
void unpack_weight_int8(const PackedWeightRef& w, int8_t* out, cudaStream_t stream);

// Decode (M <= 16): out = epilogue(int32 sum of quantized activations x unpacked weights) reading
// the packed weight codes directly; bit-identical to unpack_weight_int8 + gemm(s8).
struct DecodeParams {
  const int8_t* a = nullptr;  // (M, K) int8 activation codes, row stride lda bytes
  int64_t lda = 0;
  // Fused modes (x != null; decode_tiles only, linear_decode_tiles.cuh): the GEMV rotates +
  // quantizes x itself (into d.a / ep.a_scale when given: the cooperative rotation).
  const void* x = nullptr;    // (M, K) x_dtype, row stride x_row_stride elements
  DType x_dtype = DType::bf16;
  int64_t x_row_stride = 0;
  int rot = 256;
  int act_qmax = 127;         // 127 (int8 activations) or 7 (comfy int4)
  int64_t M = 0;              // 1..16
  PackedWeightRef w;
  Epilogue ep{};
  void* out = nullptr;        // (M, N) out_dtype, row stride ldo
  DType out_dtype = DType::bf16;
  int64_t ldo = 0;
  int32_t* acc_out = nullptr; // when set: raw int32 sums (M, N), row stride ldo
  // The weight's decode-tile layout (linear_decode_tiles.cuh, decode_tiles_build of w), or null:
  // when set and decode_tiles_applies, decode_gemv runs the tiled kernel on it.
  const uint8_t* tiles = nullptr;
  // Streaming kernel: one CTA per 8 output columns (the round-1 grid) instead of the resident
  // grid; for A/B bench rows, same bits.
  bool one_tile_per_cta = false;
  // Bench only (decode_tiles; null in the library): per CTA, kTilesStampWords uint64 of phase
  // stamps (linear_decode_tiles.cuh), for the timeline of a stream of layers.
  uint64_t* stamps = nullptr;
  // convrotfp8 (session 17): `a` and w.codes hold e4m3 bytes (w.format int8: one byte per
  // weight, row_bytes K); the sums are the tensor cores' fp32 ones, not exact integers (the
  // layer's fp8 tolerance). Only the ring kernel takes it (decode_ring_applies); no acc_out.
  bool e4m3 = false;
  // decode_tiles with the codes in a, 8 < M <= 16: clusters of `cluster` CTAs (2 or 4; 0: none)
  // copy the activation rows as multicast bulk copies (DecodeTilesTuning::act_mcast).
  int cluster = 0;
};
// Sets d's epilogue and output for contiguous rows (the bench rows build their DecodeParams
// beside rotate_quant_rows' parameters): w_scale (N) fp32, bias (N) bias_dtype or null, out
// (M, N) out_dtype with row stride d.w.N (set d.w first).
inline void decode_epilogue(DecodeParams& d, const float* w_scale, const void* bias,
                            DType bias_dtype, void* out, DType out_dtype) {
  d.ep.w_scale = w_scale;
  d.ep.bias = bias;
  d.ep.bias_dtype = bias_dtype;
  d.out = out;
  d.out_dtype = out_dtype;
  d.ldo = d.w.N;
}
void decode_gemv(const DecodeParams& p, cudaStream_t stream);

// NVFP4 decode GEMV (M <= 16, sm_89+; linear_decode_nvfp4.cu): out = epilogue(x16 · W(N, K)ᵀ)
// with W the packed e2m1 codes (N, K/2) times their e4m3 block scales (N, K/16) read directly;
// fp32 sums of the tensor cores (the NVFP4 tolerance). x16: the activation rows (M, K) in f16,
// contiguous. ep: a_scale / w_scale null, w_tensor_scale = the weight's pts, bias.
struct Nvfp4DecodeParams {
  const uint16_t* x16 = nullptr;  // (M, K) f16 bits
  int64_t M = 0, N = 0, K = 0;
  const uint8_t* w_codes = nullptr;
  const uint8_t* w_scales = nullptr;
  Epilogue ep{};
  void* out = nullptr;            // (M, N) out_dtype, row stride ldo
  DType out_dtype = DType::bf16;
  int64_t ldo = 0;
};
// Whether decode_nvfp4 takes p on the current device: M <= 16, K a multiple of 64, 8-byte aligned
// codes, 16-byte aligned x16, bf16 / f16 / f32 out, compute capability 8.9 or newer.
bool decode_nvfp4_applies(const Nvfp4DecodeParams& p);
// Assumes decode_nvfp4_applies(p) (the layer asks first). depth: 64-column steps whose loads are
// in flight per warp (a register ring): 4, or 1 (the first form: load, then multiply).
// slots: 4 or 2 = the cp.async ring kernel (session 18) with that many shared-memory slots per
// warp (depth unused), 0 = the register ring; x_ahead: the ring kernel loads the next step's
// activation values while the current one multiplies (session 19).
// cvt (session 19): the codes through e4m3 (step_mma_cvt), which reads x16 with each 8 columns
// in the order 0, 2, 4, 6, 1, 3, 5, 7 (RotateQuantParams::x16_permuted); needs slots 4, x_ahead
// off and decode_nvfp4_ring_applies. tiles (session 20; 1 or, with cvt, 2): 16-row weight tiles
// per CTA sharing each warp's activation loads.
void decode_nvfp4(const Nvfp4DecodeParams& p, cudaStream_t stream, int depth = 4, int slots = 4,
                  bool x_ahead = false, bool cvt = false, int tiles = 1);
// Whether the cp.async ring kernel takes p's pointers (16-byte aligned codes, 4-byte scales);
// decode_nvfp4 runs the register ring where not.
bool decode_nvfp4_ring_applies(const Nvfp4DecodeParams& p);

// NVFP4 -> f16 or bf16 (out_dtype; exact either way: every e2m1 x e4m3 product is such a value).
// codes (R, C/2), scales (R, C/16) e4m3 linear; out (R, C) row stride C. The per-tensor scale is
// not applied.
void dequant_nvfp4_16(const uint8_t* codes, const uint8_t* scales, int64_t R, int64_t C,
                      uint16_t* out, DType out_dtype, cudaStream_t stream);

// Dequantize int8-grid weights to fp32: out[n, k] = code8[n, k] * row_scale[n] (backward).
// codes (N, K) int8 (already unpacked), row_scale (N) fp32; out (N, K) fp32.
void dequant_int8_f32(const int8_t* codes, const float* row_scale, int64_t N, int64_t K,
                      float* out, cudaStream_t stream);
// e4m3 codes (N, K) * row_scale -> fp32; NVFP4: e2m1 * (block scale * pts[0]) -> fp32.
void dequant_e4m3_f32(const uint8_t* codes, const float* row_scale, int64_t N, int64_t K,
                      float* out, cudaStream_t stream);
void dequant_nvfp4_f32(const uint8_t* codes, const uint8_t* scales, const float* pts, int64_t N,
                       int64_t K, float* out, cudaStream_t stream);

// Re-quantization on stored scales (QAT, SPEC §3.5; docs/linear.md): z = w_rot / S with S the
// stored scale of the element (S = 1 when !(S > 0)); nearest: the qtype's rounding; stochastic:
// floor(z + u) for integer codes, the upper grid neighbour with probability (|z| - lo) / (hi - lo)
// for e4m3 / e2m1; u = uniform01(seed, n * K + k) (splitmix64). Rewrites the stored codes only.
enum class RequantFormat : int { int8 = 0, packed = 1, ternary = 2, comfy_int4 = 3, e4m3 = 4,
                                 nvfp4 = 5 };
struct RequantParams {
  const float* w_rot = nullptr;  // (N, K) fp32, rotated, contiguous
  int64_t N = 0, K = 0;
  RequantFormat format = RequantFormat::int8;
  int bits = 8;                  // packed / ternary (2) / comfy (4)
  int qmax = 127;
  const float* scales = nullptr; // (N) fp32 row scales (not nvfp4)
  const float* ratios = nullptr; // (N, K/group) fp32 or null
  int64_t group = 0;
  const uint8_t* block_scales = nullptr;  // nvfp4: (N, K/16) e4m3
  const float* tensor_scale = nullptr;    // nvfp4: (1) fp32
  bool stochastic = false;
  uint64_t seed = 0;
  uint8_t* codes = nullptr;      // the stored codes, row stride row_bytes
  int64_t row_bytes = 0;
};
void requantize_codes(const RequantParams& p, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
