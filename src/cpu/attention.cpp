// Attention family front (SPEC §2): scale-layout helpers, argument validation, dispatch to the CPU
// or CUDA backend, and the one-call attention() that quantizes bf16/f16 q, k, v first.
#include "lowbit/attention.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lowbit/prologue.h"
#include "lowbit/runtime.h"
#include "src/core/backends.h"
#include "src/core/check.h"
#include "src/core/guarded.h"
#include "src/core/prologue_internal.h"
#include "src/core/scratch.h"
#include "src/core/stream_fork.h"
#include "src/cpu/attention_backend.h"

namespace lowbit {

int64_t scale_index(ScaleLayout layout, int block, int64_t row) {
  const int64_t r = row % block;
  int64_t group = 0;
  switch (layout) {
    case ScaleLayout::per_block:
      group = 0;
      break;
    case ScaleLayout::thread_q:
      group = r % 8;
      break;
    case ScaleLayout::thread_k:
      group = (r % 8) / 2;
      break;
    case ScaleLayout::warp_q:
      group = r / 32;
      break;
  }
  return (row / block) * scale_groups(layout) + group;
}

int64_t scale_count(ScaleLayout layout, int block, int64_t rows) {
  const int64_t pad = layout == ScaleLayout::thread_q ? 128 : block;
  return (rows + pad - 1) / pad * (pad / block) * scale_groups(layout);
}

namespace {

const char* layout_name(ScaleLayout l) {
  switch (l) {
    case ScaleLayout::per_block:
      return "per_block";
    case ScaleLayout::thread_q:
      return "thread_q";
    case ScaleLayout::thread_k:
      return "thread_k";
    case ScaleLayout::warp_q:
      return "warp_q";
  }
  return "?";
}

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

void check_shape(const char* op, const char* arg, const TensorView& t,
                 std::initializer_list<int64_t> shape) {
  check::ndim(op, arg, t, static_cast<int>(shape.size()));
  int d = 0;
  for (int64_t s : shape) check::dim(op, arg, t, d++, s);
}

void check_layout(const char* op, const char* arg, ScaleLayout layout, int block) {
  LOWBIT_CHECK(block > 0 && block % 8 == 0, op, arg,
               "block: expected a positive multiple of 8, got " + std::to_string(block));
  if (layout == ScaleLayout::thread_q)
    LOWBIT_CHECK(128 % block == 0, op, arg,
                 "thread_q block: expected a divisor of 128, got " + std::to_string(block));
  if (layout == ScaleLayout::warp_q)
    LOWBIT_CHECK(block == 128, op, arg,
                 std::string("warp_q block: ") + check::expected_got(128, block));
}

// Every stride but the innermost a multiple of `elems`, and the data 16-byte aligned.
void check_vector_aligned(const char* op, const char* arg, const TensorView& t, int elems) {
  check::aligned(op, arg, t.data, 16);
  for (int d = 0; d + 1 < t.ndim; ++d)
    LOWBIT_CHECK(t.shape[d] <= 1 || t.stride[d] % elems == 0, op, arg,
                 "stride " + std::to_string(d) + ": expected a multiple of " +
                     std::to_string(elems) + " elements on CUDA, got " +
                     std::to_string(t.stride[d]));
}

void check_quantized(const char* op, const char* arg, const char* scale_arg,
                     const QuantizedRows& r) {
  check::not_null(op, arg, r.data);
  check::not_null(op, scale_arg, r.scale);
  check::dtype(op, arg, r.data, {DType::i8});
  check::ndim(op, arg, r.data, 4);
  check::inner_contiguous(op, arg, r.data);
  check_layout(op, arg, r.layout, r.block);
  check::dtype(op, scale_arg, r.scale, {DType::f32});
  check::ndim(op, scale_arg, r.scale, 3);
  check::dim(op, scale_arg, r.scale, 0, r.data.shape[0]);
  check::dim(op, scale_arg, r.scale, 1, r.data.shape[2]);
  const int64_t need = scale_count(r.layout, r.block, r.data.shape[1]);
  LOWBIT_CHECK(r.scale.shape[2] >= need, op, scale_arg,
               std::string("scales per head (") + layout_name(r.layout) + ", block " +
                   std::to_string(r.block) + "): expected >= " + std::to_string(need) + ", got " +
                   std::to_string(r.scale.shape[2]));
  check::same_device(op, scale_arg, r.scale, arg, r.data);
}

void check_head_vector(const char* op, const char* arg, const TensorView* t, int64_t b, int64_t h,
                       int64_t d, const TensorView& ref) {
  if (!t) return;
  check::not_null(op, arg, *t);
  check::dtype(op, arg, *t, {DType::f32});
  check_shape(op, arg, *t, {b, h, d});
  check::contiguous(op, arg, *t);
  check::same_device(op, arg, *t, "q", ref);
}

float resolve_sm_scale(float s, int64_t d) {
  return s != 0.f ? s : 1.f / std::sqrt(static_cast<float>(d));
}

// quantize_v_fp8 of a padded varlen batch read in place (CUDA; rows / lens per item, or null).
void quantize_v_fp8_items(const TensorView& v, TensorView v_fp8, TensorView v_scale,
                          TensorView* v_mean, Context& ctx, const int32_t* rows,
                          const int32_t* lens) {
  const char* op = "quantize_v_fp8";
  check::not_null(op, "v", v);
  check::ndim(op, "v", v, 4);
  check::dtype(op, "v", v, {DType::bf16, DType::f16, DType::f32});
  check::inner_contiguous(op, "v", v);
  const int64_t B = v.shape[0], N = v.shape[1], H = v.shape[2], D = v.shape[3];
  check::not_null(op, "v_fp8", v_fp8);
  check::dtype(op, "v_fp8", v_fp8, {DType::e4m3});
  check_shape(op, "v_fp8", v_fp8, {B, H, D, round_up(N, 64)});
  check::contiguous(op, "v_fp8", v_fp8);
  check::same_device(op, "v_fp8", v_fp8, "v", v);
  check_head_vector(op, "v_scale", &v_scale, B, H, D, v);
  check_head_vector(op, "v_mean", v_mean, B, H, D, v);
  if (v.device == Device::cuda) {
    LOWBIT_CHECK(D == 64 || D == 128 || D == 256, op, "v",
                 "head dim on CUDA: expected 64, 128 or 256, got " + std::to_string(D));
    LOWBIT_CHECK(v.dtype != DType::f32, op, "v", "dtype on CUDA: expected bf16 or f16, got f32");
  }
  if (v.numel() == 0 && v_fp8.numel() == 0 && v_scale.numel() == 0) return;
  if (v.device == Device::cpu) {
    cpu::quantize_v_fp8(v, v_fp8, v_scale, v_mean, ctx, rows, lens);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::quantize_v_fp8(v, v_fp8, v_scale, v_mean, ctx, rows, lens));
  }
}

}  // namespace

