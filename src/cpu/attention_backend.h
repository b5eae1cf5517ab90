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
  // 16-bit P·V on the TMA-ring kernel (auto / wgmma_r3) at D = 64: 3 forces three consumer
  // warpgroups (192 rows per CTA, the default until session 14), 4 four (256 rows, 112 registers
  // each; the default since H200 run 48), 0 the default
  int ring_cons = 0;
  // attention(): the q prologue, the k path and V's passes one after another on the caller's
  // stream (before session 21) instead of on side streams beside each other
  bool serial_passes = false;
  // Causal CTA order (session 25): heads per group of the longest-first walk across heads
  // (attn::cta_work); 1 = each head's query blocks longest-first, the heads in order (the order
  // before session 25); 0 = by L2 size (the groups' K / V ~30 MB). The same bits.
  int causal_heads = 0;
  // Bench only: a device buffer of kAttentionTraceWords words per CTA for round 3's per-CTA
  // stamps (see attention_wgmma.cu, r3_trace), or null.
  unsigned long long* trace = nullptr;
  // Round 3 without turns at D = 128 (auto's fp8 P·V kernel): 1 the output rows stored from
  // registers (4-byte stores), 2 through the consumers' Q rows in shared memory as 16-byte row
  // stores (session 26), 0 the default (kAttnStagedEpilogue in attention.cu). The same bits.
  int epilogue = 0;
  // The same kernel (with the staged epilogue), the bench's A/B: true releases each ring stage by
  // each consumer warp's lane 0 after __syncwarp (the form before session 27), false by every
  // consumer thread (the default). The same bits.
  bool lane0_release = false;
  // attention_varlen: every sequence a call of its own (the form before session 50) instead of
  // runs of equal lengths as batches. The same bits.
  bool varlen_each = false;
};
constexpr int kAttentionTraceWords = 16;
void set_attention_cuda_tuning(const AttentionCudaTuning& t);
AttentionCudaTuning attention_cuda_tuning();
}  // namespace detail
}  // namespace lowbit
