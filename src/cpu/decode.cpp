// CPU backend of the decode family: the oracle. Plain loops in fp32 (the order of every sum is
// the obvious one), threaded over independent (batch, head, split) chunks.
#include "lowbit/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/core/convert_elem.h"
#include "src/core/decode_backend.h"
#include "src/core/indexing.h"
#include "src/core/parallel.h"
#include "src/cpu/cpu_clones.h"
#include "src/cpu/rows.h"
#include "src/cpu/x86_intrinsics.h"

namespace lowbit {
namespace cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kDotKeys = 64;  // keys per block of the score loop

// Element offset of (b, logical key j, head h) in a cache tensor of rank 4 (contiguous) or 3
// (paged pool); for scale/shift tensors (one rank less, no D) the same with `t` of that rank.
// Returns -1 when a page index is out of range (validated before on the CPU, so never here).
struct KeyAddress {
  const KvCache& c;
  int64_t row(int64_t b, int64_t j) const {  // physical row for paged, j for contiguous
    if (!c.paged()) return j;
    const int32_t* bt = c.block_tables.ptr<int32_t>();
    const int64_t page = bt[b * c.block_tables.stride[0] + (j / c.page_size) * c.block_tables.stride[1]];
    return page * c.page_size + j % c.page_size;
  }
  int64_t offset(const TensorView& t, int64_t b, int64_t j, int64_t h) const {
    if (!c.paged()) return b * t.stride[0] + j * t.stride[1] + h * t.stride[2];
    return row(b, j) * t.stride[0] + h * t.stride[1];
  }
};

// q . k over D channels (a multiple of 8) in 8 lanes, lane l taking channels d = l (mod 8) by
// fused multiply-adds in channel order, then the lanes added as ((0 + 4) + (2 + 6)) + ((1 + 5) +
// (3 + 7)): the AVX2 + FMA form and the scalar loop give the same bits.
#ifdef LOWBIT_AVX2
__attribute__((target("avx2,fma"))) float dot8_avx2(const float* q, const float* k, int D) {
  __m256 acc = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 t = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif
float dot8_scalar(const float* q, const float* k, int D) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int d = 0; d < D; d += 8)
    for (int l = 0; l < 8; ++l) lane[l] = std::fma(q[d + l], k[d + l], lane[l]);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}
// dot8's lanes for two keys at once in 512-bit registers (key j in lanes 0-7, key j + 1 in 8-15,
// one register per row, up to 4 rows sharing each pair of K loads), then the same tree of adds
// per half: lane l + lane l + 4, then (0 + 4) + (2 + 6) and (1 + 5) + (3 + 7), then their sum,
// each add with the lower lane as its first operand as in dot8_scalar.
#ifdef LOWBIT_AVX512
template <int NR>
LOWBIT_AVX512 void key_pair_dots(const float* q, int D, const float* k0, const float* k1,
                                 float (&out)[4][2]) {
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    // (AVX-512 F forms of insertf32x8 / broadcast_f32x8: the 256-bit halves moved as doubles)
    const __m512 kk = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(k0 + d))),
                           _mm256_castps_pd(_mm256_loadu_ps(k1 + d)), 1));
    for (int r = 0; r < NR; ++r) {
      const __m512 qq = _mm512_castpd_ps(
          _mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(q + r * D + d))));
      acc[r] = _mm512_fmadd_ps(qq, kk, acc[r]);
    }
  }
  const __m512i swap4 = _mm512_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  const __m512i swap2 = _mm512_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  const __m512i swap1 = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  for (int r = 0; r < NR; ++r) {
    const __m512 t = _mm512_add_ps(acc[r], _mm512_permutexvar_ps(swap4, acc[r]));
    const __m512 u = _mm512_add_ps(t, _mm512_permutexvar_ps(swap2, t));
    const __m512 v = _mm512_add_ps(u, _mm512_permutexvar_ps(swap1, u));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    out[r][0] = lanes[0];
    out[r][1] = lanes[8];
  }
}
LOWBIT_AVX512 void key_dots_avx512(const float* q, int R, const float* k, int64_t n, int D,
                                   float* dots) {
  for (int64_t j = 0; j < n; j += 2) {
    const float* k0 = k + j * D;
    const float* k1 = j + 1 < n ? k0 + D : k0;  // (a last odd key pairs with itself)
    for (int r0 = 0; r0 < R; r0 += 4) {
      float out[4][2];
      const float* qr = q + static_cast<int64_t>(r0) * D;
      switch (std::min(4, R - r0)) {
        case 1:
          key_pair_dots<1>(qr, D, k0, k1, out);
          break;
        case 2:
          key_pair_dots<2>(qr, D, k0, k1, out);
          break;
        case 3:
          key_pair_dots<3>(qr, D, k0, k1, out);
          break;
        default:
          key_pair_dots<4>(qr, D, k0, k1, out);
          break;
      }
      for (int r = 0; r < std::min(4, R - r0); ++r) {
        dots[(r0 + r) * n + j] = out[r][0];
        if (j + 1 < n) dots[(r0 + r) * n + j + 1] = out[r][1];
      }
    }
  }
}
#endif
// dots[r * n + j] = q_r . k_j for the R rows of q (R x D) and the n rows of k (n x D), D a
// multiple of 8.
void key_dots(const float* q, int R, const float* k, int64_t n, int D, float* dots) {
#ifdef LOWBIT_AVX512
  if (rows::avx512_on()) return key_dots_avx512(q, R, k, n, D, dots);
#endif
#ifdef LOWBIT_AVX2
  if (rows::avx2_fma_on()) {
    for (int64_t j = 0; j < n; ++j)
      for (int r = 0; r < R; ++r) dots[r * n + j] = dot8_avx2(q + r * D, k + j * D, D);
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j)
    for (int r = 0; r < R; ++r) dots[r * n + j] = dot8_scalar(q + r * D, k + j * D, D);
}

