// CUDA kv_append (the row codec of decode.h, bit-identical to the CPU) and the public merge of
// partial attention results (+ backward).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "src/core/check.h"
#include "src/core/convert_elem.h"
#include "src/core/indexing.h"
#include "src/cuda/decode_common.cuh"

namespace lowbit {
namespace cuda {

int decode_multiprocessors() { return multiprocessor_count(); }
int decode_bulk_heads_of(const KvCache& cache) { return decode_detail::decode_bulk_heads(cache); }

namespace {

using namespace decode_detail;

constexpr float kLog2e = 1.4426950408889634f;

// ---- kv_append: one thread per (token, head, k|v) row ---------------------------------------

struct AppendParams {
  CacheArgs c;
  char* k = nullptr;
  char* v = nullptr;
  uint32_t* kss = nullptr;
  uint32_t* vss = nullptr;
  KvFormat format = KvFormat::f16;
  const void* src[2] = {nullptr, nullptr};  // k_new, v_new (B, n, H, D)
  DType src_dtype = DType::f32;
  int64_t src_st[2][3] = {{0, 0, 0}, {0, 0, 0}};
  const int32_t* positions = nullptr;
  int64_t pos_st = 0;
  int64_t B = 0, n = 0, H = 0;
  int D = 0;
};

__global__ void kv_append_kernel(const AppendParams p) {
  const int64_t total = p.B * p.n * p.H * 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int which = static_cast<int>(i & 1);
    const int64_t rest = i >> 1;
    const int64_t h = rest % p.H, t = (rest / p.H) % p.n, b = rest / (p.H * p.n);
    const int64_t pos = p.positions[b * p.pos_st];
    const int64_t j = pos + t;
    if (pos < 0 || j >= p.c.capacity) continue;  // outside the cache: skipped, never written
    const int64_t row = physical_row(p.c, b, j);
    if (row < 0) continue;
    float x[256];
    const int64_t soff = b * p.src_st[which][0] + t * p.src_st[which][1] + h * p.src_st[which][2];
    for (int d = 0; d < p.D; ++d) x[d] = load_f32(p.src[which], soff + d, p.src_dtype);
    char* dst = (which ? p.v : p.k) + row_offset(p.c, which, b, row, h);
    switch (p.format) {
      case KvFormat::f16:
        for (int d = 0; d < p.D; ++d) reinterpret_cast<uint16_t*>(dst)[d] = dt::f32_to_f16(x[d]);
        break;
      case KvFormat::bf16:
        for (int d = 0; d < p.D; ++d) reinterpret_cast<uint16_t*>(dst)[d] = dt::f32_to_bf16(x[d]);
        break;
      case KvFormat::int4:
        kv::quantize_int4_row(x, p.D, p.c.n_groups, reinterpret_cast<uint32_t*>(dst));
        break;
      case KvFormat::fp8: {
        uint32_t* ss = (which ? p.vss : p.kss) + ss_offset(p.c, which, b, row, h);
        kv::quantize_fp8_row(x, p.D, reinterpret_cast<uint32_t*>(dst), ss);
        break;
      }
    }
  }
}

// ---- merge --------------------------------------------------------------------------------------

constexpr int kMaxListParts = 16;

// Partial results: either up to 16 parts with their own layouts, or `n` parts a fixed distance
// apart sharing one layout (the stacked form).
struct Parts {
  int n = 0;
  bool uniform = false;
  const char* out[kMaxListParts] = {};
  const float* lse[kMaxListParts] = {};
  StridedIndex out_idx[kMaxListParts] = {};  // leading dims only
  StridedIndex lse_idx[kMaxListParts] = {};
  int64_t out_step = 0, lse_step = 0;         // uniform: bytes / elements between parts
  DType dtype = DType::f32;
};

__device__ __forceinline__ int64_t lead_off(const StridedIndex& s, int64_t row) {
  int64_t off = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    off += (row % s.shape[d]) * s.stride[d];
    row /= s.shape[d];
  }
  return off;
}

__device__ __forceinline__ const char* part_out(const Parts& p, int i) {
  return p.uniform ? p.out[0] + i * p.out_step : p.out[i];
}
__device__ __forceinline__ const float* part_lse(const Parts& p, int i) {
  return p.uniform ? p.lse[0] + i * p.lse_step : p.lse[i];
}
__device__ __forceinline__ const StridedIndex& part_oidx(const Parts& p, int i) {
  return p.out_idx[p.uniform ? 0 : i];
}
__device__ __forceinline__ const StridedIndex& part_lidx(const Parts& p, int i) {
  return p.lse_idx[p.uniform ? 0 : i];
}

// One CTA per row.
__global__ void merge_kernel(const Parts parts, int D, void* out, DType out_dtype, StridedIndex oi,
                             float* lse_out, StridedIndex li) {
  const int64_t row = blockIdx.x;
  float mx = -INFINITY;
  for (int i = 0; i < parts.n; ++i)
    mx = fmaxf(mx, part_lse(parts, i)[lead_off(part_lidx(parts, i), row)]);
  float total = 0.f;
  if (mx != -INFINITY)
    for (int i = 0; i < parts.n; ++i)
      total += exp2f((part_lse(parts, i)[lead_off(part_lidx(parts, i), row)] - mx) * kLog2e);
  const int64_t ooff = lead_off(oi, row);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    if (mx != -INFINITY) {
      for (int i = 0; i < parts.n; ++i) {
        const float w = exp2f((part_lse(parts, i)[lead_off(part_lidx(parts, i), row)] - mx) * kLog2e);
        acc = fmaf(w, load_f32(part_out(parts, i), lead_off(part_oidx(parts, i), row) + d, parts.dtype), acc);
      }
      acc /= total;
    }
    store_f32(out, ooff + d, out_dtype, acc);
  }
  if (lse_out && threadIdx.x == 0) lse_out[lead_off(li, row)] = mx == -INFINITY ? -INFINITY : mx + logf(total);
}

