// Decode rows of `lowbit bench`: split-K decode attention over int4 (4 groups), fp8 and fp16 KV
// caches, contiguous and paged (page 16 and 256), at the model shapes. Each row reports
// the effective bandwidth on the bytes the op must read (K/V rows of every valid key, fp8
// scale/shift words, q and out), its ratio to the copy bandwidth of this run, and the time of
// lowbit's own fp16 path at the same shape (the baseline). The accuracy column (cos and rel L1
// against fp64 attention on the unquantized N(0,1) K/V) is measured on a smaller shape of the same
// head layout. bench/decode_sdpa.py times torch SDPA on the same fp16 cache shapes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "bench/bench.h"
#include "lowbit/decode.h"
#include "lowbit/runtime.h"

namespace lowbit {
namespace bench {
namespace {

struct Shape {
  int64_t B, L, Hq, Hkv, D;
  std::string str() const {
    std::ostringstream s;
    s << "(B=" << B << ", L=" << L << ", Hq=" << Hq << ", Hkv=" << Hkv << ", D=" << D << ")";
    return s.str();
  }
};

// Which CUDA kernel a row times: plan_decode's choice (the bulk-copy kernel where the layout
// allows it) or DecodePlan knobs on top of it. Probe rows (DecodePlan::bulk_probe, NOT attention:
// the roofline of a read pattern over the same bytes; session 11): "probe tma" the int4 g4
// kernel's own tensor-map copies and ring (fp8: its whole-tile copies) without the math, "probe
// flat" one 1-D bulk copy per tile and kind instead of the tensor map, "probe empty" no reads
// (kernel start, partial writes, merge: the fixed cost of a call). `splits` (x 2 / / 2 of
// plan_decode's split count) varies the grid.
// Settled variants have no rows (docs/decode.md has their numbers): session 9 removed "fp8
// shared issue", "int4 g4 pairs" and "last issue"; session 10 "CTA merge" and "run-24 kernel";
// session 11 "int4 g4 run-29 kernel" (bulk_diet off: adopted in run 30, confirmed in run 31) and
// "int4 g4 pairs probe" (the key-pair copies under shared issue: runs 17-30); after run 33 the
// "probe ldg" / "probe lsu" rows, the probe's 2 / 5 stages and 2x / half splits, "int4 g4 2x /
// half splits", "int4 g4 lsu" / "fp8 lsu" (bulk_lsu, deleted) and "fp8 2x / half splits" (half
// adopted by plan_decode for fp8 at B 1; the old count is the "fp8 2x splits" row, which since
// session 33 also times the two CTAs per multiprocessor plan_decode took before at B 64 / B 16).
struct Fmt {
  KvFormat format;
  int n_groups;
  const char* name;
  int probe = 0;   // DecodePlan::bulk_probe
  int splits = 0;  // 0: plan_decode's; 2: twice as many; -2: half as many
  // Shapes (indices into the shape list, bit i = shape i) and layouts (bit 0 contiguous, 1 paged
  // 16, 2 paged 256) the row runs at.
  int shapes = 7, layouts = 7;
  int flat = -1;  // DecodePlan::bulk_flat (-1: plan_decode's)
};

void choose_kernel(DecodePlan& plan, const Fmt& f) {
  plan.bulk_probe = f.probe;
  if (f.flat >= 0) plan.bulk_flat = f.flat;
  if (f.splits) {
    const int64_t len = plan.capacity;
    const int64_t want = f.splits > 0 ? int64_t{plan.n_splits} * f.splits
                                      : std::max<int64_t>(1, plan.n_splits / -f.splits);
    plan.split_size = (len / want + 15) / 16 * 16;
    plan.n_splits = static_cast<int>((len + plan.split_size - 1) / plan.split_size);
    plan.merge_wide = plan.n_splits >= 64;
  }
}

int64_t packed_dim(const Fmt& f, int64_t D) {
  return f.format == KvFormat::int4 ? f.n_groups + D / 8 : f.format == KvFormat::fp8 ? D / 4 : D;
}
DType cache_dtype(const Fmt& f) {
  return f.format == KvFormat::f16 ? DType::f16 : f.format == KvFormat::bf16 ? DType::bf16 : DType::i32;
}

// Fills `bytes` of device (or host) memory with `pattern` repeated (doubling copies).
void fill_tiled(Device dev, void* dst, size_t bytes, const std::vector<uint8_t>& pattern) {
  Context ctx;
  size_t n = std::min(bytes, pattern.size());
  if (dev == Device::cuda) copy_to_device(dst, pattern.data(), n, ctx);
  else std::memcpy(dst, pattern.data(), n);
  while (n < bytes) {
    const size_t m = std::min(n, bytes - n);
    if (dev == Device::cuda) copy_device_to_device(static_cast<char*>(dst) + n, dst, m, ctx);
    else std::memcpy(static_cast<char*>(dst) + n, dst, m);
    n += m;
  }
  if (dev == Device::cuda) synchronize(ctx);
}

// A cache of B sequences of L keys, every key valid. Rows are a tiled pattern of 4096 quantized
// N(0,1) rows (timing only; accuracy uses build_exact below).
struct BenchCache {
  DeviceTensor k, v, kss, vss, bt, seq;
  KvCache c;
};

BenchCache build_cache(Device dev, const Shape& s, const Fmt& f, int page, uint64_t seed) {
  BenchCache bc;
  const int64_t dp = packed_dim(f, s.D);
  const int64_t rows = s.B * s.L;  // pages: B * L / page pages exactly
  std::vector<int64_t> shape = page ? std::vector<int64_t>{rows, s.Hkv, dp}
                                    : std::vector<int64_t>{s.B, s.L, s.Hkv, dp};
  std::vector<int64_t> sshape = page ? std::vector<int64_t>{rows, s.Hkv} : std::vector<int64_t>{s.B, s.L, s.Hkv};
  bc.k = make_empty(dev, cache_dtype(f), shape);
  bc.v = make_empty(dev, cache_dtype(f), shape);
  const int64_t pattern_rows = 4096;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(s.D);
  const size_t row_bytes = static_cast<size_t>(dp) * (f.format == KvFormat::f16 ? 2 : 4);
  std::vector<uint8_t> pat(pattern_rows * row_bytes), spat(pattern_rows * 4);
  for (int64_t r = 0; r < pattern_rows; ++r) {
    for (float& e : x) e = nd(rng);
    uint8_t* row = pat.data() + r * row_bytes;
    if (f.format == KvFormat::f16) {
      for (int64_t d = 0; d < s.D; ++d) {
        const uint16_t h = dt::f32_to_f16(x[d]);
        std::memcpy(row + 2 * d, &h, 2);
      }
    } else if (f.format == KvFormat::int4) {
      kv::quantize_int4_row(x.data(), static_cast<int>(s.D), f.n_groups, reinterpret_cast<uint32_t*>(row));
    } else {
      kv::quantize_fp8_row(x.data(), static_cast<int>(s.D), reinterpret_cast<uint32_t*>(row),
                           reinterpret_cast<uint32_t*>(spat.data() + 4 * r));
    }
  }
  const size_t kv_bytes = static_cast<size_t>(rows * s.Hkv) * row_bytes;
  fill_tiled(dev, bc.k.view.data, kv_bytes, pat);
  fill_tiled(dev, bc.v.view.data, kv_bytes, pat);
  bc.c.format = f.format;
  bc.c.n_groups = f.n_groups;
  bc.c.k = bc.k.view;
  bc.c.v = bc.v.view;
  if (f.format == KvFormat::fp8) {
    bc.kss = make_empty(dev, DType::i32, sshape);
    bc.vss = make_empty(dev, DType::i32, sshape);
    fill_tiled(dev, bc.kss.view.data, static_cast<size_t>(rows * s.Hkv) * 4, spat);
    fill_tiled(dev, bc.vss.view.data, static_cast<size_t>(rows * s.Hkv) * 4, spat);
    bc.c.k_scale_shift = bc.kss.view;
    bc.c.v_scale_shift = bc.vss.view;
  }
  Context ctx;
  if (page) {
    const int64_t per_seq = s.L / page;
    std::vector<int32_t> table(s.B * per_seq);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);  // pages scattered over the pool
    bc.bt = make_empty(dev, DType::i32, {s.B, per_seq});
    if (dev == Device::cuda) copy_to_device(bc.bt.view.data, table.data(), table.size() * 4, ctx);
    else std::memcpy(bc.bt.view.data, table.data(), table.size() * 4);
    bc.c.block_tables = bc.bt.view;
    bc.c.page_size = page;
  }
  std::vector<int32_t> lens(s.B, static_cast<int32_t>(s.L));
  bc.seq = make_empty(dev, DType::i32, {s.B});
  if (dev == Device::cuda) copy_to_device(bc.seq.view.data, lens.data(), lens.size() * 4, ctx);
  else std::memcpy(bc.seq.view.data, lens.data(), lens.size() * 4);
  bc.c.seq_len = bc.seq.view;
  return bc;
}

// Bytes decode attention must move: every valid K/V row (+ fp8 scale/shift), q and out.
double problem_bytes(const Shape& s, const Fmt& f) {
  const double row = static_cast<double>(packed_dim(f, s.D)) * (f.format == KvFormat::f16 ? 2 : 4);
  double b = 2.0 * s.B * s.L * s.Hkv * row;
  if (f.format == KvFormat::fp8) b += 2.0 * s.B * s.L * s.Hkv * 4;
  return b + 2.0 * s.B * s.Hq * s.D * 2;
}

double time_decode(const Env& env, const BenchCache& bc, const Shape& s, const DeviceTensor& q,
                   const DeviceTensor& out, const Fmt& f, int mq = 1) {
  Context ctx = env.ctx;
  DecodePlan plan = plan_decode(bc.c, mq, static_cast<int>(s.Hq), static_cast<int>(s.D), ctx);
  choose_kernel(plan, f);
  Buffer ws(env.device, workspace_bytes(plan));
  return env.time_ms([&] {  // (Mq > 1: causal)
    decode_attention(q.view, bc.c, plan, ws.data(), out.view, nullptr, nullptr, 0.f, mq > 1, ctx);
  });
}

// A timed row's baseline (the configuration's plain f16 row, timed first) and its note.
void finish_row(Row& r, const Fmt& f, double& f16_ms, double copy_gbps) {
  if (f.format == KvFormat::f16 && f.probe == 0 && !f.splits) {
    f16_ms = r.ms;
  } else {
    r.baseline = "lowbit fp16 decode";
    r.baseline_ms = f16_ms;
  }
  std::ostringstream note;
  note.precision(3);
  note << 100.0 * r.gbps() / copy_gbps << "% of copy (" << copy_gbps << " GB/s)";
  r.note = note.str();
}

// cos / rel L1 of decode attention on a quantized cache written by kv_append from N(0,1) K/V,
// against fp64 attention on the unquantized values.
std::string measure_accuracy(Device dev, const Fmt& f, int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t B = 2, L = 2048;
  const int64_t G = Hq / Hkv;
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> nd;
  std::vector<float> kx(B * L * Hkv * D), vx(kx.size()), qx(B * Hq * D);
  for (float& e : kx) e = nd(rng);
  for (float& e : vx) e = nd(rng);
  for (float& e : qx) e = dt::f16_to_f32(dt::f32_to_f16(nd(rng)));
  const Shape s{B, L, Hq, Hkv, D};
  BenchCache bc = build_cache(dev, s, f, 0, 1);
  DeviceTensor kn = make_empty(dev, DType::f32, {B, L, Hkv, D}), vn = make_empty(dev, DType::f32, {B, L, Hkv, D});
  DeviceTensor pos = make_empty(dev, DType::i32, {B});
  DeviceTensor q = make_empty(dev, DType::f16, {B, 1, Hkv, G, D}), out = make_empty(dev, DType::f16, {B, 1, Hkv, G, D});
  std::vector<uint16_t> qh(qx.size());
  for (size_t i = 0; i < qx.size(); ++i) qh[i] = dt::f32_to_f16(qx[i]);
  std::vector<int32_t> zeros(B, 0);
  Context ctx;
  auto put = [&](void* dst, const void* src, size_t bytes) {
    if (dev == Device::cuda) copy_to_device(dst, src, bytes, ctx);
    else std::memcpy(dst, src, bytes);
  };
  put(kn.view.data, kx.data(), kx.size() * 4);
  put(vn.view.data, vx.data(), vx.size() * 4);
  put(pos.view.data, zeros.data(), B * 4);
  put(q.view.data, qh.data(), qh.size() * 2);
  kv_append(bc.c, kn.view, vn.view, pos.view, ctx);
  // The variant's output and, for a non-default pick, plan_decode's kernel's output (bits compared).
  auto run_pick = [&](const Fmt& pick) {
    DecodePlan plan = plan_decode(bc.c, 1, static_cast<int>(Hq), static_cast<int>(D), ctx);
    choose_kernel(plan, pick);
    Buffer ws(dev, workspace_bytes(plan));
    decode_attention(q.view, bc.c, plan, ws.data(), out.view, nullptr, nullptr, 0.f, false, ctx);
    if (dev == Device::cuda) synchronize(ctx);
    return to_host_f32(out.view);
  };
  std::vector<float> got = run_pick(f);
  std::string vs_default;
  if (f.splits || f.flat >= 0) {
    const std::vector<float> def = run_pick(Fmt{f.format, f.n_groups, f.name});
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i)
      max_diff = std::max(max_diff, std::fabs(double(got[i]) - def[i]));
    const size_t n_diff = bits_differ(got, def);
    std::ostringstream d;
    if (n_diff == 0) d << "; bits = default kernel's";
    else d << "; differs from default kernel: " << n_diff << " values, max |d| " << max_diff;
    vs_default = d.str();
  }
  std::vector<double> ref(got.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> p(L);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t g = 0; g < G; ++g) {
        const float* qr = &qx[((b * Hkv + h) * G + g) * D];
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < L; ++j) {
          const float* kr = &kx[((b * L + j) * Hkv + h) * D];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qr[d]) * kr[d];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < L; ++j) sum += (p[j] = std::exp(p[j] - mx));
        double* o = &ref[((b * Hkv + h) * G + g) * D];
        for (int64_t j = 0; j < L; ++j) {
          const float* vr = &vx[((b * L + j) * Hkv + h) * D];
          for (int64_t d = 0; d < D; ++d) o[d] += p[j] / sum * vr[d];
        }
      }
  return accuracy(got, ref).str() + " @(2, 2048)" + vs_default;
}

