// The CPU decode GEMV of the int8-code qtypes (linear_gemv.h). The weight's GEMM codes + 128
// (comfy: + 8) are the unsigned operand of vpdpbusd and the activation codes the signed one, so
// every dot is the wrapping int32 sum of (code + 128) x activation less 128 x the activation
// row's sum: the exact dot whenever it fits in int32, as in the other GEMMs.
#include "src/cpu/linear_gemv.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <vector>

#include "src/cpu/bits_vbmi.h"
#include "src/cpu/linear_kernels.h"
#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {
namespace convrot {

namespace {

std::atomic<bool> g_gemv_off{false};

bool grouped_nibbles(const PackedWeightView& w) {
  return w.qtype == QType::convrot_int4 && w.bits == 4 && w.group > 0 && w.group % 32 == 0 &&
         w.in_features % w.group == 0 && w.ratios.data != nullptr;
}
bool nibble_rows(const PackedWeightView& w) {
  return w.qtype == QType::convrot_comfy_w4a4 || grouped_nibbles(w);
}
// Bit-packed 2..7-bit grouped rows (SPEC §3.3; 4 bits are nibbles), groups a multiple of 64.
bool bit_rows(const PackedWeightView& w) {
  return w.qtype >= QType::convrot_int2 && w.qtype <= QType::convrot_int7 && w.bits >= 2 &&
         w.bits <= 7 && w.bits != 4 && w.group > 0 && w.group % 64 == 0 &&
         w.in_features % w.group == 0 && w.ratios.data != nullptr;
}
// Rows of one byte a code: convrot8's int8 codes, or convrotint8's stored u = code + 127.
bool byte_rows(const PackedWeightView& w) {
  return w.qtype == QType::convrot8 || (w.qtype == QType::convrot_int8 && w.bits == 8);
}
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
[[maybe_unused]] const uint8_t* code_row(const PackedWeightView& w, int64_t o) {
  return static_cast<const uint8_t*>(w.codes.data) + o * w.codes.shape[w.codes.ndim - 1];
}
// Weight row o's group ratios.
[[maybe_unused]] const float* row_ratios(const PackedWeightView& w, int64_t o) {
  return static_cast<const float*>(w.ratios.data) + o * w.ratios.shape[1];
}
// Ternary rows (convrot_bitnet: base 3, 5 codes a byte, SPEC §3.3), groups a multiple of 64 (a
// block's 320 codes meet at most 6 of them).
bool ternary_rows(const PackedWeightView& w) {
  return w.qtype == QType::convrot_bitnet && w.group > 0 && w.group % 64 == 0 &&
         w.in_features % w.group == 0 && w.ratios.data != nullptr;
}
// The activations of the GEMVs whose bytes hold `digits` codes (ternary 5, 2-bit rows 4): M rows
// of K codes into rows of `stride` bytes of digit-major blocks of digits x `lanes` codes, code
// block b + digits l + j at block b + lanes j + l (zero past K): lane l of digit vector j meets
// the code of byte l's digit j.
void pack_digit_major(const int8_t* codes, int64_t M, int64_t K, int64_t stride, int64_t lanes,
                      int64_t digits, int8_t* out) {
  const int64_t block = digits * lanes;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t b = 0; b < stride / block; ++b)
      for (int64_t j = 0; j < digits; ++j)
        for (int64_t l = 0; l < lanes; ++l) {
          const int64_t k = block * b + digits * l + j;
          out[r * stride + block * b + lanes * j + l] = k < K ? codes[r * K + k] : int8_t{0};
        }
}
// A ternary row's bytes, and its 64-byte blocks (each 320 codes).
int64_t ternary_bytes(const PackedWeightView& w) { return (w.in_features + 4) / 5; }
int64_t ternary_blocks(const PackedWeightView& w) { return (ternary_bytes(w) + 63) / 64; }
// Bit-packed rows of 2 or 3 bits keep prebuilt fold tables (2^n bytes a group, 1/8 and 1/6 of
// the codes' bytes); 5..7 bits build them as they go (32..128 bytes a group would add 40-114 %
// to the bytes a decode streams: 5 bits measured slower with them).
bool bit_tables(const PackedWeightView& w) { return bit_rows(w) && w.bits <= 3; }
// Bytes of a weight row's tables: 16 a group for 4-bit rows, 2^n for bit-packed rows.
[[maybe_unused]] int64_t table_bytes_per_row(const PackedWeightView& w) {
  return w.in_features / w.group * (bit_rows(w) ? int64_t{1} << w.bits : 16);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOWBIT_GEMV_X86 1
#define LOWBIT_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))

bool cpu_has_gemv() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has;
}
// The CPU has the GEMVs' instructions, the vector kernels are on and no test switched them off.
bool gemv_on() {
  return cpu_has_gemv() && simd_kernels_on() && !avx2_kernels_forced() && !g_gemv_off.load();
}

LOWBIT_VBMI inline uint32_t sum_lanes(__m512i v) {
  return static_cast<uint32_t>(_mm512_reduce_add_epi32(v));
}

// One group's table: fold_code(v - 7, ratio) + 128 as uint8 for the stored nibble v, by
// fold_codes' arithmetic (code x ratio in fp32, round half to even, NaN -> 0, clamp to ±127).
LOWBIT_VBMI inline __m128i fold_table(float ratio) {
  const __m512 v = _mm512_setr_ps(-7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f, 2.f, 3.f, 4.f,
                                  5.f, 6.f, 7.f, 8.f);
  const __m512 y = _mm512_mul_ps(v, _mm512_set1_ps(ratio));
  __m512 r = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, y, _CMP_ORD_Q), r);
  r = _mm512_max_ps(_mm512_min_ps(r, _mm512_set1_ps(127.f)), _mm512_set1_ps(-127.f));
  return _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_add_ps(r, _mm512_set1_ps(128.f))));
}
// The tables of weight row o (K / group of them, 16 bytes each) into tabs.
LOWBIT_VBMI void row_tables(const PackedWeightView& w, int64_t o, uint8_t* tabs) {
  const int64_t groups = w.in_features / w.group;
  const float* ratios = row_ratios(w, o);
  for (int64_t gi = 0; gi < groups; ++gi)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(tabs + 16 * gi), fold_table(ratios[gi]));
}

// Weight rows are prefetched kPrefetchRows rows ahead into the last-level cache (one thread
// streaming 3072 x 3072 layers from memory: 11.3-11.7 GB/s for int8 codes, 9.2-9.4 for comfy's
// 4-bit codes; into L2 9-10 / 6-8, into L1 9-11 / 6-8, no prefetch 8 / 5-6).
constexpr int64_t kPrefetchRows = 4;
inline void prefetch(const uint8_t* p) {  // (SSE: every x86-64 form calls it)
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T2);
}

// Weight rows per pass (4 measured the same as 2).
constexpr int kJ = 2;

// Where a 4-bit block's four 16-entry tables (one per 32-code chunk) come from.
enum TableMode {
  kSigned,   // comfy's signed nibbles (the GEMV: no table, nibble ^ 8 = code + 8)
  kGroup,    // group a multiple of 128: the block's group's table, broadcast
  kGroup64,  // two groups per block: tables t, t, t + 1, t + 1
  kGroup32,  // four groups per block: four consecutive tables
};
TableMode table_mode(const PackedWeightView& w) {
  return !grouped_nibbles(w)  ? kSigned
         : w.group % 128 == 0 ? kGroup
         : w.group == 64      ? kGroup64
                              : kGroup32;
}
// QuantizedLinear's tables of a 4-bit grouped weight (gemv_build_tables into decode_tiles), or
// nullptr where the view has none (then they are built a row at a time).
const uint8_t* prebuilt_tables(const PackedWeightView& w) {
  const bool has = (grouped_nibbles(w) || bit_tables(w)) && w.decode_tiles.data != nullptr &&
                   w.decode_tiles.device == Device::cpu &&
                   w.decode_tiles.numel() == gemv_tables_bytes(w);
  return has ? static_cast<const uint8_t*>(w.decode_tiles.data) : nullptr;
}

// The four tables of the block at byte k of a row (tab: the row's tables, 16 bytes a group;
// left: the row's bytes from k on). A row's last block may hold fewer groups than a full one
// (group 64: K an odd multiple of 64; group 32: K not a multiple of 128): only its own groups'
// tables are read (masked loads), never the next row's or past the buffer's end.
template <TableMode kMode>
LOWBIT_VBMI inline __m512i block_tables(const uint8_t* tab, int64_t k, int64_t group_bytes,
                                        int64_t left) {
  if (kMode == kGroup)
    return _mm512_broadcast_i32x4(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(tab + 16 * (k / group_bytes))));
  if (kMode == kGroup64) {  // 16 table bytes per 32 code bytes
    const __mmask32 m = left >= 64 ? ~__mmask32{0} : (__mmask32{1} << (left / 2)) - 1;
    const __m512i two = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(m, tab + k / 2));
    return _mm512_shuffle_i64x2(two, two, 0x50);  // 128-bit lanes 0, 0, 1, 1
  }
  return _mm512_maskz_loadu_epi8(tail_mask(left), tab + k);  // kGroup32: a table byte a code byte
}
// The table entries of a block's low and high nibbles: byte l of the block holds columns 2l and
// 2l + 1 of chunk l / 16, whose table sits at 16 (l / 16) of t; (raw & 15) | slot and
// ((raw >> 4) & 15) | slot are the vpermb indices (ternary logic 0xEA = (A & B) | C).
LOWBIT_VBMI inline void lookup_halves(__m512i raw, __m512i t, __m512i& lo, __m512i& hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i slot =
      _mm512_set_epi64(0x3030303030303030, 0x3030303030303030, 0x2020202020202020,
                       0x2020202020202020, 0x1010101010101010, 0x1010101010101010, 0, 0);
  lo = _mm512_permutexvar_epi8(_mm512_ternarylogic_epi32(raw, low4, slot, 0xEA), t);
  hi = _mm512_permutexvar_epi8(
      _mm512_ternarylogic_epi32(_mm512_srli_epi16(raw, 4), low4, slot, 0xEA), t);
}

