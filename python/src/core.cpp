// The core of the module: lowbit.Error, dtypes, array-like -> TensorView, convert, version and
// device queries.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstring>
#include <string>

#include "lowbit/core.h"
#include "lowbit/runtime.h"
#include "lowbit/version.h"
#include "python/src/common.h"

namespace lowbit {
namespace py {

namespace {

constexpr DType kAllDTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::i8,     DType::u8,
                                DType::i32,  DType::e4m3, DType::e5m2, DType::e2m1x2, DType::i4x2};

// "float32", "uint16", "bfloat16", "float8_e4m3fn", ... (names in the numpy / torch spelling).
std::string storage_name(const nb::dlpack::dtype& d) {
  using C = nb::dlpack::dtype_code;
  std::string prefix;
  switch (static_cast<C>(d.code)) {
    case C::Int: prefix = "int"; break;
    case C::UInt: prefix = "uint"; break;
    case C::Float: prefix = "float"; break;
    case C::Bfloat: prefix = "bfloat"; break;
    case C::Complex: prefix = "complex"; break;
    case C::Bool: return "bool";
    case C::Float8_E4M3FN: return "float8_e4m3fn";
    case C::Float8_E5M2: return "float8_e5m2";
    case C::Float4_E2M1FN: return "float4_e2m1fn";
    default: prefix = "dlpack_code" + std::to_string(d.code) + "_bits";
  }
  std::string s = prefix + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

// The lowbit dtype an array's own DLPack dtype names, if any.
std::optional<DType> native_dtype(const nb::dlpack::dtype& d) {
  using C = nb::dlpack::dtype_code;
  if (d.lanes != 1) return std::nullopt;
  switch (static_cast<C>(d.code)) {
    case C::Float:
      if (d.bits == 32) return DType::f32;
      if (d.bits == 16) return DType::f16;
      break;
    case C::Bfloat:
      if (d.bits == 16) return DType::bf16;
      break;
    case C::Int:
      if (d.bits == 8) return DType::i8;
      if (d.bits == 32) return DType::i32;
      break;
    case C::UInt:
      if (d.bits == 8) return DType::u8;
      break;
    case C::Float8_E4M3FN:
      if (d.bits == 8) return DType::e4m3;
      break;
    case C::Float8_E5M2:
      if (d.bits == 8) return DType::e5m2;
      break;
    default: break;
  }
  return std::nullopt;
}

bool is_integer_storage(const nb::dlpack::dtype& d) {
  using C = nb::dlpack::dtype_code;
  return d.lanes == 1 && (d.code == static_cast<uint8_t>(C::Int) ||
                          d.code == static_cast<uint8_t>(C::UInt));
}

std::string describe_array(const nb::dlpack::dtype& dt, size_t ndim, const int64_t* shape) {
  std::string s = "(";
  for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (ndim == 1) s += ",";
  return s + ") " + storage_name(dt);
}

template <typename Array>
TensorView view_of(const Array& a, std::optional<DType> want, const char* op, const char* arg) {
  size_t ndim = a.ndim();
  const int64_t* shape = a.shape_ptr();
  const int64_t* stride = a.stride_ptr();
  nb::dlpack::dtype dt = a.dtype();
  if (ndim > static_cast<size_t>(kMaxDims)) {
    throw Error(op, arg, "expected at most " + std::to_string(kMaxDims) + " dimensions, got " +
                             describe_array(dt, ndim, shape));
  }
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.ndim = static_cast<int>(ndim);
  int32_t dev = a.device_type();
  if (dev == nb::device::cpu::value || dev == nb::device::cuda_host::value) {
    v.device = Device::cpu;
    v.device_index = 0;
  } else if (dev == nb::device::cuda::value || dev == nb::device::cuda_managed::value) {
    v.device = Device::cuda;
    v.device_index = a.device_id();
  } else {
    throw Error(op, arg, "expected a CPU or CUDA array, got DLPack device type " +
                             std::to_string(dev));
  }
  for (size_t i = 0; i < ndim; ++i) {
    v.shape[i] = shape[i];
    v.stride[i] = stride[i];
  }
  std::optional<DType> native = native_dtype(dt);
  if (!want) {
    if (!native) {
      throw Error(op, arg, "expected an array of float32/float16/bfloat16/int8/uint8/int32/"
                           "float8_e4m3fn/float8_e5m2 (or lowbit.typed(array, dtype) for other "
                           "lowbit dtypes), got " + describe_array(dt, ndim, shape));
    }
    v.dtype = *native;
    return v;
  }
  v.dtype = *want;
  if (native && *native == *want) return v;
  if (dtype_is_packed(*want)) {
    if (!(is_integer_storage(dt) && dt.bits == 8)) {
      throw Error(op, arg, std::string("expected uint8/int8 storage for ") + dtype_name(*want) +
                               " (two 4-bit values per byte), got " +
                               describe_array(dt, ndim, shape));
    }
    if (ndim == 0 || (shape[ndim - 1] != 1 && stride[ndim - 1] != 1)) {
      throw Error(op, arg, std::string("expected a contiguous innermost dimension for ") +
                               dtype_name(*want) + " storage, got " +
                               describe_array(dt, ndim, shape) + " with innermost stride " +
                               std::to_string(ndim ? stride[ndim - 1] : 0));
    }
    v.shape[ndim - 1] *= 2;
    v.stride[ndim - 1] = 1;
    for (size_t i = 0; i + 1 < ndim; ++i) v.stride[i] *= 2;
    return v;
  }
  if (!(is_integer_storage(dt) && dt.bits == dtype_bits(*want))) {
    throw Error(op, arg, std::string("expected ") + std::to_string(dtype_bits(*want)) +
                             "-bit integer storage to hold " + dtype_name(*want) + ", got " +
                             describe_array(dt, ndim, shape));
  }
  return v;
}

PyObject* g_error_type = nullptr;

}  // namespace

DType parse_dtype(const std::string& name) {
  struct Alias {
    const char* name;
    DType dtype;
  };
  static const Alias aliases[] = {
      {"float32", DType::f32},       {"float", DType::f32},         {"float16", DType::f16},
      {"half", DType::f16},          {"bfloat16", DType::bf16},     {"int8", DType::i8},
      {"uint8", DType::u8},          {"int32", DType::i32},         {"float8_e4m3fn", DType::e4m3},
      {"float8_e5m2", DType::e5m2},  {"float4_e2m1fn_x2", DType::e2m1x2}, {"int4x2", DType::i4x2},
  };
  for (DType d : kAllDTypes) {
    if (name == dtype_name(d)) return d;
  }
  for (const Alias& a : aliases) {
    if (name == a.name) return a.dtype;
  }
  std::string all;
  for (DType d : kAllDTypes) all += std::string(all.empty() ? "" : "/") + dtype_name(d);
  throw Error("lowbit.typed", "dtype", "expected one of " + all + ", got '" + name + "'");
}

TensorView Args::convert(nb::handle obj, const char* arg, bool writable) {
  std::optional<DType> want;
  nb::handle src = obj;
  if (nb::isinstance<Typed>(obj)) {
    const Typed& t = nb::cast<const Typed&>(obj);
    src = t.array;
    want = t.dtype;
  }
  if (writable) {
    nb::ndarray<> a;
    if (!nb::try_cast(src, a, false)) {
      nb::ndarray<nb::ro> probe;
      bool readonly = nb::try_cast(src, probe, false);
      throw Error(op_, arg,
                  readonly ? std::string("expected a writable array, got a read-only ") +
                                 nb::type_name(src.type()).c_str()
                           : std::string("expected an array (numpy, torch, cupy, jax or a DLPack "
                                         "capsule), got ") +
                                 nb::type_name(src.type()).c_str());
    }
    keep_rw_.push_back(a);
    return view_of(a, want, op_, arg);
  }
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(src, a, false)) {
    throw Error(op_, arg, std::string("expected an array (numpy, torch, cupy, jax or a DLPack "
                                      "capsule), got ") +
                              nb::type_name(src.type()).c_str());
  }
  keep_ro_.push_back(a);
  return view_of(a, want, op_, arg);
}

nb::object to_array(const TensorView& v, nb::handle owner) {
  using C = nb::dlpack::dtype_code;
  nb::dlpack::dtype dt;
  dt.lanes = 1;
  switch (v.dtype) {
    case DType::f32: dt.code = static_cast<uint8_t>(C::Float); dt.bits = 32; break;
    case DType::f16: dt.code = static_cast<uint8_t>(C::Float); dt.bits = 16; break;
    case DType::bf16: dt.code = static_cast<uint8_t>(C::UInt); dt.bits = 16; break;
    case DType::i8: dt.code = static_cast<uint8_t>(C::Int); dt.bits = 8; break;
    case DType::i32: dt.code = static_cast<uint8_t>(C::Int); dt.bits = 32; break;
    default: dt.code = static_cast<uint8_t>(C::UInt); dt.bits = 8; break;  // u8, fp8, packed
  }
  size_t shape[kMaxDims];
  int64_t stride[kMaxDims];
  int ndim = v.ndim;
  for (int i = 0; i < ndim; ++i) {
    shape[i] = static_cast<size_t>(v.shape[i]);
    stride[i] = v.stride[i];
  }
  if (dtype_is_packed(v.dtype) && ndim > 0) {
    shape[ndim - 1] = static_cast<size_t>((v.shape[ndim - 1] + 1) / 2);
    for (int i = 0; i + 1 < ndim; ++i) stride[i] /= 2;
  }
  int dev = v.device == Device::cuda ? nb::device::cuda::value : nb::device::cpu::value;
  if (v.device == Device::cpu) {
    return nb::ndarray<nb::numpy>(v.data, static_cast<size_t>(ndim), shape, owner, stride, dt,
                                  dev, v.device_index)
        .cast(nb::rv_policy::reference);
  }
  return nb::ndarray<>(v.data, static_cast<size_t>(ndim), shape, owner, stride, dt, dev,
                       v.device_index)
      .cast(nb::rv_policy::reference);
}

TensorView Args::in(nb::handle obj, const char* arg) { return convert(obj, arg, false); }
TensorView Args::out(nb::handle obj, const char* arg) { return convert(obj, arg, true); }
std::optional<TensorView> Args::in_opt(nb::handle obj, const char* arg) {
  if (obj.is_none()) return std::nullopt;
  return convert(obj, arg, false);
}
std::optional<TensorView> Args::out_opt(nb::handle obj, const char* arg) {
  if (obj.is_none()) return std::nullopt;
  return convert(obj, arg, true);
}

void bind_core(nb::module_& m) {
  // lowbit.Error: a ValueError carrying the library's message and its op / argument.
  g_error_type = PyErr_NewExceptionWithDoc(
      "lowbit.Error",
      "An error reported by the lowbit library: 'op: argument: expected ..., got ...'. "
      "Attributes: op, argument.",
      PyExc_ValueError, nullptr);
  m.attr("Error") = nb::handle(g_error_type);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::object exc = nb::steal(PyObject_CallFunction(g_error_type, "s", e.what()));
      if (!exc.is_valid()) return;  // the Python error of the failed call stays set
      exc.attr("op") = nb::str(e.op());
      exc.attr("argument") = nb::str(e.argument());
      PyErr_SetObject(g_error_type, exc.ptr());
    }
  });

  nb::enum_<DType> dtype(m, "DType", "lowbit element types");
  for (DType d : kAllDTypes) dtype.value(dtype_name(d), d);
  m.def("dtype_bits", &dtype_bits, nb::arg("dtype"), "Bits per element (4 for packed types).");
  m.def("dtype_is_packed", &dtype_is_packed, nb::arg("dtype"));
  m.def("parse_dtype", &parse_dtype, nb::arg("name"));

  nb::class_<Typed>(m, "Typed",
                    "An array whose storage is read as a lowbit dtype (see lowbit.typed).")
      .def("__init__",
           [](Typed* t, nb::object array, nb::handle dtype) {
             DType d = nb::isinstance<DType>(dtype)
                           ? nb::cast<DType>(dtype)
                           : parse_dtype(nb::cast<std::string>(nb::str(dtype)));
             if (nb::isinstance<Typed>(array)) array = nb::cast<const Typed&>(array).array;
             new (t) Typed{array, d};
           },
           nb::arg("array"), nb::arg("dtype"))
      .def_prop_ro("array", [](const Typed& t) { return t.array; })
      .def_prop_ro("dtype", [](const Typed& t) { return t.dtype; })
      .def("__repr__", [](const Typed& t) {
        return std::string("lowbit.typed(") + nb::repr(t.array).c_str() + ", '" +
               dtype_name(t.dtype) + "')";
      });

  m.def(
      "inspect",
      [](nb::handle x, bool writable) {
        Args args("lowbit.inspect");
        TensorView v = writable ? args.out(x, "x") : args.in(x, "x");
        nb::list shape, stride;
        for (int i = 0; i < v.ndim; ++i) {
          shape.append(v.shape[i]);
          stride.append(v.stride[i]);
        }
        nb::dict d;
        d["data"] = reinterpret_cast<uintptr_t>(v.data);
        d["dtype"] = dtype_name(v.dtype);
        d["shape"] = nb::tuple(shape);
        d["strides"] = nb::tuple(stride);
        d["device"] = device_name(v.device);
        d["device_index"] = v.device_index;
        d["describe"] = v.describe();
        return d;
      },
      nb::arg("x"), nb::arg("writable") = false,
      "The TensorView lowbit sees for an array-like: data pointer, dtype, shape, strides (in "
      "elements), device. No copy is made.");

  m.def(
      "convert",
      [](nb::handle src, nb::handle dst, uintptr_t stream, int threads) {
        Args args("convert");
        TensorView s = args.in(src, "src");
        TensorView d = args.out(dst, "dst");
        Context ctx = make_context(stream, threads);
        nb::gil_scoped_release release;
        lowbit::convert(s, d, ctx);
      },
      nb::arg("src"), nb::arg("dst"), nb::kw_only(), nb::arg("stream") = 0,
      nb::arg("threads") = 0,
      "dst = convert(src) element by element (any strides; see lowbit/core.h for the dtype "
      "pairs). Writes into dst in place.");

  m.def("version", &version_string);
  m.def("build_info", &build_info);
  m.def("built_with_cuda", &built_with_cuda);
  m.def("cuda_device_count", &cuda_device_count);
  m.def("cuda_unavailable_reason", &cuda_unavailable_reason);
  m.def(
      "cuda_device_info",
      [](int index) {
        DeviceInfo info = cuda_device_info(index);
        nb::dict d;
        d["name"] = info.name;
        d["sm"] = nb::make_tuple(info.sm_major, info.sm_minor);
        d["multiprocessors"] = info.multiprocessors;
        d["l2_bytes"] = info.l2_bytes;
        d["shared_bytes_per_block_optin"] = info.shared_bytes_per_block_optin;
        d["global_bytes"] = info.global_bytes;
        d["code_arch"] = info.code_arch;  // the device code lowbit runs there (runtime.h)
        d["code_sm90a"] = info.code_sm90a;
        return d;
      },
      nb::arg("index") = 0);
  m.def(
      "synchronize", [](uintptr_t stream) { lowbit::synchronize(make_context(stream, 0)); },
      nb::arg("stream") = 0);
}

}  // namespace py
}  // namespace lowbit
