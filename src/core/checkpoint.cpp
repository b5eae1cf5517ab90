// The model quantizer: streams a safetensors checkpoint, quantizing its linear weights
// (SPEC §3.6). Also the loader of quantized layers. docs/checkpoint-format.md gives the formats.
#include "lowbit/checkpoint.h"

#include <dirent.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
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

// s with control characters (NUL included) as \xNN, for error messages.
std::string printable(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    const char* hex = "0123456789abcdef";
    out += {'\\', 'x', hex[u >> 4], hex[u & 15]};
  }
  return out;
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
  enum Kind { copy, transform } kind = copy;  // transform: quantize / dequantize
  size_t file = 0;  // which input file (reader)
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

std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string join_path(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

// A small text file (the sharded output's index) written beside its destination and renamed
// onto it by commit(); removed when dropped uncommitted.
class PendingText {
 public:
  PendingText(const std::string& path, const std::string& text) : path_(path) {
    temp_ = join_path(parent_dir(path), "." + base_name(path) + ".tmp-" + std::to_string(getpid()));
    std::ofstream f(temp_, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) {
      std::remove(temp_.c_str());
      check::fail(kOp, path.c_str(), "cannot write the temporary file " + temp_);
    }
  }
  PendingText(const PendingText&) = delete;
  PendingText& operator=(const PendingText&) = delete;
  ~PendingText() {
    if (!committed_) std::remove(temp_.c_str());
  }
  void commit() {
    LOWBIT_CHECK(std::rename(temp_.c_str(), path_.c_str()) == 0, kOp, path_.c_str(),
                 "cannot rename " + temp_ + " onto it: " + std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string path_, temp_;
  bool committed_ = false;
};

}  // namespace

bool is_checkpoint_index(const std::string& path) { return ends_with(path, ".index.json"); }

CheckpointFiles checkpoint_files(const std::string& path_in) {
  const char* op = "checkpoint_files";
  LOWBIT_CHECK(!path_in.empty(), op, "path", "expected a file, an index or a directory, got ''");
  std::string path = path_in;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::vector<std::string> indexes, files;
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n.empty() || n[0] == '.') continue;  // hidden files: a writer's temporaries too
        if (ends_with(n, ".safetensors.index.json")) indexes.push_back(n);
        if (ends_with(n, ".safetensors")) files.push_back(n);
      }
      ::closedir(d);
    } else {
      check::fail(op, path.c_str(),
                  std::string("cannot list the directory: ") + std::strerror(errno));
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(files.begin(), files.end());
    auto listing = [](const std::vector<std::string>& v) {
      std::string out;
      for (const auto& n : v) out += (out.empty() ? "" : ", ") + n;
      return out;
    };
    if (indexes.size() > 1)
      check::fail(op, path.c_str(),
                  "expected one *.safetensors.index.json in the directory, got " +
                      std::to_string(indexes.size()) + " (" + listing(indexes) + ")");
    if (indexes.size() == 1) {
      path = join_path(path, indexes[0]);
    } else {
      LOWBIT_CHECK(files.size() == 1, op, path.c_str(),
                   "expected a *.safetensors.index.json or exactly one *.safetensors file in the "
                   "directory, got " +
                       std::to_string(files.size()) + " .safetensors files" +
                       (files.empty() ? std::string() : " (" + listing(files) + ")"));
      path = join_path(path, files[0]);
    }
  }
  CheckpointFiles out;
  out.index_metadata = "{}";
  if (!is_checkpoint_index(path)) {
    out.files.push_back(path);
    return out;
  }
  out.index = path;
  std::ifstream f(path, std::ios::binary);
  LOWBIT_CHECK(f.good(), op, path.c_str(),
               std::string("cannot open the index: ") + std::strerror(errno));
  std::stringstream text;
  text << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  LOWBIT_CHECK(j.is_object(), op, path.c_str(), "expected a JSON object (a sharded index)");
  auto wm = j.find("weight_map");
  LOWBIT_CHECK(wm != j.end() && wm->is_object(), op, path.c_str(),
               "expected a \"weight_map\" object of tensor name -> shard file");
  LOWBIT_CHECK(!wm->empty(), op, path.c_str(), "the \"weight_map\" is empty");
  auto meta = j.find("metadata");
  if (meta != j.end()) {
    LOWBIT_CHECK(meta->is_object(), op, path.c_str(), "\"metadata\" is not an object");
    out.index_metadata = meta->dump();
  }
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    const std::string& name = it.key();
    LOWBIT_CHECK(!name.empty(), op, path.c_str(), "weight_map: an empty tensor name");
    LOWBIT_CHECK(it->is_string(), op, path.c_str(),
                 "weight_map['" + name + "']: expected a shard file name, got " + it->dump());
    const std::string shard = it->get<std::string>();
    LOWBIT_CHECK(ends_with(shard, ".safetensors") && shard.find('/') == std::string::npos &&
                     shard.find('\0') == std::string::npos && shard[0] != '.',
                 op, path.c_str(),
                 "weight_map['" + name +
                     "']: expected a *.safetensors file name in the index's "
                     "directory, got '" +
                     printable(shard) + "'");
    out.weight_map[name] = shard;
    shards.insert(shard);
  }
  for (const auto& shard : shards) out.files.push_back(join_path(parent_dir(path), shard));
  return out;
}