// out[i][j] = the wrapping int32 sum over K of (GEMM code of weight row j + 128; comfy: + 8) x
// activation code of row i, for R activation rows x kJ weight rows of 4-bit codes. a[i]: 128
// bytes per block (even columns, then odd columns), zero past K; w[j]: the packed row; tab[j]:
// its tables (16 bytes a group; none for comfy). `ahead`: bytes from a weight row to the row to
// prefetch.
template <int R, TableMode kMode>
LOWBIT_VBMI void nibble_dots(const int8_t* const* a, const uint8_t* const (&w)[kJ],
                             const uint8_t* const (&tab)[kJ], int64_t K, int64_t group,
                             int64_t ahead, uint32_t (&out)[4][kJ]) {
  // (Index loops, not range-for: references into acc kept GCC from holding it in registers.)
  __m512i acc[R][kJ];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < kJ; ++j) acc[i][j] = _mm512_setzero_si512();
  const __m512i low4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  const int64_t bytes = K / 2, group_bytes = group / 2;
  for (int64_t k = 0; k < bytes; k += 64) {
    const __mmask64 m = tail_mask(bytes - k);
    __m512i lo_a[R], hi_a[R];
    for (int i = 0; i < R; ++i) {
      lo_a[i] = _mm512_loadu_si512(a[i] + 2 * k);
      hi_a[i] = _mm512_loadu_si512(a[i] + 2 * k + 64);
    }
    for (int j = 0; j < kJ; ++j) {
      const __m512i raw = _mm512_maskz_loadu_epi8(m, w[j] + k);
      prefetch(w[j] + k + ahead);
      __m512i lo, hi;
      if (kMode == kSigned) {
        // (raw & 15) ^ 8 and ((raw >> 4) & 15) ^ 8: ternary logic 0x6A = (A & B) ^ C.
        lo = _mm512_ternarylogic_epi32(raw, low4, eight, 0x6A);
        hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(raw, 4), low4, eight, 0x6A);
      } else {
        lookup_halves(raw, block_tables<kMode>(tab[j], k, group_bytes, bytes - k), lo, hi);
      }
      for (int i = 0; i < R; ++i) {
        acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], lo, lo_a[i]);
        acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], hi, hi_a[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < kJ; ++j) out[i][j] = sum_lanes(acc[i][j]);
}

// The same for two byte rows (byte_rows), the unsigned operand code + 128: convrot8's code ^ 0x80,
// or (kStored) convrotint8's stored code + 127, plus 1 (mod 256: the byte 255 reads as code -128,
// as the scalar unpack reads it); a[i]: the row, zero past K.
template <int R, bool kStored>
LOWBIT_VBMI void int8_dots(const int8_t* const* a, const uint8_t* const (&w)[kJ], int64_t K,
                           int64_t ahead, uint32_t (&out)[4][kJ]) {
  __m512i acc[R][kJ];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < kJ; ++j) acc[i][j] = _mm512_setzero_si512();
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t k = 0; k < K; k += 64) {
    const __mmask64 m = tail_mask(K - k);
    __m512i x[R];
    for (int i = 0; i < R; ++i) x[i] = _mm512_loadu_si512(a[i] + k);
    for (int j = 0; j < kJ; ++j) {
      __m512i y = _mm512_maskz_loadu_epi8(m, w[j] + k);
      y = kStored ? _mm512_add_epi8(y, _mm512_set1_epi8(1)) : _mm512_xor_si512(y, bias);
      prefetch(w[j] + k + ahead);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], y, x[i]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < kJ; ++j) out[i][j] = sum_lanes(acc[i][j]);
}

// A fold table stored as its 2^n bytes, repeated over 64 bytes (t0; t1 the entries from 64).
template <int kBits>
LOWBIT_VBMI inline void load_table(const uint8_t* t, __m512i& t0, __m512i& t1) {
  if (kBits == 2) t0 = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(t));
  if (kBits == 3) t0 = _mm512_set1_epi64(*reinterpret_cast<const int64_t*>(t));
  if (kBits == 5)
    t0 = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t)));
  if (kBits >= 6) t0 = _mm512_loadu_si512(t);
  t1 = kBits == 7 ? _mm512_loadu_si512(t + 64) : t0;
}
// c_i0 += the dots of weight operand ua, c_i1 of ub, with activation row i's 64 bytes at a[i] + k,
// i < R (the GEMVs' named accumulators: GCC 12 kept arrays of them in memory, a store a step).
template <int R>
LOWBIT_VBMI inline __attribute__((always_inline)) void dot_step(
    const int8_t* const* a, int64_t k, __m512i ua, __m512i ub, __m512i& c00, __m512i& c01,
    __m512i& c10, __m512i& c11, __m512i& c20, __m512i& c21, __m512i& c30, __m512i& c31) {
  const __m512i v0 = _mm512_loadu_si512(a[0] + k);
  c00 = _mm512_dpbusd_epi32(c00, ua, v0);
  c01 = _mm512_dpbusd_epi32(c01, ub, v0);
  if (R > 1) {
    const __m512i v1 = _mm512_loadu_si512(a[1] + k);
    c10 = _mm512_dpbusd_epi32(c10, ua, v1);
    c11 = _mm512_dpbusd_epi32(c11, ub, v1);
  }
  if (R > 2) {
    const __m512i v2 = _mm512_loadu_si512(a[2] + k);
    c20 = _mm512_dpbusd_epi32(c20, ua, v2);
    c21 = _mm512_dpbusd_epi32(c21, ub, v2);
  }
  if (R > 3) {
    const __m512i v3 = _mm512_loadu_si512(a[3] + k);
    c30 = _mm512_dpbusd_epi32(c30, ua, v3);
    c31 = _mm512_dpbusd_epi32(c31, ub, v3);
  }
}

// The same as int8_dots for bit-packed rows (bit_rows): each group's fold table + 128 for both
// weight rows, loaded (kPrebuilt: tab) or built in registers (bits::fold_tables), 64 codes a step
// by vpermb (vpermi2b for 7 bits) on their raw fields; a[i] in natural order.
template <int R, int kBits, bool kPrebuilt>
LOWBIT_VBMI void bit_dots(const int8_t* const* a, const uint8_t* const (&w)[kJ],
                          const float* const (&ratios)[kJ], const uint8_t* const (&tab)[kJ],
                          const bits::Fields& f, const bits::FoldIndex& x, int64_t K, int64_t group,
                          int64_t ahead, uint32_t (&out)[4][kJ]) {
  constexpr bool kWide = kBits == 7;
  static_assert(kJ == 2 && R >= 1 && R <= 4, "bit_dots: two weight rows, 1..4 activation rows");
  // Named accumulators and tables: GCC 12 kept arrays of them in memory here (a store every
  // step).
  const __m512i zero = _mm512_setzero_si512();
  __m512i c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero,
          c31 = zero;
  constexpr int64_t kEntries = int64_t{1} << kBits;
  for (int64_t g0 = 0, gi = 0; g0 < K; g0 += group, ++gi) {
    __m512i ta0, ta1, tb0, tb1;
    if (kPrebuilt) {
      load_table<kBits>(tab[0] + gi * kEntries, ta0, ta1);
      load_table<kBits>(tab[1] + gi * kEntries, tb0, tb1);
    } else {
      bits::fold_tables<kBits>(x, ratios[0][gi], 128, ta0, ta1);
      bits::fold_tables<kBits>(x, ratios[1][gi], 128, tb0, tb1);
    }
    for (int64_t k = g0; k < g0 + group; k += 64) {
      // (the tables repeat every 2^n entries: the fields need no mask)
      const __m512i ra = bits::raw_high(f, w[0], k), rb = bits::raw_high(f, w[1], k);
      prefetch(w[0] + (k >> 3) * kBits + ahead);
      prefetch(w[1] + (k >> 3) * kBits + ahead);
      const __m512i ua =
          kWide ? _mm512_permutex2var_epi8(ta0, ra, ta1) : _mm512_permutexvar_epi8(ra, ta0);
      const __m512i ub =
          kWide ? _mm512_permutex2var_epi8(tb0, rb, tb1) : _mm512_permutexvar_epi8(rb, tb0);
      dot_step<R>(a, k, ua, ub, c00, c01, c10, c11, c20, c21, c30, c31);
    }
  }
  const __m512i c[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < kJ; ++j) out[i][j] = sum_lanes(c[i][j]);
}
// A bit-packed row's fold tables (fold_tables + 128), each group's 2^n entries in turn: the
// prebuilt tables of bit_tables, or a pass's scratch where more than one pass of activation
// rows reads them.
LOWBIT_VBMI void bit_row_tables(const PackedWeightView& w, int64_t o, uint8_t* tabs) {
  const bits::FoldIndex x = bits::fold_index(w.bits);
  const int64_t groups = w.in_features / w.group, entries = int64_t{1} << w.bits;
  const float* ratios = row_ratios(w, o);
  const __mmask64 m = tail_mask(entries);
  for (int64_t gi = 0; gi < groups; ++gi) {
    __m512i t0, t1;
    bits::fold_tables(w.bits, x, ratios[gi], 128, t0, t1);
    _mm512_mask_storeu_epi8(tabs + gi * entries, m, t0);
    if (entries > 64) _mm512_storeu_si512(tabs + gi * entries + 64, t1);
  }
}

