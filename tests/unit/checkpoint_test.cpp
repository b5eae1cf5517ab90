// quantize_checkpoint: what is quantized / copied / skipped, exact output keys for both formats,
// independent decoding of the stored codes (a dense Kronecker rotation built here), never
// overwriting the input, cancellation, and the weight error on real MiniLM weights.
#include "lowbit/checkpoint.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "lowbit/dtype.h"
#include "tests/unit/random_data.h"
#include "tests/unit/temp_files.h"

namespace lowbit {
namespace {

std::string tmp_dir(const std::string& name) { return testing_files::tmp_dir("lowbit_ck_", name); }
using testing_files::list_dir;


struct Src {
  std::string name;
  FileDType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

Src f32_tensor(const std::string& name, std::vector<int64_t> shape, uint64_t seed) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  auto v = testing_data::normal_vec(static_cast<size_t>(n), seed, 0.05f);
  Src s{name, FileDType::f32, shape, std::vector<uint8_t>(v.size() * 4)};
  std::memcpy(s.bytes.data(), v.data(), s.bytes.size());
  return s;
}

Src bf16_tensor(const std::string& name, std::vector<int64_t> shape, uint64_t seed) {
  Src s = f32_tensor(name, shape, seed);
  std::vector<uint8_t> b(s.bytes.size() / 2);
  for (size_t i = 0; i < b.size() / 2; ++i) {
    float f;
    std::memcpy(&f, s.bytes.data() + 4 * i, 4);
    uint16_t h = dt::f32_to_bf16(f);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  s.dtype = FileDType::bf16;
  s.bytes = b;
  return s;
}

void write_file(const std::string& path, const std::vector<Src>& ts,
                const std::map<std::string, std::string>& meta = {}) {
  std::vector<TensorSpec> plan;
  for (const auto& t : ts) plan.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter w(path, plan, meta);
  for (const auto& t : ts) w.write(t.name, t.bytes.data(), t.bytes.size());
  w.finish();
}

std::vector<float> read_f32(const SafetensorsReader& r, const std::string& name) {
  const TensorInfo& t = r.at(name);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == FileDType::f32) {
    std::memcpy(v.data(), r.data(t), t.nbytes());
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, r.data(t) + 2 * i, 2);
      v[i] = dt::bf16_to_f32(h);
    }
  }
  return v;
}

// Dense R_n = R4^{⊗k} (n = 4^k), built from its definition.
std::vector<double> dense_rotation(int n) {
  const double r4[16] = {1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, -1, 1, 1, 1};
  std::vector<double> r = {1.0};
  int m = 1;
  while (m < n) {
    std::vector<double> next(static_cast<size_t>(m * 4) * (m * 4));
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j)
        for (int a = 0; a < 4; ++a)
          for (int b = 0; b < 4; ++b)
            next[(i * 4 + a) * (m * 4) + (j * 4 + b)] = r[i * m + j] * 0.5 * r4[a * 4 + b];
    r = next;
    m *= 4;
  }
  return r;
}

// w (O, K) = w_rot · R per block of `rot` (R symmetric, its own inverse).
std::vector<double> unrotate(const std::vector<double>& w_rot, int64_t o, int64_t k, int rot) {
  auto r = dense_rotation(rot);
  std::vector<double> w(w_rot.size(), 0.0);
  for (int64_t i = 0; i < o; ++i)
    for (int64_t b = 0; b < k; b += rot)
      for (int c = 0; c < rot; ++c) {
        double acc = 0;
        for (int j = 0; j < rot; ++j) acc += w_rot[i * k + b + j] * r[j * rot + c];
        w[i * k + b + c] = acc;
      }
  return w;
}

double rel_err(const std::vector<float>& w, const std::vector<double>& d) {
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    num += (w[i] - d[i]) * (w[i] - d[i]);
    den += static_cast<double>(w[i]) * w[i];
  }
  return std::sqrt(num / den);
}

const LayerReport* find_layer(const QuantizeReport& r, const std::string& name) {
  for (const auto& l : r.layers)
    if (l.name == name) return &l;
  return nullptr;
}

std::vector<Src> model_tensors() {
  return {
      f32_tensor("embed_tokens.weight", {32, 64}, 1),
      f32_tensor("blocks.0.attn.qkv.weight", {48, 64}, 2),
      f32_tensor("blocks.0.attn.qkv.bias", {48}, 3),
      f32_tensor("blocks.0.norm.weight", {64}, 4),
      bf16_tensor("blocks.0.mlp.fc1.weight", {32, 256}, 5),
      f32_tensor("blocks.0.mlp.fc2.weight", {16, 24}, 6),   // K = 24: rot 4 < 16
      f32_tensor("blocks.0.conv.weight", {8, 4, 3, 3}, 7),  // 4-D: not a linear
      f32_tensor("head.weight", {16, 64}, 8),
  };
}

