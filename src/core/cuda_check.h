// CUDA runtime errors as lowbit::Error, and a context's stream: shared by the plain-C++ files of
// src/core that call the runtime (runtime.cpp, stream_fork.cpp) and by the CUDA backend
// (src/cuda/common.cuh). Only with the CUDA backend.
#pragma once

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include <string>

#include "lowbit/tensor.h"

namespace lowbit {
namespace detail {

// Throws lowbit::Error naming the op when a launch or CUDA call failed.
inline void check_cuda(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess) throw Error(op, what, std::string("CUDA error: ") + cudaGetErrorString(e));
}
inline cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.cuda_stream);
}

}  // namespace detail
}  // namespace lowbit
#endif