// ---- ternary rows (digits: bits::ternary_digit) ----
// The lanes of a block's digit vector j (lane i: code 320 blk + 5 i + j) fall into at most six
// groups of 64 or more codes, in order: the first group, then each later one with the mask of
// its lanes onward.
struct TernaryParts {
  int32_t first = 0, n = 0;  // n later groups
  int32_t group[5] = {};
  __mmask64 from[5] = {};
};
std::vector<TernaryParts> ternary_parts(const PackedWeightView& w) {
  const int64_t K = w.in_features, groups = K / w.group, blocks = ternary_blocks(w);
  std::vector<TernaryParts> parts(static_cast<size_t>(5 * blocks));
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int j = 0; j < 5; ++j) {
      TernaryParts& p = parts[static_cast<size_t>(5 * blk + j)];
      int64_t last = -1;
      for (int64_t i = 0; i < 64; ++i) {
        // (codes past K, which meet zero activations, take the last group's table)
        const int64_t g = std::min((320 * blk + 5 * i + j) / w.group, groups - 1);
        if (last < 0) {
          p.first = static_cast<int32_t>(g);
        } else if (g != last) {
          p.group[p.n] = static_cast<int32_t>(g);
          p.from[p.n] = ~__mmask64{0} << i;
          ++p.n;
        }
        last = g;
      }
    }
  return parts;
}
// build(w), a function of the weight's (K, group) alone, kept per thread for the last shape (a
// layer's GEMV asks for it per 64 weight rows).
template <typename T>
const T& last_shape(const PackedWeightView& w, T (*build)(const PackedWeightView&)) {
  thread_local struct {
    int64_t K = -1, group = -1;
    T value;
  } cache;
  if (cache.K != w.in_features || cache.group != w.group) {
    cache.value = build(w);
    cache.K = w.in_features;
    cache.group = w.group;
  }
  return cache.value;
}
// Each group's three GEMM codes + 128 of the codes -1, 0, 1, bytes 0..2 of a word: with f =
// fold_code(1, ratio) (clamp(rint(ratio), -127, 127), NaN -> 0, 16 groups a step),
// fold_code(-1, ratio) = -f (rounding and clamp are symmetric) and fold_code(0, ratio) = 0
// (0 x ratio is 0 or NaN).
LOWBIT_VBMI void ternary_words(const PackedWeightView& w, int64_t o, uint32_t* words) {
  const int64_t groups = w.in_features / w.group;
  const float* ratios = row_ratios(w, o);
  const __m512i c128 = _mm512_set1_epi32(128), mid = _mm512_set1_epi32(128 << 8);
  for (int64_t g = 0; g < groups; g += 16) {
    const __mmask16 m = tail_mask16(groups - g);
    const __m512 r = _mm512_maskz_loadu_ps(m, ratios + g);
    __m512 q = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), q);
    q = _mm512_max_ps(_mm512_min_ps(q, _mm512_set1_ps(127.f)), _mm512_set1_ps(-127.f));
    const __m512i f = _mm512_cvtps_epi32(q);
    const __m512i v = _mm512_add_epi32(_mm512_add_epi32(_mm512_sub_epi32(c128, f), mid),
                                       _mm512_slli_epi32(_mm512_add_epi32(c128, f), 16));
    _mm512_mask_storeu_epi32(words + g, m, v);
  }
}
// out[i][j] for R activation rows x kJ ternary weight rows: per 64-byte block, the five digit
// vectors by table (vpermi2b on the byte's low 7 bits, high half picked by its top bit), each
// digit's GEMM code + 128 by vpermb on its group's three-entry table (merged over the parts),
// vpdpbusd against the activations' digit-major layout (a[i]: per block, the codes 5 l + j of
// the block's 320 at 64 j + l).
template <int R>
LOWBIT_VBMI void ternary_dots(const int8_t* const* a, const uint8_t* const (&w)[kJ],
                              const uint32_t* const (&words)[kJ], const TernaryParts* parts,
                              int64_t bytes, int64_t ahead, uint32_t (&out)[4][kJ]) {
  static_assert(kJ == 2 && R >= 1 && R <= 4, "ternary_dots: two weight rows, 1..4 activation rows");
  const bits::TernaryDigits& dt = bits::ternary_digits();
  const __m512i zero = _mm512_setzero_si512();
  __m512i c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero,
          c31 = zero;
  for (int64_t blk = 0, k = 0; k < bytes; ++blk, k += 64) {
    const __mmask64 m = tail_mask(bytes - k);
    const __m512i ba = _mm512_maskz_loadu_epi8(m, w[0] + k);
    const __m512i bb = _mm512_maskz_loadu_epi8(m, w[1] + k);
    prefetch(w[0] + k + ahead);
    prefetch(w[1] + k + ahead);
    const __mmask64 ha = _mm512_movepi8_mask(ba), hb = _mm512_movepi8_mask(bb);
    for (int j = 0; j < 5; ++j) {
      const __m512i da = bits::ternary_digit(dt.t[j], ba, ha);
      const __m512i db = bits::ternary_digit(dt.t[j], bb, hb);
      const TernaryParts& p = parts[5 * blk + j];
      __m512i ua =
          _mm512_permutexvar_epi8(da, _mm512_set1_epi32(static_cast<int>(words[0][p.first])));
      __m512i ub =
          _mm512_permutexvar_epi8(db, _mm512_set1_epi32(static_cast<int>(words[1][p.first])));
      for (int q = 0; q < p.n; ++q) {
        ua = _mm512_mask_permutexvar_epi8(
            ua, p.from[q], da, _mm512_set1_epi32(static_cast<int>(words[0][p.group[q]])));
        ub = _mm512_mask_permutexvar_epi8(
            ub, p.from[q], db, _mm512_set1_epi32(static_cast<int>(words[1][p.group[q]])));
      }
      dot_step<R>(a, 320 * blk + 64 * j, ua, ub, c00, c01, c10, c11, c20, c21, c30, c31);
    }
  }
  const __m512i c[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < kJ; ++j) out[i][j] = sum_lanes(c[i][j]);
}

// M rows of K int8 values into rows of `stride` bytes (zero past K); for the 4-bit layouts
// (`nibbles`), each block of 128 as its 64 even columns, then its 64 odd columns.
LOWBIT_VBMI void pack_rows(const int8_t* codes, int64_t M, int64_t K, int64_t stride, bool nibbles,
                           int8_t* out) {
  alignas(64) uint8_t even_odd[128];
  for (int i = 0; i < 64; ++i) even_odd[i] = static_cast<uint8_t>(2 * i);
  for (int i = 0; i < 64; ++i) even_odd[64 + i] = static_cast<uint8_t>(2 * i + 1);
  const __m512i even = _mm512_load_si512(even_odd), odd = _mm512_load_si512(even_odd + 64);
  for (int64_t r = 0; r < M; ++r) {
    const int8_t* src = codes + r * K;
    int8_t* dst = out + r * stride;
    for (int64_t k = 0; k < stride; k += nibbles ? 128 : 64) {
      const __m512i x0 = _mm512_maskz_loadu_epi8(k < K ? tail_mask(K - k) : 0, src + k);
      if (!nibbles) {
        _mm512_storeu_si512(dst + k, x0);
        continue;
      }
      const __m512i x1 =
          _mm512_maskz_loadu_epi8(k + 64 < K ? tail_mask(K - k - 64) : 0, src + k + 64);
      _mm512_storeu_si512(dst + k, _mm512_permutex2var_epi8(x0, even, x1));
      _mm512_storeu_si512(dst + k + 64, _mm512_permutex2var_epi8(x0, odd, x1));
    }
  }
}

// The weight's row kind, for dots_pass.
struct RowKind {
  bool nibbles, bitrows, ternary;
  TableMode mode;           // nibbles
  bits::Fields f;           // bitrows
  bits::FoldIndex x;        // bitrows
  const float* ratios[kJ];  // bitrows: the pass's weight rows' group ratios
  const uint32_t* words[kJ];  // ternary: the pass's weight rows' group tables
  const TernaryParts* parts;  // ternary
  int64_t bytes;              // ternary: bytes a row
};

// bit_dots with the tables in memory (prebuilt or the call's scratch: tb) or built in registers.
template <int R, int kBits>
LOWBIT_VBMI void bit_pass(const PackedWeightView& w, const RowKind& kind, const int8_t* const* a,
                          const uint8_t* const (&wr)[kJ], const uint8_t* const (&tb)[kJ],
                          int64_t ahead, uint32_t (&out)[4][kJ]) {
  if (tb[0] != nullptr)
    return bit_dots<R, kBits, true>(a, wr, kind.ratios, tb, kind.f, kind.x, w.in_features, w.group,
                                    ahead, out);
  bit_dots<R, kBits, false>(a, wr, kind.ratios, tb, kind.f, kind.x, w.in_features, w.group, ahead,
                            out);
}

