// Class-conditional sample grids from a model: one row per class, DDIM for
// DDPM models and Euler for flow models, with classifier-free guidance. A
// model conditioned on features (cond_dim > 0) samples under the null
// condition (length 0), without guidance: rows are then just more samples.
// The noise comes from its own seeded generator, so grids made at different
// steps of a run start from the same noise and can be compared.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "models/diffusion_model.h"
#include "train/config.h"

namespace perftrain::train {

struct SampleOptions {
  int64_t classes = 10;    // first N classes (capped at the model's)
  int64_t per_class = 8;   // images per class (one grid row)
  int64_t steps = 50;
  double cfg_scale = 4.0;
  uint64_t seed = 0;
  bool bf16 = false;       // autocast the model to bf16 (CUDA)
};

// Returns [classes*per_class, C, H, W] float32 samples in model space.
at::Tensor sample_images(const models::DiffusionModel& model, const TrainConfig& cfg, const SampleOptions& opts,
                         const at::Device& device);
// Samples and writes a PNG grid; latents with C != 1 or 3 show channels 0..2.
void write_sample_grid(const std::string& path, const models::DiffusionModel& model, const TrainConfig& cfg,
                       const SampleOptions& opts, const at::Device& device);

}  // namespace perftrain::train
