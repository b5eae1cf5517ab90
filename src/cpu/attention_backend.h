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
namespace detail {
// Bench-only A/B knobs of the CUDA attention kernels (not part of the public API; the default is
// what ships). Process-wide, one struct under a mutex.
struct AttentionCudaTuning {
  // wgmma_r3: round 3 + I2FP logits without the consumers' ping-pong turns (same bits as round
  // 3; auto's kernel at D = 128)
  bool no_turn = false;
  // with no_turn on wgmma_r3: three consumer warpgroups (192 rows per CTA) at D = 64 fed by the
  // TMA producer (auto's kernel at D = 64)
  bool cons3 = false;
  // fp8 P·V auto and wgmma_r3 (D 64 and 128): auto's kernels with P's row sums on the tensor
  // cores (a ones row block appended to each V tile); not bit-equal (the sums of the
  // e4m3-rounded P), launches without LSE only
  bool sum_pv = false;
  // fp8 P·V auto and wgmma_r3: auto's kernels (with or without sum_pv) reducing each row's tile
  // maximum over the quad first, the two halves' maxima only when a row moved (same bits)
  bool quick_max = false;
};
void set_attention_cuda_tuning(const AttentionCudaTuning& t);
AttentionCudaTuning attention_cuda_tuning();
}  // namespace detail
}  // namespace lowbit