std::vector<SafetensorsReader> open_checkpoint(const CheckpointFiles& files,
                                               const ReaderOptions& options) {
  const char* op = "open_checkpoint";
  std::vector<SafetensorsReader> readers;
  readers.reserve(files.files.size());
  for (const auto& f : files.files) readers.emplace_back(f, options);
  if (files.index.empty()) return readers;
  size_t listed = 0;
  for (const SafetensorsReader& r : readers) {
    const std::string shard = base_name(r.path());
    for (const TensorInfo& t : r.tensors()) {
      auto it = files.weight_map.find(t.name);
      LOWBIT_CHECK(it != files.weight_map.end(), op, files.index.c_str(),
                   "tensor '" + t.name + "' of shard " + shard + " is not in the weight_map");
      LOWBIT_CHECK(
          it->second == shard, op, files.index.c_str(),
          "tensor '" + t.name + "' is in shard " + shard + ", the weight_map says " + it->second);
      ++listed;
    }
  }
  if (listed != files.weight_map.size()) {
    for (const auto& kv : files.weight_map) {
      const SafetensorsReader* r = nullptr;
      for (const SafetensorsReader& x : readers)
        if (base_name(x.path()) == kv.second) r = &x;
      LOWBIT_CHECK(r && r->find(kv.first), op, files.index.c_str(),
                   "tensor '" + kv.first + "' of the weight_map is not in shard " + kv.second);
    }
  }
  return readers;
}

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

