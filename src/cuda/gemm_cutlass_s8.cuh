// Internal to the CUTLASS int8 GEMM files (gemm_cutlass_s8*.cu), compiled only with the CUTLASS
// headers (LOWBIT_HAVE_CUTLASS): the epilogue functor, the kernel configuration templated on the
// CTA tile and cluster shapes, argument building and the launch (see gemm_cutlass_s8.cu).
#pragma once

// Device-side asserts compile to calls, and a call inside the mainloop serializes the wgmma
// pipeline (ptxas C7510): CUTLASS is built with its asserts off, whatever the build type.
#ifndef NDEBUG
#define NDEBUG
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace cutlass_s8 {
namespace {

// ((acc · a) · w) + b on a fragment, each operation rounded (the CPU oracle's fp32 order).
template <class T>
struct ScaleScaleBiasRn;
template <int N>
struct ScaleScaleBiasRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& acc,
                                                     cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& w,
                                                     cutlass::Array<float, N> const& b) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fadd_rn(__fmul_rn(__fmul_rn(acc[i], a[i]), w[i]), b[i]);
    return r;
  }
};

using namespace cute;

// Scheduler: void (CUTLASS's persistent data-parallel scheduler) or
// cutlass::gemm::StreamKScheduler (output tiles split along K over the SMs when there are too few
// of them; the partial int32 sums meet in the workspace, exact in any order).
template <class ElementOut, class TileShape_, class ClusterShape_, class Scheduler = void>
struct Config {
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // (M) per-token scales, loaded one element at a time (alignment 1: no vector load may reach
  // past a_scale[M - 1] when M is odd).
  using AScale = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float,
                                                             Stride<_1, _0, _0>, 1>;
  using WScale = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float>;  // (N)
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float>;    // (N)
  using Evt = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<ScaleScaleBiasRn, ElementOut, float, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, AScale, WScale, Bias>;

  using ElementD = ElementOut;
  static constexpr int kAlignOut = 16 / sizeof(ElementOut);
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void,
      cutlass::layout::RowMajor, kAlignOut, ElementOut, cutlass::layout::RowMajor, kAlignOut,
      EpilogueSchedule, Evt>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor, 16,
      int8_t, cutlass::layout::ColumnMajor, 16, int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// The transposed GEMM (the weight as A): out^T (N, M) = W (N, K) · codes (M, K)^T, D column-major
// = out row-major, the same epilogue with the broadcasts swapped (a_scale along D's columns,
// w_scale and bias along its rows). ElementW: int8_t (gemm_cutlass_s8_t.cu) or cutlass::int4b_t
// (CUTLASS's mixed-input mainloop, gemm_cutlass_s8s4.cu). Stream-K scheduler, no cluster.
// ScaleW (non-void): the mixed-input mainloop's per-(weight row, K group) operand, loaded with
// each stage (gemm_cutlass_s8s4_lut.cu: 8-byte lookup tables); MainloopFix::apply<Built>::type
// replaces the built mainloop (its conversion specialized there), void: the builder's own.
// ElementAct / Acc: the activations' and the accumulators' types (int8 / int32; NVFP4's GEMM,
// gemm_cutlass_nvfp4_mixed.cu: f16 / fp32).
template <class ElementW_, class TileShape_, class ElementOut_, class ScaleW_ = void,
          class MainloopFix = void, class ElementAct_ = int8_t, class Acc_ = int32_t>
struct WeightAConfig {
  using ElementW = ElementW_;
  using ScaleW = ScaleW_;
  using ElementAct = ElementAct_;
  using Acc = Acc_;
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
      cutlass::epilogue::fusion::Sm90Compute<ScaleScaleBiasRn, ElementOut, float,
                                             kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, AScale, WScale, Bias>;

  static constexpr int kAlignOut = 8;
  static constexpr int kAlignW = 128 / cute::sizeof_bits_v<ElementW>;  // 16 bytes
  static constexpr int64_t kWPerByte = 8 / cute::sizeof_bits_v<ElementW>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Acc, float, void,
      cutlass::layout::ColumnMajor, kAlignOut, ElementOut, cutlass::layout::ColumnMajor, kAlignOut,
      EpilogueSchedule, Evt>::CollectiveOp;

