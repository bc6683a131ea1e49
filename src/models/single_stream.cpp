#include "models/single_stream.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "models/dit.h"
#include "models/fused/single_stream_fused.h"
#include "nn/rotary.h"
#include "ops/recompute.h"

namespace perftrain::models {
namespace {

void zero_weight(at::Tensor& w) {
  at::NoGradGuard no_grad;
  w.zero_();
}

at::Generator seeded(uint64_t seed, const at::Device& device = at::kCPU) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(seed);
  return gen;
}

}  // namespace

SingleStreamAttention::SingleStreamAttention(int64_t hidden, int64_t heads, at::Generator& gen)
    : qkv(hidden, 3 * hidden, gen, false),
      q_norm(hidden / heads, gen),
      k_norm(hidden / heads, gen),
      proj(hidden, hidden, gen, false),
      heads_(heads) {
  register_module("qkv", &qkv);
  register_module("q_norm", &q_norm);
  register_module("k_norm", &k_norm);
  register_module("proj", &proj);
}

at::Tensor SingleStreamAttention::forward(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                                          const at::Tensor& mask) const {
  return hooked({x_in}, [&](at::TensorList in) {  // the hook point (nn/module.h): x is the input it watches
    return proj.forward(attend(qkv.forward(in[0]), cos, sin, mask));
  });
}

at::Tensor SingleStreamAttention::attend(const at::Tensor& qkv_out, const at::Tensor& cos, const at::Tensor& sin,
                                         const at::Tensor& mask) const {
  const int64_t B = qkv_out.size(0), T = qkv_out.size(1), D = qkv_out.size(2) / 3, hd = D / heads_;
  const auto parts = qkv_out.view({B, T, 3, heads_, hd}).permute({2, 0, 3, 1, 4}).unbind(0);  // [B, H, T, hd]
  const at::Tensor q = nn::apply_rope(q_norm.forward(parts[0]), cos, sin);
  const at::Tensor k = nn::apply_rope(k_norm.forward(parts[1]), cos, sin);
  const std::optional<at::Tensor> m = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  const at::Tensor o = at::scaled_dot_product_attention(q, k, parts[2], m);  // [B, H, T, hd]
  return o.transpose(1, 2).reshape({B, T, D});
}

SingleStreamBlock::SingleStreamBlock(const DiTConfig& cfg, at::Generator& gen)
    : attn_norm(cfg.hidden, gen),
      attn(cfg.hidden, cfg.heads, gen),
      attn_post_norm(cfg.hidden, gen),
      ffn_norm(cfg.hidden, gen),
      ffn(cfg.hidden, cfg.mlp_hidden(), gen),
      ffn_post_norm(cfg.hidden, gen),
      adaLN_modulation(cfg.hidden, 4 * cfg.hidden, gen, false) {
  zero_weight(adaLN_modulation.weight);
  register_module("attn_norm", &attn_norm);
  register_module("attn", &attn);
  register_module("attn_post_norm", &attn_post_norm);
  register_module("ffn_norm", &ffn_norm);
  register_module("ffn", &ffn);
  register_module("ffn_post_norm", &ffn_post_norm);
  register_module("adaLN_modulation", &adaLN_modulation);
}

template <class Attn, class Ffn>
at::Tensor SingleStreamBlock::body(const at::Tensor& x, const at::Tensor& modulation, const Attn& attend,
                                   const Ffn& ffn_of) const {
  const auto mod = modulation.chunk(4, 1);  // scale, gate (attention); scale, gate (FFN)
  at::Tensor h = attn_norm.forward(x) * (1 + mod[0].unsqueeze(1));
  const at::Tensor x1 = x + at::tanh(mod[1]).unsqueeze(1) * attn_post_norm.forward(attend(h));
  h = ffn_norm.forward(x1) * (1 + mod[2].unsqueeze(1));
  return x1 + at::tanh(mod[3]).unsqueeze(1) * ffn_post_norm.forward(ffn_of(h));
}

at::Tensor SingleStreamBlock::forward(const at::Tensor& x_in, const at::Tensor& silu_c_in, const at::Tensor& cos,
                                      const at::Tensor& sin, const at::Tensor& mask) const {
  return hooked({x_in, silu_c_in}, [&](at::TensorList in) {
    return body(
        in[0], adaLN_modulation.forward(in[1]),
        [&](const at::Tensor& h) { return attn.forward(h, cos, sin, mask); },
        [this](const at::Tensor& h) { return ffn.forward(h); });
  });
}