TEST(QuantizeCheckpoint, Convrot8LowbitFormat) {
  std::string dir = tmp_dir("c8");
  std::string in = dir + "/in.safetensors", out = dir + "/out.safetensors";
  auto src = model_tensors();
  write_file(in, src, {{"origin", "test"}});
  QuantizeOptions opt;
  opt.filter.exclude = {"head.*"};
  std::vector<QuantizeProgress> seen;
  opt.progress = [&](const QuantizeProgress& p) { seen.push_back(p); };
  Context ctx;
  QuantizeReport rep = quantize_checkpoint(in, out, QType::convrot8, opt, ctx);

  // Progress: once before, once per tensor, bytes increasing to the total.
  ASSERT_EQ(seen.size(), src.size() + 1);
  EXPECT_EQ(seen.front().index, 0u);
  EXPECT_EQ(seen.back().index, src.size());
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);

  // The report lists the five 2-D *.weight tensors with the right decisions.
  ASSERT_EQ(rep.layers.size(), 5u);
  EXPECT_NE(find_layer(rep, "embed_tokens.weight")->skip_reason.find("embedding"),
            std::string::npos);
  EXPECT_TRUE(find_layer(rep, "blocks.0.attn.qkv.weight")->quantized);
  EXPECT_TRUE(find_layer(rep, "blocks.0.mlp.fc1.weight")->quantized);
  EXPECT_FALSE(find_layer(rep, "blocks.0.mlp.fc2.weight")->quantized);
  EXPECT_FALSE(find_layer(rep, "blocks.0.mlp.fc2.weight")->skip_reason.empty());
  EXPECT_NE(find_layer(rep, "head.weight")->skip_reason.find("--exclude 'head.*'"),
            std::string::npos);
  EXPECT_EQ(rep.quantized(), 2u);
  EXPECT_EQ(rep.skipped(), 3u);

  SafetensorsReader r(out);
  EXPECT_EQ(r.metadata().at("origin"), "test");
  EXPECT_EQ(r.metadata().at("lowbit.qtype"), "convrot8");
  // Everything not quantized is copied byte for byte.
  for (const Src& s : src) {
    if (s.name == "blocks.0.attn.qkv.weight" || s.name == "blocks.0.mlp.fc1.weight") continue;
    const TensorInfo& t = r.at(s.name);
    EXPECT_EQ(t.dtype, s.dtype) << s.name;
    EXPECT_EQ(t.shape, s.shape) << s.name;
    ASSERT_EQ(t.nbytes(), s.bytes.size());
    EXPECT_EQ(std::memcmp(r.data(t), s.bytes.data(), s.bytes.size()), 0) << s.name;
  }
  // Quantized layers: int8 codes (O, K), f32 row scales (O), a marker; decoded here with a dense
  // rotation, they reproduce the weight to about 1 % (convrot8, SPEC §3.2).
  auto markers = find_layer_markers(r);
  ASSERT_EQ(markers.size(), 2u);
  for (const auto& m : markers) {
    EXPECT_EQ(m.format, "lowbit");
    EXPECT_EQ(m.qtype, "convrot8");
    EXPECT_EQ(m.bits, 8);
    const TensorInfo& codes = r.at(m.prefix + "weight");
    const TensorInfo& scales = r.at(m.prefix + "weight_scale");
    ASSERT_EQ(codes.dtype, FileDType::i8);
    ASSERT_EQ(scales.dtype, FileDType::f32);
    int64_t o = codes.shape[0], k = codes.shape[1];
    EXPECT_EQ(scales.shape, std::vector<int64_t>{o});
    EXPECT_EQ(m.rot, k == 64 ? 64 : 256);
    std::vector<double> w_rot(static_cast<size_t>(o * k));
    for (int64_t i = 0; i < o; ++i) {
      float s;
      std::memcpy(&s, r.data(scales) + 4 * i, 4);
      for (int64_t j = 0; j < k; ++j)
        w_rot[i * k + j] = static_cast<int8_t>(r.data(codes)[i * k + j]) * static_cast<double>(s);
    }
    const Src& orig = m.prefix == "blocks.0.attn.qkv." ? src[1] : src[4];
    SafetensorsReader ri(in);
    auto w = read_f32(ri, orig.name);
    double e = rel_err(w, unrotate(w_rot, o, k, m.rot));
    EXPECT_LT(e, 0.015) << m.prefix;
    // The report's error is the same quantity.
    EXPECT_NEAR(find_layer(rep, orig.name)->rel_error, e, 1e-4) << m.prefix;
    // load_quantized_layer gives back the same packed weight quantize_weight makes.
    PackedWeight loaded = load_quantized_layer(r, m);
    EXPECT_EQ(loaded.qtype(), QType::convrot8);
    EXPECT_EQ(loaded.out_features(), o);
    EXPECT_EQ(loaded.in_features(), k);
    EXPECT_EQ(std::memcmp(loaded.codes.data(), r.data(codes), codes.nbytes()), 0);
  }
  // Output has no temporary files beside it.
  EXPECT_EQ(list_dir(dir).size(), 2u);
}

