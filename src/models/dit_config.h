// Named DiT configurations (facebookresearch/DiT's registry: DiT-S/B/L/XL with
// patch 2, 4, 8) plus a tiny DiT-T for CPU runs, and the per-run settings
// (image size, channels, classes, learned variance).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::models {

struct DiTConfig {
  std::string name = "DiT-S/2";
  int64_t depth = 12;
  int64_t hidden = 384;
  int64_t heads = 6;
  int64_t patch = 2;
  double mlp_ratio = 4.0;
  int64_t image_size = 32;   // input height = width (latent size for latents)
  int64_t in_channels = 4;
  int64_t num_classes = 1000;
  double class_dropout = 0.1;  // > 0 adds the null class used for guidance
  bool learn_sigma = true;     // output 2C channels: noise and variance

  int64_t out_channels() const { return learn_sigma ? 2 * in_channels : in_channels; }
  int64_t tokens() const { return (image_size / patch) * (image_size / patch); }
  int64_t mlp_hidden() const { return static_cast<int64_t>(hidden * mlp_ratio); }
  // Throws UsageError naming the field when a value cannot work.
  void validate() const;
  // Parameters of the model this config builds (closed form), including the
  // fixed positional embedding unless trainable_only.
  int64_t parameter_count(bool trainable_only = false) const;
  // Matrix-product and attention FLOPs of one forward pass for one sample.
  double forward_flops_per_sample() const;
};

// The names known to dit_config(), in registry order.
std::vector<std::string> dit_model_names();
// The architecture of a named model (depth, width, heads, patch); other fields
// keep their defaults. Throws UsageError listing the known names.
DiTConfig dit_config(const std::string& name);

}  // namespace perftrain::models
