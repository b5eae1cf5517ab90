// Bindings of include/lowbit/attention.h: attention (one call), quantize_v_fp8, attention_int8.
#include "python/src/common.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "lowbit/attention.h"
#include "python/src/common_enums.h"

namespace lowbit {
namespace py {

namespace {

const std::pair<const char*, AttentionOptions::Causal> kCausal[] = {
    {"none", AttentionOptions::none},
    {"bottom_right", AttentionOptions::bottom_right},
    {"top_left", AttentionOptions::top_left},
};
const std::pair<const char*, AttentionOptions::PV> kPV[] = {
    {"fp8", AttentionOptions::fp8},
    {"f16", AttentionOptions::f16},
};
const std::pair<const char*, AttentionOptions::Kernel> kKernels[] = {
    {"auto", AttentionOptions::auto_kernel},
    {"mma_sync", AttentionOptions::mma_sync},
    {"wgmma", AttentionOptions::wgmma},
    {"wgmma_r3", AttentionOptions::wgmma_r3},
};
const std::pair<const char*, ScaleLayout> kLayouts[] = {
    {"per_block", ScaleLayout::per_block},
    {"thread_q", ScaleLayout::thread_q},
    {"thread_k", ScaleLayout::thread_k},
    {"warp_q", ScaleLayout::warp_q},
};

AttentionOptions make_options(const char* op, float sm_scale, const std::string& causal,
                              const std::string& pv, bool smooth_k, bool smooth_v,
                              const std::string& kernel = "auto") {
  AttentionOptions o;
  o.kernel = parse_enum(op, "kernel", kernel, kKernels);
  o.sm_scale = sm_scale;
  o.causal = parse_enum(op, "causal", causal, kCausal);
  o.pv = parse_enum(op, "pv", pv, kPV);
  o.smooth_k = smooth_k;
  o.smooth_v = smooth_v;
  return o;
}

// q's and k's norm / rope arguments of attention() and attention_varlen(), kept alive here and
// pointed at by o (those not given stay off).
struct QkPrologues {
  PrologueParts q, k;
  void apply(Args& args, nb::handle q_norm_weight, nb::handle k_norm_weight,
             nb::handle q_weight_rows, nb::handle k_weight_rows, float eps, nb::handle q_rope,
             nb::handle k_rope, bool interleaved, bool check_rows, const std::string& scope,
             const char* op, AttentionOptions& o) {
    fill_prologue(args, q, q_norm_weight, q_weight_rows, eps, q_rope, interleaved, nb::none(),
                  "q_", check_rows, scope, op);
    fill_prologue(args, k, k_norm_weight, k_weight_rows, eps, k_rope, interleaved, nb::none(),
                  "k_", check_rows, scope, op);
    if (any_prologue(q)) o.q_prologue = &q.p;
    if (any_prologue(k)) o.k_prologue = &k.p;
  }
};

}  // namespace

void bind_attention(nb::module_& m) {
  m.attr("has_attention") = true;
  m.def(
      "attention_workspace_bytes",
      [](nb::handle q, nb::handle k, float sm_scale, const std::string& causal,
         const std::string& pv, bool smooth_k, bool smooth_v) {
        const char* op = "attention_workspace_bytes";
        Args args(op);
        TensorView qv = args.in(q, "q"), kv = args.in(k, "k");
        return attention_workspace_bytes(qv, kv,
                                         make_options(op, sm_scale, causal, pv, smooth_k,
                                                      smooth_v));
      },
      nb::arg("q"), nb::arg("k"), nb::kw_only(), nb::arg("sm_scale") = 0.f,
      nb::arg("causal") = "none", nb::arg("pv") = "fp8", nb::arg("smooth_k") = true,
      nb::arg("smooth_v") = false,
      "Bytes of the workspace attention(..., workspace=) needs for these q, k and options.");
  m.def(
      "attention",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, float sm_scale,
         const std::string& causal, const std::string& pv, bool smooth_k, bool smooth_v,
         const std::string& kernel, nb::handle workspace, nb::handle q_norm_weight,
         nb::handle k_norm_weight, nb::handle q_weight_rows, nb::handle k_weight_rows,
         float norm_eps, nb::handle q_rope, nb::handle k_rope, bool rope_interleaved,
         bool check_weight_rows, const std::string& norm_scope, uintptr_t stream, int threads) {
        Args args("attention");
        TensorView qv = args.in(q, "q"), kv = args.in(k, "k"), vv = args.in(v, "v");
        TensorView ov = args.out(out, "out");
        std::optional<TensorView> lv = args.out_opt(lse, "lse");
        std::optional<TensorView> wv = args.out_opt(workspace, "workspace");
        AttentionOptions o =
            make_options("attention", sm_scale, causal, pv, smooth_k, smooth_v, kernel);
        QkPrologues qk;
        qk.apply(args, q_norm_weight, k_norm_weight, q_weight_rows, k_weight_rows, norm_eps, q_rope,
                 k_rope, rope_interleaved, check_weight_rows, norm_scope, "attention", o);
        Context ctx = make_context(stream, threads);
        if (wv && !wv->is_contiguous()) {
          throw Error("attention", "workspace", "expected a contiguous array, got " +
                                                    wv->describe());
        }
        nb::gil_scoped_release release;
        if (wv) {
          size_t bytes = static_cast<size_t>(dtype_storage_bytes(wv->dtype, wv->numel()));
          attention(qv, kv, vv, ov, lv ? &*lv : nullptr, o, wv->data, bytes, ctx);
        } else {
          attention(qv, kv, vv, ov, lv ? &*lv : nullptr, o, ctx);
        }
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::kw_only(),
      nb::arg("lse") = nb::none(), nb::arg("sm_scale") = 0.f, nb::arg("causal") = "none",
      nb::arg("pv") = "fp8", nb::arg("smooth_k") = true, nb::arg("smooth_v") = false,
      nb::arg("kernel") = "auto", nb::arg("workspace") = nb::none(),
      nb::arg("q_norm_weight") = nb::none(), nb::arg("k_norm_weight") = nb::none(),
      nb::arg("q_weight_rows") = nb::none(), nb::arg("k_weight_rows") = nb::none(),
      nb::arg("norm_eps") = 1e-6f, nb::arg("q_rope") = nb::none(), nb::arg("k_rope") = nb::none(),
      nb::arg("rope_interleaved") = false, nb::arg("check_weight_rows") = true,
      nb::arg("norm_scope") = "head", nb::arg("stream") = 0, nb::arg("threads") = 0,
      "INT8 attention (SPEC section 2). q (B, Nq, Hq, D), k/v (B, Nkv, Hkv, D), out like q, all "
      "strided views (pass an HND tensor permuted); lse (B, Hq, Nq) f32 or None. sm_scale 0 = "
      "1/sqrt(D); causal none/bottom_right/top_left; pv fp8/f16; kernel auto/mma_sync/wgmma/"
      "wgmma_r3 (CUDA only; the CPU ignores it). workspace: a contiguous array "
      "of >= attention_workspace_bytes bytes (256-byte aligned, q's device): no allocation and no "
      "stream synchronization; None: lowbit allocates (and synchronizes on CUDA). "
      "q_norm_weight / k_norm_weight ((D) or (R, D) with q_weight_rows / k_weight_rows (N) int32), "
      "norm_eps, q_rope / k_rope tables ((1|B, N, 1, pairs, 2[, 2]), SPEC section 1) and "
      "rope_interleaved: q's and k's RMSNorm and RoPE, fused into their quantization. "
      "check_weight_rows False: the weight rows' range is not read back (no synchronization, "
      "capturable in a CUDA graph; an index out of range takes the nearest row). norm_scope "
      "'token': each norm over the token's H*D channels (Wan's RMSNorm(dim) before the head "
      "split), weights (H*D) or (H, D).");
  m.def(
      "attention_varlen",
      [](nb::handle q, nb::handle k, nb::handle v, std::vector<int64_t> cu_seqlens_q,
         std::vector<int64_t> cu_seqlens_k, nb::handle out, nb::handle lse, float sm_scale,
         const std::string& causal, const std::string& pv, bool smooth_k, bool smooth_v,
         const std::string& kernel, nb::handle q_norm_weight, nb::handle k_norm_weight,
         nb::handle q_weight_rows, nb::handle k_weight_rows, float norm_eps, nb::handle q_rope,
         nb::handle k_rope, bool rope_interleaved, bool check_weight_rows,
         const std::string& norm_scope, uintptr_t stream, int threads) {
        Args args("attention_varlen");
        TensorView qv = args.in(q, "q"), kv = args.in(k, "k"), vv = args.in(v, "v");
        TensorView ov = args.out(out, "out");
        std::optional<TensorView> lv = args.out_opt(lse, "lse");
        AttentionOptions o =
            make_options("attention_varlen", sm_scale, causal, pv, smooth_k, smooth_v, kernel);
        QkPrologues qk;
        qk.apply(args, q_norm_weight, k_norm_weight, q_weight_rows, k_weight_rows, norm_eps, q_rope,
                 k_rope, rope_interleaved, check_weight_rows, norm_scope, "attention_varlen", o);
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        attention_varlen(qv, kv, vv, cu_seqlens_q, cu_seqlens_k, ov, lv ? &*lv : nullptr, o, ctx);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
      nb::arg("out"), nb::kw_only(), nb::arg("lse") = nb::none(), nb::arg("sm_scale") = 0.f,
      nb::arg("causal") = "none", nb::arg("pv") = "fp8", nb::arg("smooth_k") = true,
      nb::arg("smooth_v") = false, nb::arg("kernel") = "auto",
      nb::arg("q_norm_weight") = nb::none(), nb::arg("k_norm_weight") = nb::none(),
      nb::arg("q_weight_rows") = nb::none(), nb::arg("k_weight_rows") = nb::none(),
      nb::arg("norm_eps") = 1e-6f, nb::arg("q_rope") = nb::none(), nb::arg("k_rope") = nb::none(),
      nb::arg("rope_interleaved") = false, nb::arg("check_weight_rows") = true,
      nb::arg("norm_scope") = "head", nb::arg("stream") = 0, nb::arg("threads") = 0,
      "attention() on a variable-length batch (its q_/k_ norm and rope arguments too, tables and "
      "weight rows over the packed tokens): q (Tq, Hq, D), k/v (Tk, Hkv, D) hold n sequences "
      "packed along the tokens; cu_seqlens_q / cu_seqlens_k: n + 1 offsets each (0 first, "
      "nondecreasing, Tq / Tk last; a list or a host int array). Each sequence is attended on "
      "its own, as attention() would (causal aligned per sequence); out like q; lse (Hq, Tq) f32 "
      "or None. Consecutive sequences of equal lengths run as one batched call (the same bits). "
      "Allocates its workspace stream-ordered (no synchronization on CUDA).");
  m.def(
      "quantize_v_fp8",
      [](nb::handle v, nb::handle v_fp8, nb::handle v_scale, nb::handle v_mean,
         uintptr_t stream, int threads) {
        Args args("quantize_v_fp8");
        TensorView vv = args.in(v, "v");
        TensorView fv = args.out(v_fp8, "v_fp8");
        TensorView sv = args.out(v_scale, "v_scale");
        std::optional<TensorView> mv = args.out_opt(v_mean, "v_mean");
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        quantize_v_fp8(vv, fv, sv, mv ? &*mv : nullptr, ctx);
      },
      nb::arg("v"), nb::arg("v_fp8"), nb::arg("v_scale"), nb::kw_only(),
      nb::arg("v_mean") = nb::none(), nb::arg("stream") = 0, nb::arg("threads") = 0,
      "Per-channel e4m3 V: v (B, N, Hkv, D) -> v_fp8 (B, Hkv, D, round_up(N, 64)) e4m3, "
      "v_scale (B, Hkv, D) f32, v_mean (B, Hkv, D) f32 or None.");
  m.def(
      "attention_int8",
      [](nb::handle q, nb::handle q_scale, const std::string& q_layout, int q_block, nb::handle k,
         nb::handle k_scale, const std::string& k_layout, int k_block, nb::handle v,
         nb::handle v_scale, nb::handle v_mean, nb::handle k_mean, nb::handle out, nb::handle lse,
         float sm_scale, const std::string& causal, const std::string& pv,
         const std::string& kernel, uintptr_t stream, int threads) {
        const char* op = "attention_int8";
        Args args(op);
        QuantizedRows qr, kr;
        qr.data = args.in(q, "q");
        qr.scale = args.in(q_scale, "q_scale");
        qr.layout = parse_enum(op, "q_layout", q_layout, kLayouts);
        qr.block = q_block;
        kr.data = args.in(k, "k");
        kr.scale = args.in(k_scale, "k_scale");
        kr.layout = parse_enum(op, "k_layout", k_layout, kLayouts);
        kr.block = k_block;
        TensorView vv = args.in(v, "v");
        std::optional<TensorView> vs = args.in_opt(v_scale, "v_scale");
        std::optional<TensorView> vm = args.in_opt(v_mean, "v_mean");
        std::optional<TensorView> km = args.in_opt(k_mean, "k_mean");
        TensorView ov = args.out(out, "out");
        std::optional<TensorView> lv = args.out_opt(lse, "lse");
        AttentionOptions o = make_options(op, sm_scale, causal, pv, true, false, kernel);
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        attention_int8(qr, kr, vv, vs ? &*vs : nullptr, vm ? &*vm : nullptr,
                       km ? &*km : nullptr, ov, lv ? &*lv : nullptr, o, ctx);
      },
      nb::arg("q"), nb::arg("q_scale"), nb::arg("q_layout"), nb::arg("q_block"), nb::arg("k"),
      nb::arg("k_scale"), nb::arg("k_layout"), nb::arg("k_block"), nb::arg("v"), nb::kw_only(),
      nb::arg("v_scale") = nb::none(), nb::arg("v_mean") = nb::none(),
      nb::arg("k_mean") = nb::none(), nb::arg("out"), nb::arg("lse") = nb::none(),
      nb::arg("sm_scale") = 0.f, nb::arg("causal") = "none", nb::arg("pv") = "fp8",
      nb::arg("kernel") = "auto", nb::arg("stream") = 0, nb::arg("threads") = 0,
      "Attention on quantized operands (the prologue's int8 q/k with their scales; v from "
      "quantize_v_fp8 in fp8 mode or bf16/f16 in f16 mode).");
}

}  // namespace py
}  // namespace lowbit