TEST(QuantizeCheckpoint, ComfyFormatExactKeys) {
  std::string dir = tmp_dir("comfy");
  std::string in = dir + "/in.safetensors", out = dir + "/out.safetensors";
  Src w = f32_tensor("net.lin.weight", {24, 512}, 11);
  Src b = f32_tensor("net.lin.bias", {24}, 12);
  Src small = f32_tensor("net.small.weight", {24, 64}, 13);  // K % 256 != 0: skipped
  write_file(in, {w, b, small});
  QuantizeOptions opt;
  opt.format = CheckpointFormat::comfy;
  Context ctx;
  QuantizeReport rep = quantize_checkpoint(in, out, QType::convrot_comfy_w4a4, opt, ctx);
  EXPECT_EQ(rep.quantized(), 1u);
  EXPECT_FALSE(find_layer(rep, "net.small.weight")->quantized);

  SafetensorsReader r(out);
  std::vector<std::string> names;
  for (const auto& t : r.tensors()) names.push_back(t.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"net.lin.weight", "net.lin.weight_scale",
                                      "net.lin.comfy_quant", "net.lin.bias", "net.small.weight"}));
  const TensorInfo& q = r.at("net.lin.weight");
  EXPECT_EQ(q.dtype, FileDType::i8);
  EXPECT_EQ(q.shape, (std::vector<int64_t>{24, 256}));
  const TensorInfo& s = r.at("net.lin.weight_scale");
  EXPECT_EQ(s.dtype, FileDType::f32);
  EXPECT_EQ(s.shape, std::vector<int64_t>{24});
  const TensorInfo& m = r.at("net.lin.comfy_quant");
  EXPECT_EQ(m.dtype, FileDType::u8);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.data(m)), m.nbytes()),
            R"({"format":"convrot_w4a4","convrot_groupsize":256})");
  EXPECT_EQ(std::memcmp(r.data(r.at("net.lin.bias")), b.bytes.data(), b.bytes.size()), 0);
  // Decode: signed nibbles, even column in the low nibble, codes in [-7, 7], times the row scale,
  // rotated back with a dense R_256.
  std::vector<double> w_rot(24 * 512);
  for (int i = 0; i < 24; ++i) {
    float sc;
    std::memcpy(&sc, r.data(s) + 4 * i, 4);
    EXPECT_GT(sc, 0.f);
    for (int j = 0; j < 512; ++j) {
      uint8_t byte = r.data(q)[i * 256 + j / 2];
      int code = (j % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      if (code >= 8) code -= 16;
      EXPECT_GE(code, -7);
      w_rot[i * 512 + j] = code * static_cast<double>(sc);
    }
  }
  std::vector<float> wf(24 * 512);
  std::memcpy(wf.data(), w.bytes.data(), w.bytes.size());
  double e = rel_err(wf, unrotate(w_rot, 24, 512, 256));
  EXPECT_LT(e, 0.15);  // 4-bit per-row scale on Gaussian weights: about 0.1
  EXPECT_NEAR(find_layer(rep, "net.lin.weight")->rel_error, e, 1e-4);
  auto markers = find_layer_markers(r);
  ASSERT_EQ(markers.size(), 1u);
  EXPECT_EQ(markers[0].qtype, "convrotcomfyw4a4");
  EXPECT_EQ(markers[0].rot, 256);
  PackedWeight loaded = load_quantized_layer(r, markers[0]);
  EXPECT_EQ(loaded.in_features(), 512);

  // comfy format refuses other qtypes, before writing anything.
  std::remove(out.c_str());
  EXPECT_THROW(quantize_checkpoint(in, out, QType::convrot8, opt, ctx), Error);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"in.safetensors"});
}

TEST(QuantizeCheckpoint, NeverOverwritesInputAndCancelsCleanly) {
  std::string dir = tmp_dir("guard");
  std::string in = dir + "/in.safetensors";
  write_file(in, {f32_tensor("a.weight", {16, 64}, 1)});
  std::ifstream f0(in, std::ios::binary);
  std::string before((std::istreambuf_iterator<char>(f0)), std::istreambuf_iterator<char>());
  Context ctx;
  QuantizeOptions opt;
  EXPECT_THROW(quantize_checkpoint(in, in, QType::convrot8, opt, ctx), Error);
  std::string link = dir + "/hard.safetensors";
  ASSERT_EQ(::link(in.c_str(), link.c_str()), 0);
  EXPECT_THROW(quantize_checkpoint(in, link, QType::convrot8, opt, ctx), Error);
  std::remove(link.c_str());
  std::ifstream f1(in, std::ios::binary);
  std::string after((std::istreambuf_iterator<char>(f1)), std::istreambuf_iterator<char>());
  EXPECT_EQ(before, after);

  std::atomic<bool> cancel{true};
  opt.cancel = &cancel;
  EXPECT_THROW(quantize_checkpoint(in, dir + "/out.safetensors", QType::convrot8, opt, ctx), Error);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"in.safetensors"});
}

TEST(QuantizeCheckpoint, SkipsLayersAlreadyQuantized) {
  std::string dir = tmp_dir("twice");
  std::string in = dir + "/in.safetensors", mid = dir + "/mid.safetensors",
              out = dir + "/out.safetensors";
  write_file(in, {f32_tensor("x.weight", {16, 64}, 1), f32_tensor("y.weight", {16, 64}, 2)});
  Context ctx;
  QuantizeOptions opt;
  opt.filter.include = {"x.*"};
  QuantizeReport r1 = quantize_checkpoint(in, mid, QType::convrot_int4, opt, ctx);
  EXPECT_EQ(r1.quantized(), 1u);
  EXPECT_EQ(find_layer(r1, "y.weight")->skip_reason, "not matched by --include");
  opt.filter.include.clear();
  QuantizeReport r2 = quantize_checkpoint(mid, out, QType::convrot8, opt, ctx);
  // x.weight is now int8 packed bytes with a marker: left alone; y.weight gets quantized.
  EXPECT_TRUE(find_layer(r2, "y.weight")->quantized);
  for (const auto& l : r2.layers)
    if (l.name == "x.weight") {
      EXPECT_NE(l.skip_reason.find("already quantized"), std::string::npos);
    }
  SafetensorsReader r(out);
  auto markers = find_layer_markers(r);
  ASSERT_EQ(markers.size(), 2u);
  EXPECT_EQ(markers[0].qtype == "convrotint4" ? markers[1].qtype : markers[0].qtype, "convrot8");
}