// o[d] = o[d] + p[i] * v[key[i]][d] for i < n in order, d < D (vf rows of D): the product and
// the sum rounded one after the other, key after key (rows::add_scaled's bits for each key), o
// held in 512-bit registers across the keys instead of loaded and stored per key. D a multiple of
// 16 (the plans' head dims are 64, 128 and 256).
#ifdef LOWBIT_AVX512
template <int NV>
LOWBIT_AVX512 void pv_keys_block(float* o, const float* p, const int* key, int n, const float* vf,
                                 int D, int d0) {
  __m512 acc[NV];
  for (int c = 0; c < NV; ++c) acc[c] = _mm512_loadu_ps(o + d0 + 16 * c);
  for (int i = 0; i < n; ++i) {
    const __m512 pp = _mm512_set1_ps(p[i]);
    const float* v = vf + static_cast<int64_t>(key[i]) * D + d0;
    for (int c = 0; c < NV; ++c)
      acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(pp, _mm512_loadu_ps(v + 16 * c)));
  }
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + d0 + 16 * c, acc[c]);
}
LOWBIT_AVX512 void pv_keys_avx512(float* o, const float* p, const int* key, int n, const float* vf,
                                  int D) {
  int d0 = 0;
  for (; D - d0 >= 128; d0 += 128) pv_keys_block<8>(o, p, key, n, vf, D, d0);
  for (; D - d0 >= 64; d0 += 64) pv_keys_block<4>(o, p, key, n, vf, D, d0);
  for (; D - d0 >= 16; d0 += 16) pv_keys_block<1>(o, p, key, n, vf, D, d0);
}
#endif
void pv_keys(float* o, const float* p, const int* key, int n, const float* vf, int D) {
#ifdef LOWBIT_AVX512
  if (rows::avx512_on() && D % 16 == 0) return pv_keys_avx512(o, p, key, n, vf, D);
#endif
  for (int i = 0; i < n; ++i) rows::add_scaled(o, p[i], vf + static_cast<int64_t>(key[i]) * D, D);
}

