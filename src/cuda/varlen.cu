// attention_varlen's padded buckets (session 51): sequences of different lengths gathered into
// one zero-padded (items, L, H, D) batch, so that one chain of prologue, V and attention kernels
// serves them all (AttnParams / PrologueArgs carry the per-item lengths), and the outputs
// scattered back into the packed rows.
#include <cstdint>

#include "src/cpu/attention_backend.h"
#include "src/cuda/common.cuh"

namespace lowbit {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One 32-bit word per thread of the flat index over (item, row, head, word); 32-bit index math
// (the host keeps items * L * H * W < 2^31).
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const uint8_t* src, int64_t row_stride, int64_t head_stride, int H, int W,
                  const VarlenSpans spans, int L, uint32_t* dst, const VarlenSpans q_spans,
                  const VarlenSpans kv_spans, int32_t* lens_out) {
  const int per_item = L * H * W;
  const int b = blockIdx.y;
  if (lens_out && b == 0 && blockIdx.x == 0 && threadIdx.x < q_spans.items) {
    lens_out[threadIdx.x] = q_spans.len[threadIdx.x];
    lens_out[q_spans.items + threadIdx.x] = kv_spans.len[threadIdx.x];
  }
  const int start = spans.start[b], len = spans.len[b];
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < per_item; i += gridDim.x * kThreads) {
    const int w = i % W, h = (i / W) % H, n = i / (W * H);
    uint32_t v = 0;
    if (n < len)
      v = *reinterpret_cast<const uint32_t*>(src + (static_cast<int64_t>(start) + n) * row_stride +
                                             h * head_stride + 4 * w);
    dst[static_cast<int64_t>(b) * per_item + i] = v;
  }
}

__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const uint32_t* src, int L, int H, int W, const VarlenSpans spans, uint8_t* dst,
                   int64_t row_stride, int64_t head_stride) {
  const int b = blockIdx.y, start = spans.start[b], len = spans.len[b];
  const int per_item = L * H * W, used = len * H * W;
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < used; i += gridDim.x * kThreads) {
    const int w = i % W, h = (i / W) % H, n = i / (W * H);
    *reinterpret_cast<uint32_t*>(dst + (static_cast<int64_t>(start) + n) * row_stride +
                                 h * head_stride + 4 * w) =
        src[static_cast<int64_t>(b) * per_item + i];
  }
}

__global__ void __launch_bounds__(kThreads)
    scatter_lse_kernel(const float* src, int L, int H, const VarlenSpans spans, float* dst,
                       int64_t sh, int64_t sn) {
  const int b = blockIdx.y, start = spans.start[b], len = spans.len[b];
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < H * len; i += gridDim.x * kThreads) {
    const int h = i / len, n = i % len;
    dst[h * sh + (static_cast<int64_t>(start) + n) * sn] =
        src[(static_cast<int64_t>(b) * H + h) * L + n];
  }
}

unsigned blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

}  // namespace

void varlen_gather(const void* src, int64_t row_stride, int64_t head_stride, int64_t H, int64_t W,
                   const VarlenSpans& spans, int64_t L, void* dst, const VarlenSpans* q_spans,
                   const VarlenSpans* kv_spans, int32_t* lens_out, Context& ctx) {
  if (spans.items == 0) return;
  const VarlenSpans none;
  gather_kernel<<<dim3(blocks_for(L * H * W), static_cast<unsigned>(spans.items)), kThreads, 0,
                  stream_of(ctx)>>>(
      static_cast<const uint8_t*>(src), row_stride, head_stride, static_cast<int>(H),
      static_cast<int>(W), spans, static_cast<int>(L), static_cast<uint32_t*>(dst),
      q_spans ? *q_spans : none, kv_spans ? *kv_spans : none, lens_out);
  check_launch("attention_varlen");
}

void varlen_scatter(const void* src, int64_t L, int64_t H, int64_t W, const VarlenSpans& spans,
                    void* dst, int64_t row_stride, int64_t head_stride, Context& ctx) {
  if (spans.items == 0) return;
  scatter_kernel<<<dim3(blocks_for(L * H * W), static_cast<unsigned>(spans.items)), kThreads, 0,
                   stream_of(ctx)>>>(static_cast<const uint32_t*>(src), static_cast<int>(L),
                                     static_cast<int>(H), static_cast<int>(W), spans,
                                     static_cast<uint8_t*>(dst), row_stride, head_stride);
  check_launch("attention_varlen");
}

void varlen_scatter_lse(const float* src, int64_t L, int64_t H, const VarlenSpans& spans,
                        float* dst, int64_t sh, int64_t sn, Context& ctx) {
  if (spans.items == 0) return;
  scatter_lse_kernel<<<dim3(blocks_for(L * H), static_cast<unsigned>(spans.items)), kThreads, 0,
                       stream_of(ctx)>>>(src, static_cast<int>(L), static_cast<int>(H), spans, dst,
                                         sh, sn);
  check_launch("attention_varlen");
}

}  // namespace cuda
}  // namespace lowbit