// ---- sharded checkpoints (a Hugging Face / diffusers index and its shards) ----

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// model_tensors() over three shards of `dir` with an index; a layer's weight and bias in
// different shards (blocks.0.attn.qkv), each shard with its own metadata.
std::string write_shards(const std::string& dir, const std::string& index_name,
                         const std::string& extra_index_meta = "") {
  auto src = model_tensors();
  const std::vector<std::vector<size_t>> groups = {{0, 1}, {2, 3, 4}, {5, 6, 7}};
  std::string wm;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string shard = "model-0000" + std::to_string(g + 1) + "-of-00003.safetensors";
    std::vector<Src> part;
    for (size_t i : groups[g]) {
      part.push_back(src[i]);
      wm += (wm.empty() ? "" : ",") + std::string("\"") + src[i].name + "\":\"" + shard + "\"";
    }
    write_file(dir + "/" + shard, part,
               {{"format", "pt"}, {"origin", "shard" + std::to_string(g)}});
  }
  const std::string index = dir + "/" + index_name;
  write_text(index, "{\"metadata\":{\"total_size\":1" + extra_index_meta + "},\"weight_map\":{" +
                        wm + "}}");
  return index;
}

// name -> (dtype, shape, bytes) of every tensor of the files.
std::map<std::string, std::tuple<FileDType, std::vector<int64_t>, std::string>> contents(
    const std::vector<std::string>& files) {
  std::map<std::string, std::tuple<FileDType, std::vector<int64_t>, std::string>> out;
  for (const auto& f : files) {
    SafetensorsReader r(f);
    for (const auto& t : r.tensors())
      out[t.name] = {t.dtype, t.shape,
                     std::string(reinterpret_cast<const char*>(r.data(t)), t.nbytes())};
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(QuantizeCheckpoint, ShardedInputIntoOneFileEqualsTheMergedFile) {
  std::string dir = tmp_dir("shard1");
  mkdir((dir + "/in").c_str(), 0755);
  const std::string index = write_shards(dir + "/in", "model.safetensors.index.json");
  write_file(dir + "/merged.safetensors", model_tensors());
  // The directory resolves to its index; the shards sorted by name.
  CheckpointFiles files = checkpoint_files(dir + "/in");
  EXPECT_EQ(files.index, index);
  ASSERT_EQ(files.files.size(), 3u);
  EXPECT_EQ(files.files[0], dir + "/in/model-00001-of-00003.safetensors");
  EXPECT_EQ(files.weight_map.at("blocks.0.attn.qkv.bias"), "model-00002-of-00003.safetensors");
  EXPECT_EQ(open_checkpoint(files).size(), 3u);

  QuantizeOptions opt;
  opt.filter.exclude = {"head.*"};
  std::vector<QuantizeProgress> seen;
  opt.progress = [&](const QuantizeProgress& p) { seen.push_back(p); };
  Context ctx;
  const std::string one = dir + "/one.safetensors", ref = dir + "/ref.safetensors";
  QuantizeReport rep = quantize_checkpoint(dir + "/in", one, QType::convrot8, opt, ctx);
  ASSERT_EQ(seen.size(), model_tensors().size() + 1);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  opt.progress = nullptr;
  QuantizeReport rr =
      quantize_checkpoint(dir + "/merged.safetensors", ref, QType::convrot8, opt, ctx);
  EXPECT_EQ(rep.files_in, files.files);
  EXPECT_EQ(rep.files_out, std::vector<std::string>{one});
  EXPECT_TRUE(rep.index_out.empty());
  EXPECT_EQ(rep.quantized(), 2u);
  EXPECT_EQ(rep.skipped(), rr.skipped());
  EXPECT_EQ(rep.tensors_out, rr.tensors_out);
  EXPECT_EQ(rep.data_bytes_out, rr.data_bytes_out);
  // The same tensors, bytes and order as quantizing the merged file; the shards' metadata
  // merged with the first shard's value kept.
  EXPECT_EQ(contents({one}), contents({ref}));
  SafetensorsReader a(one), b(ref);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i)
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
  EXPECT_EQ(a.metadata().at("origin"), "shard0");
  EXPECT_EQ(a.metadata().at("format"), "pt");
  EXPECT_EQ(a.metadata().at("lowbit.qtype"), "convrot8");
  EXPECT_EQ(list_dir(dir).size(), 4u);  // in/, merged, one, ref: no temporary file
}

TEST(QuantizeCheckpoint, ShardedInputIntoShardsWithAnIndex) {
  std::string dir = tmp_dir("shard2");
  mkdir((dir + "/in").c_str(), 0755);
  mkdir((dir + "/out").c_str(), 0755);
  const std::string index = write_shards(
      dir + "/in", "diffusion_pytorch_model.safetensors.index.json", ",\"note\":\"kept\"");
  Context ctx;
  QuantizeOptions opt;
  const std::string one = dir + "/one.safetensors";
  quantize_checkpoint(index, one, QType::convrot_int4, opt, ctx);
  const std::string out = dir + "/out/q.safetensors.index.json";
  QuantizeReport rep = quantize_checkpoint(index, out, QType::convrot_int4, opt, ctx);
  ASSERT_EQ(rep.files_out.size(), 3u);
  EXPECT_EQ(rep.files_out[1], dir + "/out/model-00002-of-00003.safetensors");
  EXPECT_EQ(rep.index_out, out);
  auto ls = list_dir(dir + "/out");
  std::sort(ls.begin(), ls.end());
  EXPECT_EQ(ls, (std::vector<std::string>{
                    "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                    "model-00003-of-00003.safetensors", "q.safetensors.index.json"}));
  // Every tensor as in the one-file output, each in the shard of its input tensor (a layer's
  // parts and marker with its weight), the index saying so, total_size the data bytes.
  EXPECT_EQ(contents(rep.files_out), contents({one}));
  CheckpointFiles files = checkpoint_files(out);
  EXPECT_EQ(files.files, rep.files_out);
  EXPECT_EQ(open_checkpoint(files).size(), 3u);  // the index agrees with the shards
  EXPECT_EQ(files.weight_map.size(), rep.tensors_out);
  EXPECT_EQ(files.weight_map.at("blocks.0.attn.qkv.weight_scale"),
            "model-00001-of-00003.safetensors");
  EXPECT_EQ(files.weight_map.at("blocks.0.attn.qkv.lowbit_quant"),
            "model-00001-of-00003.safetensors");
  EXPECT_EQ(files.weight_map.at("blocks.0.attn.qkv.bias"), "model-00002-of-00003.safetensors");
  EXPECT_EQ(files.weight_map.at("blocks.0.mlp.fc1.weight_scale"),
            "model-00002-of-00003.safetensors");
  std::ifstream f(out);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["metadata"]["note"].get<std::string>(), "kept");
  EXPECT_EQ(j["metadata"]["total_size"].get<uint64_t>(), rep.data_bytes_out);
  uint64_t data = 0;
  for (const auto& file : rep.files_out) {
    SafetensorsReader r(file);
    for (const auto& t : r.tensors()) data += t.nbytes();
    EXPECT_EQ(r.metadata().at("lowbit.qtype"), "convrotint4");
  }
  EXPECT_EQ(data, rep.data_bytes_out);
  // The layers load from their shard.
  SafetensorsReader s1(rep.files_out[0]);
  auto markers = find_layer_markers(s1);
  ASSERT_EQ(markers.size(), 1u);
  EXPECT_EQ(load_quantized_layer(s1, markers[0]).out_features(), 48);
  // Quantizing the sharded output again (into one file) finds every shard's markers and keeps
  // those layers as they are.
  QuantizeReport again =
      quantize_checkpoint(out, dir + "/again.safetensors", QType::convrot8, opt, ctx);
  EXPECT_NE(find_layer(again, "blocks.0.attn.qkv.weight")->skip_reason.find("already quantized"),
            std::string::npos);
}

TEST(QuantizeCheckpoint, DryRunPlansWithoutWriting) {
  std::string dir = tmp_dir("dry");
  mkdir((dir + "/in").c_str(), 0755);
  const std::string index = write_shards(dir + "/in", "model.safetensors.index.json");
  Context ctx;
  QuantizeOptions opt;
  opt.filter.exclude = {"head.*"};
  const std::string out = dir + "/q.safetensors";
  QuantizeReport real = quantize_checkpoint(index, out, QType::convrot_int4, opt, ctx);
  std::remove(out.c_str());
  opt.dry_run = true;
  QuantizeReport dry = quantize_checkpoint(index, out, QType::convrot_int4, opt, ctx);
  // The same decisions and sizes as the real run, no error figures, no file.
  ASSERT_EQ(dry.layers.size(), real.layers.size());
  for (size_t i = 0; i < dry.layers.size(); ++i) {
    EXPECT_EQ(dry.layers[i].quantized, real.layers[i].quantized);
    EXPECT_EQ(dry.layers[i].skip_reason, real.layers[i].skip_reason);
    EXPECT_EQ(dry.layers[i].bytes_after, real.layers[i].bytes_after);
    EXPECT_EQ(dry.layers[i].rel_error, -1.0);
  }
  EXPECT_EQ(dry.tensors_out, real.tensors_out);
  EXPECT_EQ(dry.data_bytes_out, real.data_bytes_out);
  EXPECT_TRUE(dry.files_out.empty());
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"in"});
}

TEST(QuantizeCheckpoint, ShardedErrorsNameTheEntryAndWriteNothing) {
  std::string dir = tmp_dir("shard3");
  const std::string in = dir + "/in", out = dir + "/out";
  mkdir(in.c_str(), 0755);
  mkdir(out.c_str(), 0755);
  const std::string index = write_shards(in, "model.safetensors.index.json");
  const std::string s1 = "model-00001-of-00003.safetensors";
  Context ctx;
  QuantizeOptions opt;
  auto quantize_err = [&](const std::string& from, const std::string& to) {
    return error_of([&] { quantize_checkpoint(from, to, QType::convrot8, opt, ctx); });
  };
  auto expect_has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg << "\n  expected to contain: " << part;
  };
  // Broken indexes.
  auto with_index = [&](const std::string& text) {
    const std::string p = dir + "/bad.safetensors.index.json";
    write_text(p, text);
    return p;
  };
  expect_has(quantize_err(with_index("not json"), out + "/o.safetensors"), "JSON object");
  expect_has(quantize_err(with_index("{\"metadata\":{}}"), out + "/o.safetensors"),
             "\"weight_map\"");
  expect_has(quantize_err(with_index("{\"weight_map\":{\"a\":\"../in/" + s1 + "\"}}"),
                          out + "/o.safetensors"),
             "got '../in/" + s1 + "'");
  expect_has(quantize_err(with_index("{\"weight_map\":{\"a\":3}}"), out + "/o.safetensors"),
             "weight_map['a']");
  expect_has(quantize_err(with_index("{\"weight_map\":{\"a\":\"missing.safetensors\"}}"),
                          out + "/o.safetensors"),
             "missing.safetensors");
  // A NUL in a shard name would open the file named by what precedes it ("plain", a valid
  // safetensors file without the extension): refused, the NUL shown.
  {
    std::ifstream src(in + "/" + s1, std::ios::binary);
    std::ofstream dst(dir + "/plain", std::ios::binary);
    dst << src.rdbuf();
  }
  expect_has(quantize_err(with_index("{\"weight_map\":{\"a\":\"plain\\u0000.safetensors\"}}"),
                          out + "/o.safetensors"),
             "got 'plain\\x00.safetensors'");
  std::remove((dir + "/plain").c_str());
  std::remove((dir + "/bad.safetensors.index.json").c_str());
  // An index that disagrees with its shards.
  std::ifstream fi(index);
  const std::string good((std::istreambuf_iterator<char>(fi)), std::istreambuf_iterator<char>());
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    write_text(index, t);
  };
  edited("\"head.weight\"", "\"head.other\"");
  expect_has(quantize_err(index, out + "/o.safetensors"), "'head.weight' of shard");
  expect_has(quantize_err(index, out + "/o.safetensors"), "not in the weight_map");
  edited("\"head.weight\":\"model-00003", "\"head.weight\":\"model-00002");
  expect_has(quantize_err(index, out + "/o.safetensors"),
             "'head.weight' is in shard model-00003-of-00003.safetensors, the weight_map says "
             "model-00002-of-00003.safetensors");
  write_text(index, good.substr(0, good.size() - 2) + ",\"ghost.weight\":\"" + s1 + "\"}}");
  expect_has(quantize_err(index, out + "/o.safetensors"),
             "'ghost.weight' of the weight_map is not in shard " + s1);
  write_text(index, good);
  // Directories: two indexes, or nothing to read.
  write_text(in + "/other.safetensors.index.json", good);
  expect_has(quantize_err(in, out + "/o.safetensors"),
             "got 2 (model.safetensors.index.json, "
             "other.safetensors.index.json)");
  std::remove((in + "/other.safetensors.index.json").c_str());
  expect_has(quantize_err(out, dir + "/o.safetensors"), "got 0 .safetensors files");
  // Outputs: shards onto the input's own shards, an index from one file, the input index.
  expect_has(quantize_err(index, in + "/again.safetensors.index.json"), "is an input shard");
  expect_has(quantize_err(in + "/" + s1, out + "/x.safetensors.index.json"), "is one file");
  expect_has(quantize_err(index, index), "the input index");
  // Cancelled half-way through the shards: no shard and no index written.
  std::atomic<bool> cancel{false};
  opt.cancel = &cancel;
  opt.progress = [&](const QuantizeProgress& p) {
    if (p.index == 4) cancel.store(true);
  };
  expect_has(quantize_err(index, out + "/q.safetensors.index.json"), "cancelled");
  EXPECT_TRUE(list_dir(out).empty());
  auto ls = list_dir(in);
  EXPECT_EQ(ls.size(), 4u);  // the three shards and the index, nothing added
}