// out[d] = int4 value of code d (eight 4-bit codes per word, low nibble first), d0 <= d < d0 + n.
// AVX2 where d0 and n are multiples of 8: a word's 8 codes by one variable shift, then the
// product and the sum rounded one after the other, as kv::int4_value_at.
#ifdef LOWBIT_AVX2
LOWBIT_AVX2 void int4_group_avx2(const uint32_t* words, int d0, int n, float scale, float shift,
                                 float* out) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i low4 = _mm256_set1_epi32(0xf);
  const __m256 vs = _mm256_set1_ps(scale), vh = _mm256_set1_ps(shift);
  for (int d = d0; d < d0 + n; d += 8) {
    const __m256i codes = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int32_t>(words[d / 8])), shifts), low4);
    _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(codes), vs), vh));
  }
}
// The same 16 codes at a time (two words, each by one variable shift): where d0 and n are
// multiples of 16.
LOWBIT_AVX512 void int4_group_avx512(const uint32_t* words, int d0, int n, float scale, float shift,
                                     float* out) {
  const __m512i shifts =
      _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  const __m512i low4 = _mm512_set1_epi32(0xf);
  const __m512 vs = _mm512_set1_ps(scale), vh = _mm512_set1_ps(shift);
  for (int d = d0; d < d0 + n; d += 16) {
    const __m512i w =
        _mm512_inserti64x4(_mm512_set1_epi32(static_cast<int32_t>(words[d / 8])),
                           _mm256_set1_epi32(static_cast<int32_t>(words[d / 8 + 1])), 1);
    const __m512i codes = _mm512_and_si512(_mm512_srlv_epi32(w, shifts), low4);
    _mm512_storeu_ps(out + d, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(codes), vs), vh));
  }
}
#endif
void int4_group(const uint32_t* words, int d0, int n, float scale, float shift, float* out) {
#ifdef LOWBIT_AVX2
  if (rows::avx512_on() && d0 % 16 == 0 && n % 16 == 0)
    return int4_group_avx512(words, d0, n, scale, shift, out);
  if (rows::avx2_on() && d0 % 8 == 0 && n % 8 == 0)
    return int4_group_avx2(words, d0, n, scale, shift, out);
#endif
  for (int d = d0; d < d0 + n; ++d)
    out[d] = kv::int4_value_at((words[d / 8] >> (4 * (d % 8))) & 0xfu, scale, shift);
}

// out[i] = the f16 value h[i] as fp32, i < n (a row's few coefficient halves: F16C one at a
// time where the CPU has it, a call into the vector row converter costs more than the values).
#ifdef LOWBIT_AVX2
__attribute__((target("f16c"))) void halves_f16c(const uint16_t* h, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = _cvtsh_ss(h[i]);
}
#endif
void halves_to_f32(const uint16_t* h, int n, float* out) {
#ifdef LOWBIT_AVX2
  static const bool f16c = has_f16c();
  if (f16c && rows::avx2_on()) return halves_f16c(h, n, out);
#endif
  for (int i = 0; i < n; ++i) out[i] = dt::f16_to_f32(h[i]);
}

// out[d] = e4m3 value of byte d * scale + shift, d < D (kv::fp8_value_at's arithmetic: the
// product and the sum rounded one after the other). AVX2: 8 table entries by one gather.
#ifdef LOWBIT_AVX2
LOWBIT_AVX2 void fp8_row_avx2(const uint8_t* bytes, int D, float scale, float shift, float* out) {
  const float* e4m3 = rows::e4m3_table();
  const __m256 vs = _mm256_set1_ps(scale), vh = _mm256_set1_ps(shift);
  for (int d = 0; d < D; d += 8) {
    const __m256i idx =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + d)));
    const __m256 v = _mm256_i32gather_ps(e4m3, idx, 4);
    _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_mul_ps(v, vs), vh));
  }
}
// 16 bytes at a time without the table: the code's bits moved into an f16 (sign to bit 15, the
// exponent and mantissa to bits 7-14: the f16 of the code's value times 2^-8, subnormals
// included), widened and times 256 (exact); the NaN codes (0x7f, 0xff) as dt::e4m3_to_f32 gives
// them. Where D is a multiple of 16.
LOWBIT_AVX512 void fp8_row_avx512(const uint8_t* bytes, int D, float scale, float shift,
                                  float* out) {
  const __m512 vs = _mm512_set1_ps(scale), vh = _mm512_set1_ps(shift);
  const __m256i low7 = _mm256_set1_epi16(0x7f), top = _mm256_set1_epi16(0x80);
  for (int d = 0; d < D; d += 16) {
    const __m256i b =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + d)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, low7), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(b, top), 8));
    __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.f));
    const __m512i b32 = _mm512_cvtepu16_epi32(b);
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(b32, _mm512_set1_epi32(0x7f)),
                                                  _mm512_set1_epi32(0x7f));
    const __m512i nan_bits =
        _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(b32, _mm512_set1_epi32(0x80)), 24),
                        _mm512_set1_epi32(0x7fc00000));
    v = _mm512_mask_blend_ps(nan, v, _mm512_castsi512_ps(nan_bits));
    _mm512_storeu_ps(out + d, _mm512_add_ps(_mm512_mul_ps(v, vs), vh));
  }
}
#endif
void fp8_row(const uint8_t* bytes, int D, float scale, float shift, float* out) {
#ifdef LOWBIT_AVX2
  if (rows::avx512_on() && D % 16 == 0) return fp8_row_avx512(bytes, D, scale, shift, out);
  if (rows::avx2_on() && D % 8 == 0) return fp8_row_avx2(bytes, D, scale, shift, out);
#endif
  const float* e4m3 = rows::e4m3_table();
  for (int d = 0; d < D; ++d) out[d] = e4m3[bytes[d]] * scale + shift;
}

