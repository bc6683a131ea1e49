// perftrain models: the named configurations with their sizes.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/option_checks.h"
#include "models/dit_config.h"

namespace perftrain::cli {
namespace {

struct ModelsOptions {
  int64_t image_size = 32, in_channels = 4, num_classes = 1000;
  bool learn_sigma = true, json = false;
};

void list_models(const ModelsOptions& o) {
  nlohmann::json all = nlohmann::json::object();
  if (!o.json)
    std::printf("%-12s %6s %7s %6s %6s %7s %14s %16s\n", "model", "depth", "hidden", "heads", "patch", "tokens",
                "parameters", "GFLOP/img/step");
  // DiT, then the single-stream family (one class token; its tokens column
  // counts the condition token with the image's), then the looped one (its
  // depth counts block applications, its parameters the shared block once).
  for (const auto& name : models::model_names()) {
    auto c = models::model_config(name);
    c.image_size = o.image_size;
    c.in_channels = o.in_channels;
    c.num_classes = o.num_classes;
    c.learn_sigma = o.learn_sigma;
    if (c.image_size % c.patch != 0) continue;
    const double gflop = 3 * c.forward_flops_per_sample() / 1e9;  // forward + 2x backward
    if (o.json) {
      all[name] = {{"params", c.parameter_count()}, {"trainable", c.parameter_count(true)},
                   {"depth", c.depth}, {"hidden", c.hidden}, {"heads", c.heads}, {"patch", c.patch},
                   {"tokens", c.sequence_tokens()}, {"family", c.family}, {"mlp_hidden", c.mlp_hidden()},
                   {"train_gflop_per_image", gflop}};
      if (c.looped())
        all[name].update({{"prelude", c.prelude}, {"shared_group", c.shared_group}, {"loops", c.loops},
                          {"coda", c.coda}, {"loop_block", c.loop_block}});
    } else {
      std::printf("%-12s %6lld %7lld %6lld %6lld %7lld %14lld %16.1f\n", name.c_str(), (long long)c.depth,
                  (long long)c.hidden, (long long)c.heads, (long long)c.patch, (long long)c.sequence_tokens(),
                  (long long)c.parameter_count(), gflop);
    }
  }
  if (o.json) std::cout << all.dump(2) << "\n";
  else
    std::printf("\nfor %lldx%lldx%lld inputs, %lld classes, learn_sigma %s; parameters include DiT's fixed pos_embed;\n"
                "SS-*: single-stream (docs/guide/architectures.md), one class token in its tokens;\n"
                "Looped-*: prelude 2, one shared block applied depth - 4 times, coda 2 (depth: block applications;\n"
                "parameters count the shared block once)\n",
                (long long)o.in_channels, (long long)o.image_size, (long long)o.image_size,
                (long long)o.num_classes, o.learn_sigma ? "on" : "off");
}

}  // namespace

void add_models_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("models", "list the model configurations with parameter counts");
  auto o = std::make_shared<ModelsOptions>();
  cmd->add_option("--image-size", o->image_size, "input height = width")
      ->check(integer_in(1, models::kMaxImageSize));
  cmd->add_option("--in-channels", o->in_channels, "input channels")->check(integer_in(1, models::kMaxInChannels));
  cmd->add_option("--num-classes", o->num_classes, "classes")->check(integer_in(1, models::kMaxNumClasses));
  cmd->add_option("--learn-sigma", o->learn_sigma, "learned variance (doubles output channels)")
      ->check(boolean_text())
      ->default_str(o->learn_sigma ? "true" : "false");
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->callback([o] { list_models(*o); });
}

}  // namespace perftrain::cli
