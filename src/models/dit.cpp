#include "models/dit.h"

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/silu.h>


#include "base/error.h"
#include "base/scope.h"

#include "nn/modulation.h"
#include "ops/adaln_layernorm.h"
#include "compat/compat.h"
#include "ops/gated_residual.h"
#include "ops/gelu_mlp.h"
#include "ops/linear.h"
#include "ops/position_add.h"
#include "ops/recompute.h"
#include "ops/residual_adaln.h"
#include "ops/stacked_linear.h"
#include "ops/qkv_attention.h"

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

at::Tensor DiTBlock::forward(const at::Tensor& x_in, const at::Tensor& c_in) const {
  return hooked({x_in, c_in}, [this](at::TensorList in) {
    const at::Tensor &x = in[0], &c = in[1];
    auto mod = adaLN_modulation.forward(c).chunk(6, 1);  // 6 x [B, D]
    const auto &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
    const auto &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];
    auto h = attn.forward(nn::modulate(nn::layer_norm_no_affine(x), shift_msa, scale_msa));
    auto x1 = x + gate_msa.unsqueeze(1) * h;  // [B, T, D]
    h = mlp.forward(nn::modulate(nn::layer_norm_no_affine(x1), shift_mlp, scale_mlp));
    return x1 + gate_mlp.unsqueeze(1) * h;  // [B, T, D]
  });
}

std::vector<at::Tensor> DiTBlock::modulation(const at::Tensor& c, at::ScalarType act) const {
  return modulation_of_silu(at::silu(c).to(act));
}

std::vector<at::Tensor> DiTBlock::modulation_of_silu(const at::Tensor& silu_c) const {
  // The Linear of forward()'s adaLN_modulation, through ops::linear (the
  // optimizer's bf16 weight copy, the bias in the product's epilogue).
  const nn::Linear& l = adaLN_modulation.linear();
  return ops::linear(silu_c, l.weight, l.bias).chunk(6, 1);  // shift, scale, gate (attention); (MLP)
}

std::pair<at::Tensor, at::Tensor> DiTBlock::attention_half(const at::Tensor& x, const at::Tensor& h,
                                                           const std::vector<at::Tensor>& mod,
                                                           at::ScalarType act) const {
  auto a = ops::projected_attention(h, attn.qkv.weight, attn.qkv.bias, attn.heads());  // [B, T, D] act
  // x1 = x + gate * (a proj^T + bias) and the MLP's modulated norm of x1, in
  // one pass: the bias is added there and its gradient comes from that
  // kernel's column sums, not from a reduction over the product's gradient.
  return ops::residual_adaln(x, mod[2], ops::linear(a, attn.proj.weight), mod[3], mod[4], act, 1e-6,
                             attn.proj.bias);
}

at::Tensor DiTBlock::mlp_half(const at::Tensor& h2, bool keep_activation) const {
  // fc2's bias is left to the gated residual after it (as the projection's).
  return ops::gelu_mlp(h2, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, at::Tensor(), keep_activation);  // [B, T, D]
}

at::Tensor DiTBlock::forward_fused(const at::Tensor& x_in, const at::Tensor& c_in, bool keep_activation) const {
  // The block's hooks fire; its children's do not (their forwards are not called).
  return hooked({x_in, c_in}, [this, keep_activation](at::TensorList in) {
    const at::Tensor &x = in[0], &c = in[1];
    const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
    const auto mod = modulation(c, act);  // 6 x [B, D]
    auto [x1, h2] = attention_half(x, ops::adaln_layernorm(x, mod[0], mod[1], act), mod, act);
    return ops::gated_residual(x1, mod[5], mlp_half(h2, keep_activation), mlp.fc2.bias);  // [B, T, D]
  });
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
  return hooked({x, c}, [this](at::TensorList in) {
    auto mod = adaLN_modulation.forward(in[1]).chunk(2, 1);  // shift, scale: [B, D]
    return linear.forward(nn::modulate(nn::layer_norm_no_affine(in[0]), mod[0], mod[1]));
  });
}

