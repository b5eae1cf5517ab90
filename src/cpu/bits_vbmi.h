// Bit-packed n-bit weight rows on AVX-512 VBMI (2 <= n <= 7, SPEC §3.3), shared by the unpack of
// linear_kernels.cpp and the decode GEMV of linear_gemv.cpp: the raw fields of 64 codes a step,
// and a group's fold table (every stored value's int8 GEMM code) built in registers; the digits
// of ternary rows.
#pragma once

#include "src/cpu/x86_intrinsics.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "src/cpu/linear_kernels.h"

#define LOWBIT_BITS_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))

namespace lowbit {
namespace cpu {
namespace convrot {
namespace bits {

// 8 codes are one n-byte little-endian word, so vpermb puts word g's n bytes into qword g (idx)
// and vpmultishiftqb takes code j's 8 bits from bit j n of it (ctrl; j n + 8 <= 64), masked to n
// bits; a step loads 8 n bytes.
struct Fields {
  __m512i idx, ctrl, mask;
  __mmask64 bytes;
  int bits;
};
// The index vectors of Fields and FoldIndex for each width, built once (plain bytes).
struct Layout {
  alignas(64) uint8_t idx[64], ctrl[64];  // Fields
  alignas(64) uint8_t fold[128];          // FoldIndex::idx0, idx1
  uint64_t neg[2];                        // FoldIndex::neg0, neg1
};
// Byte of code c (< 64) after packs_epi16(packs_epi32(q0, q1), packs_epi32(q2, q3)), q_p holding
// codes 16 p .. 16 p + 15 (fold_tables).
inline int packed_byte(int c) { return 16 * ((c % 16) / 4) + 4 * (c / 16) + c % 4; }
inline Layout make_layout(int bits) {
  Layout l{};
  for (int g = 0; g < 8; ++g)
    for (int j = 0; j < 8; ++j) {
      l.idx[g * 8 + j] = static_cast<uint8_t>(g * bits + std::min(j, bits - 1));
      l.ctrl[g * 8 + j] = static_cast<uint8_t>(j * bits);
    }
  const int qmax = (1 << (bits - 1)) - 1;
  for (int u = 0; u < std::max(64, 1 << bits); ++u) {  // (n <= 6: entry u mod 2^n)
    const int c = u % (1 << bits) - qmax, a = c < 0 ? -c : c;
    l.fold[u] = static_cast<uint8_t>(a < 64 ? packed_byte(a) : 0);  // (c = 64: set apart)
    if (c < 0) l.neg[u / 64] |= uint64_t{1} << (u % 64);
  }
  return l;
}
inline const Layout& layout(int bits) {
  static const struct All {
    Layout l[8];
    All() {
      for (int b = 2; b <= 7; ++b) l[b] = make_layout(b);
    }
  } all;
  return all.l[bits];
}
LOWBIT_BITS_VBMI inline Fields fields(int bits) {
  const Layout& l = layout(bits);
  return {_mm512_load_si512(l.idx), _mm512_load_si512(l.ctrl),
          _mm512_set1_epi8(static_cast<char>((1 << bits) - 1)), (__mmask64{1} << (8 * bits)) - 1,
          bits};
}
// The n-bit fields of codes i .. i + 63 (i a multiple of 8) of the row at in, each with the next
// fields' low bits above it (bits n.. of each byte): the index of a lookup that reads only the
// low 6 (vpermb) or 7 (vpermi2b) bits of each byte in a table repeating every 2^n entries, as
// fold_tables builds them.
LOWBIT_BITS_VBMI inline __attribute__((always_inline)) __m512i raw_high(const Fields& f,
                                                                        const uint8_t* in,
                                                                        int64_t i) {
  const __m512i words =
      _mm512_permutexvar_epi8(f.idx, _mm512_maskz_loadu_epi8(f.bytes, in + (i >> 3) * f.bits));
  return _mm512_multishift_epi64_epi8(f.ctrl, words);
}
// The raw n-bit fields alone (0 .. 2^n - 1).
LOWBIT_BITS_VBMI inline __attribute__((always_inline)) __m512i raw(const Fields& f,
                                                                   const uint8_t* in, int64_t i) {
  return _mm512_and_si512(raw_high(f, in, i), f.mask);
}

// A group's fold table: entry u (u < 2^n) = fold_code(u - qmax, ratio) + bias (mod 256), entries
// 0..63 in t0, 64..127 in t1 (n = 7; else t1 = t0, the 2^n entries repeated over its 64 bytes).
// fold_code is odd in the code (round half to even and the clamp are symmetric, c r is exact
// under negation), so only the codes 0 .. qmax + 1 are computed: 16 lanes a piece as clamp(c r)
// converted with round-to-nearest-even, the pieces narrowed by two packs (saturation never acts:
// |value| <= 127), then placed and negated by one vpermb and one masked subtraction per table.
// A non-finite ratio (NaN products) takes the scalar rule per entry.
struct FoldIndex {
  __m512i idx0, idx1;    // entry u's byte in the packed positive codes
  __mmask64 neg0, neg1;  // entries whose code is negative
};
LOWBIT_BITS_VBMI inline FoldIndex fold_index(int bits) {
  const Layout& l = layout(bits);
  return {_mm512_load_si512(l.fold), _mm512_load_si512(l.fold + 64), l.neg[0], l.neg[1]};
}
// The scalar rule for every entry (out of line: the GEMV's loop keeps its registers).
__attribute__((noinline)) inline void fold_table_scalar(int bits, float ratio, uint8_t bias,
                                                        uint8_t* t) {
  const int entries = 1 << bits, qmax = (1 << (bits - 1)) - 1;
  for (int u = 0; u < std::max(64, entries); ++u)
    t[u] = static_cast<uint8_t>(static_cast<uint8_t>(fold_code(u % entries - qmax, ratio)) + bias);
}
// (always inlined: a call inside the GEMV's loop would spill its accumulators, every vector
// register being caller-saved)
template <int kBits>
LOWBIT_BITS_VBMI inline __attribute__((always_inline)) void fold_tables(const FoldIndex& x,
                                                                        float ratio, uint8_t bias,
                                                                        __m512i& t0, __m512i& t1) {
  constexpr int kQmax = (1 << (kBits - 1)) - 1;
  constexpr int kPieces = kQmax + 1 >= 64 ? 4 : (kQmax + 1) / 16 + 1;  // codes 0 .. qmax + 1
  const __m512i b = _mm512_set1_epi8(static_cast<char>(bias));
  if (!std::isfinite(ratio)) {
    alignas(64) uint8_t t[128];
    fold_table_scalar(kBits, ratio, bias, t);
    t0 = _mm512_load_si512(t);
    t1 = kBits == 7 ? _mm512_load_si512(t + 64) : t0;
    return;
  }
  const __m512 r = _mm512_set1_ps(ratio), hi = _mm512_set1_ps(127.f), lo = _mm512_set1_ps(-127.f);
  // |c r| <= 127 for every code c <= qmax + 1 = 2^(n-1) (a power of two: the test is exact)
  // needs no clamp.
  const bool clamp = !(std::fabs(ratio) * static_cast<float>(kQmax + 1) <= 127.f);
  __m512i q[4];
  for (int p = 0; p < 4; ++p) {
    if (p >= kPieces) {
      q[p] = _mm512_setzero_si512();
      continue;
    }
    const float c0 = 16.f * static_cast<float>(p);
    const __m512 c = _mm512_setr_ps(c0, c0 + 1.f, c0 + 2.f, c0 + 3.f, c0 + 4.f, c0 + 5.f, c0 + 6.f,
                                    c0 + 7.f, c0 + 8.f, c0 + 9.f, c0 + 10.f, c0 + 11.f, c0 + 12.f,
                                    c0 + 13.f, c0 + 14.f, c0 + 15.f);
    __m512 y = _mm512_mul_ps(c, r);
    if (clamp) y = _mm512_max_ps(_mm512_min_ps(y, hi), lo);
    q[p] = _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  const __m512i pos =
      _mm512_packs_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3]));
  const __m512i zero = _mm512_setzero_si512();
  __m512i v = _mm512_permutexvar_epi8(x.idx0, pos);
  t0 = _mm512_add_epi8(_mm512_mask_sub_epi8(v, x.neg0, zero, v), b);
  if (kBits < 7) {
    t1 = t0;
    return;
  }
  v = _mm512_permutexvar_epi8(x.idx1, pos);
  v = _mm512_mask_sub_epi8(v, x.neg1, zero, v);
  // u = 127: the code 64, past the pieces (the same arithmetic on one lane).
  const __m128 y64 =
      _mm_max_ss(_mm_min_ss(_mm_set_ss(64.f * ratio), _mm_set_ss(127.f)), _mm_set_ss(-127.f));
  const int c64 = _mm_cvt_roundss_si32(y64, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  v = _mm512_mask_set1_epi8(v, __mmask64{1} << 63, static_cast<char>(c64));
  t1 = _mm512_add_epi8(v, b);
}
// The same with the width known at run time (2..7).
LOWBIT_BITS_VBMI inline void fold_tables(int bits, const FoldIndex& x, float ratio, uint8_t bias,
                                         __m512i& t0, __m512i& t1) {
  switch (bits) {
    case 2:
      return fold_tables<2>(x, ratio, bias, t0, t1);
    case 3:
      return fold_tables<3>(x, ratio, bias, t0, t1);
    case 4:
      return fold_tables<4>(x, ratio, bias, t0, t1);
    case 5:
      return fold_tables<5>(x, ratio, bias, t0, t1);
    case 6:
      return fold_tables<6>(x, ratio, bias, t0, t1);
    default:
      return fold_tables<7>(x, ratio, bias, t0, t1);
  }
}

// ---- ternary rows (base 3, five codes a byte, SPEC §3.3) ----
// Digit j of every byte b (floor(b / 3^j) mod 3, which is unpack_ternary's digit for all 256
// bytes) as 256-entry tables, four vectors a digit.
struct TernaryDigits {
  alignas(64) uint8_t t[5][256];
  TernaryDigits() {
    for (int j = 0, p = 1; j < 5; ++j, p *= 3)
      for (int b = 0; b < 256; ++b) t[j][b] = static_cast<uint8_t>(b / p % 3);
  }
};
inline const TernaryDigits& ternary_digits() {
  static const TernaryDigits d;
  return d;
}
// Digit j (0..2) of each byte of b, whose top bits are `high` (vpermi2b on the low 7 bits in
// each half of the table, the half picked by the top bit).
LOWBIT_BITS_VBMI inline __attribute__((always_inline)) __m512i ternary_digit(const uint8_t* t,
                                                                             __m512i b,
                                                                             __mmask64 high) {
  return _mm512_mask_blend_epi8(
      high, _mm512_permutex2var_epi8(_mm512_load_si512(t), b, _mm512_load_si512(t + 64)),
      _mm512_permutex2var_epi8(_mm512_load_si512(t + 128), b, _mm512_load_si512(t + 192)));
}

}  // namespace bits
}  // namespace convrot
}  // namespace cpu
}  // namespace lowbit
#endif
