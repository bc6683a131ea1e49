// perftrain config: the config `perftrain train` would run with, as TOML (a
// valid --config input), from the same options; nothing runs or is written.
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/command.h"
#include "cli/train_options.h"

namespace perftrain::cli {

void add_config_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "print the resolved training config (TOML) that train would use, "
                                           "without running (same options as train)");
  auto a = std::make_shared<TrainArgs>();
  add_train_options(cmd, a);
  cmd->callback([a] { std::cout << resolve_config(*a).to_toml(); });
}

}  // namespace perftrain::cli
