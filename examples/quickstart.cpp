// lowbit quickstart: one call per op family on the CPU backend (the same calls run on CUDA with
// device tensors and ctx.cuda_stream set). Built and run by ctest (`example.quickstart`), so the
// README's excerpt of it stays true.
#include <lowbit/lowbit.h>
#include <lowbit/attention.h>
#include <lowbit/decode.h>
#include <lowbit/linear.h>
#include <lowbit/prologue.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace lowbit;

int main() {
  Context ctx;  // ctx.cuda_stream = your cudaStream_t for GPU tensors
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };

  // core: bit-exact dtype conversion.
  std::vector<float> x = randn(64);
  std::vector<uint8_t> x8(64);
  convert(make_view(x.data(), DType::f32, {64}), make_view(x8.data(), DType::e4m3, {64}), ctx);

  // prologue: RMSNorm + INT8 quantization of k in SageAttention-2's THREAD_K layout.
  const int64_t B = 1, N = 100, H = 2, D = 64;
  std::vector<float> k = randn(B * N * H * D), norm_w(D, 1.f);
  std::vector<int8_t> k8(k.size());
  const int64_t n_scales = prologue_scale_count(N, ScaleLayout::thread_k, 64);  // per (b, h)
  std::vector<float> k_scale(B * H * n_scales);
  TensorView w = make_view(norm_w.data(), DType::f32, {D});
  Prologue p;
  p.norm_weight = &w;
  p.layout = ScaleLayout::thread_k;
  p.block = 64;
  norm_rope_quantize(make_view(k.data(), DType::f32, {B, N, H, D}), p,
                     make_view(k8.data(), DType::i8, {B, N, H, D}),
                     make_view(k_scale.data(), DType::f32, {B, H, n_scales}), ctx);

  // attention: INT8 QK, 16-bit PV, bottom-right causal, from fp32 q, k, v (CPU).
  std::vector<float> q = randn(B * N * H * D), v = randn(B * N * H * D), o(q.size());
  AttentionOptions ao;
  ao.causal = AttentionOptions::bottom_right;
  ao.pv = AttentionOptions::f16;
  attention(make_view(q.data(), DType::f32, {B, N, H, D}), make_view(k.data(), DType::f32, {B, N, H, D}),
            make_view(v.data(), DType::f32, {B, N, H, D}), make_view(o.data(), DType::f32, {B, N, H, D}),
            nullptr, ao, ctx);
  // ... as a DiT block: q / k RMSNorm and RoPE ((cos, sin) table, split halves) inside the call.
  std::vector<float> table(N * (D / 2) * 2);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = static_cast<double>(n) * std::pow(10000.0, -2.0 * static_cast<double>(i) / D);
      table[(n * (D / 2) + i) * 2] = static_cast<float>(std::cos(a));
      table[(n * (D / 2) + i) * 2 + 1] = static_cast<float>(std::sin(a));
    }
  Rope rope{make_view(table.data(), DType::f32, {1, N, 1, D / 2, 2}), /*interleaved=*/false};
  Prologue qk;  // the call reads its norm_weight, weight_rows, eps, rope and scale_eps
  qk.norm_weight = &w;
  qk.rope = &rope;
  ao.q_prologue = ao.k_prologue = &qk;
  attention(make_view(q.data(), DType::f32, {B, N, H, D}), make_view(k.data(), DType::f32, {B, N, H, D}),
            make_view(v.data(), DType::f32, {B, N, H, D}), make_view(o.data(), DType::f32, {B, N, H, D}),
            nullptr, ao, ctx);

  // linear: a ConvRot int8 layer (rotation, quantized weights, fused epilogue).
  const int64_t M = 5, K = 256, O = 64;
  std::vector<float> weight = randn(O * K), xs = randn(M * K), y(M * O);
  QuantizedLinear layer =
      QuantizedLinear::quantize(make_view(weight.data(), DType::f32, {O, K}), parse_qtype("convrot8"), ctx);
  layer.forward(make_view(xs.data(), DType::f32, {M, K}), nullptr, make_view(y.data(), DType::f32, {M, O}), ctx);

  // decode: int4 KV cache (xformers layout), append 10 tokens, split-K decode for 4 query heads.
  const int64_t L = 64, Hkv = 1, G = 4;
  std::vector<int32_t> kc(B * L * Hkv * (1 + D / 8)), vc(kc.size()), len{10}, pos{0};
  KvCache cache;
  cache.format = KvFormat::int4;
  cache.k = make_view(kc.data(), DType::i32, {B, L, Hkv, 1 + D / 8});
  cache.v = make_view(vc.data(), DType::i32, {B, L, Hkv, 1 + D / 8});
  cache.seq_len = make_view(len.data(), DType::i32, {B});
  std::vector<float> knew = randn(B * 10 * Hkv * D);
  kv_append(cache, make_view(knew.data(), DType::f32, {B, 10, Hkv, D}),
            make_view(knew.data(), DType::f32, {B, 10, Hkv, D}), make_view(pos.data(), DType::i32, {B}), ctx);
  DecodePlan plan = plan_decode(cache, 1, static_cast<int>(Hkv * G), static_cast<int>(D), ctx);
  std::vector<uint8_t> workspace(workspace_bytes(plan));
  std::vector<float> qd = randn(B * Hkv * G * D), od(qd.size());
  decode_attention(make_view(qd.data(), DType::f32, {B, 1, Hkv, G, D}), cache, plan, workspace.data(),
                   make_view(od.data(), DType::f32, {B, 1, Hkv, G, D}), nullptr, nullptr, 0.f, false, ctx);

  // Errors name the op, the argument, expected and got; nothing is written.
  try {
    convert(make_view(x.data(), DType::f32, {64}), make_view(x8.data(), DType::e4m3, {32}), ctx);
    return 1;
  } catch (const Error& e) {
    std::printf("expected error: %s\n", e.what());
  }
  bool finite = std::isfinite(o[0]) && std::isfinite(y[0]) && std::isfinite(od[0]);
  std::printf("lowbit %s quickstart: %s\n", version_string(), finite ? "ok" : "non-finite output");
  return finite ? 0 : 1;
}
