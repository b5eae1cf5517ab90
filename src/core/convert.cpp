// convert(): validate, then run on the tensors' device.
#include "lowbit/core.h"
#include "src/core/check.h"
#include "src/core/backends.h"

namespace lowbit {

namespace {
bool is_float(DType d) {
  return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::e4m3 ||
         d == DType::e5m2;
}
}  // namespace

void convert(const TensorView& src, TensorView dst, Context& ctx) {
  const char* op = "convert";
  check::not_null(op, "src", src);
  check::not_null(op, "dst", dst);
  check::same_shape(op, "dst", dst, "src", src);
  check::same_device(op, "dst", dst, "src", src);
  bool ok = (is_float(src.dtype) && is_float(dst.dtype)) ||
            (src.dtype == DType::f32 &&
             (dst.dtype == DType::i8 || dtype_is_packed(dst.dtype))) ||
            (dst.dtype == DType::f32 &&
             (src.dtype == DType::i8 || dtype_is_packed(src.dtype)));
  LOWBIT_CHECK(ok, op, "dst",
               std::string("dtype pair: expected two of f32/f16/bf16/e4m3/e5m2, or "
                           "f32 <-> i8/e2m1x2/i4x2, got ") +
                   dtype_name(src.dtype) + " -> " + dtype_name(dst.dtype));
  if (dtype_is_packed(dst.dtype)) {
    check::contiguous(op, "dst", dst);
    LOWBIT_CHECK(dst.ndim > 0 && dst.shape[dst.ndim - 1] % 2 == 0, op, "dst",
                 "packed 4-bit output: expected an even innermost size, got " + dst.describe());
  }
  if (dtype_is_packed(src.dtype)) check::contiguous(op, "src", src);
  if (src.numel() == 0) return;
  if (src.device == Device::cpu) {
    cpu::convert(src, dst, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::convert(src, dst, ctx));
  }
}

}  // namespace lowbit
