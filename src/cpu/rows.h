// Row kernels shared by the CPU backends. Rows of 16-bit floats to and from f32: AVX2 + F16C
// where the CPU has them, else scalar loops; the bits of dt::f16_to_f32 / dt::f32_to_f16 /
// dt::f32_to_bf16 either way (NaN in: its payload; NaN out: 0x7fff).
#pragma once

#include <cstdint>

#include "lowbit/tensor.h"

namespace lowbit {
namespace cpu {
namespace rows {

void f16_to_f32(const uint16_t* src, int64_t n, float* dst);
void f32_to_f16(const float* src, int64_t n, uint16_t* dst);
void f32_to_bf16(const float* src, int64_t n, uint16_t* dst);
// o[i] += p * v[i], i < n: one rounded product, one rounded sum per element (no contraction; a
// vectorized clone where the CPU has AVX2, the same bits).
void add_scaled(float* o, float p, const float* v, int64_t n);
// The 256 values of e4m3 (dt::e4m3_to_f32 of every code), for per-element decodes.
const float* e4m3_table();
// A row of n elements of dtype dt at element offset off of base, as f32: load_f32's bits
// (src/core/convert_elem.h), the dtype dispatched once per row (f16 by the kernel above, e4m3 by
// the table). Non-packed dtypes.
void load(const void* base, int64_t off, DType dt, int64_t n, float* out);
// store_f32 of src[i] at element offset off + i of base, i < n (f32 may be in place; f16 and
// bf16 by the kernels above). Non-packed dtypes.
void store(const float* src, int64_t n, DType dt, void* base, int64_t off);
// Tests: force the scalar loops (to compare the two).
void force_scalar(bool on);

}  // namespace rows
}  // namespace cpu
}  // namespace lowbit