void quantize_v_fp8(const TensorView& v, TensorView v_fp8, TensorView v_scale, TensorView* v_mean,
                    Context& ctx) {
  quantize_v_fp8_items(v, v_fp8, v_scale, v_mean, ctx, nullptr, nullptr);
}

namespace {

// attention_int8 with a padded varlen batch's per-item lengths (CUDA; null: none).
void attention_int8_items(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                          const TensorView* v_scale, const TensorView* v_mean,
                          const TensorView* k_mean, TensorView out, TensorView* lse_out,
                          const AttentionOptions& options, Context& ctx,
                          const detail::VarlenItems* items) {
  const char* op = "attention_int8";
  check_quantized(op, "q", "q_scale", q);
  check_quantized(op, "k", "k_scale", k);
  const int64_t B = q.data.shape[0], Nq = q.data.shape[1], Hq = q.data.shape[2],
                D = q.data.shape[3];
  const int64_t Nkv = k.data.shape[1], Hkv = k.data.shape[2];
  check::dim(op, "k", k.data, 0, B);
  check::dim(op, "k", k.data, 3, D);
  check::same_device(op, "k", k.data, "q", q.data);
  LOWBIT_CHECK(Hkv > 0 && Hq % Hkv == 0, op, "k",
               "heads: expected a divisor of q's " + std::to_string(Hq) + " heads, got " +
                   std::to_string(Hkv));
  LOWBIT_CHECK(D > 0 && D % 16 == 0, op, "q",
               "head dim: expected a multiple of 16, got " + std::to_string(D));
  const bool on_cuda = q.data.device == Device::cuda;
  if (on_cuda) {
    LOWBIT_CHECK(D == 64 || D == 128 || D == 256, op, "q",
                 "head dim on CUDA: expected 64, 128 or 256, got " + std::to_string(D));
  }
  LOWBIT_CHECK(options.causal <= AttentionOptions::top_left, op, "options.causal",
               "expected none, bottom_right or top_left");
  LOWBIT_CHECK(options.pv <= AttentionOptions::f16, op, "options.pv", "expected fp8 or f16");
  LOWBIT_CHECK(options.kernel <= AttentionOptions::wgmma_r3, op, "options.kernel",
               "expected auto_kernel, mma_sync, wgmma or wgmma_r3");
  check::not_null(op, "out", out);
  check::dtype(op, "out", out,
               on_cuda ? std::initializer_list<DType>{DType::bf16, DType::f16}
                       : std::initializer_list<DType>{DType::bf16, DType::f16, DType::f32});
  check_shape(op, "out", out, {B, Nq, Hq, D});
  check::inner_contiguous(op, "out", out);
  check::same_device(op, "out", out, "q", q.data);
  check::not_null(op, "v", v);
  if (options.pv == AttentionOptions::fp8) {
    check::dtype(op, "v", v, {DType::e4m3});
    check_shape(op, "v", v, {B, Hkv, D, round_up(Nkv, 64)});
    check::contiguous(op, "v", v);
    LOWBIT_CHECK(v_scale != nullptr, op, "v_scale",
                 "expected (B, Hkv, D) f32 in fp8 PV mode, got null");
    check_head_vector(op, "v_scale", v_scale, B, Hkv, D, q.data);
    check_head_vector(op, "v_mean", v_mean, B, Hkv, D, q.data);
  } else {
    check::dtype(op, "v", v, {out.dtype});
    check_shape(op, "v", v, {B, Nkv, Hkv, D});
    check::inner_contiguous(op, "v", v);
    LOWBIT_CHECK(v_scale == nullptr, op, "v_scale",
                 "expected null in 16-bit PV mode, got a tensor");
    LOWBIT_CHECK(v_mean == nullptr, op, "v_mean", "expected null in 16-bit PV mode, got a tensor");
  }
  check::same_device(op, "v", v, "q", q.data);
  check_head_vector(op, "k_mean", k_mean, B, Hkv, D, q.data);
  if (lse_out) {
    check::not_null(op, "lse_out", *lse_out);
    check::dtype(op, "lse_out", *lse_out, {DType::f32});
    check_shape(op, "lse_out", *lse_out, {B, Hq, Nq});
    check::same_device(op, "lse_out", *lse_out, "q", q.data);
  }
  if (on_cuda) {
    check_vector_aligned(op, "q", q.data, 16);
    check_vector_aligned(op, "k", k.data, 16);
    if (options.pv == AttentionOptions::f16)
      check_vector_aligned(op, "v", v, 8);
    else
      check::aligned(op, "v", v.data, 16);
    check::aligned(op, "out", out.data, 4);
    for (int d = 0; d < 3; ++d)
      LOWBIT_CHECK(out.stride[d] % 2 == 0, op, "out",
                   "strides on CUDA: expected even strides, got " + out.describe());
  }
  if (B == 0 || Nq == 0 || Hq == 0) return;
  const float sm = resolve_sm_scale(options.sm_scale, D);
  if (!on_cuda) {
    cpu::attention_int8(q, k, v, v_scale, v_mean, k_mean, out, lse_out, sm, options, ctx, items);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::attention_int8(q, k, v, v_scale, v_mean, k_mean, out, lse_out, sm,
                                              options, ctx, items));
  }
}

}  // namespace

void attention_int8(const QuantizedRows& q, const QuantizedRows& k, const TensorView& v,
                    const TensorView* v_scale, const TensorView* v_mean, const TensorView* k_mean,
                    TensorView out, TensorView* lse_out, const AttentionOptions& options,
                    Context& ctx) {
  attention_int8_items(q, k, v, v_scale, v_mean, k_mean, out, lse_out, options, ctx, nullptr);
}

