// CPU convert: one pass over the elements, multi-threaded.
#include "src/core/backends.h"
#include "src/core/convert_elem.h"
#include "src/core/indexing.h"
#include "src/core/parallel.h"

namespace lowbit {
namespace cpu {

void convert(const TensorView& src, TensorView dst, Context& ctx) {
  const StridedIndex si = flat_index_of(src), di = flat_index_of(dst);
  const int64_t n = src.numel();
  if (dtype_is_packed(dst.dtype)) {  // contiguous, even: one output byte per pair
    auto* out = static_cast<uint8_t*>(dst.data);
    parallel_for(n / 2, 1 << 14, ctx, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        uint8_t lo = nibble_code(load_f32(src.data, element_offset(si, 2 * p), src.dtype), dst.dtype);
        uint8_t hi = nibble_code(load_f32(src.data, element_offset(si, 2 * p + 1), src.dtype), dst.dtype);
        out[p] = static_cast<uint8_t>(lo | (hi << 4));
      }
    });
    return;
  }
  parallel_for(n, 1 << 14, ctx, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      store_f32(dst.data, element_offset(di, i), dst.dtype,
                load_f32(src.data, element_offset(si, i), src.dtype));
  });
}

}  // namespace cpu
}  // namespace lowbit
