// Row kernels of the CPU ConvRot backend: rotation, quantizers, packing (docs/linear.md).
// Hot loops are written so GCC vectorizes them; LOWBIT_CLONES builds an AVX2 copy next to the
// baseline one (picked at load time). Vectorization never changes the bits: every reduction
// follows the fixed lane order of docs/linear.md and no FMA is formed (ISO C++ mode, and the
// avx2 clone target does not include FMA).
#include "src/cpu/linear_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "lowbit/dtype.h"
#include "src/core/convert_elem.h"
#include "src/cpu/bits_vbmi.h"
#include "src/cpu/rows.h"
#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {
namespace convrot {

// ---- rotation
// ------------------------------------------------------------------------------------
namespace {

struct RotTables {
  float sign[256];    // d[i] = (-1)^(number of base-4 digits equal to 3)
  int16_t perm[256];  // p(j): the two bits of every base-4 digit swapped
  float scale;        // 2^-k
  alignas(64) int32_t lanes[16];  // perm[l] % 16, l < 16: the AVX-512 build's lane permutation
};

RotTables make_tables(int n) {
  RotTables t{};
  int k = 0;
  for (int m = n; m > 1; m /= 4) ++k;
  for (int i = 0; i < n; ++i) {
    int threes = 0, p = 0;
    for (int d = 0; d < k; ++d) {
      int digit = (i >> (2 * d)) & 3;
      threes += digit == 3;
      int swapped = ((digit & 1) << 1) | (digit >> 1);
      p |= swapped << (2 * d);
    }
    t.sign[i] = (threes & 1) ? -1.f : 1.f;
    t.perm[i] = static_cast<int16_t>(p);
  }
  t.scale = std::ldexp(1.f, -k);
  for (int l = 0; l < 16 && l < n; ++l) t.lanes[l] = t.perm[l] & 15;
  return t;
}

const RotTables& tables(int n) {
  static const RotTables t16 = make_tables(16), t64 = make_tables(64), t256 = make_tables(256);
  return n == 16 ? t16 : n == 64 ? t64 : t256;
}

}  // namespace

namespace {

void rotate_block_scalar(const float* xb, float* yb, int rot, const RotTables& tb) {
  float t[256];
  for (int i = 0; i < rot; ++i) t[i] = xb[i] * tb.sign[i];
  // Butterfly stages h = 1, 2, 4, ...: (a, b) -> (a + b, a - b).
  for (int h = 1; h < rot; h *= 2)
    for (int i = 0; i < rot; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        float a = t[j], c = t[j + h];
        t[j] = a + c;
        t[j + h] = a - c;
      }
  for (int j = 0; j < rot; ++j) yb[j] = tb.sign[j] * t[tb.perm[j]] * tb.scale;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The same butterflies on 8-lane registers: stages 1, 2, 4 inside a register (partner lane by a
// permute; the lower element of each pair takes a + b, the upper a - b, as in the scalar loop),
// stages 8.. between registers. Same operations on the same operands: the same bits.
__attribute__((target("avx2"))) void rotate_block_avx2(const float* xb, float* yb, int rot,
                                                       const RotTables& tb) {
  alignas(32) float t[256];
  for (int i = 0; i < rot; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + i), _mm256_loadu_ps(tb.sign + i));
    __m256 sw = _mm256_permute_ps(v, 0xB1);  // h = 1: lanes [1, 0, 3, 2, ...]
    v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xAA);
    sw = _mm256_permute_ps(v, 0x4E);  // h = 2: lanes [2, 3, 0, 1, ...]
    v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xCC);
    sw = _mm256_permute2f128_ps(v, v, 1);  // h = 4: swap the 128-bit halves
    v = _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xF0);
    _mm256_store_ps(t + i, v);
  }
  for (int h = 8; h < rot; h *= 2)
    for (int i = 0; i < rot; i += 2 * h)
      for (int j = i; j < i + h; j += 8) {
        __m256 a = _mm256_load_ps(t + j), c = _mm256_load_ps(t + j + h);
        _mm256_store_ps(t + j, _mm256_add_ps(a, c));
        _mm256_store_ps(t + j + h, _mm256_sub_ps(a, c));
      }
  const __m256 scale = _mm256_set1_ps(tb.scale);
  for (int j = 0; j < rot; j += 8) {
    __m256i idx =
        _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.perm + j)));
    __m256 g = _mm256_i32gather_ps(t, idx, 4);
    _mm256_storeu_ps(yb + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(tb.sign + j), g), scale));
  }
}

// The same butterflies on 16-lane registers (NREG = rot / 16 of them): stages 1, 2, 4, 8 inside a
// register, the others between registers; the output permutation (each base-4 digit's two bits
// swapped) is a fixed permutation of the 16 lanes (the digits in bits 0-3) applied to the
// register whose index has its own digits swapped (bits 4-7): one vpermps a register, no gather.
template <int NREG>
__attribute__((target("avx512f"))) void rotate_block_avx512(const float* xb, float* yb,
                                                            const RotTables& tb) {
  __m512 v[NREG];
  for (int r = 0; r < NREG; ++r) {
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(xb + 16 * r), _mm512_loadu_ps(tb.sign + 16 * r));
    t = _mm512_mask_blend_ps(0xAAAA, _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1)),
                             _mm512_sub_ps(_mm512_permute_ps(t, 0xB1), t));  // h = 1
    t = _mm512_mask_blend_ps(0xCCCC, _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E)),
                             _mm512_sub_ps(_mm512_permute_ps(t, 0x4E), t));  // h = 2
    __m512 sw = _mm512_shuffle_f32x4(t, t, 0xB1);                            // h = 4
    t = _mm512_mask_blend_ps(0xF0F0, _mm512_add_ps(t, sw), _mm512_sub_ps(sw, t));
    sw = _mm512_shuffle_f32x4(t, t, 0x4E);  // h = 8
    v[r] = _mm512_mask_blend_ps(0xFF00, _mm512_add_ps(t, sw), _mm512_sub_ps(sw, t));
  }
  for (int h = 1; h < NREG; h *= 2)  // h = 16, 32, ... elements: whole registers
    for (int i = 0; i < NREG; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const __m512 a = v[j], c = v[j + h];
        v[j] = _mm512_add_ps(a, c);
        v[j + h] = _mm512_sub_ps(a, c);
      }
  const __m512i idx = _mm512_load_si512(tb.lanes);
  const __m512 scale = _mm512_set1_ps(tb.scale);
  for (int r = 0; r < NREG; ++r) {
    const __m512 g = _mm512_permutexvar_ps(idx, v[tb.perm[16 * r] >> 4]);
    _mm512_storeu_ps(yb + 16 * r,
                     _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(tb.sign + 16 * r), g), scale));
  }
}
#endif

bool g_force_scalar_rotation = false;

}  // namespace