template <int R>
LOWBIT_VBMI void dots_pass(const PackedWeightView& w, const RowKind& kind, const int8_t* const* a,
                           const uint8_t* const (&wr)[kJ], const uint8_t* const (&tb)[kJ],
                           int64_t ahead, uint32_t (&out)[4][kJ]) {
  const int64_t K = w.in_features;
  if (kind.ternary) return ternary_dots<R>(a, wr, kind.words, kind.parts, kind.bytes, ahead, out);
  if (kind.bitrows) {
    switch (w.bits) {
      case 2:
        return bit_pass<R, 2>(w, kind, a, wr, tb, ahead, out);
      case 3:
        return bit_pass<R, 3>(w, kind, a, wr, tb, ahead, out);
      case 5:
        return bit_pass<R, 5>(w, kind, a, wr, tb, ahead, out);
      case 6:
        return bit_pass<R, 6>(w, kind, a, wr, tb, ahead, out);
      default:
        return bit_pass<R, 7>(w, kind, a, wr, tb, ahead, out);
    }
  }
  if (!kind.nibbles)
    return w.qtype == QType::convrot8 ? int8_dots<R, false>(a, wr, K, ahead, out)
                                      : int8_dots<R, true>(a, wr, K, ahead, out);
  switch (kind.mode) {
    case kSigned:
      return nibble_dots<R, kSigned>(a, wr, tb, K, 0, ahead, out);
    case kGroup:
      return nibble_dots<R, kGroup>(a, wr, tb, K, w.group, ahead, out);
    case kGroup64:
      return nibble_dots<R, kGroup64>(a, wr, tb, K, w.group, ahead, out);
    case kGroup32:
      return nibble_dots<R, kGroup32>(a, wr, tb, K, w.group, ahead, out);
  }
}

// Rows [o0, o1) in pairs (a last odd row pairs with itself), activation rows 4 at a time.
LOWBIT_VBMI void dots_rows(const PackedWeightView& w, const int8_t* act, const int32_t* act_sums,
                           int64_t M, int64_t o0, int64_t o1, int32_t* dots) {
  const int64_t n = o1 - o0, stride = gemv_row_bytes(w);
  const bool nibbles = nibble_rows(w), grouped = grouped_nibbles(w);
  RowKind kind{};
  kind.nibbles = nibbles;
  kind.bitrows = bit_rows(w);
  kind.ternary = ternary_rows(w);
  kind.mode = table_mode(w);
  std::vector<uint32_t> words;
  const int64_t groups = w.group > 0 ? w.in_features / w.group : 0;
  if (kind.ternary) {
    words.resize(static_cast<size_t>(kJ * groups));
    kind.parts = last_shape(w, ternary_parts).data();
    kind.bytes = ternary_bytes(w);
  }
  if (kind.bitrows) {
    kind.f = bits::fields(w.bits);
    kind.x = bits::fold_index(w.bits);
  }
  const int64_t ahead = kPrefetchRows * w.codes.shape[w.codes.ndim - 1];
  const uint8_t* prebuilt = prebuilt_tables(w);
  // Bit-packed rows without prebuilt tables: built in registers for one pass of activation rows
  // (up to 4), into scratch once a weight row for more.
  const bool bit_scratch = kind.bitrows && !prebuilt && M > 4;
  const int64_t row_tab = grouped || bit_tables(w) || bit_scratch ? table_bytes_per_row(w) : 0;
  std::vector<uint8_t> tabs(
      (grouped || bit_scratch) && !prebuilt ? static_cast<size_t>(kJ * row_tab) : 0);
  // What the weight operand adds to each code: 8 for comfy's nibble ^ 8, else 128.
  const uint32_t bias = grouped || !nibbles ? 128u : 8u;
  for (int64_t o = o0; o < o1; o += kJ) {
    int64_t oo[kJ];
    const uint8_t* wr[kJ];
    const uint8_t* tb[kJ];
    for (int j = 0; j < kJ; ++j) {
      oo[j] = std::min<int64_t>(o + j, o1 - 1);
      wr[j] = code_row(w, oo[j]);
      tb[j] = nullptr;
      if (kind.bitrows) kind.ratios[j] = row_ratios(w, oo[j]);
      if (kind.ternary) {
        ternary_words(w, oo[j], words.data() + j * groups);
        kind.words[j] = words.data() + j * groups;
      }
    }
    for (int j = 0; (grouped || prebuilt || bit_scratch) && j < kJ; ++j) {
      if (prebuilt) {
        tb[j] = prebuilt + oo[j] * row_tab;
      } else {
        uint8_t* t = tabs.data() + j * row_tab;
        bit_scratch ? bit_row_tables(w, oo[j], t) : row_tables(w, oo[j], t);
        tb[j] = t;
      }
    }
    for (int64_t m = 0; m < M; m += 4) {
      const int64_t rows = std::min<int64_t>(4, M - m);
      const int8_t* a[4];
      for (int64_t i = 0; i < 4; ++i) a[i] = act + (m + std::min(i, rows - 1)) * stride;
      uint32_t out[4][kJ];
      switch (rows) {
        case 1:
          dots_pass<1>(w, kind, a, wr, tb, ahead, out);
          break;
        case 2:
          dots_pass<2>(w, kind, a, wr, tb, ahead, out);
          break;
        case 3:
          dots_pass<3>(w, kind, a, wr, tb, ahead, out);
          break;
        default:
          dots_pass<4>(w, kind, a, wr, tb, ahead, out);
          break;
      }
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < std::min<int64_t>(kJ, o1 - o); ++j)
          dots[(m + i) * n + (o - o0) + j] =
              static_cast<int32_t>(out[i][j] - bias * static_cast<uint32_t>(act_sums[m + i]));
    }
  }
}

// Weight row o's GEMM codes (K of them, natural order) into codes: the GEMV's table lookups,
// less 128, the even and odd columns interleaved back; tab: the row's tables (comfy: its
// signed nibbles + 128).
template <TableMode kMode>
LOWBIT_VBMI void unpack_row(const uint8_t* row, const uint8_t* tab, int64_t K, int64_t group,
                            int8_t* codes) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  alignas(64) uint8_t order[128];
  for (int i = 0; i < 128; ++i) order[i] = static_cast<uint8_t>((i % 2) * 64 + i / 2);
  const __m512i first = _mm512_load_si512(order), second = _mm512_load_si512(order + 64);
  const __m512i one =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tab)));
  const int64_t bytes = K / 2, group_bytes = group / 2;
  for (int64_t k = 0; k < bytes; k += 64) {
    const __m512i raw = _mm512_maskz_loadu_epi8(tail_mask(bytes - k), row + k);
    __m512i lo, hi;
    lookup_halves(raw, kMode == kSigned ? one : block_tables<kMode>(tab, k, group_bytes, bytes - k),
                  lo, hi);
    lo = _mm512_xor_si512(lo, bias);
    hi = _mm512_xor_si512(hi, bias);
    _mm512_mask_storeu_epi8(codes + 2 * k, tail_mask(K - 2 * k),
                            _mm512_permutex2var_epi8(lo, first, hi));
    if (K - 2 * k > 64)
      _mm512_mask_storeu_epi8(codes + 2 * k + 64, tail_mask(K - 2 * k - 64),
                              _mm512_permutex2var_epi8(lo, second, hi));
  }
}

LOWBIT_VBMI void unpack_rows(const PackedWeightView& w, int64_t o0, int64_t n, int8_t* codes) {
  const int64_t K = w.in_features;
  const bool grouped = grouped_nibbles(w);
  const TableMode mode = table_mode(w);
  const int64_t row_tab = grouped ? table_bytes_per_row(w) : 0;
  const uint8_t* prebuilt = prebuilt_tables(w);
  std::vector<uint8_t> tabs(grouped && !prebuilt ? static_cast<size_t>(row_tab) : 16);
  if (!grouped)
    for (int v = 0; v < 16; ++v)
      tabs[v] = static_cast<uint8_t>(signed_nibble(static_cast<uint8_t>(v)) + 128);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t o = o0 + j;
    const uint8_t* tab = tabs.data();
    if (prebuilt) {
      tab = prebuilt + o * row_tab;
    } else if (grouped) {
      row_tables(w, o, tabs.data());
    }
    int8_t* out = codes + j * K;
    switch (mode) {
      case kSigned:
        unpack_row<kSigned>(code_row(w, o), tab, K, 0, out);
        break;
      case kGroup:
        unpack_row<kGroup>(code_row(w, o), tab, K, w.group, out);
        break;
      case kGroup64:
        unpack_row<kGroup64>(code_row(w, o), tab, K, w.group, out);
        break;
      case kGroup32:
        unpack_row<kGroup32>(code_row(w, o), tab, K, w.group, out);
        break;
    }
  }
}

