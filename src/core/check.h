// Argument validation used by every op before it touches memory. Each failure throws
// lowbit::Error("op", "argument", "expected ..., got ...").
//
// LOWBIT_CHECK(ok, op, arg, message): throws lowbit::Error(op, arg, message) unless ok. The
// message expression is evaluated only on failure (a macro, as TORCH_CHECK): the messages name
// shapes and values (TensorView::describe's ostringstream, std::to_string), and an eager op used
// to build every one of them on every call (session 22: the attention.host bench family).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "lowbit/tensor.h"

namespace lowbit {
namespace check {

[[noreturn]] void fail(const char* op, const char* arg, const std::string& message);

// "expected 128, got 64"
std::string expected_got(int64_t expected, int64_t got);
std::string expected_got(const std::string& expected, const std::string& got);

void not_null(const char* op, const char* arg, const TensorView& t);
void dtype(const char* op, const char* arg, const TensorView& t, std::initializer_list<DType> ok);
void ndim(const char* op, const char* arg, const TensorView& t, int n);
// shape[dim] == expected
void dim(const char* op, const char* arg, const TensorView& t, int d, int64_t expected);
// Same shape as `ref` (named ref_arg in the message).
void same_shape(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref);
void device(const char* op, const char* arg, const TensorView& t, Device dev);
void same_device(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                 const TensorView& ref);
// stride[-1] == 1 (or the innermost size is 1).
void inner_contiguous(const char* op, const char* arg, const TensorView& t);
void contiguous(const char* op, const char* arg, const TensorView& t);
void aligned(const char* op, const char* arg, const void* p, int bytes);
// lo <= v <= hi
void in_range(const char* op, const char* arg, int64_t v, int64_t lo, int64_t hi);

}  // namespace check
}  // namespace lowbit

#define LOWBIT_CHECK(ok, op, arg, message)                    \
  do {                                                        \
    if (!(ok)) ::lowbit::check::fail((op), (arg), (message)); \
  } while (0)
