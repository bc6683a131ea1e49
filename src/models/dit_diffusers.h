// A DiT's weights in the layout of diffusers' DiTTransformer2DModel (its
// conversion script scripts/convert_dit_to_diffusers.py maps the same
// names): x_embedder -> pos_embed, blocks.N -> transformer_blocks.N with
// attn.qkv split into attn1.to_q/to_k/to_v, attn.proj -> attn1.to_out.0,
// mlp.fc1/fc2 -> ff.net.0.proj/ff.net.2, adaLN_modulation.1 -> norm1.linear,
// final_layer -> proj_out_1 (its adaLN) and proj_out_2. diffusers keeps a
// copy of the timestep MLP and the label table in every block
// (transformer_blocks.N.norm1.emb), so DiT's single ones are repeated; its
// label table always has the null-class row, so a DiT trained without one
// gets a zero row it never uses. pos_embed is not stored: diffusers computes
// the same sin-cos table. Only the DiT family maps (the single-stream model
// has no diffusers class).
#pragma once

#include <cstdint>

#include "models/dit_config.h"
#include "nn/module.h"

namespace perftrain::models {

// Throws UsageError for a config diffusers' class cannot hold (another
// family, mlp_ratio other than 4) and RuntimeError for a missing tensor.
nn::NamedTensors dit_to_diffusers(const nn::NamedTensors& dit, const DiTConfig& cfg);

// The values of diffusers' config.json for the class, in its keys' order.
struct DiffusersConfig {
  int64_t num_attention_heads, attention_head_dim, in_channels, out_channels, num_layers, sample_size, patch_size,
      num_embeds_ada_norm;
  double norm_eps;  // DiT's LayerNorms: 1e-6
};
DiffusersConfig diffusers_config(const DiTConfig& cfg);

}  // namespace perftrain::models
