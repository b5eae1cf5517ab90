// CPU backend of the attention family: the oracle. Loops following SageAttention 2's arithmetic
// step by step (SPEC §2), each (batch, head, query row) on its own, threaded over row blocks.
// Session 40: a key tile's q . k dots for one row at a time from the tile's K rows staged as
// int16 pairs (AVX2 multiply-adds where the CPU has them: exact integers either way), P's e4m3
// rounding by the rows' vector encoder and the code table, P·V as one loop over the tile's keys
// (the same operations in the same order per element as the plain loops), and 2^x by rows::exp2
// (within 2 ulp, vectorized; glibc's exp2f before: P's values may differ by an ulp or two, so an
// e4m3 P may round a step apart, as the GPU's ex2.approx does).
// Also the fp64 softmax(q k^T) v reference used for accuracy figures.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "lowbit/attention.h"
#include "lowbit/dtype.h"
#include "src/core/check.h"
#include "src/core/convert_elem.h"
#include "src/core/parallel.h"
#include "src/cpu/amx.h"
#include "src/cpu/attention_backend.h"
#include "src/cpu/cpu_clones.h"
#include "src/cpu/exp2_kernel.h"
#include "src/cpu/rows.h"
#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2_448 = 8.807354922057604f;  // P is scaled into [0, 448] in fp8 mode
constexpr int kKvTile = 64;                      // keys per online-softmax step

// Query rows per task (times the group's G heads): ~512 rows share each key tile's gathering
// (K staged, V decoded; 128 -> 512 rows took 10 % off (1, 24, 1024, 128) on 2 cores), halved
// while that leaves fewer than 4 tasks a thread.
int64_t attention_row_block(int64_t groups, int64_t Nq, int64_t G, int threads) {
  int64_t rb = std::max<int64_t>(16, 512 / G);
  while (rb > 32 && groups * ((Nq + rb - 1) / rb) < 4 * int64_t{threads}) rb /= 2;
  return rb;
}

inline int64_t off4(const TensorView& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2] + d * t.stride[3];
}
inline int64_t off3(const TensorView& t, int64_t a, int64_t b, int64_t c) {
  return a * t.stride[0] + b * t.stride[1] + c * t.stride[2];
}

// First key query row i may not see (keys [0, end) are visible).
inline int64_t visible_end(AttentionOptions::Causal causal, int64_t i, int64_t nq, int64_t nkv) {
  if (causal == AttentionOptions::none) return nkv;
  const int64_t shift = causal == AttentionOptions::bottom_right ? nkv - nq : 0;
  return std::max<int64_t>(0, std::min<int64_t>(nkv, i + shift + 1));
}

// Position of key `key` inside its 32-key group of the fp8 V layout (attention.h).
inline int64_t fp8_v_position(int64_t key) {
  const int64_t base = key & ~int64_t{31}, r = key & 31;
  const int64_t h = r / 16, w = r % 16;  // w = 8 * (i / 2) + 2 * t + (i % 2)
  const int64_t i = (w / 8) * 2 + (w % 2), t = (w % 8) / 2;
  return base + 16 * h + 4 * t + i;
}

// The key a tile's P·V takes at step j of n (every P·V loop, every SIMD level, the same order):
// keys in pairs (2 m, 2 m + 1), the odd key first, as AVX512_BF16's vdpbf16ps adds a pair (a
// last key without its pair alone): steps 0, 1, 2, 3, 4 of n = 5 take keys 1, 0, 3, 2, 4.
inline int64_t pv_key(int64_t j, int64_t n) { return (j ^ 1) < n ? j ^ 1 : j; }

