// Device discovery and memory helpers (runtime.h). Compiled with or without CUDA.
#include "lowbit/runtime.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "src/core/check.h"
#include "src/core/cuda_check.h"
#ifdef LOWBIT_WITH_CUDA
#include "src/cuda/code_arch.h"
#endif

namespace lowbit {

bool built_with_cuda() {
#ifdef LOWBIT_WITH_CUDA
  return true;
#else
  return false;
#endif
}

#ifdef LOWBIT_WITH_CUDA
using detail::check_cuda;
using detail::stream_of;

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  return n > 0 ? "" : "no CUDA device found";
}

DeviceInfo cuda_device_info(int device_index) {
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, device_index), "cuda_device_info", "device_index");
  DeviceInfo d;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  d.l2_bytes = p.l2CacheSize;
  d.shared_bytes_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  d.global_bytes = static_cast<int64_t>(p.totalGlobalMem);
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cuda_device_info", "current device");
  check_cuda(cudaSetDevice(device_index), "cuda_device_info", "device_index");
  const cuda::CodeArch code = cuda::code_arch();
  check_cuda(cudaSetDevice(current), "cuda_device_info", "current device");
  d.code_arch = code.ptx;
  d.code_sm90a = code.sm90a;
  return d;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  check_cuda(cudaMalloc(&p, bytes), "device_alloc", "bytes");
  return p;
}
void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}
void copy_to_device(void* dst, const void* src, size_t bytes, const Context& ctx) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(ctx)),
          "copy_to_device", "dst");
  check_cuda(cudaStreamSynchronize(stream_of(ctx)), "copy_to_device", "stream");
}
void copy_to_host(void* dst, const void* src, size_t bytes, const Context& ctx) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(ctx)),
          "copy_to_host", "src");
  check_cuda(cudaStreamSynchronize(stream_of(ctx)), "copy_to_host", "stream");
}
void copy_device_to_device(void* dst, const void* src, size_t bytes, const Context& ctx) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)),
          "copy_device_to_device", "src");
}
void device_memset(void* dst, int value, size_t bytes, const Context& ctx) {
  check_cuda(cudaMemsetAsync(dst, value, bytes, stream_of(ctx)), "device_memset", "dst");
}
void synchronize(const Context& ctx) {
  // With no device (or no driver) nothing can have been enqueued: nothing to wait for.
  if (cuda_device_count() == 0) return;
  check_cuda(cudaStreamSynchronize(stream_of(ctx)), "synchronize", "stream");
}

#else  // no CUDA backend

int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "lowbit was built without its CUDA backend"; }
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(op, "device", "expected a CUDA build of lowbit, got one built without CUDA");
}
}  // namespace
DeviceInfo cuda_device_info(int) { no_cuda("cuda_device_info"); }
void* device_alloc(size_t) { no_cuda("device_alloc"); }
void device_free(void*) noexcept {}
void copy_to_device(void*, const void*, size_t, const Context&) { no_cuda("copy_to_device"); }
void copy_to_host(void*, const void*, size_t, const Context&) { no_cuda("copy_to_host"); }
void copy_device_to_device(void*, const void*, size_t, const Context&) {
  no_cuda("copy_device_to_device");
}
void device_memset(void*, int, size_t, const Context&) { no_cuda("device_memset"); }
void synchronize(const Context&) {}

#endif

Buffer::Buffer(Device device, size_t bytes) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device == Device::cpu) {
    data_ = std::malloc(bytes);
    if (!data_) throw Error("Buffer", "bytes", "host allocation of " + std::to_string(bytes) + " bytes failed");
  } else {
    data_ = device_alloc(bytes);
  }
}
Buffer::~Buffer() {
  if (!data_) return;
  if (device_ == Device::cpu) std::free(data_);
  else device_free(data_);
}
Buffer::Buffer(Buffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_), device_(o.device_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    data_ = o.data_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

}  // namespace lowbit
