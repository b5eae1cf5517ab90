// Row kernels shared by the CPU backends. Rows of 16-bit floats to and from f32: AVX2 + F16C
// where the CPU has them, else scalar loops; the bits of dt::f16_to_f32 / dt::f32_to_f16 /
// dt::f32_to_bf16 either way (NaN in: its payload; NaN out: 0x7fff). Rows of f32 to e4m3: AVX2
// where the CPU has it, else a scalar loop; the bits of dt::f32_to_e4m3 either way.
#pragma once

#include <cstdint>

#include "lowbit/tensor.h"

namespace lowbit {
namespace cpu {
namespace rows {

void f16_to_f32(const uint16_t* src, int64_t n, float* dst);
void f32_to_f16(const float* src, int64_t n, uint16_t* dst);
void f32_to_bf16(const float* src, int64_t n, uint16_t* dst);
void bf16_to_f32(const uint16_t* src, int64_t n, float* dst);
// dst[i] = dt::f32_to_e4m3(src[i] / divisor), i < n: one rounded fp32 division, then round to
// nearest even, saturating (|z| >= 448 and +-inf -> +-448, 0x7e | sign), any NaN -> 0x7f (no
// sign), |z| <= 2^-10 (-0 too) -> 0x00 | sign. Divisor 1 is store_f32's e4m3 (x / 1 = x for every
// float; a NaN stays a NaN). The quantizers' encoder (convrot::e4m3_codes) and rows::store's.
void f32_to_e4m3(const float* src, int64_t n, float divisor, uint8_t* dst);
// dst[i] = the value of e4m3 code f32_to_e4m3(src[i]) (divisor 1), i < n: x rounded to e4m3 and
// back (NaN -> the NaN of code 0x7f). An AVX-512 loop where avx512_on(), the same bits.
void round_e4m3(const float* src, int64_t n, float* dst);
// dst[i] = x rounded to bf16 and back (dt::f32_to_bf16: NaN -> 0x7fff's NaN), i < n; in place
// allowed. An AVX-512 loop where avx512_on(), the same bits.
void round_bf16(const float* src, int64_t n, float* dst);
// o[i] += p * v[i], i < n: one rounded product, one rounded sum per element (no contraction; a
// vectorized clone where the CPU has AVX2, the same bits).
void add_scaled(float* o, float p, const float* v, int64_t n);
// out[i] = 2^x[i], i < n, within 2 ulp of the exact power (normal results; subnormal ones within
// 2^-149): x clamped to [-150, 128], x = k + f with k the nearest integer (ties even), 2^f by the
// degree-7 Taylor polynomial of e^(f ln 2) in Horner form with fused multiply-adds, times 2^k in
// two exact power-of-two steps (the second rounds a subnormal once); integers give 2^k exactly,
// NaN stays NaN, -inf gives 0, +inf (or x >= 128) gives inf. AVX2 + FMA where the CPU has them,
// else the same operations in scalar code (std::fma): the same bits either way. (The attention
// oracle's P = 2^(s - m); Highway 1.0's math library has no exp2, and exp(x ln 2) would add up to
// ~7 ulp over P's range.)
void exp2(const float* x, int64_t n, float* out);
float exp2(float x);
// The 256 values of e4m3 (dt::e4m3_to_f32 of every code), for per-element decodes.
const float* e4m3_table();
// A row of n elements of dtype dt at element offset off of base, as f32: load_f32's bits
// (src/core/convert_elem.h), the dtype dispatched once per row (f16 by the kernel above, e4m3 by
// the table). Non-packed dtypes.
void load(const void* base, int64_t off, DType dt, int64_t n, float* out);
// store_f32 of src[i] at element offset off + i of base, i < n (f32 may be in place; f16, bf16
// and e4m3 (divisor 1) by the kernels above). Non-packed dtypes.
void store(const float* src, int64_t n, DType dt, void* base, int64_t off);
// Tests: force the scalar loops (to compare the two).
void force_scalar(bool on);
// Whether the AVX2 row kernels run (the CPU has AVX2 and force_scalar is off); other CPU files'
// AVX2 loops follow it so that force_scalar tests their scalar twins too.
bool avx2_on();
// The same with FMA too (the AVX2 + FMA loops: exp2 here, the decode oracle's dots).
bool avx2_fma_on();
// Whether the AVX-512 (F, BW, VNNI) loops run: the CPU has them, force_scalar is off and
// force_avx2 is off (the attention oracle's q . k dots and P·V).
bool avx512_on();
// Tests: keep the AVX-512 loops off (the AVX2 twins run), to compare the two.
void force_avx2(bool on);
// Whether the AVX-512 BF16 loops run: avx512_on() and the CPU has AVX512_BF16 (vdpbf16ps: per
// 32-bit lane acc = fma(a_odd, b_odd, acc), then fma(a_even, b_even, that), round to nearest
// even, bf16 denormals read as 0 and denormal results flushed), and force_no_bf16 is off (the
// attention oracle's P·V: fp8 mode, and 16-bit mode with bf16 V where no value is denormal).
bool avx512_bf16_on();
// Tests: keep the AVX-512 BF16 loops off (the AVX-512 F loops run), to compare the two.
void force_no_bf16(bool on);

}  // namespace rows
}  // namespace cpu
}  // namespace lowbit
