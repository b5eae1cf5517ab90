// Bindings of include/lowbit/prologue.h: norm_rope_mean, norm_rope_quantize,
// norm_rope_mean_quantize.
#include "python/src/common.h"

#include <nanobind/stl/string.h>

#include "lowbit/prologue.h"
#include "python/src/common_enums.h"

namespace lowbit {
namespace py {

namespace {

const std::pair<const char*, NormScope> kNormScopes[] = {
    {"head", NormScope::head},
    {"token", NormScope::token},
};
const std::pair<const char*, ScaleLayout> kLayouts[] = {
    {"per_block", ScaleLayout::per_block},
    {"thread_q", ScaleLayout::thread_q},
    {"thread_k", ScaleLayout::thread_k},
    {"warp_q", ScaleLayout::warp_q},
};

}  // namespace

void fill_prologue(Args& args, PrologueParts& pa, nb::handle norm_weight, nb::handle weight_rows,
                   float eps, nb::handle rope, bool rope_interleaved, nb::handle mean,
                   const char* prefix, bool check_weight_rows, const std::string& norm_scope,
                   const char* op) {
  const std::string pre(prefix);
  if (auto w = args.in_opt(norm_weight, (pre + "norm_weight").c_str())) {
    pa.norm_weight = *w;
    pa.p.norm_weight = &pa.norm_weight;
  }
  if (auto r = args.in_opt(weight_rows, (pre + "weight_rows").c_str())) {
    pa.weight_rows = *r;
    pa.p.weight_rows = &pa.weight_rows;
  }
  pa.p.check_weight_rows = check_weight_rows;
  pa.p.norm_scope = parse_enum(op, "norm_scope", norm_scope, kNormScopes);
  pa.p.eps = eps;
  if (auto t = args.in_opt(rope, (pre + "rope").c_str())) {
    pa.rope.table = *t;
    pa.rope.interleaved = rope_interleaved;
    pa.p.rope = &pa.rope;
  }
  if (auto m = args.in_opt(mean, (pre + "mean").c_str())) {
    pa.mean = *m;
    pa.p.mean = &pa.mean;
  }
}

namespace {

// The quantize options shared by norm_rope_quantize and norm_rope_mean_quantize (`op` names the
// call in a bad layout's error).
void set_quantize(PrologueParts& pa, const char* op, float sm_scale, float scale_eps,
                  const std::string& layout, int block) {
  pa.p.sm_scale = sm_scale;
  pa.p.scale_eps = scale_eps;
  pa.p.layout = parse_enum(op, "layout", layout, kLayouts);
  pa.p.block = block;
}

}  // namespace

void bind_prologue(nb::module_& m) {
  m.attr("has_prologue") = true;
  m.def(
      "prologue_scale_count",
      [](int64_t n_tokens, const std::string& layout, int block) {
        return prologue_scale_count(
            n_tokens, parse_enum("prologue_scale_count", "layout", layout, kLayouts), block);
      },
      nb::arg("n_tokens"), nb::arg("layout"), nb::arg("block"),
      "Scales per (batch, head): the last dim of norm_rope_quantize's scale_out.");
  m.def(
      "norm_rope_mean",
      [](nb::handle x, nb::handle mean_out, nb::handle norm_weight, nb::handle weight_rows,
         float eps, nb::handle rope, bool rope_interleaved, bool check_weight_rows,
         const std::string& norm_scope, uintptr_t stream, int threads) {
        Args args("norm_rope_mean");
        TensorView xv = args.in(x, "x");
        TensorView mv = args.out(mean_out, "mean_out");
        PrologueParts pa;
        fill_prologue(args, pa, norm_weight, weight_rows, eps, rope, rope_interleaved,
                      nb::none(), "", check_weight_rows, norm_scope, "norm_rope_mean");
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        norm_rope_mean(xv, pa.p, mv, ctx);
      },
      nb::arg("x"), nb::arg("mean_out"), nb::kw_only(), nb::arg("norm_weight") = nb::none(),
      nb::arg("weight_rows") = nb::none(), nb::arg("eps") = 1e-6f, nb::arg("rope") = nb::none(),
      nb::arg("rope_interleaved") = false, nb::arg("check_weight_rows") = true,
      nb::arg("norm_scope") = "head", nb::arg("stream") = 0, nb::arg("threads") = 0,
      "mean_out (B, H, D) f32 = mean over tokens of rope(norm(x)); x (B, N, H, D). "
      "check_weight_rows False: weight_rows' range is not read back (no synchronization; an "
      "index out of range takes the nearest row). norm_scope 'token': the RMSNorm over each "
      "token's H*D channels (Wan), norm_weight (H*D) or (H, D).");
  m.def(
      "norm_rope_quantize",
      [](nb::handle x, nb::handle q_out, nb::handle scale_out, nb::handle norm_weight,
         nb::handle weight_rows, float eps, nb::handle rope, bool rope_interleaved,
         nb::handle mean, float sm_scale, float scale_eps, const std::string& layout, int block,
         bool check_weight_rows, const std::string& norm_scope, uintptr_t stream, int threads) {
        Args args("norm_rope_quantize");
        TensorView xv = args.in(x, "x");
        TensorView qv = args.out(q_out, "q_out");
        TensorView sv = args.out(scale_out, "scale_out");
        PrologueParts pa;
        fill_prologue(args, pa, norm_weight, weight_rows, eps, rope, rope_interleaved, mean, "",
                      check_weight_rows, norm_scope, "norm_rope_quantize");
        set_quantize(pa, "norm_rope_quantize", sm_scale, scale_eps, layout, block);
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        norm_rope_quantize(xv, pa.p, qv, sv, ctx);
      },
      nb::arg("x"), nb::arg("q_out"), nb::arg("scale_out"), nb::kw_only(),
      nb::arg("norm_weight") = nb::none(), nb::arg("weight_rows") = nb::none(),
      nb::arg("eps") = 1e-6f, nb::arg("rope") = nb::none(), nb::arg("rope_interleaved") = false,
      nb::arg("mean") = nb::none(), nb::arg("sm_scale") = 1.f, nb::arg("scale_eps") = 1e-7f,
      nb::arg("layout") = "per_block", nb::arg("block") = 64,
      nb::arg("check_weight_rows") = true, nb::arg("norm_scope") = "head", nb::arg("stream") = 0,
      nb::arg("threads") = 0,
      "INT8 codes q_out (B, N, H, D) and f32 scales scale_out (B, H, prologue_scale_count) of "
      "(rope(norm(x)) - mean) * sm_scale (SPEC section 1).");
  m.def(
      "norm_rope_mean_quantize",
      [](nb::handle x, nb::handle mean_out, nb::handle q_out, nb::handle scale_out,
         nb::handle norm_weight, nb::handle weight_rows, float eps, nb::handle rope,
         bool rope_interleaved, float sm_scale, float scale_eps, const std::string& layout,
         int block, bool check_weight_rows, const std::string& norm_scope, uintptr_t stream,
         int threads) {
        Args args("norm_rope_mean_quantize");
        TensorView xv = args.in(x, "x");
        TensorView mv = args.out(mean_out, "mean_out");
        TensorView qv = args.out(q_out, "q_out");
        TensorView sv = args.out(scale_out, "scale_out");
        PrologueParts pa;
        fill_prologue(args, pa, norm_weight, weight_rows, eps, rope, rope_interleaved,
                      nb::none(), "", check_weight_rows, norm_scope, "norm_rope_mean_quantize");
        set_quantize(pa, "norm_rope_mean_quantize", sm_scale, scale_eps, layout, block);
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        norm_rope_mean_quantize(xv, pa.p, mv, qv, sv, ctx);
      },
      nb::arg("x"), nb::arg("mean_out"), nb::arg("q_out"), nb::arg("scale_out"), nb::kw_only(),
      nb::arg("norm_weight") = nb::none(), nb::arg("weight_rows") = nb::none(),
      nb::arg("eps") = 1e-6f, nb::arg("rope") = nb::none(), nb::arg("rope_interleaved") = false,
      nb::arg("sm_scale") = 1.f, nb::arg("scale_eps") = 1e-7f, nb::arg("layout") = "thread_k",
      nb::arg("block") = 64, nb::arg("check_weight_rows") = true, nb::arg("norm_scope") = "head",
      nb::arg("stream") = 0, nb::arg("threads") = 0,
      "The k path in one call: mean_out (B, H, D) f32 = norm_rope_mean(x), then q_out and "
      "scale_out as norm_rope_quantize(x, mean=mean_out) (the same bits as the two calls).");
}

}  // namespace py
}  // namespace lowbit
