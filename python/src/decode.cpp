// Bindings of include/lowbit/decode.h: KV caches (xformers-compatible int4 / fp8 rows, paged or
// contiguous), kv_append, plan_decode / decode_attention, merge_attention (+ backward).
#include "python/src/common.h"

#include <nanobind/stl/string.h>

#include "lowbit/decode.h"
#include "python/src/common_enums.h"

namespace lowbit {
namespace py {

namespace {

const std::pair<const char*, KvFormat> kFormats[] = {
    {"f16", KvFormat::f16},
    {"bf16", KvFormat::bf16},
    {"int4", KvFormat::int4},
    {"fp8", KvFormat::fp8},
};

// A cache as Python holds it: the arrays (any DLPack / buffer array-likes) and the format.
struct PyKvCache {
  nb::object k, v, seq_len, k_scale_shift, v_scale_shift, block_tables;
  KvFormat format = KvFormat::f16;
  int n_groups = 1;
  int page_size = 0;

  // The library's view of it; `writable` for kv_append (k, v and the scale/shift words).
  KvCache view(Args& args, bool writable) const {
    KvCache c;
    c.format = format;
    c.n_groups = n_groups;
    c.k = writable ? args.out(k, "k_cache") : args.in(k, "k_cache");
    c.v = writable ? args.out(v, "v_cache") : args.in(v, "v_cache");
    if (!k_scale_shift.is_none()) {
      c.k_scale_shift = writable ? args.out(k_scale_shift, "k_scale_shift")
                                 : args.in(k_scale_shift, "k_scale_shift");
    }
    if (!v_scale_shift.is_none()) {
      c.v_scale_shift = writable ? args.out(v_scale_shift, "v_scale_shift")
                                 : args.in(v_scale_shift, "v_scale_shift");
    }
    if (!block_tables.is_none()) c.block_tables = args.in(block_tables, "block_tables");
    c.page_size = page_size;
    c.seq_len = args.in(seq_len, "seq_len");
    return c;
  }
};

}  // namespace

void bind_decode(nb::module_& m) {
  m.attr("has_decode") = true;

  nb::class_<PyKvCache>(m, "KvCache",
                        "A KV cache over caller-owned arrays (SPEC section 4 / xformers layout).")
      .def(
          "__init__",
          [](PyKvCache* self, nb::object k, nb::object v, nb::object seq_len,
             const std::string& format, int n_groups, nb::object k_scale_shift,
             nb::object v_scale_shift, nb::object block_tables, int page_size) {
            new (self) PyKvCache{k,
                                 v,
                                 seq_len,
                                 k_scale_shift,
                                 v_scale_shift,
                                 block_tables,
                                 parse_enum("KvCache", "format", format, kFormats),
                                 n_groups,
                                 page_size};
          },
          nb::arg("k"), nb::arg("v"), nb::arg("seq_len"), nb::kw_only(),
          nb::arg("format") = "f16", nb::arg("n_groups") = 1,
          nb::arg("k_scale_shift") = nb::none(), nb::arg("v_scale_shift") = nb::none(),
          nb::arg("block_tables") = nb::none(), nb::arg("page_size") = 0,
          "k, v: (B, L, Hkv, Dp) contiguous layout or (P * page_size, Hkv, Dp) pools with "
          "block_tables (B, max_pages) int32; Dp = D (f16/bf16), n_groups + D/8 int32 words "
          "(int4), D/4 int32 words (fp8, with k/v_scale_shift int32); seq_len (B) int32.")
      .def_prop_ro("k", [](const PyKvCache& c) { return c.k; })
      .def_prop_ro("v", [](const PyKvCache& c) { return c.v; })
      .def_prop_ro("seq_len", [](const PyKvCache& c) { return c.seq_len; })
      .def_prop_ro("block_tables", [](const PyKvCache& c) { return c.block_tables; })
      .def_prop_ro("k_scale_shift", [](const PyKvCache& c) { return c.k_scale_shift; })
      .def_prop_ro("v_scale_shift", [](const PyKvCache& c) { return c.v_scale_shift; })
      .def_prop_ro("format", [](const PyKvCache& c) { return kv_format_name(c.format); })
      .def_prop_ro("n_groups", [](const PyKvCache& c) { return c.n_groups; })
      .def_prop_ro("page_size", [](const PyKvCache& c) { return c.page_size; })
      .def_prop_ro("paged", [](const PyKvCache& c) { return !c.block_tables.is_none(); })
      .def_prop_ro("batch",
                   [](const PyKvCache& c) {
                     Args a("KvCache");
                     return c.view(a, false).batch();
                   })
      .def_prop_ro("kv_heads",
                   [](const PyKvCache& c) {
                     Args a("KvCache");
                     return c.view(a, false).kv_heads();
                   })
      .def_prop_ro("capacity",
                   [](const PyKvCache& c) {
                     Args a("KvCache");
                     return c.view(a, false).capacity();
                   })
      .def_prop_ro("head_dim", [](const PyKvCache& c) {
        Args a("KvCache");
        return c.view(a, false).head_dim();
      });

  nb::class_<DecodePlan>(m, "DecodePlan", "Split-K plan of decode_attention (a value type).")
      .def(nb::init<>())
      .def_prop_ro("device", [](const DecodePlan& p) { return device_name(p.device); })
      .def_rw("batch", &DecodePlan::batch)
      .def_rw("kv_heads", &DecodePlan::kv_heads)
      .def_rw("capacity", &DecodePlan::capacity)
      .def_rw("mq", &DecodePlan::mq)
      .def_rw("group", &DecodePlan::group)
      .def_rw("head_dim", &DecodePlan::head_dim)
      .def_prop_ro("format", [](const DecodePlan& p) { return kv_format_name(p.format); })
      .def_rw("n_splits", &DecodePlan::n_splits)
      .def_rw("split_size", &DecodePlan::split_size)
      .def_rw("multiprocessors", &DecodePlan::multiprocessors)
      .def_rw("tensor_cores", &DecodePlan::tensor_cores)
      .def_rw("streaming", &DecodePlan::streaming)
      .def_rw("stream_registers", &DecodePlan::stream_registers)
      .def_rw("bulk_copy", &DecodePlan::bulk_copy)
      .def_rw("fold_scales", &DecodePlan::fold_scales)
      .def_rw("bulk_issue", &DecodePlan::bulk_issue)
      .def_rw("bulk_stages", &DecodePlan::bulk_stages)
      .def_rw("merge_wide", &DecodePlan::merge_wide)
      .def_rw("launch_pdl", &DecodePlan::launch_pdl)
      .def_prop_ro("workspace_bytes", [](const DecodePlan& p) { return workspace_bytes(p); })
      .def("__repr__", [](const DecodePlan& p) {
        return std::string("lowbit.DecodePlan(") + device_name(p.device) +
               ", n_splits=" + std::to_string(p.n_splits) +
               ", split_size=" + std::to_string(p.split_size) +
               ", workspace_bytes=" + std::to_string(workspace_bytes(p)) + ")";
      });

  m.def(
      "kv_append",
      [](const PyKvCache& cache, nb::handle k_new, nb::handle v_new, nb::handle positions,
         uintptr_t stream, int threads) {
        Args args("kv_append");
        KvCache c = cache.view(args, true);
        TensorView kv = args.in(k_new, "k_new"), vv = args.in(v_new, "v_new");
        TensorView pv = args.in(positions, "positions");
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        kv_append(c, kv, vv, pv, ctx);
      },
      nb::arg("cache"), nb::arg("k_new"), nb::arg("v_new"), nb::arg("positions"), nb::kw_only(),
      nb::arg("stream") = 0, nb::arg("threads") = 0,
      "Quantizes k_new, v_new (B, Mnew, Hkv, D) into the cache at positions (B) int32 + t. "
      "seq_len is not changed.");
  m.def(
      "plan_decode",
      [](const PyKvCache& cache, int mq, int hq, int d, int64_t max_seq_len, uintptr_t stream,
         int threads) {
        Args args("plan_decode");
        KvCache c = cache.view(args, false);
        Context ctx = make_context(stream, threads);
        return plan_decode(c, mq, hq, d, ctx, max_seq_len);
      },
      nb::arg("cache"), nb::arg("mq"), nb::arg("hq"), nb::arg("head_dim"), nb::kw_only(),
      nb::arg("max_seq_len") = 0, nb::arg("stream") = 0, nb::arg("threads") = 0);
  m.def("workspace_bytes", [](const DecodePlan& p) { return workspace_bytes(p); },
        nb::arg("plan"));
  m.def(
      "decode_attention",
      [](nb::handle q, const PyKvCache& cache, const DecodePlan& plan, nb::handle workspace,
         nb::handle out, nb::handle lse, nb::handle bias, float sm_scale, bool causal,
         uintptr_t stream, int threads) {
        const char* op = "decode_attention";
        Args args(op);
        TensorView qv = args.in(q, "q");
        KvCache c = cache.view(args, false);
        size_t need = workspace_bytes(plan);
        void* ws = nullptr;
        if (auto w = args.out_opt(workspace, "workspace")) {
          int64_t have = dtype_storage_bytes(w->dtype, w->numel());
          if (!w->is_contiguous() || have < static_cast<int64_t>(need) ||
              w->device != plan.device) {
            throw Error(op, "workspace",
                        "expected a contiguous array of at least " + std::to_string(need) +
                            " bytes on " + device_name(plan.device) + ", got " +
                            w->describe() + " (" + std::to_string(have) + " bytes)");
          }
          ws = w->data;
        } else if (need > 0) {
          throw Error(op, "workspace",
                      "expected an array of at least " + std::to_string(need) +
                          " bytes (plan.workspace_bytes), got None");
        }
        TensorView ov = args.out(out, "out");
        std::optional<TensorView> lv = args.out_opt(lse, "lse");
        std::optional<TensorView> bv = args.in_opt(bias, "bias");
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        decode_attention(qv, c, plan, ws, ov, lv ? &*lv : nullptr, bv ? &*bv : nullptr,
                         sm_scale, causal, ctx);
      },
      nb::arg("q"), nb::arg("cache"), nb::arg("plan"), nb::arg("workspace"), nb::arg("out"),
      nb::kw_only(), nb::arg("lse") = nb::none(), nb::arg("bias") = nb::none(),
      nb::arg("sm_scale") = 0.f, nb::arg("causal") = false, nb::arg("stream") = 0,
      nb::arg("threads") = 0,
      "out (B, Mq, Hkv, G, D) = softmax(q k^T * sm_scale + bias) v over the cache; q like out; "
      "lse (B, Mq, Hkv, G) f32; bias (B, Hkv, G, Mq, capacity); workspace: plan.workspace_bytes "
      "bytes on the plan's device.");
  m.def(
      "merge_attention",
      [](nb::handle outs, nb::handle lses, nb::handle out, nb::handle lse, uintptr_t stream,
         int threads) {
        Args args("merge_attention");
        TensorView ov = args.out(out, "out");
        std::optional<TensorView> lv = args.out_opt(lse, "lse");
        Context ctx = make_context(stream, threads);
        if (nb::isinstance<nb::list>(outs) || nb::isinstance<nb::tuple>(outs)) {
          std::vector<TensorView> ovs, lvs;
          for (nb::handle o : outs) ovs.push_back(args.in(o, "outs"));
          for (nb::handle l : lses) lvs.push_back(args.in(l, "lses"));
          if (ovs.size() != lvs.size()) {
            throw Error("merge_attention", "lses",
                        "expected " + std::to_string(ovs.size()) + " parts, got " +
                            std::to_string(lvs.size()));
          }
          nb::gil_scoped_release release;
          merge_attention(ovs.data(), lvs.data(), static_cast<int>(ovs.size()), ov,
                          lv ? &*lv : nullptr, ctx);
        } else {
          TensorView os = args.in(outs, "outs"), ls = args.in(lses, "lses");
          nb::gil_scoped_release release;
          merge_attention(os, ls, ov, lv ? &*lv : nullptr, ctx);
        }
      },
      nb::arg("outs"), nb::arg("lses"), nb::arg("out"), nb::kw_only(),
      nb::arg("lse") = nb::none(), nb::arg("stream") = 0, nb::arg("threads") = 0,
      "Merges partial attention results: outs / lses as lists of (..., D) / (...) arrays or "
      "stacked (n, ..., D) / (n, ...); out (..., D), lse (...) f32 or None.");
  m.def(
      "merge_attention_backward",
      [](nb::handle outs, nb::handle lses, nb::handle out, nb::handle lse, nb::handle grad_out,
         nb::handle grad_lse, nb::handle grad_outs, nb::handle grad_lses, uintptr_t stream,
         int threads) {
        const char* op = "merge_attention_backward";
        Args args(op);
        std::vector<TensorView> ovs, lvs, gos, gls;
        for (nb::handle o : outs) ovs.push_back(args.in(o, "outs"));
        for (nb::handle l : lses) lvs.push_back(args.in(l, "lses"));
        for (nb::handle g : grad_outs) gos.push_back(args.out(g, "grad_outs"));
        for (nb::handle g : grad_lses) gls.push_back(args.out(g, "grad_lses"));
        size_t n = ovs.size();
        if (lvs.size() != n || gos.size() != n || gls.size() != n) {
          throw Error(op, "lses", "expected lses, grad_outs and grad_lses of " +
                                      std::to_string(n) + " parts each");
        }
        TensorView ov = args.in(out, "out"), lv = args.in(lse, "lse");
        TensorView gv = args.in(grad_out, "grad_out");
        std::optional<TensorView> glv = args.in_opt(grad_lse, "grad_lse");
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        merge_attention_backward(ovs.data(), lvs.data(), static_cast<int>(n), ov, lv, gv,
                                 glv ? &*glv : nullptr, gos.data(), gls.data(), ctx);
      },
      nb::arg("outs"), nb::arg("lses"), nb::arg("out"), nb::arg("lse"), nb::arg("grad_out"),
      nb::arg("grad_lse").none(), nb::arg("grad_outs"), nb::arg("grad_lses"), nb::kw_only(),
      nb::arg("stream") = 0, nb::arg("threads") = 0,
      "Gradients of merge_attention w.r.t. each part (lists of arrays).");
}

}  // namespace py
}  // namespace lowbit