void rotate_row(const float* x, float* y, int64_t K, int rot) {
  const RotTables& tb = tables(rot);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has_avx512 = __builtin_cpu_supports("avx512f");
  if (has_avx512 && !g_force_scalar_rotation && !avx2_kernels_forced()) {
    for (int64_t b = 0; b < K; b += rot) {
      if (rot == 16)
        rotate_block_avx512<1>(x + b, y + b, tb);
      else if (rot == 64)
        rotate_block_avx512<4>(x + b, y + b, tb);
      else
        rotate_block_avx512<16>(x + b, y + b, tb);
    }
    return;
  }
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (has_avx2 && !g_force_scalar_rotation) {
    for (int64_t b = 0; b < K; b += rot) rotate_block_avx2(x + b, y + b, rot, tb);
    return;
  }
#endif
  for (int64_t b = 0; b < K; b += rot) rotate_block_scalar(x + b, y + b, rot, tb);
}

// ---- quantizers -------------------------------------------------------------------------------
// The hot primitives come in two builds with the same bits: plain scalar loops, and AVX2 (8 lanes;
// the 16-lane sum order of docs/linear.md is two registers: lanes 0-7 and 8-15). The AVX2 build
// uses only IEEE add/sub/mul/div, compares and the RNE round instruction, never FMA.
namespace {

// max |x| with NaN sticky (a NaN anywhere gives NaN).
inline float amax_scalar(const float* x, int64_t n) {
  float m = 0.f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    m = a > m ? a : m;
    nan |= a != a;
  }
  return nan ? NAN : m;
}

void codes_scalar(const float* w, int64_t n, float s, float qmax, int8_t* codes) {
  for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<int8_t>(round_clamp(w[i] / s, qmax));
}

// Σ (w - round_clamp(w / s)·s)² in the 16-lane order.
float group_error_scalar(const float* w, int64_t g, float s, float qmax) {
  float lane[16] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t i = 0; i < g; i += 16)
    for (int l = 0; l < 16; ++l) {
      float q = round_clamp(w[i + l] / s, qmax);
      float d = w[i + l] - q * s;
      lane[l] += d * d;
    }
  return tree16(lane);
}

// num = Σ w·q, den = Σ q·q with q = round_clamp(w / s), 16-lane order.
void refit_scalar(const float* w, int64_t g, float s, float qmax, float* num, float* den) {
  float ln[16] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  float ld[16] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t i = 0; i < g; i += 16)
    for (int l = 0; l < 16; ++l) {
      float cq = round_clamp(w[i + l] / s, qmax);
      ln[l] += w[i + l] * cq;
      ld[l] += cq * cq;
    }
  *num = tree16(ln);
  *den = tree16(ld);
}

inline float clamp6(float z) {
  z = z > 6.f ? 6.f : z;
  return z < -6.f ? -6.f : z;
}

// The e2m1 codes of clamp(w / den) for a block of 16, two per byte (even element low).
void nvfp4_codes_scalar(const float* w, float den, uint8_t* packed8) {
  for (int l = 0; l < 16; l += 2) {
    uint8_t lo = dt::f32_to_e2m1(clamp6(w[l] / den));
    uint8_t hi = dt::f32_to_e2m1(clamp6(w[l + 1] / den));
    packed8[l / 2] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// Σ (w - e2m1(clamp(w/den))·den)² over a block of 16 in the lane-tree order.
float nvfp4_error_scalar(const float* w, float den) {
  float lane[16];
  for (int l = 0; l < 16; ++l) {
    float z = clamp6(w[l] / den);
    float d = w[l] - dt::e2m1_to_f32(dt::f32_to_e2m1(z)) * den;
    lane[l] = d * d;
  }
  return tree16(lane);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOWBIT_HAVE_AVX2_PATH 1

LOWBIT_AVX2 inline __m256 abs8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), x); }
// The docs/linear.md tree over lanes a[0..7] (0-7) and b[0..7] (8-15).
LOWBIT_AVX2 inline float tree16_8x2(__m256 a, __m256 b) {
  __m256 t = _mm256_add_ps(a, b);                                                 // h = 8
  __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));  // h = 4
  __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                  // h = 2
  __m128 w = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));                              // h = 1
  return _mm_cvtss_f32(w);
}

LOWBIT_AVX2 float amax_avx2(const float* x, int64_t n) {
  __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    m = _mm256_max_ps(m, abs8(v));  // NaN in v: max returns v's lane (2nd operand)... tracked below
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = 0.f;
  for (int l = 0; l < 8; ++l) r = lanes[l] > r ? lanes[l] : r;
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  for (; i < n; ++i) {
    float a = std::fabs(x[i]);
    r = a > r ? a : r;
    any_nan |= a != a;
  }
  return any_nan ? NAN : r;
}

LOWBIT_AVX2 void codes_avx2(const float* w, int64_t n, float s, float qmax, int8_t* codes) {
  const __m256 vs = _mm256_set1_ps(s), vq = _mm256_set1_ps(qmax), vnq = _mm256_set1_ps(-qmax);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r = round_clamp8(_mm256_div_ps(_mm256_loadu_ps(w + i), vs), vq, vnq);
    __m256i i32 = _mm256_cvtps_epi32(r);
    __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packs_epi16(p16, p16));
  }
  codes_scalar(w + i, n - i, s, qmax, codes + i);
}

LOWBIT_AVX2 float group_error_avx2(const float* w, int64_t g, float s, float qmax) {
  const __m256 vs = _mm256_set1_ps(s), vq = _mm256_set1_ps(qmax), vnq = _mm256_set1_ps(-qmax);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < g; i += 16) {
    __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
    __m256 q0 = round_clamp8(_mm256_div_ps(w0, vs), vq, vnq);
    __m256 q1 = round_clamp8(_mm256_div_ps(w1, vs), vq, vnq);
    __m256 d0 = _mm256_sub_ps(w0, _mm256_mul_ps(q0, vs));
    __m256 d1 = _mm256_sub_ps(w1, _mm256_mul_ps(q1, vs));
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(d0, d0));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(d1, d1));
  }
  return tree16_8x2(a0, a1);
}

LOWBIT_AVX2 void refit_avx2(const float* w, int64_t g, float s, float qmax, float* num,
                            float* den) {
  const __m256 vs = _mm256_set1_ps(s), vq = _mm256_set1_ps(qmax), vnq = _mm256_set1_ps(-qmax);
  __m256 n0 = _mm256_setzero_ps(), n1 = _mm256_setzero_ps();
  __m256 d0 = _mm256_setzero_ps(), d1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < g; i += 16) {
    __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
    __m256 q0 = round_clamp8(_mm256_div_ps(w0, vs), vq, vnq);
    __m256 q1 = round_clamp8(_mm256_div_ps(w1, vs), vq, vnq);
    n0 = _mm256_add_ps(n0, _mm256_mul_ps(w0, q0));
    n1 = _mm256_add_ps(n1, _mm256_mul_ps(w1, q1));
    d0 = _mm256_add_ps(d0, _mm256_mul_ps(q0, q0));
    d1 = _mm256_add_ps(d1, _mm256_mul_ps(q1, q1));
  }
  *num = tree16_8x2(n0, n1);
  *den = tree16_8x2(d0, d1);
}

