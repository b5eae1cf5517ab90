// Internal to the weight-as-A mixed-input GEMM files (gemm_cutlass_s8s4*.cu,
// gemm_cutlass_nvfp4_mixed.cu; session 37), compiled only with the CUTLASS headers: the tile
// choice shared by the three, and the hook that replaces the conversion of CUTLASS's sm_90
// mixed-input mainloop.
//
// The hook: the builder's collective gets `ConvertA<Conv>` as its TransformA (CUTLASS's builder
// passes cute::identity there and the mixed-input mainloop does not read it), and
// cutlass::gemm::collective::detail::MixedInputUtils is partially specialized for such
// collectives: everything is CUTLASS's own utilities (loads, scale partitions, the lookup-table
// helpers: the primary template on UtilsView, below) except dequantize_A_kblock, which calls
// Conv::convert<Base> on the K block's loaded A fragment, its operand registers and the scale
// operands loaded beside it.
#pragma once

#include "src/cuda/gemm_cutlass_s8.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace cutlass_s8 {
namespace {

template <class Conv>
struct ConvertA {};

template <class C, class Tag>
struct RebindTransformA;
template <class D, class T, class EA, class SA, class EB, class SB, class TM, class GA, class LA,
          class CA, class TA, class GB, class LB, class CB, class TB, class Tag>
struct RebindTransformA<
    cutlass::gemm::collective::CollectiveMma<D, T, EA, SA, EB, SB, TM, GA, LA, CA, TA, GB, LB, CB, TB>,
    Tag> {
  using type =
      cutlass::gemm::collective::CollectiveMma<D, T, EA, SA, EB, SB, TM, GA, LA, CA, Tag, GB, LB, CB, TB>;
};

// WeightAConfig's MainloopFix: the built mainloop with Conv's conversion.
template <class Conv>
struct UseConvertA {
  template <class C>
  using apply = RebindTransformA<C, ConvertA<Conv>>;
};

// The 128 x 256 tile (each converted weight fragment feeds 256 activation rows) from wide_min_m
// rows where it still gives ~3/4 of the SMs a tile of their own (H200 session 36: 256 x 5120 ->
// 13824, 108 wide tiles, 0.0450 ms vs 0.0596 with 128 x 128; 256 x 14336 -> 4096, 32 wide
// tiles, 0.0586 vs 0.0556).
bool weight_a_wide(const WeightAGemmParams& p) {
  if (p.wide_min_m <= 0 || p.M < p.wide_min_m) return false;
  const int64_t tiles = ((p.N + 127) / 128) * ((p.M + 255) / 256);
  return 4 * tiles >= 3 * static_cast<int64_t>(multiprocessor_count());
}

// f(configuration) for p: Small<Out> (128 x 64) up to small_max_m rows, Wide<Out> (128 x 256)
// where weight_a_wide, else Narrow<Out> (128 x 128); Out by p.out_dtype (bf16 or f16).
template <template <class> class Small, template <class> class Narrow,
          template <class> class Wide, class F>
auto with_weight_a_tile(const WeightAGemmParams& p, F&& f) {
  const bool f16 = p.out_dtype == DType::f16;
  if (p.M <= p.small_max_m)
    return f16 ? f(Small<cutlass::half_t>{}) : f(Small<cutlass::bfloat16_t>{});
  if (weight_a_wide(p)) return f16 ? f(Wide<cutlass::half_t>{}) : f(Wide<cutlass::bfloat16_t>{});
  return f16 ? f(Narrow<cutlass::half_t>{}) : f(Narrow<cutlass::bfloat16_t>{});
}
template <template <class> class Small, template <class> class Narrow,
          template <class> class Wide>
size_t weight_a_tile_scratch_bytes(const WeightAGemmParams& p) {
  return with_weight_a_tile<Small, Narrow, Wide>(
      p, [&](auto c) { return weight_a_scratch_bytes<decltype(c)>(p); });
}
template <template <class> class Small, template <class> class Narrow,
          template <class> class Wide>
bool weight_a_tile_launch(const WeightAGemmParams& p, void* scratch, cudaStream_t stream) {
  return with_weight_a_tile<Small, Narrow, Wide>(
      p, [&](auto c) { return weight_a_launch<decltype(c)>(p, scratch, stream); });
}

// A weight-as-A file's three entry points (`*_applies`, `*_scratch_bytes`, `gemm_*` of
// linear_kernels.cuh) from its configurations and its Fits(p) predicate: it applies where Fits
// and the device runs the Narrow bf16 kernel's sm_90a image (the three tiles share the build).
template <template <class> class Small, template <class> class Narrow,
          template <class> class Wide, bool (*Fits)(const WeightAGemmParams&)>
struct WeightAEntry {
  static bool applies(const WeightAGemmParams& p) {
    return Fits(p) && sm90a_image_loaded(reinterpret_cast<const void*>(
                          cutlass::device_kernel<typename Narrow<cutlass::bfloat16_t>::Kernel>));
  }
  static size_t scratch_bytes(const WeightAGemmParams& p) {
    return Fits(p) ? weight_a_tile_scratch_bytes<Small, Narrow, Wide>(p) : 0;
  }
  static bool run(const WeightAGemmParams& p, void* scratch, cudaStream_t stream) {
    return applies(p) && weight_a_tile_launch<Small, Narrow, Wide>(p, scratch, stream);
  }
};

}  // namespace
}  // namespace cutlass_s8
}  // namespace linear
}  // namespace cuda
}  // namespace lowbit

