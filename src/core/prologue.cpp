// Front of the attention prologue: validates every argument (nothing is read or written before
// all checks pass), resolves views into PrologueArgs, dispatches on the device.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lowbit/runtime.h"
#include "src/core/backends.h"
#include "src/core/check.h"
#include "src/core/guarded.h"
#include "src/core/prologue_internal.h"
#include "src/core/scratch.h"

namespace lowbit {

const char* scale_layout_name(ScaleLayout l) {
  switch (l) {
    case ScaleLayout::per_block: return "per_block";
    case ScaleLayout::thread_q: return "thread_q";
    case ScaleLayout::thread_k: return "thread_k";
    case ScaleLayout::warp_q: return "warp_q";
  }
  return "?";
}

int scale_groups(ScaleLayout l) {
  switch (l) {
    case ScaleLayout::per_block: return 1;
    case ScaleLayout::thread_q: return 8;
    case ScaleLayout::thread_k: return 4;
    case ScaleLayout::warp_q: return 4;
  }
  return 1;
}

namespace {

void check_layout(const char* op, ScaleLayout layout, int block) {
  LOWBIT_CHECK(static_cast<int>(layout) <= 3, op, "layout",
               "expected per_block, thread_q, thread_k or warp_q, got " +
                   std::to_string(static_cast<int>(layout)));
  LOWBIT_CHECK(block > 0 && block % 8 == 0, op, "block",
               "expected a positive multiple of 8, got " + std::to_string(block));
  if (layout == ScaleLayout::thread_q)
    LOWBIT_CHECK(128 % block == 0, op, "block",
                 "thread_q pads to 128 rows: expected a divisor of 128 (8, 16, 32, 64, 128), got " +
                     std::to_string(block));
  if (layout == ScaleLayout::warp_q)
    LOWBIT_CHECK(
        block <= 128, op, "block",
        "warp_q has 4 groups of 32 rows: expected at most 128, got " + std::to_string(block));
}

}  // namespace

int64_t prologue_scale_count(int64_t n_tokens, ScaleLayout layout, int block) {
  check_layout("prologue_scale_count", layout, block);
  LOWBIT_CHECK(n_tokens >= 0, "prologue_scale_count", "n_tokens",
               "expected >= 0, got " + std::to_string(n_tokens));
  const int64_t pad = layout == ScaleLayout::thread_q ? 128 : block;
  return (n_tokens + pad - 1) / pad * (pad / block) * scale_groups(layout);
}

namespace {

bool strides_multiple_of(const TensorView& t, int ndim_outer, int64_t m) {
  for (int d = 0; d < ndim_outer; ++d)
    if (t.shape[d] > 1 && t.stride[d] % m != 0) return false;
  return true;
}

// Validates x and the Prologue's optional parts; fills the input side of `a`.
// rows_ctx: the stream on which weight_rows' index range is read back (the caller's: the indices
// are ordered behind its work), or null where the caller has checked them already.
PrologueArgs resolve_inputs(const char* op, const TensorView& x, const Prologue& p, bool use_mean,
                            const Context* rows_ctx) {
  PrologueArgs a;
  check::ndim(op, "x", x, 4);
  check::not_null(op, "x", x);
  const bool cuda = x.device == Device::cuda;
  if (cuda)
    check::dtype(op, "x", x, {DType::bf16, DType::f16});
  else
    check::dtype(op, "x", x, {DType::bf16, DType::f16, DType::f32});
  for (int d = 0; d < 4; ++d)
    LOWBIT_CHECK(x.shape[d] >= 1, op, "x", "expected every dim >= 1, got shape " + x.describe());
  const int64_t B = x.shape[0], N = x.shape[1], H = x.shape[2], D = x.shape[3];
  LOWBIT_CHECK(D % 16 == 0, op, "x",
               "head dim: expected a multiple of 16, got " + std::to_string(D));
  LOWBIT_CHECK(
      x.stride[3] == 1, op, "x",
      "channel stride: expected 1 (channels contiguous), got " + std::to_string(x.stride[3]));
  if (cuda) {
    LOWBIT_CHECK(D == 64 || D == 128 || D == 256, op, "x",
                 "head dim on cuda: expected 64, 128 or 256, got " + std::to_string(D));
    check::aligned(op, "x", x.data, 16);
    LOWBIT_CHECK(strides_multiple_of(x, 3, 8), op, "x",
                 "strides on cuda: expected batch/token/head strides that are multiples of 8 "
                 "elements (16-byte rows), got " +
                     x.describe());
  }
  a.x = x.data;
  a.x_dtype = x.dtype;
  a.batch = B, a.tokens = N, a.heads = H, a.dim = D;
  a.x_sb = x.stride[0], a.x_sn = x.stride[1], a.x_sh = x.stride[2];
  a.eps = p.eps;

  // Norm.
  LOWBIT_CHECK(p.norm_scope == NormScope::head || p.norm_scope == NormScope::token, op,
               "norm_scope",
               "expected head or token, got " + std::to_string(static_cast<int>(p.norm_scope)));
  if (p.norm_weight) {
    check::not_null(op, "norm_weight", *p.norm_weight);
    check::same_device(op, "norm_weight", *p.norm_weight, "x", x);
    check::dtype(op, "norm_weight", *p.norm_weight, {DType::f32, DType::bf16, DType::f16});
  }
  if (p.norm_weight && p.norm_scope == NormScope::token) {
    // Over all heads of a token: the weight (H·D) or (H, D), head h's row h.
    const TensorView& w = *p.norm_weight;
    LOWBIT_CHECK(p.weight_rows == nullptr, op, "weight_rows",
                 "expected none with norm_scope token (one weight over the token's H·D "
                 "channels), got one");
    const bool flat = w.ndim == 1 && w.shape[0] == H * D && w.stride[0] == 1;
    const bool rows = w.ndim == 2 && w.shape[0] == H && w.shape[1] == D && w.stride[1] == 1;
    LOWBIT_CHECK(flat || rows, op, "norm_weight",
                 "with norm_scope token: expected (H·D) = (" + std::to_string(H * D) +
                     ") contiguous or (H, D) = (" + std::to_string(H) + ", " +
                     std::to_string(D) + ") with contiguous channels, got " + w.describe());
    if (cuda)
      LOWBIT_CHECK(H * D <= kTokenNormMaxChannels, op, "x",
                   "with norm_scope token on cuda: expected H·D <= " +
                       std::to_string(kTokenNormMaxChannels) + ", got " + std::to_string(H * D));
    a.norm = true;
    a.norm_heads = true;
    a.w = w.data;
    a.w_dtype = w.dtype;
    a.w_sr = flat ? D : w.stride[0];
    a.w_count = H;
  } else if (p.norm_weight) {
    const TensorView& w = *p.norm_weight;
    LOWBIT_CHECK(w.ndim == 1 || w.ndim == 2, op, "norm_weight",
                 "rank: expected 1 (D) or 2 (R, D), got " + std::to_string(w.ndim) + " (" +
                     w.describe() + ")");
    check::dim(op, "norm_weight", w, -1, D);
    check::inner_contiguous(op, "norm_weight", w);
    a.norm = true;
    a.w = w.data;
    a.w_dtype = w.dtype;
    if (w.ndim == 2) {
      LOWBIT_CHECK(p.weight_rows != nullptr, op, "weight_rows",
                   "expected (N) int32 row indices with a (R, D) norm_weight, got none");
      LOWBIT_CHECK(w.shape[0] >= 1, op, "norm_weight", "expected R >= 1, got " + w.describe());
      a.w_sr = w.stride[0];
      a.w_count = w.shape[0];
      const TensorView& r = *p.weight_rows;
      check::ndim(op, "weight_rows", r, 1);
      check::dim(op, "weight_rows", r, 0, N);
      check::dtype(op, "weight_rows", r, {DType::i32});
      check::not_null(op, "weight_rows", r);
      check::same_device(op, "weight_rows", r, "x", x);
      // Index range: every row must name a row of the weight (on CUDA read back on the caller's
      // stream: one synchronization per call that checks them), unless the caller vouches for
      // it (check_weight_rows false: the kernels clamp each index to [0, R)).
      const int64_t rs = r.stride[0];
      if (r.device == Device::cuda)
        LOWBIT_CHECK(rs == 1 || N == 1, op, "weight_rows",
                     "stride on cuda: expected 1, got " + std::to_string(rs));
      if (rows_ctx && p.check_weight_rows) {
        std::vector<int32_t> rows(static_cast<size_t>(N));
        if (r.device == Device::cuda) {
          copy_to_host(rows.data(), r.data, rows.size() * sizeof(int32_t), *rows_ctx);
        } else {
          for (int64_t i = 0; i < N; ++i) rows[i] = static_cast<const int32_t*>(r.data)[i * rs];
        }
        for (int64_t i = 0; i < N; ++i)
          if (rows[i] < 0 || rows[i] >= w.shape[0])
            check::fail(op, "weight_rows",
                        "token " + std::to_string(i) + ": expected a row in [0, " +
                            std::to_string(w.shape[0]) + "), got " + std::to_string(rows[i]));
      }
      a.w_rows = static_cast<const int32_t*>(r.data);
      a.w_rows_s = rs;
    } else {
      LOWBIT_CHECK(p.weight_rows == nullptr, op, "weight_rows",
                   "expected none with a (D) norm_weight (segmented weights are (R, D)), got one");
    }
  } else {
    LOWBIT_CHECK(p.weight_rows == nullptr, op, "weight_rows",
                 "expected none without a norm_weight, got one");
  }

  // RoPE.
  if (p.rope) {
    const TensorView& t = p.rope->table;
    check::not_null(op, "rope.table", t);
    check::same_device(op, "rope.table", t, "x", x);
    check::dtype(op, "rope.table", t, {DType::f32, DType::bf16, DType::f16});
    LOWBIT_CHECK(t.ndim == 5 || t.ndim == 6, op, "rope.table",
                 "rank: expected 5 (1|B, N, 1, pairs, 2) or 6 (1|B, N, 1, pairs, 2, 2), got " +
                     t.describe());
    LOWBIT_CHECK(t.shape[0] == 1 || t.shape[0] == B, op, "rope.table",
                 "dim 0: expected 1 or B = " + std::to_string(B) + ", got " + t.describe());
    check::dim(op, "rope.table", t, 1, N);
    check::dim(op, "rope.table", t, 2, 1);
    check::dim(op, "rope.table", t, 4, 2);
    if (t.ndim == 6) check::dim(op, "rope.table", t, 5, 2);
    const int64_t pairs = t.shape[3];
    LOWBIT_CHECK(pairs >= 1 && 2 * pairs <= D, op, "rope.table",
                 "pairs (dim 3): expected 1 .. D/2 = " + std::to_string(D / 2) + ", got " +
                     std::to_string(pairs));
    a.rotate = true;
    a.interleaved = p.rope->interleaved;
    a.rope = t.data;
    a.r_dtype = t.dtype;
    a.pairs = pairs;
    a.r_sb = t.shape[0] == 1 ? 0 : t.stride[0];
    a.r_sn = t.stride[1];
    a.r_sp = t.stride[3];
    a.r_sc = t.stride[4];
  }

  // Mean.
  if (use_mean && p.mean) {
    const TensorView& m = *p.mean;
    check::not_null(op, "mean", m);
    check::same_device(op, "mean", m, "x", x);
    check::dtype(op, "mean", m, {DType::f32});
    check::ndim(op, "mean", m, 3);
    check::dim(op, "mean", m, 0, B);
    check::dim(op, "mean", m, 1, H);
    check::dim(op, "mean", m, 2, D);
    check::inner_contiguous(op, "mean", m);
    a.mean = static_cast<const float*>(m.data);
    a.m_sb = m.stride[0];
    a.m_sh = m.stride[1];
  }
  return a;
}

}  // namespace

namespace {

// Validates mean_out and points `a` at it.
void resolve_mean_out(const char* op, const TensorView& x, TensorView mean_out, PrologueArgs& a) {
  check::not_null(op, "mean_out", mean_out);
  check::same_device(op, "mean_out", mean_out, "x", x);
  check::dtype(op, "mean_out", mean_out, {DType::f32});
  check::ndim(op, "mean_out", mean_out, 3);
  check::dim(op, "mean_out", mean_out, 0, a.batch);
  check::dim(op, "mean_out", mean_out, 1, a.heads);
  check::dim(op, "mean_out", mean_out, 2, a.dim);
  check::inner_contiguous(op, "mean_out", mean_out);
  a.mean_out = static_cast<float*>(mean_out.data);
  a.mo_sb = mean_out.stride[0];
  a.mo_sh = mean_out.stride[1];
}

// Validates the quantize side (p's layout and scale_eps, q_out, scale_out) and fills it into `a`.
void resolve_quantize(const char* op, const TensorView& x, const Prologue& p, TensorView q_out,
                      TensorView scale_out, PrologueArgs& a) {
  check::not_null(op, "q_out", q_out);
  check::same_device(op, "q_out", q_out, "x", x);
  check::dtype(op, "q_out", q_out, {DType::i8});
  check::same_shape(op, "q_out", q_out, "x", x);
  LOWBIT_CHECK(
      q_out.stride[3] == 1, op, "q_out",
      "channel stride: expected 1 (channels contiguous), got " + std::to_string(q_out.stride[3]));
  if (x.device == Device::cuda) {
    check::aligned(op, "q_out", q_out.data, 8);
    LOWBIT_CHECK(
        strides_multiple_of(q_out, 3, 8), op, "q_out",
        "strides on cuda: expected batch/token/head strides that are multiples of 8, got " +
            q_out.describe());
  }
  const int64_t count = prologue_scale_count(a.tokens, p.layout, p.block);
  check::not_null(op, "scale_out", scale_out);
  check::same_device(op, "scale_out", scale_out, "x", x);
  check::dtype(op, "scale_out", scale_out, {DType::f32});
  check::ndim(op, "scale_out", scale_out, 3);
  check::dim(op, "scale_out", scale_out, 0, a.batch);
  check::dim(op, "scale_out", scale_out, 1, a.heads);
  check::dim(op, "scale_out", scale_out, 2, count);
  check::inner_contiguous(op, "scale_out", scale_out);
  a.sm_scale = p.sm_scale;
  a.scale_eps = p.scale_eps;
  a.layout = p.layout;
  a.block = p.block;
  a.groups = scale_groups(p.layout);
  a.n_blocks = count / a.groups;
  a.q = static_cast<int8_t*>(q_out.data);
  a.q_sb = q_out.stride[0], a.q_sn = q_out.stride[1], a.q_sh = q_out.stride[2];
  a.scale = static_cast<float*>(scale_out.data);
  a.s_sb = scale_out.stride[0], a.s_sh = scale_out.stride[1];
}

void check_quantize_options(const char* op, const Prologue& p) {
  check_layout(op, p.layout, p.block);
  LOWBIT_CHECK(p.scale_eps >= 0.f, op, "scale_eps",
               "expected >= 0, got " + std::to_string(p.scale_eps));
}

// The bytes a view spans, [first, last): from its lowest to past its highest element.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorView& t) {
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return {0, 0};
    const int64_t reach = (t.shape[d] - 1) * t.stride[d];
    (reach < 0 ? lo : hi) += reach;
  }
  const int64_t e = dtype_bits(t.dtype) / 8;
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  return {base + static_cast<uintptr_t>(lo * e), base + static_cast<uintptr_t>((hi + 1) * e)};
}