// e2m1 value of clamp(w / den) (the SPEC §3.4 boundary count), 8 lanes.
LOWBIT_AVX2 inline __m256 e2m1_value8(__m256 w, __m256 den) {
  const __m256 six = _mm256_set1_ps(6.f), nsix = _mm256_set1_ps(-6.f);
  __m256 z = _mm256_div_ps(w, den);
  z = _mm256_max_ps(nsix, z);  // NaN z stays NaN (max/min return the 2nd operand on NaN)
  z = _mm256_min_ps(six, z);
  __m256 a = abs8(z);
  __m256i idx = _mm256_setzero_si256();
  const float bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (float b : bounds)
    idx =
        _mm256_sub_epi32(idx, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(b), _CMP_GT_OQ)));
  const __m256 mags = _mm256_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  __m256 v = _mm256_permutevar8x32_ps(mags, idx);
  __m256 neg =
      _mm256_and_ps(_mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ), _mm256_set1_ps(-0.f));
  return _mm256_xor_ps(v, neg);
}

// The e2m1 codes (magnitude index | sign << 3, the SPEC §3.4 boundary count) of clamp(w / den)
// for a block of 16, two per byte, the even element in the low nibble: nvfp4_codes_scalar's.
LOWBIT_AVX2 void nvfp4_codes_avx2(const float* w, float den, uint8_t* packed8) {
  const __m256 vd = _mm256_set1_ps(den), six = _mm256_set1_ps(6.f), nsix = _mm256_set1_ps(-6.f);
  const float bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int h = 0; h < 2; ++h) {
    __m256 z = _mm256_div_ps(_mm256_loadu_ps(w + 8 * h), vd);
    z = _mm256_min_ps(six, _mm256_max_ps(nsix, z));  // NaN z stays NaN (2nd operand)
    const __m256 a = abs8(z);
    __m256i c = _mm256_setzero_si256();
    for (float b : bounds)
      c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(b), _CMP_GT_OQ)));
    const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ));
    c = _mm256_or_si256(c, _mm256_and_si256(neg, _mm256_set1_epi32(8)));
    // each 64-bit pair: even | odd << 4 in its low byte
    const __m256i pairs = _mm256_or_si256(c, _mm256_srli_epi64(c, 28));
    alignas(32) int64_t out[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), pairs);
    for (int k = 0; k < 4; ++k) packed8[4 * h + k] = static_cast<uint8_t>(out[k]);
  }
}

LOWBIT_AVX2 float nvfp4_error_avx2(const float* w, float den) {
  const __m256 vd = _mm256_set1_ps(den);
  __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
  __m256 d0 = _mm256_sub_ps(w0, _mm256_mul_ps(e2m1_value8(w0, vd), vd));
  __m256 d1 = _mm256_sub_ps(w1, _mm256_mul_ps(e2m1_value8(w1, vd), vd));
  return tree16_8x2(_mm256_mul_ps(d0, d0), _mm256_mul_ps(d1, d1));
}
#endif

struct Primitives {
  float (*amax)(const float*, int64_t);
  void (*codes)(const float*, int64_t, float, float, int8_t*);
  float (*group_error)(const float*, int64_t, float, float);
  void (*refit)(const float*, int64_t, float, float, float*, float*);
  float (*nvfp4_error)(const float*, float);
  void (*nvfp4_codes)(const float*, float, uint8_t*);
};

bool g_force_scalar = false;

const Primitives& prims() {
  static const Primitives scalar = {amax_scalar,  codes_scalar,       group_error_scalar,
                                    refit_scalar, nvfp4_error_scalar, nvfp4_codes_scalar};
#ifdef LOWBIT_HAVE_AVX2_PATH
  static const Primitives avx2 = {amax_avx2,  codes_avx2,       group_error_avx2,
                                  refit_avx2, nvfp4_error_avx2, nvfp4_codes_avx2};
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (has_avx2 && !g_force_scalar) return avx2;
#endif
  return scalar;
}

inline float amax_of(const float* x, int64_t n) { return prims().amax(x, n); }

}  // namespace

bool simd_kernels_available() {
#ifdef LOWBIT_HAVE_AVX2_PATH
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}
bool simd_kernels_on() { return simd_kernels_available() && !g_force_scalar; }

namespace {
bool g_force_avx2 = false;
}
void force_avx2_kernels(bool on) { g_force_avx2 = on; }
bool avx2_kernels_forced() { return g_force_avx2; }

void force_scalar_kernels(bool on) {
  g_force_scalar = on;
  g_force_scalar_rotation = on;
  rows::force_scalar(on);
}

float quantize_row_int(const float* w, int64_t K, int qmax, int8_t* codes) {
  const Primitives& p = prims();
  float scale = p.amax(w, K) / static_cast<float>(qmax);
  if (scale == 0.f) scale = 1.f;
  p.codes(w, K, scale, static_cast<float>(qmax), codes);
  return scale;
}

void nvfp4_codes(const float* w, float den, uint8_t* packed8) { prims().nvfp4_codes(w, den, packed8); }

// (The row encoder of src/cpu/rows: AVX2 or scalar by rows' own selection, which
// force_scalar_kernels forces too.)
void e4m3_codes(const float* w, int64_t n, float s, uint8_t* codes) {
  rows::f32_to_e4m3(w, n, s, codes);
}

float quantize_row_fp8(const float* w, int64_t K, uint8_t* codes) {
  float scale = amax_of(w, K) / 448.f;
  if (scale == 0.f) scale = 1.f;
  e4m3_codes(w, K, scale, codes);
  return scale;
}

float mse_group_quantize(const float* w, int64_t g, int qmax, int8_t* codes) {
  const Primitives& p = prims();
  // Candidate multipliers c_i = float(f_i / qmax), f_i = 0.2 + i * (0.8 / 15) in fp64.
  float c[16];
  for (int i = 0; i < 16; ++i) c[i] = static_cast<float>((0.2 + i * (0.8 / 15)) / qmax);
  const float q = static_cast<float>(qmax);
  float amax = p.amax(w, g);
  if (amax == 0.f) amax = 1.f;
  float best_s = amax * c[0];
  float best_e = p.group_error(w, g, best_s, q);
  for (int i = 1; i < 16; ++i) {
    float s = amax * c[i];
    float e = p.group_error(w, g, s, q);
    if (e < best_e) {
      best_e = e;
      best_s = s;
    }
  }
  float s = best_s;
  for (int it = 0; it < 2; ++it) {
    float num, den;
    p.refit(w, g, s, q, &num, &den);
    if (den > 0.f && num > 0.f) s = num / den;
  }
  p.codes(w, g, s, q, codes);
  return s;
}

