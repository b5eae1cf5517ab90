// File-system helpers shared by the checkpoint and safetensors tests.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace lowbit {
namespace testing_files {

// The directories tmp_dir made in this process; removed with what they hold when it exits
// (static destruction, after the tests ran), so a run leaves nothing under the temp dir.
struct MadeDirs {
  std::vector<std::string> dirs;
  ~MadeDirs() {
    for (const std::string& d : dirs) {
      std::error_code ec;  // best effort: a directory already gone is fine
      std::filesystem::remove_all(d, ec);
    }
  }
};

// A fresh directory under GoogleTest's temp dir, unique to this process and `name`.
inline std::string tmp_dir(const std::string& prefix, const std::string& name) {
  static MadeDirs made;
  std::string d = testing::TempDir() + prefix + std::to_string(getpid()) + "_" + name;
  mkdir(d.c_str(), 0755);
  made.dirs.push_back(d);
  return d;
}

// Entries of directory `d` (without "." and "..").
inline std::vector<std::string> list_dir(const std::string& d) {
  std::vector<std::string> out;
  DIR* dir = opendir(d.c_str());
  if (!dir) return out;
  while (dirent* e = readdir(dir)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(dir);
  return out;
}

}  // namespace testing_files
}  // namespace lowbit
