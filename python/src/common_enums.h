// String <-> enum helpers shared by the bindings: Python passes enum values as their C++ names
// ("thread_q", "bottom_right", "convrot8", "int4"); an unknown name is a lowbit::Error that lists
// the accepted ones.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "lowbit/tensor.h"

namespace lowbit {
namespace py {

template <typename Enum, size_t N>
Enum parse_enum(const char* op, const char* arg, const std::string& name,
                const std::pair<const char*, Enum> (&table)[N]) {
  std::string all;
  for (const auto& e : table) {
    if (name == e.first) return e.second;
    all += std::string(all.empty() ? "" : "/") + e.first;
  }
  throw Error(op, arg, "expected one of " + all + ", got '" + name + "'");
}

}  // namespace py
}  // namespace lowbit
