// libFuzzer target for `lowbit quantize` and `lowbit dequantize` on an untrusted checkpoint: the
// first byte picks the qtype (and, for convrotcomfyw4a4, the ComfyUI format), the rest is a
// safetensors file. quantize_checkpoint either throws lowbit::Error (and writes nothing) or
// writes a file that must read back: every layer marker in it loads (load_quantized_layer), and
// dequantize_checkpoint restores a file with the input's tensors, names, order and shapes, every
// tensor not quantized byte for byte, every quantized weight in its source dtype (lowbit format)
// or bf16 (ComfyUI). Anything else — another exception, an error on our own output, a file left
// behind after an error, an ASan report — is a finding. Seeds: tests/fuzz/corpus_roundtrip (small
// f32 / bf16 / f16 checkpoints with linear weights; the first byte of each names its qtype).
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "lowbit/checkpoint.h"
#include "lowbit/linear.h"

namespace {

char g_dir[] = "/tmp/lowbit-roundtrip-fuzz-XXXXXX";

std::string path(const char* name) { return std::string(g_dir) + "/" + name; }

void remove_scratch() {
  for (const char* f : {"in.safetensors", "q.safetensors", "back.safetensors"})
    std::remove(path(f).c_str());
  ::rmdir(g_dir);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool ready = [] {
    if (!::mkdtemp(g_dir)) std::abort();
    std::atexit(remove_scratch);
    return true;
  }();
  (void)ready;
  if (size < 1) return 0;
  const auto qtype = static_cast<lowbit::QType>(data[0] % lowbit::kNumQTypes);
  const std::string in = path("in.safetensors"), q = path("q.safetensors"),
                    back = path("back.safetensors");
  std::remove(q.c_str());
  std::remove(back.c_str());
  {
    std::ofstream f(in, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  lowbit::Context ctx;
  ctx.cpu_threads = 1;
  lowbit::QuantizeOptions qo;
  qo.writer.fsync = false;
  if (qtype == lowbit::QType::convrot_comfy_w4a4 && (data[0] / lowbit::kNumQTypes) % 2)
    qo.format = lowbit::CheckpointFormat::comfy;
  lowbit::QuantizeReport report;
  try {
    report = lowbit::quantize_checkpoint(in, q, qtype, qo, ctx);
  } catch (const lowbit::Error&) {
    if (exists(q)) __builtin_trap();  // nothing written on an error
    return 0;
  }
  // Our own output reads back.
  lowbit::ReaderOptions ro;
  ro.max_header_bytes = 1 << 24;
  const lowbit::SafetensorsReader in_file(in, ro), q_file(q, ro);
  for (const lowbit::LayerMarker& m : lowbit::find_layer_markers(q_file))
    (void)lowbit::load_quantized_layer(q_file, m);
  lowbit::DequantizeOptions dqo;
  dqo.writer.fsync = false;
  (void)lowbit::dequantize_checkpoint(q, back, dqo, ctx);
  const lowbit::SafetensorsReader back_file(back, ro);
  const auto& a = in_file.tensors();
  const auto& b = back_file.tensors();
  if (a.size() != b.size()) __builtin_trap();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape) __builtin_trap();
    bool quantized = false;
    for (const lowbit::LayerReport& l : report.layers)
      quantized |= l.quantized && l.name == a[i].name;
    if (quantized) {
      const lowbit::FileDType want =
          qo.format == lowbit::CheckpointFormat::comfy ? lowbit::FileDType::bf16 : a[i].dtype;
      if (b[i].dtype != want) __builtin_trap();
    } else if (a[i].dtype != b[i].dtype || a[i].nbytes() != b[i].nbytes() ||
               std::memcmp(in_file.data(a[i]), back_file.data(b[i]), a[i].nbytes()) != 0) {
      __builtin_trap();
    }
  }
  return 0;
}
