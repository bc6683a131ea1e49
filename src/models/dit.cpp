#include "models/dit.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/silu.h>

#include "base/error.h"
#include "base/scope.h"
#include "models/fused/dit_block.h"
#include "models/fused/dit_fused.h"
#include "nn/modulation.h"
#include "ops/recompute.h"
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

namespace {

// The block's function, whichever tensors its linears read: x [B, T, D],
// modulation [B, 6D] (from c), attn and mlp maps of [B, T, D].
template <class Attn, class Mlp>
at::Tensor dit_block_body(const at::Tensor& x, const at::Tensor& modulation, const Attn& attn, const Mlp& mlp) {
  auto mod = modulation.chunk(6, 1);  // 6 x [B, D]
  const auto &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
  const auto &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];
  auto h = attn(nn::modulate(nn::layer_norm_no_affine(x), shift_msa, scale_msa));
  auto x1 = x + gate_msa.unsqueeze(1) * h;  // [B, T, D]
  h = mlp(nn::modulate(nn::layer_norm_no_affine(x1), shift_mlp, scale_mlp));
  return x1 + gate_mlp.unsqueeze(1) * h;  // [B, T, D]
}

}  // namespace

at::Tensor DiTBlock::forward(const at::Tensor& x_in, const at::Tensor& c_in, const DiTExecution& exec) const {
  return hooked({x_in, c_in}, [this, &exec](at::TensorList in) {
    const at::Tensor &x = in[0], &c = in[1];
    if (exec.fused_kernels) return fused::dit_block(*this, x, c, exec);
    return dit_block_body(
        x, adaLN_modulation.forward(c), [this](const at::Tensor& a) { return attn.forward(a); },
        [this](const at::Tensor& m) { return mlp.forward(m); });
  });
}

at::Tensor DiTBlock::forward(const at::Tensor& x_in, const at::Tensor& c_in, const DiTBlockWeights& w) const {
  return hooked({x_in, c_in}, [this, &w](at::TensorList in) {
    const int64_t heads = attn.heads();
    return dit_block_body(
        in[0], at::linear(at::silu(in[1]), w.ada_w, w.ada_b),
        [&w, heads](const at::Tensor& a) {
          return at::linear(ops::self_attention(at::linear(a, w.qkv_w, w.qkv_b), heads), w.proj_w, w.proj_b);
        },
        [&w](const at::Tensor& m) {
          return at::linear(at::gelu(at::linear(m, w.fc1_w, w.fc1_b), "tanh"), w.fc2_w, w.fc2_b);
        });
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

at::Tensor FinalLayer::forward(const at::Tensor& x, const at::Tensor& c, const DiTExecution& exec) const {
  return hooked({x, c}, [this, &exec](at::TensorList in) {
    if (exec.fused_kernels) return fused::dit_final_layer(*this, in[0], in[1]);
    auto mod = adaLN_modulation.forward(in[1]).chunk(2, 1);  // shift, scale: [B, D]
    return linear.forward(nn::modulate(nn::layer_norm_no_affine(in[0]), mod[0], mod[1]));
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
  if (cfg.family != "dit")
    throw UsageError("model " + cfg.name + ": family '" + cfg.family + "' is not dit (models::DiT builds DiT-*)");
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
    if (exec.fused_kernels) return unpatchify(fused::dit_forward(*this, x, c, exec));
    const at::Tensor h = run_blocks(x_embedder.forward(x) + pos_embed, c, exec);  // [B, T, D]
    return unpatchify(final_layer.forward(h, c));  // [B, out, H, W]
  });
}

at::Tensor DiT::run_blocks(at::Tensor h, const at::Tensor& c, const DiTExecution& exec) const {
  for (size_t i = 0; i < blocks.size(); ++i) {
    PERFTRAIN_SCOPE_INDEXED("block", i);  // a range in profiler traces (base/scope.h)
    const DiTBlock& block = blocks[i];
    // With recompute, backward calls fn again on autograd's thread after this
    // forward has returned: everything it reads is captured by value here.
    auto fn = [&block, exec](const at::Tensor& x, const at::Tensor& cond) { return block.forward(x, cond, exec); };
    h = exec.recompute ? ops::recompute(fn, h, c) : fn(h, c);
  }
  return h;
}

at::Tensor DiT::unpatchify(const at::Tensor& x) const { return models::unpatchify(x, cfg_); }

at::Tensor unpatchify(const at::Tensor& x, const DiTConfig& cfg) {
  const int64_t p = cfg.patch, c = cfg.out_channels(), g = cfg.image_size / p;
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
