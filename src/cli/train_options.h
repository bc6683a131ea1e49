// The options of `perftrain train` and how they resolve into a TrainConfig:
// device defaults < --config file < shortcut flags (--steps, --model, ...) <
// --set / positional section.key=value. `perftrain config` takes the same
// options and prints the config instead of training with it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/config.h"

namespace CLI {
class App;
}

namespace perftrain::cli {

struct TrainArgs {
  std::string config_file, resume;
  bool resume_given = false;           // --resume was passed (an empty path is an error, not a fresh run)
  std::vector<std::string> overrides;  // --set and positional section.key=value
  std::vector<std::string> shortcuts;  // the shortcut flags as section.key=value, applied before overrides
  std::string device;                  // --device also picks the defaults (GPU or CPU)
};

// Adds train's options to cmd; parsing fills *a.
void add_train_options(CLI::App* cmd, const std::shared_ptr<TrainArgs>& a);

// The config the options describe, validated (UsageError naming the key). A
// relative data.path is made absolute against the current directory, so that
// the run's config.toml and checkpoints work from anywhere (--resume too). An
// empty --resume, and --resume with a run.name or run.dir other than the
// run's own, are UsageErrors.
train::TrainConfig resolve_config(const TrainArgs& a);

}  // namespace perftrain::cli
