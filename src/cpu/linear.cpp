// CPU backend of the rotated quantized linear family (step 0: entry points only).
#include "src/core/check.h"
#include "src/core/linear_backend.h"

namespace lowbit {
namespace cpu {
namespace {
[[noreturn]] void not_yet(const char* op) { check::fail(op, "device", "not implemented on the CPU yet"); }
}  // namespace
void quantize_weight(const TensorView&, PackedWeight&, Context&) { not_yet("quantize_weight"); }
void hadamard_rotate(const TensorView&, int, TensorView, Context&) { not_yet("hadamard_rotate"); }
void rotate_quantize_activations(const TensorView&, QType, int, TensorView, TensorView, Context&) {
  not_yet("rotate_quantize_activations");
}
void quantized_linear_forward(const PackedWeightView&, const TensorView&, const TensorView*,
                              TensorView, Context&) {
  not_yet("QuantizedLinear::forward");
}
void quantized_linear_backward_input(const PackedWeightView&, const TensorView&, TensorView,
                                     Context&) {
  not_yet("QuantizedLinear::backward_input");
}
void dequantize_weight(const PackedWeightView&, TensorView, bool, Context&) {
  not_yet("dequantize_weight");
}
void requantize_weight(const PackedWeightView&, const TensorView&, bool, uint64_t, Context&) {
  not_yet("requantize_weight");
}
}  // namespace cpu
}  // namespace lowbit
