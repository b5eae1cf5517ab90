// Out-of-line helpers declared in src/cuda/common.cuh.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
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

namespace {
bool tiled_map_valid(const void* base, int elem, int rank, const uint64_t* dims,
                     const uint64_t* strides, const uint32_t* box, bool sw64) {
  // cuTensorMapEncodeTiled's documented requirements (cuda.h), checked here so that a layout
  // the TMA cannot take falls back without a failed driver call (which compute-sanitizer and
  // API tracers report as an error).
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || rank < 1 || rank > 4) return false;
  if (static_cast<uint64_t>(box[0]) * elem % 16 != 0 ||
      static_cast<uint64_t>(box[0]) * elem > (sw64 ? 64u : 128u))
    return false;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (uint64_t{1} << 32) || box[i] == 0 || box[i] > 256) return false;
    if (i + 1 < rank && (strides[i] % 16 != 0 || strides[i] >= (uint64_t{1} << 40))) return false;
  }
  return true;
}
}  // namespace

bool encode_tiled_map(CUtensorMap* map, const void* base, int elem, int rank,
                      const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                      bool sw64) {
  if (!tiled_map_valid(base, elem, rank, dims, strides, box, sw64)) return false;
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

namespace {
int current_device(const char* op) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), op, "device");
  return dev;
}
std::mutex g_cache_mu;  // guards the caches below
// cache[key], made by make() (outside the lock) on first use.
template <typename Map, typename Make>
typename Map::mapped_type cached(Map& cache, const typename Map::key_type& key, Make make) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  const typename Map::mapped_type v = make();
  std::lock_guard<std::mutex> lock(g_cache_mu);
  return cache.emplace(key, v).first->second;
}
}  // namespace

int device_attribute(cudaDeviceAttr attr, const char* op) {
  static std::map<std::pair<int, int>, int> cache;
  const int dev = current_device(op);
  return cached(cache, {dev, static_cast<int>(attr)}, [&] {
    int v = 0;
    check_cuda(cudaDeviceGetAttribute(&v, attr, dev), op, "device attribute");
    return v;
  });
}

int multiprocessor_count() {
  return device_attribute(cudaDevAttrMultiProcessorCount, "multiprocessor_count");
}

int occupancy_per_sm(const void* kernel, int threads, size_t smem, const char* op) {
  static std::map<std::tuple<int, const void*, int, size_t>, int> cache;
  return cached(cache, {current_device(op), kernel, threads, smem}, [&] {
    int n = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem), op,
               "occupancy");
    return n;
  });
}

cudaFuncAttributes func_attributes(const void* kernel, const char* op) {
  static std::map<std::pair<int, const void*>, cudaFuncAttributes> cache;
  return cached(cache, {current_device(op), kernel}, [&] {
    cudaFuncAttributes a{};
    check_cuda(cudaFuncGetAttributes(&a, kernel), op, "kernel attributes");
    return a;
  });
}

void set_func_attribute(const void* kernel, cudaFuncAttribute attr, int value, const char* op,
                        const char* what) {
  using Key = std::tuple<int, const void*, int>;
  static std::map<Key, int> done;  // the value set (the largest, for the shared-memory size)
  const Key key{current_device(op), kernel, static_cast<int>(attr)};
  const bool at_least = attr == cudaFuncAttributeMaxDynamicSharedMemorySize;
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    auto it = done.find(key);
    if (it != done.end() && (at_least ? it->second >= value : it->second == value)) return;
  }
  check_cuda(cudaFuncSetAttribute(kernel, attr, value), op, what);
  std::lock_guard<std::mutex> lock(g_cache_mu);
  int& v = done[key];
  v = at_least ? std::max(v, value) : value;
}

namespace {
// code_arch's probe: its static shared memory says which branch its image was compiled with.
constexpr int kProbeWordsSm90a = 64;
__global__ void code_arch_probe_kernel(uint32_t* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kWords = kProbeWordsSm90a;
#else
  constexpr int kWords = 1;
#endif
  __shared__ uint32_t s[kWords];
  s[threadIdx.x % kWords] = threadIdx.x;
  __syncthreads();
  if (out) out[threadIdx.x] = s[(threadIdx.x + 1) % kWords];
}
}  // namespace

CodeArch code_arch() {
  static std::map<int, CodeArch> verdict;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  // The thread's last answer first: launch_maybe_pdl asks on every launch, and the shared map
  // takes a mutex.
  thread_local int last_dev = -1;
  thread_local CodeArch last;
  if (dev == last_dev) return last;
  last = cached(verdict, dev, [&] {
    CodeArch c;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess)
      c.sm = major * 10 + minor;
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, code_arch_probe_kernel) == cudaSuccess) {
      c.ptx = attr.ptxVersion;
      c.sm90a = attr.ptxVersion == 90 && attr.binaryVersion == 90 &&
                attr.sharedSizeBytes >= kProbeWordsSm90a * sizeof(uint32_t);
    }
    cudaGetLastError();  // no image for this device: the error stays here
    return c;
  });
  last_dev = dev;
  return last;
}

std::string fp8_mma_missing() {
  const CodeArch c = code_arch();
  if (c.sm >= 89 && c.ptx >= 89) return "";
  if (c.sm == 0) return "no GPU";
  return "sm_" + std::to_string(c.sm) + " GPU running " +
         (c.ptx ? "compute_" + std::to_string(c.ptx) : std::string("no")) + " code";
}

bool sm90a_image_loaded(const void* kernel, int min_regs) {
  static std::map<std::pair<int, const void*>, bool> verdict;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return cached(verdict, {dev, kernel}, [&] {
    const CodeArch code = code_arch();
    cudaFuncAttributes attr{};
    const bool ok = code.sm == 90 && code.sm90a &&
                    cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
                    attr.binaryVersion == 90 && attr.ptxVersion == 90 && attr.numRegs >= min_regs;
    cudaGetLastError();
    return ok;
  });
}

}  // namespace cuda
}  // namespace lowbit
