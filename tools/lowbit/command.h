// Subcommand registry of the lowbit CLI: each file of tools/lowbit/ registers its subcommand with
//   LOWBIT_CLI_COMMAND(setup_fn) { auto* sub = app.add_subcommand("name", "..."); ... }
#pragma once

#include <CLI/CLI.hpp>

#include <vector>

namespace lowbit {
namespace cli {

using Setup = void (*)(CLI::App& app);
std::vector<Setup>& commands();
struct CommandRegistrar {
  explicit CommandRegistrar(Setup s) { commands().push_back(s); }
};
#define LOWBIT_CLI_COMMAND(fn)                                    \
  static void fn(CLI::App& app);                                  \
  static ::lowbit::cli::CommandRegistrar fn##_registrar_(&fn);    \
  static void fn(CLI::App& app)

}  // namespace cli
}  // namespace lowbit
