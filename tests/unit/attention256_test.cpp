// Head dim 256 (issue 4): the CPU backend's attention at D = 256 against the fp64 reference, and
// the argument errors around the CUDA head dims: D outside {64, 128, 256} on CUDA is refused by
// every entry (attention, attention_int8, quantize_v_fp8, the prologue) before anything runs,
// naming the op, the argument and expected vs got; on a GPU, every kernel choice runs D = 256
// (wgmma / wgmma_r3: the head-dim-256 wgmma kernel, session 11) with matching outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lowbit/attention.h"
#include "lowbit/prologue.h"
#include "lowbit/runtime.h"
#include "tests/harness/harness.h"

namespace lowbit {
namespace {

using harness::HostTensor;

// A view that claims to live on CUDA (the checks below fail before any access to it).
TensorView fake_cuda(HostTensor& t) {
  TensorView v = t.view();
  v.device = Device::cuda;
  return v;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nexpected: " << part;
}

TEST(Attention256, CudaHeadDimOutsideTheSetIsRefused) {
  for (int64_t D : {96, 192, 320, 512}) {
    SCOPED_TRACE("D = " + std::to_string(D));
    const std::string want = "expected 64, 128 or 256, got " + std::to_string(D);
    HostTensor q(DType::bf16, {1, 4, 2, D}), k(DType::bf16, {1, 4, 2, D}),
        v(DType::bf16, {1, 4, 2, D}), out(DType::bf16, {1, 4, 2, D});
    const std::string a = error_of([&] {
      Context ctx;
      attention(fake_cuda(q), fake_cuda(k), fake_cuda(v), fake_cuda(out), nullptr,
                AttentionOptions{}, ctx);
    });
    expect_has(a, "attention");
    expect_has(a, want);
    HostTensor q8(DType::i8, {1, 4, 2, D}), k8(DType::i8, {1, 4, 2, D});
    HostTensor qs(DType::f32, {1, 2, 1}), ks(DType::f32, {1, 2, 1});
    AttentionOptions f16;
    f16.pv = AttentionOptions::f16;
    const std::string i8 = error_of([&] {
      Context ctx;
      attention_int8(QuantizedRows{fake_cuda(q8), fake_cuda(qs), ScaleLayout::per_block, 128},
                     QuantizedRows{fake_cuda(k8), fake_cuda(ks), ScaleLayout::per_block, 64},
                     fake_cuda(v), nullptr, nullptr, nullptr, fake_cuda(out), nullptr, f16, ctx);
    });
    expect_has(i8, "attention_int8");
    expect_has(i8, want);
    HostTensor v8(DType::e4m3, {1, 2, D, 64}), vs(DType::f32, {1, 2, D});
    const std::string qv = error_of([&] {
      Context ctx;
      quantize_v_fp8(fake_cuda(v), fake_cuda(v8), fake_cuda(vs), nullptr, ctx);
    });
    expect_has(qv, "quantize_v_fp8");
    expect_has(qv, want);
    const std::string pq = error_of([&] {
      Context ctx;
      Prologue p;
      p.block = 64;
      HostTensor sc(DType::f32, {1, 2, prologue_scale_count(4, p.layout, p.block)});
      norm_rope_quantize(fake_cuda(q), p, fake_cuda(q8), fake_cuda(sc), ctx);
    });
    expect_has(pq, "norm_rope_quantize");
    expect_has(pq, want);
  }
}

// One-call attention at D = 256 on the CPU against fp64 (both P·V modes, causal, GQA, odd sizes).
TEST(Attention256, CpuOneCallMatchesFp64) {
  std::mt19937_64 rng(harness::case_seed("Attention256.CpuOneCallMatchesFp64"));
  const int64_t B = 1, Nq = 37, Nkv = 70, Hq = 4, Hkv = 2, D = 256;
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16})
    for (auto causal : {AttentionOptions::none, AttentionOptions::bottom_right}) {
      AttentionOptions o;
      o.pv = pv;
      o.causal = causal;
      HostTensor q(DType::bf16, {B, Nq, Hq, D}), k(DType::bf16, {B, Nkv, Hkv, D}),
          v(DType::bf16, {B, Nkv, Hkv, D}), out(DType::bf16, {B, Nq, Hq, D});
      q.fill_normal(rng);
      k.fill_normal(rng, 0.5f);
      v.fill_normal(rng);
      Context ctx;
      attention(q.view(), k.view(), v.view(), out.view(), nullptr, o, ctx);
      std::vector<double> ref(static_cast<size_t>(out.numel()));
      attention_reference_f64(q.view(), k.view(), v.view(), o, ref.data(), nullptr);
      double dot = 0, gg = 0, rr = 0, l1 = 0, r1 = 0;
      for (int64_t i = 0; i < out.numel(); ++i) {
        const double g = out.get(i), r = ref[static_cast<size_t>(i)];
        dot += g * r, gg += g * g, rr += r * r, l1 += std::fabs(g - r), r1 += std::fabs(r);
      }
      const double cos = dot / std::sqrt(gg * rr), rel = l1 / r1;
      SCOPED_TRACE(std::string(pv == AttentionOptions::fp8 ? "fp8" : "f16") +
                   (causal ? " causal" : ""));
      EXPECT_GT(cos, pv == AttentionOptions::fp8 ? 0.998 : 0.9995);
      EXPECT_LT(rel, pv == AttentionOptions::fp8 ? 0.06 : 0.03);
    }
}

