// CPU convert: one pass over the elements, multi-threaded. Tensors whose rows (innermost
// dimension) are contiguous on both sides go row chunk by row chunk through an f32 buffer with
// the row kernels (F16C / AVX2 where the CPU has them); the rest element by element. Both give
// the bits of load_f32 / store_f32 (src/core/convert_elem.h).
#include <algorithm>

#include "src/core/backends.h"
#include "src/core/convert_elem.h"
#include "src/core/indexing.h"
#include "src/core/parallel.h"
#include "src/cpu/rows.h"

namespace lowbit {
namespace cpu {
namespace {

constexpr int64_t kChunk = 2048;  // elements per buffer pass (8 KB of f32)

}  // namespace

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
  // Rows: both sides flat, or both with a unit innermost stride (the innermost dimension a row).
  const bool flat = si.ndim == 1 && di.ndim == 1 && si.stride[0] == 1 && di.stride[0] == 1;
  const bool rowwise = !dtype_is_packed(src.dtype) && n > 0 &&
                       (flat || (src.ndim >= 1 && src.stride[src.ndim - 1] == 1 &&
                                 dst.stride[dst.ndim - 1] == 1));
  if (rowwise) {
    const int64_t inner = flat ? n : src.shape[src.ndim - 1];
    const int64_t chunks = (inner + kChunk - 1) / kChunk;  // per row
    const StridedIndex so = strided_index_of(src), dof = strided_index_of(dst);
    parallel_for(n / inner * chunks, std::max<int64_t>(1, (1 << 15) / kChunk), ctx,
                 [&](int64_t b, int64_t e) {
                   float buf[kChunk];
                   for (int64_t u = b; u < e; ++u) {
                     const int64_t row = u / chunks, c0 = (u % chunks) * kChunk;
                     const int64_t len = std::min(kChunk, inner - c0);
                     const int64_t lin = row * inner + c0;
                     const int64_t s_off = flat ? lin : element_offset(so, lin);
                     const int64_t d_off = flat ? lin : element_offset(dof, lin);
                     rows::load(src.data, s_off, src.dtype, len, buf);
                     rows::store(buf, len, dst.dtype, dst.data, d_off);
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
