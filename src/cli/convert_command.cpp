// perftrain convert: weights from a torch.save file, a safetensors file or a
// run directory into perftrain's safetensors (default) or another layout
// (--to); the work is train::run_convert (train/convert.h).
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/command.h"
#include "cli/option_checks.h"
#include "train/convert.h"

namespace perftrain::cli {

void add_convert_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert",
                                 "convert weights: a torch.save state dict (e.g. DiT-XL-2-256x256.pt) to perftrain's "
                                 "safetensors, or weights to diffusers (--to diffusers)");
  auto o = std::make_shared<train::ConvertOptions>();
  cmd->add_option("input", o->input, "a .pt torch.save file, a .safetensors weights file, or a run / ckpt / step directory")
      ->required()
      ->check(printable_text());
  cmd->add_option("--out", o->out, "the file (perftrain) or directory (diffusers) to write")
      ->required()
      ->check(printable_text());
  std::string targets;
  for (const auto& t : train::convert_targets())
    targets += (targets.empty() ? "" : ", ") + std::string(t.name) + ": " + t.help;
  cmd->add_option("--to", o->to, "the layout to write (" + targets + ")")->capture_default_str();
  cmd->add_option("--weights", o->weights,
                  "ema | model: which weights of a run directory, or which entry of a torch.save training checkpoint "
                  "(DiT's train.py: {\"model\", \"ema\", ...}); default: EMA")
      ->check(CLI::IsMember({"ema", "model"}));
  cmd->add_option("--model", o->hints.model,
                  "for a file without a config: the registry name to record (and its heads), its width and patch "
                  "those of the shapes")
      ->check(known_model());
  cmd->add_option("--heads", o->hints.heads,
                  "for a file without a config: attention heads (shapes do not show them; default: the registry "
                  "model's of the same depth and width)")
      ->check(integer_in(1, 65536));
  cmd->callback([o] { train::run_convert(*o, std::cout); });
}

}  // namespace perftrain::cli
