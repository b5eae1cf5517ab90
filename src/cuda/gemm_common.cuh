// PTX wrappers and the fused scale/bias epilogue shared by the ConvRot GEMM and decode kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "lowbit/tensor.h"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/ptx.cuh"

namespace lowbit {
namespace cuda {
namespace linear {

using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_e4m3;
using ptx::mma_f16;
using ptx::mma_s8;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared; src_bytes < 16 zero-fills the rest.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                            uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D += A·B for one m16n8 tile and 32 bytes of K. Fragment byte layouts are the same for the
// three kinds (a0..a3: rows gid / gid+8, K bytes [4*tid4, +4) / [16 + 4*tid4, +4); b0, b1: column
// gid, the same K bytes).

__device__ __forceinline__ float load_scalar(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::f16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// out = acc * a_scale[row] * w_scale[col] (* w_tensor_scale[0]) (+ bias[col]): fp32, no FMA
// contraction (explicit _rn intrinsics), in that order: the CPU oracle's bits.
__device__ __forceinline__ float apply_epilogue(const Epilogue& ep, float acc, int64_t row,
                                                int64_t col) {
  float v = acc;
  if (ep.a_scale) v = __fmul_rn(v, ep.a_scale[row]);
  if (ep.w_scale) v = __fmul_rn(v, ep.w_scale[col]);
  if (ep.w_tensor_scale) v = __fmul_rn(v, *ep.w_tensor_scale);
  if (ep.bias) v = __fadd_rn(v, load_scalar(ep.bias, ep.bias_dtype, col));
  return v;
}

// Stores two adjacent outputs (col, col + 1); `pair` says both exist and the address is aligned.
__device__ __forceinline__ void store2(void* out, DType dt, int64_t off, float v0, float v1,
                                       bool has1, bool pair) {
  switch (dt) {
    case DType::bf16: {
      auto* o = static_cast<__nv_bfloat16*>(out) + off;
      if (pair) {
        *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(v0, v1);
      } else {
        o[0] = __float2bfloat16_rn(v0);
        if (has1) o[1] = __float2bfloat16_rn(v1);
      }
      break;
    }
    case DType::f16: {
      auto* o = static_cast<__half*>(out) + off;
      if (pair) {
        *reinterpret_cast<__half2*>(o) = __floats2half2_rn(v0, v1);
      } else {
        o[0] = __float2half_rn(v0);
        if (has1) o[1] = __float2half_rn(v1);
      }
      break;
    }
    default: {
      auto* o = static_cast<float*>(out) + off;
      o[0] = v0;
      if (has1) o[1] = v1;
    }
  }
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
