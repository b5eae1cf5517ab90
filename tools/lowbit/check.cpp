// `lowbit check`: runs the cross-backend harness (the same cases ctest runs).
#include <fmt/core.h>

#include <cstdio>
#include <regex>

#include "lowbit/runtime.h"
#include "tests/harness/harness.h"
#include "tools/lowbit/command.h"

namespace {
struct CheckOptions {
  std::string backend = "all";
  std::string op = ".*";
  bool list = false;
  bool verbose = false;
  std::string shard = "0/1";
};
}  // namespace

LOWBIT_CLI_COMMAND(setup_check) {
  auto opt = std::make_shared<CheckOptions>();
  auto* sub = app.add_subcommand("check", "Run the cross-backend harness against the CPU oracle");
  sub->add_option("--backend", opt->backend, "cpu, cuda or all (cuda skips where there is no GPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "all"}));
  sub->add_option("--op", opt->op, "Regular expression selecting case names (e.g. '^core\\.')");
  sub->add_flag("--list", opt->list, "List the case names and exit");
  sub->add_flag("-v,--verbose", opt->verbose, "Print every case, not only failures and skips");
  sub->add_option("--shard", opt->shard,
                  "I/N: run only the selected cases whose index modulo N is I (run N processes "
                  "with I = 0..N-1 to cover them all)");
  sub->callback([opt] {
    std::regex re(opt->op);
    int shard_i = 0, shard_n = 1;
    char tail = 0;
    if (std::sscanf(opt->shard.c_str(), "%d/%d%c", &shard_i, &shard_n, &tail) != 2 || shard_n < 1 ||
        shard_i < 0 || shard_i >= shard_n)
      throw CLI::ValidationError("--shard",
                                 fmt::format("expected I/N with 0 <= I < N, got '{}'", opt->shard));
    int selected = -1;
    std::vector<lowbit::Device> devices;
    if (opt->backend != "cuda") devices.push_back(lowbit::Device::cpu);
    if (opt->backend != "cpu") devices.push_back(lowbit::Device::cuda);
    int passed = 0, failed = 0, skipped = 0;
    bool cuda_skip_reported = false;
    for (auto& c : lowbit::harness::registry()) {
      if (!std::regex_search(c->name(), re)) continue;
      if (++selected % shard_n != shard_i) continue;
      if (opt->list) {
        fmt::print("{}\n", c->name());
        continue;
      }
      for (lowbit::Device d : devices) {
        lowbit::harness::Result r = lowbit::harness::run_case(*c, d);
        const char* dn = lowbit::device_name(d);
        switch (r.status) {
          case lowbit::harness::Status::pass:
            ++passed;
            if (opt->verbose) fmt::print("PASS {} [{}] ({:.1f} ms)\n", c->name(), dn, r.cpu_ms + r.backend_ms);
            break;
          case lowbit::harness::Status::skip:
            ++skipped;
            if (d == lowbit::Device::cuda && lowbit::cuda_device_count() == 0) {
              if (!cuda_skip_reported) fmt::print("SKIP every [cuda] case: {}\n", r.message);
              cuda_skip_reported = true;
            } else {
              fmt::print("SKIP {} [{}]: {}\n", c->name(), dn, r.message);
            }
            break;
          case lowbit::harness::Status::fail:
            ++failed;
            fmt::print("FAIL {} [{}]: {}\n", c->name(), dn, r.message);
            break;
        }
      }
    }
    if (opt->list) return;
    fmt::print("{} passed, {} failed, {} skipped\n", passed, failed, skipped);
    if (failed) throw CLI::RuntimeError(1);
  });
}
