// The sm_100 convrot4 path (src/cuda/gemm_nvfp4_sm100.h) hands lowbit's packed NVFP4 bytes to
// CUTLASS's block-scaled GEMM. No Blackwell GPU is at hand, so this checks the data contract on
// the CPU through CUTLASS's own operand types and scale-factor layouts (the ones the sm_100a
// kernel is built with): (1) PackedWeight's swizzled block scales sit where Sm1xxBlockScaledConfig
// puts scale (row, k) for both operands; (2) reading the weight codes, the rotation kernel's
// activation codes and both scale tensors as CUTLASS reads them (float_e2m1_t nibbles,
// float_ue4m3_t scales) and forming alpha·Σ a·w + bias gives the CPU oracle's layer output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lowbit/linear.h"
#include "src/cpu/linear_kernels.h"
#include "tests/unit/random_data.h"

#ifdef LOWBIT_TEST_SM100_LAYOUTS
#include <cute/tensor.hpp>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>
#include <cutlass/float8.h>
#include <cutlass/float_subbyte.h>
#endif

namespace lowbit {
namespace {

#ifdef LOWBIT_TEST_SM100_LAYOUTS
using Cfg = cutlass::detail::Sm1xxBlockScaledConfig<16>;

using testing_data::normal_vec;

TEST(LinearSm100, SwizzledScalesAreCutlassScaleFactorLayout) {
  // (rows, 16-element blocks per row): single tile, row and column padding, several tiles.
  const int64_t shapes[][2] = {{1, 1}, {16, 4}, {130, 5}, {300, 17}, {257, 64}};
  for (const auto& sh : shapes) {
    const int R = static_cast<int>(sh[0]), C = static_cast<int>(sh[1]), K = C * 16;
    const auto sfa = Cfg::tile_atom_to_shape_SFA(cute::make_shape(R, 8, K, 1));
    const auto sfb = Cfg::tile_atom_to_shape_SFB(cute::make_shape(8, R, K, 1));
    const int64_t padded = (R + 127) / 128 * 128 * ((C + 3) / 4 * 4);
    EXPECT_EQ(cute::cosize(sfa), padded) << R << "x" << C;
    EXPECT_EQ(cute::cosize(sfb), padded) << R << "x" << C;
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < C; ++c) {
        const int64_t ours = cpu::convrot::swizzle_index(r, c, C);
        for (int j : {0, 7, 15}) {  // every element of the 16-block shares its scale
          ASSERT_EQ(static_cast<int64_t>(sfa(r, c * 16 + j, 0)), ours) << r << "," << c;
          ASSERT_EQ(static_cast<int64_t>(sfb(r, c * 16 + j, 0)), ours) << r << "," << c;
        }
      }
    }
  }
}

TEST(LinearSm100, CutlassOperandReadingGivesTheOracleOutput) {
  Context ctx;
  const int64_t M = 37, O = 160, K = 320;  // rows and columns off the 128 tile; rot 64
  const std::vector<float> w = normal_vec(O * K, 71, 0.05f), x = normal_vec(M * K, 72),
                           bias = normal_vec(O, 73);
  QuantizedLinear lin =
      QuantizedLinear::quantize(make_view(const_cast<float*>(w.data()), DType::f32, {O, K}), QType::convrot4, ctx);
  PackedWeight p = lin.to_packed(ctx);
  std::vector<float> out(M * O);
  TensorView bv = make_view(const_cast<float*>(bias.data()), DType::f32, {O});
  lin.forward(make_view(const_cast<float*>(x.data()), DType::f32, {M, K}), &bv,
              make_view(out.data(), DType::f32, {M, O}), ctx);

  // The activation operand exactly as the rotation kernel writes it, scales swizzled as the
  // sm_100 wrapper does (the wrapper's kernel inverts swizzle_index; checked above).
  std::vector<uint8_t> ac(M * K / 2), as(M * K / 16);
  rotate_quantize_activations(make_view(const_cast<float*>(x.data()), DType::f32, {M, K}),
                              QType::convrot4, lin.rotation_block(),
                              make_view(ac.data(), DType::e2m1x2, {M, K}),
                              make_view(as.data(), DType::e4m3, {M, K / 16}), ctx);
  const auto problem = cute::make_shape(static_cast<int>(M), static_cast<int>(O),
                                        static_cast<int>(K), 1);
  const auto lsfa = Cfg::tile_atom_to_shape_SFA(problem);
  const auto lsfb = Cfg::tile_atom_to_shape_SFB(problem);
  std::vector<uint8_t> sfa(cute::cosize(lsfa), 0);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < K / 16; ++c)
      sfa[cpu::convrot::swizzle_index(r, c, K / 16)] = as[r * (K / 16) + c];
  ASSERT_EQ(p.block_scales_swizzled.size(), static_cast<size_t>(cute::cosize(lsfb)));

  using cute::_1;
  const auto ta = cute::make_tensor(cute::recast_ptr<cutlass::float_e2m1_t>(ac.data()),
                                    cute::make_layout(cute::make_shape(M, K),
                                                      cute::make_stride(K, _1{})));
  const auto tb = cute::make_tensor(cute::recast_ptr<cutlass::float_e2m1_t>(p.codes.data()),
                                    cute::make_layout(cute::make_shape(O, K),
                                                      cute::make_stride(K, _1{})));
  const auto tsa =
      cute::make_tensor(reinterpret_cast<const cutlass::float_ue4m3_t*>(sfa.data()), lsfa);
  const auto tsb = cute::make_tensor(
      reinterpret_cast<const cutlass::float_ue4m3_t*>(p.block_scales_swizzled.data()), lsfb);
  float pts;
  std::memcpy(&pts, p.tensor_scale.data(), sizeof(float));

  double worst = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < O; ++n) {
      double acc = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = static_cast<float>(cutlass::float_e2m1_t(ta(m, k))) * static_cast<float>(tsa(m, k, 0));
        const double b = static_cast<float>(cutlass::float_e2m1_t(tb(n, k))) * static_cast<float>(tsb(n, k, 0));
        acc += a * b;
        mag += std::fabs(a * b);
      }
      const double want = acc * pts + bias[n];
      const double err = std::fabs(out[m * O + n] - want) / (mag * pts + std::fabs(bias[n]) + 1e-30);
      worst = std::max(worst, err);
    }
  }
  // fp32 accumulation in the oracle against fp64 here: ~1e-7 of the magnitude; a swapped nibble,
  // a misplaced scale or a wrong sign would be off by O(1).
  EXPECT_LT(worst, 2e-6);
}
#else
TEST(LinearSm100, SwizzledScalesAreCutlassScaleFactorLayout) {
  GTEST_SKIP() << "built without CUTLASS / sm_100a support: the sm_100 NVFP4 GEMM is not compiled";
}
#endif

}  // namespace
}  // namespace lowbit
