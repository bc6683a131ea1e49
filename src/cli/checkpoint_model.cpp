#include "cli/checkpoint_model.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <iostream>

#include "base/error.h"
#include "cli/option_checks.h"
#include "base/fs.h"
#include "compat/compat.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/memory_estimate.h"
#include "train/vae.h"

namespace perftrain::cli {
namespace {

// A weights file, or a run / ckpt / step directory (then its EMA weights).
std::string weights_file(const CheckpointArgs& a) {
  if (fs::is_regular_file(a.ckpt)) return a.ckpt;
  if (!fs::exists(a.ckpt)) throw UsageError("--ckpt " + a.ckpt + " does not exist");
  return train::resolve_checkpoint_dir(a.ckpt) + "/" + a.weights + ".safetensors";
}

// Whether the weights carry the config they were trained with.
bool carries_config(const std::string& path) {
  return io::SafetensorsFile::open(path).metadata().count("perftrain.config") > 0;
}

}  // namespace

void add_checkpoint_options(CLI::App* cmd, CheckpointArgs& a) {
  cmd->add_option("--ckpt", a.ckpt, "weights .safetensors, or a run / ckpt / step directory")->required();
  cmd->add_option("--weights", a.weights, "ema | model (for a directory)");
  cmd->add_option("--config", a.config_file,
                  "TOML config over the one the weights carry (weights without one, e.g. converted from PyTorch, "
                  "need it: the run's config.toml)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", a.overrides, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--device", a.device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

train::TrainConfig checkpoint_config(const CheckpointArgs& a, const std::string& path) {
  train::TrainConfig cfg;
  if (a.config_file.empty() || carries_config(path)) cfg = train::config_from_weights(path);
  else cfg = train::default_config(false);
  if (!a.config_file.empty()) train::apply_toml_file(cfg, a.config_file);
  for (const auto& o : a.overrides) train::apply_override(cfg, o);
  return cfg;
}

CheckpointModel load_checkpoint_model(const CheckpointArgs& a,
                                      const std::function<void(const train::TrainConfig&)>& check) {
  if (a.weights != "ema" && a.weights != "model") throw UsageError("--weights must be ema or model");
  CheckpointModel out;
  out.path = weights_file(a);
  if (fs::is_directory(a.ckpt)) out.run_dir = fs::parent_path(fs::parent_path(train::resolve_checkpoint_dir(a.ckpt)));
  out.cfg = checkpoint_config(a, out.path);
  const bool cuda = a.device == "cuda" || (a.device == "auto" && compat::cuda_available());
  if (a.device == "cuda" && !compat::cuda_available()) throw UsageError("--device cuda but no CUDA GPU is visible");
  out.device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);

  out.cfg.validate();  // every value of the metadata, as a resume checks it
  if (check) check(out.cfg);
  train::check_model_fits(out.cfg.model, train::memory_available_for_training(cuda));
  // Built on the device (its fixed tables too: a single-stream model's rotary
  // tables, which are not weights, would otherwise stay on the CPU and be
  // copied to the GPU on every model call), then the weights copied in.
  out.model = models::build_diffusion_model(out.cfg.model, 0, out.device);
  train::load_weights(out.path, *out.model);
  return out;
}

void add_sampler_options(CLI::App* cmd, SamplerArgs& a) {
  cmd->add_option("--steps", a.steps, "sampler steps")->check(integer_in(1, 100000))->default_str("the run's");
  cmd->add_option("--cfg-scale", a.cfg_scale, "guidance scale")->check(finite_in(0, INFINITY))->default_str("the run's");
  cmd->add_option("--seed", a.seed, "noise seed")->check(integer_in(0, INT64_MAX));
  cmd->add_option("--vae", a.vae,
                  "a latent model's VAE: the diffusers AutoencoderKL folder (config.json, "
                  "diffusion_pytorch_model.safetensors) that decodes its samples to images")
      ->check(printable_text())
      ->default_str("none");
}

train::SampleOptions sampler_options(const SamplerArgs& a, const CheckpointModel& m) {
  train::SampleOptions o;
  o.steps = a.steps > 0 ? a.steps : m.cfg.diffusion.sample_steps;
  o.cfg_scale = a.cfg_scale >= 0 ? a.cfg_scale : m.cfg.diffusion.cfg_scale;
  o.seed = a.seed;
  o.bf16 = m.device.is_cuda() && m.cfg.optim.precision != "fp32";
  if (m.cfg.model.single_stream() && m.cfg.model.cond_dim > 0) o.cfg_scale = 1.0;  // features: null condition, no guidance
  else if (o.cfg_scale != 1.0 && m.cfg.model.class_dropout <= 0)
    throw UsageError("this model was trained without a null class; use --cfg-scale 1");
  if (!a.vae.empty()) o.decoder = train::vae_image_decoder(a.vae, m.cfg, m.device, std::cerr);
  return o;
}

}  // namespace perftrain::cli
