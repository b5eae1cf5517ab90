// The convrot4 GEMM on sm_100a (see src/cuda/gemm_nvfp4_sm100.h): CUTLASS's block-scaled
// tcgen05 mainloop (NVFP4 operands, e4m3 scale per 16 elements, fp32 accumulation in tensor
// memory) and its TMA epilogue with the per-tensor scale and the per-column bias fused
// (D = alpha·acc + bias in fp32, one rounding to bf16/f16). This object is compiled for sm_100a
// only; the rest of lowbit is compiled for the architectures of CMAKE_CUDA_ARCHITECTURES.
#include "src/cuda/gemm_nvfp4_sm100.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace lowbit {
namespace cuda {
namespace linear {

namespace {

using namespace cute;

// One GEMM type per output dtype. 128x128 output tiles with K steps of 256 fp4 elements on one
// SM (no cluster): the decode/prefill shapes of a DiT layer keep >= 132 tiles busy from M = 128.
template <class OutT>
struct Sm100Nvfp4 {
  using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  using MmaTile = Shape<_128, _128, _256>;
  using Cluster = Shape<_1, _1, _1>;
  static constexpr int kAlignAB = 32;  // 16 bytes of fp4: the TMA's granule
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<OutT>::value;
  // D = alpha * acc + bias(n) (+ beta * C with no C): fp32 compute, fp32 bias.
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBias<OutT, float, float, OutT, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor, kAlignD, OutT, cutlass::layout::RowMajor, kAlignD,
      cutlass::epilogue::collective::EpilogueScheduleAuto, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementAB,
      cutlass::layout::RowMajor, kAlignAB, ElementAB, cutlass::layout::ColumnMajor, kAlignAB,
      float, MmaTile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Row-major (R, C) block scales -> the 128x4-tile swizzled layout (SPEC §3.4), padding zeroed.
__global__ void swizzle_scales_kernel(const uint8_t* __restrict__ src, int64_t R, int64_t C,
                                      int64_t padded, uint8_t* __restrict__ dst) {
  const int64_t cb = (C + 3) / 4;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < padded;
       i += int64_t{gridDim.x} * blockDim.x) {
    // Invert the flat index: i = ((t*32 + r%32)*4 + (r%128)/32)*4 + c%4, t = (r/128)*cb + c/4.
    const int64_t c4 = i & 3, r32 = (i >> 2) & 3, r0 = (i >> 4) & 31, t = i >> 9;
    const int64_t r = (t / cb) * 128 + r32 * 32 + r0, c = (t % cb) * 4 + c4;
    dst[i] = (r < R && c < C) ? src[r * C + c] : uint8_t{0};
  }
}

__global__ void bias_to_f32_kernel(const void* __restrict__ bias, DType dt, int64_t n,
                                   float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v;
    if (dt == DType::bf16) {
      v = __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[i]);
    } else if (dt == DType::f16) {
      v = __half2float(static_cast<const __half*>(bias)[i]);
    } else {
      v = static_cast<const float*>(bias)[i];
    }
    out[i] = v;
  }
}

// Stream-ordered temporary, freed on the stream when it goes out of scope.
struct Temp {
  void* p = nullptr;
  cudaStream_t s;
  Temp(size_t bytes, cudaStream_t stream) : s(stream) {
    if (bytes && cudaMallocAsync(&p, bytes, s) != cudaSuccess) p = nullptr;
  }
  ~Temp() {
    if (p) cudaFreeAsync(p, s);
  }
};

template <class OutT>
std::string run(const Nvfp4Sm100Gemm& g, cudaStream_t stream) {
  using T = Sm100Nvfp4<OutT>;
  using Gemm = typename T::Gemm;
  using Cfg = typename T::Kernel::CollectiveMainloop::Sm1xxBlkScaledConfig;
  using StrideA = typename T::Kernel::StrideA;
  using StrideB = typename T::Kernel::StrideB;
  using StrideD = typename T::Kernel::StrideD;
  const int M = static_cast<int>(g.M), N = static_cast<int>(g.N), K = static_cast<int>(g.K);

  const int64_t sfa_bytes = (g.M + 127) / 128 * 128 * ((g.K / 16 + 3) / 4 * 4);
  Temp sfa(static_cast<size_t>(sfa_bytes), stream);
  Temp bias32(g.bias ? static_cast<size_t>(g.N) * sizeof(float) : 0, stream);
  if (!sfa.p || (g.bias && !bias32.p)) return "temporary buffer allocation failed";
  StrideA sa{};
  get<0>(sa) = g.K;  // A (M, K) K-contiguous
  get<2>(sa) = g.M * g.K;
  StrideB sb{};
  get<0>(sb) = g.K;  // W (N, K) K-contiguous
  get<2>(sb) = g.N * g.K;
  StrideD sd{};
  get<0>(sd) = g.ldo;
  get<2>(sd) = g.M * g.ldo;
  const auto problem = make_shape(M, N, K, 1);

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {reinterpret_cast<const cutlass::float_e2m1_t*>(g.a_codes), sa,
       reinterpret_cast<const cutlass::float_e2m1_t*>(g.w_codes), sb,
       static_cast<const cutlass::float_ue4m3_t*>(sfa.p), Cfg::tile_atom_to_shape_SFA(problem),
       reinterpret_cast<const cutlass::float_ue4m3_t*>(g.w_scales_swizzled),
       Cfg::tile_atom_to_shape_SFB(problem)},
      {{}, nullptr, sd, static_cast<OutT*>(g.out), sd}};
  args.epilogue.thread.alpha_ptr = g.alpha;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.thread.bias_ptr = static_cast<const float*>(bias32.p);

  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
    return "CUTLASS cannot run this shape (K must be a multiple of 32 and the output row stride "
           "of 8 elements)";
  }
  // Arguments accepted: now fill the temporaries the kernel reads.
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((sfa_bytes + threads - 1) / threads, 4096));
  swizzle_scales_kernel<<<blocks, threads, 0, stream>>>(g.a_scales, g.M, g.K / 16, sfa_bytes,
                                                        static_cast<uint8_t*>(sfa.p));
  if (g.bias) {
    bias_to_f32_kernel<<<static_cast<int>((g.N + threads - 1) / threads), threads, 0, stream>>>(
        g.bias, g.bias_dtype, g.N, static_cast<float*>(bias32.p));
  }
  if (cudaGetLastError() != cudaSuccess) return "scale swizzle launch failed";

  Temp ws(Gemm::get_workspace_size(args), stream);
  if (Gemm::get_workspace_size(args) && !ws.p) return "workspace allocation failed";
  if (gemm.initialize(args, ws.p, stream) != cutlass::Status::kSuccess) {
    return "CUTLASS initialization failed";
  }
  if (gemm.run(stream) != cutlass::Status::kSuccess) return "CUTLASS launch failed";
  return "";
}

}  // namespace

bool nvfp4_sm100_device() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 10 && minor == 0;
}

std::string nvfp4_gemm_sm100(const Nvfp4Sm100Gemm& g, cudaStream_t stream) {
  if (!nvfp4_sm100_device()) return "the device is not compute capability 10.0";
  if (g.K % 32 != 0) return "K must be a multiple of 32";
  if (g.ldo % 8 != 0) return "the output row stride must be a multiple of 8 elements";
  if (g.M > INT32_MAX || g.N > INT32_MAX || g.K > INT32_MAX) return "shape exceeds int32";
  if (g.out_dtype == DType::bf16) return run<cutlass::bfloat16_t>(g, stream);
  if (g.out_dtype == DType::f16) return run<cutlass::half_t>(g, stream);
  return "the output dtype must be bf16 or f16";
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