// Asks for the cache lines of one cache row (`bytes` from element offset `off` of t).
constexpr int64_t kPrefetchKeys = 32;
inline void prefetch_row(const TensorView& t, int64_t off, int64_t bytes) {
  const char* p = static_cast<const char*>(t.data) + dtype_storage_bytes(t.dtype, off);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
  __builtin_prefetch(p + bytes - 1);
}

// Dequantizes one row of a head into out (D).
void load_row(const KvCache& c, const TensorView& t, const TensorView& ss, const KeyAddress& a,
              int64_t b, int64_t j, int64_t h, int D, float* out) {
  const int64_t off = a.offset(t, b, j, h);
  switch (c.format) {
    case KvFormat::f16: {
      rows::f16_to_f32(t.ptr<uint16_t>() + off, D, out);
      break;
    }
    case KvFormat::bf16: {
      const uint16_t* p = t.ptr<uint16_t>() + off;
      for (int d = 0; d < D; ++d) out[d] = dt::bf16_to_f32(p[d]);
      break;
    }
    case KvFormat::int4: {  // each group's scale and shift converted once
      const uint32_t* w = t.ptr<uint32_t>() + off;
      const int ng = c.n_groups, per = D / ng;
      // the coefficient words as f16 halves: scale (low) then shift (high) of each group
      float coef[16];
      uint16_t halves[16];  // (copied: a uint32_t read through a uint16_t pointer is not allowed)
      std::memcpy(halves, w, sizeof(uint16_t) * 2 * static_cast<size_t>(ng));
      halves_to_f32(halves, 2 * ng, coef);
      for (int g = 0; g < ng; ++g)
        int4_group(w + ng, g * per, per, coef[2 * g], coef[2 * g + 1], out);
      break;
    }
    case KvFormat::fp8: {  // the row's scale and shift converted once
      const uint32_t* w = t.ptr<uint32_t>() + off;
      const uint32_t s = ss.ptr<uint32_t>()[c.paged() ? a.row(b, j) * ss.stride[0] + h * ss.stride[1]
                                                      : b * ss.stride[0] + j * ss.stride[1] +
                                                            h * ss.stride[2]];
      float coef[2];  // scale (low half), shift (high half)
      uint16_t halves[2];
      std::memcpy(halves, &s, sizeof(halves));
      halves_to_f32(halves, 2, coef);
      fp8_row(reinterpret_cast<const uint8_t*>(w), D, coef[0], coef[1], out);
      break;
    }
  }
}