class DecodeBench : public BenchCase {
 public:
  std::string name() const override { return "decode.attention"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    std::vector<Shape> shapes;
    if (env.device == Device::cuda) {
      shapes = {{64, 8192, 32, 8, 128}, {1, 131072, 32, 8, 128}, {16, 32768, 64, 8, 128}};
    } else {
      shapes = {{2, env.quick ? 256 : 1024, 8, 2, 128}};
    }
    // fp16 first: its time is the baseline of the rows after it. Plain rows: plan_decode's kernel
    // (the bulk-copy kernel; int4 g4 with folded scales and tensor-map tiles under solo issue;
    // fp16 solo issue; fp8 solo issue + folded scales + whole-tile copies; programmatic dependent
    // launches). Rows of settled variants were removed session by session (docs/decode.md keeps
    // their numbers).
    std::vector<Fmt> formats = {{KvFormat::f16, 1, "fp16"},
                                {KvFormat::int4, 4, "int4 g4"},
                                {KvFormat::fp8, 1, "fp8"}};
    if (env.device == Device::cuda) {
      // Session 14 (issue 7): plan_decode's int4 g4 kernel reads its tiles by 1-D bulk copies
      // into an unpadded stage (DecodePlan::bulk_flat 1; session 14's third form since H200 run
      // 53, the only form since session 15); the row: the tensor-map boxes before it (bulk_flat
      // 0), at every shape and layout; the accuracy column says whether the bits equal the
      // default kernel's. (Run 49's "flat xor" row: +6..+9 % over the first form, deleted;
      // session 15 deleted the first form's and the lean shuffles' rows, run 53: 0.1679 / 0.1641
      // ms vs 0.1629 at B 64 contiguous.)
      const KvFormat i4f = KvFormat::int4;
      formats.insert(formats.begin() + 2,
                     Fmt{i4f, 4, "int4 g4 tensor-map boxes (bulk_flat 0)", 0, 0, 7, 7, 0});
      // Session 11 (issue 7): read-pattern probes over the int4 g4 kernel's bytes (and fp8's at
      // B 64 / B 1), the grid and bytes-in-flight variants; shapes bit 0 B 64, 1 B 1, 2 B 16.
      const KvFormat i4 = KvFormat::int4, f8 = KvFormat::fp8;
      formats.push_back({i4, 4, "int4 g4 probe tma (copies only, not attention)", 1, 0, 7, 3});
      formats.push_back({i4, 4, "int4 g4 probe flat (1-D bulk, not attention)", 2, 0, 7, 3});
      formats.push_back({i4, 4, "int4 g4 probe empty (no reads, not attention)", 3, 0, 7, 1});
      formats.push_back({f8, 1, "fp8 probe (copies only, not attention)", 1, 0, 3, 1});
      formats.push_back({f8, 1, "fp8 probe empty (no reads, not attention)", 3, 0, 3, 1});
      // fp8 with twice plan_decode's splits: at B 64 / B 16 (and paged 256) the two CTAs per
      // multiprocessor of plan_decode before session 33 (which takes one where the cache is
      // contiguous or its pages hold >= 64 keys); at B 1 contiguous run 33's 256 splits.
      formats.push_back({f8, 1, "fp8 2x splits", 0, 2, 7, 5});
    }
    const double copy_gbps = env.copy_gbps();
    bool accuracy_done = false;
    for (size_t si = 0; si < shapes.size(); ++si) {
      const Shape& s = shapes[si];
      if (!env.shape_selected(s.str())) continue;
      const int64_t G = s.Hq / s.Hkv;
      DeviceTensor q = make_tensor(env.device, DType::f16, {s.B, 1, s.Hkv, G, s.D}, 5);
      DeviceTensor out = make_empty(env.device, DType::f16, {s.B, 1, s.Hkv, G, s.D});
      for (int page : {0, 16, 256}) {
        double f16_ms = 0;
        const int layout = page == 0 ? 1 : page == 16 ? 2 : 4;
        for (const Fmt& f : formats) {
          if (!(f.shapes >> si & 1) || !(f.layouts & layout)) continue;
          Row r;
          r.family = "decode";
          r.op = std::string("decode_attention ") + f.name + (page ? " paged " + std::to_string(page) : " contiguous");
          r.shape = s.str();
          r.backend = device_name(env.device);
          {
            BenchCache bc = build_cache(env.device, s, f, page, 77);
            r.ms = time_decode(env, bc, s, q, out, f);
          }
          r.bytes = problem_bytes(s, f);
          finish_row(r, f, f16_ms, copy_gbps);
          if (!accuracy_done && page == 0 && f.probe == 0)
            r.accuracy = measure_accuracy(env.device, f, s.Hq, s.Hkv, s.D);
          rows.push_back(r);
        }
        accuracy_done = true;
      }
    }
    return rows;
  }
};

