// Core ops: element-wise dtype conversion on any backend (the dtype conversions of dtype.h,
// applied to strided tensors).
#pragma once

#include "lowbit/tensor.h"

namespace lowbit {

// dst = convert(src), element by element, same shape, any strides (packed 4-bit types need a
// contiguous innermost dimension of even size). Supported: every pair among f32, f16, bf16,
// e4m3, e5m2, and f32 -> i8 / e2m1x2 / i4x2, i8 / e2m1x2 / i4x2 -> f32. src and dst on the
// same device. Float -> narrow float rounds as dtype.h documents.
void convert(const TensorView& src, TensorView dst, Context& ctx);

}  // namespace lowbit