// D values of a row of t (channel stride t.stride[3]) from element offset `off`, as f32.
void load_row_f32(const TensorView& t, int64_t off, int64_t D, float* dst) {
  const int64_t cs = t.stride[3];
  if (t.dtype == DType::f32) {
    const float* src = static_cast<const float*>(t.data) + off;
    for (int64_t d = 0; d < D; ++d) dst[d] = src[d * cs];
  } else if (t.dtype == DType::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(t.data) + off;
    for (int64_t d = 0; d < D; ++d) dst[d] = dt::bf16_to_f32(src[d * cs]);
  } else if (t.dtype == DType::f16) {
    const uint16_t* src = static_cast<const uint16_t*>(t.data) + off;
    for (int64_t d = 0; d < D; ++d) dst[d] = dt::f16_to_f32(src[d * cs]);
  } else {
    for (int64_t d = 0; d < D; ++d) dst[d] = load_f32(t.data, off + d * cs, t.dtype);
  }
}
// A key tile's K rows as int16 pairs: kt[(d / 2) * 2 kKvTile + 2 j + d % 2] = k[j][d] (D even;
// keys past the tile's count stay 0). One row's dots against them: out[j] = q . k[j], exact
// int32 (any summation order gives the same integer), all kKvTile keys.
void stage_keys(const int8_t* kbuf, int64_t tn, int64_t D, int16_t* kt) {
  std::fill(kt, kt + D * kKvTile, int16_t{0});
  for (int64_t j = 0; j < tn; ++j)
    for (int64_t d = 0; d < D; ++d) kt[(d / 2) * 2 * kKvTile + 2 * j + d % 2] = kbuf[j * D + d];
}
#ifdef LOWBIT_AVX2
LOWBIT_AVX2 void tile_dots_avx2(const int8_t* q, const int16_t* kt, int64_t D, int32_t* out) {
  static_assert(kKvTile == 64, "8 vectors of 8 keys");
  __m256i acc[8];
  for (int v = 0; v < 8; ++v) acc[v] = _mm256_setzero_si256();
  for (int64_t p = 0; p < D / 2; ++p) {
    // (q[2p], q[2p + 1]) in every 32-bit lane: madd pairs it with each key's (k[2p], k[2p + 1])
    const uint32_t pair = static_cast<uint16_t>(int16_t{q[2 * p]}) |
                          (static_cast<uint32_t>(static_cast<uint16_t>(int16_t{q[2 * p + 1]})) << 16);
    const __m256i qq = _mm256_set1_epi32(static_cast<int32_t>(pair));
    const int16_t* row = kt + p * 2 * kKvTile;
    for (int v = 0; v < 8; ++v)
      acc[v] = _mm256_add_epi32(
          acc[v], _mm256_madd_epi16(
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 * v)), qq));
  }
  for (int v = 0; v < 8; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * v), acc[v]);
}
#endif
void tile_dots(const int8_t* q, const int16_t* kt, int64_t D, int32_t* out) {
#ifdef LOWBIT_AVX2
  if (rows::avx2_on()) return tile_dots_avx2(q, kt, D, out);
#endif
  for (int64_t j = 0; j < kKvTile; ++j) out[j] = 0;
  for (int64_t d = 0; d < D; ++d) {
    const int16_t* row = kt + (d / 2) * 2 * kKvTile + d % 2;
    for (int64_t j = 0; j < kKvTile; ++j) out[j] += int32_t{q[d]} * int32_t{row[2 * j]};
  }
}
// Whether any of p[0, n) is nonzero with |p| < 2^-55 (a P that keeps pv_tile_bf16 from its
// vdpbf16ps form).
LOWBIT_CLONES bool any_tiny(const float* p, int64_t n) {
  int tiny = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float a = std::fabs(p[j]);
    tiny |= static_cast<int>(a != 0.f) & static_cast<int>(a < 0x1p-55f);
  }
  return tiny != 0;
}
// Whether a staged bf16 V value keeps pv_tile_bf16 from its vdpbf16ps form: nonzero and
// denormal or below 2^-55 in magnitude, or inf / NaN.
inline bool dp_unsafe(uint16_t x) {
  const unsigned e = (x >> 7) & 0xffu;
  return (x & 0x7fffu) != 0 && (e < 127u - 55u || e == 0xffu);
}
#ifdef LOWBIT_AVX512
// dp_unsafe of 32 bf16 lanes: 0 < |x| < 2^-55 (|x|'s bits below 72 << 7), or inf / NaN.
LOWBIT_AVX512 inline __mmask32 dp_unsafe_lanes(__m512i x) {
  const __m512i ax = _mm512_and_si512(x, _mm512_set1_epi16(0x7fff));
  return _mm512_cmplt_epu16_mask(_mm512_sub_epi16(ax, _mm512_set1_epi16(1)),
                                 _mm512_set1_epi16(0x23ff)) |
         _mm512_cmpge_epu16_mask(ax, _mm512_set1_epi16(0x7f80));
}
// The bf16 V rows of keys j, j + 1 (j even) as their key pair of the staged tile (vb16 layout,
// pv_tile_bf16), 16 channels a step (D a multiple of 16); `second` null: j is the tile's last key
// (its pair's other half 0). Returns whether any value is dp_unsafe.
LOWBIT_AVX512 bool stage_v_pair_avx512(const uint16_t* first, const uint16_t* second, int64_t D,
                                       uint16_t* dst) {
  alignas(64) static const uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                       21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  __mmask32 bad = 0;
  for (int64_t d = 0; d < D; d += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + d));
    const __m256i b = second ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + d))
                             : _mm256_setzero_si256();
    const __m512i x =
        _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
    _mm512_storeu_si512(dst + 2 * d, x);
    bad |= dp_unsafe_lanes(x);
  }
  return bad != 0;
}
// The bf16 bits of 32 e4m3 codes (a code in each 16-bit lane) from the 256 values of tab
// (codes 64 r .. 64 r + 63 in tab[2 r], tab[2 r + 1]).
LOWBIT_AVX512 inline __m512i e4m3_bf16_lanes(__m512i c, const __m512i (&tab)[8]) {
  const __m512i q0 = _mm512_permutex2var_epi16(tab[0], c, tab[1]);  // (index bits 0-5)
  const __m512i q1 = _mm512_permutex2var_epi16(tab[2], c, tab[3]);
  const __m512i q2 = _mm512_permutex2var_epi16(tab[4], c, tab[5]);
  const __m512i q3 = _mm512_permutex2var_epi16(tab[6], c, tab[7]);
  const __mmask32 b6 = _mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40));
  const __mmask32 b7 = _mm512_test_epi16_mask(c, _mm512_set1_epi16(0x80));
  return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, q0, q1),
                                 _mm512_mask_blend_epi16(b6, q2, q3));
}
// The fp8 V codes of a key tile (from a key that is a multiple of 64; channel d's codes at
// col + d npad, in the layout's order) as bf16 key pairs (vb16, pv_tile_bf16's layout), 32 keys
// x 16 channels a step. In the layout the keys 2 m, 2 m + 1 of a 32-key group are adjacent
// bytes (fp8_v_position), pair p of each 8 at 16-bit word 2 (p % 4) + p / 4: so a channel's codes
// widen to the pairs' 32-bit words, and a 16 x 16 transpose of 16 channels gives 16 pairs'
// rows. Returns whether a value of the tile's first tn keys is dp_unsafe (a NaN code).
LOWBIT_AVX512 bool stage_v_fp8_avx512(const uint8_t* col, int64_t npad, int64_t D, int64_t tn,
                                      const uint16_t* e4m3_bf16, uint16_t* vb16) {
  __m512i tab[8];
  for (int r = 0; r < 8; ++r) tab[r] = _mm512_loadu_si512(e4m3_bf16 + 32 * r);
  __mmask32 bad = 0;
  for (int64_t g = 0; g < 2 && 32 * g < tn; ++g) {
    __mmask32 keys = 0;  // (the lanes of the group's keys below tn)
    for (int64_t r = 0; r < 32 && 32 * g + r < tn; ++r) keys |= 1u << fp8_v_position(r);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512i w[16], pairs[16];
      for (int c = 0; c < 16; ++c) {
        const __m256i codes =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + (d0 + c) * npad + 32 * g));
        w[c] = e4m3_bf16_lanes(_mm512_cvtepu8_epi16(codes), tab);
        bad |= dp_unsafe_lanes(w[c]) & keys;
      }
      transpose16_epi32(w, pairs);  // pairs[q]: the 16 channels of pair word q
      for (int q = 0; q < 16; ++q) {
        const int64_t pair = 16 * g + 8 * (q / 8) + 4 * (q % 2) + (q % 8) / 2;
        _mm512_storeu_si512(vb16 + (pair * D + d0) * 2, pairs[q]);
      }
    }
  }
  return bad != 0;
}
#endif
#ifdef LOWBIT_AVX512
// The AVX-512 VNNI form of the dots (rows::avx512_on()): a key tile's K rows staged as groups of
// four channels, kq[(d / 4) 4 kKvTile + 4 j + d % 4] = k[j][d] (keys past the tile's count 0), and
// ksum[j] = 128 sum_d k[j][d]. The query rows come biased, qb[d] = q[d] + 128 (uint8), so that
// vpdpbusd (uint8 x int8, four products into each int32 lane, wrapping) gives q . k + ksum[j]; the
// true dot fits in int32 (|q . k| <= 128 . 128 . D), so the wrapped difference is exact: the
// integers of tile_dots.
// (D is a multiple of 16: a key's four channels 4 g .. 4 g + 3 move as one 32-bit word.)
void stage_keys_vnni(const int8_t* kbuf, int64_t tn, int64_t D, int8_t* kq, int32_t* ksum) {
  if (tn < kKvTile) std::fill(kq, kq + D * kKvTile, int8_t{0});
  for (int64_t j = 0; j < tn; ++j) {
    int32_t sum = 0;
    for (int64_t d = 0; d < D; ++d) sum += kbuf[j * D + d];
    ksum[j] = 128 * sum;
    for (int64_t g = 0; g < D / 4; ++g)
      std::memcpy(kq + (g * kKvTile + j) * 4, kbuf + j * D + 4 * g, 4);
  }
  for (int64_t j = tn; j < kKvTile; ++j) ksum[j] = 0;
}
// out[r][j] = q_r . k[j] for R biased query rows (1 or 2), all kKvTile keys.
template <int R>
LOWBIT_AVX512 void tile_dots_vnni(const uint8_t* const (&qb)[2], const int8_t* kq,
                                  const int32_t* ksum, int64_t D, int32_t* const (&out)[2]) {
  static_assert(kKvTile == 64, "4 vectors of 16 keys");
  __m512i acc[R][4];
  for (auto& r : acc)
    for (auto& a : r) a = _mm512_setzero_si512();
  for (int64_t g = 0; g < D / 4; ++g) {
    __m512i qq[R];
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, qb[r] + 4 * g, 4);
      qq[r] = _mm512_set1_epi32(four);
    }
    const int8_t* row = kq + g * 4 * kKvTile;
    for (int v = 0; v < 4; ++v) {
      __m512i kk = _mm512_loadu_si512(row + 64 * v);
      if (R == 2) asm("" : "+v"(kk));  // one load for both rows
      for (int r = 0; r < R; ++r) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], qq[r], kk);
    }
  }
  for (int v = 0; v < 4; ++v) {
    const __m512i s = _mm512_loadu_si512(ksum + 16 * v);
    for (int r = 0; r < R; ++r)
      _mm512_storeu_si512(out[r] + 16 * v, _mm512_sub_epi32(acc[r][v], s));
  }
}
// tile_scores in 512-bit vectors: the same products in the same order, the maximum as a tree of
// max_ps (a NaN score never wins: max_ps returns its second operand, the lanes' maximum so
// far, when either is NaN; the maximum of the others does not depend on the order).
LOWBIT_AVX512 float tile_scores_avx512(const int32_t* dots, const float* ksv, float qs,
                                       float scale_log2, int64_t n, float* s) {
  const __m512 vq = _mm512_set1_ps(qs), vl = _mm512_set1_ps(scale_log2);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask16(n - j);
    const __m512 d = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(k, dots + j));
    const __m512 x =
        _mm512_mul_ps(_mm512_mul_ps(d, _mm512_mul_ps(vq, _mm512_maskz_loadu_ps(k, ksv + j))), vl);
    _mm512_mask_storeu_ps(s + j, k, x);
    m = _mm512_mask_max_ps(m, k, x, m);
  }
  return _mm512_reduce_max_ps(m);
}
// tile_probs in 512-bit vectors, one pass: P = 2^(s - m_off) by rows::exp2's arithmetic
// (exp2_kernel::exp2_16), the row sum's 16 lanes as one register (lane l adds the keys
// j = l mod 16 in key order; a tail's lanes masked), then the same tree (l += l + 8, + 4, + 2, +
// 1).
LOWBIT_AVX512 float tile_probs_avx512(const float* s, float m_off, int64_t n, float* p) {
  const __m512 mo = _mm512_set1_ps(m_off);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask16(n - j);
    const __m512 x = exp2_kernel::exp2_16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mo));
    _mm512_mask_storeu_ps(p + j, k, x);
    acc = _mm512_mask_add_ps(acc, k, acc, x);
  }
  const __m256 h8 =
      _mm256_add_ps(_mm512_castps512_ps256(acc),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}
