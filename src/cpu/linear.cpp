// CPU backend of the rotated quantized linear family (SPEC §3): the oracle the CUDA backend is
// compared against, and a usable backend. Row kernels live in linear_kernels.cpp; this file
// threads them over rows and runs the emulated GEMMs with the fp32 epilogue.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "lowbit/dtype.h"
#include "src/core/convert_elem.h"
#include "src/core/linear_backend.h"
#include "src/core/parallel.h"
#include "src/cpu/amx.h"
#include "src/cpu/cpu_clones.h"
#include "src/cpu/gemm_vnni.h"
#include "src/cpu/linear_gemv.h"
#include "src/cpu/linear_kernels.h"
#include "src/cpu/rows.h"
#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {

using namespace convrot;

namespace {

const uint8_t* row_bytes(const TensorView& t, int64_t r) {
  return static_cast<const uint8_t*>(t.data) + r * t.stride[0] * (dtype_bits(t.dtype) / 8);
}
uint8_t* row_bytes_mut(const TensorView& t, int64_t r) {
  return static_cast<uint8_t*>(t.data) + r * t.stride[0] * (dtype_bits(t.dtype) / 8);
}
// Rows per parallel chunk so that a chunk holds about 64 K elements.
int64_t grain_rows(int64_t K) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(K, 1)); }

bool int8_family(QType q) {
  return q == QType::convrot8 || (q >= QType::convrot_int2 && q <= QType::convrot_int8) ||
         q == QType::convrot_bitnet;
}

}  // namespace

// ---- rotation and weight quantization ---------------------------------------------------------

void hadamard_rotate(const TensorView& x, int block, TensorView out, Context& ctx) {
  const int64_t R = x.shape[0], K = x.shape[1];
  parallel_for(R, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = b; r < e; ++r) {
      rows::load(row_bytes(x, r), 0, x.dtype, K, row.data());
      rotate_row(row.data(), row.data(), K, block);
      rows::store(row.data(), K, out.dtype, row_bytes_mut(out, r), 0);
    }
  });
}

void quantize_weight(const TensorView& w, PackedWeight& out, Context& ctx) {
  const int64_t O = w.shape[0], K = w.shape[1];
  const int rot = out.rot();
  if (out.qtype() == QType::convrot4) {
    // Pass 1: the per-tensor amax of the rotated weight (rows re-rotated in pass 2, so no
    // full-size fp32 copy is kept).
    std::vector<float> part_amax(static_cast<size_t>(O), 0.f);
    parallel_for(O, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t o = b; o < e; ++o) {
        rows::load(row_bytes(w, o), 0, w.dtype, K, row.data());
        rotate_row(row.data(), row.data(), K, rot);
        float m = 0.f;
        bool nan = false;
        for (int64_t i = 0; i < K; ++i) {
          float a = std::fabs(row[i]);
          m = a > m ? a : m;
          nan |= a != a;
        }
        part_amax[o] = nan ? NAN : m;
      }
    });
    float amax = 0.f;
    bool nan = false;
    for (float a : part_amax) {
      amax = a > amax ? a : amax;
      nan |= a != a;
    }
    if (nan) amax = NAN;
    float pts = amax / 2688.f;
    if (pts == 0.f) pts = 1.f;
    std::memcpy(out.tensor_scale.data(), &pts, 4);
    const int64_t nb = K / 16;
    parallel_for(O, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t o = b; o < e; ++o) {
        rows::load(row_bytes(w, o), 0, w.dtype, K, row.data());
        rotate_row(row.data(), row.data(), K, rot);
        quantize_row_nvfp4_weight(row.data(), K, pts, out.block_scales.data() + o * nb,
                                  out.codes.data() + o * (K / 2));
      }
    });
    std::fill(out.block_scales_swizzled.begin(), out.block_scales_swizzled.end(), 0);
    for (int64_t o = 0; o < O; ++o)
      for (int64_t c = 0; c < nb; ++c)
        out.block_scales_swizzled[swizzle_index(o, c, nb)] = out.block_scales[o * nb + c];
    return;
  }
  const PackedWeightView ov = out.view();
  parallel_for(O, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t o = b; o < e; ++o) {
      rows::load(row_bytes(w, o), 0, w.dtype, K, row.data());
      rotate_row(row.data(), row.data(), K, rot);
      quantize_weight_row(row.data(), o, ov);
    }
  });
}

// ---- activations ------------------------------------------------------------------------------
namespace {

// Quantizes rows [b, e) of x into a_codes (row stride K bytes; K/2 for convrot4) and the scales.
//   a_codes: i8 codes (int8 family, comfy), e4m3 bytes (fp8), e2m1 pairs (convrot4)
//   a_scales: f32 per row, or e4m3 (K/16) per row for convrot4
void quantize_act_rows(const TensorView& x, QType q, int rot, int64_t b, int64_t e,
                       uint8_t* a_codes, int64_t code_stride, void* a_scales,
                       int64_t scale_stride) {
  const int64_t K = x.shape[1];
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t m = b; m < e; ++m) {
    rows::load(row_bytes(x, m), 0, x.dtype, K, row.data());
    rotate_row(row.data(), row.data(), K, rot);
    uint8_t* codes = a_codes + m * code_stride;
    if (q == QType::convrot4) {
      quantize_row_nvfp4_act(row.data(), K, static_cast<uint8_t*>(a_scales) + m * scale_stride,
                             codes);
    } else if (q == QType::convrot_fp8) {
      static_cast<float*>(a_scales)[m * scale_stride] = quantize_row_fp8(row.data(), K, codes);
    } else {
      const int qmax = q == QType::convrot_comfy_w4a4 ? 7 : 127;
      static_cast<float*>(a_scales)[m * scale_stride] =
          quantize_row_int(row.data(), K, qmax, reinterpret_cast<int8_t*>(codes));
    }
  }
}

}  // namespace

void rotate_quantize_activations(const TensorView& x, QType q, int rot, TensorView codes,
                                 TensorView scales, Context& ctx) {
  const int64_t M = x.shape[0], K = x.shape[1];
  const int64_t code_stride = q == QType::convrot4 ? codes.stride[0] / 2 : codes.stride[0];
  const int64_t scale_stride = q == QType::convrot4 ? scales.stride[0] : scales.stride[0];
  parallel_for(M, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
    quantize_act_rows(x, q, rot, b, e, static_cast<uint8_t*>(codes.data), code_stride, scales.data,
                      scale_stride);
  });
}