// Stores one quantized row.
void store_row(const KvCache& c, const TensorView& t, const TensorView& ss, const KeyAddress& a,
               int64_t b, int64_t j, int64_t h, int D, const float* x) {
  const int64_t off = a.offset(t, b, j, h);
  switch (c.format) {
    case KvFormat::f16: {
      uint16_t* p = t.ptr<uint16_t>() + off;
      for (int d = 0; d < D; ++d) p[d] = dt::f32_to_f16(x[d]);
      break;
    }
    case KvFormat::bf16: {
      uint16_t* p = t.ptr<uint16_t>() + off;
      for (int d = 0; d < D; ++d) p[d] = dt::f32_to_bf16(x[d]);
      break;
    }
    case KvFormat::int4:
      kv::quantize_int4_row(x, D, c.n_groups, t.ptr<uint32_t>() + off);
      break;
    case KvFormat::fp8: {
      uint32_t* s = ss.ptr<uint32_t>() + (c.paged() ? a.row(b, j) * ss.stride[0] + h * ss.stride[1]
                                                    : b * ss.stride[0] + j * ss.stride[1] +
                                                          h * ss.stride[2]);
      kv::quantize_fp8_row(x, D, t.ptr<uint32_t>() + off, s);
      break;
    }
  }
}

// Offset of the `row`-th (row-major) index of the leading dims of a (..., D) tensor.
int64_t lead_offset(const TensorView& t, int64_t row, int lead_dims) {
  int64_t off = 0;
  for (int d = lead_dims - 1; d >= 0; --d) {
    off += (row % t.shape[d]) * t.stride[d];
    row /= t.shape[d];
  }
  return off;
}

}  // namespace

void kv_append(const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const TensorView& positions, Context& ctx) {
  const int64_t B = k_new.shape[0], n = k_new.shape[1], H = k_new.shape[2];
  const int D = static_cast<int>(k_new.shape[3]);
  const KeyAddress addr{cache};
  parallel_for(B * n * H, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> row(D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i % H, t = (i / H) % n, b = i / (H * n);
      const int64_t j = positions.ptr<int32_t>()[b * positions.stride[0]] + t;
      for (int which = 0; which < 2; ++which) {
        const TensorView& src = which ? v_new : k_new;
        const int64_t base = b * src.stride[0] + t * src.stride[1] + h * src.stride[2];
        for (int d = 0; d < D; ++d) row[d] = load_f32(src.data, base + d, src.dtype);
        store_row(cache, which ? cache.v : cache.k, which ? cache.v_scale_shift : cache.k_scale_shift,
                  addr, b, j, h, D, row.data());
      }
    }
  });
}