void check_disjoint(const char* op, const char* arg, const TensorView& t, const char* other_arg,
                    const TensorView& other) {
  const auto a = byte_span(t), b = byte_span(other);
  LOWBIT_CHECK(a.second <= b.first || b.second <= a.first, op, arg,
               std::string("expected no overlap with ") + other_arg + ", got " + t.describe() +
                   " and " + other.describe());
}

}  // namespace

namespace {

// NormScope::token: each token's inverse RMS over its H·D channels, into a (B, N) f32 buffer
// (stream-ordered on CUDA: no synchronization) that `a` points at while `run` queues the passes.
// On CUDA, where `stage` (the quantize and mean passes; not the store step, which is this stage
// itself), the norm output y = round_to_act_dtype(x * inv * w) (SPEC §1's stored norm output) is
// then written once into a (B, N, H, D) scratch by the store step, and the passes run on y with
// the norm off: the bits of the fused arithmetic (the passes continue from the same rounded y),
// on the fast kernels, which read a per-head norm only. The first-generation kernels read the
// token's inverse themselves (no scratch) where the tuning forces them (`legacy`).
// fast (kFastQ: norm_rope_quantize; kFastK: norm_rope_mean_quantize, with the tuning's
// `token_fast_k` too): with the tuning's `token_fast`, where the round-5 kernels take `a`
// (cuda::token_quantize_fast), the passes read each token's inverse and the weight rows as f32
// (token_norm_inv writes both) instead of a staged y.
constexpr int kFastNone = 0, kFastQ = 1, kFastK = 2;
template <typename F>
void with_token_inv(const char* op, Device device, PrologueArgs& a, Context& ctx, bool stage,
                    F&& run, int fast = kFastNone) {
  if (!a.norm_heads || a.batch * a.tokens == 0) {
    run();
    return;
  }
  const size_t inv_bytes = sizeof(float) * static_cast<size_t>(a.batch * a.tokens);
  bool token_fast = false;
  const detail::PrologueCudaTuning tuning = detail::prologue_cuda_tuning();
  if (device == Device::cuda && tuning.token_fast &&
      (fast == kFastQ || (fast == kFastK && tuning.token_fast_k)))
    LOWBIT_CUDA_CALL(op, token_fast = cuda::token_quantize_fast(a, fast == kFastK));
  if (token_fast) {
    detail::StreamBuffer inv(device, inv_bytes, ctx, op);
    detail::StreamBuffer w(device, sizeof(float) * static_cast<size_t>(a.heads * a.dim) + 16, ctx,
                           op);
    a.token_inv = inv.as<float>();
    a.token_w = static_cast<const float*>(w.aligned(16));
    LOWBIT_CUDA_CALL(
        op, cuda::token_norm_inv(a, inv.as<float>(), ctx, static_cast<float*>(w.aligned(16))));
    run();
    return;
  }
  if (device != Device::cuda || !stage || tuning.legacy) {
    detail::StreamBuffer inv(device, inv_bytes, ctx, op);
    a.token_inv = inv.as<float>();
    if (device == Device::cuda)
      LOWBIT_CUDA_CALL(op, cuda::token_norm_inv(a, inv.as<float>(), ctx));
    else
      cpu::token_norm_inv(a, inv.as<float>(), ctx);
    run();
    return;
  }
  const int64_t row = a.heads * a.dim, elems = a.batch * a.tokens * row;
  detail::StreamBuffer y(device, static_cast<size_t>(dtype_storage_bytes(a.x_dtype, elems)) + 256,
                         ctx, op);
  void* yp = y.aligned(256);
  [[maybe_unused]] PrologueArgs norm_only =
      a;  // the store step: y = the norm output, no rotation, no mean
  norm_only.rotate = false;
  norm_only.mean = nullptr;
  bool fused = false;  // the token's inverse and y in one pass (H·D up to 24 groups of 256)
  if (!tuning.token_two_pass)
    LOWBIT_CUDA_CALL(op, fused = cuda::token_norm_store(norm_only, yp, ctx));
  if (!fused) {
    detail::StreamBuffer inv(device, inv_bytes, ctx, op);
    norm_only.token_inv = inv.as<float>();
    LOWBIT_CUDA_CALL(op, cuda::token_norm_inv(norm_only, inv.as<float>(), ctx));
    LOWBIT_CUDA_CALL(op, cuda::norm_rope_store(norm_only, yp, a.tokens * row, row, a.dim, ctx));
  }
  a.x = yp;
  a.x_sb = a.tokens * row, a.x_sn = row, a.x_sh = a.dim;
  a.item_x = false;  // (a padded varlen batch: y holds each item at b * x_sb)
  a.norm = a.norm_heads = false;
  a.token_inv = nullptr;
  run();
}

}  // namespace

