#include "tests/harness/harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "lowbit/dtype.h"
#include "lowbit/runtime.h"
#include "src/core/parallel.h"
#include "src/cpu/rows.h"

namespace lowbit {
namespace harness {

namespace {
const DeviceInfo& device0() {
  static const DeviceInfo d = cuda_device_count() > 0 ? cuda_device_info(0) : DeviceInfo{};
  return d;
}
}  // namespace

int cuda_code_arch() { return device0().code_arch; }
bool cuda_code_sm90a() { return device0().code_sm90a; }
std::string cuda_lacks_fp8() {
  const DeviceInfo& d = device0();
  if (d.sm_major * 10 + d.sm_minor < 89) return "e4m3 tensor cores need an sm_89+ GPU";
  if (d.code_arch < 89) return "e4m3 tensor cores need sm_89+ device code (this build's: compute_" +
                               std::to_string(d.code_arch) + ")";
  return "";
}

HostTensor rope_table(int64_t B, int64_t N, int64_t pairs, bool matrix, std::mt19937_64& rng) {
  std::vector<int64_t> shape = {B, N, 1, pairs, 2};
  if (matrix) shape.push_back(2);
  HostTensor t(DType::f32, shape);
  const int64_t start = static_cast<int64_t>(rng() % 4096);
  const int64_t per_pair = matrix ? 4 : 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < pairs; ++p) {
        const double a =
            static_cast<double>(start + b + n) * std::pow(10000.0, -static_cast<double>(p) / pairs);
        const float c = static_cast<float>(std::cos(a)), sn = static_cast<float>(std::sin(a));
        const int64_t at = ((b * N + n) * pairs + p) * per_pair;
        if (matrix) {  // [[cos, -sin], [sin, cos]]: the sine at dim 4's stride from the cosine
          t.set(at + 0, c);
          t.set(at + 1, -sn);
          t.set(at + 2, sn);
          t.set(at + 3, c);
        } else {
          t.set(at + 0, c);
          t.set(at + 1, sn);
        }
      }
  return t;
}

HostTensor norm_rope_f64(const HostTensor& x, const HostTensor* weight, const HostTensor* rows,
                         double eps, const HostTensor* table, bool interleaved, bool token_scope) {
  const int64_t B = x.shape[0], N = x.shape[1], H = x.shape[2], D = x.shape[3];
  HostTensor y(DType::f32, x.shape);
  std::vector<double> r(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      double token_ss = 0;  // over the token's H·D channels (token_scope)
      for (int64_t i = 0; i < H * D; ++i) {
        const double v = x.get((b * N + n) * H * D + i);
        token_ss += v * v;
      }
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * N + n) * H + h) * D;
        double ss = 0;
        for (int64_t d = 0; d < D; ++d) {
          r[d] = x.get(base + d);
          ss += r[d] * r[d];
        }
        if (weight) {
          const double inv = token_scope ? 1.0 / std::sqrt(token_ss / (H * D) + eps)
                                         : 1.0 / std::sqrt(ss / D + eps);
          const int64_t row =
              token_scope ? h : rows ? static_cast<int64_t>(rows->get(n)) : 0;
          for (int64_t d = 0; d < D; ++d) r[d] *= inv * weight->get(row * D + d);
        }
        if (table) {
          const int64_t pairs = table->shape[3], tb = table->shape[0] == 1 ? 0 : b;
          const int64_t per_pair = table->shape.size() == 6 ? 4 : 2;
          const int64_t sin_at = table->shape.size() == 6 ? 2 : 1;  // dim 4's stride
          for (int64_t p = 0; p < pairs; ++p) {
            const int64_t at = ((tb * N + n) * pairs + p) * per_pair;
            const double c = table->get(at), sn = table->get(at + sin_at);
            const int64_t i = interleaved ? 2 * p : p, j = interleaved ? 2 * p + 1 : p + pairs;
            const double a = r[i], o = r[j];
            r[i] = c * a - sn * o;
            r[j] = sn * a + c * o;
          }
        }
        for (int64_t d = 0; d < D; ++d) y.set(base + d, static_cast<float>(r[d]));
      }
    }
  return y;
}

// ---- HostTensor -------------------------------------------------------------------------------

