// Bit-exact scalar conversions between fp32 and the narrow formats lowbit moves.
// Usable from host and device code (CUDA kernels include this header and give the same bits).
//
// Rounding and special values (docs/formats.md restates these):
//   bf16, f16:   round to nearest even; overflow -> inf; any NaN -> the canonical NaN 0x7FFF.
//   e4m3 (fn):   round to nearest even, saturating ("satfinite"): |x| beyond 448, and +-inf,
//                become +-448; any NaN -> 0x7F.
//   e5m2:        round to nearest even, saturating: beyond 57344 and +-inf become +-57344;
//                any NaN -> 0x7F.
//   The NaN rule is the one of the GPU's conversion instructions (cvt.rn[.satfinite]), measured
//   on the H200, so kernels that use them give the same bits as this header.
//   e2m1 (fp4):  SPEC §3.4: magnitude index = number of the boundaries
//                {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} strictly below |x| (exact midpoints go
//                to the lower magnitude); values beyond 6 clamp to 6; NaN -> +0 (a quantizer
//                never feeds NaN here: it sees a non-finite scale first).
//   int8, int4:  round to nearest even, then clamp to [-128, 127] / [-8, 7]; NaN -> 0.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOWBIT_HD __host__ __device__ __forceinline__
#else
#define LOWBIT_HD inline
#endif