// On CUDA, where the round-4/5 mean kernels would run but for the RoPE table's form (e.g. Flux's
// (..., pairs, 2, 2) matrices, which sent the mean pass to the round-2 kernel: Wan-shape k path
// 0.446 ms against 0.314 with a (..., pairs, 2) table, H100), the table's (cos, sin) copied into
// that form first (the same values, so the same bits as the kernels that read them in place;
// ~1 % of the pass's bytes), then `run` on it.
template <typename F>
void with_mean_table(const char* op, Device device, PrologueArgs& a, Context& ctx, F&& run) {
  bool compact = false;
  if (device == Device::cuda) LOWBIT_CUDA_CALL(op, compact = cuda::rope_table_compactable(a));
  if (!compact) {
    run();
    return;
  }
  int64_t bytes = 0;  // (every cuda:: call through LOWBIT_CUDA_CALL: a CPU-only build has none)
  LOWBIT_CUDA_CALL(op, bytes = cuda::rope_table_bytes(a));
  detail::StreamBuffer t(device, static_cast<size_t>(bytes) + 16, ctx, op);
  float* table = static_cast<float*>(t.aligned(16));
  LOWBIT_CUDA_CALL(op, cuda::compact_rope_table(a, table, ctx));
  // (a padded varlen batch read in place: one compacted table per item, read at b * r_sb)
  const bool shared = a.r_sb == 0 && !a.item_rows;
  a.rope = table;
  a.r_dtype = DType::f32;
  a.r_sp = 2, a.r_sc = 1, a.r_sn = 2 * a.pairs;
  a.r_sb = shared ? 0 : a.tokens * 2 * a.pairs;
  a.item_table = false;
  run();
}

