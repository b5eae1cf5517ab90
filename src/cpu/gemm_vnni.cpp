// The blocked AVX-512 VNNI int8 GEMM (gemm_vnni.h).
#include "src/cpu/gemm_vnni.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {
namespace vnni {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOWBIT_VNNI_GEMM 1
#define LOWBIT_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
#endif

bool available() {
#ifdef LOWBIT_VNNI_GEMM
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

namespace {
std::atomic<bool> g_forced{false};
}  // namespace
void force(bool on) { g_forced.store(on); }
bool forced() { return g_forced.load(); }

int64_t panel_bytes(int64_t K) { return K / 4 * kPanel * 4; }

#ifdef LOWBIT_VNNI_GEMM
namespace {

// pack_panel on AVX-512: 16 rows x 16 k-quads at a time, transposed in registers (rows past n
// and quads past K / 4 loaded as zeros); the row sums by vpdpbusd against ones.
LOWBIT_VNNI_TARGET void pack_panel_avx512(const int8_t* w, int n, int64_t K, int8_t* panel,
                                          uint32_t* sum128) {
  const int64_t quads = K / 4;
  for (int j0 = 0; j0 < kPanel; j0 += 16) {
    for (int64_t q0 = 0; q0 < quads; q0 += 16) {
      const int64_t nq = std::min<int64_t>(16, quads - q0);
      const __mmask16 qm = static_cast<__mmask16>((1u << nq) - 1);
      __m512i r[16], c[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < n ? _mm512_maskz_loadu_epi32(qm, w + (j0 + i) * K + q0 * 4)
                          : _mm512_setzero_si512();
      transpose16_epi32(r, c);
      int8_t* out = panel + (q0 * kPanel + j0) * 4;
      for (int64_t t = 0; t < nq; ++t) _mm512_storeu_si512(out + t * kPanel * 4, c[t]);
    }
  }
  const __m512i ones = _mm512_set1_epi8(1);
  for (int j = 0; j < kPanel; ++j) {
    __m512i acc = _mm512_setzero_si512();
    for (int64_t k = 0; j < n && k < K; k += 64) {
      const __mmask64 m = tail_mask(K - k);
      acc = _mm512_dpbusd_epi32(acc, ones, _mm512_maskz_loadu_epi8(m, w + j * K + k));
    }
    sum128[j] = static_cast<uint32_t>(_mm512_reduce_add_epi32(acc)) * 128u;
  }
}

}  // namespace
#endif

// panel[(q kPanel + j) 4 + r] = w[j][4 q + r].
void pack_panel(const int8_t* w, int n, int64_t K, int8_t* panel, uint32_t* sum128) {
#ifdef LOWBIT_VNNI_GEMM
  if (available()) return pack_panel_avx512(w, n, K, panel, sum128);
#endif
  const int64_t quads = K / 4;
  for (int j = 0; j < kPanel; ++j) {
    uint32_t sum = 0;
    for (int64_t q = 0; q < quads; ++q) {
      int8_t* dst = panel + (q * kPanel + j) * 4;
      if (j < n) {
        std::memcpy(dst, w + j * K + q * 4, 4);
        for (int r = 0; r < 4; ++r) sum += static_cast<uint32_t>(static_cast<int32_t>(dst[r]));
      } else {
        std::memset(dst, 0, 4);
      }
    }
    sum128[j] = sum * 128u;
  }
}

#ifdef LOWBIT_VNNI_GEMM
namespace {

// R activation rows (R <= kRows) against the panel: R x 3 accumulators, one broadcast per row
// and k-quad, three panel loads per k-quad. (Named variables, not an array: GCC 12 kept an array
// of accumulators in memory, stored and reloaded every k-quad.)
#define LOWBIT_VNNI_ROWS(X) X(0) X(1) X(2) X(3)
template <int R>
LOWBIT_VNNI_TARGET void block(const uint8_t* a, int64_t lda, const int8_t* panel,
                              const uint32_t* sum128, int64_t quads, int32_t* dots) {
  static_assert(R >= 1 && R <= kRows, "rows per block");
#define LOWBIT_DECL(i) \
  __m512i c##i##0 = _mm512_setzero_si512(), c##i##1 = c##i##0, c##i##2 = c##i##0;
  LOWBIT_VNNI_ROWS(LOWBIT_DECL)
#undef LOWBIT_DECL
  const int8_t* p = panel;
  for (int64_t q = 0; q < quads; ++q, p += kPanel * 4) {
    const __m512i b0 = _mm512_loadu_si512(p);
    const __m512i b1 = _mm512_loadu_si512(p + 64);
    const __m512i b2 = _mm512_loadu_si512(p + 128);
#define LOWBIT_ROW(i)                              \
  if constexpr (i < R) {                           \
    int32_t quad;                                  \
    std::memcpy(&quad, a + (i)*lda + q * 4, 4);    \
    const __m512i x = _mm512_set1_epi32(quad);     \
    c##i##0 = _mm512_dpbusd_epi32(c##i##0, x, b0); \
    c##i##1 = _mm512_dpbusd_epi32(c##i##1, x, b1); \
    c##i##2 = _mm512_dpbusd_epi32(c##i##2, x, b2); \
  }
    LOWBIT_VNNI_ROWS(LOWBIT_ROW)
#undef LOWBIT_ROW
  }
  const __m512i s0 = _mm512_loadu_si512(sum128), s1 = _mm512_loadu_si512(sum128 + 16),
                s2 = _mm512_loadu_si512(sum128 + 32);
#define LOWBIT_STORE(i)                                                         \
  if constexpr (i < R) {                                                        \
    _mm512_storeu_si512(dots + (i)*kPanel, _mm512_sub_epi32(c##i##0, s0));      \
    _mm512_storeu_si512(dots + (i)*kPanel + 16, _mm512_sub_epi32(c##i##1, s1)); \
    _mm512_storeu_si512(dots + (i)*kPanel + 32, _mm512_sub_epi32(c##i##2, s2)); \
  }
  LOWBIT_VNNI_ROWS(LOWBIT_STORE)
#undef LOWBIT_STORE
}
#undef LOWBIT_VNNI_ROWS

}  // namespace
#endif

void gemm_panel(const uint8_t* a, int64_t lda, int64_t M, const int8_t* panel,
                const uint32_t* sum128, int64_t K, int32_t* dots) {
#ifdef LOWBIT_VNNI_GEMM
  const int64_t quads = K / 4;
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows)
    block<kRows>(a + m * lda, lda, panel, sum128, quads, dots + m * kPanel);
  const uint8_t* ar = a + m * lda;
  int32_t* dr = dots + m * kPanel;
  static_assert(kRows == 4, "the remainder cases below");
  switch (M - m) {
    case 3:
      block<3>(ar, lda, panel, sum128, quads, dr);
      break;
    case 2:
      block<2>(ar, lda, panel, sum128, quads, dr);
      break;
    case 1:
      block<1>(ar, lda, panel, sum128, quads, dr);
      break;
    default:
      break;
  }
#else
  (void)a, (void)lda, (void)M, (void)panel, (void)sum128, (void)K, (void)dots;
#endif
}

}  // namespace vnni
}  // namespace cpu
}  // namespace lowbit
