// The options `sample` and `eval` share to name a model and its weights
// (--ckpt, --weights, --config, --set, --device), and the model they load.
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/diffusion_model.h"
#include "train/config.h"
#include "train/sampling.h"

namespace CLI {
class App;
}

namespace perftrain::cli {

struct CheckpointArgs {
  std::string ckpt, weights = "ema", device = "auto";
  std::string config_file;             // --config: over the weights' own config, or instead of none
  std::vector<std::string> overrides;  // --set section.key=value, last word
};

void add_checkpoint_options(CLI::App* cmd, CheckpointArgs& a);

struct CheckpointModel {
  std::string path;     // the weights file
  std::string run_dir;  // the run directory when --ckpt named one (or its ckpt / step directory), else ""
  train::TrainConfig cfg;
  at::Device device = at::Device(at::kCPU);
  std::unique_ptr<models::DiffusionModel> model;
};

// The config the weights were trained with (their metadata) < --config < --set.
train::TrainConfig checkpoint_config(const CheckpointArgs& a, const std::string& weights_path);
// The model with its weights, on the device --device chooses; `check`
// (when given) sees the resolved config before anything is built or loaded.
CheckpointModel load_checkpoint_model(const CheckpointArgs& a,
                                      const std::function<void(const train::TrainConfig&)>& check = {});

// The sampler's options (--steps, --cfg-scale, --seed), the run's values by
// default, and the VAE that decodes a latent model's samples (--vae).
struct SamplerArgs {
  int64_t steps = 0;
  double cfg_scale = -1;
  uint64_t seed = 0;
  std::string vae;
};

void add_sampler_options(CLI::App* cmd, SamplerArgs& a);
// UsageError when guidance is asked of a model trained without a null class;
// with --vae, the VAE loaded and checked against the model (train/vae.h).
train::SampleOptions sampler_options(const SamplerArgs& a, const CheckpointModel& m);

}  // namespace perftrain::cli
