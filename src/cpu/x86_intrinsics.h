// <immintrin.h> for the CPU backend's vector loops (x86-64 with GCC or Clang; elsewhere nothing),
// and the AVX-512 loops' tail mask.
// GCC 12's AVX-512 intrinsics initialize their pass-through operand from _mm512_undefined_*(),
// which -Wmaybe-uninitialized reports inside the header once inlined (GCC bug 105593, fixed in
// GCC 13); the warnings' location is the header, so they are silenced around its inclusion.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <cpuid.h>

#include <cstdint>

namespace lowbit {
namespace cpu {
// F16C (CPUID leaf 1, ECX bit 29) read directly: Clang before 16 rejects "f16c" in
// __builtin_cpu_supports. Callers pair it with an AVX2 check, which covers the OS's AVX state.
inline bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
// The byte mask of the first min(n, 64) lanes of a 64-byte vector (a row's tail, n >= 0).
inline __mmask64 tail_mask(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }
// The same for the first min(n, 16) lanes of a 16-lane vector (floats or dwords).
inline __mmask16 tail_mask16(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1);
}
// The (wrapping) sum of a vector's eight int32 lanes, on AVX2.
__attribute__((target("avx2"))) inline int32_t sum_lanes8(__m256i v) {
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1));
  return _mm_cvtsi128_si32(q);
}
// round_clamp on 8 lanes: round half to even, NaN -> +0, clamp to [nqmax, qmax] (fp32).
__attribute__((target("avx2"))) inline __m256 round_clamp8(__m256 x, __m256 qmax, __m256 nqmax) {
  __m256 r = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm256_and_ps(r, _mm256_cmp_ps(x, x, _CMP_ORD_Q));
  r = _mm256_min_ps(r, qmax);
  return _mm256_max_ps(r, nqmax);
}
// out[c] = column c of the 16 x 16 dwords r[0..15] (r[i][c] -> out[c][i]): dword pairs, qword
// pairs, then a 4 x 4 transpose of the 128-bit lanes (AVX-512 F; the VNNI GEMM's packing, the
// CPU attention's fp8 V staging).
__attribute__((target("avx512f"))) inline void transpose16_epi32(const __m512i (&r)[16],
                                                                 __m512i (&out)[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int a = 0; a < 8; ++a) {
    t[2 * a] = _mm512_unpacklo_epi32(r[2 * a], r[2 * a + 1]);
    t[2 * a + 1] = _mm512_unpackhi_epi32(r[2 * a], r[2 * a + 1]);
  }
#pragma GCC unroll 4
  for (int a = 0; a < 4; ++a) {  // u[4a + c] lane L: rows 4a .. 4a + 3 of column 4L + c
    u[4 * a] = _mm512_unpacklo_epi64(t[4 * a], t[4 * a + 2]);
    u[4 * a + 1] = _mm512_unpackhi_epi64(t[4 * a], t[4 * a + 2]);
    u[4 * a + 2] = _mm512_unpacklo_epi64(t[4 * a + 1], t[4 * a + 3]);
    u[4 * a + 3] = _mm512_unpackhi_epi64(t[4 * a + 1], t[4 * a + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    out[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    out[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}
}  // namespace cpu
}  // namespace lowbit
#endif