namespace lowbit {
namespace dt {

LOWBIT_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
LOWBIT_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Shift right by `shift` (0..31) rounding to nearest, ties to even.
LOWBIT_HD uint32_t shift_right_rne(uint32_t v, int shift) {
  if (shift <= 0) return v;
  if (shift >= 32) return 0;
  uint32_t q = v >> shift;
  uint32_t rem = v & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return q;
}

// ---- bf16 ----------------------------------------------------------------------------------
LOWBIT_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
LOWBIT_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// ---- f16 -----------------------------------------------------------------------------------
LOWBIT_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t ax = u & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fffu;
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (ax >= 0x38800000u) {                                              // normal f16
    uint32_t r = shift_right_rne(ax - 0x38000000u, 13);  // rebias 127 -> 15, round mantissa
    return static_cast<uint16_t>(sign | r);
  }
  int e = static_cast<int>(ax >> 23);
  if (e < 101) return static_cast<uint16_t>(sign);  // below 2^-26: rounds to zero
  uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  // value = mant * 2^(e-150); in units of 2^-24: mant * 2^(e-126)
  return static_cast<uint16_t>(sign | shift_right_rne(mant, 126 - e));
}
LOWBIT_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-08f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// ---- generic minifloat rounding (finite |x| given as its fp32 bits) --------------------------
// Returns the unsaturated magnitude code (exponent << M | mantissa) of the nearest-even value in
// a format with M mantissa bits and the given exponent bias (subnormals included).
template <int M, int BIAS>
LOWBIT_HD uint32_t minifloat_magnitude_code(uint32_t ax) {
  int e = static_cast<int>(ax >> 23);
  if (e == 0) return 0;  // fp32 subnormals lie far below every minifloat's smallest step
  uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  int te = e - 127 + BIAS;
  if (te >= 1) {
    uint32_t q = shift_right_rne(mant, 23 - M);  // in [2^M, 2^(M+1)], carries into exponent
    return (static_cast<uint32_t>(te) << M) + q - (1u << M);
  }
  int shift = (23 - M) + (1 - te);
  if (shift >= 25) return 0;
  return shift_right_rne(mant, shift);
}

// Saturating fp8 code of f: NaN -> 0x7f; |f| >= SAT_BITS (the fp32 bits of the format's largest
// finite value, inf included) -> +-MAX_CODE; else the nearest-even code, at most MAX_CODE.
template <int M, int BIAS, uint32_t SAT_BITS, uint32_t MAX_CODE>
LOWBIT_HD uint8_t f32_to_fp8_saturating(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t ax = u & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fu;
  if (ax >= SAT_BITS) return static_cast<uint8_t>(sign | MAX_CODE);
  uint32_t c = minifloat_magnitude_code<M, BIAS>(ax);
  if (c > MAX_CODE) c = MAX_CODE;
  return static_cast<uint8_t>(sign | c);
}

// ---- fp8 e4m3 (fn) -------------------------------------------------------------------------
// Saturates at 448 (0x43e00000), code 0x7e.
LOWBIT_HD uint8_t f32_to_e4m3(float f) {
  return f32_to_fp8_saturating<3, 7, 0x43e00000u, 0x7eu>(f);
}
LOWBIT_HD float e4m3_to_f32(uint8_t c) {
  uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  uint32_t e = (c >> 3) & 0xfu, m = c & 7u;
  if (e == 0xf && m == 7) return bits_f32(sign | 0x7fc00000u);
  if (e == 0) {
    float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

// ---- fp8 e5m2 ------------------------------------------------------------------------------
// Saturates at 57344 (0x47600000), code 0x7b.
LOWBIT_HD uint8_t f32_to_e5m2(float f) {
  return f32_to_fp8_saturating<2, 15, 0x47600000u, 0x7bu>(f);
}
LOWBIT_HD float e5m2_to_f32(uint8_t c) {
  // e5m2 is the top byte of an f16.
  return f16_to_f32(static_cast<uint16_t>(static_cast<uint16_t>(c) << 8));
}

// ---- fp4 e2m1 ------------------------------------------------------------------------------
LOWBIT_HD float e2m1_to_f32(uint8_t code) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float v = mag[code & 7u];
  return (code & 8u) ? -v : v;
}
// Code of x (SPEC §3.4 boundary rule; ties go to the lower magnitude).
LOWBIT_HD uint8_t f32_to_e2m1(float x) {
  float a = x < 0.f ? -x : x;
  uint8_t idx = 0;
  idx += a > 0.25f;
  idx += a > 0.75f;
  idx += a > 1.25f;
  idx += a > 1.75f;
  idx += a > 2.5f;
  idx += a > 3.5f;
  idx += a > 5.0f;
  uint8_t sign = (x < 0.f) ? 8u : 0u;  // NaN compares false everywhere: +0
  return static_cast<uint8_t>(idx | sign);
}

// ---- integers ------------------------------------------------------------------------------
// Round to nearest even in fp32 (exact for |x| < 2^23), NaN -> 0, then clamp.
LOWBIT_HD float rint_even(float x) {
  float a = x < 0.f ? -x : x;
  if (!(a < 8388608.f)) return x;         // already integral (or NaN/inf)
  float r = (a + 8388608.f) - 8388608.f;  // the fp32 add rounds to nearest even
  return x < 0.f ? -r : r;
}
LOWBIT_HD int32_t f32_to_int_clamped(float x, int32_t lo, int32_t hi) {
  if (x != x) return 0;
  float r = rint_even(x);
  if (r < static_cast<float>(lo)) return lo;
  if (r > static_cast<float>(hi)) return hi;
  return static_cast<int32_t>(r);
}
LOWBIT_HD int8_t f32_to_i8(float x) {
  return static_cast<int8_t>(f32_to_int_clamped(x, -128, 127));
}
LOWBIT_HD uint8_t f32_to_i4_code(float x) {
  return static_cast<uint8_t>(f32_to_int_clamped(x, -8, 7) & 0xf);
}
LOWBIT_HD int32_t i4_code_to_int(uint8_t code) {
  return (code & 8u) ? static_cast<int32_t>(code & 0xfu) - 16 : static_cast<int32_t>(code & 7u);
}

// Packed nibble access: element i of a byte array holding two 4-bit codes per byte.
LOWBIT_HD uint8_t get_nibble(const uint8_t* p, int64_t i) {
  uint8_t b = p[i >> 1];
  return (i & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
}

}  // namespace dt
}  // namespace lowbit
