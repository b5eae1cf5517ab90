// Every one of the 2^32 float bit patterns through the prologue's norm_rsqrt and libdevice's
// __frsqrt_rn (the CUDA kernels' rounding before session 25): prints the number of patterns
// whose results differ (NaNs compare as NaNs) and the first few; exit status 1 if any differ,
// 2 without a GPU. A GPU-only check (docs/prologue.md "Session 25"); the harness's
// `prologue.rsqrt` cases compare it with the CPU oracle on a dense sweep of [1, 4).
#include <cuda_runtime.h>

#include <cinttypes>
#include <cstdio>

#include "src/cuda/rsqrt_rn.cuh"

namespace {

__device__ unsigned long long g_count;
__device__ uint32_t g_first[8];

__global__ void compare_all(uint32_t base) {
  const uint32_t i = base + blockIdx.x * blockDim.x + threadIdx.x;
  const float s = __uint_as_float(i);
  const float a = lowbit::cuda::norm_rsqrt(s), b = __frsqrt_rn(s);
  const bool same = __float_as_uint(a) == __float_as_uint(b) || (a != a && b != b);
  if (!same) {
    const unsigned long long k = atomicAdd(&g_count, 1ull);
    if (k < 8) g_first[k] = i;
  }
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("rsqrt_exhaustive: no CUDA device\n");
    return 2;
  }
  const unsigned long long zero = 0;
  cudaMemcpyToSymbol(g_count, &zero, sizeof zero);
  const uint32_t per_launch = 1u << 30;  // 4 launches of 2^22 blocks of 256
  for (uint64_t base = 0; base < (1ull << 32); base += per_launch)
    compare_all<<<per_launch / 256, 256>>>(static_cast<uint32_t>(base));
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("rsqrt_exhaustive: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  unsigned long long count = 0;
  uint32_t first[8] = {};
  cudaMemcpyFromSymbol(&count, g_count, sizeof count);
  cudaMemcpyFromSymbol(first, g_first, sizeof first);
  std::printf("rsqrt_exhaustive: %llu of 2^32 patterns differ from __frsqrt_rn\n", count);
  for (unsigned long long k = 0; k < count && k < 8; ++k)
    std::printf("  0x%08" PRIx32 "\n", first[k]);
  return count == 0 ? 0 : 1;
}