HostTensor::HostTensor(DType dt, std::vector<int64_t> shape_) : dtype(dt), shape(std::move(shape_)) {
  bytes.assign(static_cast<size_t>(dtype_storage_bytes(dt, numel())), 0);
}

TensorView HostTensor::view() {
  return make_view(bytes.data(), dtype, static_cast<int>(shape.size()), shape.data());
}

float HostTensor::get(int64_t i) const {
  const uint8_t* p = bytes.data();
  switch (dtype) {
    case DType::f32: return reinterpret_cast<const float*>(p)[i];
    case DType::f16: return dt::f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return dt::bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::e4m3: return dt::e4m3_to_f32(p[i]);
    case DType::e5m2: return dt::e5m2_to_f32(p[i]);
    case DType::i8: return static_cast<float>(reinterpret_cast<const int8_t*>(p)[i]);
    case DType::u8: return static_cast<float>(p[i]);
    case DType::i32: return static_cast<float>(reinterpret_cast<const int32_t*>(p)[i]);
    case DType::e2m1x2: return dt::e2m1_to_f32(dt::get_nibble(p, i));
    case DType::i4x2: return static_cast<float>(dt::i4_code_to_int(dt::get_nibble(p, i)));
  }
  return 0.f;
}

void HostTensor::set(int64_t i, float v) {
  uint8_t* p = bytes.data();
  switch (dtype) {
    case DType::f32: reinterpret_cast<float*>(p)[i] = v; break;
    case DType::f16: reinterpret_cast<uint16_t*>(p)[i] = dt::f32_to_f16(v); break;
    case DType::bf16: reinterpret_cast<uint16_t*>(p)[i] = dt::f32_to_bf16(v); break;
    case DType::e4m3: p[i] = dt::f32_to_e4m3(v); break;
    case DType::e5m2: p[i] = dt::f32_to_e5m2(v); break;
    case DType::i8: reinterpret_cast<int8_t*>(p)[i] = dt::f32_to_i8(v); break;
    case DType::u8: p[i] = static_cast<uint8_t>(dt::f32_to_int_clamped(v, 0, 255)); break;
    case DType::i32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::e2m1x2:
    case DType::i4x2: {
      uint8_t code = dtype == DType::e2m1x2 ? dt::f32_to_e2m1(v) : dt::f32_to_i4_code(v);
      uint8_t& b = p[i >> 1];
      b = (i & 1) ? static_cast<uint8_t>((b & 0x0f) | (code << 4))
                  : static_cast<uint8_t>((b & 0xf0) | code);
      break;
    }
  }
}