// ---- NVFP4 (convrot4) ----
// Twice the e2m1 value of each code + 12 (uint8 in [0, 24]; the sign is bit 3).
LOWBIT_VBMI inline __m512i twice_e2m1_plus12() {
  return _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

// out[i] (i < R) += the exact int64 NVFP4 dot of weight row `row` (codes, e4m3 block scales)
// with activation row i: a[i] in the GEMV's 4-bit layout (twice-e2m1 integers), sa[i] its
// block scale integers and c12[i] 12 x its block sums (Fp4Activations::blocks entries each, a
// multiple of 8, zero past the row's blocks).
template <int R>
LOWBIT_VBMI void fp4_dots(const uint8_t* codes, const uint8_t* scales, const int32_t* scale_ints,
                          const int8_t* const* a, const int32_t* const* sa,
                          const int32_t* const* c12, int64_t K, int64_t ahead, int64_t* out) {
  __m512i acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_si512();
  const __m512i low4 = _mm512_set1_epi8(0x0F), t = twice_e2m1_plus12();
  const int64_t bytes = K / 2, nb = K / 16;
  for (int64_t k = 0; k < bytes; k += 64) {
    const __m512i raw = _mm512_maskz_loadu_epi8(tail_mask(bytes - k), codes + k);
    prefetch(codes + k + ahead);
    const __m512i lo = _mm512_permutexvar_epi8(_mm512_and_si512(raw, low4), t);
    const __m512i hi =
        _mm512_permutexvar_epi8(_mm512_and_si512(_mm512_srli_epi16(raw, 4), low4), t);
    // The 8 blocks' weight scale integers, as int64.
    const int64_t b0 = k / 8;
    const __mmask8 bm = static_cast<__mmask8>(nb - b0 >= 8 ? 0xFF : (1u << (nb - b0)) - 1);
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_maskz_loadu_epi8(bm, scales + b0));
    const __m512i sw = _mm512_cvtepi32_epi64(
        _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), bm, idx, scale_ints, 4));
    for (int i = 0; i < R; ++i) {
      __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(a[i] + 2 * k));
      d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(a[i] + 2 * k + 64));
      // Block j of the step sits in lanes 2j, 2j + 1: their sum, less 12 x the block's sum.
      const __m256i dots =
          _mm256_sub_epi32(_mm512_cvtepi64_epi32(_mm512_add_epi32(d, _mm512_srli_epi64(d, 32))),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c12[i] + b0)));
      const __m256i da = _mm256_mullo_epi32(
          dots, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sa[i] + b0)));
      acc[i] = _mm512_add_epi64(acc[i], _mm512_mul_epi32(_mm512_cvtepi32_epi64(da), sw));
    }
  }
  for (int i = 0; i < R; ++i) out[i] = _mm512_reduce_add_epi64(acc[i]);
}

LOWBIT_VBMI void build_tables(const PackedWeightView& w, int64_t o0, int64_t o1, uint8_t* out) {
  const int64_t row_tab = table_bytes_per_row(w);
  for (int64_t o = o0; o < o1; ++o)
    bit_tables(w) ? bit_row_tables(w, o, out + o * row_tab) : row_tables(w, o, out + o * row_tab);
}

// ---- the AVX2 form (CPUs without AVX-512 VBMI: Zen 3, Skylake / Cascade Lake, client cores) ----
// convrot8, the 4-bit, 2-bit, 3-bit and ternary rows (below). Products by vpmaddubsw on |weight
// code| (uint8) and the activation code carrying the weight's sign (vpsignb): each pair sum |w| |a|
// + |w'| |a'| <= 2 x 128 x 127 stays inside int16 (activation codes are in [-127, 127], SPEC §3.2;
// a weight code of -128 reads as 128), vpmaddwd by ones widens it to int32: the exact dot, no bias
// to take off. The activations: rows of round_up(K, 64) bytes, zero past K; for the 4-bit rows each
// block of 64 as its 32 even columns, then its 32 odd ones (a 32-byte load of packed codes is one
// block: its low nibbles are the even columns, 16 per 128-bit lane, each lane with its group's
// table); the 2-, 3-bit and ternary rows' own orders below.
#define LOWBIT_GEMV_AVX2 __attribute__((target("avx2")))

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
bool avx2_rows(const PackedWeightView& w) {
  return byte_rows(w) || nibble_rows(w) || ternary_rows(w) || bit_tables(w);
}
// The AVX2 form runs where the VBMI GEMV does not (no VBMI, or the tests forced the AVX2 kernels).
bool avx2_gemv_on() { return !gemv_on() && simd_kernels_on() && !g_gemv_off.load(); }
bool use_avx2(const PackedWeightView& w) { return avx2_gemv_on() && avx2_rows(w); }

