// lowbit core types: DType, Device, TensorView, Context, Error.
// Framework-free: no torch, no Python, no CUDA headers here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace lowbit {

// Element types lowbit moves. Packed types hold two 4-bit values per byte, the even element in
// the low nibble; their shape is counted in *elements*, their strides in *bytes* of the packed
// storage are not used: a packed tensor's innermost dimension must be contiguous and even.
enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  i8,
  u8,
  i32,
  e4m3,    // fp8 e4m3fn: bias 7, no inf, NaN = S.1111.111, max 448
  e5m2,    // fp8 e5m2: bias 15, IEEE-like inf/NaN, max 57344
  e2m1x2,  // NVFP4 e2m1, two per byte (SPEC §3.4)
  i4x2,    // signed two's-complement int4, two per byte
};

enum class Device : uint8_t { cpu, cuda };

const char* dtype_name(DType);
// Bits per element (4 for the packed types).
int dtype_bits(DType);
// Bytes needed to store `n` elements of `dt` (packed types round up to whole bytes).
int64_t dtype_storage_bytes(DType dt, int64_t n);
bool dtype_is_packed(DType);
const char* device_name(Device);

constexpr int kMaxDims = 6;

// A non-owning view of a strided tensor. Strides are in elements (for packed 4-bit types, in
// elements too, and every stride except the innermost must be even).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0, 0, 0};

  int64_t numel() const;
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t strides(int d) const { return stride[d < 0 ? d + ndim : d]; }
  bool is_contiguous() const;
  // Human readable "(2, 3, 4) bf16 cuda:0".
  std::string describe() const;
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// A contiguous row-major view of `shape`.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                     Device device = Device::cpu, int device_index = 0);
TensorView make_view(void* data, DType dtype, int ndim, const int64_t* shape,
                     Device device = Device::cpu, int device_index = 0);

// Where work runs: the caller's CUDA stream and the CPU thread count. Passed explicitly to every
// op; lowbit keeps no hidden global stream.
struct Context {
  void* cuda_stream = nullptr;  // cudaStream_t of the caller (nullptr = legacy default stream)
  int cpu_threads = 0;          // 0 = all hardware threads
};

// Every error lowbit reports: "op: argument: expected ..., got ...".
class Error : public std::runtime_error {
 public:
  Error(std::string op, std::string argument, std::string message);
  const char* op() const noexcept { return op_.c_str(); }
  const char* argument() const noexcept { return argument_.c_str(); }
  // The part after "op: argument: " ("expected ..., got ...").
  const char* message() const noexcept { return message_.c_str(); }

 private:
  std::string op_, argument_, message_;
};

}  // namespace lowbit
