// Small helpers shared by lowbit's CUDA kernels.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "lowbit/tensor.h"

namespace lowbit {
namespace cuda {

inline cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.cuda_stream);
}

// Throws lowbit::Error naming the op when a launch or CUDA call failed.
inline void check_cuda(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess) throw Error(op, what, std::string("CUDA error: ") + cudaGetErrorString(e));
}
inline void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Multiprocessor count of the current device (queried, never hard-coded).
int multiprocessor_count();

}  // namespace cuda
}  // namespace lowbit
