// convrotint4 prefill without an unpacked weight (session 37): CUTLASS's sm_90 mixed-input
// mainloop on the checkpoint's packed 4-bit codes, each code turned into the row's int8-grid
// value (SPEC §3.3: code8 = clamp(rint(c · ratio_g), ±127)) by its (row, group) fold table in
// registers.
//
// The codes are stored offset, u = c + 7 in 0..14, eight to a little-endian 32-bit word with the
// even column in the low nibble: CUTLASS's K-major `int4b_t` packing (the nibble values are only
// table indices here). CUTLASS's lookup-table conversion (ConvertAndScale with an 8-byte array as
// the scale type) picks each byte from two 8-entry tables by bit 3 of the nibble: `hi` for u >= 8
// (c = u - 7 = 1..8) and `lo` for u < 8 (c = -7..0), indexed by its low three bits. Its own
// tables are fp8 (the `lo` table derived from `hi` by flipping sign bits); this file replaces
// the conversion through gemm_cutlass_mixed.cuh's ConvertA hook (FoldLut below) so that the same
// lookups run on int8 tables: the stored table (one per weight row and K group of 128, from
// decode_tiles_gemm_lut) is hi[i] = fold(i + 1), i = 0..6, hi[7] = 0; lo[u] = -fold(7 - u) =
// -hi[6 - u] for u <= 6 and lo[7] = 0, derived once per K tile with one prmt and a bytewise
// negation per register (the fold table is odd: fold(-m) = -fold(m), which decode_tiles_build
// checks). The int8 wgmma then sums exactly the products of the unpacked path, so the epilogue
// (gemm_cutlass_s8.cuh's, broadcasts swapped as in gemm_cutlass_s8s4.cu) gives the same bits.
//
// The GEMM is transposed as the comfy one (the weight is wgmma's register operand A): A = the
// weight (N, K), B = the activation codes (M, K), D = out^T column-major. Tiles 128 x 64 (up to
// WeightAGemmParams::small_max_m rows), 128 x 128 and 128 x 256 (from wide_min_m rows where it
// fills ~3/4 of the SMs), stream-K (gemm_cutlass_mixed.cuh).
#ifndef NDEBUG  // before any header: see gemm_cutlass_s8.cuh
#define NDEBUG
#endif
#include <cstdint>

#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"

#if defined(LOWBIT_HAVE_CUTLASS)
#include "src/cuda/gemm_cutlass_mixed.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace cutlass_s8 {
namespace {

using FoldTable = cutlass::Array<int8_t, 8>;

// The conversion of a K block (gemm_cutlass_mixed.cuh's ConvertA hook): CUTLASS's own lookups on
// int8 tables, `hi` loaded, `lo` derived from it at the K tile's first block.
struct FoldLut {
  // lo = -(hi's bytes 6, 5, ..., 0) and a zero (hi[7] = 0; every hi byte in [0, 127], so the
  // bytewise negation (0x80 - y) ^ 0x80 never borrows).
  CUTLASS_DEVICE static void lo_from_hi(uint32_t h0, uint32_t h1, uint32_t& l0, uint32_t& l1) {
    const uint32_t r0 = __byte_perm(h0, h1, 0x3456), r1 = __byte_perm(h0, h1, 0x7012);
    l0 = (0x80808080u - r0) ^ 0x80808080u;
    l1 = (0x80808080u - r1) ^ 0x80808080u;
  }