namespace {

// xoshiro256** (Blackman and Vigna), its state from splitmix64 of one seed.
class FastRng {
 public:
  explicit FastRng(uint64_t seed) {
    for (uint64_t& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  // Uniform in [0, 1) from 24 random bits (every value a multiple of 2^-24).
  static float unit(uint32_t bits) { return static_cast<float>(bits >> 8) * 0x1p-24f; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Stores n floats into t (in its dtype, rounded as HostTensor::set does): the float dtypes by the
// CPU backend's row conversions (their bits are dtype.h's: tests/unit/dtype_test.cpp).
void store_floats(HostTensor& t, const std::vector<float>& v) {
  const int64_t n = static_cast<int64_t>(v.size());
  switch (t.dtype) {
    case DType::f32:
    case DType::bf16:
    case DType::f16:
    case DType::e4m3: cpu::rows::store(v.data(), n, t.dtype, t.bytes.data(), 0); return;
    default:
      for (int64_t i = 0; i < n; ++i) t.set(i, v[i]);
  }
}

}  // namespace

namespace {

// Marsaglia and Tsang's ziggurat for N(0, 1) (128 layers; J. Stat. Software 5(8), 2000): most
// draws are one 64-bit number, a table lookup, a multiply and a compare; the layers' wedges and
// the tail beyond r take the exact tests. The layer index and the 32-bit abscissa come from
// different bits of the draw.
class Ziggurat {
 public:
  Ziggurat() {
    const double m1 = 2147483648.0, vn = 9.91256303526217e-3;
    double dn = kR, tn = dn;
    const double q = vn / std::exp(-0.5 * dn * dn);
    kn_[0] = static_cast<uint32_t>((dn / q) * m1);
    kn_[1] = 0;
    wn_[0] = static_cast<float>(q / m1);
    wn_[127] = static_cast<float>(dn / m1);
    fn_[0] = 1.f;
    fn_[127] = static_cast<float>(std::exp(-0.5 * dn * dn));
    for (int i = 126; i >= 1; --i) {
      dn = std::sqrt(-2.0 * std::log(vn / dn + std::exp(-0.5 * dn * dn)));
      kn_[i + 1] = static_cast<uint32_t>((dn / tn) * m1);
      tn = dn;
      fn_[i] = static_cast<float>(std::exp(-0.5 * dn * dn));
      wn_[i] = static_cast<float>(dn / m1);
    }
  }
  float draw(FastRng& r) const {
    for (;;) {
      const uint64_t bits = r.next();
      const int32_t hz = static_cast<int32_t>(static_cast<uint32_t>(bits));
      const int iz = static_cast<int>((bits >> 32) & 127);
      const uint32_t ahz = hz < 0 ? static_cast<uint32_t>(-static_cast<int64_t>(hz))
                                  : static_cast<uint32_t>(hz);
      const float x = static_cast<float>(hz) * wn_[iz];
      if (ahz < kn_[iz]) return x;  // inside the layer's rectangle
      if (iz == 0) {                // the tail beyond r
        float xt, y;
        do {
          xt = -std::log(unit_open(r)) / static_cast<float>(kR);
          y = -std::log(unit_open(r));
        } while (y + y < xt * xt);
        return hz > 0 ? static_cast<float>(kR) + xt : -static_cast<float>(kR) - xt;
      }
      const float u = FastRng::unit(static_cast<uint32_t>(r.next() >> 32));
      if (fn_[iz] + u * (fn_[iz - 1] - fn_[iz]) < std::exp(-0.5f * x * x)) return x;  // wedge
    }
  }

 private:
  static constexpr double kR = 3.442619855899;  // the base layer's edge
  static float unit_open(FastRng& r) {  // (0, 1]
    return static_cast<float>((r.next() >> 40) + 1) * 0x1p-24f;
  }
  uint32_t kn_[128];
  float wn_[128], fn_[128];
};

}  // namespace

std::vector<float> normal_floats(std::mt19937_64& rng, int64_t n, float mean, float stddev) {
  // Blocks of kBlock values, block k from its own generator seeded by (seed, k): the same values
  // whatever the thread count; the blocks on the host's threads.
  static const Ziggurat zig;
  constexpr int64_t kBlock = int64_t{1} << 16;
  const uint64_t seed = rng();
  std::vector<float> v(static_cast<size_t>(n));
  Context ctx;
  cpu::parallel_for((n + kBlock - 1) / kBlock, 1, ctx, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      FastRng r(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(k + 1)));
      float* out = v.data() + k * kBlock;
      const int64_t m = std::min(kBlock, n - k * kBlock);
      for (int64_t i = 0; i < m; ++i) out[i] = mean + stddev * zig.draw(r);
    }
  });
  return v;
}

void HostTensor::fill_normal(std::mt19937_64& rng, float mean, float stddev) {
  store_floats(*this, normal_floats(rng, numel(), mean, stddev));
}

void HostTensor::fill_uniform(std::mt19937_64& rng, float lo, float hi) {
  FastRng r(rng());
  std::vector<float> v(static_cast<size_t>(numel()));
  for (float& x : v) {
    x = lo + (hi - lo) * FastRng::unit(static_cast<uint32_t>(r.next() >> 32));
    if (x >= hi) x = lo;  // (rounding may reach hi; the range is [lo, hi))
  }
  store_floats(*this, v);
}

void HostTensor::fill_random_bytes(std::mt19937_64& rng) {
  FastRng r(rng());
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t w = r.next();
    std::memcpy(bytes.data() + i, &w, std::min<size_t>(8, bytes.size() - i));
  }
}

// ---- registry -----------------------------------------------------------------------------------

std::vector<std::unique_ptr<Case>>& registry() {
  static std::vector<std::unique_ptr<Case>> cases;
  return cases;
}

Registrar::Registrar(void (*fn)(std::vector<std::unique_ptr<Case>>&)) { fn(registry()); }

namespace {

uint64_t run_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("LOWBIT_TEST_SEED"))
      return static_cast<uint64_t>(std::strtoull(s, nullptr, 0));
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}