// 32 bytes at p, or the 16 at p (zero above) where only 16 are left (rows end on 16 bytes).
LOWBIT_GEMV_AVX2 inline __m256i load_bytes(const uint8_t* p, int64_t left) {
  return left >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                    : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The AVX2 GEMVs' four accumulators (activation row i, weight row j: cij) summed into out.
LOWBIT_GEMV_AVX2 inline void store_sums(__m256i c00, __m256i c01, __m256i c10, __m256i c11,
                                        int32_t (&out)[2][kJ]) {
  out[0][0] = sum_lanes8(c00);
  out[0][1] = sum_lanes8(c01);
  out[1][0] = sum_lanes8(c10);
  out[1][1] = sum_lanes8(c11);
}
// fold_code's rounding of 8 products y = code x ratio: rint, NaN -> 0, clamp to ±127 (fp32).
LOWBIT_GEMV_AVX2 inline __m256 fold8(__m256 y) {
  return round_clamp8(y, _mm256_set1_ps(127.f), _mm256_set1_ps(-127.f));
}
// acc += the int32 pair sums of (signed weight codes s) x (activation codes a).
LOWBIT_GEMV_AVX2 inline __m256i dot_signed(__m256i acc, __m256i s, __m256i u, __m256i a) {
  const __m256i pairs = _mm256_maddubs_epi16(u, _mm256_sign_epi8(a, s));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
// c0 (and c1, R = 2) += the dots of signed weight codes s (|s|: u) with activation rows a[0]
// (and a[1]) at byte `at`.
template <int R>
LOWBIT_GEMV_AVX2 inline void dot_rows(__m256i& c0, __m256i& c1, __m256i s, __m256i u,
                                      const int8_t* const* a, int64_t at) {
  c0 = dot_signed(c0, s, u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[0] + at)));
  if (R > 1)
    c1 = dot_signed(c1, s, u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[1] + at)));
}
// The signed GEMM codes of a 4-bit block's 16-entry tables (per 128-bit lane) at byte k of a row.
template <TableMode kMode>
LOWBIT_GEMV_AVX2 inline __m256i block_tables_avx2(const uint8_t* tab, int64_t k, int64_t left,
                                                  int64_t group) {
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  if (kMode == kSigned)  // comfy: the nibble's own signed value
    return _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4,
                            5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
  if (kMode == kGroup32)  // two groups a block: tables k / 16 and k / 16 + 1
    return _mm256_xor_si256(load_bytes(tab + k, left), bias);
  return _mm256_xor_si256(  // one group a block (group a multiple of 64)
      _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tab + 16 * (2 * k / group)))),
      bias);
}
// out[i][j] = the exact dot of activation row i (R <= 2 of them, a[i]) with weight row j (kJ):
// 4-bit rows (kMode) or byte rows (kInt8; less kOffset: convrotint8's 127).
template <int R, bool kInt8, TableMode kMode, int kOffset = 0>
LOWBIT_GEMV_AVX2 void dots_avx2(const int8_t* const* a, const uint8_t* const (&w)[kJ],
                                const uint8_t* const (&tab)[kJ], int64_t K, int64_t group,
                                int64_t ahead, int32_t (&out)[2][kJ]) {
  static_assert(R >= 1 && R <= 2 && kJ == 2, "dots_avx2: 1..2 activation rows, 2 weight rows");
  const __m256i zero = _mm256_setzero_si256(), low4 = _mm256_set1_epi8(0x0F);
  __m256i c00 = zero, c01 = zero, c10 = zero, c11 = zero;
  const int64_t bytes = kInt8 ? K : K / 2;
  for (int64_t k = 0; k < bytes; k += 32) {
    const int64_t left = bytes - k;
    for (int j = 0; j < kJ; ++j) {
      const __m256i raw = load_bytes(w[j] + k, left);
      prefetch(w[j] + k + ahead);
      __m256i& c0 = j == 0 ? c00 : c01;
      __m256i& c1 = j == 0 ? c10 : c11;
      if (kInt8) {  // (convrotint8's zero bytes past K: code -127 against activations 0)
        const __m256i s =
            kOffset ? _mm256_sub_epi8(raw, _mm256_set1_epi8(static_cast<char>(kOffset))) : raw;
        dot_rows<R>(c0, c1, s, _mm256_abs_epi8(s), a, k);
        continue;
      }
      const __m256i t = block_tables_avx2<kMode>(tab[j], k, left, group);
      const __m256i slo = _mm256_shuffle_epi8(t, _mm256_and_si256(raw, low4));
      const __m256i shi = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4));
      dot_rows<R>(c0, c1, slo, _mm256_abs_epi8(slo), a, 2 * k);
      dot_rows<R>(c0, c1, shi, _mm256_abs_epi8(shi), a, 2 * k + 32);
    }
  }
  store_sums(c00, c01, c10, c11, out);
}
template <int R>
LOWBIT_GEMV_AVX2 void dots_pass_avx2(const PackedWeightView& w, TableMode mode,
                                     const int8_t* const* a, const uint8_t* const (&wr)[kJ],
                                     const uint8_t* const (&tb)[kJ], int64_t ahead,
                                     int32_t (&out)[2][kJ]) {
  const int64_t K = w.in_features;
  if (w.qtype == QType::convrot_int8)
    return dots_avx2<R, true, kSigned, 127>(a, wr, tb, K, 0, ahead, out);
  if (!nibble_rows(w)) return dots_avx2<R, true, kSigned>(a, wr, tb, K, 0, ahead, out);
  switch (mode) {
    case kSigned:
      return dots_avx2<R, false, kSigned>(a, wr, tb, K, 0, ahead, out);
    case kGroup32:
      return dots_avx2<R, false, kGroup32>(a, wr, tb, K, w.group, ahead, out);
    default:
      return dots_avx2<R, false, kGroup>(a, wr, tb, K, w.group, ahead, out);
  }
}
// ---- ternary rows on AVX2 ----
// A 32-byte block of a ternary row holds 160 codes; its digit vector j (lane l: code
// 160 b + 5 l + j) meets at most four groups (groups of 64 or more codes): g0 = the group of the
// block's first code, and per lane the offset of its group from g0 (codes past K take the last
// group), so one vpshufb on the four groups' fold codes f (f_g = fold_code(1, ratio_g), the
// code -1 folds to -f, 0 to 0) gives each lane its f (last_shape keeps them).
struct TernaryLanes {
  std::vector<int32_t> g0;     // per block
  std::vector<uint8_t> index;  // per block and digit: 32 group offsets
};
TernaryLanes ternary_lanes(const PackedWeightView& w) {
  const int64_t groups = w.in_features / w.group, blocks = (ternary_bytes(w) + 31) / 32;
  TernaryLanes t;
  t.g0.assign(static_cast<size_t>(blocks), 0);
  t.index.assign(static_cast<size_t>(blocks * 5 * 32), 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t g0 = std::min(160 * b / w.group, groups - 1);
    t.g0[static_cast<size_t>(b)] = static_cast<int32_t>(g0);
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t l = 0; l < 32; ++l)
        t.index[static_cast<size_t>((5 * b + j) * 32 + l)] =
            static_cast<uint8_t>(std::min((160 * b + 5 * l + j) / w.group, groups - 1) - g0);
  }
  return t;
}
// f_g = fold_code(1, ratio_g) of a row's groups as int8 (clamp(rint(ratio), ±127), NaN -> 0),
// 8 at a time, into f (groups + 4 bytes: the last block's four-group read stays inside).
LOWBIT_GEMV_AVX2 void ternary_fold_codes(const PackedWeightView& w, int64_t o, int8_t* f) {
  const int64_t groups = w.in_features / w.group;
  const float* ratios = row_ratios(w, o);
  int64_t g = 0;
  alignas(32) int32_t q[8];
  for (; g < groups; g += 8) {
    const int64_t n = std::min<int64_t>(8, groups - g);
    __m256 r;
    if (n == 8) {
      r = _mm256_loadu_ps(ratios + g);
    } else {
      alignas(32) float tail[8] = {};
      std::memcpy(tail, ratios + g, static_cast<size_t>(n) * sizeof(float));
      r = _mm256_load_ps(tail);
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_cvtps_epi32(fold8(r)));
    for (int64_t i = 0; i < n; ++i) f[g + i] = static_cast<int8_t>(q[i]);
  }
  std::memset(f + groups, 0, 4);
}
// The five digit vectors (0, 1, 2) of 32 base-3 bytes: each byte taken mod 243 (243..255 carry
// the digits of byte - 243, as the other paths read them), widened to 16 bits, q_j = floor(v /
// 3^j) by vpmulhuw on ceil(2^16 / 3^j) (exact for v < 243), digit j = q_j - 3 q_(j+1).
LOWBIT_GEMV_AVX2 inline void ternary_digits_avx2(__m256i raw, __m256i (&d)[5]) {
  const __m256i big =
      _mm256_cmpeq_epi8(_mm256_subs_epu8(raw, _mm256_set1_epi8(static_cast<char>(242))),
                        _mm256_setzero_si256());  // raw < 243
  const __m256i v =
      _mm256_blendv_epi8(_mm256_sub_epi8(raw, _mm256_set1_epi8(static_cast<char>(243))), raw, big);
  const __m256i zero = _mm256_setzero_si256();
  __m256i q[2][5];
  const __m256i half[2] = {_mm256_unpacklo_epi8(v, zero), _mm256_unpackhi_epi8(v, zero)};
  const int16_t magic[4] = {21846, 7282, 2428, 810};  // ceil(2^16 / 3^j), j = 1..4
  for (int h = 0; h < 2; ++h) {
    q[h][0] = half[h];
    for (int j = 1; j < 5; ++j)
      q[h][j] = _mm256_mulhi_epu16(half[h], _mm256_set1_epi16(magic[j - 1]));
  }
  for (int j = 0; j < 5; ++j) {
    __m256i t[2];
    for (int h = 0; h < 2; ++h)
      t[h] = j == 4
                 ? q[h][4]
                 : _mm256_sub_epi16(q[h][j], _mm256_mullo_epi16(q[h][j + 1], _mm256_set1_epi16(3)));
    d[j] = _mm256_packus_epi16(t[0], t[1]);  // (the unpacks' lane order restored)
  }
}
// out[i][j] for R <= 2 activation rows x kJ ternary weight rows; a[i] in the AVX2 ternary layout
// (per 32-byte block, code 160 b + 5 l + j at 160 b + 32 j + l), f[j] the rows' fold codes.
template <int R>
LOWBIT_GEMV_AVX2 void ternary_dots_avx2(const int8_t* const* a, const uint8_t* const (&w)[kJ],
                                        const int8_t* const (&f)[kJ], const TernaryLanes& lanes,
                                        int64_t bytes, int64_t ahead, int32_t (&out)[2][kJ]) {
  static_assert(R >= 1 && R <= 2 && kJ == 2, "ternary_dots_avx2: 1..2 activation rows");
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi8(1);
  __m256i c00 = zero, c01 = zero, c10 = zero, c11 = zero;
  for (int64_t b = 0, k = 0; k < bytes; ++b, k += 32) {
    const int32_t g0 = lanes.g0[static_cast<size_t>(b)];
    const uint8_t* index = lanes.index.data() + 5 * 32 * b;
    for (int j = 0; j < kJ; ++j) {
      __m256i raw;
      if (bytes - k >= 32) {
        raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j] + k));
      } else {
        alignas(32) uint8_t tail[32] = {};
        std::memcpy(tail, w[j] + k, static_cast<size_t>(bytes - k));
        raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
      }
      prefetch(w[j] + k + ahead);
      __m256i d[5];
      ternary_digits_avx2(raw, d);
      int32_t four;
      std::memcpy(&four, f[j] + g0, 4);
      const __m256i t = _mm256_set1_epi32(four);
      __m256i& c0 = j == 0 ? c00 : c01;
      __m256i& c1 = j == 0 ? c10 : c11;
      for (int q = 0; q < 5; ++q) {
        const __m256i fl = _mm256_shuffle_epi8(
            t, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + 32 * q)));
        const __m256i code = _mm256_sign_epi8(fl, _mm256_sub_epi8(d[q], one));
        dot_rows<R>(c0, c1, code, _mm256_abs_epi8(code), a, 5 * k + 32 * q);
      }
    }
  }
  store_sums(c00, c01, c10, c11, out);
}
// ---- 2-bit rows on AVX2 ----
// 32 stored bytes = 128 codes a step (byte l: codes 4 l .. 4 l + 3 at bits 2 j): digit vector j =
// (bytes >> 2 j) & 3, each 128-bit lane (64 codes, one group: groups are multiples of 64) looked
// up in its group's 4-entry table (fold_code(u - 1, ratio) + 128, bit_tables' layout); the
// activations digit-major (code 128 b + 4 l + j at 128 b + 32 j + l).
template <int R>
LOWBIT_GEMV_AVX2 void bit2_dots_avx2(const int8_t* const* a, const uint8_t* const (&w)[kJ],
                                     const uint8_t* const (&tab)[kJ], int64_t K, int64_t group,
                                     int64_t ahead, int32_t (&out)[2][kJ]) {
  static_assert(R >= 1 && R <= 2 && kJ == 2, "bit2_dots_avx2: 1..2 activation rows");
  const __m256i zero = _mm256_setzero_si256(), three = _mm256_set1_epi8(3),
                bias = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i c00 = zero, c01 = zero, c10 = zero, c11 = zero;
  const int64_t bytes = K / 4, last = K / group - 1;
  for (int64_t k = 0; k < bytes; k += 32) {
    const int64_t g0 = 4 * k / group, g1 = std::min((4 * k + 64) / group, last);
    for (int j = 0; j < kJ; ++j) {
      const __m256i raw = load_bytes(w[j] + k, bytes - k);
      prefetch(w[j] + k + ahead);
      int32_t t0, t1;
      std::memcpy(&t0, tab[j] + 4 * g0, 4);
      std::memcpy(&t1, tab[j] + 4 * g1, 4);
      const __m256i t = _mm256_xor_si256(_mm256_setr_epi32(t0, t0, t0, t0, t1, t1, t1, t1), bias);
      __m256i& c0 = j == 0 ? c00 : c01;
      __m256i& c1 = j == 0 ? c10 : c11;
      for (int q = 0; q < 4; ++q) {
        const __m256i code = _mm256_shuffle_epi8(
            t, _mm256_and_si256(q == 0 ? raw : _mm256_srli_epi16(raw, 2 * q), three));
        dot_rows<R>(c0, c1, code, _mm256_abs_epi8(code), a, 4 * k + 32 * q);
      }
    }
  }
  store_sums(c00, c01, c10, c11, out);
}
// A 4-, 3- or 2-bit row's tables (row_tables' and bit_tables' bytes: fold_code(u - (entries / 2 -
// 1), ratio) + 128 for the 16, 8 or 4 stored values u of each group), 8 entries a step by
// fold_codes' fp32 arithmetic.
LOWBIT_GEMV_AVX2 void row_tables_avx2(const PackedWeightView& w, int64_t o, uint8_t* tabs) {
  const int64_t groups = w.in_features / w.group;
  const int64_t entries = bit_rows(w) ? int64_t{1} << w.bits : 16;
  const float* ratios = row_ratios(w, o);
  const __m256 lane = _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
  alignas(32) int32_t q[8];
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t u0 = 0; u0 < entries; u0 += 8) {
      const __m256 c =
          _mm256_add_ps(lane, _mm256_set1_ps(static_cast<float>(u0 - (entries / 2 - 1))));
      const __m256 r = fold8(_mm256_mul_ps(c, _mm256_set1_ps(ratios[g])));
      _mm256_store_si256(reinterpret_cast<__m256i*>(q),
                         _mm256_cvtps_epi32(_mm256_add_ps(r, _mm256_set1_ps(128.f))));
      for (int64_t u = u0; u < std::min<int64_t>(entries, u0 + 8); ++u)
        tabs[g * entries + u] = static_cast<uint8_t>(q[u - u0]);
    }
}
// ---- 3-bit rows on AVX2 ----
// 12 stored bytes = 32 codes a step (8 codes in 3 bytes, code j at bits 3 j): each code's two
// bytes gathered into a 16-bit lane by vpshufb (codes 0..15 and 16..31 from one 16-byte load),
// its field moved to the top by vpmullw with 2^(13 - (3 j mod 8)) and down by a shift of 13, the
// halves packed (order 0-7, 16-23, 8-15, 24-31: the activations' per block of 32) and looked up
// in the group's 8-entry table (groups are multiples of 64: one a step).
template <int R>
LOWBIT_GEMV_AVX2 void bit3_dots_avx2(const int8_t* const* a, const uint8_t* const (&w)[kJ],
                                     const uint8_t* const (&tab)[kJ], int64_t K, int64_t group,
                                     int64_t ahead, int32_t (&out)[2][kJ]) {
  static_assert(R >= 1 && R <= 2 && kJ == 2, "bit3_dots_avx2: 1..2 activation rows");
  const __m256i zero = _mm256_setzero_si256(), bias = _mm256_set1_epi8(static_cast<char>(0x80));
  // Code j's bytes (3 j / 8 and the next) in lane order; lane 1 three bytes on; B six bytes on.
  const __m256i gather_a = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 1, 2, 1, 2, 1, 2, 2, 3, 2, 3,  //
                                            3, 4, 3, 4, 3, 4, 4, 5, 4, 5, 4, 5, 5, 6, 5, 6);
  const __m256i gather_b = _mm256_add_epi8(gather_a, _mm256_set1_epi8(6));
  const __m256i lift = _mm256_setr_epi16(8192, 1024, 128, 4096, 512, 64, 2048, 256,  //
                                         8192, 1024, 128, 4096, 512, 64, 2048, 256);
  __m256i c00 = zero, c01 = zero, c10 = zero, c11 = zero;
  const int64_t bytes = K / 8 * 3;
  for (int64_t k = 0, b = 0; k < K; k += 32, b += 12) {
    for (int j = 0; j < kJ; ++j) {
      __m128i raw16;
      if (bytes - b >= 16) {
        raw16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[j] + b));
      } else {
        alignas(16) uint8_t tail[16] = {};
        std::memcpy(tail, w[j] + b, static_cast<size_t>(bytes - b));
        raw16 = _mm_load_si128(reinterpret_cast<const __m128i*>(tail));
      }
      prefetch(w[j] + b + ahead);
      const __m256i v = _mm256_broadcastsi128_si256(raw16);
      const __m256i fa =
          _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, gather_a), lift), 13);
      const __m256i fb =
          _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, gather_b), lift), 13);
      int64_t t8;
      std::memcpy(&t8, tab[j] + 8 * (k / group), 8);
      const __m256i t = _mm256_xor_si256(_mm256_set1_epi64x(t8), bias);
      const __m256i code = _mm256_shuffle_epi8(t, _mm256_packus_epi16(fa, fb));
      dot_rows<R>(j == 0 ? c00 : c01, j == 0 ? c10 : c11, code, _mm256_abs_epi8(code), a, k);
    }
  }
  store_sums(c00, c01, c10, c11, out);
}
// M activation rows into the AVX2 layout (row_bytes_avx2 bytes each).
int64_t row_bytes_avx2(const PackedWeightView& w) {
  if (ternary_rows(w)) return 160 * ((ternary_bytes(w) + 31) / 32);
  return round_up(w.in_features, bit_rows(w) ? 128 : 64);
}
LOWBIT_GEMV_AVX2 void pack_rows_avx2(const PackedWeightView& w, const int8_t* codes, int64_t M,
                                     int8_t* out) {
  const int64_t K = w.in_features, stride = row_bytes_avx2(w);
  if (ternary_rows(w)) return pack_digit_major(codes, M, K, stride, 32, 5, out);
  if (bit_rows(w) && w.bits == 2) return pack_digit_major(codes, M, K, stride, 32, 4, out);
  if (bit_rows(w)) {  // 3 bits: per block of 32, codes 0-7, 16-23, 8-15, 24-31
    for (int64_t r = 0; r < M; ++r)
      for (int64_t p = 0; p < stride; ++p) {
        const int64_t q = p % 32, k = p - q + (q / 8 == 1 ? q + 8 : q / 8 == 2 ? q - 8 : q);
        out[r * stride + p] = k < K ? codes[r * K + k] : int8_t{0};
      }
    return;
  }
  // Per 128-bit lane: its 8 even bytes, then its 8 odd ones.
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                         4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  alignas(32) int8_t block[64];
  for (int64_t r = 0; r < M; ++r) {
    int8_t* dst = out + r * stride;
    for (int64_t k = 0; k < stride; k += 64) {
      const int64_t n = std::min<int64_t>(64, std::max<int64_t>(K - k, 0));
      std::memset(block, 0, sizeof(block));
      std::memcpy(block, codes + r * K + k, static_cast<size_t>(n));
      const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(block));
      const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + 32));
      if (!nibble_rows(w)) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), x0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k + 32), x1);
        continue;
      }
      // (64-bit quarters) x0 -> E0 O0 E1 O1 -> E0 E1 O0 O1, x1 likewise E2 E3 O2 O3
      const __m256i y0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(x0, split), 0xD8);
      const __m256i y1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(x1, split), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k),
                          _mm256_permute2x128_si256(y0, y1, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k + 32),
                          _mm256_permute2x128_si256(y0, y1, 0x31));
    }
  }
}
// The AVX2 GEMVs' activation rows two at a time (a last one alone) against the weight rows
// [o, o + kJ) of [o0, o1): pass(std::integral_constant<int, R>, a, out) fills out[i][j], i < R.
template <typename Pass>
void activation_pairs(const int8_t* act, int64_t stride, int64_t M, int64_t o, int64_t o0,
                      int64_t o1, int32_t* dots, Pass&& pass) {
  for (int64_t m = 0; m < M; m += 2) {
    const int8_t* a[2] = {act + m * stride, act + std::min(m + 1, M - 1) * stride};
    int32_t out[2][kJ];
    if (M - m >= 2) {
      pass(std::integral_constant<int, 2>{}, a, out);
    } else {
      pass(std::integral_constant<int, 1>{}, a, out);
    }
    for (int64_t i = 0; i < std::min<int64_t>(2, M - m); ++i)
      for (int64_t j = 0; j < std::min<int64_t>(kJ, o1 - o); ++j)
        dots[(m + i) * (o1 - o0) + (o - o0) + j] = out[i][j];
  }
}
// dots_rows_avx2 for ternary rows.
LOWBIT_GEMV_AVX2 void ternary_rows_avx2(const PackedWeightView& w, const int8_t* act, int64_t M,
                                        int64_t o0, int64_t o1, int32_t* dots) {
  const int64_t stride = row_bytes_avx2(w), bytes = ternary_bytes(w);
  const int64_t groups = w.in_features / w.group, ahead = kPrefetchRows * bytes;
  const TernaryLanes& lanes = last_shape(w, ternary_lanes);
  std::vector<int8_t> fold(static_cast<size_t>(kJ * (groups + 4)));
  for (int64_t o = o0; o < o1; o += kJ) {
    const uint8_t* wr[kJ];
    const int8_t* f[kJ];
    for (int j = 0; j < kJ; ++j) {
      const int64_t oo = std::min<int64_t>(o + j, o1 - 1);
      wr[j] = code_row(w, oo);
      int8_t* fj = fold.data() + j * (groups + 4);
      ternary_fold_codes(w, oo, fj);
      f[j] = fj;
    }
    activation_pairs(act, stride, M, o, o0, o1, dots,
                     [&](auto rows, const int8_t* const* a, int32_t(&out)[2][kJ]) {
                       ternary_dots_avx2<decltype(rows)::value>(a, wr, f, lanes, bytes, ahead, out);
                     });
  }
}
// dots_rows' AVX2 form: weight rows in pairs, activation rows 2 at a time.
LOWBIT_GEMV_AVX2 void dots_rows_avx2(const PackedWeightView& w, const int8_t* act, int64_t M,
                                     int64_t o0, int64_t o1, int32_t* dots) {
  const int64_t stride = row_bytes_avx2(w);
  if (ternary_rows(w)) return ternary_rows_avx2(w, act, M, o0, o1, dots);
  const bool grouped = grouped_nibbles(w), bitrows = bit_rows(w);  // (bit rows here: 2, 3 bits)
  const TableMode mode = table_mode(w);
  const int64_t ahead = kPrefetchRows * w.codes.shape[w.codes.ndim - 1];
  const uint8_t* prebuilt = prebuilt_tables(w);
  const int64_t row_tab = grouped || bitrows ? table_bytes_per_row(w) : 0;
  std::vector<uint8_t> tabs((grouped || bitrows) && !prebuilt ? static_cast<size_t>(kJ * row_tab)
                                                              : 0);
  for (int64_t o = o0; o < o1; o += kJ) {
    const uint8_t* wr[kJ];
    const uint8_t* tb[kJ];
    for (int j = 0; j < kJ; ++j) {
      const int64_t oo = std::min<int64_t>(o + j, o1 - 1);
      wr[j] = code_row(w, oo);
      tb[j] = nullptr;
      if ((grouped || bitrows) && prebuilt) {
        tb[j] = prebuilt + oo * row_tab;
      } else if (grouped || bitrows) {
        uint8_t* t = tabs.data() + j * row_tab;
        row_tables_avx2(w, oo, t);
        tb[j] = t;
      }
    }
    activation_pairs(act, stride, M, o, o0, o1, dots,
                     [&](auto rows, const int8_t* const* a, int32_t(&out)[2][kJ]) {
                       constexpr int R = decltype(rows)::value;
                       if (bitrows && w.bits == 2)
                         return bit2_dots_avx2<R>(a, wr, tb, w.in_features, w.group, ahead, out);
                       if (bitrows)
                         return bit3_dots_avx2<R>(a, wr, tb, w.in_features, w.group, ahead, out);
                       dots_pass_avx2<decltype(rows)::value>(w, mode, a, wr, tb, ahead, out);
                     });
  }
}
#undef LOWBIT_GEMV_AVX2
#endif

}  // namespace