// pv_tile / pv_tile_pair's exact form (fused multiply-adds, key after key per element: the same
// bits) in 512-bit vectors: blocks of NV x 16 channels, one or two rows.
template <int NV, int R>
LOWBIT_AVX512 inline void pv_block_avx512(float* const (&tile)[2], const float* const (&pr)[2],
                                          const float* vbuf, const int64_t (&n)[2], int64_t D,
                                          int64_t d0) {
  __m512 acc[R][NV];
  for (auto& r : acc)
    for (auto& a : r) a = _mm512_setzero_ps();
  // (steps both rows take in the same order: whole pairs of keys both see)
  const int64_t both = R == 2 ? std::min(n[0], n[1]) & ~int64_t{1} : n[0];
  for (int64_t j = 0; j < both; ++j) {
    const int64_t key = pv_key(j, both);
    __m512 p[R];
    for (int r = 0; r < R; ++r) p[r] = _mm512_set1_ps(pr[r][key]);
    const float* v = vbuf + key * D + d0;
    for (int c = 0; c < NV; ++c) {
      __m512 x = _mm512_loadu_ps(v + 16 * c);
      if (R == 2) asm("" : "+v"(x));  // one load for both rows (not a memory operand twice)
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(p[r], x, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)  // the keys only one row of the pair takes
    for (int64_t j = both; j < n[r]; ++j) {
      const int64_t key = pv_key(j, n[r]);
      const __m512 p = _mm512_set1_ps(pr[r][key]);
      const float* v = vbuf + key * D + d0;
      for (int c = 0; c < NV; ++c)
        acc[r][c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * c), acc[r][c]);
    }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(tile[r] + d0 + 16 * c, acc[r][c]);
}
template <int R>
LOWBIT_AVX512 void pv_tile_avx512(float* const (&tile)[2], const float* const (&pr)[2],
                                  const float* vbuf, const int64_t (&n)[2], int64_t D) {
  int64_t d0 = 0;  // (2 x 8 or 8 vector chains at 128 channels: enough to hide the FMA latency)
  for (; d0 + 128 <= D; d0 += 128) pv_block_avx512<8, R>(tile, pr, vbuf, n, D, d0);
  for (; d0 + 64 <= D; d0 += 64) pv_block_avx512<4, R>(tile, pr, vbuf, n, D, d0);
  for (; d0 + 32 <= D; d0 += 32) pv_block_avx512<2, R>(tile, pr, vbuf, n, D, d0);
  for (; d0 < D; d0 += 16) pv_block_avx512<1, R>(tile, pr, vbuf, n, D, d0);
}
// P·V on AVX512_BF16 where P and V are exact in bf16 (the fp8 mode's e4m3 values, or bf16 V
// with P rounded to bf16): vdpbf16ps, the same bits as pv_block_avx512's fused multiply-adds
// when no input, product or sum is denormal (the caller's guard). V staged as bf16 key pairs
// (vb[(m D + d) 2 + e] = v[2 m + e][d]), each row's P pair (keys 2 m, 2 m + 1) one 32-bit
// broadcast; a row's last key without its pair by one fused multiply-add.
inline uint32_t p_pair_bits(const float* pr, int64_t m) {
  uint32_t lo, hi;
  std::memcpy(&lo, pr + 2 * m, 4);
  std::memcpy(&hi, pr + 2 * m + 1, 4);
  return (lo >> 16) | (hi & 0xffff0000u);  // (P exact in bf16: the low 16 bits are 0)
}
// DP false: the same steps as single fused multiply-adds of the widened values (the pair's odd
// key first), for tiles where a value could be denormal (vdpbf16ps would read it as 0).
template <bool DP>
LOWBIT_AVX512_BF16 inline __m512 pv_pair_step(__m512 acc, const float* pr, int64_t m, __m512i x) {
  if constexpr (DP) {
    const __m512i p = _mm512_set1_epi32(static_cast<int>(p_pair_bits(pr, m)));
    return _mm512_dpbf16_ps(acc, (__m512bh)p, (__m512bh)x);
  } else {
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(~0xffff)));
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(pr[2 * m + 1]), odd, acc);
    return _mm512_fmadd_ps(_mm512_set1_ps(pr[2 * m]), even, acc);
  }
}
template <bool DP, int NV, int R>
LOWBIT_AVX512_BF16 inline void pv_block_bf16(float* const (&tile)[2], const float* const (&pr)[2],
                                             const uint16_t* vb, const int64_t (&n)[2], int64_t D,
                                             int64_t d0) {
  __m512 acc[R][NV];
  for (auto& r : acc)
    for (auto& a : r) a = _mm512_setzero_ps();
  const int64_t both = (R == 2 ? std::min(n[0], n[1]) : n[0]) / 2;  // whole pairs
  for (int64_t m = 0; m < both; ++m) {
    const uint16_t* v = vb + (m * D + d0) * 2;
    for (int c = 0; c < NV; ++c) {
      __m512i x = _mm512_loadu_si512(v + 32 * c);
      if (R == 2) asm("" : "+v"(x));  // one load for both rows
      for (int r = 0; r < R; ++r) acc[r][c] = pv_pair_step<DP>(acc[r][c], pr[r], m, x);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t m = both; m < n[r] / 2; ++m) {
      const uint16_t* v = vb + (m * D + d0) * 2;
      for (int c = 0; c < NV; ++c)
        acc[r][c] = pv_pair_step<DP>(acc[r][c], pr[r], m, _mm512_loadu_si512(v + 32 * c));
    }
    if (n[r] & 1) {  // the last key alone: its bf16 (the low half) widened to f32
      const int64_t m = n[r] / 2;
      const __m512 p = _mm512_set1_ps(pr[r][2 * m]);
      const uint16_t* v = vb + (m * D + d0) * 2;
      for (int c = 0; c < NV; ++c) {
        const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(v + 32 * c), 16));
        acc[r][c] = _mm512_fmadd_ps(p, x, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(tile[r] + d0 + 16 * c, acc[r][c]);
}
template <bool DP, int R>
LOWBIT_AVX512_BF16 void pv_tile_bf16(float* const (&tile)[2], const float* const (&pr)[2],
                                     const uint16_t* vb, const int64_t (&n)[2], int64_t D) {
  int64_t d0 = 0;
  for (; d0 + 128 <= D; d0 += 128) pv_block_bf16<DP, 8, R>(tile, pr, vb, n, D, d0);
  for (; d0 + 64 <= D; d0 += 64) pv_block_bf16<DP, 4, R>(tile, pr, vb, n, D, d0);
  for (; d0 + 32 <= D; d0 += 32) pv_block_bf16<DP, 2, R>(tile, pr, vb, n, D, d0);
  for (; d0 < D; d0 += 16) pv_block_bf16<DP, 1, R>(tile, pr, vb, n, D, d0);
}
// A row pair's P·V tiles (tile, tile + D; P at pr, pr + kKvTile; n keys each) by a two-row
// kernel: run(R, tiles, P rows, key counts) with R = 2, or R = 1 for the one row with keys.
template <typename F>
void pv_rows(float* tile, const float* pr, const int64_t (&n)[2], int64_t D, F&& run) {
  float* const tiles[2] = {tile, tile + D};
  const float* const prs[2] = {pr, pr + kKvTile};
  if (n[0] > 0 && n[1] > 0) {
    run(std::integral_constant<int, 2>{}, tiles, prs, n);
    return;
  }
  const int slot = n[0] > 0 ? 0 : 1;
  float* const one_tile[2] = {tiles[slot], nullptr};
  const float* const one_pr[2] = {prs[slot], nullptr};
  const int64_t one_n[2] = {n[slot], 0};
  run(std::integral_constant<int, 1>{}, one_tile, one_pr, one_n);
}
#endif
// tile[d] = sum over keys j < n, in pv_key's order, of pr[j] * v[j][d] (tile zeroed first): per
// element one rounded product and one rounded sum per key.
// (64 channels at a time held in registers across the keys; D is a multiple of 16.) EXACT:
// every product pr[j] * v[j][d] is exact in fp32 (e4m3 or 16-bit P times e4m3 or 16-bit V: at
// most 22 significant bits), so a fused multiply-add gives the same bits as the product and the
// sum rounded one after the other; with an f32 V (CPU only) the two roundings are kept.
template <bool EXACT, int W>
inline void pv_block(float* tile, const float* pr, const float* vbuf, int64_t n, int64_t D,
                     int64_t d0) {
  float acc[W] = {};
  for (int64_t j = 0; j < n; ++j) {
    const int64_t key = pv_key(j, n);
    const float p = pr[key];
    const float* v = vbuf + key * D + d0;
    for (int c = 0; c < W; ++c) acc[c] = EXACT ? std::fma(p, v[c], acc[c]) : acc[c] + p * v[c];
  }
  for (int c = 0; c < W; ++c) tile[d0 + c] = acc[c];
}
template <bool EXACT>
inline void pv_blocks(float* tile, const float* pr, const float* vbuf, int64_t n, int64_t D) {
  int64_t d0 = 0;  // (64 channels: 8 independent vector chains, enough to hide the FMA latency)
  for (; d0 + 64 <= D; d0 += 64) pv_block<EXACT, 64>(tile, pr, vbuf, n, D, d0);
  for (; d0 + 32 <= D; d0 += 32) pv_block<EXACT, 32>(tile, pr, vbuf, n, D, d0);
  for (; d0 < D; d0 += 16) pv_block<EXACT, 16>(tile, pr, vbuf, n, D, d0);
}
LOWBIT_CLONES_FMA void pv_tile(float* tile, const float* pr, const float* vbuf, int64_t n,
                               int64_t D, bool exact_products) {
  if (exact_products)
    pv_blocks<true>(tile, pr, vbuf, n, D);
  else
    pv_blocks<false>(tile, pr, vbuf, n, D);
}
// pv_tile for two rows at once (tile0 over n0 keys of pr0, tile1 over n1 keys of pr1; each row's
// element the same operations in the same order as pv_tile's): the keys both rows see load each
// V value once for two products. 32 channels a block (8 vector chains).
template <bool EXACT>
__attribute__((always_inline)) inline void pv_pair_blocks(float* tile0, float* tile1,
                                                          const float* pr0, const float* pr1,
                                                          const float* vbuf, int64_t n0, int64_t n1,
                                                          int64_t D) {
  constexpr int W = 32;
  const int64_t both = std::min(n0, n1) & ~int64_t{1};  // whole key pairs both rows take
  for (int64_t d0 = 0; d0 < D; d0 += W) {
    if (D - d0 < W) {  // (D a multiple of 16: one last block of 16)
      pv_block<EXACT, 16>(tile0, pr0, vbuf, n0, D, d0);
      pv_block<EXACT, 16>(tile1, pr1, vbuf, n1, D, d0);
      continue;
    }
    float a0[W] = {}, a1[W] = {};
    for (int64_t j = 0; j < both; ++j) {
      const int64_t key = pv_key(j, both);
      const float p0 = pr0[key], p1 = pr1[key];
      const float* v = vbuf + key * D + d0;
      for (int c = 0; c < W; ++c) {
        a0[c] = EXACT ? std::fma(p0, v[c], a0[c]) : a0[c] + p0 * v[c];
        a1[c] = EXACT ? std::fma(p1, v[c], a1[c]) : a1[c] + p1 * v[c];
      }
    }
    for (int64_t j = both; j < n0; ++j) {
      const int64_t key = pv_key(j, n0);
      const float p0 = pr0[key];
      const float* v = vbuf + key * D + d0;
      for (int c = 0; c < W; ++c) a0[c] = EXACT ? std::fma(p0, v[c], a0[c]) : a0[c] + p0 * v[c];
    }
    for (int64_t j = both; j < n1; ++j) {
      const int64_t key = pv_key(j, n1);
      const float p1 = pr1[key];
      const float* v = vbuf + key * D + d0;
      for (int c = 0; c < W; ++c) a1[c] = EXACT ? std::fma(p1, v[c], a1[c]) : a1[c] + p1 * v[c];
    }
    for (int c = 0; c < W; ++c) {
      tile0[d0 + c] = a0[c];
      tile1[d0 + c] = a1[c];
    }
  }
}
LOWBIT_CLONES_FMA void pv_tile_pair(float* tile0, float* tile1, const float* pr0, const float* pr1,
                                    const float* vbuf, int64_t n0, int64_t n1, int64_t D,
                                    bool exact_products) {
  if (exact_products)
    pv_pair_blocks<true>(tile0, tile1, pr0, pr1, vbuf, n0, n1, D);
  else
    pv_pair_blocks<false>(tile0, tile1, pr0, pr1, vbuf, n0, n1, D);
}
// s[j] = dot[j] (q_scale k_scale[j]) scale_log2 for the row's n keys of a tile; returns their
// maximum (-inf for none; a NaN score never wins, as std::max(m, s) key after key: the maximum
// of the other scores does not depend on the order).
LOWBIT_CLONES float tile_scores(const int32_t* dots, const float* ksv, float qs, float scale_log2,
                                int64_t n, float* s) {
  for (int64_t j = 0; j < n; ++j) s[j] = static_cast<float>(dots[j]) * (qs * ksv[j]) * scale_log2;
  // 8 running maxima (element-wise selects, which vectorize), then theirs
  const float ninf = -std::numeric_limits<float>::infinity();
  float lane[8] = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] < s[j + l] ? s[j + l] : lane[l];
  float m = ninf;
  for (; j < n; ++j) m = m < s[j] ? s[j] : m;
  for (int l = 0; l < 8; ++l) m = m < lane[l] ? lane[l] : m;
  return m;
}
// p[j] = 2^(s[j] - m_off) (rows::exp2); returns their sum in 16 lanes (lane l adds the keys
// j = l mod 16 in key order), then the lanes as a tree (l += l + 8, l + 4, l + 2, l + 1): one
// order whatever vectors the compiler picks, and no chain of 64 dependent additions (SPEC leaves
// the row sum's order open; this one is 16 keys deep).
LOWBIT_CLONES float tile_probs(const float* s, float m_off, int64_t n, float* p) {
  for (int64_t j = 0; j < n; ++j) p[j] = s[j] - m_off;
  rows::exp2(p, n, p);
  float lane[16] = {};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lane[l] += p[j + l];
  for (int l = 0; j + l < n; ++l) lane[l] += p[j + l];
  for (int h = 8; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) lane[l] += lane[l + h];
  return lane[0];
}
// An output row from its accumulator: o = acc / l, times the V scale (fp8 mode), plus the V
// mean (V mean smoothing), each a rounded step (no contraction); 0 for l <= 0 (no key seen).
LOWBIT_CLONES void finish_row(float* acc, int64_t D, float l, const float* vs, int64_t vss,
                              const float* vm, int64_t vms) {
  if (!(l > 0.f)) {
    for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
  } else if ((!vs || vss == 1) && (!vm || vms == 1)) {  // (the loops that vectorize)
    for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] / l;
    if (vs)
      for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * vs[d];
    if (vm)
      for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] + vm[d];
  } else {
    for (int64_t d = 0; d < D; ++d) {
      float o = acc[d] / l;
      if (vs) o *= vs[d * vss];
      if (vm) o += vm[d * vms];
      acc[d] = o;
    }
  }
}
// out[d] = q[d] + 128 as uint8 (the VNNI dots' biased rows): q's bits with the top one flipped.
LOWBIT_CLONES void bias_row(const int8_t* q, int64_t D, uint8_t* out) {
  for (int64_t d = 0; d < D; ++d) out[d] = static_cast<uint8_t>(static_cast<uint8_t>(q[d]) ^ 0x80u);
}
// x[d] = (x[d] - mean[d]) / scale[d], 0 where the scale is 0 (the channel is all mean): V's
// values before the e4m3 encoder (quantize_v_fp8).
LOWBIT_CLONES void center_and_scale(float* x, const float* mean, const float* scale, int64_t D) {
  for (int64_t d = 0; d < D; ++d) {
    const float q = (x[d] - mean[d]) / scale[d];  // (masked below where the scale is 0)
    x[d] = scale[d] > 0.f ? q : 0.f;
  }
}
// acc[d] = acc[d] * r + tile[d].
LOWBIT_CLONES void rescale_add(float* acc, float r, const float* tile, int64_t D) {
  for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * r + tile[d];
}

}  // namespace

