#include "models/looped.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/binary_cross_entropy_with_logits.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <functional>
#include <utility>

#include "base/error.h"
#include "base/scope.h"
#include "models/fused/looped_fused.h"
#include "nn/init.h"
#include "ops/recompute.h"

namespace perftrain::models {
namespace {

at::Generator seeded(uint64_t seed, const at::Device& device = at::kCPU) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(seed);
  return gen;
}

template <class Block>
void add_blocks(nn::ModuleList<Block>& list, int64_t n, const DiTConfig& cfg, at::Generator& gen) {
  for (int64_t i = 0; i < n; ++i) list.add(std::make_unique<Block>(cfg, gen));
}

// fn(x, c), or under ops::recompute (its activations made again in backward).
at::Tensor apply(const ops::BlockFn& fn, const at::Tensor& x, const at::Tensor& c, const DiTExecution& exec) {
  return exec.recompute ? ops::recompute(fn, x, c) : fn(x, c);
}

// The plain path: the fused schedule is the looped-fused one, not a block's.
DiTExecution plain(const DiTExecution& exec) {
  DiTExecution e = exec;
  e.fused_kernels = false;
  return e;
}

// Tokens `index` [B, n] of x [B, S, D] -> [B, n, D].
at::Tensor gather_tokens(const at::Tensor& x, const at::Tensor& index) {
  return at::gather(x, 1, index.unsqueeze(-1).expand({index.size(0), index.size(1), x.size(2)}));
}

}  // namespace

LoopedDiTParts::LoopedDiTParts(const DiTConfig& cfg, at::Generator& gen)
    : x_embedder(cfg.in_channels, cfg.hidden, cfg.patch, gen),
      t_embedder(cfg.hidden, gen),
      y_embedder(cfg.num_classes, cfg.hidden, cfg.class_dropout > 0, gen),
      final_layer(cfg, gen) {
  pos_embed = nn::sincos_pos_embed_2d(cfg.hidden, cfg.image_size / cfg.patch).unsqueeze(0).to(gen.device());
  add_blocks(prelude, cfg.prelude, cfg, gen);
  add_blocks(shared, cfg.shared_group, cfg, gen);
  add_blocks(coda, cfg.coda, cfg, gen);
}

LoopedSingleStreamParts::LoopedSingleStreamParts(const DiTConfig& cfg, at::Generator& gen)
    : x_embedder(cfg.in_channels * cfg.patch * cfg.patch, cfg.hidden, gen, false),
      t_embedder(cfg.hidden, gen, /*bias=*/false),
      final_layer(cfg, gen) {
  if (cfg.cond_dim > 0)
    cond_embedder = std::make_unique<ConditionEmbedder>(cfg.cond_dim, cfg.hidden, gen);
  else
    y_embedder = std::make_unique<nn::LabelEmbedder>(cfg.num_classes, cfg.cond_tokens * cfg.hidden,
                                                     cfg.class_dropout > 0, gen);
  add_blocks(prelude, cfg.prelude, cfg, gen);
  add_blocks(shared, cfg.shared_group, cfg, gen);
  add_blocks(coda, cfg.coda, cfg, gen);
  std::tie(rope_cos, rope_sin) = single_stream_rope_tables(cfg, gen.device());
}

LoopedDiT::LoopedDiT(const DiTConfig& cfg, uint64_t seed) : LoopedDiT((cfg.validate(), cfg), seeded(seed)) {}

LoopedDiT::LoopedDiT(const DiTConfig& cfg, uint64_t seed, const at::Device& device)
    : LoopedDiT((cfg.validate(), cfg), seeded(seed, device)) {}

