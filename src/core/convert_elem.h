// Per-element load/store through fp32 for the convert op; shared by the CPU and CUDA backends so
// both give the same bits.
#pragma once

#include <cstdint>

#include "lowbit/dtype.h"
#include "lowbit/tensor.h"

namespace lowbit {

LOWBIT_HD float load_f32(const void* base, int64_t off, DType dt) {
  switch (dt) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::f16: return dt::f16_to_f32(static_cast<const uint16_t*>(base)[off]);
    case DType::bf16: return dt::bf16_to_f32(static_cast<const uint16_t*>(base)[off]);
    case DType::e4m3: return dt::e4m3_to_f32(static_cast<const uint8_t*>(base)[off]);
    case DType::e5m2: return dt::e5m2_to_f32(static_cast<const uint8_t*>(base)[off]);
    case DType::i8: return static_cast<float>(static_cast<const int8_t*>(base)[off]);
    case DType::e2m1x2: return dt::e2m1_to_f32(dt::get_nibble(static_cast<const uint8_t*>(base), off));
    case DType::i4x2:
      return static_cast<float>(dt::i4_code_to_int(dt::get_nibble(static_cast<const uint8_t*>(base), off)));
    default: return 0.f;
  }
}

// Code of v in a 4-bit packed dtype.
LOWBIT_HD uint8_t nibble_code(float v, DType dt) {
  return dt == DType::e2m1x2 ? dt::f32_to_e2m1(v) : dt::f32_to_i4_code(v);
}

// Stores v into a non-packed dtype.
LOWBIT_HD void store_f32(void* base, int64_t off, DType dt, float v) {
  switch (dt) {
    case DType::f32: static_cast<float*>(base)[off] = v; break;
    case DType::f16: static_cast<uint16_t*>(base)[off] = dt::f32_to_f16(v); break;
    case DType::bf16: static_cast<uint16_t*>(base)[off] = dt::f32_to_bf16(v); break;
    case DType::e4m3: static_cast<uint8_t*>(base)[off] = dt::f32_to_e4m3(v); break;
    case DType::e5m2: static_cast<uint8_t*>(base)[off] = dt::f32_to_e5m2(v); break;
    case DType::i8: static_cast<int8_t*>(base)[off] = dt::f32_to_i8(v); break;
    default: break;
  }
}

}  // namespace lowbit