  static constexpr int kAlignAct = 16 / static_cast<int>(sizeof(ElementAct));
  using ElementWSpec =
      std::conditional_t<std::is_void_v<ScaleW>, ElementW, cute::tuple<ElementW, ScaleW>>;
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementWSpec,
      cutlass::layout::RowMajor, kAlignW, ElementAct, cutlass::layout::ColumnMajor, kAlignAct,
      Acc, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  template <class Fix, class = void>
  struct Mainloop {
    using type = BuiltMainloop;
  };
  template <class Fix>
  struct Mainloop<Fix, std::enable_if_t<!std::is_void_v<Fix>>> {
    using type = typename Fix::template apply<BuiltMainloop>::type;
  };
  using CollectiveMainloop = typename Mainloop<MainloopFix>::type;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class C>
typename C::Gemm::Arguments make_weight_a_args(const WeightAGemmParams& p, const float* bias) {
  using Kernel = typename C::Kernel;
  const int M = static_cast<int>(p.M), N = static_cast<int>(p.N), K = static_cast<int>(p.K);
  typename Kernel::StrideA sa{};
  get<0>(sa) = p.w_row_bytes * C::kWPerByte;  // weight elements between weight rows
  typename Kernel::StrideB sb{};
  get<0>(sb) = p.lda;  // activation elements between activation rows
  typename Kernel::StrideD sd{};
  get<1>(sd) = p.ldo;  // D = out^T column-major: out's rows are D's columns
  typename Kernel::StrideC sc = sd;
  typename C::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = make_shape(N, M, K, 1);
  args.mainloop.ptr_A = reinterpret_cast<const typename C::ElementW*>(p.w_codes);
  args.mainloop.dA = sa;
  args.mainloop.ptr_B = reinterpret_cast<const typename C::ElementAct*>(p.a);
  args.mainloop.dB = sb;
  if constexpr (!std::is_void_v<typename C::ScaleW>) {
    // (N, K / group) operands, weight rows contiguous, w_lut_ld elements between groups.
    args.mainloop.ptr_S = static_cast<const typename C::ScaleW*>(p.w_lut);
    get<1>(args.mainloop.dS) = p.w_lut_ld;
    args.mainloop.group_size = static_cast<int>(p.w_lut_group);
  }
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

__global__ void bias_to_f32_kernel(const void* in, DType dt, int64_t n, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (dt == DType::bf16) {
    out[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(in)[i]);
  } else if (dt == DType::f16) {
    out[i] = __half2float(static_cast<const __half*>(in)[i]);
  } else {
    out[i] = static_cast<const float*>(in)[i];
  }
}

template <class C>
typename C::Gemm::Arguments make_args(const GemmParams& p, const float* bias) {
  using Kernel = typename C::Kernel;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;
  const int M = static_cast<int>(p.M), N = static_cast<int>(p.N), K = static_cast<int>(p.K);
  // Row-major (M, K) A, (N, K) B (K-contiguous "column-major" B), row-major (M, N) out.
  StrideA sa{};
  get<0>(sa) = p.lda;
  StrideB sb{};
  get<0>(sb) = p.ldb;
  StrideD sd{};
  get<0>(sd) = p.ldo;
  StrideC sc{};
  get<0>(sc) = p.ldo;
  typename C::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = make_shape(M, N, K, 1);
  args.mainloop.ptr_A = static_cast<const int8_t*>(p.a);
  args.mainloop.dA = sa;
  args.mainloop.ptr_B = static_cast<const int8_t*>(p.b);
  args.mainloop.dB = sb;
  auto& t = args.epilogue.thread;
  // Children in order: accumulator, a_scale (M), w_scale (N), bias (N); then the compute node.
  get<1>(t).ptr_col = p.a_scale;
  get<1>(t).null_default = 1.f;
  get<2>(t).ptr_row = p.w_scale;
  get<2>(t).null_default = 1.f;
  get<3>(t).ptr_row = bias;
  get<3>(t).null_default = -0.f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = sc;
  args.epilogue.ptr_D = static_cast<typename C::ElementD*>(p.out);
  args.epilogue.dD = sd;
  return args;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Shapes and pointers this kernel addresses (TMA: 16-byte aligned bases and row strides).
bool fits(const GemmParams& p) {
  if (p.kind != GemmKind::s8 || p.acc_out || p.w_tensor_scale) return false;
  if (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16) return false;
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return false;
  if (p.M > INT32_MAX || p.N > INT32_MAX || p.K > INT32_MAX) return false;
  if (p.K % 16 || p.lda % 16 || p.ldb % 16 || p.ldo % 8 || p.N % 8) return false;
  return aligned16(p.a) && aligned16(p.b) && aligned16(p.out) && aligned16(p.a_scale) &&
         aligned16(p.w_scale);
}

// Shapes and pointers the weight-as-A GEMM addresses (TMA: 16-byte row strides and bases; D's
// contiguous dimension (N) in whole 16-byte vectors); w_per_byte: 2 for int4 codes, 1 for int8.
// A null `a`: the codes are still to be written (16-byte aligned).
bool weight_a_fits(const WeightAGemmParams& p, int64_t w_per_byte) {
  if (p.out_dtype != DType::bf16 && p.out_dtype != DType::f16) return false;
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return false;
  if (p.M > INT32_MAX || p.N > INT32_MAX || w_per_byte * p.K > INT32_MAX) return false;
  if (p.K % (16 * w_per_byte) || p.w_row_bytes % 16 ||
      p.w_row_bytes * w_per_byte < p.K || p.lda % 16 || p.ldo % 8 || p.N % 8)
    return false;
  return aligned16(p.a) && aligned16(p.w_codes) && aligned16(p.out) && aligned16(p.w_scale);
}

template <class C>
size_t workspace_bytes_of(const GemmParams& p) {
  return C::Gemm::get_workspace_size(make_args<C>(p, nullptr));
}

// Runs a CUTLASS GEMM configuration C on its arguments; false (nothing launched) where CUTLASS
// refuses them.
template <class C>
bool run_args(const typename C::Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  typename C::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return false;
  return gemm.run(stream) == cutlass::Status::kSuccess;
}

template <class C>
bool run(const GemmParams& p, const float* bias, void* workspace, cudaStream_t stream) {
  return run_args<C>(make_args<C>(p, bias), workspace, stream);
}

// Workspace of the largest request we make: the tile scheduler's needs do not depend on M, N, K
// for a plain (not split-K / stream-K) GEMM, but query it per call anyway and round up.
template <class CBf16, class CF16>
size_t workspace_for(const GemmParams& p) {
  if constexpr (!std::is_void_v<CF16>) {
    if (p.out_dtype == DType::f16) return workspace_bytes_of<CF16>(p);
  }
  return workspace_bytes_of<CBf16>(p);
}

// launch's scratch: room for the N converted bias values (fp32, 256-byte aligned), then the
// configuration's workspace.
size_t bias_bytes(int64_t N) { return (static_cast<size_t>(N) * 4 + 255) / 256 * 256; }
size_t bias_bytes(const GemmParams& p) { return bias_bytes(p.N); }

// The bias as N fp32 values for the epilogue's broadcast: the caller's own where it is fp32 and
// 16-byte aligned, else converted (exact) into `room` (bias_bytes(N)) on `stream`; null: none.
const float* bias_f32(const void* bias, DType dtype, int64_t N, void* room, cudaStream_t stream) {
  if (!bias) return nullptr;
  if (dtype == DType::f32 && aligned16(bias)) return static_cast<const float*>(bias);
  float* b32 = static_cast<float*>(room);
  bias_to_f32_kernel<<<static_cast<unsigned>((N + 255) / 256), 256, 0, stream>>>(bias, dtype, N,
                                                                                  b32);
  return b32;
}

// The weight-as-A GEMM (WeightAConfig C): its scratch (room for the converted bias, then C's
// workspace) and its launch; false (nothing but the bias conversion launched) where CUTLASS
// refuses the arguments.
template <class C>
size_t weight_a_scratch_bytes(const WeightAGemmParams& p) {
  return bias_bytes(p.N) +
         static_cast<size_t>(C::Gemm::get_workspace_size(make_weight_a_args<C>(p, nullptr)));
}
template <class C>
bool weight_a_launch(const WeightAGemmParams& p, void* scratch, cudaStream_t stream) {
  const float* bias = bias_f32(p.bias, p.bias_dtype, p.N, scratch, stream);
  void* ws = static_cast<char*>(scratch) + bias_bytes(p.N);
  return run_args<C>(make_weight_a_args<C>(p, bias), ws, stream);
}
template <class CBf16, class CF16>
size_t scratch_for(const GemmParams& p) {
  return bias_bytes(p) + workspace_for<CBf16, CF16>(p);
}

// Launches on `stream`; returns false (nothing launched) when CUTLASS refuses the arguments.
// `scratch` holds at least N fp32 (the converted bias) + the workspace, 256-byte aligned.
// CBf16 / CF16: the configs for bf16 and f16 output (CF16 = void: f16 not instantiated).
template <class CBf16, class CF16>
bool launch(const GemmParams& p, void* scratch, cudaStream_t stream) {
  char* base = static_cast<char*>(scratch);
  const float* bias = bias_f32(p.bias, p.bias_dtype, p.N, base, stream);
  void* ws = base + (p.bias ? bias_bytes(p) : 0);
  if (p.out_dtype == DType::f16) {
    if constexpr (std::is_void_v<CF16>) {
      return false;
    } else {
      return run<CF16>(p, bias, ws, stream);
    }
  }
  return run<CBf16>(p, bias, ws, stream);
}


}  // namespace
}  // namespace cutlass_s8
}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
