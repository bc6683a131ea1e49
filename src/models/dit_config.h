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

// A linear layer of a block: its path in the block and its shape.
struct LinearShape {
  std::string path;
  int64_t in, out;
};

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
  // Which model the fields build: "dit" (models::DiT), "single-stream"
  // (models::SingleStreamDiT) or "looped" (models::LoopedDiT,
  // docs/guide/architectures.md). The single-stream fields below are ignored
  // by DiT, the looped ones by the other families.
  std::string family = "dit";
  // Single-stream: condition tokens in the sequence. Class labels
  // (cond_dim 0): cond_tokens learned tokens per class. Features (cond_dim
  // Dc > 0): at most cond_tokens tokens of Dc channels per sample, a length
  // per sample masking the rest.
  int64_t cond_tokens = 1;
  int64_t cond_dim = 0;
  // Looped (models/looped.h): `prelude` blocks, a group of `shared_group`
  // blocks applied `loops` times with shared weights, `coda` blocks, all of
  // the kind `loop_block` ("dit" or "single_stream"; the stem and final layer
  // are that family's). depth is the number of block applications,
  // prelude + shared_group * loops + coda (looped_depth()).
  std::string loop_block = "dit";
  int64_t prelude = 2;
  int64_t coda = 2;
  int64_t shared_group = 1;
  int64_t loops = 8;
  // The prelude's output e into every loop's input h: "none", "add"
  // (h + e) or "concat" (a Linear(2D, D) of [h, e], starting as h).
  std::string reinject = "none";
  // Depth-wise LoRA: per loop and shared block a rank-`lora_rank` adapter
  // (0: none) on the `lora_targets` (comma list of attn, mlp, adaln), scale
  // lora_alpha / lora_rank; lora_bias adds a per-loop bias delta.
  int64_t lora_rank = 0;
  double lora_alpha = 16.0;
  std::string lora_targets = "attn,mlp";
  bool lora_bias = false;
  // Routing: loop l keeps the share capacity(l) of the image tokens
  // (expert-choice top-k), linear from route_capacity at the first loop to
  // route_capacity_end (-1: the same) at the last; a loop at capacity 1 is
  // not routed. router_aux_weight scales the routers' balancing loss.
  double route_capacity = 1.0;
  double route_capacity_end = -1.0;
  double router_aux_weight = 0.01;

  int64_t out_channels() const { return learn_sigma ? 2 * in_channels : in_channels; }
  int64_t tokens() const { return (image_size / patch) * (image_size / patch); }
  // DiT: hidden * mlp_ratio. Single-stream SwiGLU: 2/3 of that (the GELU
  // MLP's parameters at the same ratio; 8/3 * hidden at 4), rounded up to a
  // multiple of 64.
  int64_t mlp_hidden() const;
  bool looped() const { return family == "looped"; }
  // Single-stream blocks and token layout: the single-stream family, or a
  // looped model of single-stream blocks.
  bool single_stream() const { return family == "single-stream" || (looped() && loop_block == "single_stream"); }
  // Looped: prelude + shared_group * loops + coda (the block applications).
  int64_t looped_depth() const { return prelude + shared_group * loops + coda; }
  // Looped: the capacity of loop l (route_capacity to route_capacity_end,
  // linear in l), the image tokens a routed loop keeps per sample
  // (max(1, round(capacity * tokens()))), whether loop l is routed
  // (capacity < 1) and whether any loop is.
  double loop_capacity(int64_t loop) const;
  int64_t loop_tokens(int64_t loop) const;
  bool loop_routed(int64_t loop) const { return looped() && loop_capacity(loop) < 1.0; }
  bool routing() const;
  // Looped: the LoRA targets, parsed from lora_targets (attn, mlp, adaln, in
  // that order); throws UsageError naming model.lora_targets.
  std::vector<std::string> lora_target_list() const;
  // Looped: the shared block's linears the adapters target, as their paths
  // in the block ("attn.qkv", "mlp.fc1", "adaLN_modulation.1", ...), with
  // their in and out features, in the order of lora_target_list().
  std::vector<LinearShape> lora_linears() const;
  // Single-stream: condition plus image tokens in the one sequence.
  int64_t sequence_tokens() const { return single_stream() ? cond_tokens + tokens() : tokens(); }
  // Throws UsageError naming the field when a value cannot work.
  void validate() const;
  void validate_looped() const;  // the looped fields (validate() calls it for family looped)
  // Parameters of the model this config builds (closed form), including the
  // fixed positional embedding unless trainable_only.
  int64_t parameter_count(bool trainable_only = false) const;
  // Matrix-product and attention FLOPs of one forward pass for one sample
  // (looped: per block application).
  double forward_flops_per_sample() const;
  // One block's parameters, and its forward FLOPs for one sample over S tokens.
  int64_t block_parameter_count() const;
  double block_flops(double S) const;
  // Looped: loop_embed, reinject, adapters and routers' parameters; all
  // block applications' FLOPs with the routers' and the adapters' merge.
  int64_t looped_extra_parameter_count() const;
  double looped_blocks_flops() const;
};

// Every name model_config() knows, family by family (DiT-*, SS-*, Looped-*).
std::vector<std::string> model_names();
// The single-stream names ("SS-S/2", ...), known to model_config().
std::vector<std::string> single_stream_model_names();
// The looped names ("Looped-B/2", ...: DiT's sizes, prelude 2, one shared
// block applied depth - 4 times, coda 2), known to model_config().
std::vector<std::string> looped_model_names();
// A named model of either family (the name implies model.family). Throws
// UsageError listing the known names.
DiTConfig model_config(const std::string& name);

// The names known to dit_config(), in registry order.
std::vector<std::string> dit_model_names();
// The architecture of a named model (depth, width, heads, patch); other fields
// keep their defaults. Throws UsageError listing the known names.
DiTConfig dit_config(const std::string& name);

}  // namespace perftrain::models