float fold_group_scales(const float* gscales, int64_t n_groups, int qmax, float* ratios) {
  float m = gscales[0];
  for (int64_t g = 1; g < n_groups; ++g) m = gscales[g] > m ? gscales[g] : m;
  float rscale = m * static_cast<float>(qmax / 127.0);
  if (rscale == 0.f) rscale = 1.f;
  for (int64_t g = 0; g < n_groups; ++g) ratios[g] = gscales[g] / rscale;
  return rscale;
}

namespace {

inline float nvfp4_den(uint8_t s8, float pts) {
  float den = dt::e4m3_to_f32(s8) * pts;
  return den > 0.f ? den : 1.f;
}

}  // namespace

void quantize_row_nvfp4_weight(const float* w, int64_t K, float pts, uint8_t* scales_out,
                               uint8_t* packed_out) {
  static const float kFrac[9] = {
      static_cast<float>(0.70), static_cast<float>(0.75), static_cast<float>(0.80),
      static_cast<float>(0.85), static_cast<float>(0.90), static_cast<float>(0.95),
      static_cast<float>(1.00), static_cast<float>(1.05), static_cast<float>(1.10)};
  const Primitives& p = prims();
  const float six_pts = 6.f * pts;
  for (int64_t b = 0; b < K / 16; ++b) {
    const float* wb = w + b * 16;
    float base = amax_of(wb, 16) / six_pts;
    bool have = false;
    uint8_t best_s = 0, prev_s = 0;
    float best_e = 0.f;
    for (int i = 0; i < 9; ++i) {
      float c = base * kFrac[i];
      if (c > 448.f) continue;
      uint8_t s8 = dt::f32_to_e4m3(c);
      // (fractions a few % apart often snap to the same code: its error is the one just
      // measured, which loses the tie to the first)
      if (have && s8 == prev_s) continue;
      prev_s = s8;
      float e = p.nvfp4_error(wb, nvfp4_den(s8, pts));
      if (!have || e < best_e) {
        have = true;
        best_e = e;
        best_s = s8;
      }
    }
    if (!have) best_s = dt::f32_to_e4m3(base);
    scales_out[b] = best_s;
    nvfp4_codes(wb, nvfp4_den(best_s, pts), packed_out + b * 8);
  }
}

LOWBIT_CLONES void quantize_row_nvfp4_act(const float* x, int64_t K, uint8_t* scales_out,
                                          uint8_t* packed_out) {
  for (int64_t b = 0; b < K / 16; ++b) {
    const float* xb = x + b * 16;
    float base = amax_of(xb, 16) / 6.f;
    base = base > 448.f ? 448.f : base;
    uint8_t s8 = dt::f32_to_e4m3(base);
    scales_out[b] = s8;
    nvfp4_codes(xb, nvfp4_den(s8, 1.f), packed_out + b * 8);
  }
}

// ---- packing ------------------------------------------------------------------------------------
void pack_bits(const int8_t* codes, int64_t K, int bits, uint8_t* out) {
  const int qmax = (1 << (bits - 1)) - 1;
  for (int64_t i = 0; i < K; i += 8) {
    uint64_t word = 0;
    for (int j = 0; j < 8; ++j) word |= static_cast<uint64_t>(codes[i + j] + qmax) << (j * bits);
    for (int b = 0; b < bits; ++b) out[i / 8 * bits + b] = static_cast<uint8_t>(word >> (8 * b));
  }
}

namespace {
// unpack_bits at 4 bits: byte i holds codes 2i (low nibble) and 2i + 1 (loops that vectorize).
LOWBIT_CLONES void unpack_nibbles(const uint8_t* in, int64_t K, int8_t* codes) {
  for (int64_t i = 0; i < K / 2; ++i) {
    codes[2 * i] = static_cast<int8_t>((in[i] & 15) - 7);
    codes[2 * i + 1] = static_cast<int8_t>((in[i] >> 4) - 7);
  }
}
// unpack_bits at 8 bits: byte i is code i + 127.
LOWBIT_CLONES void unpack_bytes(const uint8_t* in, int64_t K, int8_t* codes) {
  for (int64_t i = 0; i < K; ++i) codes[i] = static_cast<int8_t>(in[i] - 127);
}
// unpack_bits from code i0 on with the width known at compile time (each 8 codes one
// little-endian word of kBits bytes).
template <int kBits>
void unpack_words(const uint8_t* in, int64_t i0, int64_t K, int8_t* codes) {
  constexpr int qmax = (1 << (kBits - 1)) - 1;
  constexpr uint64_t mask = (1u << kBits) - 1u;
  for (int64_t i = i0; i < K; i += 8) {
    uint64_t word = 0;
    for (int b = 0; b < kBits; ++b) word |= static_cast<uint64_t>(in[i / 8 * kBits + b]) << (8 * b);
    for (int j = 0; j < 8; ++j)
      codes[i + j] = static_cast<int8_t>(static_cast<int>((word >> (j * kBits)) & mask) - qmax);
  }
}
}  // namespace