// dequantize_checkpoint: each layer's restored weight is dequantize_weight of what
// quantize_weight makes of the source weight, rounded to the dtype; everything else as it was.
TEST(DequantizeCheckpoint, RestoresEveryQTypeAndCopiesTheRest) {
  std::string dir = tmp_dir("deq");
  const std::string in = dir + "/in.safetensors";
  auto src = model_tensors();
  write_file(in, src, {{"origin", "test"}});
  Context ctx;
  for (QType q : {QType::convrot8, QType::convrot_int4, QType::convrot4, QType::convrot_fp8,
                  QType::convrot_comfy_w4a4}) {
    SCOPED_TRACE(qtype_name(q));
    QuantizeOptions qo;
    if (q == QType::convrot_comfy_w4a4) qo.format = CheckpointFormat::comfy;
    const std::string mid = dir + "/q.safetensors", out = dir + "/d.safetensors";
    QuantizeReport qr = quantize_checkpoint(in, mid, q, qo, ctx);
    ASSERT_GE(qr.quantized(), 1u);
    for (bool source : {true, false}) {
      DequantizeOptions o;
      o.source_dtype = source;
      o.dtype = FileDType::f32;
      std::vector<QuantizeProgress> seen;
      o.progress = [&](const QuantizeProgress& p) { seen.push_back(p); };
      DequantizeReport r = dequantize_checkpoint(mid, out, o, ctx);
      EXPECT_EQ(seen.size(), qr.tensors_out + 1);
      EXPECT_EQ(r.layers.size(), qr.quantized());
      SafetensorsReader back(out), orig(in), packed(mid);
      // The input's tensors, names and order; no part or marker left; metadata without lowbit's.
      ASSERT_EQ(back.tensors().size(), src.size());
      for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(back.tensors()[i].name, src[i].name);
      EXPECT_EQ(back.metadata().count("lowbit.qtype"), 0u);
      EXPECT_EQ(back.metadata().at("origin"), "test");
      EXPECT_TRUE(find_layer_markers(back).empty());
      for (const Src& t : src) {
        const LayerReport* lr = find_layer(qr, t.name);
        const TensorInfo& b = back.at(t.name);
        if (!lr || !lr->quantized) {  // copied byte for byte
          EXPECT_EQ(std::string(reinterpret_cast<const char*>(back.data(b)), b.nbytes()),
                    std::string(t.bytes.begin(), t.bytes.end()))
              << t.name;
          continue;
        }
        // Restored: the dtype (the source's: bf16 for fc1, f32 otherwise; comfy records none:
        // o.dtype), the shape, and the bits of dequantize_weight(quantize_weight(W)).
        const bool comfy = q == QType::convrot_comfy_w4a4;
        const FileDType want = !source || comfy ? FileDType::f32 : t.dtype;
        EXPECT_EQ(b.dtype, want) << t.name;
        EXPECT_EQ(b.shape, t.shape) << t.name;
        auto w = read_f32(orig, t.name);
        const int64_t o = t.shape[0], k = t.shape[1];
        PackedWeight pw = quantize_weight(make_view(w.data(), DType::f32, {o, k}), q, ctx);
        std::vector<float> d(w.size());
        dequantize_weight(pw, make_view(d.data(), DType::f32, {o, k}), false, ctx);
        for (size_t i = 0; i < d.size(); ++i) {
          float got;
          if (b.dtype == FileDType::f32) {
            std::memcpy(&got, back.data(b) + 4 * i, 4);
            ASSERT_EQ(got, d[i]) << t.name << " [" << i << "]";
          } else {
            uint16_t h;
            std::memcpy(&h, back.data(b) + 2 * i, 2);
            ASSERT_EQ(h, dt::f32_to_bf16(d[i])) << t.name << " [" << i << "]";
          }
        }
        // Its report row: the parts' bytes before, the weight's after.
        for (const auto& rl : r.layers)
          if (rl.name == t.name) {
            EXPECT_EQ(rl.bytes_before, lr->bytes_after);
            EXPECT_EQ(rl.bytes_after, b.nbytes());
            EXPECT_EQ(rl.qtype, qtype_name(q));
          }
      }
      std::remove(out.c_str());
    }
    std::remove(mid.c_str());
  }
  // Errors name the argument and write nothing.
  DequantizeOptions bad;
  bad.source_dtype = false;
  bad.dtype = FileDType::i8;
  EXPECT_NE(
      error_of([&] { dequantize_checkpoint(in, dir + "/x.safetensors", bad, ctx); }).find("dtype"),
      std::string::npos);
  EXPECT_NE(error_of([&] { dequantize_checkpoint(in, in, {}, ctx); }).find("never overwrites"),
            std::string::npos);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"in.safetensors"});
}