void decode_attention(const TensorView& q, const KvCache& cache, const DecodePlan& plan,
                      void* workspace, TensorView out, const TensorView* lse_out,
                      const TensorView* bias, float sm_scale, bool causal, Context& ctx) {
  const int64_t B = plan.batch, H = plan.kv_heads;
  const int Mq = plan.mq, G = plan.group, D = plan.head_dim, S = plan.n_splits;
  const int R = Mq * G;
  float* part_o = static_cast<float*>(workspace);
  float* part_lse = part_o + decode_partial_out_elems(plan);
  const KeyAddress addr{cache};
  const int32_t* seq_len = cache.seq_len.ptr<int32_t>();

  const int64_t row_bytes = dtype_storage_bytes(cache.k.dtype, cache.k.shape[cache.k.ndim - 1]);
  // Pass 1: each (b, h, split) -> (R, D) partial outputs and (R) LSEs. The split's keys go by
  // blocks of kDotKeys (dequantized K and V of a block stay in cache): every row's q . k for the
  // block, then each row's running maximum, sum and output rescaled
  // by exp(old max - new max) where the block raises the maximum (online softmax).
  parallel_for(B * H * S, 1, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> kf(static_cast<size_t>(kDotKeys) * D), vf(kf.size()),
        qf(static_cast<size_t>(R) * D), dots(static_cast<size_t>(R) * kDotKeys), scores(kDotKeys),
        row_max(R), row_sum(R), probs(kDotKeys);
    std::vector<int> keys(kDotKeys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task % S, h = (task / S) % H, b = task / (S * H);
      const int64_t len = seq_len[b * cache.seq_len.stride[0]];
      const int64_t lo = std::min<int64_t>(s * plan.split_size, len);
      const int64_t hi = s == S - 1 ? len : std::min<int64_t>(lo + plan.split_size, len);
      for (int r = 0; r < R; ++r) {
        const int m = r / G, g = r % G;
        const int64_t qoff = b * q.stride[0] + m * q.stride[1] + h * q.stride[2] + g * q.stride[3];
        for (int d = 0; d < D; ++d) qf[r * D + d] = load_f32(q.data, qoff + d, q.dtype);
      }
      float* o_base = part_o + (((b * H + h) * S + s) * R) * D;
      float* l_base = part_lse + ((b * H + h) * S + s) * R;
      std::fill(o_base, o_base + static_cast<int64_t>(R) * D, 0.f);
      std::fill(row_max.begin(), row_max.end(), kNegInf);
      std::fill(row_sum.begin(), row_sum.end(), 0.f);
      for (int64_t j0 = lo; j0 < hi; j0 += kDotKeys) {
        const int64_t nb = std::min<int64_t>(kDotKeys, hi - j0);
        for (int64_t j = 0; j < nb; ++j) {
          // (the rows kPrefetchKeys ahead asked for now: a head's rows are strided by the other
          // heads', which the hardware prefetcher follows poorly)
          if (j0 + j + kPrefetchKeys < hi) {
            prefetch_row(cache.k, addr.offset(cache.k, b, j0 + j + kPrefetchKeys, h), row_bytes);
            prefetch_row(cache.v, addr.offset(cache.v, b, j0 + j + kPrefetchKeys, h), row_bytes);
          }
          load_row(cache, cache.k, cache.k_scale_shift, addr, b, j0 + j, h, D, &kf[j * D]);
          load_row(cache, cache.v, cache.v_scale_shift, addr, b, j0 + j, h, D, &vf[j * D]);
        }
        key_dots(qf.data(), R, kf.data(), nb, D, dots.data());
        for (int m = 0; m < Mq; ++m) {
          // Keys visible to this query row: j < len, and j <= len - Mq + m when causal.
          const int64_t last = causal ? len - Mq + m : len - 1;
          for (int g = 0; g < G; ++g) {
            const int r = m * G + g;
            float mx = kNegInf;
            for (int64_t j = 0; j < nb; ++j) {
              float sc = kNegInf;
              if (j0 + j <= last) {
                sc = dots[r * nb + j] * sm_scale;
                if (bias) {
                  const int64_t boff = b * bias->stride[0] + h * bias->stride[1] +
                                       g * bias->stride[2] + m * bias->stride[3] +
                                       (j0 + j) * bias->stride[4];
                  sc += load_f32(bias->data, boff, bias->dtype);
                }
              }
              scores[j] = sc;
              mx = std::max(mx, sc);
            }
            if (mx == kNegInf) continue;  // no visible key in this block
            float* o = o_base + static_cast<int64_t>(r) * D;
            const float m_new = std::max(row_max[r], mx);
            if (row_max[r] != kNegInf && m_new != row_max[r]) {
              const float c = std::exp(row_max[r] - m_new);
              for (int d = 0; d < D; ++d) o[d] *= c;
              row_sum[r] *= c;
            }
            row_max[r] = m_new;
            int live = 0;  // the block's visible keys and their weights, then P·V over them
            for (int64_t j = 0; j < nb; ++j) {
              if (scores[j] == kNegInf) continue;
              const float p = std::exp(scores[j] - m_new);
              row_sum[r] += p;
              probs[live] = p;
              keys[live++] = static_cast<int>(j);
            }
            pv_keys(o, probs.data(), keys.data(), live, vf.data(), D);
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        float* o = o_base + static_cast<int64_t>(r) * D;
        if (row_max[r] == kNegInf) {  // no visible key (or every score -inf): 0 and -inf
          l_base[r] = kNegInf;
          continue;
        }
        for (int d = 0; d < D; ++d) o[d] /= row_sum[r];
        l_base[r] = row_max[r] + std::log(row_sum[r]);
      }
    }
  });

  // Pass 2: merge the splits of every row.
  parallel_for(B * H * R, 8, ctx, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int r = static_cast<int>(i % R);
      const int64_t h = (i / R) % H, b = i / (R * H);
      const int m = r / G, g = r % G;
      const float* lse = part_lse + (b * H + h) * S * R + r;
      float mx = kNegInf;
      for (int s = 0; s < S; ++s) mx = std::max(mx, lse[static_cast<int64_t>(s) * R]);
      const int64_t ooff = b * out.stride[0] + m * out.stride[1] + h * out.stride[2] + g * out.stride[3];
      float total = 0.f;
      std::vector<float> acc(D, 0.f);
      if (mx != kNegInf) {
        for (int s = 0; s < S; ++s) {
          const float w = std::exp(lse[static_cast<int64_t>(s) * R] - mx);
          total += w;
          const float* po = part_o + (((b * H + h) * S + s) * R + r) * D;
          for (int d = 0; d < D; ++d) acc[d] += w * po[d];
        }
        for (int d = 0; d < D; ++d) acc[d] /= total;
      }
      for (int d = 0; d < D; ++d) store_f32(out.data, ooff + d, out.dtype, acc[d]);
      if (lse_out) {
        const int64_t loff = b * lse_out->stride[0] + m * lse_out->stride[1] +
                             h * lse_out->stride[2] + g * lse_out->stride[3];
        lse_out->ptr<float>()[loff] = mx == kNegInf ? kNegInf : mx + std::log(total);
      }
    }
  });
}

