// perftrain extract: images (an image folder or tar shards) to the latent
// shards the trainer reads, through the user's VAE; the work is
// train::run_extract (train/extract.h).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdint>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/option_checks.h"
#include "train/extract.h"

namespace perftrain::cli {

void add_extract_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("extract", "encode images (an image folder or tar shards) with a diffusers "
                                            "AutoencoderKL into the latent shards training reads (--data latents)");
  auto o = std::make_shared<train::ExtractOptions>();
  auto precision = std::make_shared<std::string>("fp32");
  cmd->add_option("--data-path", o->data_path,
                  "an image folder (one sub-folder per class) or tar shards (shards-{000000..000009}.tar)")
      ->required()
      ->check(printable_text());
  cmd->add_option("--vae", o->vae, "the diffusers AutoencoderKL folder (config.json, diffusion_pytorch_model.safetensors)")
      ->required()
      ->check(printable_text());
  cmd->add_option("--out", o->out, "the directory of latent shards to write (a rerun continues it)")
      ->required()
      ->check(printable_text());
  cmd->add_option("--image-size", o->image_size, "the ADM centre crop's side, in pixels")
      ->capture_default_str()
      ->check(integer_in(1, 16384));
  cmd->add_option("--batch-size", o->batch_size, "images encoded at once")->capture_default_str()->check(integer_in(1, 65536));
  cmd->add_option("--shard-size", o->shard_size, "latents per shard file")->capture_default_str()->check(integer_in(1, 100000000));
  cmd->add_flag("--flip", o->flip, "also write each image's horizontally flipped copy (twice the latents)");
  cmd->add_option("--device", o->device, "auto | cpu | cuda")->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--precision", *precision, "fp32 | bf16: the VAE's (bf16 on CUDA only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--seed", o->seed, "noise seed of the posterior samples")->capture_default_str()->check(integer_in(0, INT64_MAX));
  cmd->callback([o, precision] {
    o->bf16 = *precision == "bf16";
    train::run_extract(*o, std::cout, isatty(STDOUT_FILENO));
  });
}

}  // namespace perftrain::cli