LoopedDiT::LoopedDiT(const DiTConfig& cfg, at::Generator gen) : cfg_(cfg) {
  if (!cfg.looped()) throw UsageError("model " + cfg.name + ": family '" + cfg.family + "' is not looped");
  if (cfg.single_stream())
    single_stream = std::make_unique<LoopedSingleStreamParts>(cfg, gen);
  else
    dit = std::make_unique<LoopedDiTParts>(cfg, gen);
  const int64_t D = cfg.hidden, L = cfg.loops;
  const auto options = nn::param_options(gen);
  loop_embed = at::zeros({L, D}, options);
  if (cfg.reinject == "concat") {
    reinject = std::make_unique<nn::Linear>(2 * D, D, gen);
    at::NoGradGuard no_grad;  // [I | 0]: starts as u = h
    reinject->weight.zero_();
    reinject->weight.narrow(1, 0, D).copy_(at::eye(D, options));
  }
  if (cfg.lora_rank > 0) {
    const double scale = cfg.lora_alpha / static_cast<double>(cfg.lora_rank);
    for (int64_t l = 0; l < L; ++l) {
      auto& loop = adapters.add(std::make_unique<nn::ModuleList<BlockAdapters>>());
      for (int64_t k = 0; k < cfg.shared_group; ++k)
        loop.add(std::make_unique<BlockAdapters>(cfg.lora_linears(), cfg.lora_rank, scale, cfg.lora_bias, gen));
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    if (!cfg.loop_routed(l)) continue;
    auto& r = routers.add(std::to_string(l), std::make_unique<nn::Linear>(D, 1, gen));
    nn::normal_(r.weight, 0.02, gen);
  }
  register_modules();
}

// The state_dict order: the stem, the blocks, the loops' own tensors, the final layer.
void LoopedDiT::register_modules() {
  if (dit) {
    register_parameter("pos_embed", &dit->pos_embed, /*trainable=*/false);
    register_module("x_embedder", &dit->x_embedder);
    register_module("t_embedder", &dit->t_embedder);
    register_module("y_embedder", &dit->y_embedder);
    register_module("prelude", &dit->prelude);
    register_module("shared", &dit->shared);
    register_module("coda", &dit->coda);
  } else {
    auto& s = *single_stream;
    register_module("x_embedder", &s.x_embedder);
    register_module("t_embedder", &s.t_embedder);
    if (s.y_embedder) register_module("y_embedder", s.y_embedder.get());
    if (s.cond_embedder) register_module("cond_embedder", s.cond_embedder.get());
    register_module("prelude", &s.prelude);
    register_module("shared", &s.shared);
    register_module("coda", &s.coda);
  }
  register_parameter("loop_embed", &loop_embed);
  if (reinject) register_module("reinject", reinject.get());
  if (adapters.size() > 0) register_module("adapters", &adapters);
  if (routers.size() > 0) register_module("routers", &routers);
  if (dit)
    register_module("final_layer", &dit->final_layer);
  else
    register_module("final_layer", &single_stream->final_layer);
}

const BlockAdapters* LoopedDiT::adapters_of(int64_t loop, int64_t k) const {
  if (adapters.size() == 0) return nullptr;
  return &adapters[static_cast<size_t>(loop)][static_cast<size_t>(k)];
}

DiTBlockWeights LoopedDiT::loop_weights(int64_t loop, int64_t k) const {
  DiTBlockWeights w = weights_of(dit->shared[static_cast<size_t>(k)]);
  const BlockAdapters* a = adapters_of(loop, k);
  if (a == nullptr) return w;
  std::tie(w.qkv_w, w.qkv_b) = a->merged("attn.qkv", w.qkv_w, w.qkv_b);
  std::tie(w.proj_w, w.proj_b) = a->merged("attn.proj", w.proj_w, w.proj_b);
  std::tie(w.fc1_w, w.fc1_b) = a->merged("mlp.fc1", w.fc1_w, w.fc1_b);
  std::tie(w.fc2_w, w.fc2_b) = a->merged("mlp.fc2", w.fc2_w, w.fc2_b);
  std::tie(w.ada_w, w.ada_b) = a->merged("adaLN_modulation.1", w.ada_w, w.ada_b);
  return w;
}

// Single-stream linears have no bias: a bias delta (lora_bias) has nowhere
// to go, so validate() refuses lora_bias with single_stream blocks.
SingleStreamBlockWeights LoopedDiT::single_stream_loop_weights(int64_t loop, int64_t k) const {
  SingleStreamBlockWeights w = weights_of(single_stream->shared[static_cast<size_t>(k)]);
  const BlockAdapters* a = adapters_of(loop, k);
  if (a == nullptr) return w;
  auto merge = [a](const char* path, at::Tensor& W) { W = a->merged(path, W, at::Tensor()).first; };
  merge("attn.qkv", w.qkv_w);
  merge("attn.proj", w.proj_w);
  merge("ffn.gate", w.gate_w);
  merge("ffn.up", w.up_w);
  merge("ffn.down", w.down_w);
  merge("adaLN_modulation", w.ada_w);
  return w;
}

at::Tensor LoopedDiT::loop_condition(const at::Tensor& c, int64_t loop) const {
  return c + loop_embed.select(0, loop).to(c.scalar_type());
}

at::Tensor LoopedDiT::reinjected(const at::Tensor& h, const at::Tensor& e) const {
  if (cfg_.reinject == "add") return h + e;
  if (cfg_.reinject == "concat") return reinject->forward(at::cat({h, e.to(h.scalar_type())}, -1));
  return h;
}

LoopRoute LoopedDiT::route(int64_t loop, const at::Tensor& image) const {
  const nn::Linear* r = router(loop);
  if (r == nullptr) throw RuntimeError("model " + cfg_.name + ": loop " + std::to_string(loop) + " is not routed");
  LoopRoute out;
  {
    // Scores in float32 whatever autocast says: top-k compares them.
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    out.scores = at::linear(image.to(at::kFloat), r->weight, r->bias).squeeze(-1);  // [B, T]
  }
  const int64_t k = cfg_.loop_tokens(loop);
  out.index = std::get<0>(at::sort(std::get<1>(at::topk(out.scores, k, 1)), 1));
  return with_gate_and_aux(std::move(out));
}

LoopRoute with_gate_and_aux(LoopRoute r) {
  const at::Tensor kept = at::sigmoid(at::gather(r.scores, 1, r.index));
  r.gate = 1 + kept - kept.detach();
  const at::Tensor mask = at::zeros_like(r.scores).scatter(1, r.index, 1.0);
  r.aux = at::binary_cross_entropy_with_logits(r.scores, mask);
  return r;
}

// One loop's group of shared blocks on x [B, n, D] under c_l; `positions`
// [B, n]: the places of x's tokens in the sequence (undefined: all of them).
using LoopGroupFn =
    std::function<at::Tensor(int64_t loop, const at::Tensor& x, const at::Tensor& c_l, const at::Tensor& positions)>;

// The loops over h [B, S, D] (the prelude's output), each in a "loop l"
// profiler range; S = cond_tokens + image tokens. Routed loops' unweighted
// auxiliary losses are appended to `aux`.
static at::Tensor run_loops(const LoopedDiT& m, at::Tensor h, const at::Tensor& c, int64_t cond_tokens,
                            const LoopGroupFn& group, std::vector<at::Tensor>& aux) {
  const DiTConfig& cfg = m.config();
  const at::Tensor e = h;
  for (int64_t l = 0; l < cfg.loops; ++l) {
    PERFTRAIN_SCOPE_INDEXED("loop", l);  // a range in profiler traces (base/scope.h)
    const at::Tensor c_l = m.loop_condition(c, l);
    const at::Tensor u = m.reinjected(h, e);
    if (!cfg.loop_routed(l)) {
      h = group(l, u, c_l, at::Tensor());
      continue;
    }
    const int64_t B = u.size(0), T = u.size(1) - cond_tokens;
    LoopRoute r = m.route(l, u.narrow(1, cond_tokens, T));
    aux.push_back(r.aux);
    at::Tensor positions = r.index, gate = r.gate;
    if (cond_tokens > 0) {  // the condition tokens always take part, ungated
      const at::Tensor cond_pos = at::arange(cond_tokens, r.index.options()).unsqueeze(0).expand({B, cond_tokens});
      positions = at::cat({cond_pos, r.index + cond_tokens}, 1);
      gate = at::cat({at::ones({B, cond_tokens}, gate.options()), gate}, 1);
    }
    const at::Tensor before = gather_tokens(u, positions);
    const at::Tensor after = group(l, before, c_l, positions);
    const at::Tensor change = (gate.unsqueeze(-1) * (after - before)).to(u.scalar_type());
    h = at::scatter_add(u, 1, positions.unsqueeze(-1).expand({B, positions.size(1), u.size(2)}), change);
  }
  return h;
}

at::Tensor LoopedDiT::forward(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                              const DiTExecution& exec) const {
  return forward_train(x, t, cond, exec).out;
}

ForwardOutput LoopedDiT::forward_train(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                                       const DiTExecution& exec) const {
  at::Tensor aux;
  at::Tensor out = hooked({x, t}, [&](at::TensorList in) {
    // The fused schedule (models/fused/looped_fused.h), but routed
    // single-stream loops keep the plain path (per-sample rotary tables).
    ForwardOutput o = exec.fused_kernels && !(single_stream && cfg_.routing())
                          ? fused::looped_forward(*this, in[0], in[1], cond, exec)
                          : forward_body(in[0], in[1], cond, plain(exec));
    aux = o.aux_loss;
    return o.out;
  });
  return {out, aux};
}

ForwardOutput LoopedDiT::forward_body(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                                      const DiTExecution& exec) const {
  return dit ? forward_dit(x, t, cond.labels, exec) : forward_single_stream(x, t, cond, exec);
}

// The weighted mean of the routed loops' losses (undefined: none routed).
static at::Tensor weighted_aux(const DiTConfig& cfg, const std::vector<at::Tensor>& aux) {
  if (aux.empty()) return at::Tensor();
  return at::stack(aux).mean() * cfg.router_aux_weight;
}

ForwardOutput LoopedDiT::forward_dit(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y,
                                     const DiTExecution& exec) const {
  const LoopedDiTParts& p = *dit;
  const at::Tensor c = p.t_embedder.forward(t) + p.y_embedder.forward(y);  // [B, D]
  int64_t index = 0;  // block applications so far, for the profiler ranges
  auto run = [&](const nn::ModuleList<DiTBlock>& blocks, at::Tensor h) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      PERFTRAIN_SCOPE_INDEXED("block", index++);
      const DiTBlock& block = blocks[i];
      h = apply([&block](const at::Tensor& a, const at::Tensor& b) { return block.forward(a, b); }, h, c, exec);
    }
    return h;
  };
  at::Tensor h = run(p.prelude, p.x_embedder.forward(x) + p.pos_embed);  // [B, T, D]
  const LoopGroupFn group = [this, &exec](int64_t l, const at::Tensor& in, const at::Tensor& c_l,
                                         const at::Tensor&) {
    at::Tensor g = in;
    for (int64_t k = 0; k < cfg_.shared_group; ++k) {
      // Merged inside fn: with recompute, backward merges again and the
      // gradients reach the shared weights and the adapters directly.
      auto fn = [this, l, k](const at::Tensor& a, const at::Tensor& b) {
        return dit->shared[static_cast<size_t>(k)].forward(a, b, loop_weights(l, k));
      };
      g = apply(fn, g, c_l, exec);
    }
    return g;
  };
  std::vector<at::Tensor> aux;
  h = run_loops(*this, h, c, 0, group, aux);
  index += cfg_.shared_group * cfg_.loops;
  h = run(p.coda, h);
  return {unpatchify(p.final_layer.forward(h, c), cfg_), weighted_aux(cfg_, aux)};
}

