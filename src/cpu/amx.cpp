// Intel AMX int8 tiles (amx.h).
#include "src/cpu/amx.h"

#include <algorithm>
#include <cstring>

#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <sys/syscall.h>
#include <unistd.h>

#include "src/cpu/x86_intrinsics.h"
#define LOWBIT_HAVE_AMX 1
#define LOWBIT_AMX __attribute__((target("amx-tile,amx-int8")))
#endif

namespace lowbit {
namespace cpu {
namespace amx {
namespace {

bool g_force_off = false;

#ifdef LOWBIT_HAVE_AMX
// arch_prctl codes (asm/prctl.h) and the tile data state's XSAVE feature number.
constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureTileData = 18;

bool ask_for_tiles() {
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8") ||
      !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw"))
    return false;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) != 0) return false;
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0) return false;
  return (granted >> kXfeatureTileData) & 1u;
}

// The LDTILECFG operand: palette 1, every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
#endif

}  // namespace

bool on() {
#ifdef LOWBIT_HAVE_AMX
  static const bool granted = ask_for_tiles();
  return granted && !g_force_off;
#else
  return false;
#endif
}
void force_off(bool off) { g_force_off = off; }

#ifdef LOWBIT_HAVE_AMX
// One chunk of 16 rows: the 16 x 16 transpose of their 4-byte groups (unpack 32 / 64 within the
// 128-bit lanes, then the lanes gathered by two rounds of 128-bit shuffles). Rows past n and
// values past kn (< 64) are 0.
__attribute__((target("avx512f,avx512bw"))) void pack_tile(const int8_t* w, int64_t ldw, int n,
                                                           int64_t kn, int8_t* dst) {
  const __mmask64 mask = tail_mask(kn);
  __m512i r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < n ? _mm512_maskz_loadu_epi8(mask, w + i * ldw) : _mm512_setzero_si512();
  for (int g = 0; g < 16; g += 4) {
    t[g] = _mm512_unpacklo_epi32(r[g], r[g + 1]);
    t[g + 1] = _mm512_unpackhi_epi32(r[g], r[g + 1]);
    t[g + 2] = _mm512_unpacklo_epi32(r[g + 2], r[g + 3]);
    t[g + 3] = _mm512_unpackhi_epi32(r[g + 2], r[g + 3]);
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);          // lane L: rows g..g+3, group 4L
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);      // group 4L + 1
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);  // group 4L + 2
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);  // group 4L + 3
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i a = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x44);  // lanes 0, 1 of each
    const __m512i b = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xEE);  // lanes 2, 3
    const __m512i c = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x44);
    const __m512i d = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xEE);
    _mm512_storeu_si512(dst + (q)*64, _mm512_shuffle_i32x4(a, c, 0x88));         // group q
    _mm512_storeu_si512(dst + (4 + q) * 64, _mm512_shuffle_i32x4(a, c, 0xDD));   // 4 + q
    _mm512_storeu_si512(dst + (8 + q) * 64, _mm512_shuffle_i32x4(b, d, 0x88));   // 8 + q
    _mm512_storeu_si512(dst + (12 + q) * 64, _mm512_shuffle_i32x4(b, d, 0xDD));  // 12 + q
  }
}
#endif

void pack_b32(const int8_t* w, int64_t ldw, int n, int64_t K, int8_t* packed) {
#ifdef LOWBIT_HAVE_AMX
  if (on()) {  // (AMX CPUs have AVX-512: ask_for_tiles checks it)
    for (int64_t c = 0; c * 64 < K; ++c)
      for (int t = 0; t < 2; ++t)
        pack_tile(w + t * 16 * ldw + c * 64, ldw, std::max(0, std::min(16, n - 16 * t)),
                  std::min<int64_t>(64, K - c * 64), packed + c * 2048 + t * 1024);
    return;
  }
#endif
  const int64_t chunks = (K + 63) / 64;
  std::memset(packed, 0, static_cast<size_t>(packed_b32_bytes(K)));
  for (int j = 0; j < n; ++j) {
    const int8_t* row = w + j * ldw;
    int8_t* tile = packed + (j / 16) * 1024 + 4 * (j % 16);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k0 = c * 64, kn = K - k0 < 64 ? K - k0 : 64;
      int8_t* dst = tile + c * 2048;
      for (int64_t k = 0; k < kn; ++k) dst[(k / 4) * 64 + k % 4] = row[k0 + k];
    }
  }
}

#ifdef LOWBIT_HAVE_AMX
namespace {
LOWBIT_AMX void load_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // (GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the operand: without this
  // barrier the stores of the tile shapes were dropped as dead.)
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}
LOWBIT_AMX void release_tiles() { _tile_release(); }
}  // namespace
TileScope::TileScope() { load_tile_config(); }
TileScope::~TileScope() { release_tiles(); }

// Tiles 0-3 the 2 x 2 blocks of C, 4-5 the two A row blocks, 6-7 the two B column blocks.
LOWBIT_AMX void gemm_32x32(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp,
                           int32_t* c, int64_t ldc) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < Kp; k += 64) {
    const int8_t* b = packed + (k / 64) * 2048;
    _tile_loadd(4, a + k, lda);
    _tile_loadd(5, a + 16 * lda + k, lda);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 1024, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  const int64_t stride = ldc * 4;
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  _tile_stored(2, c + 16 * ldc, stride);
  _tile_stored(3, c + 16 * ldc + 16, stride);
}
// The top half alone: tiles 0-1 of C, 4 of A, 6-7 of B.
LOWBIT_AMX void gemm_16x32(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp,
                           int32_t* c, int64_t ldc) {
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t k = 0; k < Kp; k += 64) {
    const int8_t* b = packed + (k / 64) * 2048;
    _tile_loadd(4, a + k, lda);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 1024, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
}
#else
// (Without AMX on() is false and nothing calls these; the loops keep their meaning.)
TileScope::TileScope() {}
TileScope::~TileScope() {}
namespace {
void gemm_rows(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp, int32_t* c,
               int64_t ldc, int rows) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < 32; ++j) {
      int32_t sum = 0;
      for (int64_t k = 0; k < Kp; ++k)
        sum +=
            int32_t{a[i * lda + k]} *
            packed[(k / 64) * 2048 + (j / 16) * 1024 + ((k % 64) / 4) * 64 + 4 * (j % 16) + k % 4];
      c[i * ldc + j] = sum;
    }
}
}  // namespace
void gemm_16x32(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp, int32_t* c,
                int64_t ldc) {
  gemm_rows(a, lda, packed, Kp, c, ldc, 16);
}
void gemm_32x32(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp, int32_t* c,
                int64_t ldc) {
  gemm_rows(a, lda, packed, Kp, c, ldc, 32);
}
#endif

}  // namespace amx
}  // namespace cpu
}  // namespace lowbit
