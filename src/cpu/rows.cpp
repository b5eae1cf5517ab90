// Row kernels shared by the CPU backends (rows.h).
#include "src/cpu/rows.h"

#include <array>
#include <cmath>
#include <cstring>

#include "lowbit/dtype.h"
#include "src/core/convert_elem.h"
#include "src/cpu/cpu_clones.h"
#include "src/cpu/exp2_kernel.h"
#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {
namespace rows {
namespace {

bool g_force_scalar = false;
bool g_force_avx2 = false;
bool g_force_no_bf16 = false;

// rows::exp2's constants (exp2_kernel.h)
constexpr const float (&kExp2C)[7] = exp2_kernel::kC;
constexpr float kExp2Lo = exp2_kernel::kLo, kExp2Hi = exp2_kernel::kHi,
                kRoundInt = exp2_kernel::kRoundInt;

// (x86-64-v3 clone: std::fma as one instruction; the baseline build calls libm's fmaf, seven
// calls a value, which the CPU attention's per-tile rescale factors paid.)
LOWBIT_CLONES_FMA float exp2_scalar(float x) {
  if (x != x) return x;
  const float c = x < kExp2Lo ? kExp2Lo : (x > kExp2Hi ? kExp2Hi : x);
  const float r = (c + kRoundInt) - kRoundInt;
  const float f = c - r;  // exact, |f| <= 1/2
  float p = kExp2C[6];
  for (int i = 5; i >= 0; --i) p = std::fma(p, f, kExp2C[i]);
  p = std::fma(p, f, 1.f);
  const int k = static_cast<int>(r), k1 = k >> 1, k2 = k - k1;  // both in [-75, 64]
  float s1, s2;
  const uint32_t b1 = static_cast<uint32_t>(k1 + 127) << 23, b2 = static_cast<uint32_t>(k2 + 127)
                                                                   << 23;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  return (p * s1) * s2;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOWBIT_HAVE_X86_PATHS 1
#define LOWBIT_AVX2_F16C __attribute__((target("avx2,f16c")))
// The vector loops convert whole groups of 8 and return how many they did; the callers finish
// the rest with dt's scalar conversion.
// 8 f16 -> f32 (exact; F16C quiets a signalling NaN, so NaN and inf lanes take their bits
// from the integer form sign | 0x7f800000 | m << 13, as dt::f16_to_f32).
LOWBIT_AVX2_F16C int64_t load_f16_avx2(const uint16_t* s, int64_t K, float* dst) {
  const __m256i e_mask = _mm256_set1_epi32(0x7c00), m_mask = _mm256_set1_epi32(0x3ff);
  const __m256i s_mask = _mm256_set1_epi32(0x8000), inf = _mm256_set1_epi32(0x7f800000);
  int64_t i = 0;
  for (; i + 8 <= K; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m256i h32 = _mm256_cvtepu16_epi32(h);
    const __m256i special =
        _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(h32, s_mask), 16), inf),
                        _mm256_slli_epi32(_mm256_and_si256(h32, m_mask), 13));
    const __m256i is_special = _mm256_cmpeq_epi32(_mm256_and_si256(h32, e_mask), e_mask);
    const __m256i v =
        _mm256_blendv_epi8(_mm256_castps_si256(_mm256_cvtph_ps(h)), special, is_special);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), v);
  }
  return i;
}
// 8 f32 -> f16 (the RNE conversion instruction: overflow to inf from 65520, subnormals; NaN
// lanes -> 0x7fff, as dt::f32_to_f16).
LOWBIT_AVX2_F16C int64_t store_f16_avx2(const float* src, int64_t K, uint16_t* d) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  int64_t i = 0;
  for (; i + 8 <= K; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(x), abs_mask), inf);
    const __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_blendv_epi8(h, _mm_set1_epi16(0x7fff), nan16));
  }
  return i;
}
// 8 f32 -> bf16 (RNE on the bits; NaN -> 0x7fff, as dt::f32_to_bf16).
LOWBIT_AVX2_F16C int64_t store_bf16_avx2(const float* src, int64_t K, uint16_t* d) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i nan_code = _mm256_set1_epi32(0x7fff);
  int64_t i = 0;
  for (; i + 8 <= K; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(half, lsb)), 16);
    r = _mm256_blendv_epi8(r, nan_code, _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf));
    // (values <= 0xffff: the unsigned pack keeps them; lanes 0-3 | 4-7 in order)
    const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), p);
  }
  return i;
}
bool has_f16c_path() {
  static const bool has = __builtin_cpu_supports("avx2") && has_f16c();
  return has && !g_force_scalar;
}

