// libFuzzer target for loading quantized layers from an untrusted checkpoint: the bytes are a
// safetensors file; every layer marker it holds (lowbit or ComfyUI) is loaded with
// load_quantized_layer, and a loaded layer is dequantized and run forward on the CPU with each
// kernel set the machine has (its best, AVX2, scalar). Each step either works or throws
// lowbit::Error; any other exception, an allocation the file's own bytes do not justify, a read
// outside a buffer (ASan) or kernel sets that disagree in one output bit is a finding. Seeds:
// tests/fuzz/corpus_quant (one small file per qtype, written by `lowbit quantize`;
// docs/checkpoint-format.md).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lowbit/checkpoint.h"
#include "lowbit/linear.h"
#include "src/cpu/linear_gemv.h"
#include "src/cpu/linear_kernels.h"
#include "src/cpu/rows.h"

namespace {

// Dequantize and run rows forward only for layers small enough to keep the runs fast; the
// loader's own checks (the point of the target) run at any size.
constexpr int64_t kMaxWeights = int64_t{1} << 16;

// The CPU kernel sets a machine can run: 0 its best (AVX-512 VBMI GEMV, AMX / VNNI GEMMs where
// present), 1 the AVX2 kernels forced, 2 the scalar loops. Each must give the same bits.
void kernels(int set) {
  namespace cv = lowbit::cpu::convrot;
  cv::force_avx2_kernels(set == 1);
  lowbit::cpu::rows::force_avx2(set == 1);
  cv::force_scalar_kernels(set == 2);
  cv::force_gemv_off(set == 2);
  lowbit::cpu::rows::force_scalar(set == 2);
}

void exercise(const lowbit::PackedWeight& pw) {
  const int64_t o = pw.out_features(), k = pw.in_features();
  if (o * k > kMaxWeights) return;
  lowbit::Context ctx;
  ctx.cpu_threads = 1;
  std::vector<float> w(static_cast<size_t>(o * k));
  lowbit::dequantize_weight(pw, lowbit::make_view(w.data(), lowbit::DType::f32, {o, k}), false,
                            ctx);
  // Rows 1 and 3 (3: past the GEMV's single row) through every kernel set; outputs compared bit
  // for bit (NaN against NaN).
  std::vector<float> x(static_cast<size_t>(3 * k)), ys[3];
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  for (int set = 0; set < 3; ++set) {
    kernels(set);
    lowbit::QuantizedLinear layer =
        lowbit::QuantizedLinear::from_packed(pw, lowbit::Device::cpu, ctx);
    for (int64_t m : {int64_t{1}, int64_t{3}}) {
      std::vector<float> y(static_cast<size_t>(m * o));
      layer.forward(lowbit::make_view(x.data(), lowbit::DType::f32, {m, k}), nullptr,
                    lowbit::make_view(y.data(), lowbit::DType::f32, {m, o}), ctx);
      ys[set].insert(ys[set].end(), y.begin(), y.end());
    }
  }
  kernels(0);
  for (int set = 1; set < 3; ++set)
    for (size_t i = 0; i < ys[0].size(); ++i) {
      const float a = ys[0][i], b = ys[set][i];
      if (std::memcmp(&a, &b, sizeof a) != 0 && !(std::isnan(a) && std::isnan(b))) __builtin_trap();
    }
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
