// Per-layer quantization markers ({p}lowbit_quant, {p}comfy_quant) of a safetensors file.
#include <nlohmann/json.hpp>

#include "lowbit/checkpoint.h"
#include "src/core/check.h"

namespace lowbit {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int json_int(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return 0;
  int64_t v = it->get<int64_t>();
  return v >= 0 && v <= (1 << 30) ? static_cast<int>(v) : 0;
}

}  // namespace

std::vector<LayerMarker> find_layer_markers(const SafetensorsReader& file) {
  std::vector<LayerMarker> out;
  for (const TensorInfo& t : file.tensors()) {
    bool lowbit = ends_with(t.name, "lowbit_quant");
    bool comfy = ends_with(t.name, "comfy_quant");
    if (!lowbit && !comfy) continue;
    auto bad = [&](const std::string& why) {
      check::fail("find_layer_markers", file.path().c_str(), "tensor '" + t.name + "': " + why);
    };
    if (t.dtype != FileDType::u8 || t.shape.size() != 1)
      bad(std::string("a quantization marker must be a 1-D U8 tensor, got ") +
          file_dtype_name(t.dtype) + " of rank " + std::to_string(t.shape.size()));
    LayerMarker m;
    m.prefix = t.name.substr(0, t.name.size() - (lowbit ? 12 : 11));
    m.format = lowbit ? "lowbit" : "comfy";
    m.json.assign(reinterpret_cast<const char*>(file.data(t)), t.nbytes());
    nlohmann::json j = nlohmann::json::parse(m.json, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) bad("marker bytes are not a JSON object");
    const char* key = lowbit ? "qtype" : "format";
    auto q = j.find(key);
    if (q == j.end() || !q->is_string())
      bad(std::string("marker JSON has no string \"") + key + "\"");
    m.qtype = q->get<std::string>();
    if (lowbit) {
      m.rot = json_int(j, "rot");
      m.bits = json_int(j, "bits");
      m.group = json_int(j, "group");
    } else {
      if (m.qtype == "convrot_w4a4") {
        m.qtype = "convrotcomfyw4a4";
        m.bits = 4;
      }
      m.rot = json_int(j, "convrot_groupsize");
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace lowbit
