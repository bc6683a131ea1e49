// Class-conditional sample grids from a model: one row per class, DDIM for
// DDPM models and Euler for flow models, with classifier-free guidance. A
// model conditioned on features (cond_dim > 0) samples under the null
// condition (length 0), without guidance: rows are then just more samples.
// The noise comes from its own seeded generator, so grids made at different
// steps of a run start from the same noise and can be compared.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

#include "models/diffusion_model.h"
#include "train/config.h"

namespace perftrain::train {

// Turns a latent model's samples into images: a VAE's decoder
// (train/vae.h: image_decoder). Empty for a model of images.
struct ImageDecoder {
  std::function<at::Tensor(const at::Tensor&)> decode;  // model-space latents -> images [N, 3, H, W] in [-1, 1]
  int64_t upscale = 1;    // image pixels per latent pixel along a side
  int64_t channels = 3;   // of the images
  explicit operator bool() const { return static_cast<bool>(decode); }
};

struct SampleOptions {
  int64_t classes = 10;    // first N classes (capped at the model's)
  int64_t per_class = 8;   // images per class (one grid row)
  int64_t steps = 50;
  double cfg_scale = 4.0;
  uint64_t seed = 0;
  bool bf16 = false;       // autocast the model to bf16 (CUDA)
  ImageDecoder decoder;    // latents to images (grids, --npz, eval); empty: the samples are the images
};

// One sample per label (labels: [N] int64; a model conditioned on features
// ignores them): [N, C, H, W] float32 in model space, from noise drawn with
// opts.seed. opts.classes and opts.per_class are not used.
at::Tensor sample_for_labels(const models::DiffusionModel& model, const TrainConfig& cfg, const at::Tensor& labels,
                             const SampleOptions& opts, const at::Device& device);
// sample_for_labels, then through opts.decoder when it has one: images
// [N, C, H, W] float32 in [-1, 1] (up to rounding) for a model of images or with a VAE.
at::Tensor sample_pixels_for_labels(const models::DiffusionModel& model, const TrainConfig& cfg,
                                    const at::Tensor& labels, const SampleOptions& opts, const at::Device& device);
// The side and channels of the images sample_pixels_for_labels makes.
int64_t image_size_of(const TrainConfig& cfg, const SampleOptions& opts);
int64_t image_channels_of(const TrainConfig& cfg, const SampleOptions& opts);
// Returns [classes*per_class, C, H, W] float32 samples in model space.
at::Tensor sample_images(const models::DiffusionModel& model, const TrainConfig& cfg, const SampleOptions& opts,
                         const at::Device& device);
// Samples and writes a PNG grid, decoded by opts.decoder when it has one;
// undecoded latents with C != 1 or 3 show channels 0..2.
void write_sample_grid(const std::string& path, const models::DiffusionModel& model, const TrainConfig& cfg,
                       const SampleOptions& opts, const at::Device& device);

// The labels of `count` samples from sample number `first` on: the classes
// in turn (0, 1, ..., num_classes - 1, 0, ...), so any N samples are balanced.
at::Tensor cycled_labels(int64_t first, int64_t count, int64_t num_classes);

// Model-space images [N, C, H, W] -> uint8 [N, C, H, W] as the PNG grids and
// ADM's sample batches round them: clamp(127.5 x + 128, 0, 255), truncated.
at::Tensor to_uint8(const at::Tensor& images);

// UsageError (one line, naming `what`) unless the samples are images: the
// model makes 1 or 3 channels and was not trained on latents, or opts has
// a decoder (a VAE) for its latents.
void require_images(const TrainConfig& cfg, const SampleOptions& opts, const std::string& what);

// Writes n samples (labels cycled through the classes) as the sample batch
// ADM's evaluation suite reads (decoded by opts.decoder where it has one): an .npz with arr_0 uint8 [n, H, W, 3]
// (grayscale repeated over 3 channels) and arr_1 int64 [n] labels, sampled
// and written batch_size at a time (batch b from noise seed opts.seed + b).
// `progress` is called after each batch with the samples written so far.
void write_sample_npz(const std::string& path, const models::DiffusionModel& model, const TrainConfig& cfg,
                      const SampleOptions& opts, int64_t n, int64_t batch_size, const at::Device& device,
                      const std::function<void(int64_t)>& progress = {});

}  // namespace perftrain::train