TEST(DequantizeCheckpoint, ShardsAndABrokenLayerLeaveNothing) {
  std::string dir = tmp_dir("deq2");
  for (const char* d : {"/in", "/q", "/d"}) mkdir((dir + d).c_str(), 0755);
  const std::string index = write_shards(dir + "/in", "model.safetensors.index.json");
  Context ctx;
  quantize_checkpoint(index, dir + "/q/model.safetensors.index.json", QType::convrot_int4, {}, ctx);
  DequantizeReport r =
      dequantize_checkpoint(dir + "/q", dir + "/d/model.safetensors.index.json", {}, ctx);
  EXPECT_EQ(r.files_out.size(), 3u);
  // The same tensors in the same shards as the original checkpoint, the index agreeing.
  CheckpointFiles before = checkpoint_files(index), after = checkpoint_files(dir + "/d");
  EXPECT_EQ(after.weight_map, before.weight_map);
  EXPECT_EQ(open_checkpoint(after).size(), 3u);
  auto restored = contents(after.files), original = contents(before.files);
  for (const auto& kv : original) {
    const bool was_quantized = kv.first == "blocks.0.attn.qkv.weight" ||
                               kv.first == "blocks.0.mlp.fc1.weight" || kv.first == "head.weight";
    EXPECT_EQ(std::get<1>(restored.at(kv.first)), std::get<1>(kv.second)) << kv.first;
    if (!was_quantized) EXPECT_EQ(restored.at(kv.first), kv.second) << kv.first;
  }
  // A layer whose scales are gone: an error naming it, nothing written.
  const std::string one = dir + "/q1.safetensors";
  quantize_checkpoint(index, one, QType::convrot8, {}, ctx);
  std::vector<Src> kept;
  {
    SafetensorsReader r1(one);
    for (const auto& t : r1.tensors()) {
      if (t.name == "head.weight_scale") continue;
      kept.push_back(
          {t.name, t.dtype, t.shape, std::vector<uint8_t>(r1.data(t), r1.data(t) + t.nbytes())});
    }
  }
  write_file(one, kept);
  const std::string msg =
      error_of([&] { dequantize_checkpoint(one, dir + "/d1.safetensors", {}, ctx); });
  EXPECT_NE(msg.find("'head.weight_scale' is missing"), std::string::npos) << msg;
  EXPECT_EQ(list_dir(dir).size(), 4u);  // in, q, d, q1.safetensors
}

