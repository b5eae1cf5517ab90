// CUDA convert: grid-stride loop over elements. Uses the hardware conversion instructions where
// they exist (so the harness proves them equal to dtype.h's software rounding), dtype.h elsewhere.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "src/core/backends.h"
#include "src/core/convert_elem.h"
#include "src/core/indexing.h"
#include "src/cuda/common.cuh"

namespace lowbit {
namespace cuda {

namespace {

__device__ __forceinline__ void store_hw(void* base, int64_t off, DType dt, float v) {
  switch (dt) {
    case DType::f16:
      static_cast<__half*>(base)[off] = __float2half_rn(v);
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(base)[off] = __float2bfloat16_rn(v);
      break;
    case DType::e4m3:
      static_cast<uint8_t*>(base)[off] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
      break;
    case DType::e5m2:
      static_cast<uint8_t*>(base)[off] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
      break;
    default:
      store_f32(base, off, dt, v);
  }
}

__global__ void convert_kernel(const void* src, DType sdt, StridedIndex si, void* dst, DType ddt,
                               StridedIndex di, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store_hw(dst, element_offset(di, i), ddt, load_f32(src, element_offset(si, i), sdt));
  }
}

__global__ void convert_packed_kernel(const void* src, DType sdt, StridedIndex si, uint8_t* dst,
                                      DType ddt, int64_t pairs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint8_t lo = nibble_code(load_f32(src, element_offset(si, 2 * p), sdt), ddt);
    uint8_t hi = nibble_code(load_f32(src, element_offset(si, 2 * p + 1), sdt), ddt);
    dst[p] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace

void convert(const TensorView& src, TensorView dst, Context& ctx) {
  const int64_t n = src.numel();
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads,
                                                        static_cast<int64_t>(multiprocessor_count()) * 16));
  if (dtype_is_packed(dst.dtype)) {
    convert_packed_kernel<<<blocks, threads, 0, stream_of(ctx)>>>(
        src.data, src.dtype, flat_index_of(src), static_cast<uint8_t*>(dst.data), dst.dtype, n / 2);
  } else {
    convert_kernel<<<blocks, threads, 0, stream_of(ctx)>>>(src.data, src.dtype, flat_index_of(src),
                                                           dst.data, dst.dtype, flat_index_of(dst), n);
  }
  check_launch("convert");
}

}  // namespace cuda
}  // namespace lowbit
