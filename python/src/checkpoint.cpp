// Bindings of include/lowbit/checkpoint.h: the memory-mapped safetensors reader (tensors come
// back as numpy views of the mapping, no copy) and the quantized-layer markers.
#include "python/src/common.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "lowbit/checkpoint.h"
#include "lowbit/linear.h"
#include "python/src/common_enums.h"

namespace lowbit {
namespace py {

namespace {

// The numpy-side element type of a file dtype (bf16 as uint16 and fp8 / e8m0 as uint8, the
// storage numpy has).
nb::dlpack::dtype storage_dtype(FileDType d) {
  using C = nb::dlpack::dtype_code;
  auto make = [](C code, int bits) {
    nb::dlpack::dtype t;
    t.code = static_cast<uint8_t>(code);
    t.bits = static_cast<uint8_t>(bits);
    t.lanes = 1;
    return t;
  };
  switch (d) {
    case FileDType::boolean: return make(C::Bool, 8);
    case FileDType::i8: return make(C::Int, 8);
    case FileDType::i16: return make(C::Int, 16);
    case FileDType::i32: return make(C::Int, 32);
    case FileDType::i64: return make(C::Int, 64);
    case FileDType::u16: case FileDType::bf16: return make(C::UInt, 16);
    case FileDType::u32: return make(C::UInt, 32);
    case FileDType::u64: return make(C::UInt, 64);
    case FileDType::f16: return make(C::Float, 16);
    case FileDType::f32: return make(C::Float, 32);
    case FileDType::f64: return make(C::Float, 64);
    default: return make(C::UInt, 8);  // u8, e4m3, e5m2, e8m0
  }
}

nb::object tensor_array(const SafetensorsReader& r, const TensorInfo& info, nb::handle owner) {
  std::vector<size_t> shape(info.shape.begin(), info.shape.end());
  return nb::ndarray<nb::numpy, nb::ro>(const_cast<uint8_t*>(r.data(info)), shape.size(),
                                        shape.data(), owner, nullptr, storage_dtype(info.dtype))
      .cast(nb::rv_policy::reference);
}

nb::dict marker_dict(const LayerMarker& mk) {
  nb::dict d;
  d["prefix"] = mk.prefix;
  d["format"] = mk.format;
  d["qtype"] = mk.qtype;
  d["rot"] = mk.rot;
  d["bits"] = mk.bits;
  d["group"] = mk.group;
  d["json"] = mk.json;
  return d;
}

LayerMarker marker_of(nb::handle d) {
  LayerMarker mk;
  mk.prefix = nb::cast<std::string>(d["prefix"]);
  mk.format = nb::cast<std::string>(d["format"]);
  mk.qtype = nb::cast<std::string>(d["qtype"]);
  mk.rot = nb::cast<int>(d["rot"]);
  mk.bits = nb::cast<int>(d["bits"]);
  mk.group = nb::cast<int>(d["group"]);
  mk.json = nb::cast<std::string>(d["json"]);
  return mk;
}

// The files and counts of a quantize / dequantize report.
nb::dict io_dict(const CheckpointIO& io) {
  nb::dict d;
  d["tensors_in"] = io.tensors_in;
  d["tensors_out"] = io.tensors_out;
  d["file_bytes_in"] = io.file_bytes_in;
  d["file_bytes_out"] = io.file_bytes_out;
  d["files_in"] = io.files_in;
  d["files_out"] = io.files_out;
  d["index_out"] = io.index_out;
  return d;
}

// Wraps a progress(index, count, name, bytes_done, bytes_total) Python callable (None: none).
ProgressFn progress_of(nb::object progress) {
  if (progress.is_none()) return nullptr;
  return [progress](const QuantizeProgress& p) {
    nb::gil_scoped_acquire acquire;
    progress(p.index, p.count, p.name, p.bytes_done, p.bytes_total);
  };
}

const std::pair<const char*, CheckpointFormat> kFormats[] = {
    {"lowbit", CheckpointFormat::lowbit},
    {"comfy", CheckpointFormat::comfy},
};

}  // namespace

void bind_checkpoint(nb::module_& m) {
  m.attr("has_checkpoint") = true;
  nb::class_<SafetensorsReader>(m, "SafetensorsReader",
                                "A validated, memory-mapped, read-only safetensors file.")
      .def(nb::init<const std::string&>(), nb::arg("path"))
      .def_prop_ro("path", &SafetensorsReader::path)
      .def_prop_ro("file_bytes", &SafetensorsReader::file_bytes)
      .def("names",
           [](const SafetensorsReader& r) {
             std::vector<std::string> out;
             for (const TensorInfo& t : r.tensors()) out.push_back(t.name);
             return out;
           })
      .def(
          "info",
          [](const SafetensorsReader& r, const std::string& name) {
            const TensorInfo& t = r.at(name);
            nb::dict d;
            d["dtype"] = file_dtype_name(t.dtype);
            d["shape"] = nb::tuple(nb::cast(t.shape));
            d["nbytes"] = t.nbytes();
            return d;
          },
          nb::arg("name"))
      .def(
          "get",
          [](nb::handle self, const std::string& name) {
            const SafetensorsReader& r = nb::cast<const SafetensorsReader&>(self);
            const TensorInfo& t = r.at(name);
            return nb::make_tuple(tensor_array(r, t, self), file_dtype_name(t.dtype));
          },
          nb::arg("name"),
          "(read-only numpy view of the mapping, file dtype name). BF16 comes as uint16, fp8 as "
          "uint8; the view stays valid while the reader lives.")
      .def("metadata", [](const SafetensorsReader& r) { return r.metadata(); })
      .def("__contains__",
           [](const SafetensorsReader& r, const std::string& n) { return r.find(n) != nullptr; })
      .def("__len__", [](const SafetensorsReader& r) { return r.tensors().size(); });
  m.def(
      "checkpoint_files",
      [](const std::string& path) {
        CheckpointFiles f = checkpoint_files(path);
        nb::dict d;
        d["index"] = f.index;
        d["files"] = f.files;
        d["weight_map"] = f.weight_map;
        d["index_metadata"] = f.index_metadata;
        return d;
      },
      nb::arg("path"),
      "The files of a checkpoint path (a .safetensors file, a sharded *.safetensors.index.json, "
      "or a directory holding one of them): dict of index ('' for one file), files, weight_map "
      "(tensor -> shard file name) and index_metadata (JSON text).");
  m.def(
      "open_checkpoint",
      [](const std::string& path) {
        nb::list out;
        for (SafetensorsReader& r : open_checkpoint(checkpoint_files(path)))
          out.append(nb::cast(std::move(r)));
        return out;
      },
      nb::arg("path"),
      "SafetensorsReaders of a checkpoint's files (one file, or the shards of an index, checked "
      "against it: every tensor in the shard the weight_map names, none in two shards).");
  m.def(
      "find_layer_markers",
      [](const SafetensorsReader& r) {
        nb::list out;
        for (const LayerMarker& mk : find_layer_markers(r)) out.append(marker_dict(mk));
        return out;
      },
      nb::arg("reader"),
      "The quantized layers of a file: dicts of prefix, format (lowbit / comfy), qtype, rot, "
      "bits, group, json.");
  m.def(
      "lowbit_marker",
      [](const PackedWeight& w, const std::string& source_dtype) {
        FileDType src;
        if (!parse_file_dtype(source_dtype, &src))
          throw Error("lowbit_marker", "source_dtype",
                      "expected a safetensors dtype name (F32, BF16, F16, ...), got '" +
                          source_dtype + "'");
        return lowbit_marker_json(w, src);
      },
      nb::arg("packed"), nb::arg("source_dtype") = "F32",
      "The JSON text of the layer's {prefix}lowbit_quant marker (lowbit checkpoint format).");
  m.def(
      "load_quantized_layer",
      [](const SafetensorsReader& r, nb::handle marker) {
        return load_quantized_layer(r, marker_of(marker));
      },
      nb::arg("reader"), nb::arg("marker"),
      "The PackedWeight of one quantized layer (a marker from find_layer_markers), validated "
      "against the marker's qtype and the layer's shape.");
  m.def(
      "quantize_checkpoint",
      [](const std::string& in, const std::string& out, const std::string& qtype,
         std::vector<std::string> include, std::vector<std::string> exclude,
         const std::string& format, bool compute_error, nb::object progress, int threads,
         bool dry_run) {
        QuantizeOptions o;
        o.filter.include = std::move(include);
        o.filter.exclude = std::move(exclude);
        o.format = parse_enum("quantize_checkpoint", "format", format, kFormats);
        o.compute_error = compute_error;
        o.dry_run = dry_run;
        o.progress = progress_of(progress);
        QType q = parse_qtype(qtype);
        Context ctx = make_context(0, threads);
        QuantizeReport rep;
        {
          nb::gil_scoped_release release;
          rep = quantize_checkpoint(in, out, q, o, ctx);
        }
        nb::list layers;
        for (const LayerReport& l : rep.layers) {
          nb::dict d;
          d["name"] = l.name;
          d["shape"] = nb::tuple(nb::cast(l.shape));
          d["source_dtype"] = l.source_dtype;
          d["quantized"] = l.quantized;
          d["qtype"] = l.qtype;
          d["skip_reason"] = l.skip_reason;
          d["rot"] = l.rot;
          d["bytes_before"] = l.bytes_before;
          d["bytes_after"] = l.bytes_after;
          d["rel_error"] = l.rel_error;
          layers.append(d);
        }
        nb::dict d = io_dict(rep);
        d["layers"] = layers;
        d["tensors_copied"] = rep.tensors_copied;
        return d;
      },
      nb::arg("input"), nb::arg("output"), nb::arg("qtype"), nb::kw_only(),
      nb::arg("include") = std::vector<std::string>(),
      nb::arg("exclude") = std::vector<std::string>(), nb::arg("format") = "lowbit",
      nb::arg("compute_error") = true, nb::arg("progress") = nb::none(), nb::arg("threads") = 0,
      nb::arg("dry_run") = false,
      "Streams a safetensors checkpoint (a file, a sharded index or a directory), quantizing its "
      "2-D *.weight tensors (globs include / exclude) to `qtype` in lowbit or ComfyUI format, "
      "into one file or, when `output` ends in .index.json, into shards of the input's file "
      "names beside that index; returns the per-layer report (dry_run: the plan only, nothing "
      "written). "
      "progress(index, count, name, bytes_done, bytes_total) is called as it goes.");
  m.def(
      "dequantize_checkpoint",
      [](const std::string& in, const std::string& out, const std::string& dtype,
         nb::object progress, int threads) {
        DequantizeOptions o;
        if (dtype != "source") {
          o.source_dtype = false;
          const std::pair<const char*, FileDType> kDtypes[] = {
              {"f32", FileDType::f32}, {"bf16", FileDType::bf16}, {"f16", FileDType::f16}};
          o.dtype = parse_enum("dequantize_checkpoint", "dtype", dtype, kDtypes);
        }
        o.progress = progress_of(progress);
        Context ctx = make_context(0, threads);
        DequantizeReport rep;
        {
          nb::gil_scoped_release release;
          rep = dequantize_checkpoint(in, out, o, ctx);
        }
        nb::list layers;
        for (const RestoredLayer& l : rep.layers) {
          nb::dict d;
          d["name"] = l.name;
          d["shape"] = nb::tuple(nb::cast(l.shape));
          d["qtype"] = l.qtype;
          d["dtype"] = file_dtype_name(l.dtype);
          d["bytes_before"] = l.bytes_before;
          d["bytes_after"] = l.bytes_after;
          layers.append(d);
        }
        nb::dict d = io_dict(rep);
        d["layers"] = layers;
        return d;
      },
      nb::arg("input"), nb::arg("output"), nb::kw_only(), nb::arg("dtype") = "source",
      nb::arg("progress") = nb::none(), nb::arg("threads") = 0,
      "The inverse of quantize_checkpoint: every quantized layer (lowbit or ComfyUI) becomes its "
      "dequantized weight in the original basis, in `dtype` ('source': the dtype its marker "
      "records; 'f32', 'bf16', 'f16'); other tensors are copied. Files, indexes and directories "
      "as quantize_checkpoint.");
}

}  // namespace py
}  // namespace lowbit
