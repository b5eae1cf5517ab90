// Bindings of include/lowbit/linear.h: qtypes, hadamard_rotate, activation quantization, packed
// weights (PackedWeight) and the layer (QuantizedLinear).
#include "python/src/common.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "lowbit/linear.h"

namespace lowbit {
namespace py {

namespace {

QType qtype_of(const std::string& name) { return parse_qtype(name); }

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) return Device::cuda;
  throw Error("QuantizedLinear.from_packed", "device",
              "expected 'cpu' or 'cuda', got '" + name + "'");
}

// name -> array views of the parts of a packed weight, kept valid by `owner`.
nb::dict parts_dict(const std::vector<std::pair<std::string, TensorView>>& parts,
                    nb::handle owner) {
  nb::dict d;
  for (const auto& p : parts) {
    if (p.second.data == nullptr) continue;
    d[nb::str(p.first.c_str())] = to_array(p.second, owner);
  }
  return d;
}

std::vector<std::pair<std::string, TensorView>> view_parts(const PackedWeightView& w) {
  return {{"codes", w.codes},
          {"scales", w.scales},
          {"ratios", w.ratios},
          {"block_scales", w.block_scales},
          {"block_scales_swizzled", w.block_scales_swizzled},
          {"tensor_scale", w.tensor_scale}};
}

}  // namespace