void merge_attention(const MergeArgs& a, Context& ctx) {
  const int n = static_cast<int>(a.outs.size());
  const int D = a.head_dim;
  const int lead = a.out.ndim - 1;
  parallel_for(a.rows, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> lse(n), acc(D);
    for (int64_t row = begin; row < end; ++row) {
      float mx = kNegInf;
      for (int i = 0; i < n; ++i) {
        lse[i] = a.lses[i].ptr<float>()[lead_offset(a.lses[i], row, lead)];
        mx = std::max(mx, lse[i]);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float total = 0.f;
      if (mx != kNegInf) {
        for (int i = 0; i < n; ++i) {
          const float w = std::exp(lse[i] - mx);
          total += w;
          const int64_t off = lead_offset(a.outs[i], row, lead);
          for (int d = 0; d < D; ++d) acc[d] += w * load_f32(a.outs[i].data, off + d, a.outs[i].dtype);
        }
        for (int d = 0; d < D; ++d) acc[d] /= total;
      }
      const int64_t ooff = lead_offset(a.out, row, lead);
      for (int d = 0; d < D; ++d) store_f32(a.out.data, ooff + d, a.out.dtype, acc[d]);
      if (a.lse.data)
        a.lse.ptr<float>()[lead_offset(a.lse, row, lead)] =
            mx == kNegInf ? kNegInf : mx + std::log(total);
    }
  });
}

void merge_attention_backward(const MergeBackwardArgs& a, Context& ctx) {
  const MergeArgs& f = a.fwd;
  const int n = static_cast<int>(f.outs.size());
  const int D = f.head_dim;
  const int lead = f.out.ndim - 1;
  parallel_for(f.rows, 16, ctx, [&](int64_t begin, int64_t end) {
    std::vector<float> dout(D), o(D);
    for (int64_t row = begin; row < end; ++row) {
      const float lse = f.lse.ptr<float>()[lead_offset(f.lse, row, lead)];
      const float dlse = a.grad_lse.data ? a.grad_lse.ptr<float>()[lead_offset(a.grad_lse, row, lead)] : 0.f;
      const int64_t goff = lead_offset(a.grad_out, row, lead), ooff = lead_offset(f.out, row, lead);
      for (int d = 0; d < D; ++d) {
        dout[d] = load_f32(a.grad_out.data, goff + d, a.grad_out.dtype);
        o[d] = load_f32(f.out.data, ooff + d, f.out.dtype);
      }
      for (int i = 0; i < n; ++i) {
        const float li = f.lses[i].ptr<float>()[lead_offset(f.lses[i], row, lead)];
        const float w = (lse == kNegInf || li == kNegInf) ? 0.f : std::exp(li - lse);
        const int64_t pi = lead_offset(f.outs[i], row, lead);
        const int64_t gi = lead_offset(a.grad_outs[i], row, lead);
        float dot = 0.f;
        for (int d = 0; d < D; ++d) {
          store_f32(a.grad_outs[i].data, gi + d, a.grad_outs[i].dtype, w * dout[d]);
          dot += (load_f32(f.outs[i].data, pi + d, f.outs[i].dtype) - o[d]) * dout[d];
        }
        a.grad_lses[i].ptr<float>()[lead_offset(a.grad_lses[i], row, lead)] = w * (dlse + dot);
      }
    }
  });
}

}  // namespace cpu
}  // namespace lowbit
