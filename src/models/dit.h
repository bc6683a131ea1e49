// DiT (Peebles & Xie, "Scalable Diffusion Models with Transformers"), with the
// semantics and state_dict names of facebookresearch/DiT's models.py:
// patchify -> + pos_embed -> N adaLN-Zero blocks conditioned on
// c = t_embed(t) + y_embed(y) -> final adaLN layer -> unpatchify.
// The model knows nothing of how it is run: precision (autocast), capture,
// label dropout and the execution plan (DiTExecution) come from outside.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "models/diffusion_model.h"
#include "models/dit_config.h"
#include "nn/attention.h"
#include "nn/embeddings.h"
#include "nn/mlp.h"

namespace perftrain::models {

// DiTExecution (how forward runs its blocks): models/diffusion_model.h.

class DiTBlock : public nn::Module {
 public:
  DiTBlock(const DiTConfig& cfg, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c) const;  // x [B,T,D], c [B,D]
  // The same function through the fused ops (src/ops): adaLN LayerNorm,
  // cuBLASLt products with bias/GELU epilogues, gated residuals. Matrix
  // operands in the autocast dtype (or x's dtype without autocast).
  // keep_activation: gelu_mlp's (false: GELU again in backward).
  at::Tensor forward_fused(const at::Tensor& x, const at::Tensor& c, bool keep_activation = true) const;
  // Pieces of forward_fused, so the model can chain blocks: the six
  // modulation vectors; the attention half from x and its modulated norm h
  // -> (x1, the MLP's modulated norm of x1); the MLP of that norm, without
  // fc2's bias (the gated residual that follows adds it).
  std::vector<at::Tensor> modulation(const at::Tensor& c, at::ScalarType act) const;
  // The same from silu(c) already in the compute dtype (shared by the blocks).
  std::vector<at::Tensor> modulation_of_silu(const at::Tensor& silu_c) const;
  std::pair<at::Tensor, at::Tensor> attention_half(const at::Tensor& x, const at::Tensor& h,
                                                   const std::vector<at::Tensor>& mod, at::ScalarType act) const;
  at::Tensor mlp_half(const at::Tensor& h2, bool keep_activation = true) const;

  nn::SelfAttention attn;
  nn::Mlp mlp;
  nn::SiLULinear adaLN_modulation;  // c -> 6 vectors: shift, scale, gate for attn and mlp
};

class FinalLayer : public nn::Module {
 public:
  FinalLayer(const DiTConfig& cfg, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c) const;  // -> [B, T, p*p*out]
  // The same through the fused ops, from silu(c) in the compute dtype: the
  // shift and scale; the product on the modulated norm h; both together.
  std::vector<at::Tensor> modulation_of_silu(const at::Tensor& silu_c) const;
  at::Tensor product(const at::Tensor& h) const;
  at::Tensor forward_fused(const at::Tensor& x, const at::Tensor& silu_c, at::ScalarType act) const;

  nn::Linear linear;
  nn::SiLULinear adaLN_modulation;  // c -> shift, scale
};

class DiT : public DiffusionModel {
 public:
  // Builds on the CPU in float32 with the reference initialisation drawn from
  // a generator seeded with `seed`.
  DiT(const DiTConfig& cfg, uint64_t seed);
  // The same on `device`, drawn from that device's generator seeded with
  // `seed` (other values than the CPU's for the same seed; same on every run).
  DiT(const DiTConfig& cfg, uint64_t seed, const at::Device& device);
  // x [B, C, H, W], t [B] float (timestep units), y [B] int64 -> [B, out, H, W],
  // run as `exec` says.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y,
                     const DiTExecution& exec = {}) const;
  // The same with y = cond.labels (DiffusionModel's forward).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                     const DiTExecution& exec = {}) const override {
    return forward(x, t, cond.labels, exec);
  }
  const DiTConfig& config() const override { return cfg_; }
  bool has_fused_path() const override { return true; }

 private:
  DiT(const DiTConfig& cfg, at::Generator gen);
  at::Tensor unpatchify(const at::Tensor& x) const;  // [B, T, p*p*c] -> [B, c, H, W]

  at::Tensor run_block(size_t i, const at::Tensor& h, const at::Tensor& c, const DiTExecution& exec) const;
  // The fused blocks and the final layer, chained: -> [B, T, p*p*out].
  at::Tensor run_blocks_chained(const at::Tensor& h, const at::Tensor& c, at::ScalarType act,
                                bool keep_activation) const;

  DiTConfig cfg_;
  at::Tensor pos_embed;  // [1, T, D], fixed (not trainable) but in the state_dict
  nn::PatchEmbed x_embedder;
  nn::TimestepEmbedder t_embedder;
  nn::LabelEmbedder y_embedder;
  nn::ModuleList<DiTBlock> blocks;
  FinalLayer final_layer;
};

// A model to train and its EMA (the same initial weights; the EMA takes no
// gradients), both on `device`, initialised there (DiT(cfg, seed, device)):
// on a GPU in milliseconds, where drawing DiT-XL/2's weights on the CPU took
// ~5 s per model and was most of the time to the first step.
struct ModelAndEma {
  std::unique_ptr<DiT> model, ema;
};
ModelAndEma build_model_and_ema(const DiTConfig& cfg, uint64_t seed, const at::Device& device);
// The model alone, as build_model_and_ema builds it (for a run without an EMA).
std::unique_ptr<DiT> build_model(const DiTConfig& cfg, uint64_t seed, const at::Device& device);

}  // namespace perftrain::models