struct GradParts {
  void* gout[kMaxListParts] = {};
  float* glse[kMaxListParts] = {};
  StridedIndex gout_idx[kMaxListParts] = {};
  StridedIndex glse_idx[kMaxListParts] = {};
  DType gout_dtype = DType::f32;
};

// One CTA per row; blockDim.x a power of two >= 32.
__global__ void merge_backward_kernel(const Parts parts, const GradParts grads, int D,
                                      const void* out, DType out_dtype, StridedIndex oi,
                                      const float* lse, StridedIndex li, const void* gout,
                                      DType gout_dtype, StridedIndex goi, const float* glse,
                                      StridedIndex gli) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const float L = lse[lead_off(li, row)];
  const float dl = glse ? glse[lead_off(gli, row)] : 0.f;
  const int64_t ooff = lead_off(oi, row), goff = lead_off(goi, row);
  for (int i = 0; i < parts.n; ++i) {
    const float li_ = part_lse(parts, i)[lead_off(part_lidx(parts, i), row)];
    const float w = (L == -INFINITY || li_ == -INFINITY) ? 0.f : exp2f((li_ - L) * kLog2e);
    const int64_t pofs = lead_off(part_oidx(parts, i), row);
    const int64_t gofs = lead_off(grads.gout_idx[i], row);
    float dot = 0.f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      const float g = load_f32(gout, goff + d, gout_dtype);
      store_f32(grads.gout[i], gofs + d, grads.gout_dtype, w * g);
      dot += (load_f32(part_out(parts, i), pofs + d, parts.dtype) - load_f32(out, ooff + d, out_dtype)) * g;
    }
    for (int off = 16; off >= 1; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = dot;
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.f;
      for (int k = 0; k < static_cast<int>(blockDim.x >> 5); ++k) s += red[k];
      grads.glse[i][lead_off(grads.glse_idx[i], row)] = w * (dl + s);
    }
    __syncthreads();
  }
}

StridedIndex lead_index(const TensorView& t, int lead) {
  StridedIndex s{};
  s.ndim = lead;
  for (int d = 0; d < lead; ++d) {
    s.shape[d] = t.shape[d];
    s.stride[d] = t.stride[d];
  }
  return s;
}

Parts make_parts(const MergeArgs& a) {
  Parts p;
  const int n = static_cast<int>(a.outs.size());
  const int lead = a.out.ndim - 1;
  p.n = n;
  p.dtype = a.outs[0].dtype;
  const int eb = dtype_bits(p.dtype) / 8;
  bool uniform = n > 1;
  if (uniform) {
    const int64_t ostep = static_cast<const char*>(a.outs[1].data) - static_cast<const char*>(a.outs[0].data);
    const int64_t lstep = static_cast<const float*>(a.lses[1].data) - static_cast<const float*>(a.lses[0].data);
    for (int i = 0; i < n && uniform; ++i) {
      uniform = static_cast<const char*>(a.outs[i].data) == static_cast<const char*>(a.outs[0].data) + i * ostep &&
                static_cast<const float*>(a.lses[i].data) == static_cast<const float*>(a.lses[0].data) + i * lstep;
      for (int d = 0; d < lead && uniform; ++d)
        uniform = a.outs[i].stride[d] == a.outs[0].stride[d] && a.lses[i].stride[d] == a.lses[0].stride[d];
    }
    p.out_step = ostep;
    p.lse_step = lstep;
  }
  p.uniform = uniform;
  if (!uniform)
    check::in_range("merge_attention", "n_parts (CUDA, parts with different layouts)", n, 1,
                    kMaxListParts);
  const int m = uniform ? 1 : n;
  for (int i = 0; i < m; ++i) {
    p.out[i] = static_cast<const char*>(a.outs[i].data);
    p.lse[i] = static_cast<const float*>(a.lses[i].data);
    p.out_idx[i] = lead_index(a.outs[i], lead);
    p.lse_idx[i] = lead_index(a.lses[i], lead);
  }
  (void)eb;
  return p;
}

}  // namespace

