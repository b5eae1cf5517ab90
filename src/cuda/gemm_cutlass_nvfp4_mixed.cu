// NVFP4 (convrot4) prefill on sm_90 without a dequantized weight (session 37): CUTLASS's sm_90
// mixed-input mainloop on the checkpoint's e2m1 codes, each code dequantized with its e4m3 block
// scale in registers (the issue's "on sm_90 dequantize in the kernel").
//
// sm_90 has no fp4 MMA. Every dequantized NVFP4 value e2m1 x e4m3 is exact in f16 (at most 6
// significant bits, |v| in [2^-10, 2688]), so the GEMM runs f16 wgmma with fp32 accumulation on
// (a) the activations dequantized to f16 by the rotate kernel (pts = 1) and (b) the weight codes
// converted in the consumers' registers: the layer's sm_90 arithmetic before (both operands
// dequantized to 16 bits by separate kernels, cuBLASLt), without writing and re-reading a 16-bit
// copy of the weight per call. The tensor scale pts and the bias in the epilogue
// (gemm_cutlass_s8.cuh's compute node: ((acc · 1) · pts) + bias, pts as a per-row vector).
//
// The conversion (Nvfp4Cvt, through gemm_cutlass_mixed.cuh's ConvertA hook, as
// gemm_cutlass_s8s4_lut.cu does for int8 fold tables): CUTLASS's lookup-table mode loads, beside
// each 64-column K tile of codes, one 32-bit "scale" per weight row: its four e4m3 block scales
// (K blocks 16 wide; a (K / 64, N) copy made once per weight: nvfp4_mixed_layout_build). For the
// K block b of the tile (one f16 wgmma k16 step), a code's bits placed on an e4m3 byte are its
// value x 2^-6, one cvt makes an f16x2 of two of them, the scale byte b becomes the f16 of scale
// x 64 (cvt, then 6 added to the exponent), and one f16x2 multiply gives code x scale exactly.
// (Session 37's form looked the codes up as f16 high bytes of 256 x the value and shifted the
// scale byte into f16 bits: the same products, ~28 instead of 15 instructions per 8 codes.)
//
// Transposed as the other weight-as-A GEMMs: A = the weight (N, K), B = the f16 activations
// (M, K), D = out^T column-major. Tiles 128 x 64 (up to WeightAGemmParams::small_max_m rows),
// 128 x 128, 128 x 256 (from wide_min_m rows where it fills ~3/4 of the SMs), K tile 64,
// stream-K; bf16 and f16 output.
#ifndef NDEBUG  // before any header: see gemm_cutlass_s8.cuh
#define NDEBUG
#endif
#include <cstdint>

#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"
#include "src/cuda/linear_lut.h"

#if defined(LOWBIT_HAVE_CUTLASS)
#include "src/cuda/gemm_cutlass_mixed.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace cutlass_s8 {
namespace {

using Nvfp4Scales = cutlass::Array<uint8_t, 4>;  // a row's four block scales of one K tile

// The conversion of a K block (gemm_cutlass_mixed.cuh's ConvertA hook): e2m1 codes x e4m3 block
// scales -> f16, through e4m3 (session 38; the GEMV's conversion, linear_lut.h's e2m1x8_e4m3): a
// code's bits placed on an e4m3 byte are its value x 2^-6 exactly, one cvt turns a pair of such
// bytes into an f16x2, and the block scale as f16 x 64 (cvt of the scale byte, then 6 added to
// each half's exponent: exact, <= 448 x 64) restores the value in the same multiply, so every
// product is code x scale exactly, the f16 the session-37 lookup form gave (15 instead of ~28
// instructions per 8 codes).
struct Nvfp4Cvt {
  // f16x2 of a pair of e4m3 bytes (bits 0..15 of `two_bytes`).
  CUTLASS_DEVICE static uint32_t e4m3x2_f16x2(uint32_t two_bytes) {
    uint32_t h = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890  // (the kernel exists in sm_90a code only)
    asm("{\n.reg .b16 l;\ncvt.u16.u32 l, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}\n"
        : "=r"(h)
        : "r"(two_bytes));
#endif
    return h;
  }
  // The f16x2 pair (s, s) x 64 of byte b of a row's four e4m3 block scales (positive, so the
  // f16 is normal: >= 2^-9; adding 6 to the exponent field multiplies by 64 exactly).
  CUTLASS_DEVICE static uint32_t scale_f16x2_x64(uint32_t scales, int b) {
    const uint32_t pair = __byte_perm(scales, 0u, static_cast<uint32_t>(b | (b << 4)));
    return e4m3x2_f16x2(pair) + 0x18001800u;
  }
  CUTLASS_DEVICE static uint32_t mul_f16x2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
  }

