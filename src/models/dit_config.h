// Named DiT configurations (facebookresearch/DiT's registry: DiT-S/B/L/XL with
// patch 2, 4, 8) plus a tiny DiT-T for CPU runs, and the per-run settings
// (image size, channels, classes, learned variance).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace perftrain::models {

// Upper bounds far beyond any model that fits a GPU, so that sizes and
// parameter counts stay exact in int64 (the memory estimate refuses the ones
// that do not fit); DiTConfig::validate and the commands' options check them.
constexpr int64_t kMaxImageSize = 65536;
constexpr int64_t kMaxInChannels = 4096;
constexpr int64_t kMaxNumClasses = int64_t(1) << 24;

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
  // Which model the fields build: "dit" (models::DiT) or "single-stream"
  // (models::SingleStreamDiT, docs/guide/architectures.md). The single-stream
  // fields below are ignored by DiT.
  std::string family = "dit";
  // Single-stream: condition tokens in the sequence. Class labels
  // (cond_dim 0): cond_tokens learned tokens per class. Features (cond_dim
  // Dc > 0): at most cond_tokens tokens of Dc channels per sample, a length
  // per sample masking the rest.
  int64_t cond_tokens = 1;
  int64_t cond_dim = 0;

  int64_t out_channels() const { return learn_sigma ? 2 * in_channels : in_channels; }
  int64_t tokens() const { return (image_size / patch) * (image_size / patch); }
  // DiT: hidden * mlp_ratio. Single-stream SwiGLU: 2/3 of that (the GELU
  // MLP's parameters at the same ratio; 8/3 * hidden at 4), rounded up to a
  // multiple of 64.
  int64_t mlp_hidden() const;
  bool single_stream() const { return family == "single-stream"; }
  // Single-stream: condition plus image tokens in the one sequence.
  int64_t sequence_tokens() const { return single_stream() ? cond_tokens + tokens() : tokens(); }
  // Throws UsageError naming the field when a value cannot work.
  void validate() const;
  // Parameters of the model this config builds (closed form), including the
  // fixed positional embedding unless trainable_only.
  int64_t parameter_count(bool trainable_only = false) const;
  // Matrix-product and attention FLOPs of one forward pass for one sample.
  double forward_flops_per_sample() const;
};

// Every name model_config() knows, family by family (DiT-*, then SS-*).
std::vector<std::string> model_names();
// The single-stream names ("SS-S/2", ...), known to model_config().
std::vector<std::string> single_stream_model_names();
// A named model of either family (the name implies model.family). Throws
// UsageError listing the known names.
DiTConfig model_config(const std::string& name);

// The names known to dit_config(), in registry order.
std::vector<std::string> dit_model_names();
// The architecture of a named model (depth, width, heads, patch); other fields
// keep their defaults. Throws UsageError listing the known names.
DiTConfig dit_config(const std::string& name);

}  // namespace perftrain::models
