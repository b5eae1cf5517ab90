// Shared pieces of the CUDA decode kernels: cache addressing and cp.async wrappers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lowbit/decode.h"
#include "src/core/decode_backend.h"
#include "src/cuda/common.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace decode_detail {

using ptx::cp_async_commit;
using ptx::cp_async_wait;

// Where the rows of one cache live, in bytes (k, v) and elements (scale/shift, tables).
struct CacheArgs {
  const char* k = nullptr;
  const char* v = nullptr;
  // contiguous: strides of (b, j, h); paged: (pool row, h, unused). Bytes.
  int64_t k_st[3] = {0, 0, 0}, v_st[3] = {0, 0, 0};
  const uint32_t* kss = nullptr;  // fp8: scale/shift words
  const uint32_t* vss = nullptr;
  int64_t kss_st[3] = {0, 0, 0}, vss_st[3] = {0, 0, 0};  // elements, same index order
  const int32_t* block_tables = nullptr;                 // null = contiguous
  int64_t bt_st0 = 0, bt_st1 = 0;
  int page_size = 0;
  int64_t pool_rows = 0;
  const int32_t* seq_len = nullptr;
  int64_t seq_st = 0;
  int64_t capacity = 0;
  int row_bytes = 0;  // Dp * element bytes
  int n_groups = 1;
};

inline CacheArgs make_cache_args(const KvCache& c) {
  CacheArgs a;
  const int eb = dtype_bits(c.k.dtype) / 8;
  a.k = static_cast<const char*>(c.k.data);
  a.v = static_cast<const char*>(c.v.data);
  const int rank = c.paged() ? 3 : 4;
  for (int d = 0; d < rank - 1; ++d) {
    a.k_st[d] = c.k.stride[d] * eb;
    a.v_st[d] = c.v.stride[d] * eb;
  }
  if (c.format == KvFormat::fp8) {
    a.kss = static_cast<const uint32_t*>(c.k_scale_shift.data);
    a.vss = static_cast<const uint32_t*>(c.v_scale_shift.data);
    for (int d = 0; d < rank - 1; ++d) {
      a.kss_st[d] = c.k_scale_shift.stride[d];
      a.vss_st[d] = c.v_scale_shift.stride[d];
    }
  }
  if (c.paged()) {
    a.block_tables = static_cast<const int32_t*>(c.block_tables.data);
    a.bt_st0 = c.block_tables.stride[0];
    a.bt_st1 = c.block_tables.stride[1];
    a.page_size = c.page_size;
    a.pool_rows = c.k.shape[0];
  }
  a.seq_len = static_cast<const int32_t*>(c.seq_len.data);
  a.seq_st = c.seq_len.stride[0];
  a.capacity = c.capacity();
  a.row_bytes = static_cast<int>(c.k.shape[c.k.ndim - 1] * eb);
  a.n_groups = c.n_groups;
  return a;
}

// Length of sequence b, clamped to the capacity (a CUDA run cannot report a bad value).
__device__ __forceinline__ int64_t seq_length(const CacheArgs& c, int64_t b) {
  int64_t len = c.seq_len[b * c.seq_st];
  return len < 0 ? 0 : (len > c.capacity ? c.capacity : len);
}

// Pool row of logical key j (paged) or j itself (contiguous); -1 when the page index is out of
// range (the key is then treated as absent).
__device__ __forceinline__ int64_t physical_row(const CacheArgs& c, int64_t b, int64_t j) {
  if (!c.block_tables) return j;
  const int64_t page = c.block_tables[b * c.bt_st0 + (j / c.page_size) * c.bt_st1];
  const int64_t row = page * c.page_size + j % c.page_size;
  return (page < 0 || row >= c.pool_rows) ? -1 : row;
}

// Byte offset of (b, row-or-j, h) in k (which = 0) or v (which = 1).
__device__ __forceinline__ int64_t row_offset(const CacheArgs& c, int which, int64_t b,
                                              int64_t row, int64_t h) {
  const int64_t* st = which ? c.v_st : c.k_st;
  return c.block_tables ? row * st[0] + h * st[1] : b * st[0] + row * st[1] + h * st[2];
}
__device__ __forceinline__ int64_t ss_offset(const CacheArgs& c, int which, int64_t b, int64_t row,
                                             int64_t h) {
  const int64_t* st = which ? c.vss_st : c.kss_st;
  return c.block_tables ? row * st[0] + h * st[1] : b * st[0] + row * st[1] + h * st[2];
}

// f16x2 bit casts and packing shared by the streaming, ring and bulk decode kernels.
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
__device__ __forceinline__ uint32_t pack_f32x2(float lo, float hi) {
  return h2_bits(__floats2half2_rn(lo, hi));
}
__device__ __forceinline__ __half2 lo_h2(uint32_t w) {  // (low half, low half)
  return bits_h2(__byte_perm(w, 0, 0x1010));
}
__device__ __forceinline__ __half2 hi_h2(uint32_t w) {  // (high half, high half)
  return bits_h2(__byte_perm(w, 0, 0x3232));
}

