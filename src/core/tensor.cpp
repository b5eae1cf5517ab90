#include <sstream>

#include "lowbit/tensor.h"
#include "lowbit/version.h"
#include "src/core/check.h"

namespace lowbit {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::e2m1x2: return "e2m1x2";
    case DType::i4x2: return "i4x2";
  }
  return "?";
}

int dtype_bits(DType d) {
  switch (d) {
    case DType::f32: case DType::i32: return 32;
    case DType::f16: case DType::bf16: return 16;
    case DType::i8: case DType::u8: case DType::e4m3: case DType::e5m2: return 8;
    case DType::e2m1x2: case DType::i4x2: return 4;
  }
  return 0;
}

bool dtype_is_packed(DType d) { return d == DType::e2m1x2 || d == DType::i4x2; }

int64_t dtype_storage_bytes(DType d, int64_t n) { return (n * dtype_bits(d) + 7) / 8; }

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string TensorView::describe() const {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < ndim; ++i) s << (i ? ", " : "") << shape[i];
  if (ndim == 1) s << ",";
  s << ") " << dtype_name(dtype) << " " << device_name(device);
  if (device == Device::cuda) s << ":" << device_index;
  return s.str();
}

TensorView make_view(void* data, DType dtype, int ndim, const int64_t* shape, Device device,
                     int device_index) {
  check::in_range("make_view", "ndim", ndim, 0, kMaxDims);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.device_index = device_index;
  v.ndim = ndim;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    v.shape[i] = shape[i];
    v.stride[i] = s;
    s *= shape[i];
  }
  return v;
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device,
                     int device_index) {
  return make_view(data, dtype, static_cast<int>(shape.size()), shape.begin(), device,
                   device_index);
}

Error::Error(std::string op, std::string argument, std::string message)
    : std::runtime_error(op + ": " + argument + ": " + message),
      op_(std::move(op)),
      argument_(std::move(argument)),
      message_(std::move(message)) {}

const char* version_string() { return "0.1.0"; }

const char* build_info() {
#ifdef LOWBIT_WITH_CUDA
  return "C++17, CUDA backend on (" LOWBIT_CUDA_ARCHS_STRING ")";
#else
  return "C++17, CUDA backend off";
#endif
}

}  // namespace lowbit
