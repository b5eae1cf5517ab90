// The ring decode kernel (M <= 16, linear_decode_ring.cu): weight rows streamed by bulk copies
// (cp.async.bulk + mbarrier) into per-warp shared-memory rings, one persistent CTA per SM, each
// warp owning whole output columns (no cross-warp reduction), the activation rotate + quantize
// optionally fused into the kernel's prologue. Same integer sums and epilogue as the prefill path:
// bit-identical output. Internal interface, included by linear_decode.cu, linear_entry.cu and the
// bench rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {
namespace linear {

// Largest M whose rotation + quantization the ring kernel can do itself (every CTA rotates the
// rows in its prologue, while the first weight bytes are in flight).
constexpr int64_t kRingFuseLimit = 2;
// Largest M for which QuantizedLinear::forward takes that fused mode. 0: off. H200 run 2 measured
// the fused prologue ~3 us slower than the register rotate kernel followed by the ring kernel
// (programmatic dependent launch) at 1 x 5120 -> 13824 (convrotint4 37.4 vs 34.6 us; the ring is
// instruction-bound, so the prologue's IEEE divisions and barriers add to its time).
constexpr int64_t kRingFuseMaxM = 0;

// Whether decode_ring takes these arguments on the current device: sm_90 with an sm_90 kernel
// image; weights int8 (K % 256 == 0), packed 4-bit with group 128 or no ratios (K % 512 == 0), or
// comfy int4 (K % 512 == 0); 16-byte aligned codes / ratios / activation codes; M <= 16; the
// shared-memory layout fits. With d.x set (fused mode) also: M <= kRingFuseLimit, rot 256,
// x bf16 or f16.
bool decode_ring_applies(const DecodeParams& d);

// out = epilogue(codes(M, K) · unpack(W)(N, K)ᵀ); with d.x set the kernel first rotates and
// quantizes x (M, K) itself (d.a, d.lda and d.ep.a_scale unused). Assumes decode_ring_applies(d).
// Launched with programmatic stream serialization: the weight loads start before the preceding
// kernel finished; activations are read after griddepcontrol.wait.
void decode_ring(const DecodeParams& d, cudaStream_t stream);
// decode_ring with the weight transport chosen: cp.async.bulk (bulk, the default) or 16-byte
// cp.async per lane; the same output bits (A/B bench rows).
void decode_ring_transport(const DecodeParams& d, bool bulk, cudaStream_t stream);
// ... and the tile height: tile_rows 8 (16 warps) or 16 (8 warps); 0 = the default (16 for
// M > 8, else 8). Falls back to the default where the requested layout does not fit.
void decode_ring_with(const DecodeParams& d, bool bulk, int tile_rows, cudaStream_t stream);

// The session-2 kernels only (decode4_kernel, else the general kernel), whatever the ring kernel
// would take: A/B bench rows and the fallback.
void decode_gemv_stream(const DecodeParams& d, cudaStream_t stream);

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
