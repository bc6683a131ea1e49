#include "models/dit.h"

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <ATen/TensorOperators.h>

#include "nn/modulation.h"
#include "ops/adaln_layernorm.h"
#include "ops/compat.h"
#include "ops/gated_residual.h"
#include "ops/gelu_mlp.h"
#include "ops/linear.h"
#include "ops/recompute.h"
#include "ops/residual_adaln.h"
#include "ops/self_attention.h"

namespace perftrain::models {
namespace {

// Zero-init of the adaLN modulation makes every block start as the identity
// ("adaLN-Zero"), and of the final layer makes the model start at output 0.
void zero_(nn::Linear& l) {
  at::NoGradGuard no_grad;
  l.weight.zero_();
  l.bias.zero_();
}

}  // namespace

DiTBlock::DiTBlock(const DiTConfig& cfg, at::Generator& gen)
    : attn(cfg.hidden, cfg.heads, gen),
      mlp(cfg.hidden, cfg.mlp_hidden(), gen),
      adaLN_modulation(cfg.hidden, 6 * cfg.hidden, gen) {
  zero_(adaLN_modulation.linear());
  register_module("attn", &attn);
  register_module("mlp", &mlp);
  register_module("adaLN_modulation", &adaLN_modulation);
}

at::Tensor DiTBlock::forward(const at::Tensor& x, const at::Tensor& c) const {
  auto mod = adaLN_modulation.forward(c).chunk(6, 1);  // 6 x [B, D]
  const auto &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
  const auto &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];
  auto h = attn.forward(nn::modulate(nn::layer_norm_no_affine(x), shift_msa, scale_msa));
  auto x1 = x + gate_msa.unsqueeze(1) * h;  // [B, T, D]
  h = mlp.forward(nn::modulate(nn::layer_norm_no_affine(x1), shift_mlp, scale_mlp));
  return x1 + gate_mlp.unsqueeze(1) * h;  // [B, T, D]
}

at::Tensor DiTBlock::forward_fused(const at::Tensor& x, const at::Tensor& c) const {
  const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
  auto mod = adaLN_modulation.forward(c).chunk(6, 1);  // 6 x [B, D]
  const auto &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
  const auto &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];
  auto h = ops::adaln_layernorm(x, shift_msa, scale_msa, act);              // [B, T, D] act
  auto qkv = ops::linear(h, attn.qkv.weight, attn.qkv.bias);                // [B, T, 3D]
  auto a = ops::self_attention(qkv, attn.heads());                          // [B, T, D]
  // x1 = x + gate * proj(a) and the MLP's modulated norm of x1, in one pass.
  auto [x1, h2] = ops::residual_adaln(x, gate_msa, ops::linear(a, attn.proj.weight, attn.proj.bias), shift_mlp,
                                      scale_mlp, act);  // [B, T, D] x's dtype, [B, T, D] act
  auto m = ops::gelu_mlp(h2, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias);  // [B, T, D]
  return ops::gated_residual(x1, gate_mlp, m);
}

FinalLayer::FinalLayer(const DiTConfig& cfg, at::Generator& gen)
    : linear(cfg.hidden, cfg.patch * cfg.patch * cfg.out_channels(), gen),
      adaLN_modulation(cfg.hidden, 2 * cfg.hidden, gen) {
  zero_(linear);
  zero_(adaLN_modulation.linear());
  register_module("linear", &linear);
  register_module("adaLN_modulation", &adaLN_modulation);
}

at::Tensor FinalLayer::forward(const at::Tensor& x, const at::Tensor& c) const {
  auto mod = adaLN_modulation.forward(c).chunk(2, 1);  // shift, scale: [B, D]
  return linear.forward(nn::modulate(nn::layer_norm_no_affine(x), mod[0], mod[1]));
}

static at::Generator seeded(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

DiT::DiT(const DiTConfig& cfg, uint64_t seed) : DiT((cfg.validate(), cfg), seeded(seed)) {}

DiT::DiT(const DiTConfig& cfg, at::Generator gen)
    : cfg_(cfg),
      x_embedder(cfg.in_channels, cfg.hidden, cfg.patch, gen),
      t_embedder(cfg.hidden, gen),
      y_embedder(cfg.num_classes, cfg.hidden, cfg.class_dropout > 0, gen),
      final_layer(cfg, gen) {
  pos_embed = nn::sincos_pos_embed_2d(cfg.hidden, cfg.image_size / cfg.patch).unsqueeze(0);
  for (int64_t i = 0; i < cfg.depth; ++i) blocks.add(std::make_unique<DiTBlock>(cfg, gen));
  // Registration order is the reference's state_dict order.
  register_parameter("pos_embed", &pos_embed, /*trainable=*/false);
  register_module("x_embedder", &x_embedder);
  register_module("t_embedder", &t_embedder);
  register_module("y_embedder", &y_embedder);
  register_module("blocks", &blocks);
  register_module("final_layer", &final_layer);
}

at::Tensor DiT::forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) const {
  auto h = x_embedder.forward(x) + pos_embed;                // [B, T, D]
  auto c = t_embedder.forward(t) + y_embedder.forward(y);  // [B, D]
  for (size_t i = 0; i < blocks.size(); ++i) h = run_block(i, h, c);
  return unpatchify(final_layer.forward(h, c));  // [B, out, H, W]
}

at::Tensor DiT::run_block(size_t i, const at::Tensor& h, const at::Tensor& c) const {
  const DiTBlock& block = blocks[i];
  auto fn = [&block, fused = fused_kernels_](const at::Tensor& x, const at::Tensor& cond) {
    return fused ? block.forward_fused(x, cond) : block.forward(x, cond);
  };
  return recompute_ ? ops::recompute(fn, h, c) : fn(h, c);
}

at::Tensor DiT::unpatchify(const at::Tensor& x) const {
  const int64_t p = cfg_.patch, c = cfg_.out_channels(), g = cfg_.image_size / p;
  return x.reshape({x.size(0), g, g, p, p, c})        // [B, h, w, p, q, c]
      .permute({0, 5, 1, 3, 2, 4})                    // [B, c, h, p, w, q]
      .reshape({x.size(0), c, g * p, g * p});         // [B, c, H, W]
}

}  // namespace perftrain::models
