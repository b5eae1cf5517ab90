// libFuzzer target for the safetensors parser: any byte string either parses, or is rejected
// with lowbit::Error; a parsed file's every tensor is touched end to end (ASan catches any read
// outside the buffer). Build: cmake -DLOWBIT_BUILD_FUZZERS=ON -DCMAKE_CXX_COMPILER=clang++ ...
// Run:   build-fuzz/safetensors_fuzz -max_total_time=60 tests/fuzz/corpus/
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lowbit/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exactly-sized heap buffer so ASan sees its end.
  std::vector<uint8_t> buf(data, data + size);
  lowbit::ReaderOptions opt;
  opt.max_header_bytes = 1 << 20;
  try {
    auto r = lowbit::SafetensorsReader::from_memory(buf.data(), buf.size(), "fuzz", opt);
    volatile uint32_t sum = 0;
    for (const auto& t : r.tensors()) {
      const uint8_t* p = r.data(t);
      for (uint64_t i = 0; i < t.nbytes(); ++i) sum = sum + p[i];
      if (t.nbytes() != static_cast<uint64_t>(t.numel()) *
                            static_cast<uint64_t>(lowbit::file_dtype_size(t.dtype)))
        __builtin_trap();
      lowbit::DType dt;
      if (lowbit::file_dtype_to_dtype(t.dtype, &dt) && t.shape.size() <= 6) (void)r.view(t);
    }
    for (const auto& kv : r.metadata()) sum = sum + static_cast<uint32_t>(kv.second.size());
  } catch (const lowbit::Error&) {
  }
  return 0;
}
