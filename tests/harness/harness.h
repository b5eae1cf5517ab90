// The cross-backend harness (STYLE habit 1): every op is a registered Case with an input builder,
// its outputs and their tolerances. The harness runs a case on the CPU (the oracle) and on CUDA
// when present, with guard bytes around each output, poisoned outputs run twice (proving every
// element is written and the op is deterministic), NaN/Inf checks, and a comparison of the CUDA
// outputs against the CPU's. GoogleTest (tests/unit/harness_gtest.cpp) and `lowbit check` both
// run the same registry.
//
// Adding cases: in any file of tests/cases/, write
//   LOWBIT_HARNESS_CASES(my_family_cases) { cases.push_back(std::make_unique<MyCase>(...)); }
// Case names start with their family: core., prologue., attention., linear., decode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lowbit/tensor.h"

namespace lowbit {
namespace harness {

// n values of N(mean, stddev^2), as HostTensor::fill_normal draws them (one draw of rng seeds a
// fast generator).
std::vector<float> normal_floats(std::mt19937_64& rng, int64_t n, float mean = 0.f,
                                 float stddev = 1.f);

// An owning, contiguous host tensor.
struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(DType dt, std::vector<int64_t> shape_);
  int64_t numel() const {  // (inline: loops call it per element)
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  TensorView view();
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
  // Fill helpers (f32/f16/bf16 stored in the tensor's dtype, rounded as dtype.h does). The
  // values come from a fast generator (xoshiro256**) seeded by one draw of rng, normals by
  // Marsaglia and Tsang's ziggurat: reproducible from rng's state, ~10x faster than the standard
  // distributions on mt19937_64 (input generation was most of the harness's CPU time).
  void fill_normal(std::mt19937_64& rng, float mean = 0.f, float stddev = 1.f);
  void fill_uniform(std::mt19937_64& rng, float lo, float hi);
  void fill_random_bytes(std::mt19937_64& rng);
  // Element i as float (f32, f16, bf16, e4m3, e5m2, i8, u8, i32, packed types).
  float get(int64_t i) const;
  void set(int64_t i, float v);
};

struct Tolerance {
  enum Kind { exact, close, codes } kind = exact;
  double atol = 0, rtol = 0;        // close: |got - ref| <= atol + rtol * |ref|
  int max_code_diff = 0;            // codes: integer codes may differ by at most this ...
  double max_diff_fraction = 0;     // ... on at most this fraction of the elements
  bool allow_nonfinite = false;     // outputs may hold NaN/Inf (e.g. LSE -inf)