#ifdef LOWBIT_HAVE_AVX2_PATH
namespace {
// unpack_bits on the fields, less qmax. Returns the codes done (a multiple of 64).
LOWBIT_BITS_VBMI int64_t unpack_bits_vbmi(const uint8_t* in, int64_t K, int nbits, int8_t* codes) {
  const bits::Fields f = bits::fields(nbits);
  const __m512i qmax = _mm512_set1_epi8(static_cast<char>((1 << (nbits - 1)) - 1));
  int64_t i = 0;
  for (; i + 64 <= K; i += 64)
    _mm512_storeu_si512(codes + i, _mm512_sub_epi8(bits::raw(f, in, i), qmax));
  return i;
}
// (false while the tests force the AVX2 kernels)
bool has_vbmi() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has && !g_force_avx2;
}
// The raw fields of bit-packed codes on AVX2 (2, 3, 5, 6, 7 bits), 32 codes a step: each 16
// codes (2 nbits bytes, one 16-byte load per 128-bit lane) as 16-bit words holding the two bytes
// of each field (vpshufb), the field moved to the word's top by vpmullw (x 2^(16 - nbits -
// shift): the bits above it drop out), then down by a uniform vpsrlw; vpackuswb puts the 16
// codes of each lane back in order.
struct FieldsAvx2 {
  __m256i idx[2], mul[2];
  __m128i down;
  int64_t step;  // bytes of 32 codes
};
LOWBIT_AVX2 FieldsAvx2 fields_avx2(int nbits) {
  alignas(32) uint8_t idx[2][32];
  alignas(32) uint16_t mul[2][16];
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 8; ++j) {  // word j of half h: code 8 h + j of the lane's 16
      const int bit = (8 * h + j) * nbits, byte = bit / 8;
      for (int lane = 0; lane < 2; ++lane) {
        idx[h][16 * lane + 2 * j] = static_cast<uint8_t>(byte);
        idx[h][16 * lane + 2 * j + 1] = static_cast<uint8_t>(byte + 1);
        mul[h][8 * lane + j] = static_cast<uint16_t>(1u << (16 - nbits - bit % 8));
      }
    }
  FieldsAvx2 f;
  for (int h = 0; h < 2; ++h) {
    f.idx[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(idx[h]));
    f.mul[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(mul[h]));
  }
  f.down = _mm_cvtsi32_si128(16 - nbits);
  f.step = 4 * nbits;
  return f;
}
// Codes 32 i'.. 32 i' + 31 of a row whose step starts at p (reads p .. p + step / 2 + 16).
LOWBIT_AVX2 inline __m256i raw_fields(const FieldsAvx2& f, const uint8_t* p) {
  const __m256i b = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + f.step / 2)), 1);
  const __m256i w0 =
      _mm256_srl_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(b, f.idx[0]), f.mul[0]), f.down);
  const __m256i w1 =
      _mm256_srl_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(b, f.idx[1]), f.mul[1]), f.down);
  return _mm256_packus_epi16(w0, w1);
}
// The bytes the 32-code step at byte `at` of a row of `bytes` reads: the row's own, or where its
// loads would pass the row (the last steps), a zero-padded copy of its last bytes in `last`.
inline const uint8_t* step_bytes(const uint8_t* in, int64_t at, int64_t bytes, const FieldsAvx2& f,
                                 uint8_t (&last)[32]) {
  if (at + f.step / 2 + 16 <= bytes) return in + at;
  std::memset(last, 0, sizeof last);
  std::memcpy(last, in + at, static_cast<size_t>(bytes - at));
  return last;
}
// unpack_bits on AVX2. Returns the codes done (a multiple of 32).
LOWBIT_AVX2 int64_t unpack_bits_avx2(const uint8_t* in, int64_t K, int nbits, int8_t* codes) {
  const FieldsAvx2 f = fields_avx2(nbits);
  const __m256i qmax = _mm256_set1_epi8(static_cast<char>((1 << (nbits - 1)) - 1));
  const int64_t n = K / 32 * 32, bytes = K / 8 * nbits;
  alignas(32) uint8_t last[32];
  for (int64_t i = 0; i < n; i += 32)
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(codes + i),
        _mm256_sub_epi8(raw_fields(f, step_bytes(in, i / 8 * nbits, bytes, f, last)), qmax));
  return n;
}
// A bit-packed grouped row's GEMM codes on AVX2 (2, 3, 5, 6, 7 bits; groups a multiple of 32):
// fold_code is odd in the code (rint and the clamp are symmetric, NaN -> 0 either way), so each
// group's table holds fold_code(m, ratio) for m = 0 .. qmax (16-byte tables, 1 to 4 of them:
// vpshufb on |code|, vpblendvb on its bits 4 and 5) and vpsignb gives the code's sign back. The
// one field past the codes (2^nbits - 1: code qmax + 1, no valid weight's) folds as the scalar
// path folds it: from 5 bits its |code| is past the tables, and a blend puts fold_code(qmax + 1)
// there.
LOWBIT_AVX2 void fold_bits_row_avx2(const uint8_t* in, int64_t K, int nbits, int64_t group,
                                    const float* ratios, int8_t* codes) {
  const FieldsAvx2 f = fields_avx2(nbits);
  const int qmax = (1 << (nbits - 1)) - 1, tables = std::max(1, (qmax + 1) / 16);
  const __m256i vq = _mm256_set1_epi8(static_cast<char>(qmax));
  const __m256 hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
  const __m256 step8 = _mm256_set1_ps(8.f), m0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t bytes = K / 8 * nbits;
  alignas(32) uint8_t last[32];
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    __m256i t[4];
    const float ratio = ratios[g0 / group];
    const __m256 r = _mm256_set1_ps(ratio);
    const __m256i past = _mm256_set1_epi8(static_cast<char>(fold_code(qmax + 1, ratio)));
    __m256 m = m0;
    for (int k = 0; k < tables; ++k) {  // entries 16 k .. 16 k + 15
      __m128i half[2];
      for (int h = 0; h < 2; ++h, m = _mm256_add_ps(m, step8)) {
        const __m256i q = _mm256_cvtps_epi32(round_clamp8(_mm256_mul_ps(m, r), hi, lo));
        half[h] = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
      }
      t[k] = _mm256_broadcastsi128_si256(_mm_packs_epi16(half[0], half[1]));
    }
    for (int64_t i = g0; i < g0 + group; i += 32) {
      const __m256i v =
          _mm256_sub_epi8(raw_fields(f, step_bytes(in, i / 8 * nbits, bytes, f, last)), vq);
      const __m256i a = _mm256_abs_epi8(v);
      __m256i y = _mm256_shuffle_epi8(t[0], a);
      if (tables >= 2) {
        const __m256i b4 = _mm256_slli_epi16(a, 3);  // bit 4 of each byte to its bit 7
        y = _mm256_blendv_epi8(y, _mm256_shuffle_epi8(t[1], a), b4);
        if (tables == 4) {
          const __m256i y23 =
              _mm256_blendv_epi8(_mm256_shuffle_epi8(t[2], a), _mm256_shuffle_epi8(t[3], a), b4);
          y = _mm256_blendv_epi8(y, y23, _mm256_slli_epi16(a, 2));  // by bit 5
        }
      }
      y = _mm256_sign_epi8(y, v);
      if (nbits >= 5) y = _mm256_blendv_epi8(y, past, _mm256_cmpgt_epi8(v, vq));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), y);
    }
  }
}
}  // namespace
#endif

void unpack_bits(const uint8_t* in, int64_t K, int bits, int8_t* codes) {
  if (bits == 4) return unpack_nibbles(in, K, codes);
  if (bits == 8) return unpack_bytes(in, K, codes);
  int64_t i0 = 0;
#ifdef LOWBIT_HAVE_AVX2_PATH
  if (bits >= 2 && bits <= 7 && has_vbmi() && simd_kernels_on())
    i0 = unpack_bits_vbmi(in, K, bits, codes);
  else if (simd_kernels_on())
    i0 = unpack_bits_avx2(in, K, bits, codes);
#endif
  switch (bits) {
    case 2:
      return unpack_words<2>(in, i0, K, codes);
    case 3:
      return unpack_words<3>(in, i0, K, codes);
    case 5:
      return unpack_words<5>(in, i0, K, codes);
    case 6:
      return unpack_words<6>(in, i0, K, codes);
    default:
      return unpack_words<7>(in, i0, K, codes);
  }
}

void pack_ternary(const int8_t* codes, int64_t K, uint8_t* out) {
  for (int64_t i = 0; i < K; i += 5) {
    int v = 0, w = 1;
    for (int j = 0; j < 5; ++j, w *= 3) v += (i + j < K ? codes[i + j] + 1 : 0) * w;
    out[i / 5] = static_cast<uint8_t>(v);
  }
}

