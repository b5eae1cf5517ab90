// The model quantizer: streams a safetensors checkpoint, quantizing its linear weights
// (SPEC §3.6). Also the loader of quantized layers. docs/checkpoint-format.md gives the formats.
#include "lowbit/checkpoint.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "lowbit/core.h"
#include "src/core/check.h"

namespace lowbit {

namespace {

constexpr const char* kOp = "quantize_checkpoint";
constexpr uint64_t kCopyChunk = 16ull << 20;  // copied tensors stream in 16 MiB pieces

// The ComfyUI marker bytes, exactly as SPEC §3.6 writes them.
constexpr const char* kComfyMarker = R"({"format":"convrot_w4a4","convrot_groupsize":256})";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_weight_name(const std::string& n) { return n == "weight" || ends_with(n, ".weight"); }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const std::string* first_match(const std::vector<std::string>& globs, const std::string& name) {
  for (const auto& g : globs)
    if (fnmatch(g.c_str(), name.c_str(), 0) == 0) return &g;
  return nullptr;
}

// Name of a packed part in the output file: "codes" -> {p}weight, "scales" -> {p}weight_scale,
// others -> {p}weight_<part>.
std::string part_name(const std::string& prefix, const std::string& part) {
  if (part == "codes") return prefix + "weight";
  if (part == "scales") return prefix + "weight_scale";
  return prefix + "weight_" + part;
}

// File dtype and shape of a packed part (packed 4-bit views are stored as U8 bytes).
TensorSpec part_spec(const std::string& name, const TensorView& v, bool comfy) {
  TensorSpec s;
  s.name = name;
  s.dtype = dtype_to_file_dtype(v.dtype);
  for (int d = 0; d < v.ndim; ++d) s.shape.push_back(v.shape[d]);
  if (dtype_is_packed(v.dtype) && !s.shape.empty()) s.shape.back() = (s.shape.back() + 1) / 2;
  if (comfy && ends_with(name, "weight")) s.dtype = FileDType::i8;  // comfy: int8 nibble pairs
  return s;
}

struct Plan {
  enum Kind { copy, quantize } kind = copy;
  const TensorInfo* in = nullptr;
  std::string prefix;               // quantize: the layer prefix
  std::vector<TensorSpec> outputs;  // what this input becomes, in order
  size_t report = SIZE_MAX;         // index into report.layers
};

// Aligned fp32 copy of a 2-D tensor of the file (any of f32/bf16/f16), via lowbit::convert.
std::vector<float> to_f32(const SafetensorsReader& r, const TensorInfo& t, Context& ctx) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  DType dt;
  file_dtype_to_dtype(t.dtype, &dt);
  const int esize = file_dtype_size(t.dtype);
  const uint8_t* p = r.data(t);
  std::vector<uint8_t> staged;
  if (reinterpret_cast<uintptr_t>(p) % esize != 0) {  // unaligned in the mapping: stage a copy
    staged.assign(p, p + t.nbytes());
    p = staged.data();
  }
  if (dt == DType::f32) {
    std::memcpy(out.data(), p, t.nbytes());
  } else {
    TensorView src = make_view(const_cast<uint8_t*>(p), dt, {t.shape[0], t.shape[1]});
    TensorView dst = make_view(out.data(), DType::f32, {t.shape[0], t.shape[1]});
    convert(src, dst, ctx);
  }
  return out;
}

}  // namespace

std::string lowbit_marker_json(const PackedWeight& pw, FileDType source) {
  nlohmann::ordered_json j;
  j["qtype"] = qtype_name(pw.qtype());
  j["rot"] = pw.rot();
  j["bits"] = pw.bits();
  j["group"] = pw.group();
  j["out_features"] = pw.out_features();
  j["in_features"] = pw.in_features();
  j["source_dtype"] = file_dtype_name(source);
  j["version"] = 1;
  return j.dump();
}

size_t QuantizeReport::quantized() const {
  return static_cast<size_t>(std::count_if(layers.begin(), layers.end(),
                                           [](const LayerReport& l) { return l.quantized; }));
}
size_t QuantizeReport::skipped() const { return layers.size() - quantized(); }