// On a GPU: every kernel choice runs D = 256 (wgmma / wgmma_r3: the head-dim-256 wgmma kernel
// on sm_90a, else refused naming the GPU; auto: the wgmma kernel on sm_90a since session 11,
// else the mma.sync kernel; mma_sync: the mma.sync kernel, the reference), and the other
// choices' output agrees with the mma.sync kernel's (both P·V modes, causal, 130 keys: three
// 64-key stages, the last one partial).
TEST(Attention256, CudaKernelChoices) {
  if (!built_with_cuda() || cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  const int64_t B = 1, N = 130, H = 1, D = 256;
  HostTensor hq(DType::bf16, {B, N, H, D});
  std::mt19937_64 rng(3);
  hq.fill_normal(rng);
  Buffer q(Device::cuda, hq.bytes.size()), k(Device::cuda, hq.bytes.size()),
      v(Device::cuda, hq.bytes.size()), out(Device::cuda, hq.bytes.size());
  Context ctx;
  for (Buffer* b : {&q, &k, &v}) copy_to_device(b->data(), hq.bytes.data(), hq.bytes.size(), ctx);
  synchronize(ctx);
  auto view = [&](Buffer& b) { return make_view(b.data(), DType::bf16, {B, N, H, D}, Device::cuda); };
  for (auto pv : {AttentionOptions::fp8, AttentionOptions::f16}) {
    HostTensor ref(DType::bf16, {B, N, H, D}), got(DType::bf16, {B, N, H, D});
    for (auto kernel : {AttentionOptions::mma_sync, AttentionOptions::auto_kernel,
                        AttentionOptions::wgmma, AttentionOptions::wgmma_r3}) {
      SCOPED_TRACE(std::string(pv == AttentionOptions::fp8 ? "fp8" : "f16") + " kernel " +
                   std::to_string(static_cast<int>(kernel)));
      AttentionOptions o;
      o.kernel = kernel;
      o.pv = pv;
      o.causal = AttentionOptions::bottom_right;
      const std::string e =
          error_of([&] { attention(view(q), view(k), view(v), view(out), nullptr, o, ctx); });
      if (kernel != AttentionOptions::auto_kernel && kernel != AttentionOptions::mma_sync &&
          !e.empty()) {  // a GPU without the sm_90a kernel
        expect_has(e, "options.kernel");
        expect_has(e, "got head dim 256 on a GPU without the sm_90a kernel");
        continue;
      }
      EXPECT_EQ(e, "");
      HostTensor& dst = kernel == AttentionOptions::mma_sync ? ref : got;
      copy_to_host(dst.bytes.data(), out.data(), dst.bytes.size(), ctx);
      synchronize(ctx);
      if (kernel == AttentionOptions::mma_sync) continue;
      double l1 = 0, r1 = 0, worst = 0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        const double d = std::fabs(double{got.get(i)} - ref.get(i));
        l1 += d;
        r1 += std::fabs(ref.get(i));
        worst = std::max(worst, d);
      }
      EXPECT_LT(l1 / r1, 0.02);
      EXPECT_LT(worst, 0.1);
    }
  }
}

}  // namespace
}  // namespace lowbit
