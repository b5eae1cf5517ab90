// lowbit: low-bit kernels for transformer inference. `lowbit --help` lists the subcommands.
#include <fmt/core.h>

#include <exception>

#include "lowbit/lowbit.h"
#include "tools/lowbit/command.h"

namespace lowbit {
namespace cli {
std::vector<Setup>& commands() {
  static std::vector<Setup> c;
  return c;
}
}  // namespace cli
}  // namespace lowbit

int main(int argc, char** argv) {
  CLI::App app{"lowbit: 8- and 4-bit kernels for transformer inference (attention prologue, INT8 "
               "attention, rotated quantized linear layers, quantized KV decode)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", lowbit::version_string());
  for (auto setup : lowbit::cli::commands()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const lowbit::Error& e) {
    fmt::print(stderr, "lowbit: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lowbit: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