// ---- GEMMs
// ----------------------------------------------------------------------------------------
namespace {

LOWBIT_CLONES int32_t dot_i8(const int8_t* a, const int8_t* b, int64_t K) {
  int32_t acc = 0;
  for (int64_t k = 0; k < K; ++k)
    acc += static_cast<int32_t>(static_cast<int16_t>(a[k]) * static_cast<int16_t>(b[k]));
  return acc;
}

// out[i][j] = a_i . w_j for activation rows a_0, a_1 (kTwo; else a_0 alone, out[1] = out[0])
// and the 4 weight rows w + j * K: exact int32 (any summation order gives the same integers).
// AVX2: 16 codes at a time widened to int16, pairs multiplied and added by vpmaddwd, each load
// serving 4 or 2 products.
#ifdef LOWBIT_AVX2
template <bool kTwo>
LOWBIT_AVX2 int64_t dots_2x4_avx2(const int8_t* a0, const int8_t* a1, const int8_t* w, int64_t K,
                                  int32_t (&out)[2][4]) {
  __m256i acc[2][4];
  for (auto& r : acc)
    for (auto& c : r) c = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256i x0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a0 + k)));
    const __m256i x1 =
        kTwo ? _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a1 + k))) : x0;
    for (int j = 0; j < 4; ++j) {
      const __m256i y = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j * K + k)));
      acc[0][j] = _mm256_add_epi32(acc[0][j], _mm256_madd_epi16(x0, y));
      if (kTwo) acc[1][j] = _mm256_add_epi32(acc[1][j], _mm256_madd_epi16(x1, y));
    }
  }
  if (!kTwo)
    for (int j = 0; j < 4; ++j) acc[1][j] = acc[0][j];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) out[i][j] = sum_lanes8(acc[i][j]);
  return k;
}
#endif
// out[i][j] = a_i . w_j mod 2^32 for the R activation rows a[i] of biased codes (code + 128 as
// uint8) and the 4 weight rows w + j * K: AVX-512 VNNI, 64 codes a row per step, vpdpbusd (uint8
// x int8, 4 products added into each int32 lane, wrapping, never saturating). The caller
// subtracts 128 . sum(w_j) in the same wrapping arithmetic: the true dot fits in int32
// (|a . w| <= K . 127 . 128), so the wrapped result is exact. R = 0 gives the 4 row sums of w
// (out[0][j], ones against the codes).
#ifdef LOWBIT_AVX2
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline uint32_t sum_lanes(__m512i v) {
  return static_cast<uint32_t>(sum_lanes8(_mm256_add_epi32(
      _mm512_maskz_extracti64x4_epi64(0xF, v, 0), _mm512_maskz_extracti64x4_epi64(0xF, v, 1))));
}
// (Named accumulators, not an array: GCC 12 stored an array of them to memory every step.)
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void dots_vnni(const uint8_t* const* a,
                                                                      const int8_t* w, int64_t K,
                                                                      uint32_t (&out)[4][4]) {
  constexpr int kRows = R == 0 ? 1 : R;
#define LOWBIT_DV_DECL(i)                                                     \
  __m512i c##i##0 = _mm512_setzero_si512(), c##i##1 = c##i##0, c##i##2 = c##i##0, \
          c##i##3 = c##i##0;
  LOWBIT_DV_DECL(0) LOWBIT_DV_DECL(1) LOWBIT_DV_DECL(2) LOWBIT_DV_DECL(3)
#undef LOWBIT_DV_DECL
  for (int64_t k = 0; k < K; k += 64) {
    const __mmask64 mask = tail_mask(K - k);
    const __m512i y0 = _mm512_maskz_loadu_epi8(mask, w + k);
    const __m512i y1 = _mm512_maskz_loadu_epi8(mask, w + K + k);
    const __m512i y2 = _mm512_maskz_loadu_epi8(mask, w + 2 * K + k);
    const __m512i y3 = _mm512_maskz_loadu_epi8(mask, w + 3 * K + k);
#define LOWBIT_DV_ROW(i)                                                                   \
  if constexpr (i < kRows) {                                                               \
    const __m512i x = R == 0 ? _mm512_set1_epi8(1) : _mm512_maskz_loadu_epi8(mask, a[i] + k); \
    c##i##0 = _mm512_dpbusd_epi32(c##i##0, x, y0);                                         \
    c##i##1 = _mm512_dpbusd_epi32(c##i##1, x, y1);                                         \
    c##i##2 = _mm512_dpbusd_epi32(c##i##2, x, y2);                                         \
    c##i##3 = _mm512_dpbusd_epi32(c##i##3, x, y3);                                         \
  }
    LOWBIT_DV_ROW(0) LOWBIT_DV_ROW(1) LOWBIT_DV_ROW(2) LOWBIT_DV_ROW(3)
#undef LOWBIT_DV_ROW
  }
#define LOWBIT_DV_OUT(i)                                                        \
  if constexpr (i < kRows) {                                                    \
    out[i][0] = sum_lanes(c##i##0), out[i][1] = sum_lanes(c##i##1);             \
    out[i][2] = sum_lanes(c##i##2), out[i][3] = sum_lanes(c##i##3);             \
  }
  LOWBIT_DV_OUT(0) LOWBIT_DV_OUT(1) LOWBIT_DV_OUT(2) LOWBIT_DV_OUT(3)
#undef LOWBIT_DV_OUT
}
#endif
// Activation rows from which the int8-code GEMM runs on AMX tiles (below it the VNNI loops: the
// tiles' 32-row blocks would be mostly padding; 3072 -> 3072 on 2 cores: VNNI 0.64 / AMX 0.73 ms
// at 8 rows, 0.83 / 0.75 at 12).
constexpr int64_t kAmxMinRows = 10;
// The same for the fp8 GEMM (nine plane products; below, the same digits on VNNI; 3072 -> 3072
// streamed from memory on 2 cores, VNNI / tiles: 2.9 / 3.6 ms at 8 rows, 4.2 / 3.6 at 12).
constexpr int64_t kAmxMinRowsFp8 = 10;
// And for NVFP4 (below, the NVFP4 GEMV; 3072 -> 3072 streamed from memory on 2 cores, GEMV /
// tiles: 3.1 / 4.9 ms at 24 rows, 6.2 / 6.5 at 48, 7.8 / 7.6 at 64, 12.4 / 11.4 at 96; the
// tiles pay the weights' digit planes on every call).
constexpr int64_t kAmxMinRowsFp4 = 64;
// Activation rows below which the decode GEMV runs instead of the tiles, for int8 codes and for
// 4-bit codes (3072 x 3072 layers streamed from memory on 2 cores, GEMV vs tiles: int8 codes
// 1.07-1.32 / 1.27-1.47 ms at 12 rows, 1.42-1.54 / 1.33-1.37 at 16; int4 0.73-0.80 / 0.98-1.02
// at 12, 0.98-1.01 / 1.01-1.04 at 16 (comfy 0.91-0.92 / 1.02-1.06), 1.55-1.63 / 1.16 at 24).
// Without AMX tiles the GEMV runs at every row count: it beats the VNNI loops on unpacked rows
// everywhere (Zen 4, 2 threads, 24 layers 4096 -> 4096 streamed, GEMV / VNNI loops: convrot8
// 1.39 / 2.56 ms at 16 rows, 2.58 / 4.59 at 32, 5.10 / 8.33 at 64, 22.5-23.4 / 33.6-35.0 at 256
// (torch bf16 20.5-21.4), 86.7-86.9 / 122-129 at 1024 (torch 83-84); convrotint4 2.46 / 4.53 at
// 32, 24.9 / 31.0 at 256; comfy 3.01 / 4.51 at 32, 22.6 / 33.2 at 256).
constexpr int64_t kGemvMaxRows8 = 12, kGemvMaxRows4 = 18;
// The bit-packed 6- and 7-bit rows (their fold tables built per call, so passes of 4 activation
// rows re-read and re-extract every field): the GEMV below 8 rows, with or without AMX (Zen 4,
// 24 layers 4096 -> 4096 streamed, GEMV / VNNI loops on unpacked rows: int6 0.53 / 1.31 ms at 1
// row, 1.21 / 1.53 at 5, 1.45 / 1.70 at 8, 1.95 / 1.88 at 12; int7 0.65 / 1.32 at 1, 1.72 / 1.71
// at 8). 2, 3 and 5 bits follow kGemvMaxRows4 (int5 1.79 / 2.08 ms at 12 rows, int3 1.66 / 2.67
// at 15).
constexpr int64_t kGemvMaxRowsWideBits = 8;
// The AVX2 GEMV (no VBMI) below this many rows; above, the AVX2 dots on unpacked rows (4096 ->
// 4096 on 2 Zen 4 cores, AVX2 forced: convrot8 / int4 / comfy tie at 32 rows; ternary, whose
// base-3 digits the GEMV takes again for every pair of activation rows, 0.61 vs 0.92 ms at one
// row, 0.89 vs 1.04 at two, 1.46 vs 1.35 at four; int2 0.33 vs 0.95 at one row, 1.64 vs 2.23 at
// eight, ties at 16; int3 0.62 vs 1.23 at one row, 1.90 vs 2.14 at five, 2.59 vs 2.25 at eight).
constexpr int64_t kGemvMaxRowsAvx2 = 32, kGemvMaxRowsAvx2Ternary = 3, kGemvMaxRowsAvx2Int2 = 16,
                  kGemvMaxRowsAvx2Int3 = 6;
// fp8 without VNNI: the AVX2 GEMV on the stored codes below this many rows, else the blocked GEMM
// on decoded tiles (4096 -> 4096, 2 Zen 4 cores, AVX2 forced, ms: GEMV 1.9-2.0 / 2.7 / 4.2 / 8.0 /
// 16.9 at 1 / 2 / 4 / 8 / 16 rows against 6.1 / 5.7 / 6.7 / 9.6 / 12.3).
constexpr int64_t kFp8GemvMaxRows = 12;
// Without AMX tiles, activation rows from which the register-blocked VNNI GEMM (gemm_vnni.h)
// runs instead of the GEMV, and its activation rows per block.
constexpr int64_t kVnniBlockedMinRows = 16, kVnniRowBlock = 64;
// The same for the fp8 GEMM (nine digit-plane products; below, fp8_digit_dots_vnni: 3072 ->
// 3072 on 2 Zen 4 cores, blocked / digit dots 1.41 / 1.12 ms at 2 rows, 1.65 / 2.27 at 4, 4.1 /
// 8.5 at 16, 52 / 139 at 256).
constexpr int64_t kVnniBlockedMinRowsFp8 = 4;
// The GEMV's activation rows per sweep of a block of 64 weight rows (with many rows the
// activations would stream from the LLC for every pair of weight rows). Zen 4, 2 threads, 24
// layers 4096 -> 4096, 512 rows, medians of 6 alternated runs: convrot8 42.1 ms with 32-row
// blocks vs 53.1 unblocked (torch bf16 40.1-42.0), convrotint4 46.9 vs 47.0.
constexpr int64_t kGemvRowBlock = 32;
// The decode GEMV's output rows go out in this many chunks per hardware thread, taken by whoever
// is free (2 cores streaming 3072 x 3072 layers from memory, one row: 2 chunks 0.47 / 0.52 ms
// for comfy / int4, 8 chunks 0.34 / 0.41, 16 0.31 / 0.39).
constexpr int kGemvChunksPerThread = 8;
// Whether the GEMMs run on AMX tiles: amx::on(), the vector kernels are on and the tests have not
// asked for the AVX2 kernels.
bool amx_gemm_on() {
  return amx::on() && convrot::simd_kernels_on() && !convrot::avx2_kernels_forced();
}
// Whether dots_vnni runs: the CPU has AVX-512 F / BW / VNNI, the vector kernels are on and
// the tests have not asked for the AVX2 kernels (force_avx2_kernels).
bool vnni_gemm_on() {
#ifdef LOWBIT_AVX2
  return vnni::available() && convrot::simd_kernels_on() && !convrot::avx2_kernels_forced();
#else
  return false;
#endif
}
// Whether the blocked VNNI GEMM can run: as vnni_gemm_on, K a multiple of 4 and below 2^17
// (the exact dot within int32).
bool vnni_blocked_on(int64_t K) {
  return K % 4 == 0 && K < (int64_t{1} << 17) && vnni_gemm_on();
}

void dots_2x4(const int8_t* a0, const int8_t* a1, const int8_t* w, int64_t K,
              int32_t (&out)[2][4]) {
  int64_t k = 0;
#ifdef LOWBIT_AVX2
  if (convrot::simd_kernels_on())
    k = a1 == a0 ? dots_2x4_avx2<false>(a0, a1, w, K, out) : dots_2x4_avx2<true>(a0, a1, w, K, out);
#endif
  if (k == 0) {
    for (int j = 0; j < 4; ++j) {
      out[0][j] = dot_i8(a0, w + j * K, K);
      out[1][j] = a1 == a0 ? out[0][j] : dot_i8(a1, w + j * K, K);
    }
    return;
  }
  for (int j = 0; j < 4; ++j) {  // the tail past the last 16
    out[0][j] += dot_i8(a0 + k, w + j * K + k, K - k);
    out[1][j] += dot_i8(a1 + k, w + j * K + k, K - k);
  }
}

// e4m3 value times 2^9 as an exact integer (|v| <= 229376); NaN codes read as 0.
int32_t e4m3_int(uint8_t c) {
  int32_t e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return 0;
  int32_t mag = e == 0 ? m : (8 + m) << (e - 1);
  return (c & 0x80) ? -mag : mag;
}
// e4m3_int of every code (the NVFP4 block scales' per-block lookups).
const int32_t* e4m3_int_table() {
  static const std::array<int32_t, 256> table = [] {
    std::array<int32_t, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_int(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

int8_t twice_e2m1(uint8_t code) {
  static const int8_t twice[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  return static_cast<int8_t>((code & 8u) ? -twice[code & 7u] : twice[code & 7u]);
}

// out[i] = twice_e2m1 of the i-th nibble of packed (even element in the low nibble), i < n.
// SSSE3 in the AVX2 build: 16 bytes give 32 values through one 16-entry table lookup per nibble.
#ifdef LOWBIT_AVX2
LOWBIT_AVX2 int64_t decode_twice_e2m1_avx2(const uint8_t* packed, int64_t n, int8_t* out) {
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + i / 2));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(b, low4));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 16), _mm_unpackhi_epi8(lo, hi));
  }
  return i;
}
#endif
void decode_twice_e2m1(const uint8_t* packed, int64_t n, int8_t* out) {
  int64_t i = 0;
#ifdef LOWBIT_AVX2
  if (convrot::simd_kernels_on()) i = decode_twice_e2m1_avx2(packed, n, out);
#endif
  for (; i < n; ++i) out[i] = twice_e2m1(dt::get_nibble(packed, i));
}

