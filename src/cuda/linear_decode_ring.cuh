// The ring decode kernel (M <= 16, linear_decode_ring.cu): weight rows streamed by cp.async
// (mbarrier completion) into per-warp shared-memory rings, one persistent CTA per SM, each warp
// owning whole output columns (no cross-warp reduction); activation codes from the rotate
// kernel. Same integer sums and epilogue as the prefill path: bit-identical output. Internal
// interface, included by linear_decode.cu and the bench rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {
namespace linear {

// Whether decode_ring takes these arguments on the current device: sm_90 with an sm_90 kernel
// image; weights int8 (K % 256 == 0), packed 4-bit with group 128 or no ratios (K % 512 == 0), or
// comfy int4 (K % 512 == 0); 16-byte aligned codes / ratios / activation codes; M <= 16; the
// shared-memory layout fits; codes in (d.x null: the fused mode is deleted).
bool decode_ring_applies(const DecodeParams& d);

// out = epilogue(codes(M, K) · unpack(W)(N, K)ᵀ). Assumes decode_ring_applies(d).
// Launched with programmatic stream serialization: the weight loads start before the preceding
// kernel finished; activations are read after griddepcontrol.wait.
void decode_ring(const DecodeParams& d, cudaStream_t stream);
// The session-2 kernels only (decode4_kernel, else the general kernel), whatever the ring kernel
// would take: A/B bench rows and the fallback.
void decode_gemv_stream(const DecodeParams& d, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
