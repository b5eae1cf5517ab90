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
// what ships). i2fp: the round-3/4 kernels convert the int32 logits by I2FP instead of the
// magic-number add (bit-identical; an A/B of the XU pipe's load); fused_dequant: rounds 3 and 4
// keep the logits biased (one FADD less per logit; not bit-equal to round 3, docs/attention.md);
// qk_first: round 5 (wgmma_r5) issues tile j+1's q k^T ahead of tile j's P·V (same bits);
// no_turn: rounds 5 and (with i2fp) 3 / 4 without the consumers' ping-pong turns (same bits;
// bf16 output, per-block k scales); fold2: round 5 with the P·V buffer over two tiles when no
// maximum moved (not bit-equal: longer fp8 accumulation chains; same scope). Process-wide,
// one struct under a mutex.
struct AttentionCudaTuning {
  bool i2fp = false;
  bool fused_dequant = false;
  bool qk_first = false;
  bool no_turn = false;
  bool fold2 = false;
  // with i2fp and no_turn on wgmma_r3: three consumer warpgroups (192 rows per CTA) at D = 64,
  // the TMA producer (auto's kernel at D = 64)
  bool cons3 = false;
  // fp8 P·V auto and wgmma_r3 (D 64 and 128): auto's kernels with P's row sums on the tensor
  // cores (a ones row block appended to each V tile); not bit-equal (the sums of the
  // e4m3-rounded P), launches without LSE only
  bool sum_pv = false;
};
void set_attention_cuda_tuning(const AttentionCudaTuning& t);
AttentionCudaTuning attention_cuda_tuning();
}  // namespace detail
}  // namespace lowbit
