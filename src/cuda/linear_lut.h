// Index math of the streaming decode kernel's 4-bit table lookup (linear_decode.cu), host- and
// device-compilable so a CPU unit test (tests/unit/linear_lut_test.cpp) replays it against the
// CPU oracle's unpacking (SPEC §3.3). No CUDA headers: plain C++ on the host.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOWBIT_LUT_HD __host__ __device__ __forceinline__
#else
#define LOWBIT_LUT_HD inline
#endif

namespace lowbit {
namespace cuda {
namespace linear {

// prmt.b32 / __byte_perm with the semantics the CUDA math API documents (and nvcc optimizes
// by): result byte b = byte (selector nibble b & 7) of {y, x} (x bytes 0..3, y bytes 4..7).
// Callers keep every selector nibble <= 7, where the hardware's sign-replicate mode is off.
LOWBIT_LUT_HD uint32_t lut_prmt(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t xy = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int b = 0; b < 4; ++b) {
    const int sel = static_cast<int>((s >> (4 * b)) & 7u);
    r |= static_cast<uint32_t>((xy >> (8 * sel)) & 0xffu) << (8 * b);
  }
  return r;
#endif
}

// Byte b (b = 0..3) of the result is entry (nibble b of sel16) of a 16-byte table held in
// lut[0..3] (entry e in byte e % 4 of lut[e / 4]); bits above 16 of sel16 are ignored.
LOWBIT_LUT_HD uint32_t lut4(uint32_t sel16, const uint32_t lut[4]) {
  const uint32_t idx = sel16 & 0x7777u;
  const uint32_t lo = lut_prmt(lut[0], lut[1], idx);  // entries 0..7
  const uint32_t hi = lut_prmt(lut[2], lut[3], idx);  // entries 8..15
  // Byte b from lo (selector b) or, when bit 3 of nibble b is set, from hi (selector 4 + b).
  const uint32_t pick = 0x3210u | ((sel16 >> 1) & 0x4444u);
  return lut_prmt(lo, hi, pick);
}

// Comfy int4's table: the nibble read as a two's-complement int4 (entries 0..7 -> 0..7,
// 8..15 -> -8..-1), as bytes.
LOWBIT_LUT_HD void comfy_lut(uint32_t lut[4]) {
  lut[0] = 0x03020100u, lut[1] = 0x07060504u, lut[2] = 0xfbfaf9f8u, lut[3] = 0xfffefdfcu;
}

// The 8 int8-grid codes of one 32-bit word of 4-bit codes (nibble j = column j, SPEC §3.3 and
// comfy's low-nibble-first bytes): b0 = columns 0..3, b1 = columns 4..7, byte order = column order.
LOWBIT_LUT_HD void lut_word(uint32_t word, const uint32_t lut[4], uint32_t* b0, uint32_t* b1) {
  *b0 = lut4(word, lut);
  *b1 = lut4(word >> 16, lut);
}

// ---- NVFP4 (session 17): e2m1 codes (bit 3 the sign, bits 0-2 the magnitude m) ----

// fp32 bits of an e2m1 code: m = 0 / 1 -> 0 / 0.5, else 2^((m >> 1) - 1) * (1 + (m & 1) / 2),
// the sign in bit 31: dt::e2m1_to_f32's values without its table (a dynamically indexed local
// array, which the GPU keeps in local memory).
LOWBIT_LUT_HD uint32_t e2m1_f32_bits(uint32_t code) {
  const uint32_t m = code & 7u;
  const uint32_t mag = m == 0u   ? 0u
                       : m == 1u ? 0x3f000000u
                                 : ((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
  return mag | ((code & 8u) << 28);
}

// The f16x2 pairs of the four e2m1 codes of `two_bytes` (bits 0-15; nibble j = column j): *h01 =
// columns 0, 1, *h23 = columns 2, 3. Every e2m1 value's f16 has a zero low byte (0, 0.5, 1, 1.5,
// 2, 3, 4, 6 -> 0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46, sign bit 0x80): the high bytes of
// the four codes from one 16-entry lut4 lookup, then two prmts spread them over zero low bytes
// (5 prmt + 2 logic ops per 4 codes; the pair form of session 17 took 2 x 7).
LOWBIT_LUT_HD void e2m1x4_f16x2(uint32_t two_bytes, uint32_t* h01, uint32_t* h23) {
  const uint32_t lut[4] = {0x3e3c3800u, 0x46444240u, 0xbebcb880u, 0xc6c4c2c0u};
  const uint32_t hb = lut4(two_bytes & 0xffffu, lut);  // byte j: the high byte of code j
  *h01 = lut_prmt(hb, 0u, 0x1404u);                    // 0, hb0, 0, hb1
  *h23 = lut_prmt(hb, 0u, 0x3424u);                    // 0, hb2, 0, hb3
}

// The eight e2m1 codes of `word` (nibble j = column j) as e4m3 bytes of value code x 2^-6
// (exact: the code's exponent bits land on the e4m3 exponent's low two bits, its mantissa bit on
// the top mantissa bit, the sign on the sign; code 1 = 0.5 becomes the subnormal 2^-7): *even =
// columns 0, 2, 4, 6 (byte j = column 2 j), *odd = columns 1, 3, 5, 7. 7 integer ops; a cvt of
// each 16-bit half then gives f16x2 pairs (columns 0, 2), (4, 6), (1, 3), (5, 7) (session 19).
LOWBIT_LUT_HD void e2m1x8_e4m3(uint32_t word, uint32_t* even, uint32_t* odd) {
  *even = ((word << 2) & 0x1c1c1c1cu) | ((word << 4) & 0x80808080u);
  *odd = ((word >> 2) & 0x1c1c1c1cu) | (word & 0x80808080u);
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