std::vector<at::Tensor> FinalLayer::modulation_of_silu(const at::Tensor& silu_c) const {
  const nn::Linear& l = adaLN_modulation.linear();
  return ops::linear(silu_c, l.weight, l.bias).chunk(2, 1);  // shift, scale
}

at::Tensor FinalLayer::product(const at::Tensor& h) const { return ops::linear(h, linear.weight, linear.bias); }

at::Tensor FinalLayer::forward_fused(const at::Tensor& x, const at::Tensor& silu_c, at::ScalarType act) const {
  return hooked({x, silu_c}, [this, act](at::TensorList in) {
    const auto mod = modulation_of_silu(in[1]);
    return product(ops::adaln_layernorm(in[0], mod[0], mod[1], act));
  });
}

static at::Generator seeded(uint64_t seed, const at::Device& device = at::kCPU) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(seed);
  return gen;
}

DiT::DiT(const DiTConfig& cfg, uint64_t seed) : DiT((cfg.validate(), cfg), seeded(seed)) {}

DiT::DiT(const DiTConfig& cfg, uint64_t seed, const at::Device& device)
    : DiT((cfg.validate(), cfg), seeded(seed, device)) {}

DiT::DiT(const DiTConfig& cfg, at::Generator gen)
    : cfg_(cfg),
      x_embedder(cfg.in_channels, cfg.hidden, cfg.patch, gen),
      t_embedder(cfg.hidden, gen),
      y_embedder(cfg.num_classes, cfg.hidden, cfg.class_dropout > 0, gen),
      final_layer(cfg, gen) {
  if (cfg.single_stream()) throw UsageError("model " + cfg.name + " is single-stream (models::SingleStreamDiT), not a DiT");
  pos_embed = nn::sincos_pos_embed_2d(cfg.hidden, cfg.image_size / cfg.patch).unsqueeze(0).to(gen.device());
  for (int64_t i = 0; i < cfg.depth; ++i) blocks.add(std::make_unique<DiTBlock>(cfg, gen));
  // Registration order is the reference's state_dict order.
  register_parameter("pos_embed", &pos_embed, /*trainable=*/false);
  register_module("x_embedder", &x_embedder);
  register_module("t_embedder", &t_embedder);
  register_module("y_embedder", &y_embedder);
  register_module("blocks", &blocks);
  register_module("final_layer", &final_layer);
}

at::Tensor DiT::forward(const at::Tensor& x_in, const at::Tensor& t_in, const at::Tensor& y_in,
                        const DiTExecution& exec) const {
  return hooked({x_in, t_in, y_in}, [this, exec](at::TensorList in) {
    const at::Tensor &x = in[0], &t = in[1], &y = in[2];
    auto c = t_embedder.forward(t) + y_embedder.forward(y);  // [B, D]
    if (!exec.fused_kernels) {
      at::Tensor h = x_embedder.forward(x) + pos_embed;  // [B, T, D]
      for (size_t i = 0; i < blocks.size(); ++i) h = run_block(i, h, c, exec);
      return unpatchify(final_layer.forward(h, c));  // [B, out, H, W]
    }
    const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
    at::Tensor h = ops::position_add(x_embedder.forward_as_product(x, act), pos_embed);  // contiguous [B, T, D]
    if (!exec.recompute && blocks.size() > 0) return unpatchify(run_blocks_chained(h, c, act, !exec.gelu_recompute));
    for (size_t i = 0; i < blocks.size(); ++i) h = run_block(i, h, c, exec);
    return unpatchify(final_layer.forward_fused(h, at::silu(c).to(act), act));
  });
}

