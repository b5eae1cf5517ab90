// The comfy W4A4 prefill GEMM without an unpacked weight (session 36): CUTLASS's sm_90 mixed-input
// mainloop on the checkpoint's own int4 codes. ComfyUI's convrot_w4a4 weight is (N, K/2) bytes of
// two's-complement 4-bit codes, the even column in the low nibble, one fp32 scale per row (SPEC
// §3.7) — exactly CUTLASS's K-major `int4b_t` packing — so the mainloop converts each stage's
// codes to int8 in registers (NumericArrayConverter<int8_t, int4b_t>, DirectConvert: no scale
// in the mainloop) and runs int8 wgmma with int32 accumulation: the same sums as the int8 GEMM on
// the unpacked weight, exact in any order.
//
// CUTLASS passes the narrow operand through the register file as wgmma's A, so the GEMM runs
// transposed: A = the weight (N, K) int4, B = the activation codes (M, K) int8 (column-major
// K x M), D = out^T (N, M) column-major, i.e. out (M, N) row-major with row stride ldo. The
// epilogue is gemm_cutlass_s8.cuh's compute node (((acc · a_scale) · w_scale) + bias, each
// rounded) with the broadcasts swapped: a_scale along D's columns, w_scale and bias along its
// rows: the output bits equal apply_epilogue's, as the other CUTLASS configurations'.
//
// CTA tile 128 weight rows x 128 activation rows x 128 K, no cluster, cooperative (two consumer
// warpgroups of 64 weight rows), CUTLASS's stream-K tile scheduler (at 64-512 rows of 5120 ->
// 13824 there are 108-432 output tiles for 132 SMs); from S4GemmParams::wide_min_m rows 128 x 256
// (each converted weight fragment feeds twice the activation rows). bf16 and f16 output.
#ifndef NDEBUG  // before any header: see gemm_cutlass_s8.cuh
#define NDEBUG
#endif
#include <cstdint>

#include "src/cuda/common.cuh"
#include "src/cuda/linear_kernels.cuh"

#if defined(LOWBIT_HAVE_CUTLASS)
#include "src/cuda/gemm_cutlass_s8.cuh"
#endif

namespace lowbit {
namespace cuda {
namespace linear {

#if defined(LOWBIT_HAVE_CUTLASS)

namespace {

using namespace cute;

template <class TileShape_, class ElementOut_>
struct S4Config {
  using TileShape = TileShape_;
  using ClusterShape = Shape<_1, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using ElementOut = ElementOut_;

  // D = out^T: rows are output channels (w_scale, bias), columns tokens (a_scale; one element at
  // a time: no vector load may reach past a_scale[M - 1] when M is odd).
  using AScale = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                                             Stride<_0, _1, _0>, 1>;
  using WScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                             Stride<_1, _0, _0>, 4>;
  using Bias = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                           Stride<_1, _0, _0>, 4>;
  using Evt = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass_s8::ScaleScaleBiasRn, ElementOut, float,
                                             kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, AScale, WScale, Bias>;