constexpr size_t kGuard = 256;           // bytes of guard before and after each output
constexpr uint8_t kGuardByte = 0xCD;
constexpr uint8_t kPoison[2] = {0xA5, 0x5A};

bool is_float_dtype(DType d) {
  return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::e4m3 ||
         d == DType::e5m2 || d == DType::e2m1x2;
}

// Bits of element i (packed types: the nibble).
uint32_t element_bits(const HostTensor& t, int64_t i) {
  const uint8_t* p = t.bytes.data();
  switch (dtype_bits(t.dtype)) {
    case 32: { uint32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case 16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
    case 8: return p[i];
    default: return dt::get_nibble(p, i);
  }
}

std::string fmt_index(const std::vector<int64_t>& shape, int64_t linear) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] ? linear % shape[d] : 0;
    linear = shape[d] ? linear / shape[d] : 0;
  }
  std::ostringstream s;
  s << "[";
  for (size_t d = 0; d < idx.size(); ++d) s << (d ? "," : "") << idx[d];
  s << "]";
  return s.str();
}

struct Outputs {
  std::vector<HostTensor> tensors;
  std::string error;  // "" = ok
};

// Runs the case once per poison pattern on `device`; checks guards, full writes, determinism and
// non-finite values. passes 1: one run, guards only (the CPU reference of a CUDA case: the CPU
// run of the same case, harness.cpu.*, checks the oracle's writes and determinism).
Outputs run_on(const Case& c, std::vector<HostTensor>& inputs, const std::vector<OutputSpec>& specs,
               Device device, int passes = 2) {
  Outputs result;
  std::vector<HostTensor> first;
  Context ctx;
  try {
    // Inputs on the device.
    std::vector<Buffer> in_bufs;
    std::vector<TensorView> in_views;
    for (auto& t : inputs) {
      TensorView v = t.view();
      if (device == Device::cuda) {
        in_bufs.emplace_back(Device::cuda, t.bytes.size());
        copy_to_device(in_bufs.back().data(), t.bytes.data(), t.bytes.size(), ctx);
        v.data = in_bufs.back().data();
        v.device = Device::cuda;
      }
      in_views.push_back(v);
    }
    for (int pass = 0; pass < passes; ++pass) {
      std::vector<std::vector<uint8_t>> host(specs.size());
      std::vector<Buffer> bufs;
      std::vector<TensorView> out_views;
      for (size_t k = 0; k < specs.size(); ++k) {
        int64_t n = 1;
        for (int64_t s : specs[k].shape) n *= s;
        size_t body = static_cast<size_t>(dtype_storage_bytes(specs[k].dtype, n));
        host[k].assign(body + 2 * kGuard, kGuardByte);
        std::memset(host[k].data() + kGuard, kPoison[pass], body);
        bufs.emplace_back(device, host[k].size());
        if (device == Device::cuda)
          copy_to_device(bufs.back().data(), host[k].data(), host[k].size(), ctx);
        else
          std::memcpy(bufs.back().data(), host[k].data(), host[k].size());
        out_views.push_back(make_view(static_cast<uint8_t*>(bufs.back().data()) + kGuard,
                                      specs[k].dtype, static_cast<int>(specs[k].shape.size()),
                                      specs[k].shape.data(), device));
      }
      c.run(in_views, out_views, ctx);
      if (device == Device::cuda) synchronize(ctx);
      std::vector<HostTensor> outs;
      for (size_t k = 0; k < specs.size(); ++k) {
        if (device == Device::cuda)
          copy_to_host(host[k].data(), bufs[k].data(), host[k].size(), ctx);
        else
          std::memcpy(host[k].data(), bufs[k].data(), host[k].size());
        size_t body = host[k].size() - 2 * kGuard;
        for (size_t g = 0; g < kGuard; ++g) {
          if (host[k][g] != kGuardByte || host[k][kGuard + body + g] != kGuardByte) {
            result.error = "output '" + specs[k].name + "': out-of-bounds write detected in the " +
                           (host[k][g] != kGuardByte ? "leading" : "trailing") + " guard bytes";
            return result;
          }
        }
        HostTensor t(specs[k].dtype, specs[k].shape);
        std::memcpy(t.bytes.data(), host[k].data() + kGuard, body);
        outs.push_back(std::move(t));
      }
      if (pass == 0) {
        first = std::move(outs);
        continue;
      }
      for (size_t k = 0; k < specs.size(); ++k) {
        const HostTensor& a = first[k];
        const HostTensor& b = outs[k];
        for (int64_t i = 0; i < a.numel(); ++i) {
          if (specs[k].ignore && specs[k].ignore(i)) continue;
          if (element_bits(a, i) != element_bits(b, i)) {
            result.error = "output '" + specs[k].name + "' element " + fmt_index(specs[k].shape, i) +
                           " differs between two runs with different poison: not written, or "
                           "not deterministic";
            return result;
          }
          if (!specs[k].tol.allow_nonfinite && is_float_dtype(specs[k].dtype) &&
              !std::isfinite(a.get(i))) {
            result.error = "output '" + specs[k].name + "' element " + fmt_index(specs[k].shape, i) +
                           " is not finite (" + std::to_string(a.get(i)) + ")";
            return result;
          }
        }
      }
      result.tensors = std::move(first);
    }
    if (passes == 1) result.tensors = std::move(first);
  } catch (const std::exception& e) {
    result.error = std::string("threw: ") + e.what();
  }
  return result;
}

}  // namespace

