// Backend entry points of the decode family (include/lowbit/decode.h). The front
// (src/cpu/decode_api.cpp) validates every argument, then calls these; they assume valid input.
#pragma once

#include <vector>

#include "lowbit/decode.h"

namespace lowbit {

// Partial results of a merge, already validated: n parts of `rows` rows of `head_dim` values.
// Each part's leading dims (all but D) are indexed in row-major order through its own strides.
struct MergeArgs {
  std::vector<TensorView> outs;  // n x (..., D)
  std::vector<TensorView> lses;  // n x (...) f32
  TensorView out;                // (..., D)
  TensorView lse;                // (...) f32; data null = not written
  int64_t rows = 0;
  int head_dim = 0;
};
struct MergeBackwardArgs {
  MergeArgs fwd;                       // outs, lses, out, lse (lse required)
  TensorView grad_out;                 // (..., D)
  TensorView grad_lse;                 // (...) f32; data null = zero
  std::vector<TensorView> grad_outs;   // n x (..., D)
  std::vector<TensorView> grad_lses;   // n x (...) f32
};

namespace cpu {
#include "src/core/decode_backend_api.inc"  // NOLINT(build/include)
}  // namespace cpu

namespace cuda {
int decode_multiprocessors();
// KV heads per CTA of the bulk kernel on this device for `cache` (0: it does not apply).
int decode_bulk_heads_of(const KvCache& cache);
#include "src/core/decode_backend_api.inc"  // NOLINT(build/include)
}  // namespace cuda

// Workspace layout shared by both backends: partial outputs (B, Hkv, S, R, D) f32 then partial
// LSEs (B, Hkv, S, R) f32, R = Mq * G rows ordered (m, g).
inline int64_t decode_partial_out_elems(const DecodePlan& p) {
  return p.batch * p.kv_heads * p.n_splits * static_cast<int64_t>(p.mq) * p.group * p.head_dim;
}
inline int64_t decode_partial_lse_elems(const DecodePlan& p) {
  return p.batch * p.kv_heads * p.n_splits * static_cast<int64_t>(p.mq) * p.group;
}

}  // namespace lowbit
