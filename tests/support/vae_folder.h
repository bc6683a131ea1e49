// A diffusers AutoencoderKL folder (config.json and
// diffusion_pytorch_model.safetensors) with random weights, written by our
// own network (no Python): the VAE the extract, sample and eval tests use.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>

#include <cmath>

#include <string>

#include "base/fs.h"
#include "io/safetensors.h"
#include "models/autoencoder_kl.h"
#include "support/test_support.h"

namespace perftrain::testing {

// Two blocks (16, 32 channels: 2x downsampling), 8 groups, 4 latent channels.
inline models::AutoencoderKLConfig tiny_vae_config() {
  models::AutoencoderKLConfig c;
  c.block_out_channels = {16, 32};
  c.down_block_types = {"DownEncoderBlock2D", "DownEncoderBlock2D"};
  c.up_block_types = {"UpDecoderBlock2D", "UpDecoderBlock2D"};
  c.norm_num_groups = 8;
  c.scaling_factor = 0.5;
  return c;
}

inline std::string write_random_vae(const std::string& dir, const models::AutoencoderKLConfig& c = tiny_vae_config(),
                                    uint64_t seed = 0) {
  fs::create_directories(dir);
  models::AutoencoderKL net(c);
  io::NamedTensors tensors;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& [name, t] : net.state()) {
    const bool norm = name.find("norm") != std::string::npos && name.find("weight") != std::string::npos;
    const double fan_in = t.dim() > 1 ? static_cast<double>(t.numel() / t.size(0)) : 1.0;
    const at::Tensor r = at::randn(t.sizes(), gen, at::kFloat);
    tensors.emplace_back(name, norm ? 1.0 + 0.1 * r : t.dim() > 1 ? r / std::sqrt(fan_in) : 0.05 * r);
  }
  io::save_safetensors(dir + "/diffusion_pytorch_model.safetensors", tensors);
  std::string channels;
  for (int64_t b : c.block_out_channels) channels += (channels.empty() ? "" : ", ") + std::to_string(b);
  std::string down, up;
  for (size_t i = 0; i < c.block_out_channels.size(); ++i) {
    down += std::string(i ? ", " : "") + "\"DownEncoderBlock2D\"";
    up += std::string(i ? ", " : "") + "\"UpDecoderBlock2D\"";
  }
  write_raw(dir + "/config.json",
            "{\"_class_name\": \"AutoencoderKL\", \"block_out_channels\": [" + channels + "], \"down_block_types\": [" +
                down + "], \"up_block_types\": [" + up + "], \"latent_channels\": " + std::to_string(c.latent_channels) +
                ", \"layers_per_block\": " + std::to_string(c.layers_per_block) +
                ", \"norm_num_groups\": " + std::to_string(c.norm_num_groups) +
                ", \"scaling_factor\": " + std::to_string(c.scaling_factor) + ", \"shift_factor\": null}\n");
  return dir;
}

}  // namespace perftrain::testing
