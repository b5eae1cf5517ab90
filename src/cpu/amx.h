// Intel AMX int8 tiles for the CPU backend's exact int8 dot products (the quantized linear
// layers' int8-code GEMM, the attention oracle's q . k): tdpbssd multiplies int8 by int8 and adds
// into int32 lanes, exactly (no saturation; every sum these callers form fits in int32), so a
// tile GEMM gives the integers of the vector and scalar loops, in any order.
//
// Layouts (one K chunk = 64 values):
//   A: 32 rows of a row-major int8 matrix (row stride lda bytes, Kp columns, Kp % 64 == 0);
//   B: 32 rows w_0 .. w_31 of K values packed by pack_b32 into Kp / 64 chunks of two 16-row
//      tiles, tile t of chunk c holding w_{16t + n}[64c + 4r + i] at byte 64 r + 4 n + i
//      (r < 16, n < 16, i < 4; 0 past K or past the rows given).
#pragma once

#include <cstdint>

namespace lowbit {
namespace cpu {
namespace amx {

// Whether the AMX int8 kernels run: the CPU has AMX-TILE and AMX-INT8, Linux granted this
// process the tile data state (asked for once, arch_prctl(ARCH_REQ_XCOMP_PERM)), and the tests
// have not turned them off.
bool on();
// Tests: keep the AMX kernels off (the AVX-512 / AVX2 loops run), to compare the two.
void force_off(bool off);
// (Each thread's first tile instruction traps into the kernel once, to grow the thread's saved
// state: ~50-100 us; parallel_for's workers persist, so a process pays it once per thread.)

// Bytes pack_b32 writes for K values a row: (K rounded up to 64) * 32.
inline int64_t packed_b32_bytes(int64_t K) { return (K + 63) / 64 * 64 * 32; }
// Packs rows w + j * ldw (j < n <= 32, K int8 values each) as B (above).
void pack_b32(const int8_t* w, int64_t ldw, int n, int64_t K, int8_t* packed);

// Holds this thread's tile configuration (8 tiles of 16 rows x 64 bytes) for its lifetime and
// releases the tile state at the end. Kernels below run only inside one (on() true).
class TileScope {
 public:
  TileScope();
  ~TileScope();
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// c[i * ldc + j] = sum_k a[i][k] * w_j[k] for i < 32, j < 32: A rows a + i * lda (Kp bytes each,
// zero past the true K), B packed by pack_b32 for the same Kp. Exact int32.
void gemm_32x32(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp, int32_t* c,
                int64_t ldc);
// The same for i < 16 (rows 16-31 of c untouched): half the tile work where at most 16 activation
// rows are left.
void gemm_16x32(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp, int32_t* c,
                int64_t ldc);
// gemm_16x32 when only the first `rows` <= 16 rows of A are meaningful, else gemm_32x32.
inline void gemm_rows_x32(const int8_t* a, int64_t lda, const int8_t* packed, int64_t Kp,
                          int32_t* c, int64_t ldc, int64_t rows) {
  if (rows <= 16)
    gemm_16x32(a, lda, packed, Kp, c, ldc);
  else
    gemm_32x32(a, lda, packed, Kp, c, ldc);
}

}  // namespace amx
}  // namespace cpu
}  // namespace lowbit