// A marker is untrusted text: a layer shape it claims must be checked against the tensors the
// file holds before anything is sized by it. Each claim below once reached an allocation of the
// claimed size (256 GiB and more: std::bad_alloc or the OOM killer, not an Error) or, multiplied,
// wrapped around int64; now each is an Error naming the part's element count or the size rule.
TEST(LoadQuantizedLayer, MarkerShapesBeyondTheFileAreErrors) {
  std::string dir = tmp_dir("marker");
  const std::string in = dir + "/in.safetensors", q = dir + "/q.safetensors";
  write_file(in, {f32_tensor("l.weight", {16, 256}, 11)});
  Context ctx;
  quantize_checkpoint(in, q, QType::convrot8, {}, ctx);
  std::vector<Src> parts;
  nlohmann::json marker;
  {
    SafetensorsReader r(q);
    for (const auto& t : r.tensors()) {
      std::vector<uint8_t> b(r.data(t), r.data(t) + t.nbytes());
      if (t.name == "l.lowbit_quant")
        marker = nlohmann::json::parse(std::string(b.begin(), b.end()));
      else
        parts.push_back({t.name, t.dtype, t.shape, b});
    }
    // The untouched file loads (the baseline of the cases below).
    const auto markers = find_layer_markers(r);
    ASSERT_EQ(markers.size(), 1u);
    EXPECT_EQ(load_quantized_layer(r, markers[0]).out_features(), 16);
  }
  struct Claim {
    int64_t o, k;
    const char* says;
  };
  const Claim claims[] = {
      {int64_t{1} << 22, int64_t{1} << 16, "codes: element count"},  // passes can_quantize
      {int64_t{1} << 30, int64_t{1} << 16, "layer too large"},
      {int64_t{1} << 60, int64_t{1} << 20, "layer too large"},  // O x K wraps int64
      {16, (int64_t{1} << 31) + 256, "layer too large"},
  };
  for (const Claim& c : claims) {
    nlohmann::json m = marker;
    m["out_features"] = c.o;
    m["in_features"] = c.k;
    m["group"] = c.k;  // convrot8's group is K
    const std::string text = m.dump();
    std::vector<Src> file = parts;
    file.push_back({"l.lowbit_quant",
                    FileDType::u8,
                    {static_cast<int64_t>(text.size())},
                    std::vector<uint8_t>(text.begin(), text.end())});
    const std::string bad = dir + "/bad.safetensors";
    write_file(bad, file);
    SafetensorsReader r(bad);
    const auto markers = find_layer_markers(r);
    ASSERT_EQ(markers.size(), 1u);
    std::string msg = error_of([&] { load_quantized_layer(r, markers[0]); });
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.o << " x " << c.k << ": " << msg;
    msg = error_of([&] { dequantize_checkpoint(bad, dir + "/d.safetensors", {}, ctx); });
    EXPECT_NE(msg, "(no error)") << c.o << " x " << c.k;
  }
  EXPECT_EQ(list_dir(dir).size(), 3u);  // in, q, bad: no dequantized output
}