bool gemv_supported(const PackedWeightView& w) {
#ifdef LOWBIT_GEMV_X86
  return use_avx2(w) ||
         (gemv_on() && (byte_rows(w) || nibble_rows(w) || bit_rows(w) || ternary_rows(w)));
#else
  (void)w;
  return false;
#endif
}
void force_gemv_off(bool off) { g_gemv_off.store(off); }

bool gemv_avx2(const PackedWeightView& w) {
#ifdef LOWBIT_GEMV_X86
  return use_avx2(w);
#else
  (void)w;
  return false;
#endif
}

int64_t gemv_row_bytes(const PackedWeightView& w) {
#ifdef LOWBIT_GEMV_X86
  if (use_avx2(w)) return row_bytes_avx2(w);
#endif
  if (ternary_rows(w)) return 320 * ternary_blocks(w);
  return nibble_rows(w) ? round_up(w.in_features, 128) : round_up(w.in_features, 64);
}

void gemv_pack_activations(const PackedWeightView& w, const int8_t* codes, int64_t M, int8_t* out,
                           int32_t* sums) {
#ifdef LOWBIT_GEMV_X86
  const int64_t K = w.in_features;
  if (use_avx2(w)) {  // (exact dots without a bias: no sums)
    for (int64_t r = 0; r < M; ++r) sums[r] = 0;
    return pack_rows_avx2(w, codes, M, out);
  }
  for (int64_t r = 0; r < M; ++r) {
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += codes[r * K + k];
    sums[r] = sum;
  }
  if (ternary_rows(w)) return pack_digit_major(codes, M, K, gemv_row_bytes(w), 64, 5, out);
  pack_rows(codes, M, K, gemv_row_bytes(w), nibble_rows(w), out);
#else
  (void)w, (void)codes, (void)M, (void)out, (void)sums;
#endif
}

