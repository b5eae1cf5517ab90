// Small helpers shared by lowbit's CUDA kernels.
#pragma once

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled (CUtensorMap from cuda.h)
#include <cuda_runtime.h>
#ifdef __CUDACC__
#include <cuda_fp8.h>
#endif

#include <cstdint>
#include <string>

#include "lowbit/tensor.h"
#include "src/core/cuda_check.h"
#include "src/core/scratch.h"
#include "src/cuda/code_arch.h"

namespace lowbit {
namespace cuda {

using detail::check_cuda;  // (src/core/cuda_check.h)
using detail::stream_of;
inline void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Multiprocessor count of the current device (queried, never hard-coded; cached per device).
int multiprocessor_count();
// A tuning knob whose 0 (or less) means "the GPU's multiprocessor count".
inline int knob_or_sms(int knob) { return knob > 0 ? knob : multiprocessor_count(); }

// Host-side queries and settings that are constant per device (and kernel), cached so that an
// eager call pays them once (session 21: torch.profiler counted ~24 of them per attention() call
// at (1, 8, 256, 128) besides its 7 launches; the wall time per call on the H200's host did not
// move measurably, ~115 us either way). Errors throw lowbit::Error naming `op`. Keyed by the
// current device; like any per-device state, invalid after a cudaDeviceReset.
// cudaDeviceGetAttribute.
int device_attribute(cudaDeviceAttr attr, const char* op);
// cudaOccupancyMaxActiveBlocksPerMultiprocessor of `kernel` at `threads` and `smem` bytes.
int occupancy_per_sm(const void* kernel, int threads, size_t smem, const char* op);
// cudaFuncGetAttributes.
cudaFuncAttributes func_attributes(const void* kernel, const char* op);
// cudaFuncSetAttribute(kernel, attr, value) unless it was set before on this device to `value`
// (cudaFuncAttributeMaxDynamicSharedMemorySize: to `value` or more, which allows every smaller
// launch). `what` names the setting in errors.
void set_func_attribute(const void* kernel, cudaFuncAttribute attr, int value, const char* op,
                        const char* what);
template <typename K>
void set_kernel_smem(K* kernel, int bytes, const char* op, const char* what = "shared memory") {
  set_func_attribute(reinterpret_cast<const void*>(kernel),
                     cudaFuncAttributeMaxDynamicSharedMemorySize, bytes, op, what);
}

// Whether the current device runs `kernel` from its sm_90a image: an sm_90 GPU whose loaded image
// of the kernel is binary and PTX version 90, from an sm_90a build (code_arch), with at least
// min_regs registers (a plain sm_90 image of a wgmma kernel has an empty body and a handful of
// registers). Cached per (device, kernel); no device work, so it is safe during CUDA graph
// capture. Any CUDA error reads as false.
bool sm90a_image_loaded(const void* kernel, int min_regs = 0);

// cuTensorMapEncodeTiled from the driver through the runtime's entry-point query (no libcuda
// link), looked up once; null where the driver does not provide it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// A tensor map of `rank` (<= 4) dims (innermost first; strides in bytes of dims 1..) of elements
// of `elem` bytes (1: uint8, 2: uint16), unit element strides, L2 promotion 256 B, no OOB fill,
// the box's inner row in the 128-byte swizzle (sw64: 64-byte). False, without a driver call,
// where the arguments break the driver's documented rules; false if the
// driver refuses it.
bool encode_tiled_map(CUtensorMap* map, const void* base, int elem, int rank,
                      const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                      bool sw64);

// Launch `kernel` with the programmatic-dependent-launch attribute when `pdl` (the kernel must
// call griddep_wait before it reads anything the previous kernel writes) and the device code has
// griddepcontrol (code_arch().ptx >= 90: in older code griddep_wait is compiled out, and the
// attribute would let the kernel read its predecessor's outputs early); where the attribute is
// refused, an ordinary launch.
template <typename... P, typename... A>
void launch_maybe_pdl(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, A... args) {
  if (pdl && code_arch().ptx >= 90) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kernel, args...) == cudaSuccess) return;
    (void)cudaGetLastError();  // clear the refusal; launch without the attribute
  }
  kernel<<<grid, block, smem, stream>>>(args...);
}

// A stream-ordered temporary buffer from lowbit's pool (src/core/scratch.h: its release threshold
// is "never", so temporaries are reused across calls; the default pool would return memory at
// every synchronization and re-map it on the next call, which costs more than a decode layer),
// freed on the stream when it goes out of scope (0 bytes: no allocation, null pointer):
// Scratch(bytes, stream, op).
using Scratch = detail::StreamBuffer;

#ifdef __CUDACC__
// ---- device arithmetic shared by the quantizers ----

// Whether the fast correctly rounded division below applies to this scale.
__device__ __forceinline__ bool div_rn_applies(float s) { return s >= 0x1p-60f && s <= 0x1p60f; }
// RN(y / s) from r = __frcp_rn(s) and two residual corrections (q1 = q0 + (y - s q0) r, then the
// same once more: Markstein's theorem makes the second RN(y / s) when q1 is faithful), for s with
// div_rn_applies(s) while no residual underflows, i.e. |y / s| >= 2^-60 or so (smaller quotients
// round to code 0 in every lowbit format). A zero quotient comes out +0 whatever y's sign:
// callers that keep -0 (e4m3 has one) copy y's sign back.
__device__ __forceinline__ float div_rn(float y, float s, float r) {
  const float q0 = __fmul_rn(y, r);
  const float q1 = __fmaf_rn(__fmaf_rn(-s, q0, y), r, q0);
  return __fmaf_rn(__fmaf_rn(-s, q1, y), r, q1);
}

// Two e4m3 codes (satfinite, round to nearest even: __nv_cvt_float_to_fp8's conversion, and
// dt::f32_to_e4m3's for every non-NaN input) in one cvt: lo in bits 0..7, hi in bits 8..15.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;  // cvt d, a, b: a's code in the upper byte, b's in the lower
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(lo, __NV_SATFINITE, __NV_E4M3)) |
         (static_cast<uint32_t>(__nv_cvt_float_to_fp8(hi, __NV_SATFINITE, __NV_E4M3)) << 8);
#endif
}
#endif  // __CUDACC__

}  // namespace cuda
}  // namespace lowbit