namespace {

void validate_attention_call(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView* lse_out,
                             const char* op = "attention") {
  check::not_null(op, "q", q);
  check::not_null(op, "k", k);
  check::not_null(op, "v", v);
  check::ndim(op, "q", q, 4);
  const bool on_cuda = q.device == Device::cuda;
  check::dtype(op, "q", q,
               on_cuda ? std::initializer_list<DType>{DType::bf16, DType::f16}
                       : std::initializer_list<DType>{DType::bf16, DType::f16, DType::f32});
  check::inner_contiguous(op, "q", q);
  const int64_t B = q.shape[0], Nq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  check::ndim(op, "k", k, 4);
  check::dtype(op, "k", k, {q.dtype});
  check::inner_contiguous(op, "k", k);
  check::same_device(op, "k", k, "q", q);
  check::dim(op, "k", k, 0, B);
  check::dim(op, "k", k, 3, D);
  const int64_t Hkv = k.shape[2];
  LOWBIT_CHECK(Hkv > 0 && Hq % Hkv == 0, op, "k",
               "heads: expected a divisor of q's " + std::to_string(Hq) + " heads, got " +
                   std::to_string(Hkv));
  check::dtype(op, "v", v, {q.dtype});
  check::same_shape(op, "v", v, "k", k);
  check::inner_contiguous(op, "v", v);
  check::same_device(op, "v", v, "q", q);
  check::not_null(op, "out", out);
  check::dtype(op, "out", out, {q.dtype});
  check::same_shape(op, "out", out, "q", q);
  check::inner_contiguous(op, "out", out);
  check::same_device(op, "out", out, "q", q);
  LOWBIT_CHECK(D > 0 && D % 16 == 0, op, "q",
               "head dim: expected a multiple of 16, got " + std::to_string(D));
  if (on_cuda)
    LOWBIT_CHECK(D == 64 || D == 128 || D == 256, op, "q",
                 "head dim on CUDA: expected 64, 128 or 256, got " + std::to_string(D));
  if (lse_out) {
    check::not_null(op, "lse_out", *lse_out);
    check::dtype(op, "lse_out", *lse_out, {DType::f32});
    check_shape(op, "lse_out", *lse_out, {B, Hq, Nq});
    check::same_device(op, "lse_out", *lse_out, "q", q);
  }
  if (on_cuda) {
    check_vector_aligned(op, "q", q, 8);  // the prologue's loads
    check_vector_aligned(op, "k", k, 8);
    check_vector_aligned(op, "v", v, 8);
    check::aligned(op, "out", out.data, 4);
    for (int d = 0; d < 3; ++d)
      LOWBIT_CHECK(out.stride[d] % 2 == 0, op, "out",
                   "strides on CUDA: expected even strides, got " + out.describe());
  }
}

// The workspace of attention(): INT8 q/k (contiguous NHD), their scales, the K mean and fp8 V,
// each 256-byte aligned.
struct Workspace {
  static constexpr ScaleLayout kQLayout = ScaleLayout::thread_q, kKLayout = ScaleLayout::thread_k;
  static constexpr int kQBlock = 32, kKBlock = 64;
  size_t q8 = 0, qs = 0, k8 = 0, ks = 0, km = 0, v8 = 0, vs = 0, vm = 0, total = 0;
  int64_t nqs = 0, nks = 0, vpad = 0;

  Workspace(const TensorView& q, const TensorView& k, const AttentionOptions& o) {
    const int64_t B = q.shape[0], Nq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
    const int64_t Nkv = k.shape[1], Hkv = k.shape[2];
    const bool fp8 = o.pv == AttentionOptions::fp8;
    nqs = scale_count(kQLayout, kQBlock, Nq);
    nks = scale_count(kKLayout, kKBlock, Nkv);
    vpad = round_up(Nkv, 64);
    auto take = [&](int64_t bytes) {
      const size_t at = total;
      total += static_cast<size_t>(round_up(bytes, 256));
      return at;
    };
    q8 = take(B * Nq * Hq * D);
    qs = take(B * Hq * nqs * 4);
    k8 = take(B * Nkv * Hkv * D);
    ks = take(B * Hkv * nks * 4);
    km = take(o.smooth_k ? B * Hkv * D * 4 : 0);
    v8 = take(fp8 ? B * Hkv * D * vpad : 0);
    vs = take(fp8 ? B * Hkv * D * 4 : 0);
    vm = take(fp8 && o.smooth_v ? B * Hkv * D * 4 : 0);
  }
};

}  // namespace

namespace {

// Whether k's weight_rows are q's (the same view) over at least as many weight rows: checked once.
bool same_weight_rows(const Prologue& q, const Prologue& k) {
  if (!q.weight_rows || !k.weight_rows || !q.norm_weight || !k.norm_weight) return false;
  const TensorView &a = *q.weight_rows, &b = *k.weight_rows;
  return a.data == b.data && a.device == b.device && a.device_index == b.device_index &&
         a.ndim == 1 && b.ndim == 1 && a.shape[0] == b.shape[0] && a.stride[0] == b.stride[0] &&
         a.dtype == b.dtype && k.norm_weight->ndim == 2 && q.norm_weight->ndim == 2 &&
         k.norm_weight->shape[0] >= q.norm_weight->shape[0];
}

// options.q_prologue / k_prologue against q and k (k's only where it has tokens: nothing to
// normalize otherwise). weight_rows' index ranges are read back on rows_ctx's stream, once per
// distinct view (joint attention's q and k share theirs), or not at all where rows_ctx is null.
void check_qk_prologues(const char* op, const TensorView& q, const TensorView& k,
                        const AttentionOptions& o, const Context* rows_ctx) {
  const bool q_checked = o.q_prologue && q.shape[1] > 0;
  if (q_checked)
    detail::check_prologue_inputs(op, "options.q_prologue", q, *o.q_prologue, rows_ctx);
  if (o.k_prologue && k.shape[1] > 0) {
    const bool shared = q_checked && o.q_prologue->check_weight_rows &&
                        same_weight_rows(*o.q_prologue, *o.k_prologue);
    detail::check_prologue_inputs(op, "options.k_prologue", k, *o.k_prologue,
                                  shared ? nullptr : rows_ctx);
  }
}

// The norm / rope parts of a caller's Prologue in the call's own (layout, block, sm_scale).
void take_norm_rope(const Prologue* from, Prologue& to) {
  if (!from) return;
  to.norm_weight = from->norm_weight;
  to.weight_rows = from->weight_rows;
  to.check_weight_rows = from->check_weight_rows;
  to.eps = from->eps;
  to.norm_scope = from->norm_scope;
  to.rope = from->rope;
  to.scale_eps = from->scale_eps;
}

}  // namespace

