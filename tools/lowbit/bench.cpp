// `lowbit bench`: lowbit's main job. Every op family at real model shapes on the best backend
// present, each against its baseline, as one table (or CSV / JSON).
#include <fmt/core.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "bench/bench.h"
#include "lowbit/lowbit.h"
#include "tools/lowbit/command.h"

namespace {

struct BenchOptions {
  std::string backend = "auto";
  std::string op = ".*";
  std::string shape;  // empty: every shape
  bool quick = false, list = false;
  int iters = 30, warmup = 5;
  std::string csv, json;
};

std::string num(double v, const char* f) { return v > 0 ? fmt::format(fmt::runtime(f), v) : "-"; }

void print_table(const std::vector<lowbit::bench::Row>& rows, const std::string& header) {
  fmt::print("{}\n", header);
  fmt::print("{:<10} {:<38} {:<26} {:>10} {:>9} {:>8} {:>9} {:<24} {:>8}  {}\n", "family", "op",
             "shape", "time ms", "GB/s", "TFLOPS", "base ms", "baseline", "speedup", "accuracy");
  fmt::print("{}\n", std::string(170, '-'));
  for (const auto& r : rows) {
    fmt::print("{:<10} {:<38} {:<26} {:>10} {:>9} {:>8} {:>9} {:<24} {:>8}  {}{}\n", r.family, r.op,
               r.shape, num(r.ms, "{:.4f}"), num(r.gbps(), "{:.0f}"), num(r.tflops(), "{:.1f}"),
               num(r.baseline_ms, "{:.4f}"), r.baseline, num(r.speedup(), "{:.2f}x"), r.accuracy,
               r.note.empty() ? "" : "  (" + r.note + ")");
  }
}

}  // namespace

LOWBIT_CLI_COMMAND(setup_bench) {
  auto opt = std::make_shared<BenchOptions>();
  auto* sub = app.add_subcommand(
      "bench", "Time every op family at model shapes against its baseline (the demo's table)");
  sub->add_option("--backend", opt->backend, "auto (CUDA when a GPU is present), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->add_option("--op", opt->op, "Regular expression selecting benchmark names");
  sub->add_option("--shape", opt->shape,
                  "Regular expression selecting shapes (searched in the row's shape, e.g. "
                  "'4096, 64\\)'); the families skip the other shapes");
  sub->add_flag("--quick", opt->quick, "Smaller shapes and fewer iterations");
  sub->add_flag("--list", opt->list, "List benchmark names and exit");
  sub->add_option("--iters", opt->iters, "Timed iterations (median reported)")->check(CLI::Range(1, 100000));
  sub->add_option("--warmup", opt->warmup, "Warm-up iterations")->check(CLI::Range(0, 100000));
  sub->add_option("--csv", opt->csv, "Also write the rows as CSV to this file");
  sub->add_option("--json", opt->json, "Also write the rows as JSON to this file");
  sub->callback([opt] {
    std::regex re(opt->op);
    if (!opt->shape.empty()) {
      try {
        std::regex check(opt->shape);
      } catch (const std::regex_error&) {
        throw lowbit::Error("bench", "--shape",
                            "expected a regular expression, got '" + opt->shape + "'");
      }
    }
    if (opt->list) {
      for (auto& c : lowbit::bench::registry()) fmt::print("{}\n", c->name());
      return;
    }
    lowbit::bench::Env env;
    bool gpu = lowbit::cuda_device_count() > 0;
    if (opt->backend == "cuda" && !gpu)
      throw lowbit::Error("bench", "--backend", "expected a CUDA device, got none: " +
                                                    lowbit::cuda_unavailable_reason());
    env.device = (opt->backend == "cuda" || (opt->backend == "auto" && gpu)) ? lowbit::Device::cuda
                                                                             : lowbit::Device::cpu;
    env.quick = opt->quick || env.device == lowbit::Device::cpu;
    env.iters = opt->iters;
    env.warmup = opt->warmup;
    env.shape_filter = opt->shape;
    std::string header;
    if (env.device == lowbit::Device::cuda) {
      lowbit::DeviceInfo d = lowbit::cuda_device_info(0);
      header = fmt::format("lowbit {} bench on {} (sm_{}{}, {} SMs); median of {} device-event timings, L2 flushed",
                           lowbit::version_string(), d.name, d.sm_major, d.sm_minor, d.multiprocessors, env.iters);
    } else {
      header = fmt::format("lowbit {} bench on the CPU ({} threads; {}); smaller shapes, median of host timings",
                           lowbit::version_string(), std::thread::hardware_concurrency(),
                           gpu ? "CPU chosen" : "no GPU: " + lowbit::cuda_unavailable_reason());
    }
    std::vector<lowbit::bench::Row> rows;
    for (auto& c : lowbit::bench::registry()) {
      if (!std::regex_search(c->name(), re)) continue;
      try {
        auto r = c->run(env);
        rows.insert(rows.end(), r.begin(), r.end());
      } catch (const std::exception& e) {
        lowbit::bench::Row err;
        err.family = c->name();
        err.op = "error";
        err.note = e.what();
        rows.push_back(err);
      }
    }
    print_table(rows, header);
    if (!opt->csv.empty()) {
      std::ofstream f(opt->csv);
      f << "family,op,shape,backend,ms,gbps,tflops,baseline,baseline_ms,speedup,accuracy,note\n";
      for (const auto& r : rows)
        f << fmt::format("{},\"{}\",\"{}\",{},{},{},{},\"{}\",{},{},\"{}\",\"{}\"\n", r.family, r.op,
                         r.shape, r.backend, r.ms, r.gbps(), r.tflops(), r.baseline, r.baseline_ms,
                         r.speedup(), r.accuracy, r.note);
    }
    if (!opt->json.empty()) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& r : rows)
        j.push_back({{"family", r.family}, {"op", r.op}, {"shape", r.shape}, {"backend", r.backend},
                     {"ms", r.ms}, {"gbps", r.gbps()}, {"tflops", r.tflops()},
                     {"baseline", r.baseline}, {"baseline_ms", r.baseline_ms},
                     {"speedup", r.speedup()}, {"accuracy", r.accuracy}, {"note", r.note}});
      std::ofstream(opt->json) << j.dump(2) << "\n";
    }
  });
}
