// perftrain sample: a PNG grid of class-conditional samples from a checkpoint.
#include <CLI/CLI.hpp>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/fs.h"
#include "cli/command.h"
#include "cli/option_checks.h"
#include "compat/compat.h"
#include "io/safetensors.h"
#include "models/diffusion_model.h"
#include "train/checkpoint.h"
#include "train/memory_estimate.h"
#include "train/sampling.h"

namespace perftrain::cli {
namespace {

struct SampleArgs {
  std::string ckpt, out = "samples.png", weights = "ema", device = "auto";
  std::string config_file;             // --config: over the weights' own config, or instead of none
  std::vector<std::string> overrides;  // --set section.key=value, last word
  int64_t classes = 10, per_class = 8, steps = 0;
  double cfg_scale = -1;
  uint64_t seed = 0;
};

// A weights file, or a run / ckpt / step directory (then its EMA weights).
std::string weights_file(const SampleArgs& a) {
  if (fs::is_regular_file(a.ckpt)) return a.ckpt;
  if (!fs::exists(a.ckpt)) throw UsageError("--ckpt " + a.ckpt + " does not exist");
  return train::resolve_checkpoint_dir(a.ckpt) + "/" + a.weights + ".safetensors";
}

// Whether the weights carry the config they were trained with.
bool carries_config(const std::string& path) {
  return io::SafetensorsFile::open(path).metadata().count("perftrain.config") > 0;
}

// The config the weights were trained with (their metadata) < --config <
// --set; weights without metadata take their config from --config.
train::TrainConfig weights_config(const SampleArgs& a, const std::string& path) {
  train::TrainConfig cfg;
  if (a.config_file.empty() || carries_config(path)) cfg = train::config_from_weights(path);
  else cfg = train::default_config(false);
  if (!a.config_file.empty()) train::apply_toml_file(cfg, a.config_file);
  for (const auto& o : a.overrides) train::apply_override(cfg, o);
  return cfg;
}

void run(const SampleArgs& a) {
  if (a.weights != "ema" && a.weights != "model") throw UsageError("--weights must be ema or model");
  const std::string path = weights_file(a);
  train::TrainConfig cfg = weights_config(a, path);
  const bool cuda = a.device == "cuda" || (a.device == "auto" && compat::cuda_available());
  if (a.device == "cuda" && !compat::cuda_available()) throw UsageError("--device cuda but no CUDA GPU is visible");
  const at::Device device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);

  cfg.validate();  // every value of the metadata, as a resume checks it
  train::check_model_fits(cfg.model, train::memory_available_for_training(cuda));
  // Built on the device (its fixed tables too: a single-stream model's rotary
  // tables, which are not weights, would otherwise stay on the CPU and be
  // copied to the GPU on every model call), then the weights copied in.
  const auto built = models::build_diffusion_model(cfg.model, 0, device);
  models::DiffusionModel& model = *built;
  train::load_weights(path, model);

  train::SampleOptions o;
  o.classes = a.classes;
  o.per_class = a.per_class;
  o.steps = a.steps > 0 ? a.steps : cfg.diffusion.sample_steps;
  o.cfg_scale = a.cfg_scale >= 0 ? a.cfg_scale : cfg.diffusion.cfg_scale;
  o.seed = a.seed;
  o.bf16 = cuda && cfg.optim.precision != "fp32";
  if (std::min(o.classes, cfg.model.num_classes) * o.per_class > 65536)
    throw UsageError("--classes x --per-class must be at most 65536 images in a grid");
  if (cfg.model.single_stream() && cfg.model.cond_dim > 0) o.cfg_scale = 1.0;  // features: null condition, no guidance
  else if (o.cfg_scale != 1.0 && cfg.model.class_dropout <= 0)
    throw UsageError("this model was trained without a null class; use --cfg-scale 1");
  train::write_sample_grid(a.out, model, cfg, o, device);
  std::cout << "wrote " << a.out << ": " << std::min(o.classes, cfg.model.num_classes) << " classes x "
            << o.per_class << " samples, " << o.steps << " " << (cfg.diffusion.objective == "flow" ? "Euler" : "DDIM")
            << " steps, guidance " << o.cfg_scale << ", from " << path << "\n";
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "write a PNG grid of class-conditional samples (one row per class)");
  auto a = std::make_shared<SampleArgs>();
  cmd->add_option("--ckpt", a->ckpt, "weights .safetensors, or a run / ckpt / step directory")->required();
  cmd->add_option("--out", a->out, "PNG file to write")->check(printable_text());
  cmd->add_option("--weights", a->weights, "ema | model (for a directory)");
  cmd->add_option("--config", a->config_file,
                  "TOML config over the one the weights carry (weights without one, e.g. converted from PyTorch, "
                  "need it: the run's config.toml)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--classes", a->classes, "the first N classes, one row each")->check(integer_in(1, 65536));
  cmd->add_option("--per-class", a->per_class, "samples per class")->check(integer_in(1, 1024));
  cmd->add_option("--steps", a->steps, "sampler steps")->check(integer_in(1, 100000))->default_str("the run's");
  cmd->add_option("--cfg-scale", a->cfg_scale, "guidance scale")->check(finite_in(0, INFINITY))->default_str("the run's");
  cmd->add_option("--seed", a->seed, "noise seed")->check(integer_in(0, INT64_MAX));
  cmd->add_option("--device", a->device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->callback([a] { run(*a); });
}

}  // namespace perftrain::cli
