// Out-of-line helpers declared in src/cuda/common.cuh.
#include <map>
#include <mutex>
#include <utility>

#include "src/cuda/common.cuh"

namespace lowbit {
namespace cuda {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

bool encode_tiled_map(CUtensorMap* map, const void* base, int elem, int rank,
                      const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                      bool sw64) {
  auto enc = tensor_map_encoder();
  if (!enc) return false;
  cuuint64_t d[4], st[3];
  cuuint32_t bx[4], es[4] = {1, 1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    bx[i] = box[i];
    if (i + 1 < rank) st[i] = strides[i];
  }
  return enc(map, elem == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8,
             static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, st, bx, es,
             CU_TENSOR_MAP_INTERLEAVE_NONE,
             sw64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int multiprocessor_count() {
  int dev = 0, n = 0;
  check_cuda(cudaGetDevice(&dev), "multiprocessor_count", "device");
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
             "multiprocessor_count", "attribute");
  return n;
}

bool sm90a_image_loaded(const void* kernel, int min_regs) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, bool> verdict;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = verdict.find({dev, kernel});
  if (it != verdict.end()) return it->second;
  cudaFuncAttributes attr{};
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                      cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) ==
                      cudaSuccess &&
                  major == 9 && minor == 0 && cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
                  attr.binaryVersion == 90 && attr.numRegs >= min_regs;
  cudaGetLastError();
  verdict[{dev, kernel}] = ok;
  return ok;
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