  template <class Base, class TLoad, class TMma, class Extra>
  CUTLASS_DEVICE static void convert(TLoad const& tCrA_load, TMma& tCrA_mma, Extra& extra,
                                     int const k_block) {
    using namespace cute;
    static_assert(sizeof_bits_v<typename TLoad::value_type> == 4, "e2m1 codes expected");
    static_assert(sizeof_bits_v<typename TMma::value_type> == 16, "f16 operand expected");
    Tensor src = tCrA_load(_, _, k_block);
    Tensor dst = tCrA_mma(_, _, k_block);
    // Eight codes (one register) per step: values 2j and 2j + 1 of a step share a weight row
    // (wgmma's A fragment: k pairs of one row), so one scale per f16x2 pair.
    static_assert(decltype(size(src(_, 0)))::value % 8 == 0, "8 codes per register expected");
    Tensor src_s = group_modes<1, -1>(zipped_divide(src, Int<8>{}));
    Tensor dst_s = group_modes<1, -1>(zipped_divide(dst, Int<8>{}));
    Tensor scales = get<1>(extra)(_, _, k_block);  // loaded from shared memory at k_block 0
    Tensor scales_s = group_modes<1, -1>(zipped_divide(scales, Int<8>{}));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<1>(dst_s); ++i) {
      const uint32_t word = cute::recast<uint32_t>(src_s(_, i))(0);
      auto&& out = cute::recast<cutlass::Array<uint32_t, 4>>(dst_s(_, i))(0);
      uint32_t even, odd;  // e4m3 bytes of codes 0, 2, 4, 6 and 1, 3, 5, 7
      e2m1x8_e4m3(word, &even, &odd);
      const uint32_t lo = __byte_perm(even, odd, 0x5140u);  // codes 0, 1, 2, 3
      const uint32_t hi = __byte_perm(even, odd, 0x7362u);  // codes 4, 5, 6, 7
      const uint32_t h[4] = {e4m3x2_f16x2(lo), e4m3x2_f16x2(lo >> 16), e4m3x2_f16x2(hi),
                             e4m3x2_f16x2(hi >> 16)};
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        const uint32_t sc = reinterpret_cast<uint32_t const&>(scales_s(2 * j, i));
        out[j] = mul_f16x2(h[j], scale_f16x2_x64(sc, k_block));
      }
    }
  }
};

}  // namespace
}  // namespace cutlass_s8
}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
#endif  // LOWBIT_HAVE_CUTLASS