  template <class Base, class TLoad, class TMma, class Extra>
  CUTLASS_DEVICE static void convert(TLoad const& tCrA_load, TMma& tCrA_mma, Extra& extra,
                                     int const k_block) {
    using namespace cute;
    static_assert(sizeof_bits_v<typename TLoad::value_type> == 4, "4-bit codes expected");
    static_assert(sizeof_bits_v<typename TMma::value_type> == 8, "int8 operand expected");
    Tensor src = tCrA_load(_, _, k_block);
    Tensor dst = tCrA_mma(_, _, k_block);
    // Steps of up to eight codes (one 32-bit register of the first, contiguous mode).
    constexpr int kStep = cute::min(decltype(size(src(_, 0)))::value, 8);
    Tensor src_s = group_modes<1, -1>(zipped_divide(src, Int<kStep>{}));
    Tensor dst_s = group_modes<1, -1>(zipped_divide(dst, Int<kStep>{}));
    Tensor hi = get<1>(extra)(_, _, k_block);  // loaded from shared memory at k_block 0
    auto&& lo_all = get<2>(extra);             // derived here, kept for the tile's K blocks
    Tensor lo = lo_all(_, _, k_block);
    Base::static_check_scale(hi);
    Tensor hi_s = group_modes<1, -1>(zipped_divide(hi, Int<kStep>{}));
    Tensor lo_s = group_modes<1, -1>(zipped_divide(lo, Int<kStep>{}));
    if (k_block == 0) {
      Tensor hi_d = filter(hi_s);
      Tensor lo_d = filter(lo_s);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(hi_d.layout()); ++i) {
        auto const& h = reinterpret_cast<cutlass::Array<uint32_t, 2> const&>(hi_d(i));
        auto& l = reinterpret_cast<cutlass::Array<uint32_t, 2>&>(lo_d(i));
        lo_from_hi(h[0], h[1], l[0], l[1]);
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<1>(dst_s); ++i) {
      Base::lookup_table_convert(src_s(_, i), dst_s(_, i), hi_s(_, i), lo_s(_, i));
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

#if defined(LOWBIT_HAVE_CUTLASS)

namespace {

using namespace cute;

template <class Out>
using LutNarrow =
    cutlass_s8::WeightAConfig<cutlass::int4b_t, Shape<_128, _128, _128>, Out,
                              cutlass_s8::FoldTable, cutlass_s8::UseConvertA<cutlass_s8::FoldLut>>;
template <class Out>
using LutWide =
    cutlass_s8::WeightAConfig<cutlass::int4b_t, Shape<_128, _256, _128>, Out,
                              cutlass_s8::FoldTable, cutlass_s8::UseConvertA<cutlass_s8::FoldLut>>;
template <class Out>
using LutSmall =
    cutlass_s8::WeightAConfig<cutlass::int4b_t, Shape<_128, _64, _128>, Out,
                              cutlass_s8::FoldTable, cutlass_s8::UseConvertA<cutlass_s8::FoldLut>>;

// Tables: one K group per 128-column K tile, rows contiguous, 16-byte aligned groups.
bool lut_fits(const WeightAGemmParams& p) {
  return cutlass_s8::weight_a_fits(p, 2) && p.w_lut && p.w_lut_group == 128 && p.K % 128 == 0 &&
         p.w_lut_ld >= p.N && p.w_lut_ld % 2 == 0 &&
         (reinterpret_cast<uintptr_t>(p.w_lut) & 15u) == 0;
}

using Lut = cutlass_s8::WeightAEntry<LutSmall, LutNarrow, LutWide, lut_fits>;

}  // namespace

bool cutlass_s8s4_lut_applies(const WeightAGemmParams& p) { return Lut::applies(p); }
size_t cutlass_s8s4_lut_scratch_bytes(const WeightAGemmParams& p) { return Lut::scratch_bytes(p); }
bool gemm_cutlass_s8s4_lut(const WeightAGemmParams& p, void* scratch, cudaStream_t stream) {
  return Lut::run(p, scratch, stream);
}

#else  // !LOWBIT_HAVE_CUTLASS

bool cutlass_s8s4_lut_applies(const WeightAGemmParams&) { return false; }
size_t cutlass_s8s4_lut_scratch_bytes(const WeightAGemmParams&) { return 0; }
bool gemm_cutlass_s8s4_lut(const WeightAGemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