// Session 33: the configurations outside the shapes that users run — speculative /
// multi-token decoding (Mq 2 and 4 query rows per sequence, causal) and head dims 64 and 256 — on
// contiguous caches, against lowbit's fp16 path at the same configuration (bytes as above: the
// cache read once whatever Mq is); session 35: serving batches of short contexts, paged 16.
class DecodeVariantsBench : public BenchCase {
 public:
  std::string name() const override { return "decode.attention.variants"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    struct Config {
      Shape s;
      int mq;
      int page = 0;  // 0: contiguous, else paged (block tables)
    };
    std::vector<Config> configs;
    if (env.device == Device::cuda)
      configs = {{{64, 8192, 32, 8, 128}, 2},
                 {{64, 8192, 32, 8, 128}, 4},
                 {{1, 131072, 32, 8, 128}, 4},
                 {{64, 8192, 32, 8, 64}, 1},
                 {{64, 4096, 16, 8, 256}, 1},
                 {{64, 4096, 16, 4, 256}, 1},
                 {{64, 8192, 64, 8, 128}, 2},
                 // Session 35: serving batches of short contexts in pages of 16 (Llama-3-8B
                 // heads; an MHA model with G 1), where a split's fixed cost weighs the most.
                 {{256, 1024, 32, 8, 128}, 1, 16},
                 {{128, 2048, 32, 8, 128}, 1, 16},
                 {{512, 512, 32, 8, 128}, 1, 16},
                 {{64, 2048, 32, 32, 128}, 1, 16}};
    else
      configs = {{{2, env.quick ? 256 : 1024, 8, 2, 128}, 2}};
    // (+ twice plan_decode's splits at more than 8 rows: plan_decode's grid before session 33)
    const std::vector<Fmt> formats = {{KvFormat::f16, 1, "fp16"},
                                      {KvFormat::int4, 4, "int4 g4"},
                                      {KvFormat::fp8, 1, "fp8"},
                                      {KvFormat::int4, 4, "int4 g4 2x splits", 0, 2},
                                      {KvFormat::fp8, 1, "fp8 2x splits", 0, 2}};
    const double copy_gbps = env.copy_gbps();
    for (const Config& cf : configs) {
      const Shape& s = cf.s;
      const std::string shape = s.str() + " Mq=" + std::to_string(cf.mq) +
                                (cf.page ? " page " + std::to_string(cf.page) : "");
      if (!env.shape_selected(shape)) continue;
      const int64_t G = s.Hq / s.Hkv;
      DeviceTensor q = make_tensor(env.device, DType::f16, {s.B, cf.mq, s.Hkv, G, s.D}, 5);
      DeviceTensor out = make_empty(env.device, DType::f16, {s.B, cf.mq, s.Hkv, G, s.D});
      double f16_ms = 0;
      for (const Fmt& f : formats) {
        if (f.format == KvFormat::int4 && s.D % 32 != 0) continue;
        if (f.splits && cf.mq * G <= 8) continue;
        Row r;
        r.family = "decode";
        r.op = std::string("decode_attention ") + f.name +
               (cf.page ? " paged " + std::to_string(cf.page) : " contiguous") +
               (cf.mq > 1 ? ", causal" : "");
        r.shape = shape;
        r.backend = device_name(env.device);
        {
          BenchCache bc = build_cache(env.device, s, f, cf.page, 77);
          r.ms = time_decode(env, bc, s, q, out, f, cf.mq);
        }
        r.bytes = problem_bytes(s, f) + 2.0 * s.B * (cf.mq - 1) * s.Hq * s.D * 2;
        finish_row(r, f, f16_ms, copy_gbps);
        rows.push_back(r);
      }
    }
    return rows;
  }
};

LOWBIT_BENCH_CASES(decode_bench_cases) {
  cases.push_back(std::make_unique<DecodeBench>());
  cases.push_back(std::make_unique<DecodeVariantsBench>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
