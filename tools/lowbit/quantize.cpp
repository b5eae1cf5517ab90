// `lowbit quantize IN -o OUT --qtype Q [--include GLOB]... [--exclude GLOB]... [--format F]`:
// quantizes the linear weights of a safetensors checkpoint (one file or shards with an index),
// streaming, with a progress bar on a terminal and a summary table (per layer, then per qtype).
// `lowbit dequantize IN -o OUT [--dtype D]`: the quantized layers back to full-precision weights.
#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "lowbit/checkpoint.h"
#include "tools/lowbit/command.h"

namespace {

std::atomic<bool> g_cancel{false};

extern "C" void on_interrupt(int sig) {
  g_cancel.store(true);
  signal(sig, SIG_DFL);  // a second Ctrl-C stops at once (the temporary file may then remain)
}

std::string mib(uint64_t b) { return fmt::format("{:.2f} MiB", b / 1048576.0); }

std::string shape2(const std::vector<int64_t>& s) {
  return s.size() == 2 ? fmt::format("({}, {})", s[0], s[1]) : "?";
}

struct Args {
  std::string in, out, qtype, format = "lowbit";
  std::vector<std::string> include, exclude;
  bool no_error = false, quiet = false, dry_run = false;
  int threads = 0;
};

// A progress bar on stderr when it is a terminal (and not --quiet).
lowbit::ProgressFn progress_bar(bool quiet, std::chrono::steady_clock::time_point t0) {
  if (quiet || !isatty(STDERR_FILENO)) return nullptr;
  return [t0](const lowbit::QuantizeProgress& p) {
    const int width = 30;
    double frac = p.bytes_total ? static_cast<double>(p.bytes_done) / p.bytes_total : 1.0;
    int fill = static_cast<int>(frac * width);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string name = p.name.size() > 40 ? "..." + p.name.substr(p.name.size() - 37) : p.name;
    fmt::print(stderr, "\r[{}{}] {:3.0f}% {}/{} tensors {:.1f}s  {:<40}", std::string(fill, '#'),
               std::string(width - fill, '.'), frac * 100, p.index, p.count, secs, name);
    if (p.index == p.count) fmt::print(stderr, "\n");
  };
}

// Runs f with SIGINT / SIGTERM setting g_cancel (the run then stops and leaves no output).
template <typename F>
auto with_interrupts(F&& f) {
  struct sigaction sa = {};
  sa.sa_handler = on_interrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct Restore {
    ~Restore() {
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
    }
  } restore;
  return f();
}

// Where the output went: one file, or the index and its shards.
void print_destination(const std::string& out, const std::string& index_out, size_t shards) {
  if (!index_out.empty())
    fmt::print("-> {} ({} shards beside it)\n", index_out, shards);
  else
    fmt::print("-> {}\n", out);
}

void run_quantize(const Args& a) {
  lowbit::QType q = lowbit::parse_qtype(a.qtype);
  lowbit::QuantizeOptions opt;
  opt.filter.include = a.include;
  opt.filter.exclude = a.exclude;
  if (a.format == "lowbit") {
    opt.format = lowbit::CheckpointFormat::lowbit;
  } else if (a.format == "comfy") {
    opt.format = lowbit::CheckpointFormat::comfy;
  } else {
    throw lowbit::Error("quantize", "--format", "expected lowbit or comfy, got " + a.format);
  }
  opt.compute_error = !a.no_error;
  opt.dry_run = a.dry_run;
  opt.cancel = &g_cancel;
  auto t0 = std::chrono::steady_clock::now();
  opt.progress = progress_bar(a.quiet, t0);
  lowbit::Context ctx;
  ctx.cpu_threads = a.threads;
  lowbit::QuantizeReport r =
      with_interrupts([&] { return lowbit::quantize_checkpoint(a.in, a.out, q, opt, ctx); });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (!a.quiet && !r.layers.empty()) {
    size_t w = 5;
    for (const auto& l : r.layers) w = std::max(w, l.name.size());
    fmt::print("{:<{}}  {:<14} {:<18} {:>12} {:>12} {:>9}\n", "layer", w, "shape", "qtype / skip",
               "before", "after", "rel err");
    for (const auto& l : r.layers) {
      std::string err = l.rel_error >= 0 ? fmt::format("{:.5f}", l.rel_error) : "-";
      fmt::print("{:<{}}  {:<14} {:<18} {:>12} {:>12} {:>9}{}\n", l.name, w, shape2(l.shape),
                 l.quantized ? l.qtype : "skipped", l.bytes_before, l.bytes_after, err,
                 l.quantized ? "" : "  (" + l.skip_reason + ")");
    }
  }
  // Per qtype: layers, bytes, weight error (mean over layers, and over all weights).
  struct Agg {
    size_t n = 0;
    uint64_t before = 0, after = 0;
    double err_sum = 0, err_max = 0;
    size_t err_n = 0;
  };
  std::map<std::string, Agg> by;
  std::map<std::string, size_t> reasons;
  for (const auto& l : r.layers) {
    Agg& g = by[l.quantized ? l.qtype : "skipped"];
    g.n += 1;
    g.before += l.bytes_before;
    g.after += l.bytes_after;
    if (l.rel_error >= 0) {
      g.err_sum += l.rel_error;
      g.err_max = std::max(g.err_max, l.rel_error);
      g.err_n += 1;
    }
    if (!l.quantized) {
      // Group by reason; the glob of an --exclude is dropped so excluded layers count once.
      std::string reason = l.skip_reason;
      if (reason.rfind("excluded by --exclude", 0) == 0) reason = "excluded by --exclude";
      reasons[reason] += 1;
    }
  }
  fmt::print("\n{:<18} {:>6} {:>14} {:>14} {:>7} {:>10} {:>10}\n", "summary", "layers", "before",
             "after", "ratio", "mean err", "max err");
  for (const auto& kv : by) {
    const Agg& g = kv.second;
    fmt::print("{:<18} {:>6} {:>14} {:>14} {:>7.3f} {:>10} {:>10}\n", kv.first, g.n, mib(g.before),
               mib(g.after), g.before ? static_cast<double>(g.after) / g.before : 0.0,
               g.err_n ? fmt::format("{:.5f}", g.err_sum / g.err_n) : "-",
               g.err_n ? fmt::format("{:.5f}", g.err_max) : "-");
  }
  for (const auto& kv : reasons) fmt::print("  skipped {:>4}: {}\n", kv.second, kv.first);
  const size_t n_in = r.files_in.size(), n_out = r.files_out.size();
  if (a.dry_run) {
    fmt::print(
        "dry run: {} layers would be quantized, {} skipped; tensor data {} -> {} ({:.3f}x); "
        "nothing written\n",
        r.quantized(), r.skipped(), mib(r.data_bytes_in), mib(r.data_bytes_out),
        r.data_bytes_in ? static_cast<double>(r.data_bytes_out) / r.data_bytes_in : 0.0);
    return;
  }
  fmt::print(
      "{} layers quantized, {} skipped, {} other tensors copied; {} {} -> {} ({:.3f}x) "
      "in {:.1f}s\n",
      r.quantized(), r.skipped(), r.tensors_copied - r.skipped(),
      n_in > 1 ? fmt::format("{} shards", n_in) : std::string("file"), mib(r.file_bytes_in),
      mib(r.file_bytes_out),
      r.file_bytes_in ? static_cast<double>(r.file_bytes_out) / r.file_bytes_in : 0.0, secs);
  print_destination(a.out, r.index_out, n_out);
}

}  // namespace

