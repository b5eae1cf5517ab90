// attention_varlen's padded buckets (session 51): sequences of different lengths run as one
// zero-padded (items, L, H, D) batch through one chain of prologue, V and attention kernels, each
// item read and written at its own packed rows (AttnParams / PrologueArgs carry the per-item
// counts and rows). Here: the per-item arrays, and the gather of 16-bit P·V's v.
#include <algorithm>
#include <cstdint>

#include "src/core/check.h"
#include "src/cpu/attention_backend.h"
#include "src/cuda/common.cuh"

namespace lowbit {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One 32-bit word per thread of the flat index over (row, head, word) of item blockIdx.y; 32-bit
// index math (the host keeps L * H * W < 2^31).
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const uint8_t* src, int64_t row_stride, int64_t head_stride, int H, int W,
                  const VarlenSpans spans, int L, uint32_t* dst) {
  const int per_item = L * H * W;
  const int b = blockIdx.y, start = spans.start[b], len = spans.len[b];
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < per_item; i += gridDim.x * kThreads) {
    const int w = i % W, h = (i / W) % H, n = i / (W * H);
    uint32_t v = 0;
    if (n < len)
      v = *reinterpret_cast<const uint32_t*>(src + (static_cast<int64_t>(start) + n) * row_stride +
                                             h * head_stride + 4 * w);
    dst[static_cast<int64_t>(b) * per_item + i] = v;
  }
}

__global__ void items_kernel(const VarlenSpans q, const VarlenSpans kv, int32_t* out) {
  const int i = threadIdx.x, m = q.items;
  if (i < m) {
    out[i] = q.len[i];
    out[m + i] = kv.len[i];
    out[2 * m + i] = q.start[i];
    out[3 * m + i] = kv.start[i];
  }
}

}  // namespace

void varlen_gather(const void* src, int64_t row_stride, int64_t head_stride, int64_t H, int64_t W,
                   const VarlenSpans& spans, int64_t L, void* dst, Context& ctx) {
  if (spans.items == 0) return;
  LOWBIT_CHECK(L * H * W < (int64_t{1} << 31), "attention_varlen", "v",
               "internal: a padded item of at most 2^31 words expected");
  const int64_t blocks = std::min<int64_t>(4096, (L * H * W + kThreads - 1) / kThreads);
  gather_kernel<<<dim3(static_cast<unsigned>(std::max<int64_t>(1, blocks)),
                       static_cast<unsigned>(spans.items)),
                  kThreads, 0, stream_of(ctx)>>>(
      static_cast<const uint8_t*>(src), row_stride, head_stride, static_cast<int>(H),
      static_cast<int>(W), spans, static_cast<int>(L), static_cast<uint32_t*>(dst));
  check_launch("attention_varlen");
}

void varlen_items(const VarlenSpans& q, const VarlenSpans& kv, int32_t* out, Context& ctx) {
  items_kernel<<<1, kVarlenMaxItems, 0, stream_of(ctx)>>>(q, kv, out);
  check_launch("attention_varlen");
}

}  // namespace cuda
}  // namespace lowbit
