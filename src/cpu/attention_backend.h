// Backend entry points of the attention family (SPEC §2). The front (src/cpu/attention.cpp)
// validates every argument, then calls the CPU or CUDA version; the backends assume valid input.
// Only public types appear here (the file is plain C++, included by the front and by the CUDA
// backend alike; it lives with the front, src/cpu/attention.cpp).
#pragma once

#include "lowbit/attention.h"

namespace lowbit {
namespace cpu {
#include "src/cpu/attention_backend_api.inc"  // NOLINT(build/include)
}  // namespace cpu
namespace cuda {
#include "src/cpu/attention_backend_api.inc"  // NOLINT(build/include)
}  // namespace cuda
}  // namespace lowbit