// 8 f32 -> e4m3 of x / divisor (dt::f32_to_e4m3 of the quotient), branch-free on the
// quotient's bits: |z| < 2^-6 rounds |z| 2^9 (exact) to the nearest-even integer, the subnormal
// code (8 = 2^-6 when it rounds up); from 2^-6 the magnitude's low 20 bits round to nearest-even
// into bit 20, carries included, and the exponent is rebased (127 - 7) << 3; |z| >= 448 (inf
// too) -> 0x7e; the sign bit on top; NaN -> 0x7f without its sign.
LOWBIT_AVX2 int64_t store_e4m3_avx2(const float* src, int64_t n, float divisor, uint8_t* d) {
  const __m256 vs = _mm256_set1_ps(divisor), k512 = _mm256_set1_ps(512.f);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), one = _mm256_set1_epi32(1);
  const __m256i half = _mm256_set1_epi32(0x7ffff), rebase = _mm256_set1_epi32(120 << 3);
  const __m256i min_normal = _mm256_set1_epi32(0x3c800000 - 1);  // 2^-6, less one for cmpgt
  const __m256i sat = _mm256_set1_epi32(0x43e00000 - 1), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i max_code = _mm256_set1_epi32(0x7e), nan_code = _mm256_set1_epi32(0x7f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 z = _mm256_div_ps(_mm256_loadu_ps(src + i), vs);
    const __m256i u = _mm256_castps_si256(z);
    const __m256i ax = _mm256_and_si256(u, abs_mask);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    // normal: (ax + 0x7ffff + bit 20) >> 20, rebased
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(ax, 20), one);
    const __m256i rn = _mm256_add_epi32(ax, _mm256_add_epi32(half, lsb));
    const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(rn, 20), rebase);
    // subnormal: rne(|z| 2^9)
    const __m256 az = _mm256_castsi256_ps(ax);
    const __m256i sub = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(az, k512), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i c = _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(ax, min_normal));
    c = _mm256_blendv_epi8(c, max_code, _mm256_cmpgt_epi32(ax, sat));
    c = _mm256_or_si256(c, sign);
    c = _mm256_blendv_epi8(c, nan_code, _mm256_cmpgt_epi32(ax, inf));
    // (codes <= 0xff: the packs keep them; lanes 0-3 | 4-7 in order)
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(d + i), _mm_packus_epi16(p16, p16));
  }
  return i;
}
bool has_avx2_path() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !g_force_scalar;
}