void norm_rope_mean(const TensorView& x, const Prologue& p, TensorView mean_out, Context& ctx) {
  const char* op = "norm_rope_mean";
  PrologueArgs a = resolve_inputs(op, x, p, false, &ctx);
  resolve_mean_out(op, x, mean_out, a);
  with_mean_table(op, x.device, a, ctx, [&] {
    with_token_inv(op, x.device, a, ctx, true, [&] {
      if (x.device == Device::cuda)
        LOWBIT_CUDA_CALL(op, cuda::norm_rope_mean(a, ctx));
      else
        cpu::norm_rope_mean(a, ctx);
    });
  });
}

namespace {

// A padded varlen batch's per-item tokens and packed rows into `a` (CUDA only; null: none).
void take_items(const char* op, Device device, const int32_t* item_tokens, const int32_t* item_rows,
                PrologueArgs& a) {
  LOWBIT_CHECK(!item_tokens || device == Device::cuda, op, "item_tokens",
               "internal: padded varlen batches are a CUDA path");
  a.item_tokens = item_tokens;
  a.item_rows = item_rows;
}

void quantize_front(const TensorView& x, const Prologue& p, TensorView q_out, TensorView scale_out,
                    Context& ctx, bool rows_checked, const int32_t* item_tokens = nullptr,
                    const int32_t* item_rows = nullptr) {
  const char* op = "norm_rope_quantize";
  check_quantize_options(op, p);
  PrologueArgs a = resolve_inputs(op, x, p, true, rows_checked ? nullptr : &ctx);
  resolve_quantize(op, x, p, q_out, scale_out, a);
  take_items(op, x.device, item_tokens, item_rows, a);
  with_token_inv(
      op, x.device, a, ctx, true,
      [&] {
        if (x.device == Device::cuda)
          LOWBIT_CUDA_CALL(op, cuda::norm_rope_quantize(a, ctx));
        else
          cpu::norm_rope_quantize(a, ctx);
      },
      kFastQ);
}

void mean_quantize_front(const TensorView& x, const Prologue& p, TensorView mean_out,
                         TensorView q_out, TensorView scale_out, Context& ctx, bool rows_checked,
                         const int32_t* item_tokens = nullptr, const int32_t* item_rows = nullptr) {
  const char* op = "norm_rope_mean_quantize";
  check_quantize_options(op, p);
  LOWBIT_CHECK(p.mean == nullptr, op, "p.mean",
               "expected none (the mean is computed into mean_out), got one");
  PrologueArgs a = resolve_inputs(op, x, p, false, rows_checked ? nullptr : &ctx);
  resolve_mean_out(op, x, mean_out, a);
  resolve_quantize(op, x, p, q_out, scale_out, a);
  check_disjoint(op, "mean_out", mean_out, "x", x);
  check_disjoint(op, "mean_out", mean_out, "q_out", q_out);
  check_disjoint(op, "mean_out", mean_out, "scale_out", scale_out);
  take_items(op, x.device, item_tokens, item_rows, a);
  // The quantize pass subtracts the mean just computed.
  a.mean = a.mean_out;
  a.m_sb = a.mo_sb, a.m_sh = a.mo_sh;
  with_mean_table(op, x.device, a, ctx, [&] {
    with_token_inv(
        op, x.device, a, ctx, true,
        [&] {
          if (x.device == Device::cuda)
            LOWBIT_CUDA_CALL(op, cuda::norm_rope_mean_quantize(a, ctx));
          else
            cpu::norm_rope_mean_quantize(a, ctx);
        },
        kFastK);
  });
}

}  // namespace

