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
// Compute capability major version of the current device (9 on Hopper).
int compute_capability_major();
// Whether the current device runs `kernel` from its sm_90a image: an sm_90 GPU whose loaded image
// of the kernel is binary version 90 with at least min_regs registers (a plain sm_90 image of a
// wgmma kernel has an empty body and a handful of registers). Cached per (device, kernel); no
// device work, so it is safe during CUDA graph capture. Any CUDA error reads as false.
bool sm90a_image_loaded(const void* kernel, int min_regs = 0);

// lowbit's own stream-ordered pool for the current device: its release threshold is "never", so
// temporaries are reused across calls (the default pool would return memory at every
// synchronization and re-map it on the next call, which costs more than a decode layer).
cudaMemPool_t scratch_pool(const char* op);

// A stream-ordered temporary buffer from scratch_pool, freed on the stream when it goes out of
// scope (0 bytes: no allocation, null pointer).
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t s, const char* op) : stream_(s) {
    if (bytes) check_cuda(cudaMallocFromPoolAsync(&p_, bytes, scratch_pool(op), s), op,
                          "temporary buffer");
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace cuda
}  // namespace lowbit