size_t attention_workspace_bytes(const TensorView& q, const TensorView& k,
                                 const AttentionOptions& options) {
  check::ndim("attention_workspace_bytes", "q", q, 4);
  check::ndim("attention_workspace_bytes", "k", k, 4);
  return Workspace(q, k, options).total;
}

namespace {

// attention() on a workspace; rows_checked: the caller has read back the prologues' weight_rows
// (attention_varlen, once for every sequence).
// items: a padded varlen batch (CUDA; attention_varlen's buckets), or null.
void attention_on(const TensorView& q, const TensorView& k, const TensorView& v, TensorView out,
                  TensorView* lse_out, const AttentionOptions& options, void* workspace,
                  size_t workspace_bytes, Context& ctx, bool rows_checked,
                  const detail::VarlenItems* items = nullptr) {
  const char* op = "attention";
  validate_attention_call(q, k, v, out, lse_out);
  const Workspace ws(q, k, options);
  LOWBIT_CHECK(workspace_bytes >= ws.total && (ws.total == 0 || workspace != nullptr), op,
               "workspace",
               check::expected_got(">= " + std::to_string(ws.total) + " bytes",
                                   std::to_string(workspace_bytes) + " bytes"));
  check::aligned(op, "workspace", workspace, 256);
  const int64_t B = q.shape[0], Nq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t Nkv = k.shape[1], Hkv = k.shape[2];
  if (B == 0 || Nq == 0 || Hq == 0) return;
  check_qk_prologues(op, q, k, options, rows_checked ? nullptr : &ctx);
  const float sm = resolve_sm_scale(options.sm_scale, D);
  const Device dev = q.device;
  const int di = q.device_index;
  uint8_t* base = static_cast<uint8_t*>(workspace);
  const bool fp8 = options.pv == AttentionOptions::fp8;
  QuantizedRows qr, kr;
  qr.layout = Workspace::kQLayout;
  qr.block = Workspace::kQBlock;
  kr.layout = Workspace::kKLayout;
  kr.block = Workspace::kKBlock;
  qr.data = make_view(base + ws.q8, DType::i8, {B, Nq, Hq, D}, dev, di);
  qr.scale = make_view(base + ws.qs, DType::f32, {B, Hq, ws.nqs}, dev, di);
  kr.data = make_view(base + ws.k8, DType::i8, {B, Nkv, Hkv, D}, dev, di);
  kr.scale = make_view(base + ws.ks, DType::f32, {B, Hkv, ws.nks}, dev, di);
  TensorView kmean = make_view(base + ws.km, DType::f32, {B, Hkv, D}, dev, di);
  TensorView vfp8 = make_view(base + ws.v8, DType::e4m3, {B, Hkv, D, ws.vpad}, dev, di);
  TensorView vscale = make_view(base + ws.vs, DType::f32, {B, Hkv, D}, dev, di);
  TensorView vmean = make_view(base + ws.vm, DType::f32, {B, Hkv, D}, dev, di);
  const bool smooth_k = options.smooth_k && Nkv > 0;
  const bool smooth_v = fp8 && options.smooth_v;

  // The prologue (SPEC §1) quantizes q with sm_scale folded in, and k minus its mean; the kernel
  // then scales the logits by 1 (the LSE correction included). (Session 57: q quantized inside
  // the one-consumer kernel instead, same bits, lost at Wan's cross-attention, 0.91x: each CTA
  // then waits for its bf16 q from DRAM before its first q k^T; branch s57-fusedq,
  // docs/attention.md "Session 57".)
  // The three quantizations write disjoint parts of the workspace: on CUDA V's passes run on a
  // side stream beside the q prologue and the k path (at Flux's (1, 24, 4608, 128) each pass
  // alone leaves much of the memory bandwidth unused); the kernel below waits for both. The bits
  // do not depend on it. q and k stay on the caller's stream (q's prologue on a second side
  // stream saved nothing more at Flux). (One harness seed,
  // `LOWBIT_TEST_SEED=4203166174730258032 lowbit check --backend cuda --op
  // attention.varlen.fp8.causal_br.d128`, fails the same 4 of 233984 outputs with this form as
  // with q on a side stream (H200, session 22): deterministic, so the seed's own edge, not a
  // race; the failing row (346) sees 20 keys, where one INT8 code one apart (the GPU's div.full
  // against the CPU's IEEE division, SPEC §1) can move an output by 0.04, past
  // allclose(3e-2, 3e-2).)
  // Only for small V (H200, session 21: Flux 0.4705 -> 0.4602 ms, (1, 24, 4096, 64) 0.2781 ->
  // 0.2650); at (1, 40, 32760, 128) and (2, 24, 16384, 128) each pass already streams at memory
  // speed and the fork measured -0.5..+1.1 %, so the passes stay in sequence there.
  constexpr int64_t kForkMaxV = int64_t{1} << 25;  // V elements
  constexpr bool kForkQ = true;
  const bool fork_v = fp8 && B * Nkv * Hkv * D <= kForkMaxV;
  // Session 52: q's prologue on a second side stream too (tuning fork_q: 1 off, 2 on; 0 the
  // default below), so that q, k and V each stream beside the others.
  const int fork_q_knob = detail::attention_cuda_tuning().fork_q;
  Prologue qp;
  take_norm_rope(options.q_prologue, qp);
  qp.sm_scale = sm;
  qp.layout = qr.layout;
  qp.block = qr.block;
  // Session 57: on CUDA, where the keys are few (the fp8 kernel on one consumer warpgroup), q
  // without norm or rope is quantized inside the attention kernel (the q pass's codes and scales,
  // never written to memory): at Wan's cross-attention the pass moved more bytes than the kernel.
  // Session 58: each CTA's producer prefetches the q rows of the CTA two waves ahead into L2
  // (without that prefetch the form lost: 0.91x). Session 59: causal calls (the prefetch along
  // their longest-first walk) and D 64 too. Session 61: longer keys too, on the long-key kernels
  // (two consumers at D 128, three at D 64; the CTA a wave ahead prefetched), and the 16-bit
  // P·V mode's TMA-ring kernel likewise.
  // Where that kernel turns out not to apply after all (no TMA descriptor), the pass runs below.
  bool q_in_kernel = false;
#ifdef LOWBIT_WITH_CUDA
  q_in_kernel = dev == Device::cuda && !items && !qp.norm_weight && !qp.rope &&
                cuda::attention_q16_applies(q, k, out, options);
#endif
  const bool fork_q = fork_v && !q_in_kernel && (fork_q_knob == 0 ? kForkQ : fork_q_knob == 2);
  detail::StreamFork fork(ctx, dev, fork_v ? (fork_q ? 2 : 1) : 0,
                          !detail::attention_cuda_tuning().serial_passes, op);
  Context& q_ctx = fork_q ? fork.side(1) : ctx;
  auto q_pass = [&](Context& c) {
    // (weight_rows checked above: the prologue calls do not read them back again)
    // (a padded varlen batch in place: each item's rows from its packed row, its own count. Its
    // rows past the count get no codes, so they are zeroed first: the kernel then sees zero
    // rows there, as a lone call's tile sees past its Nq (TMA's zero fill), and gives the same
    // bits; rows of stale codes with a real group scale would steer the fp8 kernel's per-tile
    // fold vote.)
    if (items && items->q_rows)
      device_memset(qr.data.data, 0, static_cast<size_t>(B * Nq * Hq * D), c);
    detail::norm_rope_quantize_rows_checked(q, qp, qr.data, qr.scale, c,
                                            items && items->q_rows ? items->q_lens : nullptr,
                                            items ? items->q_rows : nullptr);
  };
  if (!q_in_kernel) q_pass(q_ctx);
  if (fp8)
    quantize_v_fp8_items(v, vfp8, vscale, smooth_v ? &vmean : nullptr, fork.side(0),
                         items ? items->v_rows : nullptr,
                         items && items->v_rows ? items->kv_lens : nullptr);
  if (Nkv > 0) {
    Prologue kp;
    take_norm_rope(options.k_prologue, kp);
    kp.layout = kr.layout;
    kp.block = kr.block;
    // (a padded varlen batch: k's mean divides by each item's keys, and no row past them is read
    // or reaches a scale; likewise for q and V)
    const int32_t* k_items = items ? items->kv_lens : nullptr;
    const int32_t* k_rows = items ? items->k_rows : nullptr;
    if (smooth_k) {  // one call: on CUDA its quantize pass loads k before the mean is done
      detail::norm_rope_mean_quantize_rows_checked(k, kp, kmean, kr.data, kr.scale, ctx, k_items,
                                                   k_rows);
    } else {
      detail::norm_rope_quantize_rows_checked(k, kp, kr.data, kr.scale, ctx, k_items, k_rows);
    }
  }
  fork.join();
  AttentionOptions inner = options;
  inner.sm_scale = 1.f;
#ifdef LOWBIT_WITH_CUDA
  if (q_in_kernel &&
      cuda::attention_int8_q16(q, qp.sm_scale, qp.scale_eps, kr, fp8 ? vfp8 : v,
                               fp8 ? &vscale : nullptr, smooth_v ? &vmean : nullptr,
                               smooth_k ? &kmean : nullptr, out, lse_out, inner, ctx))
    return;
#endif
  if (q_in_kernel) q_pass(ctx);
  attention_int8_items(qr, kr, fp8 ? vfp8 : v, fp8 ? &vscale : nullptr, smooth_v ? &vmean : nullptr,
                       smooth_k ? &kmean : nullptr, out, lse_out, inner, ctx, items);
}

}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v, TensorView out,
               TensorView* lse_out, const AttentionOptions& options, void* workspace,
               size_t workspace_bytes, Context& ctx) {
  attention_on(q, k, v, out, lse_out, options, workspace, workspace_bytes, ctx, false);
}

