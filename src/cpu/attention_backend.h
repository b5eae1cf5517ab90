// Backend entry points of the attention family (SPEC §2). The front (src/cpu/attention.cpp)
// validates every argument, then calls the CPU or CUDA version; the backends assume valid input.
// Only public types appear here (the file is plain C++, included by the front and by the CUDA
// backend alike; it lives with the front, src/cpu/attention.cpp).
#pragma once

#include "lowbit/attention.h"

namespace lowbit {
namespace cpu {
void quantize_v_fp8(const TensorView& v, TensorView v_fp8, TensorView v_scale, TensorView* v_mean,
                    Context& ctx);
// sm_scale resolved (never 0 here).
void attention_int8(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                    const TensorView* v_scale, const TensorView* v_mean, const TensorView* k_mean,
                    TensorView out, TensorView* lse_out, float sm_scale,
                    const AttentionOptions& options, Context& ctx);
}  // namespace cpu
namespace cuda {
void quantize_v_fp8(const TensorView& v, TensorView v_fp8, TensorView v_scale, TensorView* v_mean,
                    Context& ctx);
void attention_int8(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                    const TensorView* v_scale, const TensorView* v_mean, const TensorView* k_mean,
                    TensorView out, TensorView* lse_out, float sm_scale,
                    const AttentionOptions& options, Context& ctx);
}  // namespace cuda
namespace detail {
// Bench-only A/B knobs of the CUDA attention kernels (not part of the public API; the default is
// what ships). i2fp: the round-3/4 kernels convert the int32 logits by I2FP instead of the
// magic-number add (bit-identical; an A/B of the XU pipe's load); fused_dequant: rounds 3 and 4
// keep the logits biased (one FADD less per logit; not bit-equal to round 3, see docs/attention.md).
// Process-wide, atomic.
struct AttentionCudaTuning {
  bool i2fp = false;
  bool fused_dequant = false;
};
void set_attention_cuda_tuning(const AttentionCudaTuning& t);
AttentionCudaTuning attention_cuda_tuning();
}  // namespace detail
}  // namespace lowbit