uint64_t case_seed(const std::string& name) {
  return std::hash<std::string>{}(name) ^ run_seed();
}

std::string compare(const OutputSpec& spec, const HostTensor& ref, const HostTensor& got) {
  const Tolerance& tol = spec.tol;
  int64_t n = ref.numel(), bad = 0, worst_i = -1, code_diffs = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (spec.ignore && spec.ignore(i)) continue;
    if (tol.kind == Tolerance::exact) {
      if (element_bits(ref, i) != element_bits(got, i)) {
        if (bad++ == 0) worst_i = i;
      }
      continue;
    }
    double r = ref.get(i), g = got.get(i);
    if (std::isnan(r) || std::isnan(g) || std::isinf(r) || std::isinf(g)) {
      bool same = (std::isnan(r) && std::isnan(g)) || r == g;
      if (!same && bad++ == 0) worst_i = i;
      continue;
    }
    double d = std::fabs(g - r);
    if (tol.kind == Tolerance::close) {
      double excess = d - (tol.atol + tol.rtol * std::fabs(r));
      if (excess > 0) {
        ++bad;
        if (excess > worst || worst_i < 0) worst = excess, worst_i = i;
      }
    } else {  // codes
      if (d > 0) ++code_diffs;
      if (d > tol.max_code_diff) {
        if (bad++ == 0) worst_i = i;
      }
    }
  }
  std::ostringstream s;
  if (bad > 0) {
    s << "output '" << spec.name << "': " << bad << " of " << n << " elements differ";
    s << "; first/worst at " << fmt_index(spec.shape, worst_i) << ": expected " << ref.get(worst_i)
      << " (bits 0x" << std::hex << element_bits(ref, worst_i) << "), got " << std::dec
      << got.get(worst_i) << " (bits 0x" << std::hex << element_bits(got, worst_i) << ")";
    return s.str();
  }
  if (tol.kind == Tolerance::codes) {
    int64_t allowed = std::max<int64_t>(1, static_cast<int64_t>(tol.max_diff_fraction * n));
    if (tol.max_diff_fraction == 0) allowed = 0;
    if (code_diffs > allowed) {
      s << "output '" << spec.name << "': " << code_diffs << " of " << n
        << " codes differ (allowed " << allowed << ")";
      return s.str();
    }
  }
  return "";
}

