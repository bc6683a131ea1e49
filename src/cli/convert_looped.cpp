// perftrain convert-looped (to become `perftrain convert --to looped`): a
// trained DiT as a looped model.
#include "cli/convert_looped.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/option_checks.h"

namespace perftrain::cli {

void add_convert_looped_options(CLI::App* cmd, train::LoopedConvertOptions& o) {
  cmd->add_option("source", o.input, "a run, ckpt or step directory, or a weights .safetensors carrying its config")
      ->required()
      ->check(printable_text());
  cmd->add_option("--out", o.out, "OUT.safetensors (the weights, config in their metadata) or a new directory "
                                  "(model.safetensors and config.toml)")
      ->required()
      ->check(printable_text());
  cmd->add_option("--weights", o.weights, "a directory's ema or model weights")->check(CLI::IsMember({"ema", "model"}));
  cmd->add_option("--shared", o.shared, "the shared weights: mean (of the layers each loop replaces) or layer:<i>");
  cmd->add_option("--set", o.overrides,
                  "a looped config key: model.loops=8, model.lora_rank=64, model.lora_targets=attn,mlp,adaln, "
                  "model.prelude, model.coda, model.shared_group, ... (repeatable)");
  cmd->add_option("--seed", o.seed, "seed of the looped model's own new tensors (routers)")->check(integer_in(0, INT64_MAX));
}

int run_convert_looped(const train::LoopedConvertOptions& o) {
  train::run_looped_convert(o, std::cout);
  return 0;
}

void add_convert_looped_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "convert-looped", "a trained DiT as a looped model: shared weights, per-loop LoRA adapters from an SVD "
                        "(docs/guide/architectures.md)");
  auto o = std::make_shared<train::LoopedConvertOptions>();
  add_convert_looped_options(cmd, *o);
  auto to_ptr = std::make_shared<std::string>("looped");
  cmd->add_option("--to", *to_ptr, "the target layout (looped)")->check(CLI::IsMember({"looped"}));
  cmd->callback([o, to_ptr] { run_convert_looped(*o); });  // both live as long as the command
}

}  // namespace perftrain::cli