// Σ_bl (a_bl . w_bl) · as[bl] · ws[bl] over nb blocks of 16 twice-e2m1 values (|.| <= 12) with
// integer block scales (e4m3 · 2^9, |.| < 2^18), exactly in int64: a block's dot is below 2^12,
// its product with as below 2^30 (int32), the product with ws below 2^48.
int64_t nvfp4_dot_scalar(const int8_t* a, const int32_t* as, const int8_t* w, const int32_t* ws,
                         int64_t nb) {
  int64_t acc = 0;
  for (int64_t bl = 0; bl < nb; ++bl) {
    int32_t dot = dot_i8(a + bl * 16, w + bl * 16, 16);
    acc += static_cast<int64_t>(dot) * as[bl] * ws[bl];
  }
  return acc;
}
// The same sum, 4 blocks a step (AVX2): the 4 block dots by vpmaddwd and two horizontal adds,
// times as by vpmulld (exact in int32), times ws by vpmuldq (exact in int64).
#ifdef LOWBIT_AVX2
LOWBIT_AVX2 int64_t nvfp4_dot_avx2(const int8_t* a, const int32_t* as, const int8_t* w,
                                   const int32_t* ws, int64_t nb) {
  __m256i acc = _mm256_setzero_si256();
  int64_t bl = 0;
  for (; bl + 4 <= nb; bl += 4) {
    __m256i d[4];
    for (int t = 0; t < 4; ++t) {
      const int64_t k = (bl + t) * 16;
      d[t] = _mm256_madd_epi16(
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k))),
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k))));
    }
    // hadd(hadd(d0, d1), hadd(d2, d3)): in each 128-bit half, lane t sums half of block t.
    const __m256i h =
        _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
    const __m128i dots = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128i da =
        _mm_mullo_epi32(dots, _mm_loadu_si128(reinterpret_cast<const __m128i*>(as + bl)));
    const __m256i da64 = _mm256_cvtepi32_epi64(da);
    const __m256i ws64 =
        _mm256_cvtepi32_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + bl)));
    acc = _mm256_add_epi64(acc, _mm256_mul_epi32(da64, ws64));
  }
  alignas(32) int64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] +
         nvfp4_dot_scalar(a + bl * 16, as + bl, w + bl * 16, ws + bl, nb - bl);
}
#endif
int64_t nvfp4_dot(const int8_t* a, const int32_t* as, const int8_t* w, const int32_t* ws,
                  int64_t nb) {
#ifdef LOWBIT_AVX2
  if (convrot::simd_kernels_on()) return nvfp4_dot_avx2(a, as, w, ws, nb);
#endif
  return nvfp4_dot_scalar(a, as, w, ws, nb);
}

// Σ a·b of integer-valued doubles with |a·b| < 2^36, exactly: within a chunk of 2^17 products
// every partial sum is an integer below 2^53 (so the lane order does not matter); chunks add in
// int64.
LOWBIT_CLONES int64_t dot_chunk(const double* a, const double* b, int64_t K) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[k + l] * b[k + l];
  double s = 0;
  for (; k < K; ++k) s += a[k] * b[k];
  for (int l = 0; l < 8; ++l) s += lane[l];
  return static_cast<int64_t>(s);
}
#ifdef LOWBIT_AVX2
// The sum of a vector's four doubles (exact here: the fp8 GEMMs' partial sums are exact).
__attribute__((target("avx2,fma"))) inline double sum_lanes_pd(__m256d v) {
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}
#endif
// out[i][j] += a_i . w_j exactly over n <= 2^17 values, for the first R <= 3 activation rows a[i]
// and the 4 weight rows w + j * ldw (dot_exact's bits: products of two integers below
// 2^18 and their partial sums over at most 2^17 of them are integers below 2^53, so no product,
// fused multiply-add or sum rounds and the lane order does not matter). AVX2 + FMA: 4 k at a
// time, up to 12 accumulators (R = 3: 7 loads per 12 fused multiply-adds).
#ifdef LOWBIT_AVX2
template <int R>
__attribute__((target("avx2,fma"))) void fp8_dots_avx2(const double* const (&a)[3], const double* w,
                                                       int64_t ldw, int64_t n,
                                                       int64_t (&out)[3][4]) {
  __m256d acc[R][4];
  for (auto& r : acc)
    for (auto& c : r) c = _mm256_setzero_pd();
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    __m256d x[R];
    for (int i = 0; i < R; ++i) x[i] = _mm256_loadu_pd(a[i] + k);
    for (int j = 0; j < 4; ++j) {
      const __m256d y = _mm256_loadu_pd(w + j * ldw + k);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_pd(x[i], y, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < 4; ++j) {
      double s = sum_lanes_pd(acc[i][j]);
      for (int64_t t = k; t < n; ++t) s += a[i][t] * w[j * ldw + t];
      out[i][j] += static_cast<int64_t>(s);
    }
}
#endif
// The fp8 GEMM on AMX tiles: each e4m3 integer v = e4m3_int(code) (|v| < 2^18, units of 2^-9) as
// three signed base-128 digits, v = d0 + 128 d1 + 16384 d2 (d0, d1 in [-64, 63] for v >= 0, a
// negative v the negated digits of -v); then sum_k a_k w_k = sum_{i,j} 2^(7 (i + j)) (A_i . W_j)
// over the digit planes, each plane product an int8 tile GEMM (|d_i d_j| <= 4096: exact in int32
// for K < 2^19) and the nine added in int64: dot_exact's integer.
struct E4m3Digits {
  int8_t d[3][128];  // digits of e4m3_int of the magnitude codes 0 .. 127
  E4m3Digits() {
    for (int c = 0; c < 128; ++c) {
      int32_t v = e4m3_int(static_cast<uint8_t>(c));
      for (int i = 0; i < 3; ++i) {
        const int32_t digit = ((v + 64) & 127) - 64;
        d[i][c] = static_cast<int8_t>(digit);
        v = (v - digit) / 128;
      }
    }
  }
};
const E4m3Digits& e4m3_digits() {
  static const E4m3Digits t;
  return t;
}
// plane[i][k] = digit i of e4m3_int(codes[k]), k < n (three planes of n). AVX-512 VBMI: the
// magnitude's 7 bits index a 128-entry byte table (two registers), the sign negates.
#ifdef LOWBIT_AVX2
// Digit i of the 64 codes c, the digit table's plane i in lo (magnitudes 0-63) and hi (64-127):
// the magnitude's 7 bits index the table (vpermt2b ignores index bit 7), the sign negates. With
// the table's digits + b (and base = 2b), the result is the signed digit + b.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) inline __m512i e4m3_digit(
    __m512i lo, __m512i hi, __m512i c, __m512i base = _mm512_setzero_si512()) {
  const __m512i d = _mm512_permutex2var_epi8(lo, c, hi);
  return _mm512_mask_sub_epi8(d, _mm512_movepi8_mask(c), base, d);
}
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t e4m3_digit_planes_vbmi(
    const uint8_t* codes, int64_t n, int8_t* const (&plane)[3]) {
  const E4m3Digits& t = e4m3_digits();
  __m512i lo[3], hi[3];
  for (int i = 0; i < 3; ++i) {
    lo[i] = _mm512_loadu_si512(t.d[i]);
    hi[i] = _mm512_loadu_si512(t.d[i] + 64);
  }
  int64_t k = 0;
  for (; k + 64 <= n; k += 64) {
    const __m512i c = _mm512_loadu_si512(codes + k);
    for (int i = 0; i < 3; ++i) _mm512_storeu_si512(plane[i] + k, e4m3_digit(lo[i], hi[i], c));
  }
  return k;
}
#endif
void e4m3_digit_planes(const uint8_t* codes, int64_t n, int8_t* const (&plane)[3]) {
  int64_t k = 0;
#ifdef LOWBIT_AVX2
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  if (vbmi && convrot::simd_kernels_on()) k = e4m3_digit_planes_vbmi(codes, n, plane);
#endif
  const E4m3Digits& t = e4m3_digits();
  for (; k < n; ++k)
    for (int i = 0; i < 3; ++i) {
      const int8_t d = t.d[i][codes[k] & 127];
      plane[i][k] = (codes[k] & 128) ? static_cast<int8_t>(-d) : d;
    }
}