void attention(const TensorView& q, const TensorView& k, const TensorView& v, TensorView out,
               TensorView* lse_out, const AttentionOptions& options, Context& ctx) {
  validate_attention_call(q, k, v, out, lse_out);
  const size_t bytes = attention_workspace_bytes(q, k, options);
  // Stream-ordered on CUDA (src/core/scratch.h): released on ctx's stream behind the work, so
  // the call returns without waiting for the GPU. (+256: host allocations are 16-byte aligned.)
  detail::StreamBuffer ws(q.device, bytes + 256, ctx, "attention");
  attention(q, k, v, out, lse_out, options, ws.aligned(256), bytes, ctx);
}

namespace {

// Rows [r0, r1) of a (T, H, D) view as a (1, r1 - r0, H, D) view.
TensorView sequence_rows(const TensorView& t, int64_t r0, int64_t r1, int64_t items = 1) {
  TensorView v = t;
  v.ndim = 4;
  v.data = static_cast<char*>(t.data) + r0 * t.stride[0] * (dtype_bits(t.dtype) / 8);
  v.shape[0] = items;
  v.stride[0] = (r1 - r0) * t.stride[0];
  for (int d = 0; d < 3; ++d) {
    v.shape[d + 1] = d == 0 ? r1 - r0 : t.shape[d];
    v.stride[d + 1] = t.stride[d];
  }
  return v;
}

// Columns [c0, c1) of an (H, T) view as a (1, H, c1 - c0) view; items > 1: that many such
// column ranges one after the other, as a (items, H, c1 - c0) view.
TensorView sequence_lse(const TensorView& t, int64_t c0, int64_t c1, int64_t items = 1) {
  TensorView v = t;
  v.ndim = 3;
  v.data = static_cast<char*>(t.data) + c0 * t.stride[1] * 4;
  v.shape[0] = items;
  v.shape[1] = t.shape[0];
  v.shape[2] = c1 - c0;
  v.stride[0] = items > 1 ? (c1 - c0) * t.stride[1] : t.shape[0] * t.stride[0];
  v.stride[1] = t.stride[0];
  v.stride[2] = t.stride[1];
  return v;
}

void check_offsets(const char* op, const char* arg, const std::vector<int64_t>& cu, int64_t total,
                   size_t n) {
  LOWBIT_CHECK(cu.size() == n, op, arg,
               check::expected_got(std::to_string(n) + " offsets (as many as the other)",
                                   std::to_string(cu.size())));
  LOWBIT_CHECK(!cu.empty() && cu.front() == 0, op, arg,
               "expected 0 as the first offset, got " +
                   (cu.empty() ? std::string("no offsets") : std::to_string(cu.front())));
  for (size_t i = 1; i < cu.size(); ++i)
    LOWBIT_CHECK(cu[i] >= cu[i - 1], op, arg,
                 "expected nondecreasing offsets, got " + std::to_string(cu[i - 1]) + " then " +
                     std::to_string(cu[i]) + " at " + std::to_string(i));
  LOWBIT_CHECK(cu.back() == total, op, arg,
               check::expected_got(std::to_string(total) + " (the tokens) as the last offset",
                                   std::to_string(cu.back())));
}

// A Prologue's per-token parts (rope table rows, weight_rows) for the packed rows [r0, r1) of a
// variable-length batch (items > 1: that many runs of r1 - r0 rows one after the other, the
// table as one of (items, r1 - r0) rows; no weight_rows then); `p` points into this object (not
// copyable).
struct PrologueRows {
  Prologue p;
  Rope rope;
  TensorView rows;
  PrologueRows(const Prologue* from, int64_t r0, int64_t r1, int64_t items = 1) {
    if (!from) return;
    p = *from;
    if (from->rope) {
      rope = *from->rope;
      rope.table.data = static_cast<char*>(rope.table.data) +
                        r0 * rope.table.stride[1] * (dtype_bits(rope.table.dtype) / 8);
      rope.table.shape[1] = r1 - r0;
      if (items > 1) {
        rope.table.shape[0] = items;
        rope.table.stride[0] = (r1 - r0) * rope.table.stride[1];
      }
      p.rope = &rope;
    }
    if (from->weight_rows) {
      rows = *from->weight_rows;
      rows.data = static_cast<char*>(rows.data) + r0 * rows.stride[0] * 4;
      rows.shape[0] = r1 - r0;
      p.weight_rows = &rows;
    }
  }
  PrologueRows(const PrologueRows&) = delete;
  PrologueRows& operator=(const PrologueRows&) = delete;
};

// ---- attention_varlen's padded buckets (CUDA; session 51) ----
// Sequences of different lengths would each be a call of their own (~9 launches, ~25 us of host
// and launch time apiece at a few hundred tokens). A bucket of up to kVarlenMaxItems of them runs
// as one attention() chain on an (items, L, H, D) batch padded to its longest member, each item
// read and written at its own packed rows (detail::VarlenItems: the passes read only the item's
// rows, so no other row reaches its scales or means; the kernel masks its padding keys and
// stores only its rows). Every output equals the sequence's own call but for the K mean's fp32
// sum order (its chunks follow the padded length): within the mean's tolerance.
struct Seq {
  int64_t q0, k0, nq, nk;
  size_t run;  // attention_varlen's index of the run (of one) it came from
};

[[maybe_unused]] int64_t esize(const TensorView& t) { return dtype_bits(t.dtype) / 8; }

// Padded rows (and tokens) a bucket may hold per real one.
constexpr double kVarlenPadWaste = 1.5;
// The cost model that decides whether a sequence joins a bucket (session 51, `attention.varlen`;
// rows = q rows x q heads + 2 x key rows x kv heads): a call of its own costs ~25 us plus ~0.4 ns
// a row (H200: 64 sequences of 256 tokens, H 24, 2.92 ms a call each, 0.41 ms as one batch); a
// padded bucket ~0.45 ns a padded row (64 sequences of 192..318 tokens padded to 318: 0.55 ms).
// So a sequence joins where its padding costs less than a call of its own: at H 24 up to ~800
// padding tokens.
constexpr double kVarlenCallNs = 25000, kVarlenRowNs = 0.4, kVarlenPadRowNs = 0.45;

// Whether the padded path covers this call: CUDA, rows of 32-bit words, rotary tables shared by
// all tokens (batch 1).
bool varlen_padded_ok(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const AttentionOptions& o) {
  if (q.device != Device::cuda || detail::attention_cuda_tuning().varlen_each ||
      detail::attention_cuda_tuning().varlen_unpadded)
    return false;
  if (q.shape[0] > INT32_MAX || k.shape[0] > INT32_MAX) return false;  // (int32 packed rows)
  for (const TensorView* t : {&q, &k, &v, &out}) {
    const int64_t e = dtype_bits(t->dtype) / 8;
    if (reinterpret_cast<uintptr_t>(t->data) % 4 || (t->stride[0] * e) % 4 ||
        (t->stride[1] * e) % 4 || (t->shape[2] * e) % 4 || t->stride[2] != 1)
      return false;
  }
  // The prologues: any norm (segmented weights' packed indices and a token norm's pre-pass read
  // at each item's rows: session 52), rotary tables shared by the packed tokens (batch 1; any of
  // SPEC §1's forms: the mean pass compacts the others into one table per item).
  for (const Prologue* p : {o.q_prologue, o.k_prologue}) {
    if (!p) continue;
    if (p->rope && p->rope->table.shape[0] != 1) return false;
  }
  return true;
}

// Groups sequences (longest first) into buckets whose padded tokens stay within
// kVarlenPadWaste of their real ones and whose every member costs less padded than as a call of
// its own (the cost model above); buckets of one sequence are returned as such.
std::vector<std::vector<Seq>> varlen_buckets(std::vector<Seq> seqs, int64_t hq, int64_t hkv) {
  std::sort(seqs.begin(), seqs.end(),
            [](const Seq& a, const Seq& b) { return std::max(a.nq, a.nk) > std::max(b.nq, b.nk); });
  std::vector<std::vector<Seq>> buckets;
  int64_t lq = 0, lk = 0, sq = 0, sk = 0;
  for (const Seq& s : seqs) {
    if (!buckets.empty()) {
      const int64_t m = static_cast<int64_t>(buckets.back().size()) + 1;
      const int64_t nlq = std::max(lq, s.nq), nlk = std::max(lk, s.nk);
      const double own =
          kVarlenCallNs + kVarlenRowNs * static_cast<double>(s.nq * hq + 2 * s.nk * hkv);
      const double padded = kVarlenPadRowNs * static_cast<double>(nlq * hq + 2 * nlk * hkv);
      if (m <= cuda::kVarlenMaxItems && m * nlq <= kVarlenPadWaste * (sq + s.nq) &&
          m * nlk <= kVarlenPadWaste * (sk + s.nk) &&
          (padded <= own || detail::attention_cuda_tuning().varlen_pad_all)) {
        buckets.back().push_back(s);
        lq = nlq, lk = nlk, sq += s.nq, sk += s.nk;
        continue;
      }
    }
    buckets.push_back({s});
    lq = s.nq, lk = s.nk, sq = s.nq, sk = s.nk;
  }
  return buckets;
}

// (m, L, H, D) view of a packed (T, H, D) tensor for a padded bucket read in place: item b's
// rows start at the packed row the kernels take from VarlenItems, so the batch stride is unused
// (0); the shape only sizes the workspace and the grids.
TensorView in_place(const TensorView& t, int64_t m, int64_t L) {
  TensorView v = t;
  v.ndim = 4;
  v.shape[0] = m, v.stride[0] = 0;
  v.shape[1] = L, v.stride[1] = t.stride[0];
  v.shape[2] = t.shape[1], v.stride[2] = t.stride[1];
  v.shape[3] = t.shape[2], v.stride[3] = t.stride[2];
  return v;
}

// One bucket (>= 2 sequences) through the padded path, read and written in place: q, k and (fp8
// P·V) v are read at each item's packed rows by the quantization passes, out and the LSE written
// at them by the kernel; 16-bit P·V reads v as the kernel's operand, so v is gathered into a
// zero-padded copy first.
void varlen_padded(const TensorView& q, const TensorView& k, const TensorView& v, TensorView out,
                   TensorView* lse_out, const AttentionOptions& options,
                   const std::vector<Seq>& bucket, Context& ctx) {
  const char* op = "attention_varlen";
  const int64_t m = static_cast<int64_t>(bucket.size());
  const int64_t Hkv = k.shape[1], D = q.shape[2];
  int64_t lq = 0, lk = 0;
  cuda::VarlenSpans qs, ks;
  qs.items = ks.items = static_cast<int>(m);
  for (int64_t i = 0; i < m; ++i) {
    const Seq& s = bucket[static_cast<size_t>(i)];
    lq = std::max(lq, s.nq), lk = std::max(lk, s.nk);
    qs.start[i] = static_cast<int32_t>(s.q0), qs.len[i] = static_cast<int32_t>(s.nq);
    ks.start[i] = static_cast<int32_t>(s.k0), ks.len[i] = static_cast<int32_t>(s.nk);
  }
  const Device dev = q.device;
  const int di = q.device_index;
  const bool gather_v = options.pv != AttentionOptions::fp8;
  const TensorView qp = in_place(q, m, lq), kp = in_place(k, m, lk);
  TensorView op_ = in_place(out, m, lq);
  TensorView lp;
  if (lse_out) {  // (Hq, T) -> (m, Hq, L): row n of item b at lse + (start + n) * stride[1]
    lp = *lse_out;
    lp.ndim = 3;
    lp.shape[0] = m, lp.stride[0] = 0;
    lp.shape[1] = lse_out->shape[0], lp.stride[1] = lse_out->stride[0];
    lp.shape[2] = lq, lp.stride[2] = lse_out->stride[1];
  }
  // The per-item counts and packed rows (4 x m int32), a zero-padded v (16-bit P·V), then
  // attention()'s own workspace, each 256-byte aligned.
  size_t total = 0;
  auto take = [&](int64_t bytes) {
    const size_t at = total;
    total += static_cast<size_t>(round_up(std::max<int64_t>(bytes, 1), 256));
    return at;
  };
  const size_t on = take(4 * m * 4);
  const size_t ov = take(gather_v ? m * lk * Hkv * D * esize(v) : 0);
  const size_t attn_bytes = attention_workspace_bytes(qp, kp, options);
  const size_t oa = take(static_cast<int64_t>(attn_bytes));
  detail::StreamBuffer ws(dev, total + 256, ctx, op);
  uint8_t* base = static_cast<uint8_t*>(ws.aligned(256));
  int32_t* items_dev = reinterpret_cast<int32_t*>(base + on);  // q lens, kv lens, q rows, kv rows
  LOWBIT_CUDA_CALL(op, cuda::varlen_items(qs, ks, items_dev, ctx));
  TensorView vp = in_place(v, m, lk);
  if (gather_v) {
    vp = make_view(base + ov, v.dtype, {m, lk, Hkv, D}, dev, di);
    LOWBIT_CUDA_CALL(op, cuda::varlen_gather(v.data, v.stride[0] * esize(v), v.stride[1] * esize(v),
                                             Hkv, D * esize(v) / 4, ks, lk, vp.data, ctx));
  }
  // The prologues' rotary tables as (1, L, ...) views and segmented weights' indices as (L)
  // views of the packed ones (the kernels read item b's rows from its packed row; the indices
  // were checked once for the whole batch).
  Prologue pq, pk;
  Rope rq, rk;
  TensorView wq, wk;
  AttentionOptions o = options;
  for (int which = 0; which < 2; ++which) {
    const Prologue* from = which == 0 ? options.q_prologue : options.k_prologue;
    if (!from) continue;
    Prologue& p = which == 0 ? pq : pk;
    p = *from;
    if (from->rope) {
      Rope& r = which == 0 ? rq : rk;
      r = *from->rope;
      r.table.shape[1] = which == 0 ? lq : lk;
      p.rope = &r;
    }
    if (from->weight_rows) {
      TensorView& w = which == 0 ? wq : wk;
      w = *from->weight_rows;
      w.shape[0] = which == 0 ? lq : lk;
      p.weight_rows = &w;
    }
    (which == 0 ? o.q_prologue : o.k_prologue) = &p;
  }
  detail::VarlenItems items;
  items.q_lens = items_dev;
  items.kv_lens = items_dev + m;
  items.q_rows = items_dev + 2 * m;
  items.k_rows = items_dev + 3 * m;
  items.v_rows = gather_v ? nullptr : items_dev + 3 * m;
  attention_on(qp, kp, vp, op_, lse_out ? &lp : nullptr, o, base + oa, attn_bytes, ctx, true,
               &items);
}

}  // namespace

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const std::vector<int64_t>& cu_seqlens_q,
                      const std::vector<int64_t>& cu_seqlens_k, TensorView out, TensorView* lse_out,
                      const AttentionOptions& options, Context& ctx) {
  const char* op = "attention_varlen";
  check::not_null(op, "q", q);
  check::not_null(op, "k", k);
  check::not_null(op, "v", v);
  check::not_null(op, "out", out);
  check::ndim(op, "q", q, 3);
  check::ndim(op, "k", k, 3);
  check::ndim(op, "v", v, 3);
  check::ndim(op, "out", out, 3);
  check_offsets(op, "cu_seqlens_q", cu_seqlens_q, q.shape[0], cu_seqlens_q.size());
  check_offsets(op, "cu_seqlens_k", cu_seqlens_k, k.shape[0], cu_seqlens_q.size());
  if (lse_out) {
    check::not_null(op, "lse_out", *lse_out);
    check::ndim(op, "lse_out", *lse_out, 2);
    check_shape(op, "lse_out", *lse_out, {q.shape[1], q.shape[0]});
  }
  // Every sequence's arguments are checked before anything runs (nothing is written on error);
  // the prologues' tables and weight_rows against the packed tokens, once.
  check_qk_prologues(op, sequence_rows(q, 0, q.shape[0]), sequence_rows(k, 0, k.shape[0]), options,
                     &ctx);
  // Runs of consecutive sequences with the same query and key lengths run as one attention()
  // call on a batch of them (every batch item is computed on its own: the bits of each sequence
  // alone, fewer launches); with segmented weights (weight_rows, one index per packed token)
  // every sequence is a run of its own, which the padded buckets below may still gather.
  struct Run {
    int64_t q0, k0, nq, nk, items;
  };
  const bool batch = !(options.q_prologue && options.q_prologue->weight_rows) &&
                     !(options.k_prologue && options.k_prologue->weight_rows) &&
                     !detail::attention_cuda_tuning().varlen_each;
  std::vector<Run> runs;
  for (size_t i = 0; i + 1 < cu_seqlens_q.size(); ++i) {
    const int64_t q0 = cu_seqlens_q[i], nq = cu_seqlens_q[i + 1] - q0;
    const int64_t k0 = cu_seqlens_k[i], nk = cu_seqlens_k[i + 1] - k0;
    if (nq == 0) continue;
    Run* r = runs.empty() ? nullptr : &runs.back();
    if (batch && r && r->nq == nq && r->nk == nk && r->q0 + r->items * nq == q0 &&
        r->k0 + r->items * nk == k0)
      ++r->items;
    else
      runs.push_back({q0, k0, nq, nk, 1});
  }
  auto views = [&](const Run& r, TensorView* lse) {
    if (lse_out) *lse = sequence_lse(*lse_out, r.q0, r.q0 + r.nq, r.items);
    return std::array<TensorView, 4>{sequence_rows(q, r.q0, r.q0 + r.nq, r.items),
                                     sequence_rows(k, r.k0, r.k0 + r.nk, r.items),
                                     sequence_rows(v, r.k0, r.k0 + r.nk, r.items),
                                     sequence_rows(out, r.q0, r.q0 + r.nq, r.items)};
  };
  if (runs.empty()) {  // no query rows: the shapes still have to agree
    const int64_t k1 = cu_seqlens_k.size() > 1 ? cu_seqlens_k[1] : 0;
    validate_attention_call(sequence_rows(q, 0, 0), sequence_rows(k, 0, k1),
                            sequence_rows(v, 0, k1), sequence_rows(out, 0, 0), nullptr, op);
    return;
  }
  size_t bytes = 0;
  for (const Run& r : runs) {
    TensorView lse;
    const auto t = views(r, &lse);
    validate_attention_call(t[0], t[1], t[2], t[3], lse_out ? &lse : nullptr, op);
    bytes = std::max(bytes, attention_workspace_bytes(t[0], t[1], options));
  }
  // Sequences of their own length (runs of one) into padded buckets (CUDA; see varlen_padded;
  // with segmented weights every sequence is a run of one).
  if (varlen_padded_ok(q, k, v, out, options)) {
    std::vector<Seq> single;
    for (size_t i = 0; i < runs.size(); ++i) {
      const Run& r = runs[i];
      if (r.items == 1 && r.nk > 0) single.push_back({r.q0, r.k0, r.nq, r.nk, i});
    }
    std::vector<std::vector<Seq>> buckets = single.size() > 1
                                                ? varlen_buckets(single, q.shape[1], k.shape[1])
                                                : std::vector<std::vector<Seq>>{};
    std::vector<char> in_bucket(runs.size(), 0);
    for (const auto& bk : buckets)
      if (bk.size() > 1) {
        for (const Seq& s : bk) in_bucket[s.run] = 1;
        varlen_padded(q, k, v, out, lse_out, options, bk, ctx);
      }
    std::vector<Run> rest;
    for (size_t i = 0; i < runs.size(); ++i)
      if (!in_bucket[i]) rest.push_back(runs[i]);
    runs.swap(rest);
    if (runs.empty()) return;
  }
  detail::StreamBuffer ws(q.device, bytes + 256, ctx, op);  // as attention()'s: stream-ordered
  void* at = ws.aligned(256);
  for (const Run& r : runs) {
    TensorView lse;
    const auto t = views(r, &lse);
    const PrologueRows qrows(options.q_prologue, r.q0, r.q0 + r.nq, r.items),
        krows(options.k_prologue, r.k0, r.k0 + r.nk, r.items);
    AttentionOptions o = options;
    if (o.q_prologue) o.q_prologue = &qrows.p;
    if (o.k_prologue) o.k_prologue = &krows.p;
    attention_on(t[0], t[1], t[2], t[3], lse_out ? &lse : nullptr, o, at, bytes, ctx, true);
  }
}

namespace detail {
namespace {
Guarded<AttentionCudaTuning> g_tuning;
}  // namespace
void set_attention_cuda_tuning(const AttentionCudaTuning& t) { g_tuning.set(t); }
AttentionCudaTuning attention_cuda_tuning() { return g_tuning.get(); }
}  // namespace detail

}  // namespace lowbit
