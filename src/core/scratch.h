// Temporary memory for one op call that does not make the call wait for the GPU. Internal;
// compiled with or without CUDA.
//
// StreamBuffer(device, bytes, ctx, op): on the CPU plain host memory, freed when it goes out of
// scope. On CUDA stream-ordered memory from lowbit's pool (cudaMallocFromPoolAsync on ctx's
// stream), released on that stream when it goes out of scope: the work queued on the stream
// before the release may still use it, so an op that makes its own workspace returns as soon as
// its work is queued (no synchronize), and inside a graph capture the pair becomes the graph's
// allocation and free nodes. The pool keeps what it has grown to (release threshold "never"), as
// torch's caching allocator does: the next call of the same size maps nothing. The CUDA backend's
// temporaries are the same class (`cuda::Scratch`, made from a stream).
#pragma once

#include <cstddef>

#include "lowbit/tensor.h"
#include "src/core/cuda_check.h"

namespace lowbit {
namespace detail {

#ifdef LOWBIT_WITH_CUDA
// lowbit's stream-ordered pool on the current device (made on first use; never trimmed).
cudaMemPool_t scratch_pool(const char* op);
#endif

class StreamBuffer {
 public:
  // Throws lowbit::Error naming `op` when the allocation fails (nothing is allocated then).
  StreamBuffer(Device device, size_t bytes, const Context& ctx, const char* op);
#ifdef LOWBIT_WITH_CUDA
  // On the current CUDA device, on `stream` (the CUDA backend's temporaries: its `Scratch`).
  StreamBuffer(size_t bytes, cudaStream_t stream, const char* op);
#endif
  ~StreamBuffer();
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  // data() rounded up to a multiple of `align` (a power of two); ask for align - 1 more bytes.
  void* aligned(size_t align) const;

 private:
#ifdef LOWBIT_WITH_CUDA
  void pool_alloc(size_t bytes, const char* op, const char* what);
#endif
  void* data_ = nullptr;
  Device device_ = Device::cpu;
  [[maybe_unused]] void* stream_ = nullptr;  // used by the CUDA build only
};

}  // namespace detail
}  // namespace lowbit