LOWBIT_CLI_COMMAND(setup_quantize) {
  static Args a;
  auto* sub = app.add_subcommand(
      "quantize", "Quantize the linear weights of a safetensors checkpoint (streaming)");
  sub->add_option("input", a.in,
                  "input .safetensors, sharded index (*.safetensors.index.json), or a directory "
                  "holding one of them")
      ->required();
  sub->add_option("-o,--output", a.out,
                  "output .safetensors (one file, also from shards), or *.safetensors.index.json "
                  "(shards of the input's file names beside it); never an input file")
      ->required();
  sub->add_option("--qtype", a.qtype,
                  "convrot8, convrotint2..8, convrotbitnet, convrotcomfyw4a4, convrot4, "
                  "convrotfp8")
      ->required();
  sub->add_option("--include", a.include, "only weights whose name matches this glob (repeatable)");
  sub->add_option("--exclude", a.exclude, "skip weights whose name matches this glob (repeatable)");
  sub->add_option("--format", a.format, "lowbit (every qtype) or comfy (convrotcomfyw4a4)")
      ->capture_default_str();
  sub->add_option("--threads", a.threads, "CPU threads (0 = all)")->capture_default_str();
  sub->add_flag("--no-error", a.no_error, "skip the per-layer weight error (faster)");
  sub->add_flag("--dry-run", a.dry_run,
                "print what would be quantized and the sizes; read no weight, write nothing");
  sub->add_flag("-q,--quiet", a.quiet, "no progress bar and no per-layer table");
  sub->callback([] { run_quantize(a); });
}