// Real weights (tests/data/minilm_slice.safetensors, see its README): every qtype quantizes the
// three linear slices; the weight error shrinks as bits grow, and convrot8 stays near 1 %.
TEST(QuantizeCheckpoint, MiniLMWeightErrorPerQType) {
  // The repository root from this file's path (CMake compiles it by absolute path), else the cwd.
  std::string here = __FILE__, in = "tests/data/minilm_slice.safetensors";
  size_t at = here.rfind("tests/unit/");
  if (at != std::string::npos && access((here.substr(0, at) + in).c_str(), R_OK) == 0)
    in = here.substr(0, at) + in;
  ASSERT_EQ(access(in.c_str(), R_OK), 0) << in << " not found: run from the repository root";
  std::string dir = tmp_dir("minilm");
  Context ctx;
  auto mean_err = [&](QType q, size_t* n_quantized) {
    QuantizeOptions opt;
    opt.writer.fsync = false;
    std::string out = dir + "/" + qtype_name(q) + ".safetensors";
    QuantizeReport rep = quantize_checkpoint(in, out, q, opt, ctx);
    {  // Every stored layer loads back into the packed weight with the file's exact bytes.
      SafetensorsReader r(out);
      for (const LayerMarker& m : find_layer_markers(r)) {
        EXPECT_EQ(m.qtype, qtype_name(q));
        PackedWeight pw = load_quantized_layer(r, m);
        EXPECT_EQ(pw.qtype(), q);
        for (const auto& part : pw.tensors()) {
          std::string name = m.prefix + (part.first == "codes"    ? "weight"
                                         : part.first == "scales" ? "weight_scale"
                                                                  : "weight_" + part.first);
          const TensorInfo& t = r.at(name);
          const bool same_size = static_cast<int64_t>(t.nbytes()) ==
                                 dtype_storage_bytes(part.second.dtype, part.second.numel());
          EXPECT_TRUE(same_size) << name;
          if (same_size) EXPECT_EQ(std::memcmp(r.data(t), part.second.data, t.nbytes()), 0) << name;
        }
      }
    }
    std::remove(out.c_str());
    double sum = 0;
    size_t n = 0;
    for (const auto& l : rep.layers)
      if (l.quantized) {
        sum += l.rel_error;
        ++n;
      }
    EXPECT_TRUE(find_layer(rep, "embeddings.word_embeddings.weight") != nullptr);
    EXPECT_FALSE(find_layer(rep, "embeddings.word_embeddings.weight")->quantized);
    *n_quantized = n;
    return n ? sum / n : -1.0;
  };
  size_t n = 0;
  for (QType q : {QType::convrot_bitnet, QType::convrot4}) {  // stored-format round trips
    double e = mean_err(q, &n);
    EXPECT_EQ(n, 3u) << qtype_name(q);
    EXPECT_LT(e, q == QType::convrot4 ? 0.15 : 0.7) << qtype_name(q);
  }
  double e8 = mean_err(QType::convrot8, &n);
  EXPECT_EQ(n, 3u);
  EXPECT_GT(e8, 0.001);
  EXPECT_LT(e8, 0.02);
  double prev = 0;
  for (QType q :
       {QType::convrot_int8, QType::convrot_int7, QType::convrot_int6, QType::convrot_int5,
        QType::convrot_int4, QType::convrot_int3, QType::convrot_int2}) {
    double e = mean_err(q, &n);
    EXPECT_EQ(n, 3u) << qtype_name(q);
    EXPECT_GT(e, prev) << qtype_name(q) << " should lose more than one bit more";
    prev = e;
  }
  EXPECT_LT(prev, 0.7);  // int2 is coarse but still informative
  double ec = mean_err(QType::convrot_comfy_w4a4, &n);
  EXPECT_EQ(n, 1u);  // only K = 1536 passes K % 256
  EXPECT_LT(ec, 0.2);
  double efp8 = mean_err(QType::convrot_fp8, &n);
  EXPECT_EQ(n, 3u);
  EXPECT_LT(efp8, 0.05);
}

}  // namespace
}  // namespace lowbit