void bind_linear(nb::module_& m) {
  m.attr("has_linear") = true;
  nb::list names;
  for (int i = 0; i < kNumQTypes; ++i) names.append(qtype_name(static_cast<QType>(i)));
  m.attr("QTYPES") = nb::tuple(names);
  m.def(
      "parse_qtype", [](const std::string& n) { return std::string(qtype_name(qtype_of(n))); },
      nb::arg("name"), "The canonical ai-toolkit name of a qtype (lowbit.Error when unknown).");
  m.def(
      "qtype_bits", [](const std::string& n) { return qtype_bits(qtype_of(n)); },
      nb::arg("qtype"));
  m.def(
      "qtype_group",
      [](const std::string& n, int64_t in_features) {
        return qtype_group(qtype_of(n), in_features);
      },
      nb::arg("qtype"), nb::arg("in_features"));
  m.def("rotation_block", &rotation_block, nb::arg("in_features"));
  m.def(
      "can_quantize",
      [](const std::string& n, int64_t out_features, int64_t in_features) {
        std::string why;
        bool ok = can_quantize(qtype_of(n), out_features, in_features, &why);
        return std::make_pair(ok, why);
      },
      nb::arg("qtype"), nb::arg("out_features"), nb::arg("in_features"),
      "(ok, why_not) for a layer of (out_features, in_features).");
  m.def(
      "hadamard_rotate",
      [](nb::handle x, int block, nb::handle out, uintptr_t stream, int threads) {
        Args args("hadamard_rotate");
        TensorView xv = args.in(x, "x");
        TensorView ov = args.out(out, "out");
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        hadamard_rotate(xv, block, ov, ctx);
      },
      nb::arg("x"), nb::arg("block"), nb::arg("out"), nb::kw_only(), nb::arg("stream") = 0,
      nb::arg("threads") = 0,
      "out = x . R_block on each block of the last dim (out may be x). x, out (..., K).");
  m.def(
      "rotate_quantize_activations",
      [](nb::handle x, const std::string& qtype, int rot, nb::handle codes, nb::handle scales,
         uintptr_t stream, int threads) {
        Args args("rotate_quantize_activations");
        TensorView xv = args.in(x, "x");
        TensorView cv = args.out(codes, "codes");
        TensorView sv = args.out(scales, "scales");
        QType q = qtype_of(qtype);
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        rotate_quantize_activations(xv, q, rot, cv, sv, ctx);
      },
      nb::arg("x"), nb::arg("qtype"), nb::arg("rot"), nb::arg("codes"), nb::arg("scales"),
      nb::kw_only(), nb::arg("stream") = 0, nb::arg("threads") = 0,
      "Per-token activation codes and scales of the rotated layer input x (M, K).");

  nb::class_<PackedWeight>(m, "PackedWeight",
                           "One layer's packed weight on the host (what a checkpoint stores).")
      .def(
          "__init__",
          [](PackedWeight* self, const std::string& qtype, int64_t out_features,
             int64_t in_features, nb::dict tensors, int rot, int64_t group) {
            Args args("PackedWeight");
            std::vector<std::string> names;
            for (auto item : tensors) names.push_back(nb::cast<std::string>(item.first));
            std::vector<std::pair<std::string, TensorView>> parts;
            for (size_t i = 0; i < names.size(); ++i) {
              parts.emplace_back(names[i], args.in(tensors[names[i].c_str()], names[i].c_str()));
            }
            new (self) PackedWeight(qtype_of(qtype), out_features, in_features, parts, rot,
                                    group);
          },
          nb::arg("qtype"), nb::arg("out_features"), nb::arg("in_features"), nb::arg("tensors"),
          nb::arg("rot") = 0, nb::arg("group") = 0,
          "Copies the named parts (host arrays; names as tensors() gives them), validating "
          "every dtype and shape.")
      .def_prop_ro("qtype", [](const PackedWeight& w) { return qtype_name(w.qtype()); })
      .def_prop_ro("out_features", &PackedWeight::out_features)
      .def_prop_ro("in_features", &PackedWeight::in_features)
      .def_prop_ro("rot", &PackedWeight::rot)
      .def_prop_ro("bits", &PackedWeight::bits)
      .def_prop_ro("group", &PackedWeight::group)
      .def_prop_ro("storage_bytes", &PackedWeight::storage_bytes)
      .def(
          "tensors",
          [](nb::handle self) {
            const PackedWeight& w = nb::cast<const PackedWeight&>(self);
            return parts_dict(w.tensors(), self);
          },
          "name -> numpy view of each stored part (valid while this object lives).")
      .def(
          "dtypes",
          [](const PackedWeight& w) {
            nb::dict d;
            for (const auto& p : w.tensors())
              d[nb::str(p.first.c_str())] = dtype_name(p.second.dtype);
            return d;
          },
          "name -> lowbit dtype of each stored part (tensors() gives numpy's storage type: "
          "e4m3 parts as uint8).")
      .def("__repr__", [](const PackedWeight& w) {
        return std::string("lowbit.PackedWeight(") + qtype_name(w.qtype()) + ", out_features=" +
               std::to_string(w.out_features()) + ", in_features=" +
               std::to_string(w.in_features()) + ", rot=" + std::to_string(w.rot()) + ")";
      });

  m.def(
      "make_packed_weight",
      [](const std::string& qtype, int64_t out_features, int64_t in_features) {
        return make_packed_weight(qtype_of(qtype), out_features, in_features);
      },
      nb::arg("qtype"), nb::arg("out_features"), nb::arg("in_features"));
  m.def(
      "quantize_weight",
      [](nb::handle w, const std::string& qtype, int threads) {
        Args args("quantize_weight");
        TensorView wv = args.in(w, "w");
        QType q = qtype_of(qtype);
        Context ctx = make_context(0, threads);
        nb::gil_scoped_release release;
        return quantize_weight(wv, q, ctx);
      },
      nb::arg("w"), nb::arg("qtype"), nb::kw_only(), nb::arg("threads") = 0,
      "Rotates and packs w (O, K) (host) into a PackedWeight.");
  m.def(
      "dequantize_weight",
      [](const PackedWeight& w, nb::handle out, bool rotated_basis, int threads) {
        Args args("dequantize_weight");
        TensorView ov = args.out(out, "out");
        Context ctx = make_context(0, threads);
        nb::gil_scoped_release release;
        dequantize_weight(w, ov, rotated_basis, ctx);
      },
      nb::arg("packed"), nb::arg("out"), nb::kw_only(), nb::arg("rotated_basis") = false,
      nb::arg("threads") = 0, "out (O, K) f32 = the weight the quantized GEMM multiplies by.");

  nb::class_<QuantizedLinear>(m, "QuantizedLinear",
                              "One quantized linear layer's packed weights on one device.")
      .def_static(
          "quantize",
          [](nb::handle weight, const std::string& qtype, uintptr_t stream, int threads) {
            Args args("QuantizedLinear.quantize");
            TensorView wv = args.in(weight, "weight");
            QType q = qtype_of(qtype);
            Context ctx = make_context(stream, threads);
            nb::gil_scoped_release release;
            return QuantizedLinear::quantize(wv, q, ctx);
          },
          nb::arg("weight"), nb::arg("qtype"), nb::kw_only(), nb::arg("stream") = 0,
          nb::arg("threads") = 0,
          "Rotates and packs weight (O, K) and keeps it on the weight's device.")
      .def_static(
          "from_packed",
          [](const PackedWeight& w, const std::string& device, uintptr_t stream) {
            Device d = parse_device(device);
            Context ctx = make_context(stream, 0);
            nb::gil_scoped_release release;
            return QuantizedLinear::from_packed(w, d, ctx);
          },
          nb::arg("packed"), nb::arg("device") = "cpu", nb::kw_only(), nb::arg("stream") = 0)
      .def_prop_ro("qtype", [](const QuantizedLinear& l) { return qtype_name(l.qtype()); })
      .def_prop_ro("rotation_block", &QuantizedLinear::rotation_block)
      .def_prop_ro("out_features", &QuantizedLinear::out_features)
      .def_prop_ro("in_features", &QuantizedLinear::in_features)
      .def_prop_ro("device", [](const QuantizedLinear& l) { return device_name(l.device()); })
      .def_prop_ro("empty", &QuantizedLinear::empty)
      .def_prop_rw("fp8_fast_accumulation", &QuantizedLinear::fp8_fast_accumulation,
                   &QuantizedLinear::set_fp8_fast_accumulation,
                   "convrotfp8 on CUDA: cuBLASLt fast accumulation in the prefill GEMM (default "
                   "True; False = full-precision fp32 accumulation). Ignored elsewhere.")
      .def(
          "weights",
          [](nb::handle self) {
            const QuantizedLinear& l = nb::cast<const QuantizedLinear&>(self);
            return parts_dict(view_parts(l.weights()), self);
          },
          "name -> array view of each packed part on the layer's device.")
      .def(
          "to_packed",
          [](const QuantizedLinear& l, uintptr_t stream) {
            Context ctx = make_context(stream, 0);
            return l.to_packed(ctx);
          },
          nb::kw_only(), nb::arg("stream") = 0)
      .def(
          "forward",
          [](const QuantizedLinear& l, nb::handle x, nb::handle out, nb::handle bias,
             uintptr_t stream, int threads) {
            Args args("QuantizedLinear.forward");
            TensorView xv = args.in(x, "x");
            TensorView ov = args.out(out, "out");
            std::optional<TensorView> bv = args.in_opt(bias, "bias");
            Context ctx = make_context(stream, threads);
            nb::gil_scoped_release release;
            l.forward(xv, bv ? &*bv : nullptr, ov, ctx);
          },
          nb::arg("x"), nb::arg("out"), nb::kw_only(), nb::arg("bias") = nb::none(),
          nb::arg("stream") = 0, nb::arg("threads") = 0,
          "out (M, O) = quantized x (M, K) . W^T (+ bias (O)).")
      .def(
          "backward_input",
          [](const QuantizedLinear& l, nb::handle grad_out, nb::handle grad_x, uintptr_t stream,
             int threads) {
            Args args("QuantizedLinear.backward_input");
            TensorView gv = args.in(grad_out, "grad_out");
            TensorView xv = args.out(grad_x, "grad_x");
            Context ctx = make_context(stream, threads);
            nb::gil_scoped_release release;
            l.backward_input(gv, xv, ctx);
          },
          nb::arg("grad_out"), nb::arg("grad_x"), nb::kw_only(), nb::arg("stream") = 0,
          nb::arg("threads") = 0, "grad_x (M, K) = grad_out (M, O) . dequant(W).")
      .def(
          "requantize",
          [](QuantizedLinear& l, nb::handle weight, bool stochastic, uint64_t seed,
             uintptr_t stream, int threads) {
            Args args("QuantizedLinear.requantize");
            TensorView wv = args.in(weight, "weight");
            Context ctx = make_context(stream, threads);
            nb::gil_scoped_release release;
            l.requantize(wv, stochastic, seed, ctx);
          },
          nb::arg("weight"), nb::kw_only(), nb::arg("stochastic") = false, nb::arg("seed") = 0,
          nb::arg("stream") = 0, nb::arg("threads") = 0)
      .def(
          "dequantize",
          [](const QuantizedLinear& l, nb::handle out, uintptr_t stream, int threads) {
            Args args("QuantizedLinear.dequantize");
            TensorView ov = args.out(out, "out");
            Context ctx = make_context(stream, threads);
            nb::gil_scoped_release release;
            l.dequantize(ov, ctx);
          },
          nb::arg("out"), nb::kw_only(), nb::arg("stream") = 0, nb::arg("threads") = 0,
          "out (O, K) f32 = the dequantized weight in the original basis.")
      .def("__repr__", [](const QuantizedLinear& l) {
        return std::string("lowbit.QuantizedLinear(") + qtype_name(l.qtype()) +
               ", out_features=" + std::to_string(l.out_features()) + ", in_features=" +
               std::to_string(l.in_features()) + ", device=" + device_name(l.device()) + ")";
      });
}

}  // namespace py
}  // namespace lowbit
