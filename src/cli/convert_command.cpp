// perftrain convert: weights from a torch.save file, a safetensors file or a
// run directory into perftrain's safetensors (default) or another layout
// (--to), or a DiT as a looped model (--to looped); the work is
// train::run_convert (train/convert.h) and train::run_looped_convert
// (train/looped_convert_driver.h).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/command.h"
#include "cli/option_checks.h"
#include "train/convert.h"
#include "train/looped_convert_driver.h"

namespace perftrain::cli {
namespace {

// What the command's options fill: the plain conversion's, and the ones only
// --to looped takes.
struct ConvertCommandOptions {
  train::ConvertOptions convert;
  std::string shared;                  // --shared (looped)
  std::vector<std::string> overrides;  // --set (looped)
  uint64_t seed = 0;                   // --seed (looped)
  bool looped_only_given = false;
};

void run(const ConvertCommandOptions& o) {
  if (o.convert.to != "looped") {
    if (o.looped_only_given) throw UsageError("--shared, --set and --seed are options of --to looped");
    train::run_convert(o.convert, std::cout);
    return;
  }
  if (!o.convert.hints.model.empty() || o.convert.hints.heads > 0)
    throw UsageError("--model and --heads are for a file without a config; --to looped reads a perftrain DiT's");
  train::LoopedConvertOptions l;
  l.input = o.convert.input, l.out = o.convert.out, l.overrides = o.overrides, l.seed = o.seed;
  if (!o.convert.weights.empty()) l.weights = o.convert.weights;
  if (!o.shared.empty()) l.shared = o.shared;
  train::run_looped_convert(l, std::cout);
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert",
                                 "convert weights: a torch.save state dict (e.g. DiT-XL-2-256x256.pt) to perftrain's "
                                 "safetensors, or weights to diffusers (--to diffusers)");
  auto all = std::make_shared<ConvertCommandOptions>();
  train::ConvertOptions* o = &all->convert;
  cmd->add_option("input", o->input, "a .pt torch.save file, a .safetensors weights file, or a run / ckpt / step directory")
      ->required()
      ->check(printable_text());
  cmd->add_option("--out", o->out,
                  "the file (perftrain) or directory (diffusers) to write; looped: OUT.safetensors, or a new "
                  "directory with model.safetensors and config.toml")
      ->required()
      ->check(printable_text());
  std::string targets;
  for (const auto& t : train::convert_targets())
    targets += (targets.empty() ? "" : ", ") + std::string(t.name) + ": " + t.help;
  targets += ", looped: a trained DiT as a looped model (docs/guide/architectures.md)";
  cmd->add_option("--to", o->to, "the layout to write (" + targets + ")")->capture_default_str()->check(printable_text());
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
  auto* shared = cmd->add_option("--shared", all->shared,
                                 "looped: the shared weights, mean (of the layers each loop replaces) or layer:<i>")
                      ->check(printable_text());
  auto* set = cmd->add_option("--set", all->overrides,
                              "looped: a looped config key, e.g. model.loops=8, model.lora_rank=64, "
                              "model.lora_targets=attn,mlp,adaln (repeatable)")
                  ->check(printable_text());
  auto* seed = cmd->add_option("--seed", all->seed, "looped: seed of the looped model's own new tensors (routers)")
                   ->check(integer_in(0, INT64_MAX));
  cmd->callback([all, shared, set, seed] {
    all->looped_only_given = shared->count() + set->count() + seed->count() > 0;
    run(*all);
  });
}

}  // namespace perftrain::cli
