// libFuzzer target for the index of a sharded checkpoint (model.safetensors.index.json): the
// bytes are the index's text, written into a scratch directory that also holds two small shards
// (a.safetensors: tensors "x", "y"; b.safetensors: "z"), a valid safetensors file without the
// extension ("plain") and a subdirectory. checkpoint_files resolves the index (and the directory
// holding it) and open_checkpoint checks it against the shards; each either works or throws
// lowbit::Error. A finding: any other exception, a read outside a buffer (ASan), or a resolved
// shard that is not a *.safetensors file directly in the index's directory (a path the index's
// text could point elsewhere with: '/', "..", an embedded NUL cutting the name short).
// Seeds: tests/fuzz/corpus_index; dictionary tests/fuzz/index.dict.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "lowbit/checkpoint.h"

namespace {

char g_dir[] = "/tmp/lowbit-index-fuzz-XXXXXX";

// Removes the scratch directory at exit (libFuzzer leaves through exit()).
void remove_scratch() {
  const std::string dir = g_dir;
  for (const char* f : {"a.safetensors", "b.safetensors", "plain", "sub/c.safetensors",
                        "model.safetensors.index.json"})
    std::remove((dir + "/" + f).c_str());
  ::rmdir((dir + "/sub").c_str());
  ::rmdir(dir.c_str());
}

std::string make_scratch() {
  if (!::mkdtemp(g_dir)) std::abort();
  std::atexit(remove_scratch);
  const std::string dir = g_dir;
  auto shard = [&](const std::string& name, const std::vector<std::string>& tensors) {
    std::vector<lowbit::TensorSpec> specs;
    for (const std::string& t : tensors) specs.push_back({t, lowbit::FileDType::f32, {2}});
    lowbit::WriterOptions wo;
    wo.fsync = false;
    lowbit::SafetensorsWriter w(dir + "/" + name, specs, {}, wo);
    const float v[2] = {1.f, 2.f};
    for (const std::string& t : tensors) w.write(t, v, sizeof v);
    w.finish();
  };
  shard("a.safetensors", {"x", "y"});
  shard("b.safetensors", {"z"});
  shard("plain.safetensors", {"x", "y"});
  if (std::rename((dir + "/plain.safetensors").c_str(), (dir + "/plain").c_str()) != 0)
    std::abort();
  ::mkdir((dir + "/sub").c_str(), 0755);
  shard("sub/c.safetensors", {"x"});
  return dir;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = make_scratch();
  const std::string index = dir + "/model.safetensors.index.json";
  {
    std::ofstream f(index, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  for (const std::string& path : {index, dir}) {
    try {
      const lowbit::CheckpointFiles files = lowbit::checkpoint_files(path);
      for (const std::string& f : files.files) {
        // Directly in the scratch directory, named *.safetensors, no NUL: what the OS opens is
        // what was checked.
        const std::string name = f.substr(dir.size() + 1);
        if (f.compare(0, dir.size() + 1, dir + "/") != 0 || name.find('/') != std::string::npos ||
            std::strlen(f.c_str()) != f.size() || !ends_with(f, ".safetensors") || name[0] == '.')
          __builtin_trap();
      }
      const auto readers = lowbit::open_checkpoint(files);
      // A checked index names every tensor of every shard, each in the shard it says.
      size_t tensors = 0;
      for (const auto& r : readers) tensors += r.tensors().size();
      if (!files.index.empty() && tensors != files.weight_map.size()) __builtin_trap();
    } catch (const lowbit::Error&) {
    }
  }
  return 0;
}