void unpack_ternary(const uint8_t* in, int64_t K, int8_t* codes) {
  // Each byte's five codes from a table (the base-3 digits less 1; bytes above 242 decode as the
  // loop below would, digit by digit).
  // (8-byte rows: one 8-byte store a byte where 8 codes fit, the next store overwriting the 3
  // past the five)
  struct Table {
    int8_t c[256][8] = {};
    Table() {
      for (int b = 0; b < 256; ++b)
        for (int j = 0, v = b; j < 5; ++j, v /= 3) c[b][j] = static_cast<int8_t>(v % 3 - 1);
    }
  };
  static const Table t;
  int64_t i = 0;
  for (; i + 8 <= K; i += 5) std::memcpy(codes + i, t.c[in[i / 5]], 8);
  for (; i < K; i += 5)
    std::memcpy(codes + i, t.c[in[i / 5]], static_cast<size_t>(std::min<int64_t>(5, K - i)));
}

void pack_nibbles(const uint8_t* nibbles, int64_t K, uint8_t* out) {
  for (int64_t i = 0; i < K; i += 2)
    out[i / 2] = static_cast<uint8_t>((nibbles[i] & 15u) | ((nibbles[i + 1] & 15u) << 4));
}

// ---- packed rows
// ----------------------------------------------------------------------------------
namespace {

bool grouped(QType q) {
  return (q >= QType::convrot_int2 && q <= QType::convrot_int7) || q == QType::convrot_bitnet;
}
int qmax_of(const PackedWeightView& w) {
  if (w.qtype == QType::convrot8) return 127;
  return (1 << (w.bits - 1)) - 1;
}
template <typename T>
T* row_ptr(const TensorView& t, int64_t o) {
  return static_cast<T*>(t.data) + o * t.shape[t.ndim - 1];
}

// The stored n-bit / ternary / int4 codes of row o (before the int8 fold).
void stored_codes(const PackedWeightView& w, int64_t o, int8_t* codes) {
  const int64_t K = w.in_features;
  switch (w.qtype) {
    case QType::convrot8:
      std::memcpy(codes, row_ptr<int8_t>(w.codes, o), static_cast<size_t>(K));
      break;
    case QType::convrot_bitnet:
      unpack_ternary(row_ptr<uint8_t>(w.codes, o), K, codes);
      break;
    case QType::convrot_comfy_w4a4: {
      const uint8_t* p = row_ptr<uint8_t>(w.codes, o);
      for (int64_t i = 0; i < K; ++i)
        codes[i] = signed_nibble(static_cast<uint8_t>((i & 1) ? p[i / 2] >> 4 : p[i / 2] & 15u));
      break;
    }
    default:
      unpack_bits(row_ptr<uint8_t>(w.codes, o), K, w.bits, codes);
      break;
  }
}

void store_codes(const PackedWeightView& w, int64_t o, const int8_t* codes) {
  const int64_t K = w.in_features;
  switch (w.qtype) {
    case QType::convrot8:
      std::memcpy(row_ptr<int8_t>(w.codes, o), codes, static_cast<size_t>(K));
      break;
    case QType::convrot_bitnet:
      pack_ternary(codes, K, row_ptr<uint8_t>(w.codes, o));
      break;
    case QType::convrot_comfy_w4a4: {
      uint8_t* p = row_ptr<uint8_t>(w.codes, o);
      for (int64_t i = 0; i < K; i += 2)
        p[i / 2] = static_cast<uint8_t>((codes[i] & 15) | ((codes[i + 1] & 15) << 4));
      break;
    }
    default:
      pack_bits(codes, K, w.bits, row_ptr<uint8_t>(w.codes, o));
      break;
  }
}

}  // namespace

void quantize_weight_row(const float* w_rot, int64_t o, const PackedWeightView& w) {
  const int64_t K = w.in_features;
  const QType q = w.qtype;
  float* scales = static_cast<float*>(w.scales.data);
  if (q == QType::convrot_fp8) {
    scales[o] = quantize_row_fp8(w_rot, K, row_ptr<uint8_t>(w.codes, o));
    return;
  }
  int8_t codes[65536 / 4];
  int8_t* c = codes;
  std::unique_ptr<int8_t[]> big;
  if (K > static_cast<int64_t>(sizeof(codes))) {
    big.reset(new int8_t[K]);
    c = big.get();
  }
  const int qmax = qmax_of(w);
  if (grouped(q)) {
    const int64_t g = w.group, ng = K / g;
    float gs_stack[1024];
    std::unique_ptr<float[]> gs_big;
    float* gs = gs_stack;
    if (ng > 1024) {
      gs_big.reset(new float[ng]);
      gs = gs_big.get();
    }
    for (int64_t j = 0; j < ng; ++j) gs[j] = mse_group_quantize(w_rot + j * g, g, qmax, c + j * g);
    scales[o] = fold_group_scales(gs, ng, qmax, row_ptr<float>(w.ratios, o));
  } else if (q == QType::convrot_comfy_w4a4) {
    scales[o] = mse_group_quantize(w_rot, K, qmax, c);
  } else {
    scales[o] = quantize_row_int(w_rot, K, qmax, c);
  }
  store_codes(w, o, c);
}

namespace {
#ifdef LOWBIT_HAVE_AVX2_PATH
// fold_code of 8 codes at a time (round_clamp8 of code * ratio: fold_code's bits).
LOWBIT_AVX2 int64_t fold_codes_avx2(int8_t* codes, int64_t n, float ratio) {
  const __m256 r = _mm256_set1_ps(ratio), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c8)), r);
    const __m256i q32 = _mm256_cvtps_epi32(round_clamp8(y, hi, lo));
    const __m128i q16 =
        _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packs_epi16(q16, q16));
  }
  return i;
}
#endif
}  // namespace

void fold_codes(int8_t* codes, int64_t n, float ratio) {
  int64_t i = 0;
#ifdef LOWBIT_HAVE_AVX2_PATH
  if (simd_kernels_on()) i = fold_codes_avx2(codes, n, ratio);
#endif
  for (; i < n; ++i) codes[i] = fold_code(codes[i], ratio);
}