void quantize_v_fp8(const TensorView& v, TensorView v_fp8, TensorView v_scale, TensorView* v_mean,
                    Context& ctx, const int32_t* rows, const int32_t* lens) {
  LOWBIT_CHECK(!rows && !lens, "quantize_v_fp8", "rows",
               "internal: padded varlen batches are a CUDA path");
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], D = v.shape[3];
  const int64_t npad = v_fp8.shape[3];
  // (Rows of V loaded whole (channels contiguous: the one-call path's V; any channel stride by
  // load_row_f32); per element the operations of the plain per-element loops.)
  parallel_for(B * H, 1, ctx, [&](int64_t b0, int64_t b1) {
    std::vector<float> mean(static_cast<size_t>(D)), amax(static_cast<size_t>(D)),
        scale(static_cast<size_t>(D)), x(static_cast<size_t>(D));
    std::vector<uint8_t> group_codes(static_cast<size_t>(32 * D));
    int64_t group_pos[32];  // (key r of a group -> its position)
    for (int64_t r = 0; r < 32; ++r) group_pos[r] = fp8_v_position(r);
    for (int64_t bh = b0; bh < b1; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      std::fill(mean.begin(), mean.end(), 0.f);
      std::fill(amax.begin(), amax.end(), 0.f);
      if (v_mean) {
        for (int64_t n = 0; n < N; ++n) {
          load_row_f32(v, off4(v, b, n, h, 0), D, x.data());
          for (int64_t d = 0; d < D; ++d) mean[d] += x[d];
        }
        for (int64_t d = 0; d < D; ++d) {
          mean[d] = N > 0 ? mean[d] / static_cast<float>(N) : 0.f;
          v_mean->ptr<float>()[off3(*v_mean, b, h, d)] = mean[d];
        }
      }
      for (int64_t n = 0; n < N; ++n) {
        load_row_f32(v, off4(v, b, n, h, 0), D, x.data());
        for (int64_t d = 0; d < D; ++d) amax[d] = std::max(amax[d], std::fabs(x[d] - mean[d]));
      }
      uint8_t* codes = v_fp8.ptr<uint8_t>() + (b * H + h) * D * npad;
      for (int64_t d = 0; d < D; ++d) {
        scale[d] = amax[d] / 448.f;
        v_scale.ptr<float>()[off3(v_scale, b, h, d)] = scale[d];
      }
      // A 32-key group at a time: its keys' codes as rows (padding keys 0), then each channel's
      // 32 bytes in the layout's order (one cache line written whole, not a byte per key).
      for (int64_t n0 = 0; n0 < npad; n0 += 32) {
        for (int64_t r = 0; r < 32; ++r) {
          uint8_t* row = group_codes.data() + r * D;
          if (n0 + r >= N) {
            std::fill(row, row + D, uint8_t{0});
            continue;
          }
          load_row_f32(v, off4(v, b, n0 + r, h, 0), D, x.data());
          center_and_scale(x.data(), mean.data(), scale.data(), D);
          rows::f32_to_e4m3(x.data(), D, 1.f, row);
        }
        for (int64_t d = 0; d < D; ++d) {
          uint8_t* dst = codes + d * npad + n0;
          for (int64_t r = 0; r < 32; ++r) dst[group_pos[r]] = group_codes[r * D + d];
        }
      }
    }
  });
}