namespace {

// (O, K) of a quantized layer: the lowbit marker's out_features / in_features, or a ComfyUI
// layer's (O, K / 2) nibble-pair codes.
std::pair<int64_t, int64_t> layer_shape(const char* op, const SafetensorsReader& file,
                                        const LayerMarker& m) {
  if (m.format == "comfy") {
    const TensorInfo* w = file.find(m.prefix + "weight");
    if (!w)
      check::fail(op, file.path().c_str(),
                  "layer '" + m.prefix + "': tensor '" + m.prefix + "weight' is missing");
    LOWBIT_CHECK(w->shape.size() == 2, op, file.path().c_str(),
                 "tensor '" + w->name + "': rank " + check::expected_got(2, w->shape.size()));
    return {w->shape[0], w->shape[1] * 2};
  }
  nlohmann::json j = nlohmann::json::parse(m.json, nullptr, false);
  auto get_int = [&](const char* key) -> int64_t {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer())
      check::fail(op, file.path().c_str(),
                  "layer '" + m.prefix + "': marker has no integer \"" + key + "\"");
    return it->get<int64_t>();
  };
  return {get_int("out_features"), get_int("in_features")};
}

}  // namespace

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
    const auto [o, k] = layer_shape(op, file, m);
    parts.emplace_back("codes", host_view(need(m.prefix + "weight"), keep));
    parts.emplace_back("scales", host_view(need(m.prefix + "weight_scale"), keep));
    return PackedWeight(QType::convrot_comfy_w4a4, o, k, parts, m.rot, 0);
  }
  QType q = parse_qtype(m.qtype);
  const auto [o, k] = layer_shape(op, file, m);
  for (const auto& p : packed_weight_parts(q, o, k)) {
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

namespace {

// Where a checkpoint transform writes (quantize_checkpoint, dequantize_checkpoint): one file, or
// one shard per input shard (the same file name, in the output index's directory) and the index.
struct Outputs {
  std::vector<std::string> files;
  bool sharded = false;
  size_t of(size_t input_file) const { return sharded ? input_file : 0; }
};

Outputs plan_outputs(const char* op, const CheckpointFiles& src, const std::string& in,
                     const std::string& out) {
  LOWBIT_CHECK(!out.empty(), op, "out", "expected an output path, got an empty string");
  Outputs o;
  o.sharded = is_checkpoint_index(out);
  LOWBIT_CHECK(!o.sharded || !src.index.empty(), op, "out",
               "'" + out + "' is an index (a sharded output) but the input '" + in +
                   "' is one file; write one .safetensors file");
  if (o.sharded) {
    for (const auto& f : src.files) o.files.push_back(join_path(parent_dir(out), base_name(f)));
    LOWBIT_CHECK(!same_file(src.index, out) && src.index != out, op, "out",
                 "'" + out + "' is the input index; lowbit never overwrites its input");
  } else {
    o.files.push_back(out);
  }
  for (const auto& f_out : o.files)
    for (const auto& f : src.files)
      LOWBIT_CHECK(!same_file(f, f_out) && f != f_out, op, "out",
                   "'" + f_out + "' is " +
                       (src.files.size() > 1 ? "an input shard" : "the input file") +
                       "; lowbit never overwrites its input");
  return o;
}

// Streams every plan's outputs into the output files: copies are copied in pieces, the other
// plans are written by `produce`. Each output file is written to a temporary file, closed when
// its last plan is done and renamed only once all are (the index of a sharded output is written
// before the renames and renamed last), so a failure or a cancel leaves nothing. Returns the
// written data bytes.
uint64_t stream_plans(const char* op, const CheckpointFiles& src,
                      const std::vector<SafetensorsReader>& readers, const Outputs& outs,
                      const std::string& out, const std::vector<Plan>& plans,
                      const std::function<void(std::map<std::string, std::string>&)>& metadata_fn,
                      const ProgressFn& progress, const std::atomic<bool>* cancel,
                      const WriterOptions& writer_options,
                      const std::function<void(const Plan&, SafetensorsWriter&)>& produce) {
  // Each output file's tensors and metadata (one file: the inputs' "__metadata__" merged, the
  // first file's value kept on a clash).
  std::vector<std::vector<TensorSpec>> specs(outs.files.size());
  std::vector<std::map<std::string, std::string>> metadata(outs.files.size());
  std::vector<size_t> last_plan(outs.files.size(), 0);
  for (size_t i = 0; i < plans.size(); ++i) {
    for (const TensorSpec& s : plans[i].outputs) specs[outs.of(plans[i].file)].push_back(s);
    last_plan[outs.of(plans[i].file)] = i;
  }
  for (size_t fi = 0; fi < readers.size(); ++fi)
    metadata[outs.of(fi)].insert(readers[fi].metadata().begin(), readers[fi].metadata().end());
  for (auto& m : metadata) metadata_fn(m);

  std::vector<std::unique_ptr<SafetensorsWriter>> writers(outs.files.size());
  auto writer_of = [&](size_t oi) -> SafetensorsWriter& {
    if (!writers[oi])
      writers[oi] = std::make_unique<SafetensorsWriter>(outs.files[oi], specs[oi], metadata[oi],
                                                        writer_options);
    return *writers[oi];
  };
  QuantizeProgress prog;
  prog.count = plans.size();
  for (const SafetensorsReader& r : readers)
    for (const TensorInfo& t : r.tensors()) prog.bytes_total += t.nbytes();
  if (progress) progress(prog);
  for (size_t pi = 0; pi < plans.size(); ++pi) {
    const Plan& p = plans[pi];
    if (cancel && cancel->load())
      check::fail(op, out.c_str(), "cancelled; no output written");  // writers remove theirs
    const size_t oi = outs.of(p.file);
    SafetensorsWriter& writer = writer_of(oi);
    const SafetensorsReader& reader = readers[p.file];
    const TensorInfo& t = *p.in;
    if (p.kind == Plan::copy) {
      for (uint64_t off = 0; off < t.nbytes(); off += kCopyChunk) {
        const uint64_t n = std::min(kCopyChunk, t.nbytes() - off);
        writer.write(t.name, reader.data(t) + off, n);
        reader.release(t, off, n);
      }
    } else {
      produce(p, writer);
    }
    reader.release(t);
    if (pi == last_plan[oi]) writer.close();
    prog.index += 1;
    prog.name = t.name;
    prog.bytes_done += t.nbytes();
    if (progress) progress(prog);
  }
  for (size_t oi = 0; oi < outs.files.size(); ++oi)  // an output without tensors
    if (!writers[oi]) writer_of(oi).close();
  uint64_t data_out = 0;
  for (const auto& sp : specs)
    for (const TensorSpec& t : sp) data_out += t.nbytes();
  // The index of a sharded output: the input index's metadata with the new total size, and
  // every written tensor's shard.
  std::unique_ptr<PendingText> index;
  if (outs.sharded) {
    nlohmann::ordered_json j;
    j["metadata"] = nlohmann::ordered_json::parse(src.index_metadata);
    j["metadata"]["total_size"] = data_out;
    std::map<std::string, std::string> wm;
    for (size_t oi = 0; oi < outs.files.size(); ++oi)
      for (const TensorSpec& t : specs[oi]) wm[t.name] = base_name(outs.files[oi]);
    j["weight_map"] = wm;
    index = std::make_unique<PendingText>(out, j.dump(2) + "\n");
  }
  for (auto& w : writers) w->commit();
  if (index) index->commit();
  return data_out;
}

// Opens the input files; their names, tensor count and bytes go into `io`.
std::vector<SafetensorsReader> open_inputs(const CheckpointFiles& src, CheckpointIO& io) {
  std::vector<SafetensorsReader> readers = open_checkpoint(src);
  io.files_in = src.files;
  for (const SafetensorsReader& r : readers) {
    io.tensors_in += r.tensors().size();
    io.file_bytes_in += r.file_bytes();
  }
  return readers;
}

// After stream_plans: the files written (their headers re-validated) and their bytes into `io`.
void record_outputs(const Outputs& outs, const std::string& out, const std::vector<Plan>& plans,
                    CheckpointIO& io) {
  io.files_out = outs.files;
  if (outs.sharded) io.index_out = out;
  for (const Plan& p : plans) io.tensors_out += p.outputs.size();
  for (const auto& f : outs.files) io.file_bytes_out += SafetensorsReader(f).file_bytes();
}

}  // namespace

QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out, QType qtype,
                                   const QuantizeOptions& opt, Context& ctx) {
  const bool comfy = opt.format == CheckpointFormat::comfy;
  LOWBIT_CHECK(
      !comfy || qtype == QType::convrot_comfy_w4a4, kOp, "format",
      std::string("--format comfy stores convrotcomfyw4a4 only, got qtype ") + qtype_name(qtype));
  const CheckpointFiles src = checkpoint_files(in);
  const Outputs outs = plan_outputs(kOp, src, in, out);
  QuantizeReport report;
  std::vector<SafetensorsReader> readers = open_inputs(src, report);

  // Layers already quantized in the input keep every tensor as it is.
  std::set<std::string> quantized_prefixes;
  std::unordered_set<std::string> input_names;
  for (const SafetensorsReader& r : readers) {
    for (const LayerMarker& m : find_layer_markers(r)) quantized_prefixes.insert(m.prefix);
    for (const TensorInfo& t : r.tensors()) {
      LOWBIT_CHECK(input_names.insert(t.name).second, kOp, r.path().c_str(),
                   "tensor '" + t.name + "' is also in another input file");
    }
  }

  // ---- plan: what each input tensor becomes (shapes are known before any quantization) ----
  std::vector<Plan> plans;
  for (size_t fi = 0; fi < readers.size(); ++fi) {
    for (const TensorInfo& t : readers[fi].tensors()) {
      Plan p;
      p.file = fi;
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
          outs.push_back(
              {prefix + "lowbit_quant", FileDType::u8, {static_cast<int64_t>(mj.size())}});
        }
        for (const TensorSpec& s : outs) {
          if (s.name != t.name && input_names.count(s.name))
            why = "output tensor '" + s.name + "' already exists in the input";
        }
        if (why.empty()) {
          p.kind = Plan::transform;
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
  }

  if (opt.dry_run) {
    for (const Plan& p : plans) report.tensors_out += p.outputs.size();
    for (const Plan& p : plans) report.tensors_copied += p.kind == Plan::copy;
    for (const Plan& p : plans)
      for (const TensorSpec& t : p.outputs) report.data_bytes_out += t.nbytes();
    return report;
  }
  auto metadata = [&](std::map<std::string, std::string>& m) {
    if (comfy) return;
    m["lowbit.format"] = "1";
    m["lowbit.qtype"] = qtype_name(qtype);
  };
  auto produce = [&](const Plan& p, SafetensorsWriter& writer) {
    const SafetensorsReader& reader = readers[p.file];
    const TensorInfo& t = *p.in;
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
  };
  report.data_bytes_out = stream_plans(kOp, src, readers, outs, out, plans, metadata, opt.progress,
                                       opt.cancel, opt.writer, produce);
  record_outputs(outs, out, plans, report);
  for (const Plan& p : plans) report.tensors_copied += p.kind == Plan::copy;
  return report;
}

DequantizeReport dequantize_checkpoint(const std::string& in, const std::string& out,
                                       const DequantizeOptions& opt, Context& ctx) {
  const char* op = "dequantize_checkpoint";
  LOWBIT_CHECK(
      opt.dtype == FileDType::f32 || opt.dtype == FileDType::bf16 || opt.dtype == FileDType::f16,
      op, "dtype", check::expected_got("F32, BF16 or F16", file_dtype_name(opt.dtype)));
  const CheckpointFiles src = checkpoint_files(in);
  const Outputs outs = plan_outputs(op, src, in, out);
  DequantizeReport report;
  std::vector<SafetensorsReader> readers = open_inputs(src, report);
  // Every quantized layer: its marker, and the tensors it is stored in (the parts named by its
  // qtype, then the marker), all in the marker's file.
  struct Layer {
    LayerMarker marker;
    size_t file = 0;
    int64_t o = 0, k = 0;
    FileDType dtype = FileDType::bf16;
    uint64_t stored_bytes = 0;  // its parts and marker
  };
  std::map<std::string, Layer> layers;        // by prefix
  std::map<std::string, std::string> member;  // tensor name -> its layer's prefix
  for (size_t fi = 0; fi < readers.size(); ++fi) {
    for (const LayerMarker& m : find_layer_markers(readers[fi])) {
      // The shapes only (each layer's parts are loaded and validated when it is written).
      const auto [o, k] = layer_shape(op, readers[fi], m);
      const auto parts = packed_weight_parts(parse_qtype(m.qtype), o, k);
      Layer l{m, fi, o, k, opt.dtype};
      if (opt.source_dtype) {
        const nlohmann::json j = nlohmann::json::parse(m.json, nullptr, false);
        FileDType d;
        if (j.is_object() && j.contains("source_dtype") && j["source_dtype"].is_string() &&
            parse_file_dtype(j["source_dtype"].get<std::string>(), &d) &&
            (d == FileDType::f32 || d == FileDType::bf16 || d == FileDType::f16))
          l.dtype = d;
      }
      std::vector<std::string> names;
      for (const auto& part : parts)
        names.push_back(m.format == "comfy" ? (part.first == "codes" ? m.prefix + "weight"
                                                                     : m.prefix + "weight_scale")
                                            : part_name(m.prefix, part.first));
      names.push_back(m.prefix + (m.format == "comfy" ? "comfy_quant" : "lowbit_quant"));
      for (const auto& n : names) {
        const TensorInfo* t = readers[fi].find(n);
        if (!t)
          check::fail(op, readers[fi].path().c_str(),
                      "layer '" + m.prefix + "': tensor '" + n + "' is missing");
        member[n] = m.prefix;
        l.stored_bytes += t->nbytes();
      }
      layers[m.prefix] = l;
    }
  }
  std::vector<Plan> plans;
  for (size_t fi = 0; fi < readers.size(); ++fi) {
    for (const TensorInfo& t : readers[fi].tensors()) {
      Plan p;
      p.file = fi;
      p.in = &t;
      auto it = member.find(t.name);
      if (it == member.end()) {
        p.outputs.push_back({t.name, t.dtype, t.shape});  // copied
      } else if (t.name == it->second + "weight") {
        // The codes become the restored weight, in their place; the other parts and the marker
        // become nothing.
        const Layer& l = layers.at(it->second);
        p.kind = Plan::transform;
        p.prefix = it->second;
        p.outputs.push_back({t.name, l.dtype, {l.o, l.k}});
        RestoredLayer r;
        r.name = t.name;
        r.shape = {l.o, l.k};
        r.qtype = l.marker.qtype;
        r.dtype = l.dtype;
        r.bytes_before = l.stored_bytes;
        r.bytes_after = p.outputs.back().nbytes();
        report.layers.push_back(r);
      } else {
        p.kind = Plan::transform;  // dropped: no outputs
      }
      plans.push_back(std::move(p));
    }
  }
  auto metadata = [](std::map<std::string, std::string>& m) {
    m.erase("lowbit.format");
    m.erase("lowbit.qtype");
  };
  auto produce = [&](const Plan& p, SafetensorsWriter& writer) {
    if (p.outputs.empty()) return;
    const Layer& l = layers.at(p.prefix);
    const PackedWeight pw = load_quantized_layer(readers[l.file], l.marker);
    std::vector<float> w(static_cast<size_t>(l.o * l.k));
    TensorView wv = make_view(w.data(), DType::f32, {l.o, l.k});
    dequantize_weight(pw, wv, false, ctx);
    if (l.dtype == FileDType::f32) {
      writer.write(p.outputs[0].name, w.data(), w.size() * 4);
      return;
    }
    std::vector<uint16_t> h(w.size());
    convert(wv,
            make_view(h.data(), l.dtype == FileDType::bf16 ? DType::bf16 : DType::f16, {l.o, l.k}),
            ctx);
    writer.write(p.outputs[0].name, h.data(), h.size() * 2);
  };
  stream_plans(op, src, readers, outs, out, plans, metadata, opt.progress, opt.cancel, opt.writer,
               produce);
  record_outputs(outs, out, plans, report);
  return report;
}

}  // namespace lowbit
