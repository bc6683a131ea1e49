// The options perftrain summary and graph share: which model (a name, or a
// config file as train reads it, with --set overrides) and the batch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "train/config.h"

namespace CLI {
class App;
}

namespace perftrain::cli {

struct ViewArgs {
  std::string model;  // positional or --model: a model name ("DiT-XL/2"); empty: the config's
  std::string config_file;
  std::vector<std::string> overrides;  // --set section.key=value
  int64_t batch = 0;                   // 0: the config's optim.batch_size (summary) or 2 (graph)
  std::string out;                     // -o
};

// Adds the model (positional or --model), --config, --set and -o options to cmd.
void add_view_options(CLI::App* cmd, const std::shared_ptr<ViewArgs>& a);

// GPU defaults (train's on a GPU) < --config < the model name (its
// architecture with DiTConfig's image size, channels and classes: 32x32x4
// latents, 1000 classes, as ImageNet 256) < --set; validated.
train::TrainConfig resolve_view_config(const ViewArgs& a);

// Writes text to a.out, or to stdout when it is empty.
void write_view_output(const ViewArgs& a, const std::string& text);

}  // namespace perftrain::cli
