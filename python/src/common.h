// Shared helpers of the nanobind module: array-likes (anything nanobind imports through DLPack or
// the buffer protocol) to lowbit::TensorView, zero-copy, strides kept, plus the dtype table.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lowbit/prologue.h"
#include "lowbit/tensor.h"

namespace lowbit {
namespace py {

namespace nb = nanobind;

// An array-like whose storage is reinterpreted as a lowbit dtype: bf16 in a uint16 numpy array,
// e4m3/e5m2 in uint8, e2m1x2/i4x2 in uint8/int8 arrays whose innermost size is half the element
// count. Built by lowbit.typed(array, dtype).
struct Typed {
  nb::object array;
  DType dtype;
};

// "bf16" -> DType::bf16 (also the numpy / torch spellings "bfloat16", "float8_e4m3fn", ...).
DType parse_dtype(const std::string& name);

// Collects the arguments of one call: converts each array-like to a TensorView and keeps the
// imported handles alive until the call returns.
class Args {
 public:
  explicit Args(const char* op) : op_(op) {}
  // An input: read-only arrays accepted.
  TensorView in(nb::handle obj, const char* arg);
  // An output: the array must be writable.
  TensorView out(nb::handle obj, const char* arg);
  // None -> nullopt.
  std::optional<TensorView> in_opt(nb::handle obj, const char* arg);
  std::optional<TensorView> out_opt(nb::handle obj, const char* arg);
  const char* op() const { return op_; }

 private:
  TensorView convert(nb::handle obj, const char* arg, bool writable);
  const char* op_;
  std::vector<nb::ndarray<nb::ro>> keep_ro_;
  std::vector<nb::ndarray<>> keep_rw_;
};

// The optional parts of a Prologue from Python arguments, with the views they point to kept
// here (not copyable: `p` points into the object). fill_prologue reads None as "off"; `prefix`
// goes before the argument names in errors ("q_" for attention's q_norm_weight, ...).
struct PrologueParts {
  Prologue p;
  TensorView norm_weight, weight_rows, mean;
  Rope rope;
  PrologueParts() = default;
  PrologueParts(const PrologueParts&) = delete;
  PrologueParts& operator=(const PrologueParts&) = delete;
};
// check_weight_rows: Prologue::check_weight_rows; norm_scope "head" or "token"
// (Prologue::norm_scope; `op` names the call in its error).
void fill_prologue(Args& args, PrologueParts& pa, nb::handle norm_weight, nb::handle weight_rows,
                   float eps, nb::handle rope, bool rope_interleaved, nb::handle mean,
                   const char* prefix = "", bool check_weight_rows = true,
                   const std::string& norm_scope = "head", const char* op = "");
// Whether any of a prologue's parts was given.
inline bool any_prologue(const PrologueParts& pa) {
  return pa.p.norm_weight || pa.p.rope || pa.p.weight_rows || pa.p.mean;
}

// A Python array over a TensorView's memory (no copy), kept valid by `owner`: a numpy array for
// CPU views, a DLPack-capable nanobind array for CUDA views. Types numpy lacks come back as their
// storage (bf16 -> uint16, e4m3/e5m2 -> uint8, packed 4-bit -> uint8 with the last dim halved).
nb::object to_array(const TensorView& v, nb::handle owner);

// The Context of a call: `stream` is a cudaStream_t as an integer (0 = legacy default stream),
// `threads` the CPU thread count (0 = all).
inline Context make_context(uintptr_t stream, int threads) {
  Context ctx;
  ctx.cuda_stream = reinterpret_cast<void*>(stream);
  ctx.cpu_threads = threads;
  return ctx;
}

// Registration functions, one per bound header; each sets the module attribute has_<family>
// (lowbit.has() reads it, so a build without a family reports it instead of failing on import).
void bind_core(nb::module_& m);
void bind_prologue(nb::module_& m);
void bind_attention(nb::module_& m);
void bind_linear(nb::module_& m);
void bind_decode(nb::module_& m);
void bind_checkpoint(nb::module_& m);

}  // namespace py
}  // namespace lowbit