void gemv_dots(const PackedWeightView& w, const int8_t* act, const int32_t* act_sums, int64_t M,
               int64_t o0, int64_t o1, int32_t* dots) {
#ifdef LOWBIT_GEMV_X86
  if (use_avx2(w)) return dots_rows_avx2(w, act, M, o0, o1, dots);
  dots_rows(w, act, act_sums, M, o0, o1, dots);
#else
  (void)w, (void)act, (void)act_sums, (void)M, (void)o0, (void)o1, (void)dots;
#endif
}

bool gemv_unpack_rows(const PackedWeightView& w, int64_t o0, int64_t n, int8_t* codes) {
#ifdef LOWBIT_GEMV_X86
  if (!gemv_on() || !nibble_rows(w)) return false;  // (the VBMI lookups)
  unpack_rows(w, o0, n, codes);
  return true;
#else
  (void)w, (void)o0, (void)n, (void)codes;
  return false;
#endif
}

bool gemv_fp4_supported(const PackedWeightView& w) {
#ifdef LOWBIT_GEMV_X86
  return w.qtype == QType::convrot4 && gemv_on();
#else
  (void)w;
  return false;
#endif
}

void gemv_fp4_pack_activations(const int8_t* values, const int32_t* scale_ints, int64_t M,
                               int64_t K, Fp4Activations& out) {
  const int64_t nb = K / 16;
  out.stride = round_up(K, 128);
  out.blocks = round_up(nb, 8);
  out.values.resize(static_cast<size_t>(M * out.stride));  // (pack_rows writes every byte)
  out.scales.assign(static_cast<size_t>(M * out.blocks), 0);
  out.sums12.assign(static_cast<size_t>(M * out.blocks), 0);
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* v = values + m * K;
    for (int64_t b = 0; b < nb; ++b) {
      int32_t sum = 0;
      for (int64_t k = 0; k < 16; ++k) sum += v[b * 16 + k];
      out.sums12[m * out.blocks + b] = 12 * sum;
      out.scales[m * out.blocks + b] = scale_ints[m * nb + b];
    }
  }
#ifdef LOWBIT_GEMV_X86
  pack_rows(values, M, K, out.stride, true, out.values.data());
#endif
}

void gemv_fp4_dots(const PackedWeightView& w, const int32_t* scale_ints, const Fp4Activations& act,
                   int64_t M, int64_t o0, int64_t o1, int64_t* dots) {
#ifdef LOWBIT_GEMV_X86
  const int64_t K = w.in_features, n = o1 - o0, nb = K / 16;
  const int64_t ahead = kPrefetchRows * (K / 2);
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* codes = static_cast<const uint8_t*>(w.codes.data) + o * (K / 2);
    const uint8_t* scales = static_cast<const uint8_t*>(w.block_scales.data) + o * nb;
    for (int64_t m = 0; m < M; m += 4) {
      const int64_t rows = std::min<int64_t>(4, M - m);
      const int8_t* a[4];
      const int32_t* sa[4];
      const int32_t* c12[4];
      for (int64_t i = 0; i < 4; ++i) {
        const int64_t r = m + std::min(i, rows - 1);
        a[i] = act.values.data() + r * act.stride;
        sa[i] = act.scales.data() + r * act.blocks;
        c12[i] = act.sums12.data() + r * act.blocks;
      }
      int64_t out[4];
      switch (rows) {
        case 1:
          fp4_dots<1>(codes, scales, scale_ints, a, sa, c12, K, ahead, out);
          break;
        case 2:
          fp4_dots<2>(codes, scales, scale_ints, a, sa, c12, K, ahead, out);
          break;
        case 3:
          fp4_dots<3>(codes, scales, scale_ints, a, sa, c12, K, ahead, out);
          break;
        default:
          fp4_dots<4>(codes, scales, scale_ints, a, sa, c12, K, ahead, out);
          break;
      }
      for (int64_t i = 0; i < rows; ++i) dots[(m + i) * n + (o - o0)] = out[i];
    }
  }
#else
  (void)w, (void)scale_ints, (void)act, (void)M, (void)o0, (void)o1, (void)dots;
#endif
}

int64_t gemv_tables_bytes(const PackedWeightView& w) {
#ifdef LOWBIT_GEMV_X86
  if ((cpu_has_gemv() && (grouped_nibbles(w) || bit_tables(w))) ||
      (cpu_has_avx2() && (grouped_nibbles(w) || bit_tables(w))))
    return w.out_features * table_bytes_per_row(w);
#endif
  return 0;
}

void gemv_build_tables(const PackedWeightView& w, int64_t o0, int64_t o1, uint8_t* out) {
#ifdef LOWBIT_GEMV_X86
  if (gemv_tables_bytes(w) == 0) return;
  if (cpu_has_gemv()) return build_tables(w, o0, o1, out);
  for (int64_t o = o0; o < o1; ++o) row_tables_avx2(w, o, out + o * table_bytes_per_row(w));
#else
  (void)w, (void)o0, (void)o1, (void)out;
#endif
}

}  // namespace convrot
}  // namespace cpu
}  // namespace lowbit
