// Out-of-line helpers declared in src/cuda/common.cuh.
#include <map>
#include <mutex>

#include "src/cuda/common.cuh"

namespace lowbit {
namespace cuda {

int multiprocessor_count() {
  int dev = 0, n = 0;
  check_cuda(cudaGetDevice(&dev), "multiprocessor_count", "device");
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
             "multiprocessor_count", "attribute");
  return n;
}

int compute_capability_major() {
  int dev = 0, major = 0;
  check_cuda(cudaGetDevice(&dev), "compute_capability_major", "device");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
             "compute_capability_major", "attribute");
  return major;
}

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

}  // namespace cuda
}  // namespace lowbit