void kv_append(const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const TensorView& positions, Context& ctx) {
  AppendParams p;
  p.c = make_cache_args(cache);
  p.k = static_cast<char*>(cache.k.data);
  p.v = static_cast<char*>(cache.v.data);
  if (cache.format == KvFormat::fp8) {
    p.kss = static_cast<uint32_t*>(cache.k_scale_shift.data);
    p.vss = static_cast<uint32_t*>(cache.v_scale_shift.data);
  }
  p.format = cache.format;
  p.src[0] = k_new.data;
  p.src[1] = v_new.data;
  p.src_dtype = k_new.dtype;
  LOWBIT_CHECK(v_new.dtype == k_new.dtype, "kv_append", "v_new",
               std::string("dtype: expected the dtype of k_new on CUDA (") +
                   dtype_name(k_new.dtype) + "), got " + dtype_name(v_new.dtype));
  for (int d = 0; d < 3; ++d) {
    p.src_st[0][d] = k_new.stride[d];
    p.src_st[1][d] = v_new.stride[d];
  }
  p.positions = static_cast<const int32_t*>(positions.data);
  p.pos_st = positions.stride[0];
  p.B = k_new.shape[0];
  p.n = k_new.shape[1];
  p.H = k_new.shape[2];
  p.D = static_cast<int>(k_new.shape[3]);
  const int64_t total = p.B * p.n * p.H * 2;
  const int threads = 128;
  const int blocks = static_cast<int>(std::min<int64_t>((total + threads - 1) / threads,
                                                        int64_t{multiprocessor_count()} * 8));
  kv_append_kernel<<<blocks, threads, 0, stream_of(ctx)>>>(p);
  check_launch("kv_append");
}

void merge_attention(const MergeArgs& a, Context& ctx) {
  const Parts parts = make_parts(a);
  const int lead = a.out.ndim - 1;
  const int threads = a.head_dim >= 128 ? 128 : 64;
  merge_kernel<<<static_cast<unsigned>(a.rows), threads, 0, stream_of(ctx)>>>(
      parts, a.head_dim, a.out.data, a.out.dtype, lead_index(a.out, lead),
      a.lse.data ? static_cast<float*>(a.lse.data) : nullptr, lead_index(a.lse, lead));
  check_launch("merge_attention");
}

void merge_attention_backward(const MergeBackwardArgs& a, Context& ctx) {
  const MergeArgs& f = a.fwd;
  const int n = static_cast<int>(f.outs.size());
  check::in_range("merge_attention_backward", "n_parts (CUDA)", n, 1, kMaxListParts);
  Parts parts = make_parts(f);
  const int lead = f.out.ndim - 1;
  GradParts g;
  g.gout_dtype = a.grad_outs[0].dtype;
  for (int i = 0; i < n; ++i) {
    LOWBIT_CHECK(a.grad_outs[i].dtype == g.gout_dtype, "merge_attention_backward", "grad_outs",
                 "dtype: expected every part's gradient in one dtype on CUDA");
    g.gout[i] = a.grad_outs[i].data;
    g.glse[i] = static_cast<float*>(a.grad_lses[i].data);
    g.gout_idx[i] = lead_index(a.grad_outs[i], lead);
    g.glse_idx[i] = lead_index(a.grad_lses[i], lead);
  }
  merge_backward_kernel<<<static_cast<unsigned>(f.rows), 128, 0, stream_of(ctx)>>>(
      parts, g, f.head_dim, f.out.data, f.out.dtype, lead_index(f.out, lead),
      static_cast<const float*>(f.lse.data), lead_index(f.lse, lead), a.grad_out.data,
      a.grad_out.dtype, lead_index(a.grad_out, lead),
      a.grad_lse.data ? static_cast<const float*>(a.grad_lse.data) : nullptr,
      lead_index(a.grad_lse, lead));
  check_launch("merge_attention_backward");
}

}  // namespace cuda
}  // namespace lowbit
