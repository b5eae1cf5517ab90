#include "src/core/scratch.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace lowbit {
namespace detail {

#ifdef LOWBIT_WITH_CUDA
cudaMemPool_t scratch_pool(const char* op) {
  static std::mutex mu;
  static std::map<int, cudaMemPool_t> pools;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), op, "device");
  std::lock_guard<std::mutex> lock(mu);
  auto it = pools.find(dev);
  if (it != pools.end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaMemPoolCreate(&pool, &props), op, "memory pool");
  uint64_t keep = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), op,
             "memory pool");
  pools.emplace(dev, pool);
  return pool;
}
#endif

StreamBuffer::StreamBuffer(Device device, size_t bytes, const Context& ctx, const char* op)
    : device_(device), stream_(ctx.cuda_stream) {
  if (bytes == 0) return;
  if (device == Device::cpu) {
    data_ = std::malloc(bytes);
    if (!data_)
      throw Error(op, "workspace", "host allocation of " + std::to_string(bytes) + " bytes failed");
    return;
  }
#ifdef LOWBIT_WITH_CUDA
  pool_alloc(bytes, op, "workspace");
#else
  throw Error(op, "device", "expected a CUDA build of lowbit, got one built without CUDA");
#endif
}

#ifdef LOWBIT_WITH_CUDA
StreamBuffer::StreamBuffer(size_t bytes, cudaStream_t stream, const char* op)
    : device_(Device::cuda), stream_(stream) {
  if (bytes) pool_alloc(bytes, op, "temporary buffer");
}

void StreamBuffer::pool_alloc(size_t bytes, const char* op, const char* what) {
  check_cuda(cudaMallocFromPoolAsync(&data_, bytes, scratch_pool(op),
                                     static_cast<cudaStream_t>(stream_)),
             op, what);
}
#endif

StreamBuffer::~StreamBuffer() {
  if (!data_) return;
  if (device_ == Device::cpu) {
    std::free(data_);
    return;
  }
#ifdef LOWBIT_WITH_CUDA
  cudaFreeAsync(data_, static_cast<cudaStream_t>(stream_));
#endif
}

void* StreamBuffer::aligned(size_t align) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data_);
  return reinterpret_cast<void*>((p + align - 1) & ~static_cast<uintptr_t>(align - 1));
}

}  // namespace detail
}  // namespace lowbit
