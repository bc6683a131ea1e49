// The options perftrain summary and graph share (cli/view_options.h).
#include "cli/view_options.h"

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>

#include "base/error.h"
#include "cli/option_checks.h"
#include "models/dit_config.h"

namespace perftrain::cli {

void add_view_options(CLI::App* cmd, const std::shared_ptr<ViewArgs>& a) {
  cmd->add_option("model,--model", a->model,
                  "model name (perftrain models lists them), positional or --model NAME; default: the config's model")
      ->check(known_model());
  cmd->add_option("-c,--config", a->config_file, "a training config (TOML) whose model and step to describe")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides, "section.key=value over the config (e.g. model.image_size=64)");
  cmd->add_option("-o,--output", a->out, "write to this file instead of stdout");
}

train::TrainConfig resolve_view_config(const ViewArgs& a) {
  train::TrainConfig cfg = train::default_config(/*cuda=*/true);
  if (!a.config_file.empty()) train::apply_toml_file(cfg, a.config_file);
  if (!a.model.empty()) cfg.model = models::model_config(a.model);
  for (const std::string& o : a.overrides) train::apply_override(cfg, o);
  cfg.model.validate();
  return cfg;
}

void write_view_output(const ViewArgs& a, const std::string& text) {
  if (a.out.empty()) {
    std::cout << text << std::flush;
    return;
  }
  std::ofstream f(a.out, std::ios::binary);
  f << text;
  f.close();
  if (!f) throw RuntimeError("cannot write " + a.out);
}

}  // namespace perftrain::cli