// The fp8 GEMM of R activation rows (the forward takes one: R = 2 spilled) on AVX-512 VNNI with
// the same digits: each weight row's 64 codes a step become their three digit planes + 64 in
// registers (uint8 in [0, 128]:
// the table of digits + 64 above, 128 - it for negative codes), and vpdpbusd multiplies them
// with the activations' signed digit planes; 64 x each activation plane's sum (asum) is taken
// off after. Every lane sum stays below 2^31 for K < 2^22 and the true plane dots below 2^31
// for K < 2^19: exact. out[r][i * 3 + j] = the dot of activation plane i of row r with weight
// plane j. The weight rows 4 ahead are prefetched (the rows are contiguous).
#ifdef LOWBIT_AVX2
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vnni"))) void fp8_digit_dots_vnni(
    const int8_t* const (&a)[2][3], const int64_t (&asum)[2][3], const uint8_t* wcodes, int64_t K,
    int64_t (&out)[2][9]) {
  const E4m3Digits& t = e4m3_digits();
  __m512i lo[3], hi[3], acc[R][9];
  for (int j = 0; j < 3; ++j) {
    lo[j] = _mm512_add_epi8(_mm512_loadu_si512(t.d[j]), _mm512_set1_epi8(64));
    hi[j] = _mm512_add_epi8(_mm512_loadu_si512(t.d[j] + 64), _mm512_set1_epi8(64));
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 9; ++i) acc[r][i] = _mm512_setzero_si512();
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(128));
  for (int64_t k = 0; k < K; k += 64) {
    const __mmask64 mask = tail_mask(K - k);
    const __m512i c = _mm512_maskz_loadu_epi8(mask, wcodes + k);  // (code 0: digits 0)
    _mm_prefetch(reinterpret_cast<const char*>(wcodes + k + 4 * K), _MM_HINT_T2);
    __m512i w[3];
    for (int j = 0; j < 3; ++j) w[j] = e4m3_digit(lo[j], hi[j], c, c128);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 3; ++i) {
        const __m512i x = _mm512_maskz_loadu_epi8(mask, a[r][i] + k);  // (past K: 0)
        for (int j = 0; j < 3; ++j)
          acc[r][i * 3 + j] = _mm512_dpbusd_epi32(acc[r][i * 3 + j], w[j], x);
      }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j)
        out[r][i * 3 + j] = int64_t{_mm512_reduce_add_epi32(acc[r][i * 3 + j])} - 64 * asum[r][i];
}
#endif
bool fp8_vnni_on() {
#ifdef LOWBIT_AVX2
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vbmi") &&
                          __builtin_cpu_supports("avx512vnni");
  return has && convrot::simd_kernels_on() && !convrot::avx2_kernels_forced();
#else
  return false;
#endif
}

// The NVFP4 GEMM on AMX tiles the same way: each product of a twice-e2m1 value (|.| <= 12) and
// its block's e4m3 integer scale (|.| < 2^18) is below 2^22 in magnitude, three signed base-256
// digits (v = d0 + 256 d1 + 65536 d2, d0, d1 in [-128, 127]); |d_i d_j| <= 16384 keeps each
// plane product exact in int32 for K < 2^17, and sum_k (a_k s_a)(w_k s_w) is nvfp4_dot's
// integer. plane[i][k] = digit i of v[k] * scale[k / 16], k < n (n a multiple of 16).
#ifdef LOWBIT_AVX2
__attribute__((target("avx512f,avx512bw"))) void scaled_digit_planes_avx512(
    const int8_t* v, const int32_t* scale, int64_t n, int8_t* const (&plane)[3]) {
  const __m512i half = _mm512_set1_epi32(128), low8 = _mm512_set1_epi32(255);
  for (int64_t k = 0; k < n; k += 16) {
    __m512i x = _mm512_mullo_epi32(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + k))),
        _mm512_set1_epi32(scale[k / 16]));
    for (int i = 0; i < 3; ++i) {
      const __m512i d = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(x, half), low8), half);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(plane[i] + k), _mm512_cvtepi32_epi8(d));
      x = _mm512_srai_epi32(_mm512_sub_epi32(x, d), 8);  // (exact: x - d is a multiple of 256)
    }
  }
}
#endif
void scaled_digit_planes(const int8_t* v, const int32_t* scale, int64_t n,
                         int8_t* const (&plane)[3]) {
#ifdef LOWBIT_AVX2
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (avx512 && convrot::simd_kernels_on()) return scaled_digit_planes_avx512(v, scale, n, plane);
#endif
  for (int64_t k = 0; k < n; ++k) {
    int32_t x = int32_t{v[k]} * scale[k / 16];
    for (int i = 0; i < 3; ++i) {
      const int32_t d = ((x + 128) & 255) - 128;
      plane[i][k] = static_cast<int8_t>(d);
      x = (x - d) / 256;
    }
  }
}
// acc[i * 32 + j] = sum over the three digit planes of A (rows m0 .. m0 + 31 of plane p at
// a_planes + (p Mp + m0) Kp) and of the 32 packed weight rows (plane p at packed + p pb) of
// 2^(bits (p + p')) (A_p . W_p'): the exact int64 dots.
// Only the first `rows` (<= 32) rows of acc are meaningful (16 or fewer: half the tile work).
void plane_gemm_32x32(const int8_t* a_planes, int64_t Mp, int64_t Kp, int64_t m0, int64_t rows,
                      const int8_t* packed, int64_t pb, int bits, int64_t* acc) {
  int32_t dots[32 * 32];
  const int64_t n = (rows <= 16 ? 16 : 32) * 32;
  std::fill(acc, acc + n, int64_t{0});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      amx::gemm_rows_x32(a_planes + (i * Mp + m0) * Kp, Kp, packed + j * pb, Kp, dots, 32, rows);
      const int shift = bits * (i + j);
      for (int64_t t = 0; t < n; ++t)
        acc[t] += static_cast<int64_t>(dots[t]) * (int64_t{1} << shift);
    }
}

// The fp8 decode GEMV without VNNI (AVX2 + F16C + FMA): weight row w (K e4m3 codes, K a multiple
// of 16) read where it is stored against R activation rows a[i] (e4m3_int doubles, a_fp8's rows),
// out[i] += the exact dot times 2^-17 (2^-17 x dot_exact's integers). An e4m3 code moved into an
// fp16's bits ((c & 0x7f) << 7 | sign << 15) is its value times 2^-8, subnormals included (both
// formats' subnormals are linear), so vcvtph2ps decodes 8 codes at once; the NaN codes read as 0
// (e4m3_int). Every product a_int x value 2^-8 is a multiple of 2^-17 below 2^19 in magnitude:
// the fp64 sums stay exact for K < 2^17 (the caller's bound), whatever their order.
#ifdef LOWBIT_AVX2
template <int R>
__attribute__((target("avx2,fma,f16c"))) void fp8_gemv_avx2(const double* const (&a)[2],
                                                            const uint8_t* w, int64_t K,
                                                            double (&out)[2]) {
  __m256d acc[R][4];  // (four chains a row: one FMA latency a step)
  for (auto& r : acc)
    for (auto& c : r) c = _mm256_setzero_pd();
  const __m256i low7 = _mm256_set1_epi16(0x7f), sign = _mm256_set1_epi16(0x80);
  for (int64_t k = 0; k < K; k += 16) {
    const __m256i x =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k)));
    const __m256i mag = _mm256_and_si256(x, low7);
    __m256i h =
        _mm256_or_si256(_mm256_slli_epi16(mag, 7), _mm256_slli_epi16(_mm256_and_si256(x, sign), 8));
    h = _mm256_andnot_si256(_mm256_cmpeq_epi16(mag, low7), h);  // NaN -> 0
    const __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    const __m256 f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    const __m256d d[4] = {
        _mm256_cvtps_pd(_mm256_castps256_ps128(f0)), _mm256_cvtps_pd(_mm256_extractf128_ps(f0, 1)),
        _mm256_cvtps_pd(_mm256_castps256_ps128(f1)), _mm256_cvtps_pd(_mm256_extractf128_ps(f1, 1))};
    for (int i = 0; i < R; ++i)
      for (int q = 0; q < 4; ++q)
        acc[i][q] = _mm256_fmadd_pd(_mm256_loadu_pd(a[i] + k + 4 * q), d[q], acc[i][q]);
  }
  for (int i = 0; i < R; ++i) {
    out[i] += sum_lanes_pd(
        _mm256_add_pd(_mm256_add_pd(acc[i][0], acc[i][1]), _mm256_add_pd(acc[i][2], acc[i][3])));
  }
}
#endif
// False where fp8_dots_avx2 is not built, the CPU lacks AVX2 + FMA or the scalar kernels are
// forced (then the GEMM takes dot_exact row by row).
bool fp8_blocked_available() {
#ifdef LOWBIT_AVX2
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && convrot::simd_kernels_on();
#else
  return false;
#endif
}
// fp8_blocked_available and F16C (fp8_gemv_avx2's decode).
bool fp8_gemv_available() {
#ifdef LOWBIT_AVX2
  static const bool f16c = has_f16c();
  return f16c && fp8_blocked_available();
#else
  return false;
#endif
}
int64_t dot_exact(const double* a, const double* b, int64_t K) {
  int64_t acc = 0;
  for (int64_t k = 0; k < K; k += 131072)
    acc += dot_chunk(a + k, b + k, std::min<int64_t>(131072, K - k));
  return acc;
}