namespace {

struct DequantizeArgs {
  std::string in, out, dtype = "source";
  bool quiet = false;
  int threads = 0;
};

void run_dequantize(const DequantizeArgs& a) {
  lowbit::DequantizeOptions opt;
  if (a.dtype != "source") {
    opt.source_dtype = false;
    const std::string up = a.dtype == "f32"    ? "F32"
                           : a.dtype == "bf16" ? "BF16"
                           : a.dtype == "f16"  ? "F16"
                                               : a.dtype;
    if (!lowbit::parse_file_dtype(up, &opt.dtype) ||
        (opt.dtype != lowbit::FileDType::f32 && opt.dtype != lowbit::FileDType::bf16 &&
         opt.dtype != lowbit::FileDType::f16))
      throw lowbit::Error("dequantize", "--dtype",
                          "expected source, f32, bf16 or f16, got " + a.dtype);
  }
  opt.cancel = &g_cancel;
  auto t0 = std::chrono::steady_clock::now();
  opt.progress = progress_bar(a.quiet, t0);
  lowbit::Context ctx;
  ctx.cpu_threads = a.threads;
  lowbit::DequantizeReport r =
      with_interrupts([&] { return lowbit::dequantize_checkpoint(a.in, a.out, opt, ctx); });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.quiet && !r.layers.empty()) {
    size_t w = 5;
    for (const auto& l : r.layers) w = std::max(w, l.name.size());
    fmt::print("{:<{}}  {:<14} {:<18} {:<6} {:>12} {:>12}\n", "layer", w, "shape", "qtype", "dtype",
               "before", "after");
    for (const auto& l : r.layers)
      fmt::print("{:<{}}  {:<14} {:<18} {:<6} {:>12} {:>12}\n", l.name, w, shape2(l.shape), l.qtype,
                 lowbit::file_dtype_name(l.dtype), l.bytes_before, l.bytes_after);
  }
  fmt::print("{} layers restored, {} tensors written; {} -> {} in {:.1f}s\n", r.layers.size(),
             r.tensors_out, mib(r.file_bytes_in), mib(r.file_bytes_out), secs);
  print_destination(a.out, r.index_out, r.files_out.size());
}

}  // namespace

LOWBIT_CLI_COMMAND(setup_dequantize) {
  static DequantizeArgs a;
  auto* sub = app.add_subcommand(
      "dequantize",
      "Restore the quantized layers of a checkpoint to full-precision weights (streaming)");
  sub->add_option("input", a.in,
                  "input .safetensors, sharded index (*.safetensors.index.json), or a directory "
                  "holding one of them")
      ->required();
  sub->add_option("-o,--output", a.out,
                  "output .safetensors (one file), or *.safetensors.index.json (shards of the "
                  "input's file names beside it); never an input file")
      ->required();
  sub->add_option("--dtype", a.dtype,
                  "source (each layer's original dtype from its marker; bf16 for ComfyUI layers), "
                  "f32, bf16 or f16")
      ->capture_default_str();
  sub->add_option("--threads", a.threads, "CPU threads (0 = all)")->capture_default_str();
  sub->add_flag("-q,--quiet", a.quiet, "no progress bar and no per-layer table");
  sub->callback([] { run_dequantize(a); });
}
