// Register-level unpacking of stored weight codes onto the row's int8 grid (SPEC §3.3), shared by
// the unpack kernel (prefill) and the fused decode kernel, so both feed the same int8 codes to the
// int32 accumulation.
#pragma once

#include <cstdint>

#include "lowbit/dtype.h"
#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {
namespace linear {

// Fold of a group-scaled n-bit code onto the int8 grid: clamp(rint(code * ratio), -127, 127),
// fp32 product without contraction.
// cvt.rni rounds half to even and maps NaN to 0 like dt::f32_to_int_clamped, whose integer clamp
// follows: the same codes in five instructions instead of a software rint.
__device__ __forceinline__ int32_t fold_code(int32_t code, float ratio) {
  const int32_t r = __float2int_rn(__fmul_rn(static_cast<float>(code), ratio));
  return max(-127, min(127, r));
}

__device__ __forceinline__ uint32_t pack4(int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  return (static_cast<uint32_t>(c0) & 0xffu) | ((static_cast<uint32_t>(c1) & 0xffu) << 8) |
         ((static_cast<uint32_t>(c2) & 0xffu) << 16) | ((static_cast<uint32_t>(c3) & 0xffu) << 24);
}

// The 16 int8-grid codes of weight row n, columns [k, k + 16) (k % 16 == 0), as 4 words (code
// k + 4j + b in byte b of word j).
__device__ __forceinline__ void unpack16(const PackedWeightRef& w, int64_t n, int64_t k,
                                         uint32_t out[4]) {
  const uint8_t* row = w.codes + n * w.row_bytes;
  int32_t c[16];
  switch (w.format) {
    case WeightFormat::int8: {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + k));
      out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
      return;
    }
    case WeightFormat::comfy_int4: {
      // Four bytes per step: sign-extend the low and high nibbles bytewise ((u ^ 8) - 8), then
      // interleave them back into column order (byte b holds columns 2b and 2b + 1).
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + k / 2));
      const uint32_t words[2] = {v.x, v.y};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t lo = __vsub4((words[h] & 0x0f0f0f0fu) ^ 0x08080808u, 0x08080808u);
        const uint32_t hi = __vsub4(((words[h] >> 4) & 0x0f0f0f0fu) ^ 0x08080808u, 0x08080808u);
        out[2 * h] = __byte_perm(lo, hi, 0x5140);
        out[2 * h + 1] = __byte_perm(lo, hi, 0x7362);
      }
      return;  // comfy weights carry one row scale: no fold
    }
    case WeightFormat::packed: {
      const int bits = w.bits;
      const int32_t qmax = (1 << (bits - 1)) - 1;
      const uint8_t* p = row + (k / 8) * bits;
      if (bits == 4 || bits == 2) {  // 32-bit words hold whole runs of codes
        uint32_t word[2];
        if (bits == 4) {
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
          word[0] = v.x, word[1] = v.y;
        } else {
          const uint32_t v = __ldg(reinterpret_cast<const uint32_t*>(p));
          word[0] = v, word[1] = v >> 16;
        }
        const uint32_t mask = (1u << bits) - 1u;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          c[j] = static_cast<int32_t>((word[j >> 3] >> ((j & 7) * bits)) & mask) - qmax;
      } else {
        const uint64_t mask = (uint64_t{1} << bits) - 1u;
        uint64_t word[2];
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          uint64_t acc = 0;
          for (int b = 0; b < bits; ++b)
            acc |= static_cast<uint64_t>(__ldg(p + g * bits + b)) << (8 * b);
          word[g] = acc;
        }
#pragma unroll
        for (int j = 0; j < 16; ++j)
          c[j] = static_cast<int32_t>((word[j >> 3] >> ((j & 7) * bits)) & mask) - qmax;
      }
      break;
    }
    default: {  // ternary: code k at byte k / 5, base-3 digit k % 5, u = c + 1
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t kk = k + j;
        const int b = __ldg(row + kk / 5);
        const int d = static_cast<int>(kk % 5);
        const int div = d == 0 ? 1 : (d == 1 ? 3 : (d == 2 ? 9 : (d == 3 ? 27 : 81)));
        c[j] = (b / div) % 3 - 1;
      }
    }
  }
  if (w.ratios) {
    const float ratio = __ldg(w.ratios + n * w.groups_per_row + (k >> w.group_shift));
#pragma unroll
    for (int j = 0; j < 16; ++j) c[j] = fold_code(c[j], ratio);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = pack4(c[4 * j], c[4 * j + 1], c[4 * j + 2], c[4 * j + 3]);
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
