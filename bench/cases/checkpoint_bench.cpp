// CPU rows of the checkpoint family: `quantize_checkpoint` end to end (read, quantize, write)
// on a generated bf16 checkpoint, against the same streaming pass that copies every tensor
// (the I/O floor of the pipeline), in the same run.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "lowbit/checkpoint.h"
#include "lowbit/dtype.h"

namespace lowbit {
namespace bench {
namespace {

// blocks x {qkv (3d, d), proj (d, d), fc1 (4d, d), fc2 (d, 4d)} bf16 weights (N(0, 1/K), 1 % of
// the input channels x20) with f32 biases.
std::string write_checkpoint(const std::string& path, int blocks, int64_t d, uint64_t* weights) {
  std::vector<TensorSpec> plan;
  struct Lin {
    const char* name;
    int64_t o, k;
  } lins[] = {
      {"attn.qkv", 3 * d, d}, {"attn.proj", d, d}, {"mlp.fc1", 4 * d, d}, {"mlp.fc2", d, 4 * d}};
  *weights = 0;
  for (int b = 0; b < blocks; ++b)
    for (const Lin& l : lins) {
      std::string p = "blocks." + std::to_string(b) + "." + l.name;
      plan.push_back({p + ".weight", FileDType::bf16, {l.o, l.k}});
      plan.push_back({p + ".bias", FileDType::f32, {l.o}});
      *weights += static_cast<uint64_t>(l.o * l.k);
    }
  SafetensorsWriter w(path, plan, {}, WriterOptions{false});
  std::mt19937_64 rng(7);
  std::normal_distribution<float> n(0.f, 1.f);
  for (const TensorSpec& s : plan) {
    if (s.shape.size() == 2) {
      const int64_t o = s.shape[0], k = s.shape[1];
      std::vector<float> gain(static_cast<size_t>(k), 1.f / std::sqrt(static_cast<float>(k)));
      for (auto& g : gain)
        if (rng() % 100 == 0) g *= 20.f;
      std::vector<uint16_t> row(static_cast<size_t>(k));
      for (int64_t i = 0; i < o; ++i) {
        for (int64_t j = 0; j < k; ++j) row[j] = dt::f32_to_bf16(n(rng) * gain[j]);
        w.write(s.name, row.data(), row.size() * 2);
      }
    } else {
      std::vector<float> bias(static_cast<size_t>(s.shape[0]));
      for (auto& x : bias) x = 0.02f * n(rng);
      w.write(s.name, bias.data(), bias.size() * 4);
    }
  }
  w.finish();
  return path;
}

double median_ms(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

class QuantizeCheckpointBench : public BenchCase {
 public:
  std::string name() const override { return "checkpoint.cpu.quantize"; }
  std::vector<Row> run(const Env& env) override {
    std::vector<Row> rows;
    if (env.device != Device::cpu) return rows;
    const int blocks = env.quick ? 1 : 2;
    const int64_t d = env.quick ? 512 : 1024;
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = tmp && *tmp ? tmp : "/tmp";
    const std::string tag = std::to_string(getpid());
    const std::string in = dir + "/lowbit_bench_ckpt_" + tag + ".safetensors";
    const std::string out = dir + "/lowbit_bench_ckpt_" + tag + ".out.safetensors";
    uint64_t weights = 0;
    write_checkpoint(in, blocks, d, &weights);
    Context ctx = env.ctx;
    QuantizeOptions copy_opt;
    copy_opt.filter.include = {"<nothing>"};
    copy_opt.writer.fsync = false;
    copy_opt.compute_error = false;
    const int reps = env.quick ? 1 : 3;
    double copy_ms =
        median_ms(reps, [&] { quantize_checkpoint(in, out, QType::convrot8, copy_opt, ctx); });
    for (QType q : {QType::convrot8, QType::convrot_int4, QType::convrot4}) {
      QuantizeOptions opt;
      opt.writer.fsync = false;
      opt.compute_error = false;
      QuantizeReport rep;
      Row r;
      r.family = "checkpoint";
      r.op = std::string("quantize_checkpoint ") + qtype_name(q) + " (read+quantize+write)";
      r.shape = std::to_string(blocks) + " DiT blocks d=" + std::to_string(d) + " bf16, " +
                std::to_string(weights / 1000000) + " M weights";
      r.backend = "cpu";
      r.ms = median_ms(reps, [&] { rep = quantize_checkpoint(in, out, q, opt, ctx); });
      r.bytes = static_cast<double>(rep.file_bytes_in + rep.file_bytes_out);
      r.baseline = "same pass copying every tensor";
      r.baseline_ms = copy_ms;
      opt.compute_error = true;
      rep = quantize_checkpoint(in, out, q, opt, ctx);
      double sum = 0;
      for (const auto& l : rep.layers) sum += l.rel_error;
      char acc[80];
      std::snprintf(acc, sizeof(acc), "mean rel weight err %.5f (%zu layers)",
                    sum / std::max<size_t>(1, rep.layers.size()), rep.layers.size());
      r.accuracy = acc;
      char note[96];
      std::snprintf(note, sizeof(note), "%.1f M weights/s end to end; file %.3fx",
                    static_cast<double>(weights) / (r.ms * 1e-3) / 1e6,
                    static_cast<double>(rep.file_bytes_out) / rep.file_bytes_in);
      r.note = note;
      rows.push_back(r);
    }
    std::remove(in.c_str());
    std::remove(out.c_str());
    return rows;
  }
};

LOWBIT_BENCH_CASES(checkpoint_bench_cases) {
  cases.push_back(std::make_unique<QuantizeCheckpointBench>());
}

}  // namespace
}  // namespace bench
}  // namespace lowbit