void attention_int8(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                    const TensorView* v_scale, const TensorView* v_mean, const TensorView* k_mean,
                    TensorView out, TensorView* lse_out, float sm_scale,
                    const AttentionOptions& options, Context& ctx,
                    const detail::VarlenItems* items) {
  LOWBIT_CHECK(items == nullptr, "attention_int8", "items",
               "internal: padded varlen batches are a CUDA path");
  const int64_t B = q.data.shape[0], Nq = q.data.shape[1], Hq = q.data.shape[2],
                D = q.data.shape[3];
  const int64_t Nkv = k.data.shape[1], Hkv = k.data.shape[2], G = Hq / Hkv;
  const bool fp8 = options.pv == AttentionOptions::fp8;
  const int64_t npad = fp8 ? v.shape[3] : 0;
  const float scale_log2 = sm_scale * kLog2e;
  const float p_offset = fp8 ? kLog2_448 : 0.f;
  const float inf = std::numeric_limits<float>::infinity();

  // One task: a block of row_block query rows of every head of one KV head's group, so that
  // each key tile's K rows, k scales and V values (fp8 codes decoded) are gathered once for
  // G x row_block rows; each row runs the same steps in the same order as a row on its own (the
  // split changes no bits).
  const int64_t row_block = attention_row_block(B * Hkv, Nq, G, thread_count(ctx));
  const int64_t n_blocks = (Nq + row_block - 1) / row_block;
  parallel_for(B * Hkv * n_blocks, 1, ctx, [&](int64_t t_begin, int64_t t_end) {
    std::vector<int8_t> qbuf, kbuf(static_cast<size_t>(kKvTile * D));
    std::vector<int16_t> kt(static_cast<size_t>(kKvTile * (D + 1)));
    std::vector<int32_t> dots(2 * kKvTile), ksum(kKvTile);
    std::vector<int8_t> kq(static_cast<size_t>(kKvTile * D));
    std::vector<uint8_t> qbu;  // the rows biased by 128 (the VNNI dots)
    const bool wide = rows::avx512_on();
    // AMX tiles (amx.h): every row's dots with a key tile in 32 x 32 blocks up front (the rows
    // zero-padded to 32 and D to 64; K packed 32 keys at a time).
    const bool tiles = wide && amx::on();
    const int64_t Dp = (D + 63) / 64 * 64;
    std::unique_ptr<amx::TileScope> scope;
    if (tiles) scope = std::make_unique<amx::TileScope>();
    std::vector<int8_t> qtiles,
        kpacked(tiles ? static_cast<size_t>(2 * amx::packed_b32_bytes(D)) : 0);
    std::vector<int32_t> dots_all;
    std::vector<int64_t> block_end;
    std::vector<float> ksv(kKvTile), vbuf(static_cast<size_t>(kKvTile * D));
    std::vector<float> s(kKvTile), p(kKvTile), pr(2 * kKvTile), tile(static_cast<size_t>(2 * D)),
        accs, ms, ls, qss;
    const float* e4m3 = rows::e4m3_table();
    // AVX512_BF16 with fp8 or bf16 V: V staged as bf16 key pairs for pv_tile_bf16 (the e4m3
    // values' bf16 bits, exact, or V's own bits), instead of f32 rows.
    const bool dp16 = rows::avx512_bf16_on() && (fp8 || v.dtype == DType::bf16);
    std::vector<uint16_t> vb16(dp16 ? static_cast<size_t>(kKvTile * D) : 0), e4m3_bf16(256);
    // bf16 V with channels adjacent: staged two keys at a time (stage_v_pair_avx512)
    const bool v_pairs = dp16 && !fp8 && v.stride[3] == 1;
    // key j's D values in vb16: every other uint16 from here (its pair's half j % 2)
    auto pair_slot = [&](int64_t j) { return vb16.data() + (j / 2) * 2 * D + (j & 1); };
    for (int c = 0; dp16 && c < 256; ++c) {
      uint32_t bits;
      std::memcpy(&bits, e4m3 + c, 4);
      e4m3_bf16[c] = static_cast<uint16_t>(bits >> 16);
    }
    std::vector<int64_t> ends;
    std::vector<uint16_t> p16(kKvTile);  // (a row's P in V's 16-bit dtype)
    for (int64_t task = t_begin; task < t_end; ++task) {
      const int64_t ib = task % n_blocks, hk = (task / n_blocks) % Hkv, b = task / (n_blocks * Hkv);
      const int64_t i0 = ib * row_block, n_i = std::min<int64_t>(row_block, Nq - i0);
      const int64_t R = G * n_i;  // row ri: head hk * G + ri / n_i, query i0 + ri % n_i
      qbuf.resize(static_cast<size_t>(R * D));
      if (wide && !tiles) qbu.resize(static_cast<size_t>(R * D));
      accs.assign(static_cast<size_t>(R * D), 0.f);
      ms.assign(static_cast<size_t>(R), -inf);
      ls.assign(static_cast<size_t>(R), 0.f);
      qss.resize(static_cast<size_t>(R));
      ends.resize(static_cast<size_t>(R));
      int64_t max_end = 0;
      const int64_t Rp = (R + 31) / 32 * 32;
      if (tiles) {
        qtiles.assign(static_cast<size_t>(Rp * Dp), int8_t{0});
        dots_all.resize(static_cast<size_t>(Rp * kKvTile));
        block_end.assign(static_cast<size_t>(Rp / 32), 0);
      }
      for (int64_t ri = 0; ri < R; ++ri) {
        const int64_t hq = hk * G + ri / n_i, i = i0 + ri % n_i;
        const int8_t* qrow = q.data.ptr<const int8_t>() + off4(q.data, b, i, hq, 0);
        if (q.data.stride[3] == 1)
          std::copy(qrow, qrow + D, qbuf.begin() + ri * D);
        else
          for (int64_t d = 0; d < D; ++d) qbuf[ri * D + d] = qrow[d * q.data.stride[3]];
        if (wide && !tiles)  // (the VNNI dots' rows, biased)
          bias_row(qbuf.data() + ri * D, D, qbu.data() + ri * D);
        qss[ri] =
            q.scale.ptr<const float>()[off3(q.scale, b, hq, scale_index(q.layout, q.block, i))];
        ends[ri] = visible_end(options.causal, i, Nq, Nkv);
        max_end = std::max(max_end, ends[ri]);
        if (tiles) {
          std::copy(qbuf.begin() + ri * D, qbuf.begin() + (ri + 1) * D, qtiles.begin() + ri * Dp);
          block_end[ri / 32] = std::max(block_end[ri / 32], ends[ri]);
        }
      }
      for (int64_t t0 = 0; t0 < max_end; t0 += kKvTile) {
        const int64_t tn = std::min<int64_t>(max_end, t0 + kKvTile) - t0;
        // vdpbf16ps reads denormal values as 0 and flushes denormal results: it runs where V's
        // nonzero values are finite with |v| >= 2^-55 (dp_unsafe, checked as V is staged) and
        // (below) each row's nonzero P >= 2^-55, so that every product and partial sum is a
        // multiple of 2^-124 (0 or normal).
        bool v_unsafe = false;
        for (int64_t j = 0; j < tn; ++j) {
          const int8_t* krow = k.data.ptr<const int8_t>() + off4(k.data, b, t0 + j, hk, 0);
          if (k.data.stride[3] == 1) {
            std::copy(krow, krow + D, kbuf.begin() + j * D);
          } else {
            for (int64_t d = 0; d < D; ++d) kbuf[j * D + d] = krow[d * k.data.stride[3]];
          }
          ksv[j] =
              k.scale
                  .ptr<const float>()[off3(k.scale, b, hk, scale_index(k.layout, k.block, t0 + j))];
          if (fp8 && dp16) {
            // (below, the whole tile at once)
          } else if (fp8) {
            const uint8_t* col = v.ptr<const uint8_t>() + (b * Hkv + hk) * D * npad;
            const int64_t pos = fp8_v_position(t0 + j);
            for (int64_t d = 0; d < D; ++d) vbuf[j * D + d] = e4m3[col[d * npad + pos]];
          } else if (v_pairs) {
            // (below, two keys at a time)
          } else if (dp16) {
            const uint16_t* src = v.ptr<const uint16_t>() + off4(v, b, t0 + j, hk, 0);
            uint16_t* dst = pair_slot(j);
            for (int64_t d = 0; d < D; ++d) {
              const uint16_t x = src[d * v.stride[3]];
              dst[2 * d] = x;
              v_unsafe |= dp_unsafe(x);
            }
          } else {
            load_row_f32(v, off4(v, b, t0 + j, hk, 0), D, vbuf.data() + j * D);
          }
        }
#ifdef LOWBIT_AVX512
        if (fp8 && dp16)
          v_unsafe = stage_v_fp8_avx512(v.ptr<const uint8_t>() + (b * Hkv + hk) * D * npad + t0,
                                        npad, D, tn, e4m3_bf16.data(), vb16.data());
        for (int64_t j = 0; v_pairs && j < tn; j += 2) {
          const uint16_t* first = v.ptr<const uint16_t>() + off4(v, b, t0 + j, hk, 0);
          v_unsafe |= stage_v_pair_avx512(first, j + 1 < tn ? first + v.stride[1] : nullptr, D,
                                          pair_slot(j));
        }
#endif
        const bool v_dp = dp16 && !v_unsafe;
        if (tiles) {
          const int64_t half = amx::packed_b32_bytes(D);
          for (int h = 0; h < 2 && 32 * h < tn; ++h)
            amx::pack_b32(kbuf.data() + 32 * h * D, D,
                          static_cast<int>(std::min<int64_t>(32, tn - 32 * h)), D,
                          kpacked.data() + h * half);
          for (int64_t rb = 0; rb < Rp / 32; ++rb) {
            if (block_end[rb] <= t0) continue;  // (no row of the block sees this tile)
            for (int h = 0; h < 2 && 32 * h < tn; ++h)
              amx::gemm_32x32(qtiles.data() + rb * 32 * Dp, Dp, kpacked.data() + h * half, Dp,
                              dots_all.data() + rb * 32 * kKvTile + 32 * h, kKvTile);
          }
        }
#ifdef LOWBIT_AVX512
        else if (wide)
          stage_keys_vnni(kbuf.data(), tn, D, kq.data(), ksum.data());
#endif
        else
          stage_keys(kbuf.data(), tn, D, kt.data());
        // Rows two at a time: each row's scores and P alone, then the two P·V tiles together
        // (pv_tile_pair: each V value loaded once for both rows; the same bits as pv_tile).
        for (int64_t r0 = 0; r0 < R; r0 += 2) {
          int64_t n[2] = {0, 0};
          float rescale[2] = {0.f, 0.f}, tile_sum[2] = {0.f, 0.f}, m_new[2] = {0.f, 0.f};
          bool p_tiny = false;  // (a P of either row in (0, 2^-55): no vdpbf16ps)
          for (int slot = 0; slot < 2 && r0 + slot < R; ++slot)
            n[slot] = std::max<int64_t>(0, std::min<int64_t>(ends[r0 + slot] - t0, tn));  // keys
          int32_t* const dot_rows[2] = {
              tiles ? dots_all.data() + r0 * kKvTile : dots.data(),
              tiles ? dots_all.data() + std::min(r0 + 1, R - 1) * kKvTile : dots.data() + kKvTile};
          if (!tiles) {  // (the tiles computed every row's dots above)
#ifdef LOWBIT_AVX512
            if (wide) {
              if (n[0] > 0 && n[1] > 0) {
                const uint8_t* const qrows[2] = {qbu.data() + r0 * D, qbu.data() + (r0 + 1) * D};
                tile_dots_vnni<2>(qrows, kq.data(), ksum.data(), D, dot_rows);
              } else if (n[0] > 0 || n[1] > 0) {
                const int slot = n[0] > 0 ? 0 : 1;
                const uint8_t* const qrow[2] = {qbu.data() + (r0 + slot) * D, nullptr};
                int32_t* const out_row[2] = {dot_rows[slot], nullptr};
                tile_dots_vnni<1>(qrow, kq.data(), ksum.data(), D, out_row);
              }
            } else
#endif
            {
              for (int slot = 0; slot < 2; ++slot)
                if (n[slot] > 0)
                  tile_dots(qbuf.data() + (r0 + slot) * D, kt.data(), D, dot_rows[slot]);
            }
          }
          for (int slot = 0; slot < 2 && r0 + slot < R; ++slot) {
            const int64_t ri = r0 + slot;
            if (n[slot] == 0) continue;
            const float tile_max =
#ifdef LOWBIT_AVX512
                wide
                    ? tile_scores_avx512(dot_rows[slot], ksv.data(), qss[ri], scale_log2, n[slot],
                                         s.data())
                    :
#endif
                    tile_scores(dot_rows[slot], ksv.data(), qss[ri], scale_log2, n[slot], s.data());
            const float m = ms[ri];
            m_new[slot] = std::max(m, tile_max);
            // (rows::exp2 is exact at integers (Rows.Exp2WithinTwoUlpAndPathsAgree): a maximum that
            // did not move skips the call for its 1)
            rescale[slot] = m == -inf                      ? 0.f
                            : m == m_new[slot] && m != inf ? 1.f
                                                           : rows::exp2(m - m_new[slot]);
            const float m_off = m_new[slot] - p_offset;
            tile_sum[slot] =
#ifdef LOWBIT_AVX512
                wide ? tile_probs_avx512(s.data(), m_off, n[slot], p.data()) :
#endif
                     tile_probs(s.data(), m_off, n[slot], p.data());
            // P through the format P·V runs in: e4m3 (fp8 mode) or V's 16-bit dtype
            float* prs = pr.data() + slot * kKvTile;
            if (fp8) {
              rows::round_e4m3(p.data(), n[slot], prs);  // (0 or >= 2^-9)
            } else {
              if (v.dtype == DType::f32) {
                std::copy(p.begin(), p.begin() + n[slot], prs);
              } else if (v.dtype == DType::bf16) {
                rows::round_bf16(p.data(), n[slot], prs);  // (store_f32's bits, then loaded)
              } else {  // (store_f32 then load_f32: P rounded to V's dtype)
                rows::store(p.data(), n[slot], v.dtype, p16.data(), 0);
                rows::load(p16.data(), 0, v.dtype, n[slot], prs);
              }
              if (dp16) p_tiny |= any_tiny(prs, n[slot]);
            }
          }
          const bool exact = fp8 || v.dtype != DType::f32;
#ifdef LOWBIT_AVX512
          if (dp16 && (n[0] > 0 || n[1] > 0)) {
            const bool dp = v_dp && !p_tiny;
            pv_rows(tile.data(), pr.data(), n, D, [&](auto r, auto& tr, auto& prs, auto& nr) {
              if (dp)
                pv_tile_bf16<true, decltype(r)::value>(tr, prs, vb16.data(), nr, D);
              else
                pv_tile_bf16<false, decltype(r)::value>(tr, prs, vb16.data(), nr, D);
            });
          } else if (wide && exact && (n[0] > 0 || n[1] > 0)) {
            pv_rows(tile.data(), pr.data(), n, D, [&](auto r, auto& tr, auto& prs, auto& nr) {
              pv_tile_avx512<decltype(r)::value>(tr, prs, vbuf.data(), nr, D);
            });
          } else
#endif
              if (n[0] > 0 && n[1] > 0)
            pv_tile_pair(tile.data(), tile.data() + D, pr.data(), pr.data() + kKvTile, vbuf.data(),
                         n[0], n[1], D, exact);
          else
            for (int slot = 0; slot < 2; ++slot)
              if (n[slot] > 0)
                pv_tile(tile.data() + slot * D, pr.data() + slot * kKvTile, vbuf.data(), n[slot], D,
                        exact);
          for (int slot = 0; slot < 2; ++slot) {
            if (n[slot] == 0) continue;
            const int64_t ri = r0 + slot;
            // Two-level accumulation: the tile's P·V (fresh buffer) joins the rescaled
            // accumulator.
            rescale_add(accs.data() + ri * D, rescale[slot], tile.data() + slot * D, D);
            ls[ri] = ls[ri] * rescale[slot] + tile_sum[slot];
            ms[ri] = m_new[slot];
          }
        }
      }
      for (int64_t ri = 0; ri < R; ++ri) {
        const int64_t hq = hk * G + ri / n_i, i = i0 + ri % n_i;
        const float l = ls[ri], m = ms[ri], qs = qss[ri];
        float* acc = accs.data() + ri * D;  // (becomes the output row, then stored)
        const float* vs = fp8 ? v_scale->ptr<const float>() + off3(*v_scale, b, hk, 0) : nullptr;
        const float* vm =
            fp8 && v_mean ? v_mean->ptr<const float>() + off3(*v_mean, b, hk, 0) : nullptr;
        const int64_t vss = fp8 ? v_scale->stride[2] : 0, vms = vm ? v_mean->stride[2] : 0;
        finish_row(acc, D, l, vs, vss, vm, vms);
        if (out.stride[3] == 1)
          rows::store(acc, D, out.dtype, out.data, off4(out, b, i, hq, 0));
        else
          for (int64_t d = 0; d < D; ++d)
            store_f32(out.data, off4(out, b, i, hq, d), out.dtype, acc[d]);
        if (lse_out) {
          float lse = -inf;
          if (l > 0.f) {
            lse = (m + std::log2(l) - p_offset) * kLn2;
            if (k_mean) {
              const float* km = k_mean->ptr<const float>() + off3(*k_mean, b, hk, 0);
              const int8_t* qrow = qbuf.data() + ri * D;
              float dot = 0.f;
              for (int64_t d = 0; d < D; ++d) dot += static_cast<float>(qrow[d]) * qs * km[d];
              lse += dot * sm_scale;
            }
          }
          lse_out->ptr<float>()[off3(*lse_out, b, hq, i)] = lse;
        }
      }
    }
  });
}

}  // namespace cpu

