// rows::exp2's arithmetic (rows.h states it): its constants, and its 16-lane AVX-512 step for loops
// that fuse it with other work (the CPU attention's P and row sum), the same bits as rows::exp2.
#pragma once

#include "src/cpu/cpu_clones.h"
#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {
namespace exp2_kernel {

// ln(2)^n / n! for n = 1 .. 7, the clamp, 1.5 * 2^23 (adding and subtracting it rounds
// |x| < 2^22 to the nearest integer, ties even).
constexpr float kC[7] = {0.6931471805599453f,   0.2402265069591007f,    0.05550410866482158f,
                         0.009618129107628477f, 0.0013333558146428443f, 0.00015403530393381606f,
                         1.525273380405984e-05f};
constexpr float kLo = -150.f, kHi = 128.f, kRoundInt = 12582912.f;

#ifdef LOWBIT_AVX512
// 2^v on 16 lanes: clamp, split at the nearest integer k, the polynomial of the fraction, times
// 2^(k >> 1) and 2^(k - (k >> 1)); NaN lanes pass through.
LOWBIT_AVX512 inline __m512 exp2_16(__m512 v) {
  const __m512 c = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(kLo)), _mm512_set1_ps(kHi));
  const __m512 magic = _mm512_set1_ps(kRoundInt);
  const __m512 r = _mm512_sub_ps(_mm512_add_ps(c, magic), magic);
  const __m512 f = _mm512_sub_ps(c, r);
  __m512 p = _mm512_set1_ps(kC[6]);
  for (int j = 5; j >= 0; --j) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC[j]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512i k = _mm512_cvttps_epi32(r);
  const __m512i k1 = _mm512_srai_epi32(k, 1), k2 = _mm512_sub_epi32(k, k1);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23));
  const __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), y, v);
}
#endif

}  // namespace exp2_kernel
}  // namespace cpu
}  // namespace lowbit