std::string accept_rows_as_accurate(const std::string& diff, const OutputSpec& spec,
                                    const HostTensor& ref, const HostTensor& got, int64_t row_len,
                                    const std::function<std::vector<double>()>& exact) {
  const Tolerance& tol = spec.tol;
  const int64_t n = ref.numel();
  if (tol.kind != Tolerance::close || row_len <= 0 || n % row_len != 0 || got.numel() != n)
    return diff;
  const int64_t rows = n / row_len;
  std::vector<int64_t> bad_rows;
  for (int64_t r = 0; r < rows; ++r) {
    bool bad = false;
    for (int64_t i = r * row_len; i < (r + 1) * row_len; ++i) {
      if (spec.ignore && spec.ignore(i)) continue;
      const double a = ref.get(i), g = got.get(i);
      if (!std::isfinite(a) || !std::isfinite(g)) {
        if (!((std::isnan(a) && std::isnan(g)) || a == g)) return diff;  // (a)
        continue;
      }
      if (std::fabs(g - a) > tol.atol + tol.rtol * std::fabs(a)) bad = true;
    }
    if (bad) bad_rows.push_back(r);
  }
  const int64_t allowed = std::max<int64_t>(2, rows / 256);
  std::ostringstream s;
  if (static_cast<int64_t>(bad_rows.size()) > allowed) {  // (b)
    s << diff << " (" << bad_rows.size() << " of " << rows << " rows; at most " << allowed
      << " may be judged by accuracy)";
    return s.str();
  }
  const std::vector<double> x = exact();
  if (static_cast<int64_t>(x.size()) != n) return diff;
  std::string why;
  for (int64_t r : bad_rows) {  // (c)
    double eg = 0, er = 0, nx = 0;
    for (int64_t i = r * row_len; i < (r + 1) * row_len; ++i) {
      if (spec.ignore && spec.ignore(i)) continue;
      const double dg = got.get(i) - x[i], dr = ref.get(i) - x[i];
      eg += dg * dg;
      er += dr * dr;
      nx += x[i] * x[i];
    }
    eg = std::sqrt(eg), er = std::sqrt(er), nx = std::sqrt(nx);
    if (!(eg <= 1.5 * er + 1e-3 * nx)) {
      std::ostringstream w;
      w << "; row " << r << ": error against the exact reference " << eg << ", the oracle's " << er
        << " (|exact| " << nx << ")";
      why += w.str();
    }
  }
  return why.empty() ? std::string() : diff + why;
}

std::string Case::compare_output(size_t k, const std::vector<OutputSpec>& specs,
                                 const std::vector<HostTensor>& inputs,
                                 const std::vector<HostTensor>& ref,
                                 const std::vector<HostTensor>& got) const {
  const std::string diff = compare(specs[k], ref[k], got[k]);
  if (diff.empty() || specs[k].accuracy_row_len <= 0) return diff;
  return accept_rows_as_accurate(diff, specs[k], ref[k], got[k], specs[k].accuracy_row_len,
                                 [&] { return exact_output(k, inputs); });
}

std::vector<double> Case::exact_output(size_t, const std::vector<HostTensor>&) const { return {}; }

Result run_case(const Case& c, Device backend) {
  Result r;
  if (backend == Device::cuda && cuda_device_count() == 0) {
    r.status = Status::skip;
    r.message = "SKIPPED (no GPU): " + cuda_unavailable_reason();
    return r;
  }
  std::string why = c.unsupported(backend);
  if (!why.empty()) {
    r.status = Status::skip;
    r.message = std::string("SKIPPED (unsupported on ") + device_name(backend) + "): " + why;
    return r;
  }
  const uint64_t seed = case_seed(c.name());
  std::mt19937_64 rng(seed);
  std::string seed_note = " [LOWBIT_TEST_SEED=" + std::to_string(run_seed()) + "]";
  std::vector<HostTensor> inputs;
  std::vector<OutputSpec> specs;
  try {
    inputs = c.make_inputs(rng);
    specs = c.outputs();
  } catch (const std::exception& e) {
    r.status = Status::fail;
    r.message = std::string("building inputs threw: ") + e.what();
    return r;
  }
  auto t0 = std::chrono::steady_clock::now();
  Outputs ref = run_on(c, inputs, specs, Device::cpu, backend == Device::cpu ? 2 : 1);
  r.cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!ref.error.empty()) {
    r.status = Status::fail;
    r.message = "cpu: " + ref.error + seed_note;
    return r;
  }
  if (backend == Device::cpu) return r;
  t0 = std::chrono::steady_clock::now();
  Outputs got = run_on(c, inputs, specs, backend);
  r.backend_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!got.error.empty()) {
    r.status = Status::fail;
    r.message = std::string(device_name(backend)) + ": " + got.error + seed_note;
    return r;
  }
  for (size_t k = 0; k < specs.size(); ++k) {
    std::string diff = c.compare_output(k, specs, inputs, ref.tensors, got.tensors);
    if (!diff.empty()) {
      r.status = Status::fail;
      r.message = std::string(device_name(backend)) + " vs cpu: " + diff + seed_note;
      return r;
    }
  }
  return r;
}

}  // namespace harness
}  // namespace lowbit
