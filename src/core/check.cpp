#include "src/core/check.h"

#include <string>

namespace lowbit {
namespace check {

void fail(const char* op, const char* arg, const std::string& message) {
  throw Error(op, arg, message);
}

std::string expected_got(int64_t expected, int64_t got) {
  return "expected " + std::to_string(expected) + ", got " + std::to_string(got);
}
std::string expected_got(const std::string& expected, const std::string& got) {
  return "expected " + expected + ", got " + got;
}

void not_null(const char* op, const char* arg, const TensorView& t) {
  if (t.data == nullptr && t.numel() != 0) fail(op, arg, "expected a data pointer, got null");
}

void dtype(const char* op, const char* arg, const TensorView& t, std::initializer_list<DType> ok) {
  std::string allowed;
  for (DType d : ok) {
    if (d == t.dtype) return;
    allowed += (allowed.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  fail(op, arg, "dtype: " + expected_got(allowed, dtype_name(t.dtype)));
}

void ndim(const char* op, const char* arg, const TensorView& t, int n) {
  if (t.ndim != n) fail(op, arg, "rank: " + expected_got(n, t.ndim) + " (shape " + t.describe() + ")");
}

void dim(const char* op, const char* arg, const TensorView& t, int d, int64_t expected) {
  if (d < 0) d += t.ndim;
  if (d < 0 || d >= t.ndim) fail(op, arg, "has no dimension " + std::to_string(d));
  if (t.shape[d] != expected)
    fail(op, arg, "dim " + std::to_string(d) + ": " + expected_got(expected, t.shape[d]) +
                      " (shape " + t.describe() + ")");
}

void same_shape(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref) {
  bool same = t.ndim == ref.ndim;
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == ref.shape[i];
  if (!same)
    fail(op, arg, "shape: expected the shape of " + std::string(ref_arg) + " " + ref.describe() +
                      ", got " + t.describe());
}

void device(const char* op, const char* arg, const TensorView& t, Device dev) {
  if (t.device != dev)
    fail(op, arg, "device: " + expected_got(device_name(dev), device_name(t.device)));
}

void same_device(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                 const TensorView& ref) {
  if (t.device != ref.device || t.device_index != ref.device_index)
    fail(op, arg, "device: expected the device of " + std::string(ref_arg) + " (" +
                      ref.describe() + "), got " + t.describe());
}

void inner_contiguous(const char* op, const char* arg, const TensorView& t) {
  if (t.ndim > 0 && t.shape[t.ndim - 1] > 1 && t.stride[t.ndim - 1] != 1)
    fail(op, arg, "innermost stride: " + expected_got(1, t.stride[t.ndim - 1]));
}

void contiguous(const char* op, const char* arg, const TensorView& t) {
  if (!t.is_contiguous()) fail(op, arg, "expected a contiguous tensor, got strides that are not");
}

void aligned(const char* op, const char* arg, const void* p, int bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    fail(op, arg, "alignment: expected " + std::to_string(bytes) + "-byte aligned data, got " +
                      std::to_string(reinterpret_cast<uintptr_t>(p) % bytes) + " bytes past");
}

void in_range(const char* op, const char* arg, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    fail(op, arg, "expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got " + std::to_string(v));
}

}  // namespace check
}  // namespace lowbit
