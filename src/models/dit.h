// DiT (Peebles & Xie, "Scalable Diffusion Models with Transformers"), with the
// semantics and state_dict names of facebookresearch/DiT's models.py:
// patchify -> + pos_embed -> N adaLN-Zero blocks conditioned on
// c = t_embed(t) + y_embed(y) -> final adaLN layer -> unpatchify.
// The model knows nothing of how it is run: precision (autocast), capture,
// label dropout and the execution plan (DiTExecution) come from outside.
// This file is the plain forward, the reference's code in ATen; with
// DiTExecution::fused_kernels the model hands its modules to the fused
// schedule (models/fused/dit_fused.h, built from the block pieces of
// models/fused/dit_block.h).
#pragma once

#include <memory>

#include "models/block_weights.h"
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
  // x [B, T, D], c [B, D] -> [B, T, D]. With exec.fused_kernels the same
  // function through the fused schedule (models/fused/dit_block.h:
  // fused::dit_block); this block's hooks fire either way, its children's
  // only on the plain path.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c, const DiTExecution& exec = {}) const;
  // The same function on the plain path with the weights `w` in place of
  // the block's own (a looped model's per-loop merged weights; the fused
  // schedule takes weights itself). This block's hooks fire, its children's
  // do not (their weights are not the ones read).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c, const DiTBlockWeights& w) const;

  nn::SelfAttention attn;
  nn::Mlp mlp;
  nn::SiLULinear adaLN_modulation;  // c -> 6 vectors: shift, scale, gate for attn and mlp
};

class FinalLayer : public nn::Module {
 public:
  FinalLayer(const DiTConfig& cfg, at::Generator& gen);
  // x [B, T, D], c [B, D] -> [B, T, p*p*out]; with exec.fused_kernels through
  // the fused ops (models/fused/dit_fused.h: fused::dit_final_layer).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c, const DiTExecution& exec = {}) const;

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

  // The blocks in turn as exec says, each in a "block i" profiler range
  // (base/scope.h) and, with exec.recompute, under ops::recompute (its
  // activations made again in backward): h [B, T, D] -> [B, T, D]. h by
  // value: each block's input is let go once the next one has it.
  at::Tensor run_blocks(at::Tensor h, const at::Tensor& c, const DiTExecution& exec) const;

 private:
  DiT(const DiTConfig& cfg, at::Generator gen);
  at::Tensor unpatchify(const at::Tensor& x) const;  // [B, T, p*p*c] -> [B, c, H, W]

  DiTConfig cfg_;

 public:
  // The modules, public as the reference's attributes are: the fused
  // schedule (models/fused/dit_fused.h) reads them.
  at::Tensor pos_embed;  // [1, T, D], fixed (not trainable) but in the state_dict
  nn::PatchEmbed x_embedder;
  nn::TimestepEmbedder t_embedder;
  nn::LabelEmbedder y_embedder;
  nn::ModuleList<DiTBlock> blocks;
  FinalLayer final_layer;
};

// Tokens [B, T, p*p*c] -> images [B, c, H, W] (the reference's unpatchify).
at::Tensor unpatchify(const at::Tensor& x, const DiTConfig& cfg);

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
