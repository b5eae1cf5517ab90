// Declarations of the backend entry points the public ops dispatch to. Validation happens in
// src/core (or the op family's front file) before these are called; the backends assume valid
// arguments. CPU and CUDA never include each other.
#pragma once

#include "lowbit/tensor.h"
#include "src/core/check.h"

namespace lowbit {
namespace cpu {
void convert(const TensorView& src, TensorView dst, Context& ctx);
}  // namespace cpu
namespace cuda {
void convert(const TensorView& src, TensorView dst, Context& ctx);
}  // namespace cuda
}  // namespace lowbit

// Calls a CUDA backend entry point, or reports that this build has no CUDA backend.
#ifdef LOWBIT_WITH_CUDA
#define LOWBIT_CUDA_CALL(op, ...) (__VA_ARGS__)
#else
#define LOWBIT_CUDA_CALL(op, ...) \
  ::lowbit::check::fail(op, "device", "expected a CUDA build of lowbit for a cuda tensor, got one built without CUDA")
#endif
