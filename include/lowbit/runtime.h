// Device discovery and a few memory helpers, so C++ engines, the CLI and the tests can move
// tensors without including CUDA headers. In a build without CUDA every query says "no device"
// and every device call throws lowbit::Error naming the missing backend.
#pragma once

#include <cstddef>
#include <string>

#include "lowbit/tensor.h"

namespace lowbit {

// True when lowbit was built with its CUDA backend.
bool built_with_cuda();
// Number of CUDA devices that can run lowbit's kernels (0 when none, or when not built with CUDA).
int cuda_device_count();
// Why no CUDA device is usable ("" when one is).
std::string cuda_unavailable_reason();

struct DeviceInfo {
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  int64_t l2_bytes = 0;
  int64_t shared_bytes_per_block_optin = 0;
  int64_t global_bytes = 0;
  // The device code lowbit runs on this device: the virtual architecture of the image the driver
  // loaded (90 = sm_90; 89 where the build holds only compute_89 PTX for this GPU, JIT-compiled; 0
  // where no image fits) and whether it is sm_90a code (wgmma kernels). Paths are chosen by it.
  int code_arch = 0;
  bool code_sm90a = false;
};
DeviceInfo cuda_device_info(int device_index = 0);

// Raw device memory (cudaMalloc / cudaFree). Errors throw lowbit::Error.
void* device_alloc(size_t bytes);
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes, const Context& ctx);
void copy_to_host(void* dst, const void* src, size_t bytes, const Context& ctx);
void copy_device_to_device(void* dst, const void* src, size_t bytes, const Context& ctx);
void device_memset(void* dst, int value, size_t bytes, const Context& ctx);
void synchronize(const Context& ctx);

// An owning, move-only byte buffer on the host or on the current CUDA device.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
};

}  // namespace lowbit
