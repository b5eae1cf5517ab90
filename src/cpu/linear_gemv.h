// The CPU decode GEMVs (convrot8 and convrotint8, 4-bit grouped rows, bit-packed 2-, 3-, 5-, 6- and
// 7-bit grouped rows, ComfyUI W4A4, NVFP4): a few activation rows against weight rows read where
// they are stored, on AVX-512 VBMI + VNNI (+ F / BW / VL). The 4-bit codes become their GEMM
// operands in registers (one vpermb on 16-entry tables per 64 bytes, or none for comfy), the
// bit-packed codes by vpermb + vpmultishiftqb on their fields and one lookup in the group's fold
// table (bits_vbmi.h), instead of being unpacked into a buffer first, and the weight rows ahead are
// prefetched, so a layer whose weights stream from memory is read near memory speed.
// The dots are the exact integer sums the other GEMMs give (the same bits).
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/linear.h"

namespace lowbit {
namespace cpu {
namespace convrot {

// Whether gemv_dots handles this weight on this CPU: AVX-512 F / BW / VL / VNNI / VBMI, the
// vector kernels on and not forced to AVX2, the GEMVs not switched off; convrot8 and convrotint8
// (one byte a code), the 4-bit grouped rows with groups a multiple of 32 (convrot_int4), the
// 2..7-bit rows with groups a multiple of 64, or comfy W4A4.
bool gemv_supported(const PackedWeightView& w);
// Where AVX-512 VBMI is missing (or the tests force the AVX2 kernels), convrot8 and convrotint8,
// the 4-bit rows (groups a multiple of 32, or comfy), the 2- and 3-bit rows and ternary rows
// (groups a multiple of 64) take an AVX2 form of the same GEMV (vpshufb tables, vpmaddubsw on
// |code| with the sign moved onto the activation): gemv_avx2 says which runs.
bool gemv_avx2(const PackedWeightView& w);
// Tests: take the other GEMMs even where gemv_supported / gemv_fp4_supported would hold.
void force_gemv_off(bool off);

// Bytes of one activation row in the GEMV's layout.
int64_t gemv_row_bytes(const PackedWeightView& w);
// M rows of int8 activation codes (row m at codes + m * K, natural order) into the GEMV's layout
// at out (M x gemv_row_bytes), zero past K; for the 4-bit weights, each block of 128 codes as its
// 64 even columns, then its 64 odd columns (the weight byte's low and high nibbles). sums[m]:
// the sum of row m's codes.
void gemv_pack_activations(const PackedWeightView& w, const int8_t* codes, int64_t M, int8_t* out,
                           int32_t* sums);
// dots[m * (o1 - o0) + (o - o0)] = the exact int32 dot of activation row m (M rows in act with
// their sums, from gemv_pack_activations) with the GEMM codes of weight row o, o in [o0, o1).
// A 4-bit, 2-bit or 3-bit grouped weight's tables come from w.decode_tiles when it holds them
// on the host (gemv_build_tables), else they are built row by row here (5..7 bits always).
void gemv_dots(const PackedWeightView& w, const int8_t* act, const int32_t* act_sums, int64_t M,
               int64_t o0, int64_t o1, int32_t* dots);

// The int8 GEMM codes of weight rows o0 .. o0 + n - 1 (n x K, natural order) by the GEMV's
// lookups, for the GEMMs that take unpacked rows; false (nothing written) where gemv_supported
// fails or the codes are not 4-bit.
bool gemv_unpack_rows(const PackedWeightView& w, int64_t o0, int64_t n, int8_t* codes);

// NVFP4 (convrot4): the exact int64 block-scaled dots (SPEC's units of 2^-20) of a few
// activation rows with weight rows read where they are stored (nibbles to twice-e2m1 integers
// by vpermb, 8 blocks a step, block dots by vpdpbusd, times the activation and weight scale
// integers in int32 / int64). Whether it runs (as gemv_supported, for convrot4); the
// activations in its layout (values: M rows of twice-e2m1 integers; scale_ints: M x K/16
// e4m3 integers); dots[m * (o1 - o0) + (o - o0)].
struct Fp4Activations {
  int64_t stride = 0, blocks = 0;  // values per row (K rounded up to 128), scales per row
  std::vector<int8_t> values;      // each block of 128 as its even, then its odd columns
  std::vector<int32_t> scales;     // block scale integers (0 past the row's blocks)
  std::vector<int32_t> sums12;     // 12 x each block's sum of values
};
bool gemv_fp4_supported(const PackedWeightView& w);
void gemv_fp4_pack_activations(const int8_t* values, const int32_t* scale_ints, int64_t M,
                               int64_t K, Fp4Activations& out);
void gemv_fp4_dots(const PackedWeightView& w, const int32_t* scale_ints, const Fp4Activations& act,
                   int64_t M, int64_t o0, int64_t o1, int64_t* dots);

// The tables of a 4-bit grouped weight (convrot_int4): for each row and group, the 16 GEMM
// codes + 128 of its nibbles (fold_code(v - 7, ratio) + 128), 16 bytes; rows of K / group * 16
// bytes. For 2- and 3-bit rows (groups a multiple of 64) the same with 2^n bytes a group
// (fold_code(u - qmax, ratio) + 128 for each stored u). Their bytes (0 where this CPU has no GEMV
// or the weight takes no tables), and building rows [o0, o1) of them into out.
int64_t gemv_tables_bytes(const PackedWeightView& w);
void gemv_build_tables(const PackedWeightView& w, int64_t o0, int64_t o1, uint8_t* out);

}  // namespace convrot
}  // namespace cpu
}  // namespace lowbit