at::Tensor DiT::run_block(size_t i, const at::Tensor& h, const at::Tensor& c, const DiTExecution& exec) const {
  PERFTRAIN_SCOPE_INDEXED("block", i);  // a range in profiler traces (base/scope.h)
  const DiTBlock& block = blocks[i];
  // With recompute, backward calls fn again on autograd's thread after this
  // forward has returned: everything it reads is captured by value here.
  auto fn = [&block, exec](const at::Tensor& x, const at::Tensor& cond) {
    return exec.fused_kernels ? block.forward_fused(x, cond, !exec.gelu_recompute) : block.forward(x, cond);
  };
  return exec.recompute ? ops::recompute(fn, h, c) : fn(h, c);
}

// The fused blocks one after another with each block's MLP residual fused
// with the next block's first modulated norm (ops::residual_adaln), and the
// last one's with the final layer's: the residual stream is written once per
// half-block and its two gradients are summed inside the kernel, not by
// autograd in a separate pass.
at::Tensor DiT::run_blocks_chained(const at::Tensor& x0, const at::Tensor& c, at::ScalarType act,
                                   bool keep_activation) const {
  // One SiLU and one cast of c for all blocks, and all blocks' modulations
  // from it in one product (ops::stacked_linear), split once into the six
  // [B, D] vectors per block; backward joins their gradients in one cat.
  const at::Tensor silu_c = at::silu(c).to(act);
  std::vector<at::Tensor> weights, biases;
  for (size_t i = 0; i < blocks.size(); ++i) {
    weights.push_back(blocks[i].adaLN_modulation.linear().weight);
    biases.push_back(blocks[i].adaLN_modulation.linear().bias);
  }
  const std::vector<at::Tensor> mods = ops::stacked_linear(silu_c, weights, biases).chunk(6 * blocks.size(), 1);
  auto mod = [&mods](size_t block, size_t j) -> const at::Tensor& { return mods[6 * block + j]; };
  at::Tensor x = x0;
  at::Tensor h = ops::adaln_layernorm(x, mod(0, 0), mod(0, 1), act);
  for (size_t i = 0; i < blocks.size(); ++i) {
    PERFTRAIN_SCOPE_INDEXED("block", i);
    auto [x1, h2] = blocks[i].attention_half(x, h, {mod(i, 0), mod(i, 1), mod(i, 2), mod(i, 3), mod(i, 4)}, act);
    at::Tensor m = blocks[i].mlp_half(h2, keep_activation);
    const at::Tensor& fc2_bias = blocks[i].mlp.fc2.bias;
    if (i + 1 == blocks.size()) {
      // The last residual with the final layer's modulated norm; the residual
      // stream itself is not needed after it.
      const auto fin = final_layer.modulation_of_silu(silu_c);
      return final_layer.product(ops::residual_adaln(x1, mod(i, 5), m, fin[0], fin[1], act, 1e-6, fc2_bias).second);
    }
    std::tie(x, h) = ops::residual_adaln(x1, mod(i, 5), m, mod(i + 1, 0), mod(i + 1, 1), act, 1e-6, fc2_bias);
  }
  return x;
}

at::Tensor DiT::unpatchify(const at::Tensor& x) const {
  const int64_t p = cfg_.patch, c = cfg_.out_channels(), g = cfg_.image_size / p;
  return x.reshape({x.size(0), g, g, p, p, c})        // [B, h, w, p, q, c]
      .permute({0, 5, 1, 3, 2, 4})                    // [B, c, h, p, w, q]
      .reshape({x.size(0), c, g * p, g * p});         // [B, c, H, W]
}

std::unique_ptr<DiT> build_model(const DiTConfig& cfg, uint64_t seed, const at::Device& device) {
  // transform() also marks the trainable tensors as requiring gradients.
  auto m = std::make_unique<DiT>(cfg, seed, device);
  m->transform([](const std::string&, const at::Tensor& t) { return t; });
  return m;
}

ModelAndEma build_model_and_ema(const DiTConfig& cfg, uint64_t seed, const at::Device& device) {
  return build_with_ema<ModelAndEma>([&cfg, seed, device] { return build_model(cfg, seed, device); }, device);
}

}  // namespace perftrain::models
