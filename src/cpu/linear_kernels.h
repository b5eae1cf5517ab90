// Row kernels of the CPU ConvRot backend (docs/linear.md fixes every rounding and summation
// order). Each kernel works on one row of K elements; src/cpu/linear.cpp threads them over rows.
// Internal to src/cpu; the unit tests include it to check the format rules one by one.
#pragma once

#include <cstdint>

#include "lowbit/linear.h"
#include "src/cpu/cpu_clones.h"

namespace lowbit {
namespace cpu {
namespace convrot {

// ---- scalar rules shared by every kernel
// --------------------------------------------------------- Round half to even in fp32, branch-free
// (exact for every finite float; NaN stays NaN).
inline float rne(float x) {
  float a = x < 0.f ? -x : x;
  float r = (a + 8388608.f) - 8388608.f;
  r = a < 8388608.f ? r : a;
  return x < 0.f ? -r : r;
}
// clamp(rne(x), -qmax, qmax), NaN -> 0.
inline float round_clamp(float x, float qmax) {
  float r = rne(x);
  r = r > qmax ? qmax : r;
  r = r < -qmax ? -qmax : r;
  return r == r ? r : 0.f;
}
// The 16-lane summation order of docs/linear.md: lane l sums elements i = l (mod 16) in order,
// then lanes combine as a tree (h = 8, 4, 2, 1).
inline float tree16(float* lane) {
  for (int h = 8; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) lane[l] += lane[l + h];
  return lane[0];
}
// splitmix64: the i-th (0-based) output of the generator started at `seed`, as u in [0, 1).
inline float uniform01(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * 5.9604644775390625e-08f;  // 2^-24
}
// Flat index of scale (r, c) of an (R, C) scale matrix in the cuBLAS 128x4 swizzled layout.
inline int64_t swizzle_index(int64_t r, int64_t c, int64_t C) {
  int64_t cb = (C + 3) / 4;
  int64_t t = (r / 128) * cb + c / 4;
  return ((t * 32 + r % 32) * 4 + (r % 128) / 32) * 4 + c % 4;
}

// The quantizers run AVX2 primitives when the CPU has them (same bits as the scalar loops);
// tests force the scalar build to prove the two agree.
bool simd_kernels_available();
void force_scalar_kernels(bool on);

// ---- rotation --------------------------------------------------------------------------------
// y = x · R_rot on each block of `rot` elements of a K-row (y may equal x). rot in {16, 64, 256}.
void rotate_row(const float* x, float* y, int64_t K, int rot);
// (Rows in and out of f32: rows::load / rows::store, src/cpu/rows.h.)

// ---- weight quantizers (rotated fp32 rows) -----------------------------------------------------
// Per-row symmetric: scale = amax / qmax (0 -> 1), codes = round_clamp(w / scale, qmax).
float quantize_row_int(const float* w, int64_t K, int qmax, int8_t* codes);
// One NVFP4 block's codes: packed8[l / 2] holds dt::f32_to_e2m1(clamp(w[l] / den, -6, 6)) of
// l and l + 1 (the even element in the low nibble), l < 16.
void nvfp4_codes(const float* w, float den, uint8_t* packed8);
// codes[i] = dt::f32_to_e4m3(w[i] / s), i < n (rows::f32_to_e4m3, src/cpu/rows.h).
void e4m3_codes(const float* w, int64_t n, float s, uint8_t* codes);
// Per-row e4m3: scale = amax / 448 (0 -> 1), codes = e4m3(w / scale).
float quantize_row_fp8(const float* w, int64_t K, uint8_t* codes);
// MSE-optimal scale of one group of g (multiple of 16) elements (SPEC §3.3); writes the codes.
float mse_group_quantize(const float* w, int64_t g, int qmax, int8_t* codes);
// Row fold: rscale from the group scales, ratios written (n_groups).
float fold_group_scales(const float* gscales, int64_t n_groups, int qmax, float* ratios);
// code8 of a grouped code (fp32: clamp(rne(code * ratio), -127, 127)).
inline int8_t fold_code(int code, float ratio) {
  return static_cast<int8_t>(round_clamp(static_cast<float>(code) * ratio, 127.f));
}
// codes[i] = fold_code(codes[i], ratio), i < n (AVX2 where the CPU has it: the same bits).
void fold_codes(int8_t* codes, int64_t n, float ratio);
// Whether the AVX2 kernels run (the CPU has AVX2 and force_scalar_kernels is off).
bool simd_kernels_on();
// Tests: keep the int8-code GEMM on its AVX2 kernel where the CPU has AVX-512 VNNI (the same
// bits), so both vector paths can be compared with the scalar loops on one machine.
void force_avx2_kernels(bool on);
bool avx2_kernels_forced();
// NVFP4 weight blocks of one row: MSE-optimal e4m3 block scales (SPEC §3.4) and the codes.
//   w (K), scales_out (K/16) e4m3, packed_out (K/2) e2m1 pairs.
void quantize_row_nvfp4_weight(const float* w, int64_t K, float pts, uint8_t* scales_out,
                               uint8_t* packed_out);
// NVFP4 activation blocks of one row (pts = 1, base clamped to 448, no sweep).
void quantize_row_nvfp4_act(const float* x, int64_t K, uint8_t* scales_out, uint8_t* packed_out);

// ---- packing ------------------------------------------------------------------------------------
// SPEC §3.3: codes in [-qmax, qmax], stored u = c + qmax, 8 codes per `bits` bytes (K % 8 == 0).
void pack_bits(const int8_t* codes, int64_t K, int bits, uint8_t* out);
void unpack_bits(const uint8_t* in, int64_t K, int bits, int8_t* codes);
// Base 3, 5 codes per byte, u = c + 1, weights 1, 3, 9, 27, 81; padding digits are 0.
void pack_ternary(const int8_t* codes, int64_t K, uint8_t* out);
void unpack_ternary(const uint8_t* in, int64_t K, int8_t* codes);
// Two 4-bit nibbles per byte, even element in the low nibble (signed int4 or e2m1 codes).
void pack_nibbles(const uint8_t* nibbles, int64_t K, uint8_t* out);
inline int8_t signed_nibble(uint8_t v) {
  return static_cast<int8_t>((v & 8u) ? static_cast<int>(v & 15u) - 16 : static_cast<int>(v & 7u));
}

// ---- packed rows --------------------------------------------------------------------------------
// Quantizes rotated row o of the weight into every part of `w` (all qtypes but convrot4, which
// needs the per-tensor scale first and uses quantize_row_nvfp4_weight).
//   w: a view of a PackedWeight being filled (its parts are written through the view).
void quantize_weight_row(const float* w_rot, int64_t o, const PackedWeightView& w);
// The integer codes the GEMM multiplies for row o (int8 family: code8; comfy: int4 codes).
void weight_row_gemm_codes(const PackedWeightView& w, int64_t o, int8_t* codes);
// Row o of dequant(W') in fp32 (rotated basis).
void dequantize_weight_row(const PackedWeightView& w, int64_t o, float* out);
// Rewrites row o's codes from the rotated fp32 row on the stored scales.
void requantize_weight_row(const PackedWeightView& w, int64_t o, const float* w_rot,
                           bool stochastic, uint64_t seed);

}  // namespace convrot
}  // namespace cpu
}  // namespace lowbit
