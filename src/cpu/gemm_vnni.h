// A register-blocked int8 GEMM on AVX-512 VNNI for CPUs without AMX tiles (AMD Zen 4 / 5, Intel
// Ice Lake, Cascade Lake): activation rows of int8 codes times weight rows of int8 GEMM codes,
// exact int32 dots (the integers every other GEMM gives, hence the same bits after the epilogue).
//
// Layout: the weight rows of one panel (kPanel output columns) are packed so that one 512-bit
// load holds 16 columns x 4 consecutive k; the activation rows are biased to uint8 (code + 128)
// and one 4-byte broadcast per row and k-quad feeds vpdpbusd against kPanel / 16 such loads
// (kRows x 3 accumulators: an outer product per k-quad, no horizontal sums). The bias is undone
// with 128 x each column's code sum, in the same wrapping int32 arithmetic: the true dot fits in
// int32 (|a . w| <= K . 128 . 127 for K < 2^17), so the wrapped result is exact.
#pragma once

#include <cstdint>

namespace lowbit {
namespace cpu {
namespace vnni {

constexpr int kPanel = 48;  // output columns per packed panel (3 vectors of 16)
constexpr int kRows = 4;    // activation rows per register block (GCC 12 spills from 6: 18
                            // accumulators; 4 and 5 run at one vpdpbusd a cycle on Zen 4)

// Whether the blocked GEMM can run: AVX-512 F / BW / VNNI on this CPU (x86-64 builds with GCC or
// Clang); false elsewhere.
bool available();
// Tests: the CPU forward takes this GEMM for int8 codes at every row count wherever it can run.
void force(bool on);
bool forced();

// Bytes of one packed panel for K (K a multiple of 4).
int64_t panel_bytes(int64_t K);

// Packs weight rows 0 .. n - 1 (n <= kPanel; row j at w + j * K, int8 codes, K a multiple of 4)
// into `panel` (panel_bytes(K)); the columns past n are zero. sum128[j] = 128 x the sum of row j's
// codes (0 past n), wrapping.
void pack_panel(const int8_t* w, int n, int64_t K, int8_t* panel, uint32_t* sum128);

// dots[i * kPanel + j] = the exact int32 dot of activation row i (i < M; row i at a + i * lda,
// biased codes, K of them) with panel column j, for all kPanel columns (the zero columns give 0).
void gemm_panel(const uint8_t* a, int64_t lda, int64_t M, const int8_t* panel,
                const uint32_t* sum128, int64_t K, int32_t* dots);

}  // namespace vnni
}  // namespace cpu
}  // namespace lowbit