namespace {
#ifdef LOWBIT_HAVE_AVX2_PATH
// Codes [0, n) of a row of nibbles (even column in the low nibble; n a multiple of 32) looked up
// in the 16-entry table t by pshufb, 32 codes per 16 bytes.
LOWBIT_AVX2 inline void lookup_nibbles(const uint8_t* in, int64_t n, __m128i t, int8_t* codes) {
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (int64_t i = 0; i < n; i += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i / 2));
    const __m128i lo = _mm_shuffle_epi8(t, _mm_and_si128(b, low4));
    const __m128i hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i + 16), _mm_unpackhi_epi8(lo, hi));
  }
}
// A comfy W4A4 row's codes: the signed nibbles by one table.
LOWBIT_AVX2 void comfy_row_avx2(const uint8_t* in, int64_t K, int8_t* codes) {
  lookup_nibbles(in, K, _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1),
                 codes);
}
// A 4-bit grouped row's GEMM codes in one step: each group's 16 folded values (fold_codes of
// nibble - 7, as the two-step path folds them) looked up by pshufb, 32 codes per 16 bytes.
LOWBIT_AVX2 void fold_nibble_row_avx2(const uint8_t* in, int64_t K, int64_t group,
                                      const float* ratios, int8_t* codes) {
  // The 16 codes - 7 as floats; each group's table is fold_codes_avx2's arithmetic on them, kept
  // in registers (a table written to memory by two 8-byte stores and read back as one 16-byte
  // load stalled store forwarding once a group: 68 % of a 1 x 3072 -> 3072 layer's time).
  const __m256 codes_lo = _mm256_setr_ps(-7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f);
  const __m256 codes_hi = _mm256_setr_ps(1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f);
  const __m256 qmax = _mm256_set1_ps(127.f), qmin = _mm256_set1_ps(-127.f);
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    const __m256 r = _mm256_set1_ps(ratios[g0 / group]);
    const __m256i q_lo = _mm256_cvtps_epi32(round_clamp8(_mm256_mul_ps(codes_lo, r), qmax, qmin));
    const __m256i q_hi = _mm256_cvtps_epi32(round_clamp8(_mm256_mul_ps(codes_hi, r), qmax, qmin));
    const __m128i t = _mm_packs_epi16(
        _mm_packs_epi32(_mm256_castsi256_si128(q_lo), _mm256_extracti128_si256(q_lo, 1)),
        _mm_packs_epi32(_mm256_castsi256_si128(q_hi), _mm256_extracti128_si256(q_hi, 1)));
    lookup_nibbles(in + g0 / 2, group, t, codes + g0);
  }
}
#endif
}  // namespace

#ifdef LOWBIT_HAVE_AVX2_PATH
namespace {
// A bit-packed grouped row's GEMM codes in one step (bits 2..7, groups a multiple of 64): each
// group's fold table (bits::fold_tables, in registers: 16-byte stores read back as 64-byte
// loads would stall store forwarding once a group) looked up by vpermi2b on the raw fields.
LOWBIT_BITS_VBMI void fold_bits_row_vbmi(const uint8_t* in, int64_t K, int nbits, int64_t group,
                                         const float* ratios, int8_t* codes) {
  const bits::Fields f = bits::fields(nbits);
  const bits::FoldIndex x = bits::fold_index(nbits);
  for (int64_t g0 = 0; g0 < K; g0 += group) {
    __m512i t0, t1;
    bits::fold_tables(nbits, x, ratios[g0 / group], 0, t0, t1);
    for (int64_t i = g0; i < g0 + group; i += 64)
      _mm512_storeu_si512(codes + i, _mm512_permutex2var_epi8(t0, bits::raw(f, in, i), t1));
  }
}
// Where code 64 k + i (k < 5, i < 64) of a ternary block's 320 (64 bytes) comes from: byte
// b = (64 k + i) / 5, digit j = (64 k + i) % 5; as indices into the digit vectors' pairs (0, 1),
// (2, 3) (+64: the second of the pair) and 4, and the lanes of pairs (2, 3) and 4.
struct TernaryInterleave {
  alignas(64) uint8_t idx01[5][64], idx23[5][64], idx4[5][64];
  __mmask64 m23[5] = {}, m4[5] = {};
  TernaryInterleave() {
    for (int k = 0; k < 5; ++k)
      for (int i = 0; i < 64; ++i) {
        const int c = 64 * k + i, b = c / 5, j = c % 5;
        idx01[k][i] = static_cast<uint8_t>(b + (j == 1 ? 64 : 0));
        idx23[k][i] = static_cast<uint8_t>(b + (j == 3 ? 64 : 0));
        idx4[k][i] = static_cast<uint8_t>(b);
        if (j == 2 || j == 3) m23[k] |= __mmask64{1} << i;
        if (j == 4) m4[k] |= __mmask64{1} << i;
      }
  }
};
// A ternary row's GEMM codes in one step (groups a multiple of 64): per 64-byte block, the five
// digit vectors (bits::ternary_digit), interleaved into the block's five vectors of 64 codes by
// three permutes and two blends each, then each vector's group table (fold_code of -1, 0, 1 at
// digits 0, 1, 2) by vpermb.
LOWBIT_BITS_VBMI void fold_ternary_row_vbmi(const uint8_t* in, int64_t K, int64_t group,
                                            const float* ratios, int8_t* codes) {
  static const TernaryInterleave il;
  const bits::TernaryDigits& dt = bits::ternary_digits();
  const int64_t bytes = (K + 4) / 5;
  int64_t g_last = -1;
  __m512i tab = _mm512_setzero_si512();
  for (int64_t k0 = 0, c0 = 0; c0 < K; k0 += 64, c0 += 320) {
    const __mmask64 m = tail_mask(bytes - k0);
    const __m512i b = _mm512_maskz_loadu_epi8(m, in + k0);
    const __mmask64 high = _mm512_movepi8_mask(b);
    const __m512i d0 = bits::ternary_digit(dt.t[0], b, high);
    const __m512i d1 = bits::ternary_digit(dt.t[1], b, high);
    const __m512i d2 = bits::ternary_digit(dt.t[2], b, high);
    const __m512i d3 = bits::ternary_digit(dt.t[3], b, high);
    const __m512i d4 = bits::ternary_digit(dt.t[4], b, high);
    for (int k = 0; k < 5 && c0 + 64 * k < K; ++k) {
      const int64_t g = (c0 + 64 * k) / group;
      if (g != g_last) {
        const float r = ratios[g];
        tab = _mm512_maskz_set1_epi8(1, fold_code(-1, r)) |
              _mm512_maskz_set1_epi8(2, fold_code(0, r)) |
              _mm512_maskz_set1_epi8(4, fold_code(1, r));
        g_last = g;
      }
      __m512i v = _mm512_permutex2var_epi8(d0, _mm512_load_si512(il.idx01[k]), d1);
      v = _mm512_mask_blend_epi8(il.m23[k], v,
                                 _mm512_permutex2var_epi8(d2, _mm512_load_si512(il.idx23[k]), d3));
      v = _mm512_mask_blend_epi8(il.m4[k], v,
                                 _mm512_permutexvar_epi8(_mm512_load_si512(il.idx4[k]), d4));
      _mm512_storeu_si512(codes + c0 + 64 * k, _mm512_permutexvar_epi8(v, tab));
    }
  }
}
}  // namespace
#endif

