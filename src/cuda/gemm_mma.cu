// Quantized GEMM with the fused scale/bias epilogue, mma.sync on every sm_80+ GPU (SPEC §3.5):
// out(M, N) = epilogue(A(M, K) · B(N, K)ᵀ), both operands K-contiguous ("TN").
//
// CTA tile 128 x 128 x 64 bytes of K, 8 warps as 2 (M) x 4 (N), warp tile 64 x 32, a 4-stage
// cp.async pipeline into XOR-swizzled shared memory (16-byte chunk c of row r lives at chunk
// c ^ ((r >> 1) & 3): ldmatrix reads of 8 rows hit 8 distinct bank groups). The three kinds (s8,
// e4m3, f16) share the fragment byte layout, so one kernel body serves them; only the mma
// instruction and the accumulator type differ. Integer accumulation is exact, so the int32 sums
// equal the CPU's bit for bit; the epilogue is the shared fp32 apply_epilogue.
#include <string>

#include "src/core/check.h"
#include "src/cuda/common.cuh"
#include "src/cuda/gemm_common.cuh"
#include "src/cuda/linear_kernels.cuh"

namespace lowbit {
namespace cuda {
namespace linear {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 64;  // kBK in bytes
constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kStageBytes = (kBM + kBN) * kBK;
constexpr int kSmemBytes = kStages * kStageBytes;

__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kBK + ((chunk ^ ((row >> 1) & 3)) << 4);
}

template <GemmKind KIND>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<GemmKind::s8> {
  using type = int32_t;
};

template <GemmKind KIND>
__global__ void __launch_bounds__(kThreads) gemm_mma_kernel(GemmParams p) {
  using Acc = typename AccOf<KIND>::type;
  constexpr int kElemBytes = KIND == GemmKind::f16 ? 2 : 1;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t k_bytes = p.K * kElemBytes;
  const int64_t lda_b = p.lda * kElemBytes, ldb_b = p.ldb * kElemBytes;
  const uint8_t* A = static_cast<const uint8_t*>(p.a);
  const uint8_t* B = static_cast<const uint8_t*>(p.b);
  const uint32_t smem_base = smem_u32(smem);
  const int k_tiles = static_cast<int>((k_bytes + kBK - 1) / kBK);

  auto load_stage = [&](int stage, int kt) {
    const uint32_t sa = smem_base + stage * kStageBytes;
    const uint32_t sb = sa + kBM * kBK;
    const int64_t kb0 = static_cast<int64_t>(kt) * kBK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kThreads;
      const int row = c >> 2, chunk = c & 3;
      const int64_t kb = kb0 + chunk * 16;
      {
        const int64_t gm = m0 + row;
        const bool ok = gm < p.M && kb < k_bytes;
        const void* src = ok ? static_cast<const void*>(A + gm * lda_b + kb) : p.a;
        cp_async_16(sa + swz(row, chunk), src, ok ? 16 : 0);
      }
      {
        const int64_t gn = n0 + row;
        const bool ok = gn < p.N && kb < k_bytes;
        const void* src = ok ? static_cast<const void*>(B + gn * ldb_b + kb) : p.b;
        cp_async_16(sb + swz(row, chunk), src, ok ? 16 : 0);
      }
    }
  };

  Acc acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = Acc(0);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  const int q = lane >> 3, r8 = lane & 7;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int nk = kt + kStages - 1;
      if (nk < k_tiles) load_stage(nk % kStages, nk);
      cp_async_commit();
    }
    const uint32_t sa = smem_base + (kt % kStages) * kStageBytes;
    const uint32_t sb = sa + kBM * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int row = warp_m * 64 + mi * 16 + r8 + ((q & 1) ? 8 : 0);
        ldmatrix_x4(sa + swz(row, 2 * kk + (q >> 1)), af[mi][0], af[mi][1], af[mi][2],
                    af[mi][3]);
      }
#pragma unroll
      for (int nj = 0; nj < 4; nj += 2) {
        const int row = warp_n * 32 + nj * 8 + r8 + ((q >> 1) ? 8 : 0);
        ldmatrix_x4(sb + swz(row, 2 * kk + (q & 1)), bf[nj][0], bf[nj][1], bf[nj + 1][0],
                    bf[nj + 1][1]);
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
          if constexpr (KIND == GemmKind::s8) {
            mma_s8(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
          } else if constexpr (KIND == GemmKind::e4m3) {
            mma_e4m3(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
          } else {
            mma_f16(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
          }
        }
    }
  }
  cp_async_wait<0>();

  // Epilogue straight from the accumulator fragments.
  const Epilogue ep{p.a_scale, p.w_scale, p.w_tensor_scale, p.bias, p.bias_dtype};
  const int gid = lane >> 2, tid4 = lane & 3;
  const bool out_even = (p.ldo % 2) == 0 && (reinterpret_cast<uintptr_t>(p.out) % 4) == 0;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + warp_m * 64 + mi * 16 + gid + h * 8;
      if (row >= p.M) continue;
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        const int64_t col = n0 + warp_n * 32 + nj * 8 + tid4 * 2;
        if (col >= p.N) continue;
        const bool has1 = col + 1 < p.N;
        const Acc c0 = acc[mi][nj][2 * h], c1 = acc[mi][nj][2 * h + 1];
        if constexpr (KIND == GemmKind::s8) {
          if (p.acc_out) {
            p.acc_out[row * p.ldo + col] = c0;
            if (has1) p.acc_out[row * p.ldo + col + 1] = c1;
            continue;
          }
        }
        const float v0 = apply_epilogue(ep, static_cast<float>(c0), row, col);
        const float v1 = has1 ? apply_epilogue(ep, static_cast<float>(c1), row, col + 1) : 0.f;
        store2(p.out, p.out_dtype, row * p.ldo + col, v0, v1, has1, has1 && out_even);
      }
    }
}

template <GemmKind KIND>
void launch(const GemmParams& p, cudaStream_t stream) {
  auto kernel = gemm_mma_kernel<KIND>;
  set_kernel_smem(kernel, kSmemBytes, "gemm", "shared memory");
  const dim3 grid(static_cast<unsigned>(ceil_div(p.N, kBN)),
                  static_cast<unsigned>(ceil_div(p.M, kBM)));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  check_launch("gemm");
}

}  // namespace

void gemm(const GemmParams& p, cudaStream_t stream) {
  if (p.M == 0 || p.N == 0) return;
  switch (p.kind) {
    case GemmKind::s8:
      launch<GemmKind::s8>(p, stream);
      break;
    case GemmKind::e4m3: {
      // mma.sync on e4m3 needs an sm_89+ GPU and device code built for it (a build for sm_80
      // compiles the kernel's mma to a trap).
      const std::string missing = fp8_mma_missing();
      if (!missing.empty())
        check::fail("gemm", "kind",
                    "e4m3 operands: expected an sm_89+ GPU and device code for it, got " +
                        missing);
      launch<GemmKind::e4m3>(p, stream);
      break;
    }
    case GemmKind::f16:
      launch<GemmKind::f16>(p, stream);
      break;
    default:
      check::fail("gemm", "kind", "expected s8, e4m3 or f16 operands (bf16: cuBLASLt only), got " +
                                      std::to_string(static_cast<int>(p.kind)));
  }
}

}  // namespace linear
}  // namespace cuda
}  // namespace lowbit