// rows::exp2, 8 at a time: exp2_scalar's operations lane by lane (the clamp by min / max, a NaN
// lane restored at the end).
__attribute__((target("avx2,fma"))) int64_t exp2_avx2(const float* x, int64_t n, float* out) {
  const __m256 lo = _mm256_set1_ps(kExp2Lo), hi = _mm256_set1_ps(kExp2Hi);
  const __m256 magic = _mm256_set1_ps(kRoundInt), one = _mm256_set1_ps(1.f);
  const __m256i bias = _mm256_set1_epi32(127);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 c = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m256 r = _mm256_sub_ps(_mm256_add_ps(c, magic), magic);
    const __m256 f = _mm256_sub_ps(c, r);
    __m256 p = _mm256_set1_ps(kExp2C[6]);
    for (int j = 5; j >= 0; --j) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C[j]));
    p = _mm256_fmadd_ps(p, f, one);
    const __m256i k = _mm256_cvttps_epi32(r);
    const __m256i k1 = _mm256_srai_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(y, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  return i;
}
// The AVX-512 forms (avx512_on()): the same operations as the AVX2 loops above, 16 lanes.
LOWBIT_AVX512 inline __m512i e4m3_codes_avx512(__m512 z) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i half = _mm512_set1_epi32(0x7ffff), rebase = _mm512_set1_epi32(120 << 3);
  const __m512i u = _mm512_castps_si512(z), ax = _mm512_and_si512(u, abs_mask);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(ax, 20), one);
  const __m512i rn = _mm512_add_epi32(ax, _mm512_add_epi32(half, lsb));
  const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(rn, 20), rebase);
  const __m512 az = _mm512_castsi512_ps(ax);
  const __m512i sub = _mm512_cvtps_epi32(_mm512_roundscale_ps(
      _mm512_mul_ps(az, _mm512_set1_ps(512.f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m512i c = _mm512_mask_blend_epi32(
      _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x3c800000 - 1)), sub, normal);
  c = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x43e00000 - 1)), c,
                              _mm512_set1_epi32(0x7e));
  c = _mm512_or_si512(c, sign);
  return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x7f800000)), c,
                                 _mm512_set1_epi32(0x7f));
}
// 16 f16 -> f32: load_f16_avx2's rule (NaN and inf lanes from the integer form).
LOWBIT_AVX512 int64_t load_f16_avx512(const uint16_t* s, int64_t K, float* dst) {
  const __m512i e_mask = _mm512_set1_epi32(0x7c00), m_mask = _mm512_set1_epi32(0x3ff);
  const __m512i s_mask = _mm512_set1_epi32(0x8000), inf = _mm512_set1_epi32(0x7f800000);
  int64_t i = 0;
  for (; i + 16 <= K; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m512i h32 = _mm512_cvtepu16_epi32(h);
    const __m512i special =
        _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(h32, s_mask), 16), inf),
                        _mm512_slli_epi32(_mm512_and_si512(h32, m_mask), 13));
    const __mmask16 is_special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(h32, e_mask), e_mask);
    _mm512_storeu_si512(dst + i, _mm512_mask_blend_epi32(
                                     is_special, _mm512_castps_si512(_mm512_cvtph_ps(h)), special));
  }
  return i;
}
LOWBIT_AVX512 int64_t store_e4m3_avx512(const float* src, int64_t n, float divisor, uint8_t* d) {
  const __m512 vs = _mm512_set1_ps(divisor);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i c = e4m3_codes_avx512(_mm512_div_ps(_mm512_loadu_ps(src + i), vs));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm512_cvtepi32_epi8(c));
  }
  return i;
}
// round_e4m3, 16 at a time: the values of e4m3_codes_avx512's codes (the table's entries)
// formed in place, no gather: normals |x| >= 2^-6 keep 3 mantissa bits of the same
// round-to-nearest-even sum, subnormals are the rounded multiple of 2^-9, |x| >= 448 (inf too)
// saturates to 448, all with x's sign; NaN gives code 0x7f's positive quiet NaN.
LOWBIT_AVX512 int64_t round_e4m3_avx512(const float* src, int64_t n, float* dst) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i half = _mm512_set1_epi32(0x7ffff), keep = _mm512_set1_epi32(~0xfffff);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __m512i ax = _mm512_and_si512(u, abs_mask), sign = _mm512_andnot_si512(abs_mask, u);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(ax, 20), one);
    const __m512i normal =
        _mm512_and_si512(_mm512_add_epi32(ax, _mm512_add_epi32(half, lsb)), keep);
    const __m512 sub = _mm512_mul_ps(
        _mm512_roundscale_ps(_mm512_mul_ps(_mm512_castsi512_ps(ax), _mm512_set1_ps(512.f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        _mm512_set1_ps(1.f / 512.f));
    __m512i m =
        _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x3c800000 - 1)),
                                _mm512_castps_si512(sub), normal);
    m = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x43e00000 - 1)), m,
                                _mm512_set1_epi32(0x43e00000));
    m = _mm512_or_si512(m, sign);
    m = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x7f800000)), m,
                                _mm512_set1_epi32(0x7fc00000));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(m));
  }
  return i;
}
// round_bf16, 16 at a time: dt::f32_to_bf16's sum (round to nearest even on the bits) with the
// low half cleared, NaN -> 0x7fff's value.
LOWBIT_AVX512 int64_t round_bf16_avx512(const float* src, int64_t n, float* dst) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i half = _mm512_set1_epi32(0x7fff), keep = _mm512_set1_epi32(~0xffff);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(half, lsb)), keep);
    r = _mm512_mask_blend_epi32(
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), _mm512_set1_epi32(0x7f800000)), r,
        _mm512_set1_epi32(0x7fff0000));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(r));
  }
  return i;
}
LOWBIT_AVX512 int64_t exp2_avx512(const float* x, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, exp2_kernel::exp2_16(_mm512_loadu_ps(x + i)));
  return i;
}
bool has_avx2_fma_path() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !g_force_scalar;
}
#endif

}  // namespace

void f16_to_f32(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
#ifdef LOWBIT_HAVE_X86_PATHS
  if (avx512_on())
    i = load_f16_avx512(src, n, dst);
  else if (has_f16c_path())
    i = load_f16_avx2(src, n, dst);
#endif
  for (; i < n; ++i) dst[i] = dt::f16_to_f32(src[i]);
}

void f32_to_f16(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
#ifdef LOWBIT_HAVE_X86_PATHS
  if (has_f16c_path()) i = store_f16_avx2(src, n, dst);
#endif
  for (; i < n; ++i) dst[i] = dt::f32_to_f16(src[i]);
}