ForwardOutput LoopedDiT::forward_single_stream(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                                               const DiTExecution& exec) const {
  const LoopedSingleStreamParts& p = *single_stream;
  const int64_t B = x.size(0), Tc = cfg_.cond_tokens, T = cfg_.tokens();
  const at::Tensor temb = p.t_embedder.forward(t), silu_c = at::silu(temb);  // [B, D]
  auto [ctok, mask] = single_stream_condition(cfg_, p.y_embedder.get(), p.cond_embedder.get(), cond, B);
  const at::Tensor img = p.x_embedder.forward(single_stream_patches(x, cfg_));  // [B, T, D]
  const at::Tensor cos = p.rope_cos.to(x.device()), sin = p.rope_sin.to(x.device());
  int64_t index = 0;
  auto run = [&](const nn::ModuleList<SingleStreamBlock>& blocks, at::Tensor h) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      PERFTRAIN_SCOPE_INDEXED("block", index++);
      const SingleStreamBlock& block = blocks[i];
      auto fn = [&block, cos, sin, mask = mask](const at::Tensor& a, const at::Tensor& b) {
        return block.forward(a, b, cos, sin, mask);
      };
      h = apply(fn, h, silu_c, exec);
    }
    return h;
  };
  at::Tensor h = run(p.prelude, at::cat({ctok.to(img.scalar_type()), img}, 1));  // [B, Tc + T, D]
  const LoopGroupFn group = [&, this](int64_t l, const at::Tensor& in, const at::Tensor& temb_l,
                                      const at::Tensor& positions) {
    // A routed loop's tokens keep their own rotary positions and key mask.
    at::Tensor lcos = cos, lsin = sin, lmask = mask;
    if (positions.defined()) {
      lcos = cos.index_select(0, positions.reshape(-1)).view({B, 1, positions.size(1), cos.size(1)});
      lsin = sin.index_select(0, positions.reshape(-1)).view({B, 1, positions.size(1), sin.size(1)});
      if (mask.defined()) lmask = at::gather(mask.view({B, Tc + T}), 1, positions).view({B, 1, 1, positions.size(1)});
    }
    const at::Tensor silu_l = at::silu(temb_l);
    at::Tensor g = in;
    for (int64_t k = 0; k < cfg_.shared_group; ++k) {
      auto fn = [this, l, k, lcos, lsin, lmask](const at::Tensor& a, const at::Tensor& b) {
        return single_stream->shared[static_cast<size_t>(k)].forward(a, b, lcos, lsin, lmask,
                                                                   single_stream_loop_weights(l, k));
      };
      g = apply(fn, g, silu_l, exec);
    }
    return g;
  };
  std::vector<at::Tensor> aux;
  h = run_loops(*this, h, temb, Tc, group, aux);
  index += cfg_.shared_group * cfg_.loops;
  h = run(p.coda, h);
  const at::Tensor out = p.final_layer.forward(h.narrow(1, Tc, T), silu_c);
  return {unpatchify(out, cfg_), weighted_aux(cfg_, aux)};
}

}  // namespace perftrain::models