  static constexpr int kAlignOut = 8;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void,
      cutlass::layout::ColumnMajor, kAlignOut, ElementOut, cutlass::layout::ColumnMajor, kAlignOut,
      EpilogueSchedule, Evt>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::int4b_t,
      cutlass::layout::RowMajor, 32, int8_t, cutlass::layout::ColumnMajor, 16, int32_t, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Out>
using S4Narrow = S4Config<Shape<_128, _128, _128>, Out>;
template <class Out>
using S4Wide = S4Config<Shape<_128, _256, _128>, Out>;

template <class C>
typename C::Gemm::Arguments make_s4_args(const S4GemmParams& p, const float* bias) {
  using Kernel = typename C::Kernel;
  const int M = static_cast<int>(p.M), N = static_cast<int>(p.N), K = static_cast<int>(p.K);
  typename Kernel::StrideA sa{};
  get<0>(sa) = p.w_row_bytes * 2;  // int4 elements between weight rows
  typename Kernel::StrideB sb{};
  get<0>(sb) = p.lda;  // int8 elements between activation rows
  typename Kernel::StrideD sd{};
  get<1>(sd) = p.ldo;  // D = out^T column-major: out's rows are D's columns
  typename Kernel::StrideC sc = sd;
  typename C::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = make_shape(N, M, K, 1);
  args.mainloop.ptr_A = reinterpret_cast<const cutlass::int4b_t*>(p.w_codes);
  args.mainloop.dA = sa;
  args.mainloop.ptr_B = static_cast<const int8_t*>(p.a);
  args.mainloop.dB = sb;
  auto& t = args.epilogue.thread;
  get<1>(t).ptr_row = p.a_scale;
  get<1>(t).null_default = 1.f;
  get<2>(t).ptr_col = p.w_scale;
  get<2>(t).null_default = 1.f;
  get<3>(t).ptr_col = bias;
  get<3>(t).null_default = -0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = sc;
  args.epilogue.ptr_D = static_cast<typename C::ElementOut*>(p.out);
  args.epilogue.dD = sd;
  return args;
}

using cutlass_s8::aligned16;

bool s4_fits(const S4GemmParams& p) {
  if (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16) return false;
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return false;
  if (p.M > INT32_MAX || p.N > INT32_MAX || 2 * p.K > INT32_MAX) return false;
  // TMA: 16-byte row strides and bases; D's contiguous dimension (N) in whole 16-byte vectors.
  if (p.K % 32 || p.w_row_bytes % 16 || p.w_row_bytes * 2 < p.K || p.lda % 16 || p.ldo % 8 ||
      p.N % 8)
    return false;
  return aligned16(p.a) && aligned16(p.w_codes) && aligned16(p.out) && aligned16(p.w_scale);
}

bool s4_image() {
  return sm90a_image_loaded(
      reinterpret_cast<const void*>(cutlass::device_kernel<S4Narrow<cutlass::bfloat16_t>::Kernel>));
}

// The 128 x 256 tile (each converted weight fragment feeds 256 activation rows) from
// wide_min_m rows where it still gives ~3/4 of the SMs a tile of their own (H200 session 36:
// 256 x 5120 -> 13824, 108 wide tiles, 0.0450 ms vs 0.0596 with 128 x 128; 256 x 14336 -> 4096,
// 32 wide tiles, 0.0586 vs 0.0556).
bool s4_wide(const S4GemmParams& p) {
  if (p.wide_min_m <= 0 || p.M < p.wide_min_m) return false;
  const int64_t tiles = ((p.N + 127) / 128) * ((p.M + 255) / 256);
  return 4 * tiles >= 3 * static_cast<int64_t>(multiprocessor_count());
}

}  // namespace

bool cutlass_s8s4_applies(const S4GemmParams& p) { return s4_fits(p) && s4_image(); }

// f(config type) with the configuration p runs: tile by s4_wide, output dtype by p.out_dtype.
template <class F>
auto with_s4_config(const S4GemmParams& p, F&& f) {
  const bool f16 = p.out_dtype == DType::f16;
  if (s4_wide(p)) return f16 ? f(S4Wide<cutlass::half_t>{}) : f(S4Wide<cutlass::bfloat16_t>{});
  return f16 ? f(S4Narrow<cutlass::half_t>{}) : f(S4Narrow<cutlass::bfloat16_t>{});
}

size_t cutlass_s8s4_scratch_bytes(const S4GemmParams& p) {
  if (!s4_fits(p)) return 0;
  return cutlass_s8::bias_bytes(p.N) + with_s4_config(p, [&](auto c) {
           using C = decltype(c);
           return static_cast<size_t>(C::Gemm::get_workspace_size(make_s4_args<C>(p, nullptr)));
         });
}

bool gemm_cutlass_s8s4(const S4GemmParams& p, void* scratch, cudaStream_t stream) {
  if (!s4_fits(p) || !s4_image()) return false;
  char* base = static_cast<char*>(scratch);
  const float* bias = cutlass_s8::bias_f32(p.bias, p.bias_dtype, p.N, base, stream);
  void* ws = base + cutlass_s8::bias_bytes(p.N);
  return with_s4_config(p, [&](auto c) {
    using C = decltype(c);
    return cutlass_s8::run_args<C>(make_s4_args<C>(p, bias), ws, stream);
  });
}

#else  // !LOWBIT_HAVE_CUTLASS

bool cutlass_s8s4_applies(const S4GemmParams&) { return false; }
size_t cutlass_s8s4_scratch_bytes(const S4GemmParams&) { return 0; }
bool gemm_cutlass_s8s4(const S4GemmParams&, void*, cudaStream_t) { return false; }

#endif

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
