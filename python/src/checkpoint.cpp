// Bindings of include/lowbit/checkpoint.h: the memory-mapped safetensors reader (tensors come
// back as numpy views of the mapping, no copy) and the quantized-layer markers.
#include "python/src/common.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "lowbit/checkpoint.h"

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
      "find_layer_markers",
      [](const SafetensorsReader& r) {
        nb::list out;
        for (const LayerMarker& mk : find_layer_markers(r)) {
          nb::dict d;
          d["prefix"] = mk.prefix;
          d["format"] = mk.format;
          d["qtype"] = mk.qtype;
          d["rot"] = mk.rot;
          d["bits"] = mk.bits;
          d["group"] = mk.group;
          d["json"] = mk.json;
          out.append(d);
        }
        return out;
      },
      nb::arg("reader"),
      "The quantized layers of a file: dicts of prefix, format (lowbit / comfy), qtype, rot, "
      "bits, group, json.");
}

}  // namespace py
}  // namespace lowbit