// The GEMM codes of weight rows o0 .. o0 + no - 1 (no <= 4) as 4 rows of K: convrot8's stored
// rows in place where there are 4, else unpacked into wc (4 x K), the rows past no repeating the
// last one.
const int8_t* weight_group_codes(const PackedWeightView& w, int64_t o0, int64_t no, int8_t* wc) {
  const int64_t K = w.in_features;
  if (w.qtype == QType::convrot8 && no == 4)
    return static_cast<const int8_t*>(w.codes.data) + o0 * K;
  for (int64_t j = 0; j < 4; ++j)
    if (j < no)
      convrot::weight_row_gemm_codes(w, o0 + j, wc + j * K);
    else
      std::memcpy(wc + j * K, wc + (no - 1) * K, static_cast<size_t>(K));
  return wc;
}

float bias_at(const TensorView* bias, int64_t o) {
  return bias ? load_f32(bias->data, o * bias->stride[0], bias->dtype) : 0.f;
}

void epilogue_store(const TensorView& out, int64_t m, int64_t o, float acc, float a_scale,
                    float w_scale, const TensorView* bias) {
  float v = acc * a_scale;
  v = v * w_scale;
  if (bias) v = v + bias_at(bias, o);
  store_f32(out.data, m * out.stride[0] + o, out.dtype, v);
}

}  // namespace

int64_t decode_tiles_bytes(const PackedWeightView& w) { return gemv_tables_bytes(w); }
void build_decode_tiles(const PackedWeightView& w, void* out, Context& ctx) {
  parallel_for(w.out_features, grain_rows(w.in_features), ctx, [&](int64_t b, int64_t e) {
    gemv_build_tables(w, b, e, static_cast<uint8_t*>(out));
  });
}

