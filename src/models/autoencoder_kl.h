// diffusers' AutoencoderKL (the Stable Diffusion VAE that DiT and fast-DiT
// encode ImageNet with), under diffusers' parameter names so that a user's
// diffusion_pytorch_model.safetensors loads as it is: the encoder
// (conv_in, DownEncoderBlock2D x len(block_out_channels) of layers_per_block
// ResnetBlock2D each and a stride-2 convolution after all but the last, the
// mid block ResnetBlock2D / single-head attention with GroupNorm /
// ResnetBlock2D, GroupNorm, SiLU, conv_out to 2 x latent_channels),
// quant_conv, the diagonal Gaussian posterior (mean, logvar clamped to
// [-30, 20]), post_quant_conv and the decoder (the mirror image with
// layers_per_block + 1 resnets per UpDecoderBlock2D and nearest 2x
// upsampling). GroupNorm eps 1e-6 everywhere. The network knows nothing of
// files: train/vae.h reads a diffusers folder into it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace perftrain::models {

// The keys of diffusers' config.json that shape the network or its latents.
struct AutoencoderKLConfig {
  int64_t in_channels = 3, out_channels = 3, latent_channels = 4;
  std::vector<int64_t> block_out_channels{64};
  std::vector<std::string> down_block_types{"DownEncoderBlock2D"}, up_block_types{"UpDecoderBlock2D"};
  int64_t layers_per_block = 1, norm_num_groups = 32;
  std::string act_fn = "silu";
  double scaling_factor = 0.18215, shift_factor = 0.0;  // shards hold (z - shift) * scale
  bool use_quant_conv = true, use_post_quant_conv = true, mid_block_add_attention = true;

  // UsageError naming `origin` and the key for what this network does not do
  // (other block types or activations, channels not divisible into groups).
  void validate(const std::string& origin) const;
  // Image pixels per latent pixel along a side: 2^(blocks - 1).
  int64_t downsample_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }
};

class AutoencoderKL : public nn::Module {
 public:
  explicit AutoencoderKL(const AutoencoderKLConfig& cfg);
  ~AutoencoderKL() override;

  struct Posterior {
    at::Tensor mean, logvar;  // [N, latent_channels, H/f, W/f] float32; logvar clamped as diffusers does
    // mean + exp(logvar / 2) * noise (noise: standard normal of mean's shape).
    at::Tensor sample(const at::Tensor& noise) const;
  };
  // images: [N, in_channels, H, W] in [-1, 1] (H, W multiples of the downsample factor).
  Posterior encode(const at::Tensor& images) const;
  // latents: [N, latent_channels, h, w] unscaled -> images [N, out_channels, h*f, w*f] float32.
  at::Tensor decode(const at::Tensor& latents) const;

  const AutoencoderKLConfig& config() const { return cfg_; }
  at::ScalarType dtype() const;

 private:
  struct Parts;
  AutoencoderKLConfig cfg_;
  std::unique_ptr<Parts> p_;
};

// The network with the given weights on `device` in `dtype` (float32, or
// bfloat16 on CUDA). Strict: a missing, unexpected or mis-shaped tensor is a
// one-line UsageError naming `origin` and the tensors. The attention names of
// older diffusers files (query, key, value, proj_attn) are read as to_q,
// to_k, to_v, to_out.0, as diffusers does.
std::unique_ptr<AutoencoderKL> autoencoder_kl_from(const AutoencoderKLConfig& cfg,
                                                   std::map<std::string, at::Tensor> weights,
                                                   const std::string& origin, const c10::Device& device,
                                                   at::ScalarType dtype);

}  // namespace perftrain::models
