// Compile-time dispatch over a declared set of values (STYLE habit 5): one helper instead of a
// macro per parameter. The default branch names the unsupported value.
//
//   dispatch_int<64, 128>(head_dim, "norm_rope_quantize", "x (head dim)", [&](auto D) {
//     launch<decltype(D)::value>(...);
//   });
#pragma once

#include <string>
#include <type_traits>

#include "src/core/check.h"

namespace lowbit {

template <int... Values, typename F>
void dispatch_int(int value, const char* op, const char* arg, F&& f) {
  bool done = false;
  ((value == Values ? (f(std::integral_constant<int, Values>{}), done = true) : false), ...);
  if (!done) {
    std::string allowed;
    ((allowed += (allowed.empty() ? "" : ", ") + std::to_string(Values)), ...);
    check::fail(op, arg, "expected one of {" + allowed + "}, got " + std::to_string(value));
  }
}

}  // namespace lowbit
