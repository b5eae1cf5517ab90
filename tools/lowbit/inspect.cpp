// `lowbit inspect FILE [--json]`: the tensors of a safetensors file or of a sharded checkpoint
// (dtype, shape, bytes, the shard, the qtype of quantized layers from their lowbit_quant /
// comfy_quant markers) and totals.
#include <fmt/core.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "lowbit/checkpoint.h"
#include "tools/lowbit/command.h"

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  if (s.size() == 1) out += ",";
  return out + ")";
}

// qtype of each tensor that belongs to a quantized layer: {prefix}weight* and the marker.
std::map<std::string, std::string> tensor_qtypes(const lowbit::SafetensorsReader& r,
                                                 const std::vector<lowbit::LayerMarker>& markers) {
  std::map<std::string, std::string> q;
  for (const auto& m : markers) {
    for (const auto& t : r.tensors()) {
      if (t.name.compare(0, m.prefix.size() + 6, m.prefix + "weight") == 0 ||
          t.name == m.prefix + (m.format == "comfy" ? "comfy_quant" : "lowbit_quant"))
        q[t.name] = m.qtype;
    }
  }
  return q;
}

void run_inspect(const std::string& path, bool as_json) {
  const lowbit::CheckpointFiles files = lowbit::checkpoint_files(path);
  const std::vector<lowbit::SafetensorsReader> readers = lowbit::open_checkpoint(files);
  const bool sharded = !files.index.empty();
  std::vector<std::vector<lowbit::LayerMarker>> markers;
  std::map<std::string, std::string> qtypes;
  for (const auto& r : readers) {
    markers.push_back(lowbit::find_layer_markers(r));
    for (const auto& kv : tensor_qtypes(r, markers.back())) qtypes.insert(kv);
  }
  std::map<std::string, std::pair<int64_t, uint64_t>> by_dtype;  // count, bytes
  std::map<std::string, int64_t> layers_by_qtype;
  uint64_t total = 0, file_bytes = 0;
  size_t count = 0;
  for (const auto& r : readers) {
    file_bytes += r.file_bytes();
    count += r.tensors().size();
    for (const auto& t : r.tensors()) {
      auto& d = by_dtype[lowbit::file_dtype_name(t.dtype)];
      d.first += 1;
      d.second += t.nbytes();
      total += t.nbytes();
    }
  }
  for (const auto& ms : markers)
    for (const auto& m : ms) layers_by_qtype[m.qtype] += 1;
  auto shard_of = [](const lowbit::SafetensorsReader& r) {
    const size_t slash = r.path().rfind('/');
    return slash == std::string::npos ? r.path() : r.path().substr(slash + 1);
  };

  if (as_json) {
    nlohmann::ordered_json j;
    j["file"] = sharded ? files.index : readers[0].path();
    j["file_bytes"] = file_bytes;
    if (sharded) {
      j["shards"] = files.files;
    } else {
      j["header_bytes"] = readers[0].header_bytes();
      j["metadata"] = readers[0].metadata();
    }
    nlohmann::ordered_json ts = nlohmann::ordered_json::array();
    for (const auto& r : readers) {
      for (const auto& t : r.tensors()) {
        nlohmann::ordered_json e;
        e["name"] = t.name;
        if (sharded) e["shard"] = shard_of(r);
        e["dtype"] = lowbit::file_dtype_name(t.dtype);
        e["shape"] = t.shape;
        e["bytes"] = t.nbytes();
        e["data_offsets"] = {t.begin, t.end};
        auto q = qtypes.find(t.name);
        e["qtype"] =
            q == qtypes.end() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(q->second);
        ts.push_back(std::move(e));
      }
    }
    j["tensors"] = std::move(ts);
    nlohmann::ordered_json ls = nlohmann::ordered_json::array();
    for (const auto& ms : markers) {
      for (const auto& m : ms) {
        ls.push_back({{"prefix", m.prefix},
                      {"format", m.format},
                      {"qtype", m.qtype},
                      {"rot", m.rot},
                      {"bits", m.bits},
                      {"group", m.group}});
      }
    }
    j["layers"] = std::move(ls);
    nlohmann::ordered_json bd = nlohmann::ordered_json::object();
    for (const auto& kv : by_dtype)
      bd[kv.first] = {{"tensors", kv.second.first}, {"bytes", kv.second.second}};
    j["totals"] = {{"tensors", count},
                   {"bytes", total},
                   {"by_dtype", bd},
                   {"quantized_layers", layers_by_qtype}};
    fmt::print("{}\n", j.dump(2));
    return;
  }

  if (sharded)
    fmt::print("{}: {} shards, {} tensors, {} of data\n", files.index, readers.size(), count,
               human_bytes(static_cast<double>(total)));
  else
    fmt::print("{}: {} tensors, {} of data, {}-byte header\n", readers[0].path(), count,
               human_bytes(static_cast<double>(total)), readers[0].header_bytes());
  for (const auto& r : readers) {
    for (const auto& kv : r.metadata()) {
      std::string v = kv.second.size() > 100 ? kv.second.substr(0, 97) + "..." : kv.second;
      if (sharded)
        fmt::print("  metadata ({}) {} = {}\n", shard_of(r), kv.first, v);
      else
        fmt::print("  metadata {} = {}\n", kv.first, v);
    }
  }
  size_t wname = 4, wshard = 5;
  for (const auto& r : readers) {
    wshard = std::max(wshard, shard_of(r).size());
    for (const auto& t : r.tensors()) wname = std::max(wname, t.name.size());
  }
  const std::string shard_head = sharded ? fmt::format("{:<{}}  ", "shard", wshard) : "";
  fmt::print("{:<{}}  {}{:<7}  {:<20}  {:>12}  {}\n", "name", wname, shard_head, "dtype", "shape",
             "bytes", "qtype");
  for (const auto& r : readers) {
    const std::string shard = sharded ? fmt::format("{:<{}}  ", shard_of(r), wshard) : "";
    for (const auto& t : r.tensors()) {
      auto q = qtypes.find(t.name);
      fmt::print("{:<{}}  {}{:<7}  {:<20}  {:>12}  {}\n", t.name, wname, shard,
                 lowbit::file_dtype_name(t.dtype), shape_string(t.shape), t.nbytes(),
                 q == qtypes.end() ? "-" : q->second);
    }
  }
  fmt::print("totals:\n");
  for (const auto& kv : by_dtype)
    fmt::print("  {:<8} {:>6} tensors  {:>12}\n", kv.first, kv.second.first,
               human_bytes(static_cast<double>(kv.second.second)));
  fmt::print("  {:<8} {:>6} tensors  {:>12}\n", "all", count,
             human_bytes(static_cast<double>(total)));
  for (const auto& kv : layers_by_qtype)
    fmt::print("  quantized layers {}: {}\n", kv.first, kv.second);
}

}  // namespace

LOWBIT_CLI_COMMAND(setup_inspect) {
  auto* sub = app.add_subcommand(
      "inspect", "List the tensors of a safetensors file or of a sharded checkpoint's shards");
  static std::string path;
  static bool as_json = false;
  sub->add_option("file", path,
                  "safetensors file, sharded index (*.safetensors.index.json), or a directory "
                  "holding one of them")
      ->required();
  sub->add_flag("--json", as_json, "print JSON instead of a table");
  sub->callback([] { run_inspect(path, as_json); });
}