  static Tolerance bit_exact() { return Tolerance{}; }
  static Tolerance allclose(double atol, double rtol) {
    Tolerance t;
    t.kind = close;
    t.atol = atol;
    t.rtol = rtol;
    return t;
  }
  static Tolerance codes_within(int diff, double fraction) {
    Tolerance t;
    t.kind = codes;
    t.max_code_diff = diff;
    t.max_diff_fraction = fraction;
    return t;
  }
};

struct OutputSpec {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  Tolerance tol;
  // Elements the op is not expected to write (a strided output view inside a larger buffer);
  // null = every element must be written.
  std::function<bool(int64_t)> ignore;
  // > 0: when a `close` comparison fails, rows of this many elements may still be accepted by
  // accuracy against the case's exact reference (accept_rows_as_accurate, Case::exact_output).
  int64_t accuracy_row_len = 0;
};

// The device code the CUDA backend runs on device 0 (lowbit::DeviceInfo::code_arch and
// code_sm90a; 0 / false without a GPU): cases that need an architecture's kernels report
// themselves unsupported where the build or the GPU lacks them. cuda_lacks_fp8(): why e4m3
// tensor-core paths (fp8 P·V, e4m3 weights) cannot run ("" = they can).
int cuda_code_arch();
bool cuda_code_sm90a();
std::string cuda_lacks_fp8();

// RoPE tables as models build them (SPEC §1): angle n * base^(-p / pairs) for token n and pair p,
// (B, N, 1, pairs, 2) holding (cos, sin) or, `matrix`, (B, N, 1, pairs, 2, 2) holding
// [[cos, -sin], [sin, cos]]; f32, a random start token per table.
HostTensor rope_table(int64_t B, int64_t N, int64_t pairs, bool matrix, std::mt19937_64& rng);
// SPEC §1's norm and rotation of x (B, N, H, D) in fp64 (no rounding of the norm output), as f32:
// the exact reference of the rows an attention call with q / k prologues attends with. weight
// (D) or (R, D) with rows (N) int32, or null; table (1|B, N, 1, pairs, 2[, 2]) or null.
// token_scope (NormScope::token): the norm over each token's H·D channels, weight (H·D).
HostTensor norm_rope_f64(const HostTensor& x, const HostTensor* weight, const HostTensor* rows,
                         double eps, const HostTensor* table, bool interleaved,
                         bool token_scope = false);

class Case {
 public:
  virtual ~Case() = default;
  virtual std::string name() const = 0;
  // Why this case cannot run on `device` ("" = it can).
  virtual std::string unsupported(Device) const { return ""; }
  virtual std::vector<HostTensor> make_inputs(std::mt19937_64& rng) const = 0;
  virtual std::vector<OutputSpec> outputs() const = 0;
  // Runs the op: views of the inputs and outputs on the backend's device.
  virtual void run(const std::vector<TensorView>& in, const std::vector<TensorView>& out,
                   Context& ctx) const = 0;
  // Compares output k of a backend (got) with the CPU oracle's (ref); "" when they agree. The
  // default applies the spec's tolerance; a case overrides it when agreement depends on the
  // inputs (e.g. codes that may differ only at exact rounding ties).
  // (With specs[k].accuracy_row_len set, the default also judges failing rows by accuracy.)
  virtual std::string compare_output(size_t k, const std::vector<OutputSpec>& specs,
                                     const std::vector<HostTensor>& inputs,
                                     const std::vector<HostTensor>& ref,
                                     const std::vector<HostTensor>& got) const;
  // An exact (fp64) reference of output k in its element order, computed from the inputs, where
  // the op has one (empty: none).
  virtual std::vector<double> exact_output(size_t k, const std::vector<HostTensor>& inputs) const;
};

// Registry.
std::vector<std::unique_ptr<Case>>& registry();
struct Registrar {
  explicit Registrar(void (*fn)(std::vector<std::unique_ptr<Case>>&));
};
#define LOWBIT_HARNESS_CASES(fn)                                                 \
  static void fn(std::vector<std::unique_ptr<::lowbit::harness::Case>>& cases);  \
  static ::lowbit::harness::Registrar fn##_registrar_(&fn);                       \
  static void fn(std::vector<std::unique_ptr<::lowbit::harness::Case>>& cases)

enum class Status { pass, fail, skip };
struct Result {
  Status status = Status::pass;
  std::string message;  // why it failed or was skipped; worst mismatch when it passed
  double cpu_ms = 0, backend_ms = 0;
};

// Runs `c` on `backend` (cpu: the oracle's own checks; cuda: those plus the comparison).
Result run_case(const Case& c, Device backend);

// The seed a case's inputs are drawn from: the case name hashed with a run seed that is fresh
// each process, or LOWBIT_TEST_SEED when set (failure messages print it, so a failure replays).
uint64_t case_seed(const std::string& name);

// Compare two host tensors under a tolerance; "" when they agree.
std::string compare(const OutputSpec& spec, const HostTensor& ref, const HostTensor& got);

// A second look at a `close` output that failed compare() (`diff` is its message), for ops whose
// backends may legitimately round one intermediate value a step apart from the oracle's (an e4m3
// P in attention: the GPU's ex2.approx against the CPU's exp2) and whose outputs a few such steps
// can move past allclose. The output is seen as rows of `row_len` elements. It is accepted ("")
// only if (a) every element is finite where the oracle's is, and equal to it where not; (b) at
// most max(2, rows / 256) rows hold elements outside the tolerance; (c) each such row is as
// accurate as the oracle's own row against an exact reference: ||got - exact|| <= 1.5 ||ref -
// exact|| + 1e-3 ||exact|| (L2 over the row). `exact` gives the reference in the output's element
// order; it is called only when (a) and (b) hold (empty: no reference, `diff` stands). Otherwise
// `diff` with the rows' figures.
std::string accept_rows_as_accurate(const std::string& diff, const OutputSpec& spec,
                                    const HostTensor& ref, const HostTensor& got, int64_t row_len,
                                    const std::function<std::vector<double>()>& exact);

}  // namespace harness
}  // namespace lowbit
