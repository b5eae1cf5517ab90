#include <fmt/core.h>

#include <string>

#include "lowbit/lowbit.h"
#include "tools/lowbit/command.h"

LOWBIT_CLI_COMMAND(setup_version) {
  auto* sub = app.add_subcommand("version", "Print the version, the build and the GPUs found");
  sub->callback([] {
    fmt::print("lowbit {}\nbuild: {}\n", lowbit::version_string(), lowbit::build_info());
    int n = lowbit::cuda_device_count();
    if (n == 0) {
      fmt::print("cuda: {}\n", lowbit::cuda_unavailable_reason());
      return;
    }
    for (int i = 0; i < n; ++i) {
      lowbit::DeviceInfo d = lowbit::cuda_device_info(i);
      fmt::print("cuda:{}: {} (sm_{}{}), {} SMs, {:.0f} MB L2, {:.1f} GiB; device code: {}\n", i,
                 d.name, d.sm_major, d.sm_minor, d.multiprocessors, d.l2_bytes / 1e6,
                 d.global_bytes / 1073741824.0,
                 d.code_arch == 0    ? std::string("none for this GPU")
                 : d.code_sm90a      ? std::string("sm_90a")
                                     : "compute_" + std::to_string(d.code_arch) +
                                           (d.code_arch < d.sm_major * 10 + d.sm_minor
                                                ? " (older than the GPU: its fallback paths)"
                                                : ""));
    }
  });
}