PackedWeight load_quantized_layer(const SafetensorsReader& file, const LayerMarker& m) {
  const char* op = "load_quantized_layer";
  auto need = [&](const std::string& name) -> const TensorInfo& {
    const TensorInfo* t = file.find(name);
    if (!t)
      check::fail(op, file.path().c_str(),
                  "layer '" + m.prefix + "': tensor '" + name + "' is missing");
    return *t;
  };
  auto host_view = [&](const TensorInfo& t, std::vector<std::vector<uint8_t>>& keep) {
    // Aligned copy (the loader copies again; layers are small next to a model).
    keep.emplace_back(file.data(t), file.data(t) + t.nbytes());
    DType dt;
    if (!file_dtype_to_dtype(t.dtype, &dt))
      check::fail(op, file.path().c_str(),
                  "tensor '" + t.name + "': dtype " + file_dtype_name(t.dtype) + " is not a part");
    return make_view(keep.back().data(), dt, static_cast<int>(t.shape.size()), t.shape.data());
  };
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(8);
  std::vector<std::pair<std::string, TensorView>> parts;
  if (m.format == "comfy") {
    LOWBIT_CHECK(m.qtype == "convrotcomfyw4a4", op, file.path().c_str(),
                 "layer '" + m.prefix + "': comfy format '" + m.qtype + "' is not convrot_w4a4");
    const TensorInfo& w = need(m.prefix + "weight");
    const TensorInfo& s = need(m.prefix + "weight_scale");
    LOWBIT_CHECK(w.shape.size() == 2, op, file.path().c_str(),
                 "tensor '" + w.name + "': rank " + check::expected_got(2, w.shape.size()));
    parts.emplace_back("codes", host_view(w, keep));
    parts.emplace_back("scales", host_view(s, keep));
    return PackedWeight(QType::convrot_comfy_w4a4, w.shape[0], w.shape[1] * 2, parts, m.rot, 0);
  }
  nlohmann::json j = nlohmann::json::parse(m.json, nullptr, false);
  auto get_int = [&](const char* key) -> int64_t {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer())
      check::fail(op, file.path().c_str(),
                  "layer '" + m.prefix + "': marker has no integer \"" + key + "\"");
    return it->get<int64_t>();
  };
  QType q = parse_qtype(m.qtype);
  int64_t o = get_int("out_features"), k = get_int("in_features");
  PackedWeight shape_of = make_packed_weight(q, o, k);
  for (const auto& p : shape_of.tensors()) {
    const TensorInfo& t = need(part_name(m.prefix, p.first));
    parts.emplace_back(p.first, host_view(t, keep));
    // Stored packed parts are U8 bytes; hand them back in the part's own dtype and shape.
    TensorView& v = parts.back().second;
    if (dtype_is_packed(p.second.dtype) || v.dtype != p.second.dtype) {
      LOWBIT_CHECK(
          static_cast<int64_t>(t.nbytes()) == dtype_storage_bytes(p.second.dtype, p.second.numel()),
          op, file.path().c_str(),
          "tensor '" + t.name + "': " +
              check::expected_got(dtype_storage_bytes(p.second.dtype, p.second.numel()),
                                  static_cast<int64_t>(t.nbytes())) +
              " bytes");
      v = make_view(v.data, p.second.dtype, p.second.ndim, p.second.shape);
    }
  }
  return PackedWeight(q, o, k, parts, m.rot, m.group);
}

QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out, QType qtype,
                                   const QuantizeOptions& opt, Context& ctx) {
  LOWBIT_CHECK(!out.empty(), kOp, "out", "expected an output path, got an empty string");
  LOWBIT_CHECK(!same_file(in, out) && in != out, kOp, "out",
               "'" + out + "' is the input file; lowbit never overwrites its input");
  const bool comfy = opt.format == CheckpointFormat::comfy;
  LOWBIT_CHECK(
      !comfy || qtype == QType::convrot_comfy_w4a4, kOp, "format",
      std::string("--format comfy stores convrotcomfyw4a4 only, got qtype ") + qtype_name(qtype));

  SafetensorsReader reader(in);
  QuantizeReport report;
  report.tensors_in = reader.tensors().size();
  report.file_bytes_in = reader.file_bytes();

  // Layers already quantized in the input keep every tensor as it is.
  std::set<std::string> quantized_prefixes;
  for (const LayerMarker& m : find_layer_markers(reader)) quantized_prefixes.insert(m.prefix);
  std::unordered_set<std::string> input_names;
  for (const TensorInfo& t : reader.tensors()) input_names.insert(t.name);

  // ---- plan: what each input tensor becomes (shapes are known before any quantization) ----
  std::vector<Plan> plans;
  for (const TensorInfo& t : reader.tensors()) {
    Plan p;
    p.in = &t;
    report.data_bytes_in += t.nbytes();
    if (!is_weight_name(t.name) || t.shape.size() != 2) {
      p.outputs.push_back({t.name, t.dtype, t.shape});
      plans.push_back(std::move(p));
      continue;
    }
    LayerReport lr;
    lr.name = t.name;
    lr.shape = t.shape;
    lr.source_dtype = file_dtype_name(t.dtype);
    lr.bytes_before = t.nbytes();
    const std::string prefix = t.name.substr(0, t.name.size() - 6);
    const int64_t o = t.shape[0], k = t.shape[1];
    std::string why;
    const std::string* g = nullptr;
    if (quantized_prefixes.count(prefix)) {
      why = "already quantized (the file has a marker for it)";
    } else if ((g = first_match(opt.filter.exclude, t.name))) {
      why = "excluded by --exclude '" + *g + "'";
    } else if (!opt.filter.include.empty() && !first_match(opt.filter.include, t.name)) {
      why = "not matched by --include";
    } else if (lower(t.name).find("embed") != std::string::npos) {
      why = "embedding (name contains 'embed')";
    } else if (t.dtype != FileDType::f32 && t.dtype != FileDType::bf16 &&
               t.dtype != FileDType::f16) {
      why = std::string("dtype ") + file_dtype_name(t.dtype) + " (quantizes F32/BF16/F16)";
    } else if (!can_quantize(qtype, o, k, &why)) {
      if (why.empty()) why = "can_quantize refused";
    }
    if (why.empty()) {
      PackedWeight shape_of = make_packed_weight(qtype, o, k);
      std::vector<TensorSpec> outs;
      if (comfy) {
        for (const auto& part : shape_of.tensors()) {
          if (part.first == "codes")
            outs.push_back(part_spec(prefix + "weight", part.second, true));
          if (part.first == "scales")
            outs.push_back(part_spec(prefix + "weight_scale", part.second, true));
        }
        outs.push_back({prefix + "comfy_quant",
                        FileDType::u8,
                        {static_cast<int64_t>(std::strlen(kComfyMarker))}});
      } else {
        for (const auto& part : shape_of.tensors())
          outs.push_back(part_spec(part_name(prefix, part.first), part.second, false));
        std::string mj = lowbit_marker_json(shape_of, t.dtype);
        outs.push_back({prefix + "lowbit_quant", FileDType::u8, {static_cast<int64_t>(mj.size())}});
      }
      for (const TensorSpec& s : outs) {
        if (s.name != t.name && input_names.count(s.name))
          why = "output tensor '" + s.name + "' already exists in the input";
      }
      if (why.empty()) {
        p.kind = Plan::quantize;
        p.prefix = prefix;
        p.outputs = std::move(outs);
        lr.quantized = true;
        lr.qtype = qtype_name(qtype);
        lr.rot = shape_of.rot();
        for (const TensorSpec& s : p.outputs) lr.bytes_after += s.nbytes();
      }
    }
    if (!why.empty()) {
      lr.skip_reason = why;
      lr.bytes_after = lr.bytes_before;
      p.outputs.push_back({t.name, t.dtype, t.shape});
    }
    p.report = report.layers.size();
    report.layers.push_back(std::move(lr));
    plans.push_back(std::move(p));
  }

  std::vector<TensorSpec> specs;
  for (const Plan& p : plans)
    for (const TensorSpec& s : p.outputs) specs.push_back(s);
  std::map<std::string, std::string> metadata = reader.metadata();
  if (!comfy) {
    metadata["lowbit.format"] = "1";
    metadata["lowbit.qtype"] = qtype_name(qtype);
  }

  // ---- stream ----
  SafetensorsWriter writer(out, specs, metadata, opt.writer);
  QuantizeProgress prog;
  prog.count = plans.size();
  prog.bytes_total = report.data_bytes_in;
  if (opt.progress) opt.progress(prog);
  for (const Plan& p : plans) {
    if (opt.cancel && opt.cancel->load()) {
      writer.abandon();
      check::fail(kOp, out.c_str(), "cancelled; no output written");
    }
    const TensorInfo& t = *p.in;
    if (p.kind == Plan::copy) {
      for (uint64_t off = 0; off < t.nbytes(); off += kCopyChunk) {
        const uint64_t n = std::min(kCopyChunk, t.nbytes() - off);
        writer.write(t.name, reader.data(t) + off, n);
        reader.release(t, off, n);
      }
    } else {
      std::vector<float> w = to_f32(reader, t, ctx);
      reader.release(t);
      const int64_t o = t.shape[0], k = t.shape[1];
      TensorView wv = make_view(w.data(), DType::f32, {o, k});
      PackedWeight pw = quantize_weight(wv, qtype, ctx);
      LayerReport& lr = report.layers[p.report];
      if (opt.compute_error) {
        std::vector<float> d(w.size());
        dequantize_weight(pw, make_view(d.data(), DType::f32, {o, k}), false, ctx);
        double num = 0, den = 0;
        for (size_t i = 0; i < w.size(); ++i) {
          double e = static_cast<double>(w[i]) - static_cast<double>(d[i]);
          num += e * e;
          den += static_cast<double>(w[i]) * w[i];
        }
        lr.rel_error = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
      }
      std::vector<float>().swap(w);
      auto parts = pw.tensors();
      for (const TensorSpec& s : p.outputs) {
        if (ends_with(s.name, "comfy_quant")) {
          writer.write(s.name, kComfyMarker, std::strlen(kComfyMarker));
          continue;
        }
        if (ends_with(s.name, "lowbit_quant")) {
          std::string mj = lowbit_marker_json(pw, t.dtype);
          LOWBIT_CHECK(mj.size() == s.nbytes(), kOp, s.name.c_str(), "marker size changed");
          writer.write(s.name, mj.data(), mj.size());
          continue;
        }
        const TensorView* v = nullptr;
        for (const auto& part : parts)
          if (part_name(p.prefix, part.first) == s.name) v = &part.second;
        LOWBIT_CHECK(v != nullptr, kOp, s.name.c_str(), "packed part missing");
        const uint64_t n = static_cast<uint64_t>(dtype_storage_bytes(v->dtype, v->numel()));
        LOWBIT_CHECK(
            n == s.nbytes(), kOp, s.name.c_str(),
            "packed part: " +
                check::expected_got(static_cast<int64_t>(s.nbytes()), static_cast<int64_t>(n)) +
                " bytes");
        writer.write(s.name, v->data, n);
      }
    }
    reader.release(t);
    prog.index += 1;
    prog.name = t.name;
    prog.bytes_done += t.nbytes();
    if (opt.progress) opt.progress(prog);
  }
  writer.finish();
  report.tensors_out = specs.size();
  for (const Plan& p : plans) report.tensors_copied += p.kind == Plan::copy;
  for (const TensorSpec& s : specs) report.data_bytes_out += s.nbytes();
  {
    SafetensorsReader check_out(out);  // re-validates what was written (header only)
    report.file_bytes_out = check_out.file_bytes();
  }
  return report;
}

}  // namespace lowbit
