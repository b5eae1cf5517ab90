// NVFP4 x NVFP4 GEMM on sm_100a's block-scaled tensor cores (tcgen05 MMA kind::mxf4nvf4, built
// from CUTLASS's sm_100 collectives) for the convrot4 layer (SPEC §3.4, §3.5). sm_90 has no fp4
// MMA and dequantizes to f16 instead (linear_entry.cu); this is the path for Blackwell GPUs.
//
// Compiled (src/cuda/sm100/gemm_nvfp4_sm100.cu, its own object built for sm_100a) when the CUDA
// toolkit knows sm_100a and CUTLASS's headers are found; LOWBIT_HAVE_SM100_NVFP4 is then defined.
// The operand bytes are exactly lowbit's packed formats: the weight codes and their 128x4-swizzled
// block scales as PackedWeight stores them, the activation codes as the rotation kernel writes them
// (its row-major block scales are swizzled here). tests/unit/linear_sm100_test.cpp checks, on the
// CPU, that CUTLASS's own operand types and scale-factor layouts read these bytes as the oracle's
// NVFP4 values and give the oracle's layer output.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "lowbit/tensor.h"

namespace lowbit {
namespace cuda {
namespace linear {

struct Nvfp4Sm100Gemm {
  int64_t M = 0, N = 0, K = 0;
  const uint8_t* a_codes = nullptr;            // (M, K/2) e2m1 pairs, even element in the low nibble
  const uint8_t* a_scales = nullptr;           // (M, K/16) e4m3 block scales, row-major
  const uint8_t* w_codes = nullptr;            // (N, K/2)
  const uint8_t* w_scales_swizzled = nullptr;  // (ceil(N/128)*128 * ceil(K/64)*4) swizzled e4m3
  const float* alpha = nullptr;                // device scalar: the weights' per-tensor scale pts
  const void* bias = nullptr;                  // (N) of bias_dtype, or null
  DType bias_dtype = DType::f32;
  void* out = nullptr;                         // (M, N) rows ldo apart, out_dtype bf16 or f16
  DType out_dtype = DType::bf16;
  int64_t ldo = 0;
};

// True on a device of compute capability 10.0 (the sm_100a image's only target).
bool nvfp4_sm100_device();

// Runs the GEMM on `stream` (out = alpha * A·Wᵀ + bias in fp32, rounded once to out_dtype).
// Returns "" when it ran, else why it cannot (device, shape, alignment); nothing is written then.
std::string nvfp4_gemm_sm100(const Nvfp4Sm100Gemm& g, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
