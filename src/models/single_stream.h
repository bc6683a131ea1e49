// The single-stream DiT (the S3-DiT style of recent image models): condition
// tokens and image tokens in one sequence through shared blocks.
//   tokens: [condition tokens (Tc) | image patches (T)], D wide
//   block:  x += tanh(g1) * post_norm1(attn(rope(qk_norm(.)), pre_norm1(x) * (1 + s1)))
//           x += tanh(g2) * post_norm2(swiglu(pre_norm2(x) * (1 + s2)))
//           with (s1, g1, s2, g2) = adaLN(silu(t_embed(t))), RMSNorms throughout
//   final:  linear(rms(x) * (1 + s)) on the image tokens -> unpatchify
// Linears have no bias. The rotary positions are (i, 0, 0) for condition
// token i and (Tc, row, col) for an image token (nn/rotary.h). Conditions:
// class labels as cond_tokens learned tokens per class (with a null class
// for guidance), or per-sample features [B, Tc, Dc] (RMSNorm, then a linear
// to D) with a length per sample: padded condition tokens are masked out as
// attention keys, so shapes stay static. Zero-initialised adaLN and final
// linear: every block starts as the identity and the model at output 0.
// Names and math match bench/reference_single_stream.py.
//
// This file is the plain forward (the reference's code in ATen); with
// DiTExecution::fused_kernels the model hands its modules to the fused
// schedule (models/fused/single_stream_fused.h, built from the block pieces
// of models/fused/single_stream_block.h; docs/design.md, "A single-stream
// block, line by line").
#pragma once

#include <memory>
#include <utility>

#include "models/block_weights.h"
#include "models/diffusion_model.h"
#include "nn/embeddings.h"
#include "nn/linear.h"
#include "nn/rms_norm.h"
#include "nn/swiglu.h"

namespace perftrain::models {

class SingleStreamAttention : public nn::Module {
 public:
  SingleStreamAttention(int64_t hidden, int64_t heads, at::Generator& gen);
  // x [B, T, D]; cos, sin [T, head_dim/2]; mask [B, 1, 1, T] bool (true:
  // attend) or undefined.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask) const;
  int64_t heads() const { return heads_; }
  // The attention between the projections: qkv's output [B, T, 3D] -> [B, T, D]
  // (cos, sin may also be per sample, [B, 1, T, head_dim/2]).
  at::Tensor attend(const at::Tensor& qkv_out, const at::Tensor& cos, const at::Tensor& sin,
                    const at::Tensor& mask) const;

  nn::Linear qkv;
  nn::RMSNorm q_norm, k_norm;  // over the head dimension
  nn::Linear proj;

 private:
  int64_t heads_;
};

class SingleStreamBlock : public nn::Module {
 public:
  SingleStreamBlock(const DiTConfig& cfg, at::Generator& gen);
  // x [B, T, D]; silu_c [B, D] (silu of the timestep embedding).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& silu_c, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask) const;
  // The same on the plain path with the linears' weights `w` in place of
  // the block's own (a looped model's per-loop merged weights; the norms stay
  // the block's). This block's hooks fire, its linears' do not.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& silu_c, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask, const SingleStreamBlockWeights& w) const;

  nn::RMSNorm attn_norm;
  SingleStreamAttention attn;
  nn::RMSNorm attn_post_norm, ffn_norm;
  nn::SwiGLU ffn;
  nn::RMSNorm ffn_post_norm;
  nn::Linear adaLN_modulation;  // silu(c) -> scale, gate (attention); scale, gate (FFN)

 private:
  // The block's function, whichever tensors its linears read.
  template <class Attn, class Ffn>
  at::Tensor body(const at::Tensor& x, const at::Tensor& modulation, const Attn& attend, const Ffn& ffn_of) const;
};

class SingleStreamFinalLayer : public nn::Module {
 public:
  SingleStreamFinalLayer(const DiTConfig& cfg, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& silu_c) const;  // -> [B, T, p*p*out]

  nn::Linear adaLN_modulation;  // silu(c) -> scale
  nn::Linear linear;
};

// Per-sample condition features -> tokens: RMSNorm over Dc, then a linear.
class ConditionEmbedder : public nn::Module {
 public:
  ConditionEmbedder(int64_t cond_dim, int64_t hidden, at::Generator& gen);
  at::Tensor forward(const at::Tensor& features) const;  // [B, Tc, Dc] -> [B, Tc, D]

  nn::RMSNorm norm;
  nn::Linear linear;
};

// The condition tokens [B, Tc, D] of a batch, from whichever embedder the
// model has (labels or features), and the key mask [B, 1, 1, Tc + T]
// (undefined: none). Throws RuntimeError when `cond` does not fit.
std::pair<at::Tensor, at::Tensor> single_stream_condition(const DiTConfig& cfg, const nn::LabelEmbedder* y_embedder,
                                                          const ConditionEmbedder* cond_embedder,
                                                          const Condition& cond, int64_t batch);
// The rotary tables (cos, sin) [Tc + T, head_dim/2] of the token layout, on `device`.
std::pair<at::Tensor, at::Tensor> single_stream_rope_tables(const DiTConfig& cfg, const at::Device& device);
// Images [B, C, H, W] -> patches [B, T, C*p*p] (c, i, j order).
at::Tensor single_stream_patches(const at::Tensor& x, const DiTConfig& cfg);

class SingleStreamDiT : public DiffusionModel {
 public:
  // On the CPU in float32, or on `device` from its generator (as DiT).
  SingleStreamDiT(const DiTConfig& cfg, uint64_t seed);
  SingleStreamDiT(const DiTConfig& cfg, uint64_t seed, const at::Device& device);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                     const DiTExecution& exec = {}) const override;
  const DiTConfig& config() const override { return cfg_; }
  bool has_fused_path() const override { return true; }

 private:
  SingleStreamDiT(const DiTConfig& cfg, at::Generator gen);
  // forward() without the model's own hooks (forward() runs it through them).
  at::Tensor forward_body(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                          const DiTExecution& exec) const;
  // [B, Tc, D] condition tokens, and the key mask [B, 1, 1, Tc + T] (undefined: none).
  std::pair<at::Tensor, at::Tensor> condition_tokens(const Condition& cond, int64_t batch) const;

  DiTConfig cfg_;

 public:
  // The modules, public as DiT's are: the fused schedule
  // (models/fused/single_stream_fused.h) reads them.
  nn::Linear x_embedder;  // patches [B, T, C*p*p] (c, i, j order) -> D
  nn::TimestepEmbedder t_embedder;
  std::unique_ptr<nn::LabelEmbedder> y_embedder;      // class labels: [classes (+1), Tc*D]
  std::unique_ptr<ConditionEmbedder> cond_embedder;   // features
  nn::ModuleList<SingleStreamBlock> blocks;
  SingleStreamFinalLayer final_layer;
  at::Tensor rope_cos, rope_sin;  // [Tc + T, head_dim/2], fixed and not in the state_dict
};

}  // namespace perftrain::models