at::Tensor SingleStreamBlock::forward(const at::Tensor& x_in, const at::Tensor& silu_c_in, const at::Tensor& cos,
                                      const at::Tensor& sin, const at::Tensor& mask,
                                      const SingleStreamBlockWeights& w) const {
  return hooked({x_in, silu_c_in}, [&](at::TensorList in) {
    return body(
        in[0], at::linear(in[1], w.ada_w),
        [&](const at::Tensor& h) { return at::linear(attn.attend(at::linear(h, w.qkv_w), cos, sin, mask), w.proj_w); },
        [&w](const at::Tensor& h) {
          return at::linear(at::silu(at::linear(h, w.gate_w)) * at::linear(h, w.up_w), w.down_w);
        });
  });
}

SingleStreamFinalLayer::SingleStreamFinalLayer(const DiTConfig& cfg, at::Generator& gen)
    : adaLN_modulation(cfg.hidden, cfg.hidden, gen, false),
      linear(cfg.hidden, cfg.patch * cfg.patch * cfg.out_channels(), gen, false) {
  zero_weight(adaLN_modulation.weight);
  zero_weight(linear.weight);
  register_module("adaLN_modulation", &adaLN_modulation);
  register_module("linear", &linear);
}

at::Tensor SingleStreamFinalLayer::forward(const at::Tensor& x, const at::Tensor& silu_c) const {
  return hooked({x, silu_c}, [this](at::TensorList in) {
    const at::Tensor scale = adaLN_modulation.forward(in[1]).unsqueeze(1);
    return linear.forward(nn::rms_norm(in[0], at::Tensor()) * (1 + scale));
  });
}

ConditionEmbedder::ConditionEmbedder(int64_t cond_dim, int64_t hidden, at::Generator& gen)
    : norm(cond_dim, gen), linear(cond_dim, hidden, gen, false) {
  register_module("norm", &norm);
  register_module("linear", &linear);
}

at::Tensor ConditionEmbedder::forward(const at::Tensor& features) const {
  return hooked({features}, [this](at::TensorList in) { return linear.forward(norm.forward(in[0])); });
}

SingleStreamDiT::SingleStreamDiT(const DiTConfig& cfg, uint64_t seed)
    : SingleStreamDiT((cfg.validate(), cfg), seeded(seed)) {}

SingleStreamDiT::SingleStreamDiT(const DiTConfig& cfg, uint64_t seed, const at::Device& device)
    : SingleStreamDiT((cfg.validate(), cfg), seeded(seed, device)) {}

SingleStreamDiT::SingleStreamDiT(const DiTConfig& cfg, at::Generator gen)
    : cfg_(cfg),
      x_embedder(cfg.in_channels * cfg.patch * cfg.patch, cfg.hidden, gen, false),
      t_embedder(cfg.hidden, gen, /*bias=*/false),
      final_layer(cfg, gen) {
  if (cfg.family != "single-stream")
    throw UsageError("model " + cfg.name + ": family '" + cfg.family + "' is not single-stream");
  if (cfg.cond_dim > 0)
    cond_embedder = std::make_unique<ConditionEmbedder>(cfg.cond_dim, cfg.hidden, gen);
  else
    y_embedder = std::make_unique<nn::LabelEmbedder>(cfg.num_classes, cfg.cond_tokens * cfg.hidden,
                                                     cfg.class_dropout > 0, gen);
  for (int64_t i = 0; i < cfg.depth; ++i) blocks.add(std::make_unique<SingleStreamBlock>(cfg, gen));
  register_module("x_embedder", &x_embedder);
  register_module("t_embedder", &t_embedder);
  if (y_embedder) register_module("y_embedder", y_embedder.get());
  if (cond_embedder) register_module("cond_embedder", cond_embedder.get());
  register_module("blocks", &blocks);
  register_module("final_layer", &final_layer);
  std::tie(rope_cos, rope_sin) = single_stream_rope_tables(cfg, gen.device());
}

std::pair<at::Tensor, at::Tensor> single_stream_rope_tables(const DiTConfig& cfg, const at::Device& device) {
  std::vector<std::array<int64_t, 3>> positions;
  const int64_t Tc = cfg.cond_tokens, g = cfg.image_size / cfg.patch;
  for (int64_t i = 0; i < Tc; ++i) positions.push_back({i, 0, 0});
  for (int64_t r = 0; r < g; ++r)
    for (int64_t c = 0; c < g; ++c) positions.push_back({Tc, r, c});
  auto [cos, sin] = nn::rope_tables(positions, cfg.hidden / cfg.heads);
  return {cos.to(device), sin.to(device)};
}