void norm_rope_quantize(const TensorView& x, const Prologue& p, TensorView q_out,
                        TensorView scale_out, Context& ctx) {
  quantize_front(x, p, q_out, scale_out, ctx, false);
}

void norm_rope_mean_quantize(const TensorView& x, const Prologue& p, TensorView mean_out,
                             TensorView q_out, TensorView scale_out, Context& ctx) {
  mean_quantize_front(x, p, mean_out, q_out, scale_out, ctx, false);
}

namespace detail {

void norm_rope_quantize_rows_checked(const TensorView& x, const Prologue& p, TensorView q_out,
                                     TensorView scale_out, Context& ctx, const int32_t* item_tokens,
                                     const int32_t* item_rows) {
  quantize_front(x, p, q_out, scale_out, ctx, true, item_tokens, item_rows);
}

void norm_rope_mean_quantize_rows_checked(const TensorView& x, const Prologue& p,
                                          TensorView mean_out, TensorView q_out,
                                          TensorView scale_out, Context& ctx,
                                          const int32_t* item_tokens, const int32_t* item_rows) {
  mean_quantize_front(x, p, mean_out, q_out, scale_out, ctx, true, item_tokens, item_rows);
}

void check_prologue_inputs(const char* op, const std::string& arg, const TensorView& x,
                           const Prologue& p, const Context* rows_ctx) {
  if (p.mean != nullptr)
    throw Error(op, arg + ".mean",
                "expected none (the call subtracts k's own mean: smooth_k), got one");
  if (p.sm_scale != 1.f)
    throw Error(
        op, arg + ".sm_scale",
        "expected 1 (the call folds options.sm_scale into q), got " + std::to_string(p.sm_scale));
  if (!(p.scale_eps >= 0.f))
    throw Error(op, arg + ".scale_eps", "expected >= 0, got " + std::to_string(p.scale_eps));
  try {
    resolve_inputs(op, x, p, false, rows_ctx);
  } catch (const Error& e) {
    throw Error(op, arg + "." + e.argument(), e.message());
  }
}

namespace {
Guarded<PrologueCudaTuning> g_tuning;  // every knob of one set_prologue_cuda_tuning call
}  // namespace

void set_prologue_cuda_tuning(const PrologueCudaTuning& t) { g_tuning.set(t); }

PrologueCudaTuning prologue_cuda_tuning() { return g_tuning.get(); }

void norm_rope_store(const TensorView& x, const Prologue& p, TensorView y, Context& ctx) {
  const char* op = "norm_rope_store";
  PrologueArgs a = resolve_inputs(op, x, p, false, &ctx);
  check::not_null(op, "y", y);
  check::same_device(op, "y", y, "x", x);
  LOWBIT_CHECK(
      y.dtype == x.dtype, op, "y",
      std::string("dtype: expected ") + dtype_name(x.dtype) + ", got " + dtype_name(y.dtype));
  check::same_shape(op, "y", y, "x", x);
  check::inner_contiguous(op, "y", y);
  if (x.device == Device::cuda) {
    check::aligned(op, "y", y.data, 16);
    LOWBIT_CHECK(strides_multiple_of(y, 3, 8), op, "y",
                 "strides on cuda: expected multiples of 8, got " + y.describe());
  }
  with_token_inv(op, x.device, a, ctx, false, [&] {
    if (x.device == Device::cuda)
      LOWBIT_CUDA_CALL(op,
                       cuda::norm_rope_store(a, y.data, y.stride[0], y.stride[1], y.stride[2], ctx));
    else
      cpu::norm_rope_store(a, y.data, y.stride[0], y.stride[1], y.stride[2], ctx);
  });
}

void norm_rsqrt(const TensorView& s, TensorView out, Context& ctx) {
  const char* op = "norm_rsqrt";
  check::not_null(op, "s", s);
  check::not_null(op, "out", out);
  check::dtype(op, "s", s, {DType::f32});
  check::dtype(op, "out", out, {DType::f32});
  check::contiguous(op, "s", s);
  check::contiguous(op, "out", out);
  check::same_shape(op, "out", out, "s", s);
  check::same_device(op, "out", out, "s", s);
  const auto* in = static_cast<const float*>(s.data);
  auto* o = static_cast<float*>(out.data);
  if (s.device == Device::cuda) {
    LOWBIT_CUDA_CALL(op, cuda::norm_rsqrt(in, o, s.numel(), ctx));
  } else {
    cpu::norm_rsqrt(in, o, s.numel(), ctx);
  }
}

}  // namespace detail
}  // namespace lowbit