namespace lowbit {
namespace cuda {
namespace linear {

namespace {
constexpr int64_t kNvfp4KTile = 64;
int64_t nvfp4_scales_ld(int64_t N) { return (N + 3) / 4 * 4; }  // 16-byte group rows
int64_t nvfp4_pts_offset(int64_t N, int64_t K) {
  return (K / kNvfp4KTile * nvfp4_scales_ld(N) * 4 + 255) / 256 * 256;
}

// One thread per (K tile g, row n < ld): the row's block scales 4g .. 4g + 3 as one word; rows
// past N zero. Thread (0, n < N) also writes pts[n].
__global__ void nvfp4_layout_kernel(const uint8_t* block_scales, const float* pts, int64_t N,
                                    int64_t K, int64_t ld, int64_t count, uint32_t* scales,
                                    float* pts_rows) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= count) return;
  const int64_t g = idx / ld, n = idx - g * ld;
  uint32_t w = 0;
  if (n < N) {
    const uint8_t* b = block_scales + n * (K / 16) + 4 * g;
    w = b[0] | (static_cast<uint32_t>(b[1]) << 8) | (static_cast<uint32_t>(b[2]) << 16) |
        (static_cast<uint32_t>(b[3]) << 24);
    if (g == 0) pts_rows[n] = *pts;
  }
  scales[idx] = w;
}
}  // namespace

#if defined(LOWBIT_HAVE_CUTLASS)

namespace {

using namespace cute;

template <class Tile, class Out>
using Nvfp4Config = cutlass_s8::WeightAConfig<cutlass::uint4b_t, Tile, Out, cutlass_s8::Nvfp4Scales,
                                              cutlass_s8::UseConvertA<cutlass_s8::Nvfp4Cvt>,
                                              cutlass::half_t, float>;
template <class Out>
using Nvfp4Small = Nvfp4Config<Shape<_128, _64, _64>, Out>;
template <class Out>
using Nvfp4Narrow = Nvfp4Config<Shape<_128, _128, _64>, Out>;
template <class Out>
using Nvfp4Wide = Nvfp4Config<Shape<_128, _256, _64>, Out>;

// f16 activations (lda elements, 16-byte rows), the (K / 64, ld) scale words, 64-column tiles.
bool mixed_fits(const WeightAGemmParams& p) {
  return cutlass_s8::weight_a_fits(p, 2) && p.w_lut && p.w_lut_group == kNvfp4KTile &&
         p.K % kNvfp4KTile == 0 && p.w_lut_ld >= p.N && p.w_lut_ld % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(p.w_lut) & 15u) == 0 && p.w_scale;
}

using Mixed = cutlass_s8::WeightAEntry<Nvfp4Small, Nvfp4Narrow, Nvfp4Wide, mixed_fits>;

}  // namespace

int64_t nvfp4_mixed_layout_bytes(int64_t N, int64_t K) {
  if (N < 1 || K < kNvfp4KTile || K % kNvfp4KTile) return 0;
  return nvfp4_pts_offset(N, K) + N * 4;
}

bool cutlass_nvfp4_mixed_applies(const WeightAGemmParams& p) { return Mixed::applies(p); }
size_t cutlass_nvfp4_mixed_scratch_bytes(const WeightAGemmParams& p) {
  return Mixed::scratch_bytes(p);
}
bool gemm_cutlass_nvfp4_mixed(const WeightAGemmParams& p, void* scratch, cudaStream_t stream) {
  return Mixed::run(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

int64_t nvfp4_mixed_layout_bytes(int64_t, int64_t) { return 0; }
bool cutlass_nvfp4_mixed_applies(const WeightAGemmParams&) { return false; }
size_t cutlass_nvfp4_mixed_scratch_bytes(const WeightAGemmParams&) { return 0; }
bool gemm_cutlass_nvfp4_mixed(const WeightAGemmParams&, void*, cudaStream_t) { return false; }

#endif

bool nvfp4_mixed_layout_build(const uint8_t* block_scales, const float* pts, int64_t N, int64_t K,
                              uint8_t* out, cudaStream_t stream) {
  if (nvfp4_mixed_layout_bytes(N, K) == 0) return false;
  const int64_t ld = nvfp4_scales_ld(N), count = K / kNvfp4KTile * ld;
  nvfp4_layout_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, stream>>>(
      block_scales, pts, N, K, ld, count, reinterpret_cast<uint32_t*>(out),
      reinterpret_cast<float*>(out + nvfp4_pts_offset(N, K)));
  check_launch("nvfp4_mixed_layout_build");
  return true;
}

void nvfp4_mixed_layout_parts(const uint8_t* layout, int64_t N, int64_t K, WeightAGemmParams* p) {
  p->w_lut = layout;
  p->w_lut_ld = nvfp4_scales_ld(N);
  p->w_lut_group = kNvfp4KTile;
  p->w_scale = reinterpret_cast<const float*>(layout + nvfp4_pts_offset(N, K));
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
