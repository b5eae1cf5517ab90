// `lowbit inspect FILE [--json]`: the tensors of a safetensors file (dtype, shape, bytes, the
// qtype of quantized layers from their lowbit_quant / comfy_quant markers) and totals.
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
  lowbit::SafetensorsReader r(path);
  auto markers = lowbit::find_layer_markers(r);
  auto qtypes = tensor_qtypes(r, markers);
  std::map<std::string, std::pair<int64_t, uint64_t>> by_dtype;  // count, bytes
  std::map<std::string, int64_t> layers_by_qtype;
  uint64_t total = 0;
  for (const auto& t : r.tensors()) {
    auto& d = by_dtype[lowbit::file_dtype_name(t.dtype)];
    d.first += 1;
    d.second += t.nbytes();
    total += t.nbytes();
  }
  for (const auto& m : markers) layers_by_qtype[m.qtype] += 1;

  if (as_json) {
    nlohmann::ordered_json j;
    j["file"] = path;
    j["file_bytes"] = r.file_bytes();
    j["header_bytes"] = r.header_bytes();
    j["metadata"] = r.metadata();
    nlohmann::ordered_json ts = nlohmann::ordered_json::array();
    for (const auto& t : r.tensors()) {
      nlohmann::ordered_json e;
      e["name"] = t.name;
      e["dtype"] = lowbit::file_dtype_name(t.dtype);
      e["shape"] = t.shape;
      e["bytes"] = t.nbytes();
      e["data_offsets"] = {t.begin, t.end};
      auto q = qtypes.find(t.name);
      e["qtype"] =
          q == qtypes.end() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(q->second);
      ts.push_back(std::move(e));
    }
    j["tensors"] = std::move(ts);
    nlohmann::ordered_json ls = nlohmann::ordered_json::array();
    for (const auto& m : markers) {
      ls.push_back({{"prefix", m.prefix},
                    {"format", m.format},
                    {"qtype", m.qtype},
                    {"rot", m.rot},
                    {"bits", m.bits},
                    {"group", m.group}});
    }
    j["layers"] = std::move(ls);
    nlohmann::ordered_json bd = nlohmann::ordered_json::object();
    for (const auto& kv : by_dtype)
      bd[kv.first] = {{"tensors", kv.second.first}, {"bytes", kv.second.second}};
    j["totals"] = {{"tensors", r.tensors().size()},
                   {"bytes", total},
                   {"by_dtype", bd},
                   {"quantized_layers", layers_by_qtype}};
    fmt::print("{}\n", j.dump(2));
    return;
  }

  fmt::print("{}: {} tensors, {} of data, {}-byte header\n", path, r.tensors().size(),
             human_bytes(static_cast<double>(total)), r.header_bytes());
  for (const auto& kv : r.metadata()) {
    std::string v = kv.second.size() > 100 ? kv.second.substr(0, 97) + "..." : kv.second;
    fmt::print("  metadata {} = {}\n", kv.first, v);
  }
  size_t wname = 4;
  for (const auto& t : r.tensors()) wname = std::max(wname, t.name.size());
  fmt::print("{:<{}}  {:<7}  {:<20}  {:>12}  {}\n", "name", wname, "dtype", "shape", "bytes",
             "qtype");
  for (const auto& t : r.tensors()) {
    auto q = qtypes.find(t.name);
    fmt::print("{:<{}}  {:<7}  {:<20}  {:>12}  {}\n", t.name, wname,
               lowbit::file_dtype_name(t.dtype), shape_string(t.shape), t.nbytes(),
               q == qtypes.end() ? "-" : q->second);
  }
  fmt::print("totals:\n");
  for (const auto& kv : by_dtype)
    fmt::print("  {:<8} {:>6} tensors  {:>12}\n", kv.first, kv.second.first,
               human_bytes(static_cast<double>(kv.second.second)));
  fmt::print("  {:<8} {:>6} tensors  {:>12}\n", "all", r.tensors().size(),
             human_bytes(static_cast<double>(total)));
  for (const auto& kv : layers_by_qtype)
    fmt::print("  quantized layers {}: {}\n", kv.first, kv.second);
}

}  // namespace

LOWBIT_CLI_COMMAND(setup_inspect) {
  auto* sub = app.add_subcommand("inspect", "List the tensors of a safetensors file");
  static std::string path;
  static bool as_json = false;
  sub->add_option("file", path, "safetensors file")->required();
  sub->add_flag("--json", as_json, "print JSON instead of a table");
  sub->callback([] { run_inspect(path, as_json); });
}
