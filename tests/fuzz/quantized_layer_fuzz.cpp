// libFuzzer target for loading quantized layers from an untrusted checkpoint: the bytes are a
// safetensors file; every layer marker it holds (lowbit or ComfyUI) is loaded with
// load_quantized_layer, and a loaded layer is dequantized and run forward on the CPU. Each step
// either works or throws lowbit::Error; any other exception, an allocation the file's own bytes
// do not justify, or a read outside a buffer (ASan) is a finding. Seeds: tests/fuzz/corpus_quant
// (one small file per qtype, written by `lowbit quantize`; docs/checkpoint-format.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "lowbit/checkpoint.h"
#include "lowbit/linear.h"

namespace {

// Dequantize and run one row forward only for layers small enough to keep the runs fast; the
// loader's own checks (the point of the target) run at any size.
constexpr int64_t kMaxWeights = int64_t{1} << 16;

void exercise(const lowbit::PackedWeight& pw) {
  const int64_t o = pw.out_features(), k = pw.in_features();
  if (o * k > kMaxWeights) return;
  lowbit::Context ctx;
  ctx.cpu_threads = 1;
  std::vector<float> w(static_cast<size_t>(o * k));
  lowbit::dequantize_weight(pw, lowbit::make_view(w.data(), lowbit::DType::f32, {o, k}), false,
                            ctx);
  lowbit::QuantizedLinear layer =
      lowbit::QuantizedLinear::from_packed(pw, lowbit::Device::cpu, ctx);
  std::vector<float> x(static_cast<size_t>(2 * k), 0.5f), y(static_cast<size_t>(2 * o));
  for (int64_t m : {int64_t{1}, int64_t{2}})
    layer.forward(lowbit::make_view(x.data(), lowbit::DType::f32, {m, k}), nullptr,
                  lowbit::make_view(y.data(), lowbit::DType::f32, {m, o}), ctx);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> buf(data, data + size);  // exactly sized: ASan sees its end
  lowbit::ReaderOptions opt;
  opt.max_header_bytes = 1 << 20;
  std::vector<lowbit::LayerMarker> markers;
  try {
    auto r = lowbit::SafetensorsReader::from_memory(buf.data(), buf.size(), "fuzz", opt);
    markers = lowbit::find_layer_markers(r);
    for (const lowbit::LayerMarker& m : markers) {
      try {
        const lowbit::PackedWeight pw = lowbit::load_quantized_layer(r, m);
        // A loaded layer holds no more bytes than the file gave it.
        if (pw.storage_bytes() > static_cast<int64_t>(size)) __builtin_trap();
        exercise(pw);
      } catch (const lowbit::Error&) {
      }
    }
  } catch (const lowbit::Error&) {
  }
  return 0;
}
