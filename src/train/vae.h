// A user's VAE: a diffusers AutoencoderKL folder (config.json and
// diffusion_pytorch_model.safetensors, as save_pretrained writes it, e.g.
// stabilityai/sd-vae-ft-ema), read into models::AutoencoderKL. Nothing is
// downloaded. `perftrain extract` encodes images with it; `sample --vae` and
// `eval --vae` decode a latent model's samples with it.
#pragma once

#include <c10/core/Device.h>

#include <iosfwd>
#include <memory>
#include <string>

#include "models/autoencoder_kl.h"
#include "train/config.h"
#include "train/sampling.h"

namespace perftrain::train {

// The latents a model trains on are (z - shift) * scale of the VAE's z.
struct LatentScale {
  double scale = 1.0, shift = 0.0;
  std::string from;  // where the numbers came from, for reports
};

struct Vae {
  std::string dir;
  std::unique_ptr<models::AutoencoderKL> net;
  LatentScale scale;  // the folder's config.json: scaling_factor, shift_factor
};

// The folder's config.json (unknown keys ignored; a missing key takes
// diffusers' default) and weights. UsageError naming the option, the folder
// and the file: no such folder, no config.json or weights, a config key of
// the wrong type or a class other than AutoencoderKL, weights that do not
// match the config (models::autoencoder_kl_from). bf16: bfloat16 weights (CUDA only).
Vae load_vae(const std::string& dir, const c10::Device& device, bool bf16, const std::string& option = "--vae");
models::AutoencoderKLConfig read_vae_config(const std::string& dir, const std::string& option = "--vae");

// The scale that turns a model's samples back into the VAE's latents: the
// one the run's latent shards recorded (`perftrain extract`), when the run
// trained on shards that are still there and carry it; else the VAE's own.
LatentScale latent_scale_for(const TrainConfig& cfg, const Vae& vae);

// Model-space latents [N, C, h, w] -> images [N, 3, h*f, w*f] (about
// [-1, 1]; to_uint8 clamps), decoded a few at a time to bound the memory.
at::Tensor decode_latents(const Vae& vae, const LatentScale& s, const at::Tensor& latents);

// The decoder `sample --vae`, `eval --vae` and eval.vae give the sampler:
// the folder loaded (float32) on `device`, checked against the model (its
// channels are the VAE's latent channels: else a UsageError naming
// `option`), with latent_scale_for's scale; says on `log` which scale it
// took from where.
ImageDecoder vae_image_decoder(const std::string& dir, const TrainConfig& cfg, const c10::Device& device,
                               std::ostream& log, const std::string& option = "--vae");

// The shard metadata keys `perftrain extract` writes.
inline constexpr const char* kShardVae = "vae";
inline constexpr const char* kShardScalingFactor = "vae_scaling_factor";
inline constexpr const char* kShardShiftFactor = "vae_shift_factor";

}  // namespace perftrain::train