// N consecutive 32-bit words of shared memory at p (aligned to A bytes), widest loads A allows.
template <int N, int A>
__device__ __forceinline__ void lds_words(const char* p, uint32_t* out) {
  constexpr int W = A < 4 * N ? (A < 16 ? A : 16) : (4 * N < 16 ? 4 * N : 16);
#pragma unroll
  for (int i = 0; i < N; i += W / 4) {
    if constexpr (W == 16) {
      const uint4 x = *reinterpret_cast<const uint4*>(p + 4 * i);
      out[i] = x.x;
      out[i + 1] = x.y;
      out[i + 2] = x.z;
      out[i + 3] = x.w;
    } else if constexpr (W == 8) {
      const uint2 x = *reinterpret_cast<const uint2*>(p + 4 * i);
      out[i] = x.x;
      out[i + 1] = x.y;
    } else {
      out[i] = *reinterpret_cast<const uint32_t*>(p + 4 * i);
    }
  }
}
__device__ __forceinline__ uint32_t lds32(const char* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// cp.async of `bytes` (4, 8 or 16); src_bytes 0 zero-fills the destination.
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, int bytes, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if (bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
  } else if (bytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem),
                 "r"(src_bytes));
  }
}

// Arguments of the split kernels (CUDA-core and tensor-core variants).
struct DecodeParams {
  CacheArgs c;
  const void* q = nullptr;
  DType q_dtype = DType::f16;
  int64_t q_st[4] = {0, 0, 0, 0};  // (b, m, h, g), elements
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  int64_t bias_st[5] = {0, 0, 0, 0, 0};
  float* part_o = nullptr;    // (B, H, S, R, D)
  float* part_lse = nullptr;  // (B, H, S, R)
  int H = 0, G = 1, Mq = 1, R = 1, S = 1;
  int64_t split_size = 0;
  float qk_scale = 1.f;  // sm_scale * log2(e)
  bool causal = false;
  int vec = 4;           // cp.async width for K/V rows
};

// Split kernel with a per-warp cp.async ring (decode_ring.cu): the streaming plan's kernel where
// the bulk kernel does not apply (int4 / fp8 / f16, D 64 / 128).
bool decode_ring_supported(KvFormat format, int D);
// Copy width (16, 8 or 4 bytes): the widest every row's code words allow, halved until it divides
// a row.
int ring_vector_bytes(const KvCache& c);
void launch_decode_ring(const DecodeParams& p, KvFormat format, int D, int vec, int64_t B,
                        cudaStream_t stream);

// Split kernel over contiguous multi-head key tiles (decode_bulk.cu): the streaming plan's default
// where decode_bulk_supported(cache) (int4 / fp8 / f16, D 64 / 128, adjacent heads, 16-byte aligned
// bases and strides; fp8 with 4 | Hkv). decode_bulk_heads: heads per CTA (0 = not supported).
bool decode_bulk_supported(const KvCache& cache);
int decode_bulk_heads(const KvCache& cache);
// fold: DecodePlan::fold_scales (0, 1; where decode_bulk_folds(cache), elsewhere ignored).
bool decode_bulk_folds(const KvCache& cache);
// The plan's bulk knobs: fold_scales, bulk_issue (0 shared, 1 solo, 2 shared with 4 issuing
// warps), bulk_stages (0 automatic), bulk_probe, bulk_tma, bulk_diet, bulk_flat,
// launch_pdl (the kernel waits for the previous one before its first global access).
void launch_decode_bulk(const DecodeParams& p, const KvCache& cache, const DecodePlan& plan,
                        cudaStream_t stream);

// Programmatic dependent launch (DecodePlan::launch_pdl): the decode kernels call griddep_wait
// before any global access and griddep_launch_dependents to let the split merge launch early.
using ptx::griddep_launch_dependents;
using ptx::griddep_wait;

// Widest access (16, 8 or 4 bytes) that every row start of both caches allows.
inline int row_vector_bytes(const KvCache& c) {
  const CacheArgs a = make_cache_args(c);
  const int rank = c.paged() ? 3 : 4;
  for (int vec : {16, 8, 4}) {
    bool ok = a.row_bytes % vec == 0 && reinterpret_cast<uintptr_t>(a.k) % vec == 0 &&
              reinterpret_cast<uintptr_t>(a.v) % vec == 0;
    for (int d = 0; d < rank - 1; ++d) ok = ok && a.k_st[d] % vec == 0 && a.v_st[d] % vec == 0;
    if (ok) return vec;
  }
  return 4;
}

}  // namespace decode_detail
}  // namespace cuda
}  // namespace lowbit
