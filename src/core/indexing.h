// Strided index arithmetic shared by CPU loops and CUDA kernels.
#pragma once

#include <cstdint>

#include "lowbit/dtype.h"
#include "lowbit/tensor.h"

namespace lowbit {

// Shape and strides by value, small enough to pass to a kernel.
struct StridedIndex {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
};

// Shape and strides of `t`, dimension by dimension.
inline StridedIndex strided_index_of(const TensorView& t) {
  StridedIndex s{};
  s.ndim = t.ndim;
  for (int i = 0; i < t.ndim; ++i) {
    s.shape[i] = t.shape[i];
    s.stride[i] = t.stride[i];
  }
  return s;
}

// For element-wise loops only: like strided_index_of, but a contiguous tensor collapses to one
// dimension so element_offset() is the identity (no per-element divisions).
inline StridedIndex flat_index_of(const TensorView& t) {
  if (!t.is_contiguous()) return strided_index_of(t);
  StridedIndex s{};
  s.ndim = 1;
  s.shape[0] = t.numel();
  s.stride[0] = 1;
  return s;
}

// Element offset of the `linear`-th element in row-major order.
LOWBIT_HD int64_t element_offset(const StridedIndex& s, int64_t linear) {
  if (s.ndim == 1) return linear * s.stride[0];
  int64_t off = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    int64_t i = linear % s.shape[d];
    linear /= s.shape[d];
    off += i * s.stride[d];
  }
  return off;
}

}  // namespace lowbit