void quantized_linear_forward(const PackedWeightView& w, const TensorView& x,
                              const TensorView* bias, TensorView out, Context& ctx) {
  const int64_t M = x.shape[0], K = w.in_features, O = w.out_features;
  const QType q = w.qtype;
  // 1. Activations: rotate + per-token quantize into host scratch.
  const bool nvfp4 = q == QType::convrot4;
  const int64_t code_stride = nvfp4 ? K / 2 : K;
  std::vector<uint8_t> a_codes(static_cast<size_t>(M * code_stride));
  std::vector<uint8_t> a_block_scales(nvfp4 ? static_cast<size_t>(M * (K / 16)) : 0);
  std::vector<float> a_scales(static_cast<size_t>(M), 1.f);
  parallel_for(M, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
    quantize_act_rows(
        x, q, w.rot, b, e, a_codes.data(), code_stride,
        nvfp4 ? static_cast<void*>(a_block_scales.data()) : static_cast<void*>(a_scales.data()),
        nvfp4 ? K / 16 : 1);
  });
  // Which integer GEMM runs (int8 codes, fp8 and NVFP4 on AMX tiles from kAmxMinRows /
  // kAmxMinRowsFp8 / kAmxMinRowsFp4 activation rows; fp8 below on VNNI digit planes, NVFP4 below
  // on its GEMV).
  const bool int8_codes = int8_family(q) || q == QType::convrot_comfy_w4a4;
  // The decode GEMV on the weights where they are stored (convrot8 and convrotint8 below
  // kGemvMaxRows8 rows, the
  // 4-bit and the 2-, 3- and 5-bit rows below kGemvMaxRows4, every row count without AMX; 6 and
  // 7 bits below kGemvMaxRowsWideBits; linear_gemv.h), else AMX tiles
  // from kAmxMinRows, else VNNI on unpacked rows with the activations biased to uint8.
  // Without AMX, from kVnniBlockedMinRows rows the register-blocked VNNI GEMM (gemm_vnni.h) on
  // the unpacked rows instead of the GEMV.
  const bool amx = amx_gemm_on();
  const bool blocked =
      int8_codes && vnni_blocked_on(K) && (vnni::forced() || (!amx && M >= kVnniBlockedMinRows));
  const bool wide_bits = q == QType::convrot_int6 || q == QType::convrot_int7;
  const bool gemv =
      int8_codes && !blocked && gemv_supported(w) &&
      (gemv_avx2(w) ? M < (q == QType::convrot_bitnet ? kGemvMaxRowsAvx2Ternary
                           : q == QType::convrot_int2 ? kGemvMaxRowsAvx2Int2
                           : q == QType::convrot_int3 ? kGemvMaxRowsAvx2Int3
                                                      : kGemvMaxRowsAvx2)
       : wide_bits  ? M < kGemvMaxRowsWideBits
                    : M < (q == QType::convrot8 || q == QType::convrot_int8 ? kGemvMaxRows8
                                                                            : kGemvMaxRows4) ||
                         !amx);
  const bool tiles = int8_codes && !blocked && !gemv && M >= kAmxMinRows && amx;
  const bool fp8_tiles =
      q == QType::convrot_fp8 && M >= kAmxMinRowsFp8 && K < (int64_t{1} << 19) && amx_gemm_on();
  const bool fp4_tiles = nvfp4 && M >= kAmxMinRowsFp4 && K < (int64_t{1} << 17) && amx_gemm_on();
  // Without AMX, from kVnniBlockedMinRowsFp8 rows the blocked VNNI GEMM on the same digits:
  // nine plane products (gemm_vnni.h) combined as fp8_vnni combines them.
  const bool fp8_blocked = q == QType::convrot_fp8 && !fp8_tiles && vnni_blocked_on(K) &&
                           fp8_vnni_on() &&
                           (vnni::forced() || (!amx && M >= kVnniBlockedMinRowsFp8));
  const bool fp8_vnni = q == QType::convrot_fp8 && !fp8_tiles && !fp8_blocked &&
                        K < (int64_t{1} << 19) && fp8_vnni_on();
  // Decoded activations for the float GEMMs: e4m3 as exact integers (units of 2^-9; only for
  // the GEMM of doubles), e2m1 as 2·value (integers in [-12, 12]) with the block scales as
  // integers.
  const bool fp8_doubles = q == QType::convrot_fp8 && !fp8_tiles && !fp8_vnni && !fp8_blocked;
  // Without VNNI, below kFp8GemvMaxRows rows: the AVX2 GEMV on the stored codes (fp8_gemv_avx2).
  const bool fp8_gemv =
      fp8_doubles && M < kFp8GemvMaxRows && K < (int64_t{1} << 17) && fp8_gemv_available();
  std::vector<double> a_fp8(fp8_doubles ? static_cast<size_t>(M * K) : 0);
  std::vector<int8_t> a_fp4(nvfp4 ? static_cast<size_t>(M * K) : 0);
  std::vector<int32_t> a_fp4_scales(nvfp4 ? static_cast<size_t>(M * (K / 16)) : 0);
  const int32_t* scale_ints = e4m3_int_table();  // e4m3_int of every code
  double e4m3_ints[256];                         // the same, as the float GEMM's operands
  for (int c = 0; c < 256; ++c) e4m3_ints[c] = scale_ints[c];
  for (size_t i = 0; i < a_fp8.size(); ++i) a_fp8[i] = e4m3_ints[a_codes[i]];
  if (nvfp4) decode_twice_e2m1(a_codes.data(), M * K, a_fp4.data());
  for (size_t i = 0; i < a_fp4_scales.size(); ++i) a_fp4_scales[i] = scale_ints[a_block_scales[i]];
  // NVFP4 below the tiles' rows: the decode GEMV on the packed weights (linear_gemv.h).
  const bool fp4_gemv = nvfp4 && !fp4_tiles && gemv_fp4_supported(w);
  Fp4Activations a_fp4_gemv;
  if (fp4_gemv) gemv_fp4_pack_activations(a_fp4.data(), a_fp4_scales.data(), M, K, a_fp4_gemv);
  const float* w_scales = nvfp4 ? nullptr : static_cast<const float*>(w.scales.data);
  const float pts = nvfp4 ? *static_cast<const float*>(w.tensor_scale.data) : 1.f;

  // The int8-code GEMM on AMX tiles (the codes in 32-row blocks padded with zeros to a multiple
  // of 64 values), else on AVX-512 VNNI with the activations biased to uint8 (code + 128).
  const int64_t Kp = (K + 63) / 64 * 64, Mp = (M + 31) / 32 * 32;
  std::vector<int8_t> a_tiles(tiles ? static_cast<size_t>(Mp * Kp) : 0, int8_t{0});
  if (tiles)
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(a_tiles.data() + m * Kp, a_codes.data() + m * K, static_cast<size_t>(K));
  std::vector<int8_t> a_gemv(gemv ? static_cast<size_t>(M * gemv_row_bytes(w)) : 0);
  std::vector<int32_t> a_sums(gemv ? static_cast<size_t>(M) : 0);
  if (gemv)
    gemv_pack_activations(w, reinterpret_cast<const int8_t*>(a_codes.data()), M, a_gemv.data(),
                          a_sums.data());
  const bool vnni = int8_codes && !blocked && !tiles && !gemv && vnni_gemm_on();
  // The fp8 and NVFP4 GEMMs on AMX tiles: the activations' three digit planes (Mp x Kp each,
  // zero-padded).
  std::vector<int8_t> a_digits(fp8_tiles || fp4_tiles ? static_cast<size_t>(3 * Mp * Kp) : 0,
                               int8_t{0});
  for (int64_t m = 0; fp4_tiles && m < M; ++m) {
    int8_t* const planes[3] = {a_digits.data() + m * Kp, a_digits.data() + (Mp + m) * Kp,
                               a_digits.data() + (2 * Mp + m) * Kp};
    scaled_digit_planes(a_fp4.data() + m * K, a_fp4_scales.data() + m * (K / 16), K, planes);
  }
  // Below kAmxMinRowsFp8 rows, VNNI on the same digits (one or two rows a pass): the
  // activations' signed planes and each plane's sum.
  std::vector<int8_t> a_vnni(fp8_vnni ? static_cast<size_t>(3 * M * K) : 0);
  for (int64_t m = 0; fp8_vnni && m < M; ++m) {
    int8_t* const planes[3] = {a_vnni.data() + m * K, a_vnni.data() + (M + m) * K,
                               a_vnni.data() + (2 * M + m) * K};
    e4m3_digit_planes(a_codes.data() + m * K, K, planes);
  }
  std::vector<int64_t> a_vnni_sums(fp8_vnni ? static_cast<size_t>(3 * M) : 0);  // per plane, row
  for (int64_t p = 0; p < static_cast<int64_t>(a_vnni_sums.size()); ++p)
    for (int64_t k = 0; k < K; ++k) a_vnni_sums[p] += a_vnni[p * K + k];
  for (int64_t m = 0; fp8_tiles && m < M; ++m) {
    int8_t* const planes[3] = {a_digits.data() + m * Kp, a_digits.data() + (Mp + m) * Kp,
                               a_digits.data() + (2 * Mp + m) * Kp};
    e4m3_digit_planes(a_codes.data() + m * K, K, planes);
  }
  std::vector<uint8_t> a_biased(vnni || blocked ? a_codes.size() : 0);
  for (size_t i = 0; i < a_biased.size(); ++i)
    a_biased[i] = static_cast<uint8_t>(a_codes[i] ^ 0x80u);
  // fp8_blocked: the activations' three digit planes (M x K each, row stride K) biased to uint8.
  std::vector<uint8_t> a_planes8(fp8_blocked ? static_cast<size_t>(3 * M * K) : 0);
  for (int64_t m = 0; fp8_blocked && m < M; ++m) {
    int8_t* const planes[3] = {reinterpret_cast<int8_t*>(a_planes8.data()) + m * K,
                               reinterpret_cast<int8_t*>(a_planes8.data()) + (M + m) * K,
                               reinterpret_cast<int8_t*>(a_planes8.data()) + (2 * M + m) * K};
    e4m3_digit_planes(a_codes.data() + m * K, K, planes);
  }
  for (auto& v : a_planes8) v = static_cast<uint8_t>(v ^ 0x80u);

  // 2. GEMM + epilogue, parallel over output columns (each thread unpacks its weight rows once).
  const int64_t col_grain =
      std::max<int64_t>(1, 262144 / std::max<int64_t>(K * std::max<int64_t>(M, 1), 1));
  parallel_for(
      O, col_grain, ctx,
      [&](int64_t b, int64_t e) {
        if (blocked) {
          // Panels of vnni::kPanel weight rows, unpacked and packed once, against blocks of
          // kVnniRowBlock activation rows (the dots of a block stay in L1 for the epilogue).
          constexpr int64_t P = vnni::kPanel;
          std::vector<int8_t> wc(static_cast<size_t>(P * K)),
              panel(static_cast<size_t>(vnni::panel_bytes(K)));
          std::vector<int32_t> dots(static_cast<size_t>(std::min(M, kVnniRowBlock) * P));
          uint32_t sum128[P];
          float wsc[P], bias_f[P], v[P];
          for (int64_t o0 = b; o0 < e; o0 += P) {
            const int64_t no = std::min<int64_t>(P, e - o0);
            if (!gemv_unpack_rows(w, o0, no, wc.data()))
              for (int64_t j = 0; j < no; ++j)
                convrot::weight_row_gemm_codes(w, o0 + j, wc.data() + j * K);
            vnni::pack_panel(wc.data(), static_cast<int>(no), K, panel.data(), sum128);
            for (int64_t j = 0; j < no; ++j) {
              wsc[j] = w_scales[o0 + j];
              bias_f[j] = bias_at(bias, o0 + j);
            }
            for (int64_t m0 = 0; m0 < M; m0 += kVnniRowBlock) {
              const int64_t mb = std::min(kVnniRowBlock, M - m0);
              vnni::gemm_panel(a_biased.data() + m0 * K, K, mb, panel.data(), sum128, K,
                               dots.data());
              for (int64_t i = 0; i < mb; ++i) {
                // epilogue_store's operations, a row of the panel at a time
                const float as = a_scales[m0 + i];
                const int32_t* d = dots.data() + i * P;
                for (int64_t j = 0; j < no; ++j) v[j] = static_cast<float>(d[j]) * as;
                for (int64_t j = 0; j < no; ++j) v[j] = v[j] * wsc[j];
                if (bias)
                  for (int64_t j = 0; j < no; ++j) v[j] = v[j] + bias_f[j];
                rows::store(v, no, out.dtype, out.data, (m0 + i) * out.stride[0] + o0);
              }
            }
          }
        } else if (fp8_blocked) {
          // Panels of vnni::kPanel weight rows: each row's three digit planes, packed as three
          // panels, against kVnniRowBlock activation rows' three planes; the nine int32 plane
          // dots of every output combined exactly in int64 (units of 2^-18), as fp8_vnni does.
          constexpr int64_t P = vnni::kPanel;
          const int64_t MB = std::min(M, kVnniRowBlock);
          std::vector<int8_t> wd(static_cast<size_t>(3 * P * K)),
              panels(static_cast<size_t>(3 * vnni::panel_bytes(K)));
          std::vector<int32_t> dots(static_cast<size_t>(MB * P));
          std::vector<int64_t> total(static_cast<size_t>(MB * P));
          uint32_t sum128[3][P];
          const uint8_t* wcodes = static_cast<const uint8_t*>(w.codes.data);
          for (int64_t o0 = b; o0 < e; o0 += P) {
            const int64_t no = std::min<int64_t>(P, e - o0);
            for (int64_t j = 0; j < no; ++j) {
              int8_t* const planes[3] = {wd.data() + j * K, wd.data() + (P + j) * K,
                                         wd.data() + (2 * P + j) * K};
              e4m3_digit_planes(wcodes + (o0 + j) * K, K, planes);
            }
            for (int p = 0; p < 3; ++p)
              vnni::pack_panel(wd.data() + p * P * K, static_cast<int>(no), K,
                               panels.data() + p * vnni::panel_bytes(K), sum128[p]);
            for (int64_t m0 = 0; m0 < M; m0 += kVnniRowBlock) {
              const int64_t mb = std::min(kVnniRowBlock, M - m0);
              std::fill(total.begin(), total.end(), int64_t{0});
              for (int i = 0; i < 3; ++i)
                for (int j = 0; j < 3; ++j) {
                  vnni::gemm_panel(a_planes8.data() + (i * M + m0) * K, K, mb,
                                   panels.data() + j * vnni::panel_bytes(K), sum128[j], K,
                                   dots.data());
                  const int shift = 7 * (i + j);
                  for (int64_t t = 0; t < mb * P; ++t)
                    total[t] += static_cast<int64_t>(dots[t]) * (int64_t{1} << shift);
                }
              for (int64_t r = 0; r < mb; ++r)
                for (int64_t j = 0; j < no; ++j) {
                  const float accf = std::ldexp(static_cast<float>(total[r * P + j]), -18);
                  epilogue_store(out, m0 + r, o0 + j, accf, a_scales[m0 + r], w_scales[o0 + j],
                                 bias);
                }
            }
          }
        } else if (tiles) {
          // 32 weight rows at a time packed for the tiles, against every 32-row block of the
          // activations (amx::gemm_32x32: exact int32 dots).
          amx::TileScope scope;
          std::vector<int8_t> wc(static_cast<size_t>(32 * K)),
              packed(static_cast<size_t>(amx::packed_b32_bytes(K)));
          int32_t dots[32 * 32];
          for (int64_t o0 = b; o0 < e; o0 += 32) {
            const int64_t no = std::min<int64_t>(32, e - o0);
            if (!gemv_unpack_rows(w, o0, no, wc.data()))
              for (int64_t j = 0; j < no; ++j)
                convrot::weight_row_gemm_codes(w, o0 + j, wc.data() + j * K);
            amx::pack_b32(wc.data(), K, static_cast<int>(no), K, packed.data());
            for (int64_t m0 = 0; m0 < M; m0 += 32) {
              amx::gemm_rows_x32(a_tiles.data() + m0 * Kp, Kp, packed.data(), Kp, dots, 32,
                                 M - m0);
              for (int64_t i = 0; i < std::min<int64_t>(32, M - m0); ++i)
                for (int64_t j = 0; j < no; ++j)
                  epilogue_store(out, m0 + i, o0 + j, static_cast<float>(dots[i * 32 + j]),
                                 a_scales[m0 + i], w_scales[o0 + j], bias);
            }
          }
        } else if (gemv) {
          // 64 weight rows at a time, their exact dots with kGemvRowBlock activation rows at a
          // time (both blocks stay in L2 while the other is swept).
          const int64_t stride = gemv_row_bytes(w);
          std::vector<int32_t> dots(static_cast<size_t>(std::min(M, kGemvRowBlock) * 64));
          for (int64_t o0 = b; o0 < e; o0 += 64) {
            const int64_t no = std::min<int64_t>(64, e - o0);
            for (int64_t m0 = 0; m0 < M; m0 += kGemvRowBlock) {
              const int64_t mb = std::min(kGemvRowBlock, M - m0);
              gemv_dots(w, a_gemv.data() + m0 * stride, a_sums.data() + m0, mb, o0, o0 + no,
                        dots.data());
              for (int64_t m = 0; m < mb; ++m)
                for (int64_t j = 0; j < no; ++j)
                  epilogue_store(out, m0 + m, o0 + j, static_cast<float>(dots[m * no + j]),
                                 a_scales[m0 + m], w_scales[o0 + j], bias);
            }
          }
        } else if (int8_codes && vnni) {
#ifdef LOWBIT_AVX2
          // 4 weight rows at a time against up to 4 activation rows at a time (dots_vnni on the
          // biased codes); a last partial group of weight rows repeats its final row.
          std::vector<int8_t> wc(static_cast<size_t>(4 * K));
          for (int64_t o0 = b; o0 < e; o0 += 4) {
            const int64_t no = std::min<int64_t>(4, e - o0);
            const int8_t* rows4 = weight_group_codes(w, o0, no, wc.data());
            uint32_t sums[4][4], bias128[4];  // 128 . sum of each row's codes, wrapping
            dots_vnni<0>(nullptr, rows4, K, sums);
            for (int64_t j = 0; j < 4; ++j) bias128[j] = sums[0][j] * 128u;
            for (int64_t m = 0; m < M; m += 4) {
              const int64_t rows = std::min<int64_t>(4, M - m);
              const uint8_t* const a4[4] = {
                  a_biased.data() + m * K,
                  a_biased.data() + (m + std::min<int64_t>(1, rows - 1)) * K,
                  a_biased.data() + (m + std::min<int64_t>(2, rows - 1)) * K,
                  a_biased.data() + (m + rows - 1) * K};
              uint32_t acc[4][4];
              switch (rows) {
                case 1:
                  dots_vnni<1>(a4, rows4, K, acc);
                  break;
                case 2:
                  dots_vnni<2>(a4, rows4, K, acc);
                  break;
                case 3:
                  dots_vnni<3>(a4, rows4, K, acc);
                  break;
                default:
                  dots_vnni<4>(a4, rows4, K, acc);
                  break;
              }
              for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < no; ++j)
                  epilogue_store(out, m + i, o0 + j,
                                 static_cast<float>(static_cast<int32_t>(acc[i][j] - bias128[j])),
                                 a_scales[m + i], w_scales[o0 + j], bias);
            }
          }
#endif
        } else if (int8_family(q) || q == QType::convrot_comfy_w4a4) {
          // 4 weight rows at a time against 2 activation rows at a time (dots_2x4); a last partial
          // group repeats its final row, a last single activation row pairs with itself.
          std::vector<int8_t> wc(static_cast<size_t>(4 * K));
          const int8_t* acodes = reinterpret_cast<const int8_t*>(a_codes.data());
          for (int64_t o0 = b; o0 < e; o0 += 4) {
            const int64_t no = std::min<int64_t>(4, e - o0);
            const int8_t* rows4 = weight_group_codes(w, o0, no, wc.data());
            for (int64_t m = 0; m < M; m += 2) {
              const int64_t m1 = std::min(m + 1, M - 1);
              int32_t acc[2][4];
              dots_2x4(acodes + m * K, acodes + m1 * K, rows4, K, acc);
              for (int64_t i = 0; i < (m1 > m ? 2 : 1); ++i)
                for (int64_t j = 0; j < no; ++j)
                  epilogue_store(out, m + i, o0 + j, static_cast<float>(acc[i][j]), a_scales[m + i],
                                 w_scales[o0 + j], bias);
            }
          }
        } else if (fp8_vnni) {
#ifdef LOWBIT_AVX2
          const int8_t* ab = a_vnni.data();
          const int64_t* as = a_vnni_sums.data();
          const uint8_t* wcodes = static_cast<const uint8_t*>(w.codes.data);
          // One activation row a pass: the two-row form (18 accumulators) spilled under GCC 12
          // and ran 2.8x the one-row time (Zen 4, 3072 -> 3072: 2 rows 1.20 vs 0.81 ms as two
          // one-row passes).
          for (int64_t o = b; o < e; ++o)
            for (int64_t m = 0; m < M; ++m) {
              const int8_t* const a[2][3] = {
                  {ab + m * K, ab + (M + m) * K, ab + (2 * M + m) * K}, {}};
              const int64_t asum[2][3] = {{as[m], as[M + m], as[2 * M + m]}, {}};
              int64_t dots[2][9];
              fp8_digit_dots_vnni<1>(a, asum, wcodes + o * K, K, dots);
              int64_t total = 0;
              for (int i = 0; i < 3; ++i)
                for (int j = 0; j < 3; ++j)
                  total += dots[0][i * 3 + j] * (int64_t{1} << (7 * (i + j)));
              const float accf = std::ldexp(static_cast<float>(total), -18);
              epilogue_store(out, m, o, accf, a_scales[m], w_scales[o], bias);
            }
#endif
        } else if (fp8_tiles) {
          // 32 weight rows at a time: their codes packed for the tiles, then the packed codes'
          // digit planes (the digits are per value, so packing and taking digits commute; code 0,
          // the padding, has digits 0), against every 32-row block of the activations' planes; the
          // nine plane products added in int64.
          amx::TileScope scope;
          const int64_t pb = amx::packed_b32_bytes(K);
          std::vector<int8_t> wpacked(static_cast<size_t>(pb)), packed(static_cast<size_t>(3 * pb));
          int64_t acc[32 * 32];
          const uint8_t* wcodes = static_cast<const uint8_t*>(w.codes.data);
          for (int64_t o0 = b; o0 < e; o0 += 32) {
            const int64_t no = std::min<int64_t>(32, e - o0);
            amx::pack_b32(reinterpret_cast<const int8_t*>(wcodes + o0 * K), K, static_cast<int>(no),
                          K, wpacked.data());
            int8_t* const planes[3] = {packed.data(), packed.data() + pb, packed.data() + 2 * pb};
            e4m3_digit_planes(reinterpret_cast<const uint8_t*>(wpacked.data()), pb, planes);
            for (int64_t m0 = 0; m0 < M; m0 += 32) {
              plane_gemm_32x32(a_digits.data(), Mp, Kp, m0, M - m0, packed.data(), pb, 7, acc);
              for (int64_t i = 0; i < std::min<int64_t>(32, M - m0); ++i)
                for (int64_t j = 0; j < no; ++j) {
                  const float accf = std::ldexp(static_cast<float>(acc[i * 32 + j]), -18);
                  epilogue_store(out, m0 + i, o0 + j, accf, a_scales[m0 + i], w_scales[o0 + j],
                                 bias);
                }
            }
          }
        } else if (fp8_gemv) {
#ifdef LOWBIT_AVX2
          const uint8_t* wcodes = static_cast<const uint8_t*>(w.codes.data);
          for (int64_t o = b; o < e; ++o)
            for (int64_t m = 0; m < M; m += 2) {
              const double* const a2[2] = {a_fp8.data() + m * K,
                                           a_fp8.data() + std::min(m + 1, M - 1) * K};
              double sum[2] = {0.0, 0.0};
              if (M - m >= 2) {
                fp8_gemv_avx2<2>(a2, wcodes + o * K, K, sum);
              } else {
                fp8_gemv_avx2<1>(a2, wcodes + o * K, K, sum);
              }
              // (each sum an exact multiple of 2^-17: times 2^17 the exact integer dot in units
              // of 2^-18, after the activation's 2^9 and the weight's 2^-8)
              for (int64_t i = 0; i < std::min<int64_t>(2, M - m); ++i) {
                const auto total = static_cast<int64_t>(std::ldexp(sum[i], 17));
                epilogue_store(out, m + i, o, std::ldexp(static_cast<float>(total), -18),
                               a_scales[m + i], w_scales[o], bias);
              }
            }
#endif
        } else if (q == QType::convrot_fp8 && fp8_blocked_available()) {
#ifdef LOWBIT_AVX2
          // Blocks of kRows weight rows, decoded one K tile at a time (kRows x kTile doubles, 256
          // KB, stay in L2 while every activation row passes); inside, 3 activation rows x 4 weight
          // rows per step (a last partial group repeats the block's final row; a last 1 or 2
          // activation rows run alone). Exact integer sums: the same bits as dot_exact.
          constexpr int64_t kRows = 32, kTile = 1024;
          std::vector<double> wd(static_cast<size_t>(kRows * kTile));
          std::vector<int64_t> acc(static_cast<size_t>(M * kRows));
          const uint8_t* wcodes = static_cast<const uint8_t*>(w.codes.data);
          for (int64_t o0 = b; o0 < e; o0 += kRows) {
            const int64_t no = std::min<int64_t>(kRows, e - o0), groups = (no + 3) / 4;
            std::fill(acc.begin(), acc.end(), int64_t{0});
            for (int64_t k0 = 0; k0 < K; k0 += kTile) {
              const int64_t kn = std::min<int64_t>(kTile, K - k0);
              for (int64_t j = 0; j < groups * 4; ++j) {
                const uint8_t* wr = wcodes + (o0 + std::min(j, no - 1)) * K + k0;
                for (int64_t k = 0; k < kn; ++k) wd[j * kTile + k] = e4m3_ints[wr[k]];
              }
              for (int64_t m = 0; m < M; m += 3) {
                const int64_t rows = std::min<int64_t>(3, M - m);
                const double* const a3[3] = {
                    a_fp8.data() + m * K + k0,
                    a_fp8.data() + (m + std::min<int64_t>(1, rows - 1)) * K + k0,
                    a_fp8.data() + (m + rows - 1) * K + k0};
                for (int64_t g = 0; g < groups; ++g) {
                  int64_t part[3][4] = {};
                  if (rows == 3)
                    fp8_dots_avx2<3>(a3, wd.data() + g * 4 * kTile, kTile, kn, part);
                  else if (rows == 2)
                    fp8_dots_avx2<2>(a3, wd.data() + g * 4 * kTile, kTile, kn, part);
                  else
                    fp8_dots_avx2<1>(a3, wd.data() + g * 4 * kTile, kTile, kn, part);
                  for (int64_t i = 0; i < rows; ++i)
                    for (int64_t j = 0; j < 4; ++j) acc[(m + i) * kRows + g * 4 + j] += part[i][j];
                }
              }
            }
            for (int64_t m = 0; m < M; ++m)
              for (int64_t j = 0; j < no; ++j) {
                const float accf = std::ldexp(static_cast<float>(acc[m * kRows + j]), -18);
                epilogue_store(out, m, o0 + j, accf, a_scales[m], w_scales[o0 + j], bias);
              }
          }
#endif
        } else if (q == QType::convrot_fp8) {
          std::vector<double> wd(static_cast<size_t>(K));
          for (int64_t o = b; o < e; ++o) {
            const uint8_t* wr = static_cast<const uint8_t*>(w.codes.data) + o * K;
            for (int64_t k = 0; k < K; ++k) wd[k] = e4m3_ints[wr[k]];
            for (int64_t m = 0; m < M; ++m) {
              // Exact sum of the products in units of 2^-18, rounded once to fp32.
              float accf = std::ldexp(
                  static_cast<float>(dot_exact(a_fp8.data() + m * K, wd.data(), K)), -18);
              epilogue_store(out, m, o, accf, a_scales[m], w_scales[o], bias);
            }
          }
        } else if (fp4_gemv) {
          // 64 weight rows at a time, their exact int64 dots with every activation row.
          std::vector<int64_t> dots(static_cast<size_t>(M * 64));
          for (int64_t o0 = b; o0 < e; o0 += 64) {
            const int64_t no = std::min<int64_t>(64, e - o0);
            gemv_fp4_dots(w, scale_ints, a_fp4_gemv, M, o0, o0 + no, dots.data());
            for (int64_t m = 0; m < M; ++m)
              for (int64_t j = 0; j < no; ++j)
                epilogue_store(out, m, o0 + j,
                               std::ldexp(static_cast<float>(dots[m * no + j]), -20), 1.f, pts,
                               bias);
          }
        } else if (fp4_tiles) {
          // 32 weight rows at a time: the twice-e2m1 values times their block scales as digit
          // planes, packed for the tiles, against every 32-row block of the activations' planes.
          amx::TileScope scope;
          const int64_t nb = K / 16, pb = amx::packed_b32_bytes(K);
          std::vector<int8_t> wv(static_cast<size_t>(K)), wdig(static_cast<size_t>(3 * 32 * K)),
              packed(static_cast<size_t>(3 * pb));
          std::vector<int32_t> wsi(static_cast<size_t>(nb));
          int64_t acc[32 * 32];
          for (int64_t o0 = b; o0 < e; o0 += 32) {
            const int64_t no = std::min<int64_t>(32, e - o0);
            for (int64_t j = 0; j < no; ++j) {
              const int64_t o = o0 + j;
              decode_twice_e2m1(static_cast<const uint8_t*>(w.codes.data) + o * (K / 2), K,
                                wv.data());
              const uint8_t* ws = static_cast<const uint8_t*>(w.block_scales.data) + o * nb;
              for (int64_t bl = 0; bl < nb; ++bl) wsi[bl] = scale_ints[ws[bl]];
              int8_t* const planes[3] = {wdig.data() + j * K, wdig.data() + (32 + j) * K,
                                         wdig.data() + (64 + j) * K};
              scaled_digit_planes(wv.data(), wsi.data(), K, planes);
            }
            for (int p = 0; p < 3; ++p)
              amx::pack_b32(wdig.data() + p * 32 * K, K, static_cast<int>(no), K,
                            packed.data() + p * pb);
            for (int64_t m0 = 0; m0 < M; m0 += 32) {
              plane_gemm_32x32(a_digits.data(), Mp, Kp, m0, M - m0, packed.data(), pb, 8, acc);
              for (int64_t i = 0; i < std::min<int64_t>(32, M - m0); ++i)
                for (int64_t j = 0; j < no; ++j) {
                  const float accf = std::ldexp(static_cast<float>(acc[i * 32 + j]), -20);
                  epilogue_store(out, m0 + i, o0 + j, accf, 1.f, pts, bias);
                }
            }
          }
        } else {  // convrot4: block-scaled e2m1 x e2m1
          const int64_t nb = K / 16;
          std::vector<int8_t> wv(static_cast<size_t>(K));
          std::vector<int32_t> wsi(static_cast<size_t>(nb));
          for (int64_t o = b; o < e; ++o) {
            const uint8_t* wp = static_cast<const uint8_t*>(w.codes.data) + o * (K / 2);
            const uint8_t* ws = static_cast<const uint8_t*>(w.block_scales.data) + o * nb;
            decode_twice_e2m1(wp, K, wv.data());
            for (int64_t bl = 0; bl < nb; ++bl) wsi[bl] = scale_ints[ws[bl]];
            for (int64_t m = 0; m < M; ++m) {
              // units of 2^-20: (2·e2m1)·(2·e2m1)·(2^9·s_a)·(2^9·s_w)
              const int64_t acc = nvfp4_dot(a_fp4.data() + m * K, a_fp4_scales.data() + m * nb,
                                            wv.data(), wsi.data(), nb);
              float accf = std::ldexp(static_cast<float>(acc), -20);
              epilogue_store(out, m, o, accf, 1.f, pts, bias);
            }
          }
        }
      },
      gemv || fp4_gemv || fp8_vnni ? kGemvChunksPerThread : 1);
}