void attention_reference_f64(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options, double* out_ref, double* lse_ref) {
  const int64_t B = q.shape[0], Nq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t Nkv = k.shape[1], Hkv = k.shape[2], G = Hq / Hkv;
  const double sm = options.sm_scale != 0.f ? static_cast<double>(options.sm_scale)
                                            : 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(Nkv, 1)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t hk = hq / G;
        const int64_t end = cpu::visible_end(options.causal, i, Nq, Nkv);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < end; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += static_cast<double>(load_f32(q.data, cpu::off4(q, b, i, hq, d), q.dtype)) *
                   load_f32(k.data, cpu::off4(k, b, j, hk, d), k.dtype);
          s[j] = dot * sm;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < end; ++j) {
          s[j] = std::exp(s[j] - m);  // the weights, once per key
          l += s[j];
        }
        double* o = out_ref + ((b * Nq + i) * Hq + hq) * D;
        for (int64_t d = 0; d < D; ++d) {
          double a = 0;
          for (int64_t j = 0; j < end; ++j)
            a += s[j] * load_f32(v.data, cpu::off4(v, b, j, hk, d), v.dtype);
          o[d] = end > 0 ? a / l : 0.0;
        }
        if (lse_ref)
          lse_ref[(b * Hq + hq) * Nq + i] =
              end > 0 ? m + std::log(l) : -std::numeric_limits<double>::infinity();
      }
}

}  // namespace lowbit