// (a clone per SIMD level: the loop vectorizes as a widening shift)
LOWBIT_CLONES void bf16_to_f32(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = dt::bf16_to_f32(src[i]);
}

void f32_to_bf16(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
#ifdef LOWBIT_HAVE_X86_PATHS
  if (has_f16c_path()) i = store_bf16_avx2(src, n, dst);
#endif
  for (; i < n; ++i) dst[i] = dt::f32_to_bf16(src[i]);
}

void f32_to_e4m3(const float* src, int64_t n, float divisor, uint8_t* dst) {
  int64_t i = 0;
#ifdef LOWBIT_HAVE_X86_PATHS
  if (avx512_on())
    i = store_e4m3_avx512(src, n, divisor, dst);
  else if (has_avx2_path())
    i = store_e4m3_avx2(src, n, divisor, dst);
#endif
  for (; i < n; ++i) dst[i] = dt::f32_to_e4m3(src[i] / divisor);
}

void round_e4m3(const float* src, int64_t n, float* dst) {
  const float* table = e4m3_table();
  int64_t i = 0;
#ifdef LOWBIT_HAVE_X86_PATHS
  if (avx512_on()) i = round_e4m3_avx512(src, n, dst);
#endif
  for (; i < n; ++i) dst[i] = table[dt::f32_to_e4m3(src[i])];
}

void round_bf16(const float* src, int64_t n, float* dst) {
  int64_t i = 0;
#ifdef LOWBIT_HAVE_X86_PATHS
  if (avx512_on()) i = round_bf16_avx512(src, n, dst);
#endif
  for (; i < n; ++i) dst[i] = dt::bf16_to_f32(dt::f32_to_bf16(src[i]));
}

void exp2(const float* x, int64_t n, float* out) {
  int64_t i = 0;
#ifdef LOWBIT_HAVE_X86_PATHS
  if (avx512_on())
    i = exp2_avx512(x, n, out);
  else if (has_avx2_fma_path())
    i = exp2_avx2(x, n, out);
#endif
  for (; i < n; ++i) out[i] = exp2_scalar(x[i]);
}

float exp2(float x) { return exp2_scalar(x); }

LOWBIT_CLONES void add_scaled(float* o, float p, const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] += p * v[i];
}

const float* e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = dt::e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

void load(const void* base, int64_t off, DType dt, int64_t n, float* out) {
  switch (dt) {
    case DType::f32:
      std::memcpy(out, static_cast<const float*>(base) + off, static_cast<size_t>(n) * 4);
      return;
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base) + off, n, out);
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(base) + off, n, out);
    case DType::e4m3: {
      const float* table = e4m3_table();
      const uint8_t* p = static_cast<const uint8_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) out[i] = table[p[i]];
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = load_f32(base, off + i, dt);
  }
}

void store(const float* src, int64_t n, DType dt, void* base, int64_t off) {
  switch (dt) {
    case DType::f32: {
      float* d = static_cast<float*>(base) + off;
      if (d != src) std::memmove(d, src, static_cast<size_t>(n) * 4);
      return;
    }
    case DType::f16: return f32_to_f16(src, n, static_cast<uint16_t*>(base) + off);
    case DType::bf16: return f32_to_bf16(src, n, static_cast<uint16_t*>(base) + off);
    case DType::e4m3:
      return f32_to_e4m3(src, n, 1.f, static_cast<uint8_t*>(base) + off);
    default:
      for (int64_t i = 0; i < n; ++i) store_f32(base, off + i, dt, src[i]);
  }
}

void force_scalar(bool on) { g_force_scalar = on; }
void force_avx2(bool on) { g_force_avx2 = on; }
void force_no_bf16(bool on) { g_force_no_bf16 = on; }

bool avx2_on() {
#ifdef LOWBIT_HAVE_X86_PATHS
  return has_avx2_path();
#else
  return false;
#endif
}
bool avx2_fma_on() {
#ifdef LOWBIT_HAVE_X86_PATHS
  return has_avx2_fma_path();
#else
  return false;
#endif
}
bool avx512_on() {
#ifdef LOWBIT_HAVE_X86_PATHS
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");
  return has && !g_force_scalar && !g_force_avx2;
#else
  return false;
#endif
}
bool avx512_bf16_on() {
#ifdef LOWBIT_HAVE_X86_PATHS
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has && avx512_on() && !g_force_no_bf16;
#else
  return false;
#endif
}

}  // namespace rows
}  // namespace cpu
}  // namespace lowbit