std::pair<at::Tensor, at::Tensor> SingleStreamDiT::condition_tokens(const Condition& cond, int64_t batch) const {
  return single_stream_condition(cfg_, y_embedder.get(), cond_embedder.get(), cond, batch);
}

std::pair<at::Tensor, at::Tensor> single_stream_condition(const DiTConfig& cfg, const nn::LabelEmbedder* y_embedder,
                                                          const ConditionEmbedder* cond_embedder,
                                                          const Condition& cond, int64_t batch) {
  const int64_t Tc = cfg.cond_tokens, D = cfg.hidden;
  if (y_embedder) {
    if (!cond.labels.defined()) throw RuntimeError("model " + cfg.name + " is class-conditional: no labels given");
    return {y_embedder->forward(cond.labels).view({batch, Tc, D}), at::Tensor()};
  }
  const at::Tensor& f = cond.features;
  if (!f.defined() || f.dim() != 3 || f.size(0) != batch || f.size(1) != Tc || f.size(2) != cfg.cond_dim)
    throw RuntimeError("model " + cfg.name + " takes condition features [" + std::to_string(batch) + ", " +
                       std::to_string(Tc) + ", " + std::to_string(cfg.cond_dim) + "]" +
                       (f.defined() ? ", given " + c10::str(f.sizes()) : ", given none"));
  if (!cond.lengths.defined()) return {cond_embedder->forward(f), at::Tensor()};
  // Keys: condition token j counts when j < length; image tokens always.
  const at::Tensor idx = at::arange(Tc + cfg.tokens(), cond.lengths.options().dtype(at::kLong));
  const at::Tensor lengths = cond.lengths.to(at::kLong).unsqueeze(1);
  const at::Tensor valid = (idx.unsqueeze(0) < lengths) | (idx >= Tc).unsqueeze(0);  // [B, Tc + T]
  // Padding zeroed, so that whatever the data held there (even NaN) cannot
  // reach the masked-out keys' zero weights.
  const at::Tensor features = at::where(valid.narrow(1, 0, Tc).unsqueeze(2), f, at::zeros_like(f));
  return {cond_embedder->forward(features), valid.view({batch, 1, 1, Tc + cfg.tokens()})};
}

at::Tensor SingleStreamDiT::forward(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                                    const DiTExecution& exec) const {
  return hooked({x, t}, [&](at::TensorList in) { return forward_body(in[0], in[1], cond, exec); });
}

at::Tensor SingleStreamDiT::forward_body(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                                         const DiTExecution& exec) const {
  const int64_t B = x.size(0), g = cfg_.image_size / cfg_.patch, Tc = cfg_.cond_tokens;
  const at::Tensor silu_c = at::silu(t_embedder.forward(t));  // [B, D]
  const at::Tensor patches = single_stream_patches(x, cfg_);
  auto [ctok, mask] = condition_tokens(cond, B);
  at::Tensor out;  // [B, T, p*p*out]
  if (exec.fused_kernels) {
    out = fused::single_stream_forward(*this, patches, ctok, mask, silu_c, exec);
  } else {
    const at::Tensor img = x_embedder.forward(patches);  // [B, T, D]
    at::Tensor h = at::cat({ctok.to(img.scalar_type()), img}, 1);  // [B, Tc + T, D]
    const at::Tensor cos = rope_cos.to(x.device()), sin = rope_sin.to(x.device());
    for (size_t i = 0; i < blocks.size(); ++i) {
      const SingleStreamBlock& block = blocks[i];
      // With recompute, backward calls fn again after forward has returned:
      // everything it reads is captured by value.
      auto fn = [&block, cos, sin, mask = mask](const at::Tensor& xx, const at::Tensor& c) {
        return block.forward(xx, c, cos, sin, mask);
      };
      h = exec.recompute ? ops::recompute(fn, h, silu_c) : fn(h, silu_c);
    }
    out = final_layer.forward(h.narrow(1, Tc, g * g), silu_c);
  }
  return unpatchify(out, cfg_);
}

at::Tensor single_stream_patches(const at::Tensor& x, const DiTConfig& cfg) {
  const int64_t B = x.size(0), C = x.size(1), p = cfg.patch, g = cfg.image_size / p;
  return x.reshape({B, C, g, p, g, p}).permute({0, 2, 4, 1, 3, 5}).reshape({B, g * g, C * p * p});
}

}  // namespace perftrain::models