namespace lowbit {
namespace cuda {
namespace linear {
namespace cutlass_s8 {
namespace {
// What CUTLASS's MixedInputUtils<C> reads of its collective C, as aliases into C: the utilities
// of a ConvertA collective are the primary template's on this view (instantiated from inside C's
// definition, where these members are already declared).
template <class C>
struct UtilsView {
  using KernelSchedule = typename C::KernelSchedule;
  using SmemLayoutA = typename C::SmemLayoutA;
  using SmemLayoutB = typename C::SmemLayoutB;
  using SmemLayoutScale = typename C::SmemLayoutScale;
  using SwappedElementA = typename C::SwappedElementA;
  using SwappedElementB = typename C::SwappedElementB;
  using RealSwappedElementA = typename C::RealSwappedElementA;
  using RealSwappedElementB = typename C::RealSwappedElementB;
  using ElementScale = typename C::ElementScale;
  using ElementZero = typename C::ElementZero;
  using SmemCopyAtomScale = typename C::SmemCopyAtomScale;
  static constexpr auto KernelConversionMode = C::KernelConversionMode;
  static constexpr auto ModeHasScales = C::ModeHasScales;
  static constexpr auto UseScaleLookupTable = C::UseScaleLookupTable;
};
}  // namespace
}  // namespace cutlass_s8
}  // namespace linear
}  // namespace cuda
}  // namespace lowbit

namespace cutlass::gemm::collective::detail {

template <class D, class T, class EA, class SA, class EB, class SB, class TM, class GA, class LA,
          class CA, class Conv, class GB, class LB, class CB, class TB>
struct MixedInputUtils<
    CollectiveMma<D, T, EA, SA, EB, SB, TM, GA, LA, CA,
                  lowbit::cuda::linear::cutlass_s8::ConvertA<Conv>, GB, LB, CB, TB>>
    : MixedInputUtils<lowbit::cuda::linear::cutlass_s8::UtilsView<
          CollectiveMma<D, T, EA, SA, EB, SB, TM, GA, LA, CA,
                        lowbit::cuda::linear::cutlass_s8::ConvertA<Conv>, GB, LB, CB, TB>>> {
  using Base = MixedInputUtils<lowbit::cuda::linear::cutlass_s8::UtilsView<
      CollectiveMma<D, T, EA, SA, EB, SB, TM, GA, LA, CA,
                    lowbit::cuda::linear::cutlass_s8::ConvertA<Conv>, GB, LB, CB, TB>>>;

  template <class EngineIn, class EngineOut, class LayoutIn, class LayoutOut, class... Ts>
  CUTLASS_DEVICE static void dequantize_A_kblock(cute::Tensor<EngineIn, LayoutIn> const& tCrA_load,
                                                 cute::Tensor<EngineOut, LayoutOut>& tCrA_mma,
                                                 cute::tuple<Ts...>& extra, int const k_block) {
    Conv::template convert<Base>(tCrA_load, tCrA_mma, extra, k_block);
  }
};

}  // namespace cutlass::gemm::collective::detail