void weight_row_gemm_codes(const PackedWeightView& w, int64_t o, int8_t* codes) {
#ifdef LOWBIT_HAVE_AVX2_PATH
  if (grouped(w.qtype) && w.qtype != QType::convrot_bitnet && w.bits >= 2 && w.bits <= 7 &&
      w.bits != 4 && w.group % 64 == 0 && w.in_features % w.group == 0 && has_vbmi() &&
      simd_kernels_on())
    return fold_bits_row_vbmi(row_ptr<uint8_t>(w.codes, o), w.in_features, w.bits, w.group,
                              row_ptr<float>(w.ratios, o), codes);
  if (grouped(w.qtype) && w.bits == 4 && w.group % 32 == 0 && w.in_features % w.group == 0 &&
      simd_kernels_on())
    return fold_nibble_row_avx2(row_ptr<uint8_t>(w.codes, o), w.in_features, w.group,
                                row_ptr<float>(w.ratios, o), codes);
  if (w.qtype == QType::convrot_comfy_w4a4 && w.in_features % 32 == 0 && simd_kernels_on())
    return comfy_row_avx2(row_ptr<uint8_t>(w.codes, o), w.in_features, codes);
  if (w.qtype == QType::convrot_bitnet && w.group % 64 == 0 && w.in_features % w.group == 0 &&
      has_vbmi() && simd_kernels_on())
    return fold_ternary_row_vbmi(row_ptr<uint8_t>(w.codes, o), w.in_features, w.group,
                                 row_ptr<float>(w.ratios, o), codes);
  if (grouped(w.qtype) && w.qtype != QType::convrot_bitnet && w.bits >= 2 && w.bits <= 7 &&
      w.bits != 4 && w.group % 32 == 0 && w.in_features % w.group == 0 && simd_kernels_on()) {
    return fold_bits_row_avx2(row_ptr<uint8_t>(w.codes, o), w.in_features, w.bits, w.group,
                              row_ptr<float>(w.ratios, o), codes);
  }
#endif
  stored_codes(w, o, codes);
  if (!grouped(w.qtype)) return;
  const float* ratios = row_ptr<float>(w.ratios, o);
  for (int64_t g0 = 0; g0 < w.in_features; g0 += w.group)  // a group at a time, its one ratio
    fold_codes(codes + g0, std::min<int64_t>(w.group, w.in_features - g0), ratios[g0 / w.group]);
}

void dequantize_weight_row(const PackedWeightView& w, int64_t o, float* out) {
  const int64_t K = w.in_features;
  if (w.qtype == QType::convrot4) {
    const float pts = *static_cast<const float*>(w.tensor_scale.data);
    const uint8_t* s = row_ptr<uint8_t>(w.block_scales, o);
    const uint8_t* p = row_ptr<uint8_t>(w.codes, o);
    for (int64_t i = 0; i < K; ++i) {
      float scale = dt::e4m3_to_f32(s[i / 16]) * pts;
      out[i] = dt::e2m1_to_f32(dt::get_nibble(p, i)) * scale;
    }
    return;
  }
  const float scale = static_cast<const float*>(w.scales.data)[o];
  if (w.qtype == QType::convrot_fp8) {
    const uint8_t* p = row_ptr<uint8_t>(w.codes, o);
    for (int64_t i = 0; i < K; ++i) out[i] = dt::e4m3_to_f32(p[i]) * scale;
    return;
  }
  std::unique_ptr<int8_t[]> codes(new int8_t[K]);
  weight_row_gemm_codes(w, o, codes.get());
  for (int64_t i = 0; i < K; ++i) out[i] = static_cast<float>(codes[i]) * scale;
}

namespace {

// Stochastic rounding of |z| between two neighbours of a sorted grid of magnitudes.
inline float stochastic_between(float lo, float hi, float a, float u) {
  float p = (a - lo) / (hi - lo);
  return u < p ? hi : lo;
}

uint8_t stochastic_e4m3(float z, float u) {
  if (z != z) return dt::f32_to_e4m3(z);
  float a = std::fabs(z);
  uint8_t sign = z < 0.f ? 0x80u : 0u;
  if (a >= 448.f) return static_cast<uint8_t>(sign | 0x7eu);
  uint8_t c = dt::f32_to_e4m3(a);
  if (dt::e4m3_to_f32(c) > a) --c;  // magnitude codes are monotonic: c is now the value below
  float lo = dt::e4m3_to_f32(c), hi = dt::e4m3_to_f32(static_cast<uint8_t>(c + 1));
  if (lo == a) return static_cast<uint8_t>(sign | c);
  float v = stochastic_between(lo, hi, a, u);
  return static_cast<uint8_t>(sign | (v == hi ? c + 1 : c));
}

uint8_t stochastic_e2m1(float z, float u) {
  static const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  if (z != z) return 0;
  float a = std::fabs(clamp6(z));
  int lo = 0;
  while (lo < 7 && mag[lo + 1] <= a) ++lo;
  int idx = lo;
  if (lo < 7 && mag[lo] != a && stochastic_between(mag[lo], mag[lo + 1], a, u) == mag[lo + 1])
    idx = lo + 1;
  return static_cast<uint8_t>(idx | (z < 0.f ? 8 : 0));
}

inline float safe_scale(float s) { return s > 0.f ? s : 1.f; }

}  // namespace

void requantize_weight_row(const PackedWeightView& w, int64_t o, const float* w_rot,
                           bool stochastic, uint64_t seed) {
  const int64_t K = w.in_features;
  const uint64_t base = static_cast<uint64_t>(o) * static_cast<uint64_t>(K);
  if (w.qtype == QType::convrot4) {
    const float pts = *static_cast<const float*>(w.tensor_scale.data);
    const uint8_t* s = row_ptr<uint8_t>(w.block_scales, o);
    uint8_t* p = row_ptr<uint8_t>(w.codes, o);
    for (int64_t i = 0; i < K; i += 2) {
      uint8_t c[2];
      for (int j = 0; j < 2; ++j) {
        float den = nvfp4_den(s[(i + j) / 16], pts);
        float z = clamp6(w_rot[i + j] / den);
        c[j] = stochastic ? stochastic_e2m1(z, uniform01(seed, base + i + j)) : dt::f32_to_e2m1(z);
      }
      p[i / 2] = static_cast<uint8_t>(c[0] | (c[1] << 4));
    }
    return;
  }
  const float rscale = static_cast<const float*>(w.scales.data)[o];
  if (w.qtype == QType::convrot_fp8) {
    uint8_t* p = row_ptr<uint8_t>(w.codes, o);
    const float sc = safe_scale(rscale);
    for (int64_t i = 0; i < K; ++i) {
      float z = w_rot[i] / sc;
      p[i] = stochastic ? stochastic_e4m3(z, uniform01(seed, base + i)) : dt::f32_to_e4m3(z);
    }
    return;
  }
  const float qmax = static_cast<float>(qmax_of(w));
  std::unique_ptr<int8_t[]> codes(new int8_t[K]);
  const float* ratios = grouped(w.qtype) ? row_ptr<float>(w.ratios, o) : nullptr;
  for (int64_t i = 0; i < K; ++i) {
    float sc = safe_scale(ratios ? ratios[i / w.group] * rscale : rscale);
    float z = w_rot[i] / sc;
    float r;
    if (stochastic) {
      r = std::floor(z + uniform01(seed, base + i));
      r = r > qmax ? qmax : r;
      r = r < -qmax ? -qmax : r;
      r = r == r ? r : 0.f;
    } else {
      r = round_clamp(z, qmax);
    }
    codes[i] = static_cast<int8_t>(r);
  }
  store_codes(w, o, codes.get());
}

}  // namespace convrot
}  // namespace cpu
}  // namespace lowbit
