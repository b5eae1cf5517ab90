// Front of the rotated quantized linear family (SPEC §3): qtype tables, the packed-weight layout
// (one table of parts drives allocation, loading, validation and serialization), argument
// validation, and device dispatch. Nothing here touches tensor memory before validation passes.
#include "lowbit/linear.h"

#include <cstring>
#include <string>
#include <vector>

#include "src/core/backends.h"
#include "src/core/check.h"
#include "src/core/linear_backend.h"

namespace lowbit {

// ---- qtypes -------------------------------------------------------------------------------------
namespace {

const char* const kQTypeNames[kNumQTypes] = {
    "convrot8",    "convrotint2", "convrotint3",   "convrotint4",      "convrotint5", "convrotint6",
    "convrotint7", "convrotint8", "convrotbitnet", "convrotcomfyw4a4", "convrot4",    "convrotfp8"};

bool has_ratios(QType q) {
  return (q >= QType::convrot_int2 && q <= QType::convrot_int7) || q == QType::convrot_bitnet;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

QType parse_qtype(const std::string& name) {
  for (int i = 0; i < kNumQTypes; ++i)
    if (name == kQTypeNames[i]) return static_cast<QType>(i);
  std::string all;
  for (int i = 0; i < kNumQTypes; ++i) all += (i ? ", " : "") + std::string(kQTypeNames[i]);
  check::fail("parse_qtype", "name", "expected one of " + all + ", got \"" + name + "\"");
}

const char* qtype_name(QType q) {
  int i = static_cast<int>(q);
  return (i >= 0 && i < kNumQTypes) ? kQTypeNames[i] : "invalid";
}

int qtype_bits(QType q) {
  switch (q) {
    case QType::convrot8:
      return 8;
    case QType::convrot_bitnet:
      return 2;
    case QType::convrot_comfy_w4a4:
      return 4;
    case QType::convrot4:
      return 4;
    case QType::convrot_fp8:
      return 8;
    default:
      return 2 + (static_cast<int>(q) - static_cast<int>(QType::convrot_int2));
  }
}

int64_t qtype_group(QType q, int64_t in_features) {
  if (q == QType::convrot4) return 16;
  if (has_ratios(q)) {
    int64_t g = 128;
    while (g > 1 && in_features % g != 0) g /= 2;
    return g;
  }
  return in_features;
}

int rotation_block(int64_t in_features) {
  if (in_features <= 0) return 1;
  int64_t h = 1;
  while (h < 256 && in_features % (h * 4) == 0) h *= 4;
  return static_cast<int>(h);
}

bool can_quantize(QType q, int64_t out_features, int64_t in_features, std::string* why_not) {
  auto no = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return false;
  };
  if (static_cast<unsigned>(q) >= kNumQTypes) return no("invalid qtype");
  const std::string shape = " (out_features " + std::to_string(out_features) + ", in_features " +
                            std::to_string(in_features) + ")";
  if (out_features <= 0 || in_features <= 0) return no("empty layer" + shape);
  // Far past any model's layer; keeps O x K and every part's byte count well inside int64, so a
  // shape read from an untrusted file can neither overflow a size nor ask for absurd memory.
  if (out_features > kMaxLayerDim || in_features > kMaxLayerDim ||
      out_features > kMaxLayerWeights / in_features)
    return no("layer too large: at most 2^31 - 1 features each way and 2^40 weights" + shape);
  if (in_features % 16 != 0) return no("in_features must be a multiple of 16" + shape);
  if (q == QType::convrot4) {
    if (out_features % 16 != 0) return no("NVFP4 needs out_features a multiple of 16" + shape);
  } else if (out_features % 8 != 0) {
    return no("out_features must be a multiple of 8" + shape);
  }
  if (rotation_block(in_features) < 16)
    return no("the largest power-of-4 block dividing in_features is below 16" + shape);
  if (q == QType::convrot_comfy_w4a4 && in_features % 256 != 0)
    return no("comfy W4A4 needs in_features a multiple of 256" + shape);
  if (why_not) why_not->clear();
  return true;
}

// ---- the packed layout: one table of parts ------------------------------------------------------
namespace {

struct Part {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t bytes() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return dtype_storage_bytes(dtype, n);
  }
};

std::vector<Part> packed_parts(QType q, int64_t O, int64_t K) {
  std::vector<Part> parts;
  const int bits = qtype_bits(q);
  switch (q) {
    case QType::convrot8:
      parts.push_back({"codes", DType::i8, {O, K}});
      break;
    case QType::convrot_bitnet:
      parts.push_back({"codes", DType::u8, {O, ceil_div(K, 5)}});
      break;
    case QType::convrot_comfy_w4a4:
      parts.push_back({"codes", DType::i8, {O, K / 2}});
      break;
    case QType::convrot4:
      parts.push_back({"codes", DType::u8, {O, K / 2}});
      break;
    case QType::convrot_fp8:
      parts.push_back({"codes", DType::e4m3, {O, K}});
      break;
    default:
      parts.push_back({"codes", DType::u8, {O, K / 8 * bits}});
      break;
  }
  if (q == QType::convrot4) {
    parts.push_back({"block_scales", DType::e4m3, {O, K / 16}});
    parts.push_back(
        {"block_scales_swizzled", DType::e4m3, {ceil_div(O, 128) * 128 * ceil_div(K / 16, 4) * 4}});
    parts.push_back({"tensor_scale", DType::f32, {1}});
  } else {
    parts.push_back({"scales", DType::f32, {O}});
    if (has_ratios(q)) parts.push_back({"ratios", DType::f32, {O, K / qtype_group(q, K)}});
  }
  return parts;
}

// Each stored part once: its name, its bytes in PackedWeight and its view in PackedWeightView.
struct PartMember {
  const char* name;
  std::vector<uint8_t> PackedWeight::*storage;
  TensorView PackedWeightView::*view;
};
constexpr PartMember kPartMembers[] = {
    {"codes", &PackedWeight::codes, &PackedWeightView::codes},
    {"scales", &PackedWeight::scales, &PackedWeightView::scales},
    {"ratios", &PackedWeight::ratios, &PackedWeightView::ratios},
    {"block_scales", &PackedWeight::block_scales, &PackedWeightView::block_scales},
    {"block_scales_swizzled", &PackedWeight::block_scales_swizzled,
     &PackedWeightView::block_scales_swizzled},
    {"tensor_scale", &PackedWeight::tensor_scale, &PackedWeightView::tensor_scale},
};

const PartMember* part_member(const std::string& name) {
  for (const PartMember& m : kPartMembers)
    if (name == m.name) return &m;
  return nullptr;
}

std::vector<uint8_t>* part_storage(PackedWeight& w, const std::string& name) {
  const PartMember* m = part_member(name);
  return m ? &(w.*(m->storage)) : nullptr;
}

TensorView* part_view(PackedWeightView& v, const std::string& name) {
  const PartMember* m = part_member(name);
  return m ? &(v.*(m->view)) : nullptr;
}

TensorView view_of(void* data, const Part& p, Device dev, int device_index) {
  return make_view(data, p.dtype, static_cast<int>(p.shape.size()), p.shape.data(), dev,
                   device_index);
}

void check_quantizable(const char* op, QType q, int64_t O, int64_t K) {
  std::string why;
  if (!can_quantize(q, O, K, &why))
    check::fail(op, "qtype", std::string(qtype_name(q)) + " cannot quantize this layer: " + why);
}

// A PackedWeightView must carry every part of its qtype, with the table's dtype and shape, on
// one device.
void check_packed_view(const char* op, const PackedWeightView& w) {
  check_quantizable(op, w.qtype, w.out_features, w.in_features);
  LOWBIT_CHECK(w.rot == rotation_block(w.in_features), op, "w.rot",
               check::expected_got(rotation_block(w.in_features), w.rot));
  LOWBIT_CHECK(w.bits == qtype_bits(w.qtype), op, "w.bits",
               check::expected_got(qtype_bits(w.qtype), w.bits));
  LOWBIT_CHECK(w.group == qtype_group(w.qtype, w.in_features), op, "w.group",
               check::expected_got(qtype_group(w.qtype, w.in_features), w.group));
  PackedWeightView copy = w;
  for (const Part& p : packed_parts(w.qtype, w.out_features, w.in_features)) {
    const TensorView& t = *part_view(copy, p.name);
    std::string arg = std::string("w.") + p.name;
    LOWBIT_CHECK(t.data != nullptr, op, arg.c_str(), "expected a tensor, got none");
    check::dtype(op, arg.c_str(), t, {p.dtype});
    check::ndim(op, arg.c_str(), t, static_cast<int>(p.shape.size()));
    for (size_t d = 0; d < p.shape.size(); ++d) check::dim(op, arg.c_str(), t, d, p.shape[d]);
    check::contiguous(op, arg.c_str(), t);
    check::same_device(op, arg.c_str(), t, "w.codes", w.codes);
  }
}

}  // namespace

std::vector<std::pair<std::string, TensorView>> packed_weight_parts(QType q, int64_t out_features,
                                                                    int64_t in_features) {
  check_quantizable("packed_weight_parts", q, out_features, in_features);
  std::vector<std::pair<std::string, TensorView>> out;
  for (const Part& p : packed_parts(q, out_features, in_features))
    out.emplace_back(p.name, view_of(nullptr, p, Device::cpu, 0));
  return out;
}

PackedWeight make_packed_weight(QType q, int64_t out_features, int64_t in_features) {
  check_quantizable("make_packed_weight", q, out_features, in_features);
  PackedWeight w;
  w.qtype_ = q;
  w.out_features_ = out_features;
  w.in_features_ = in_features;
  w.rot_ = rotation_block(in_features);
  w.bits_ = qtype_bits(q);
  w.group_ = qtype_group(q, in_features);
  for (const Part& p : packed_parts(q, out_features, in_features))
    part_storage(w, p.name)->assign(static_cast<size_t>(p.bytes()), 0);
  return w;
}

PackedWeight::PackedWeight(QType q, int64_t out_features, int64_t in_features,
                           const std::vector<std::pair<std::string, TensorView>>& tensors, int rot,
                           int64_t group) {
  const char* op = "PackedWeight";
  check_quantizable(op, q, out_features, in_features);
  if (rot != 0)
    LOWBIT_CHECK(rot == rotation_block(in_features), op, "rot",
                 check::expected_got(rotation_block(in_features), rot));
  if (group != 0)
    LOWBIT_CHECK(group == qtype_group(q, in_features), op, "group",
                 check::expected_got(qtype_group(q, in_features), group));
  const std::vector<Part> parts = packed_parts(q, out_features, in_features);
  for (const auto& nt : tensors) {
    bool known = false;
    for (const Part& p : parts) known = known || nt.first == p.name;
    LOWBIT_CHECK(known, op, nt.first.c_str(),
                 std::string("expected a part of ") + qtype_name(q) + ", got an unknown name");
  }
  for (const Part& p : parts) {
    const TensorView* t = nullptr;
    for (const auto& nt : tensors)
      if (nt.first == p.name) t = &nt.second;
    LOWBIT_CHECK(t != nullptr, op, p.name, "expected this part, got none");
    check::not_null(op, p.name, *t);
    check::device(op, p.name, *t, Device::cpu);
    check::dtype(op, p.name, *t, {p.dtype});
    // Shape: the table's, or the same number of elements flattened (a file may store 1-D).
    int64_t n = 1, want = 1;
    for (int64_t s : p.shape) want *= s;
    n = t->numel();
    LOWBIT_CHECK(
        n == want, op, p.name,
        "element count: " + check::expected_got(want, n) + " (shape " + t->describe() + ")");
    check::contiguous(op, p.name, *t);
  }
  *this = make_packed_weight(q, out_features, in_features);
  for (const Part& p : parts) {
    const TensorView* t = nullptr;
    for (const auto& nt : tensors)
      if (nt.first == p.name) t = &nt.second;
    std::vector<uint8_t>& dst = *part_storage(*this, p.name);
    std::memcpy(dst.data(), t->data, dst.size());
  }
}

int64_t PackedWeight::storage_bytes() const {
  return static_cast<int64_t>(codes.size() + scales.size() + ratios.size() + block_scales.size() +
                              block_scales_swizzled.size() + tensor_scale.size());
}

std::vector<std::pair<std::string, TensorView>> PackedWeight::tensors() const {
  std::vector<std::pair<std::string, TensorView>> out;
  if (codes.empty()) return out;
  PackedWeight& self = const_cast<PackedWeight&>(*this);
  for (const Part& p : packed_parts(qtype_, out_features_, in_features_))
    out.emplace_back(p.name, view_of(part_storage(self, p.name)->data(), p, Device::cpu, 0));
  return out;
}

PackedWeightView PackedWeight::view() const {
  PackedWeightView v;
  v.qtype = qtype_;
  v.out_features = out_features_;
  v.in_features = in_features_;
  v.rot = rot_;
  v.bits = bits_;
  v.group = group_;
  for (auto& nt : tensors()) *part_view(v, nt.first) = nt.second;
  return v;
}

// ---- ops ----------------------------------------------------------------------------------------
namespace {

// Flattens (..., K) into (R, K) rows when the leading dimensions collapse into one stride.
TensorView as_rows(const char* op, const char* arg, const TensorView& t) {
  LOWBIT_CHECK(t.ndim >= 1, op, arg, "rank: expected at least 1, got 0");
  TensorView r = t;
  if (t.ndim == 1) {
    r.ndim = 2;
    r.shape[0] = 1;
    r.shape[1] = t.shape[0];
    r.stride[0] = t.shape[0];
    r.stride[1] = t.stride[0];
    return r;
  }
  int64_t rows = 1;
  for (int d = 0; d < t.ndim - 1; ++d) rows *= t.shape[d];
  for (int d = 0; d + 2 < t.ndim; ++d)
    LOWBIT_CHECK(t.shape[d + 1] == 1 || t.stride[d] == t.stride[d + 1] * t.shape[d + 1], op, arg,
                 "expected leading dimensions that flatten into rows, got " + t.describe());
  r.ndim = 2;
  r.shape[0] = rows;
  r.shape[1] = t.shape[t.ndim - 1];
  r.stride[0] = t.ndim >= 2 ? t.stride[t.ndim - 2] : t.shape[t.ndim - 1];
  r.stride[1] = t.stride[t.ndim - 1];
  return r;
}

void check_float_input(const char* op, const char* arg, const TensorView& t) {
  check::not_null(op, arg, t);
  check::dtype(op, arg, t, {DType::f32, DType::bf16, DType::f16});
  check::inner_contiguous(op, arg, t);
}

void check_rot(const char* op, int rot, int64_t K) {
  LOWBIT_CHECK(rot == 16 || rot == 64 || rot == 256, op, "block",
               "expected one of {16, 64, 256}, got " + std::to_string(rot));
  LOWBIT_CHECK(K % rot == 0, op, "block",
               "expected a divisor of the last dimension " + std::to_string(K) + ", got " +
                   std::to_string(rot));
}

}  // namespace

void hadamard_rotate(const TensorView& x, int block, TensorView out, Context& ctx) {
  const char* op = "hadamard_rotate";
  check_float_input(op, "x", x);
  check_float_input(op, "out", out);
  check::same_shape(op, "out", out, "x", x);
  check::same_device(op, "out", out, "x", x);
  TensorView xr = as_rows(op, "x", x), orr = as_rows(op, "out", out);
  check_rot(op, block, xr.shape[1]);
  if (out.data == x.data) {
    bool same = out.dtype == x.dtype && xr.stride[0] == orr.stride[0];
    LOWBIT_CHECK(same, op, "out",
                 "in place: expected x's dtype and strides, got " + out.describe());
  }
  if (xr.shape[0] == 0) return;
  if (x.device == Device::cpu) {
    cpu::hadamard_rotate(xr, block, orr, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::hadamard_rotate(xr, block, orr, ctx));
  }
}

void rotate_quantize_activations(const TensorView& x, QType q, int rot, TensorView codes,
                                 TensorView scales, Context& ctx) {
  const char* op = "rotate_quantize_activations";
  check_float_input(op, "x", x);
  check::ndim(op, "x", x, 2);
  const int64_t M = x.shape[0], K = x.shape[1];
  LOWBIT_CHECK(static_cast<unsigned>(q) < kNumQTypes, op, "qtype", "expected a valid qtype");
  check_rot(op, rot, K);
  if (q == QType::convrot4)
    LOWBIT_CHECK(K % 16 == 0, op, "x", "NVFP4: expected K a multiple of 16, got " + x.describe());
  check::not_null(op, "codes", codes);
  check::not_null(op, "scales", scales);
  DType code_dt = q == QType::convrot_fp8 ? DType::e4m3
                  : q == QType::convrot4  ? DType::e2m1x2
                                          : DType::i8;
  check::dtype(op, "codes", codes, {code_dt});
  check::ndim(op, "codes", codes, 2);
  check::dim(op, "codes", codes, 0, M);
  check::dim(op, "codes", codes, 1, K);
  check::inner_contiguous(op, "codes", codes);
  if (code_dt == DType::e2m1x2)
    LOWBIT_CHECK(codes.stride[0] % 2 == 0, op, "codes", "expected an even row stride");
  if (q == QType::convrot4) {
    check::dtype(op, "scales", scales, {DType::e4m3});
    check::ndim(op, "scales", scales, 2);
    check::dim(op, "scales", scales, 0, M);
    check::dim(op, "scales", scales, 1, K / 16);
    check::inner_contiguous(op, "scales", scales);
  } else {
    check::dtype(op, "scales", scales, {DType::f32});
    check::ndim(op, "scales", scales, 1);
    check::dim(op, "scales", scales, 0, M);
  }
  check::same_device(op, "codes", codes, "x", x);
  check::same_device(op, "scales", scales, "x", x);
  if (M == 0) return;
  if (x.device == Device::cpu) {
    cpu::rotate_quantize_activations(x, q, rot, codes, scales, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::rotate_quantize_activations(x, q, rot, codes, scales, ctx));
  }
}

PackedWeight quantize_weight(const TensorView& w, QType q, Context& ctx) {
  const char* op = "quantize_weight";
  check_float_input(op, "w", w);
  check::ndim(op, "w", w, 2);
  check::device(op, "w", w, Device::cpu);
  check_quantizable(op, q, w.shape[0], w.shape[1]);
  PackedWeight p = make_packed_weight(q, w.shape[0], w.shape[1]);
  cpu::quantize_weight(w, p, ctx);
  return p;
}

void dequantize_weight(const PackedWeightView& w, TensorView out, bool rotated_basis,
                       Context& ctx) {
  const char* op = "dequantize_weight";
  check_packed_view(op, w);
  check::not_null(op, "out", out);
  check::dtype(op, "out", out, {DType::f32});
  check::ndim(op, "out", out, 2);
  check::dim(op, "out", out, 0, w.out_features);
  check::dim(op, "out", out, 1, w.in_features);
  check::inner_contiguous(op, "out", out);
  check::same_device(op, "out", out, "w.codes", w.codes);
  if (out.device == Device::cpu) {
    cpu::dequantize_weight(w, out, rotated_basis, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::dequantize_weight(w, out, rotated_basis, ctx));
  }
}

void dequantize_weight(const PackedWeight& w, TensorView out, bool rotated_basis, Context& ctx) {
  LOWBIT_CHECK(!w.codes.empty(), "dequantize_weight", "w",
               "expected a packed weight, got an empty one");
  dequantize_weight(w.view(), out, rotated_basis, ctx);
}

void requantize_weight(PackedWeightView& w, const TensorView& weight, bool stochastic,
                       uint64_t seed, Context& ctx) {
  const char* op = "requantize_weight";
  check_packed_view(op, w);
  check_float_input(op, "weight", weight);
  check::ndim(op, "weight", weight, 2);
  check::dim(op, "weight", weight, 0, w.out_features);
  check::dim(op, "weight", weight, 1, w.in_features);
  check::same_device(op, "weight", weight, "w.codes", w.codes);
  if (weight.device == Device::cpu) {
    cpu::requantize_weight(w, weight, stochastic, seed, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::requantize_weight(w, weight, stochastic, seed, ctx));
  }
}

// ---- QuantizedLinear ----------------------------------------------------------------------------

QuantizedLinear QuantizedLinear::from_packed(const PackedWeight& w, Device device, Context& ctx) {
  const char* op = "QuantizedLinear::from_packed";
  LOWBIT_CHECK(!w.codes.empty(), op, "w", "expected a packed weight, got an empty one");
  QuantizedLinear l;
  l.device_ = device;
  l.view_ = w.view();
  PackedWeight& src = const_cast<PackedWeight&>(w);
  for (const Part& p : packed_parts(w.qtype(), w.out_features(), w.in_features())) {
    const std::vector<uint8_t>& bytes = *part_storage(src, p.name);
    Buffer b(device, bytes.size());
    if (device == Device::cpu) {
      std::memcpy(b.data(), bytes.data(), bytes.size());
    } else {
      copy_to_device(b.data(), bytes.data(), bytes.size(), ctx);
    }
    *part_view(l.view_, p.name) = view_of(b.data(), p, device, 0);
    l.storage_.push_back(std::move(b));
  }
  l.build_decode_tiles(ctx);
  if (device != Device::cpu) synchronize(ctx);  // the host bytes may go away after we return
  return l;
}

void QuantizedLinear::build_decode_tiles(Context& ctx) {
  view_.decode_tiles = TensorView{};
  decode_tiles_ = Buffer();
  if (device_ == Device::cpu) {
    const int64_t bytes = cpu::decode_tiles_bytes(view_);
    if (bytes <= 0) return;
    Buffer b(device_, static_cast<size_t>(bytes));
    cpu::build_decode_tiles(view_, b.data(), ctx);
    const int64_t shape[1] = {bytes};
    view_.decode_tiles = make_view(b.data(), DType::u8, 1, shape, device_, 0);
    decode_tiles_ = std::move(b);
    return;
  }
#ifdef LOWBIT_WITH_CUDA
  const int64_t bytes = cuda::decode_tiles_bytes(view_);
  if (bytes <= 0) return;
  Buffer b(device_, static_cast<size_t>(bytes));
  // A weight whose values the layout cannot carry keeps the packed-code decode kernels.
  if (!cuda::build_decode_tiles(view_, b.data(), ctx)) return;
  const int64_t shape[1] = {bytes};
  view_.decode_tiles = make_view(b.data(), DType::u8, 1, shape, device_, 0);
  decode_tiles_ = std::move(b);
#else
  (void)ctx;
#endif
}

QuantizedLinear QuantizedLinear::quantize(const TensorView& weight, QType q, Context& ctx) {
  const char* op = "QuantizedLinear::quantize";
  check_float_input(op, "weight", weight);
  check::ndim(op, "weight", weight, 2);
  check_quantizable(op, q, weight.shape[0], weight.shape[1]);
  if (weight.device == Device::cpu)
    return from_packed(quantize_weight(weight, q, ctx), Device::cpu, ctx);
  // A CUDA weight: quantized on the host (the oracle's bits), then uploaded.
  const int64_t O = weight.shape[0], K = weight.shape[1];
  const int esz = dtype_bits(weight.dtype) / 8;
  std::vector<uint8_t> host(static_cast<size_t>(O * K * esz));
  for (int64_t r = 0; r < O; ++r)
    copy_to_host(host.data() + r * K * esz,
                 static_cast<const uint8_t*>(weight.data) + r * weight.stride[0] * esz,
                 static_cast<size_t>(K * esz), ctx);
  synchronize(ctx);
  TensorView hv = make_view(host.data(), weight.dtype, {O, K});
  return from_packed(quantize_weight(hv, q, ctx), weight.device, ctx);
}

PackedWeight QuantizedLinear::to_packed(Context& ctx) const {
  LOWBIT_CHECK(!empty(), "QuantizedLinear::to_packed", "this",
               "expected a quantized layer, got an empty one");
  PackedWeight w = make_packed_weight(view_.qtype, view_.out_features, view_.in_features);
  PackedWeightView v = view_;
  for (const Part& p : packed_parts(view_.qtype, view_.out_features, view_.in_features)) {
    std::vector<uint8_t>& dst = *part_storage(w, p.name);
    const TensorView& src = *part_view(v, p.name);
    if (device_ == Device::cpu) {
      std::memcpy(dst.data(), src.data, dst.size());
    } else {
      copy_to_host(dst.data(), src.data, dst.size(), ctx);
    }
  }
  if (device_ != Device::cpu) synchronize(ctx);
  return w;
}

void QuantizedLinear::forward(const TensorView& x, const TensorView* bias, TensorView out,
                              Context& ctx) const {
  const char* op = "QuantizedLinear::forward";
  LOWBIT_CHECK(!empty(), op, "this", "expected a quantized layer, got an empty one");
  check_float_input(op, "x", x);
  check::ndim(op, "x", x, 2);
  check::dim(op, "x", x, 1, view_.in_features);
  check::device(op, "x", x, device_);
  if (device_ != Device::cpu) check::dtype(op, "x", x, {DType::bf16, DType::f16});
  check::not_null(op, "out", out);
  check::dtype(op, "out", out, {x.dtype});
  check::ndim(op, "out", out, 2);
  check::dim(op, "out", out, 0, x.shape[0]);
  check::dim(op, "out", out, 1, view_.out_features);
  check::inner_contiguous(op, "out", out);
  check::device(op, "out", out, device_);
  if (bias) {
    check::not_null(op, "bias", *bias);
    check::dtype(op, "bias", *bias, {DType::f32, x.dtype});
    check::ndim(op, "bias", *bias, 1);
    check::dim(op, "bias", *bias, 0, view_.out_features);
    check::inner_contiguous(op, "bias", *bias);
    check::device(op, "bias", *bias, device_);
  }
  if (x.shape[0] == 0) return;
  if (device_ == Device::cpu) {
    cpu::quantized_linear_forward(view_, x, bias, out, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::quantized_linear_forward(view_, x, bias, out, ctx));
  }
}

void QuantizedLinear::backward_input(const TensorView& grad_out, TensorView grad_x,
                                     Context& ctx) const {
  const char* op = "QuantizedLinear::backward_input";
  LOWBIT_CHECK(!empty(), op, "this", "expected a quantized layer, got an empty one");
  check_float_input(op, "grad_out", grad_out);
  check::ndim(op, "grad_out", grad_out, 2);
  check::dim(op, "grad_out", grad_out, 1, view_.out_features);
  check::device(op, "grad_out", grad_out, device_);
  check_float_input(op, "grad_x", grad_x);
  check::ndim(op, "grad_x", grad_x, 2);
  check::dim(op, "grad_x", grad_x, 0, grad_out.shape[0]);
  check::dim(op, "grad_x", grad_x, 1, view_.in_features);
  check::device(op, "grad_x", grad_x, device_);
  if (grad_out.shape[0] == 0) return;
  if (device_ == Device::cpu) {
    cpu::quantized_linear_backward_input(view_, grad_out, grad_x, ctx);
  } else {
    LOWBIT_CUDA_CALL(op, cuda::quantized_linear_backward_input(view_, grad_out, grad_x, ctx));
  }
}

void QuantizedLinear::requantize(const TensorView& weight, bool stochastic, uint64_t seed,
                                 Context& ctx) {
  LOWBIT_CHECK(!empty(), "QuantizedLinear::requantize", "this",
               "expected a quantized layer, got an empty one");
  requantize_weight(view_, weight, stochastic, seed, ctx);
  if (view_.decode_tiles.data) build_decode_tiles(ctx);  // derived from the rewritten codes
}

void QuantizedLinear::dequantize(TensorView out, Context& ctx) const {
  LOWBIT_CHECK(!empty(), "QuantizedLinear::dequantize", "this",
               "expected a quantized layer, got an empty one");
  dequantize_weight(view_, out, false, ctx);
}

}  // namespace lowbit
