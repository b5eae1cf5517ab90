// Backend entry points of the rotated quantized linear family (SPEC §3). src/core/linear.cpp
// validates every argument (dtypes, shapes, devices, rot, qtype) before calling these; the
// backends assume valid arguments. Shapes: O = out_features, K = in_features, M = input rows.
// CPU and CUDA never include each other; both implement exactly the list in
// linear_backend_api.inc (the CPU also quantizes weights).
#pragma once

#include <cstdint>

#include "lowbit/linear.h"
#include "lowbit/tensor.h"

namespace lowbit {

namespace cpu {
// Rotates `w` (O, K) f32/bf16/f16 (host, innermost contiguous) by out.rot() and fills every part
// of `out` (made by make_packed_weight for the same qtype and shape). CPU only: weights are
// quantized on the host (SPEC §3.2-3.4).
void quantize_weight(const TensorView& w, PackedWeight& out, Context& ctx);
#include "src/core/linear_backend_api.inc"  // NOLINT(build/include)
// The decode GEMV's derived tables of a host weight (PackedWeightView::decode_tiles on the CPU):
// their bytes (0: none for this qtype or CPU), and building them from w's ratios into `out`.
int64_t decode_tiles_bytes(const PackedWeightView& w);
void build_decode_tiles(const PackedWeightView& w, void* out, Context& ctx);
}  // namespace cpu

namespace cuda {
#include "src/core/linear_backend_api.inc"  // NOLINT(build/include)
// The decode kernel's device layout of a packed weight (PackedWeightView::decode_tiles): its
// bytes (0: none for this qtype / shape), and building it from w's codes and ratios into `out`
// (that many device bytes; synchronizes the stream). Returns false when the weight holds values
// the layout cannot carry: then it must not be used.
int64_t decode_tiles_bytes(const PackedWeightView& w);
bool build_decode_tiles(const PackedWeightView& w, void* out, Context& ctx);
}  // namespace cuda

}  // namespace lowbit