// ---- backward, dequantize, requantize
// ------------------------------------------------------------

void dequantize_weight(const PackedWeightView& w, TensorView out, bool rotated_basis,
                       Context& ctx) {
  const int64_t O = w.out_features, K = w.in_features;
  parallel_for(O, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      float* row = static_cast<float*>(out.data) + o * out.stride[0];
      dequantize_weight_row(w, o, row);
      if (!rotated_basis) rotate_row(row, row, K, w.rot);
    }
  });
}

void quantized_linear_backward_input(const PackedWeightView& w, const TensorView& grad_out,
                                     TensorView grad_x, Context& ctx) {
  const int64_t M = grad_out.shape[0], K = w.in_features, O = w.out_features;
  std::vector<float> deq(static_cast<size_t>(O * K));
  TensorView dv = make_view(deq.data(), DType::f32, {O, K});
  cpu::dequantize_weight(w, dv, true, ctx);
  parallel_for(M, 1, ctx, [&](int64_t b, int64_t e) {
    std::vector<float> g(static_cast<size_t>(O)), row(static_cast<size_t>(K));
    std::vector<double> acc(static_cast<size_t>(K));
    for (int64_t m = b; m < e; ++m) {
      rows::load(row_bytes(grad_out, m), 0, grad_out.dtype, O, g.data());
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t o = 0; o < O; ++o) {
        const double go = g[o];
        const float* dr = deq.data() + o * K;
        for (int64_t k = 0; k < K; ++k) acc[k] += go * static_cast<double>(dr[k]);
      }
      for (int64_t k = 0; k < K; ++k) row[k] = static_cast<float>(acc[k]);
      rotate_row(row.data(), row.data(), K, w.rot);
      rows::store(row.data(), K, grad_x.dtype, row_bytes_mut(grad_x, m), 0);
    }
  });
}

void requantize_weight(const PackedWeightView& w, const TensorView& weight, bool stochastic,
                       uint64_t seed, Context& ctx) {
  const int64_t O = w.out_features, K = w.in_features;
  parallel_for(O, grain_rows(K), ctx, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t o = b; o < e; ++o) {
      rows::load(row_bytes(weight, o), 0, weight.dtype, K, row.data());
      rotate_row(row.data(), row.data(), K, w.rot);
      requantize_weight_row(w, o, row.data(), stochastic, seed);
    }
  });
}

}  // namespace cpu
}  // namespace lowbit
