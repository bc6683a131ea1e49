#include "models/fused/looped_fused.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/stack.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/scope.h"
#include "compat/compat.h"
#include "models/fused/dit_block.h"
#include "models/fused/dit_fused.h"
#include "models/fused/single_stream_block.h"
#include "models/fused/single_stream_fused.h"
#include "ops/gated_residual.h"
#include "ops/position_add.h"
#include "ops/recompute.h"
#include "ops/route_tokens.h"
#include "ops/stacked_linear.h"

namespace perftrain::models::fused {
namespace {

using Grid = std::vector<std::vector<at::Tensor>>;  // [loop][group position]

// silu(c + loop_embed[l]) of every loop, [L, B, D] in act.
at::Tensor loop_silu(const LoopedDiT& m, const at::Tensor& c, at::ScalarType act) {
  return at::silu(c.unsqueeze(0) + m.loop_embed.unsqueeze(1).to(c.scalar_type())).to(act);
}

// Whether every loop reads one tensor (or none) at each group position.
bool same_in_every_loop(const Grid& t) {
  for (const auto& loop : t)
    for (size_t k = 0; k < loop.size(); ++k)
      if (loop[k].defined() != t[0][k].defined() || (loop[k].defined() && !loop[k].is_same(t[0][k]))) return false;
  return true;
}

// Every loop's modulations, silu_cl [L, B, D] -> [L, B, K * n] for the
// modulation weights w[l][k] [n, D] and biases b[l][k] (undefined: none).
// Shared weights (no adaln adapter): one stacked_linear of all L * B rows,
// reading the bf16 copies in place. Per-loop weights: one batched product.
at::Tensor loop_modulation_product(const Grid& w, const Grid& b, const at::Tensor& silu_cl) {
  const bool biased = b[0][0].defined();
  if (same_in_every_loop(w) && same_in_every_loop(b))
    return ops::stacked_linear(silu_cl, w[0], biased ? b[0] : std::vector<at::Tensor>{});
  const at::ScalarType act = silu_cl.scalar_type();
  std::vector<at::Tensor> ws, bs;
  for (size_t l = 0; l < w.size(); ++l) {
    ws.push_back(at::cat(w[l], 0));  // [K * n, D]
    if (biased) bs.push_back(at::cat(b[l], 0));
  }
  const at::Tensor wt = at::stack(ws).to(act).transpose(1, 2);  // [L, D, K * n]
  return biased ? at::baddbmm(at::stack(bs).to(act).unsqueeze(1), silu_cl, wt) : at::bmm(silu_cl, wt);
}

// The routers' losses as the plain forward weighs them (undefined: none).
at::Tensor weighted_aux(const DiTConfig& cfg, const std::vector<at::Tensor>& aux) {
  if (aux.empty()) return at::Tensor();
  return at::stack(aux).mean() * cfg.router_aux_weight;
}

// Applications waiting to run chained from `start` (the residual stream).
template <class Application, class Modulation>
struct Chain {
  at::Tensor start;
  std::vector<Application> seq;
  std::vector<Modulation> mods;
  void add(const Application& a, const Modulation& mod) {
    seq.push_back(a);
    mods.push_back(mod);
  }
};
using DiTChain = Chain<DiTApplication, DiTModulation>;
using SingleStreamChain = Chain<SingleStreamApplication, SingleStreamModulation>;

// The prelude and coda blocks with their own weights, in that order (keys
// "prelude.i", "coda.j").
template <class Block>
auto ends_of(const nn::ModuleList<Block>& prelude, const nn::ModuleList<Block>& coda) {
  std::vector<const Block*> blocks;
  for (size_t i = 0; i < prelude.size(); ++i) blocks.push_back(&prelude[i]);
  for (size_t i = 0; i < coda.size(); ++i) blocks.push_back(&coda[i]);
  auto seq = own_weights(blocks, "prelude");
  for (size_t j = 0; j < coda.size(); ++j) seq[prelude.size() + j].key = "coda." + std::to_string(j);
  return seq;
}

// Shared block k's key in loop l.
std::string loop_key(int64_t k, int64_t l) { return "shared." + std::to_string(k) + ".loop." + std::to_string(l); }

// Each block alone under ops::recompute, run(block, x, c) its forward: x -> x.
template <class Block, class Run>
at::Tensor recomputed_blocks(const nn::ModuleList<Block>& blocks, at::Tensor x, const at::Tensor& c, const Run& run) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block* block = &blocks[i];
    x = ops::recompute([block, run](const at::Tensor& a, const at::Tensor& b) { return run(*block, a, b); }, x, c);
  }
  return x;
}

// A group of shared blocks on the kept tokens g [B, k, D] -> [B, k, D].
using GroupFn = std::function<at::Tensor(const at::Tensor& g)>;

// Routed loop l on u [B, T, D] fp32 (DiT tokens: all image tokens): the
// router's kept tokens through `group`, their gated change back into u
// (LoopedDiT::route's maths in ops/route_tokens.h: one pass over u each way).
at::Tensor routed_loop(const LoopedDiT& m, int64_t l, const at::Tensor& u, const GroupFn& group,
                       std::vector<at::Tensor>& aux) {
  const nn::Linear& router = *m.router(l);
  const ops::RouteSelection sel = ops::route_select(u, router.weight, router.bias, m.config().loop_tokens(l));
  const LoopRoute r = with_gate_and_aux({sel.scores, sel.index, at::Tensor(), at::Tensor()});
  aux.push_back(r.aux);
  return ops::route_combine(sel.through, sel.kept, group(sel.kept), r.gate, sel.index);
}

// ---- DiT blocks ----

// The waiting applications run, their last residual added alone: -> the
// residual stream (start when none wait), from which the chain starts again.
at::Tensor flush(DiTChain& chain, at::ScalarType act, bool keep_activation, Fp8States* fp8) {
  if (!chain.seq.empty())
    chain.start = dit_blocks_chained(
        chain.seq, chain.mods, chain.start, act, keep_activation,
        [](const GatedResidual& r) { return ops::gated_residual(r.x, r.gate, r.y, r.bias); }, fp8);
  chain.seq.clear();
  chain.mods.clear();
  return chain.start;
}

// Each loop's group: the shared blocks with the loop's weights, and their
// modulations from all loops' conditions in one product.
struct DiTLoops {
  std::vector<DiTBlockSeq> apps;                 // [L][K]
  std::vector<std::vector<DiTModulation>> mods;  // [L][K]
};

DiTLoops dit_loops(const LoopedDiT& m, const at::Tensor& silu_cl) {
  const DiTConfig& cfg = m.config();
  DiTLoops out;
  Grid w, b;
  for (int64_t l = 0; l < cfg.loops; ++l) {
    out.apps.emplace_back();
    w.emplace_back(), b.emplace_back();
    for (int64_t k = 0; k < cfg.shared_group; ++k) {
      const DiTBlockWeights lw = m.loop_weights(l, k);
      out.apps.back().push_back({&m.dit->shared[static_cast<size_t>(k)], lw, at::Tensor(), "loop", l, loop_key(k, l)});
      w.back().push_back(lw.ada_w), b.back().push_back(lw.ada_b);
    }
  }
  const at::Tensor product = loop_modulation_product(w, b, silu_cl);  // [L, B, K * 6D]
  for (int64_t l = 0; l < cfg.loops; ++l)
    out.mods.push_back(split_dit_modulations(product.select(0, l), static_cast<size_t>(cfg.shared_group)));
  return out;
}

// Every application chained where the stream allows (looped_fused.h), from
// the embedded tokens h to the final layer's tokens [B, T, p*p*out].
at::Tensor dit_chained(const LoopedDiT& m, const at::Tensor& h, const at::Tensor& c, at::ScalarType act,
                       bool keep_activation, Fp8States* fp8, std::vector<at::Tensor>& aux) {
  const DiTConfig& cfg = m.config();
  const LoopedDiTParts& p = *m.dit;
  const at::Tensor silu_c = at::silu(c).to(act);
  const DiTBlockSeq ends = ends_of(p.prelude, p.coda);
  const std::vector<DiTModulation> end_mods = dit_modulations(ends, silu_c);
  const DiTLoops loops = dit_loops(m, loop_silu(m, c, act));
  const size_t P = p.prelude.size();
  DiTChain chain{h, {}, {}};
  for (size_t i = 0; i < P; ++i) chain.add(ends[i], end_mods[i]);
  const at::Tensor e = cfg.reinject == "none" ? at::Tensor() : flush(chain, act, keep_activation, fp8);
  for (int64_t l = 0; l < cfg.loops; ++l) {
    const DiTBlockSeq& apps = loops.apps[static_cast<size_t>(l)];
    const std::vector<DiTModulation>& mods = loops.mods[static_cast<size_t>(l)];
    if (cfg.loop_routed(l)) {
      const at::Tensor u = m.reinjected(flush(chain, act, keep_activation, fp8), e).to(at::kFloat);
      chain.start = routed_loop(m, l, u, [&](const at::Tensor& g) {
        DiTChain group{g, apps, mods};
        return flush(group, act, keep_activation, fp8);
      }, aux);
      continue;
    }
    if (cfg.reinject == "concat") chain.start = m.reinjected(flush(chain, act, keep_activation, fp8), e).to(at::kFloat);
    for (size_t k = 0; k < apps.size(); ++k) {
      DiTApplication a = apps[k];
      if (k == 0 && cfg.reinject == "add") a.enter_add = e;  // u = h + e, added inside the chain
      chain.add(a, mods[k]);
    }
  }
  for (size_t j = P; j < ends.size(); ++j) chain.add(ends[j], end_mods[j]);
  if (chain.seq.empty()) return dit_final_layer(p.final_layer, chain.start, c);
  return dit_blocks_chained(
      chain.seq, chain.mods, chain.start, act, keep_activation,
      [&](const GatedResidual& last) { return dit_final_layer_after(p.final_layer, last, silu_c, act); }, fp8);
}

// fn(x, c) under ops::recompute (backward runs it again: fn captures by value).
at::Tensor recomputed(const ops::BlockFn& fn, const at::Tensor& x, const at::Tensor& c) {
  return ops::recompute(fn, x, c);
}

// With recompute: every application alone (fused::dit_block), the loop's
// weights merged inside it, then the final layer.
at::Tensor dit_one_by_one(const LoopedDiT& m, at::Tensor h, const at::Tensor& c, const DiTExecution& exec,
                          std::vector<at::Tensor>& aux) {
  const DiTConfig& cfg = m.config();
  const LoopedDiTParts& p = *m.dit;
  auto own = [exec](const DiTBlock& block, const at::Tensor& a, const at::Tensor& b) {
    return dit_block(block, weights_of(block), a, b, exec);
  };
  h = recomputed_blocks(p.prelude, h, c, own);
  const at::Tensor e = h;
  for (int64_t l = 0; l < cfg.loops; ++l) {
    PERFTRAIN_SCOPE_INDEXED("loop", l);
    const at::Tensor c_l = m.loop_condition(c, l);
    const LoopedDiT* mp = &m;
    const GroupFn group = [mp, &c_l, l, exec](at::Tensor g) {
      for (int64_t k = 0; k < mp->config().shared_group; ++k)
        g = recomputed([mp, l, k, exec](const at::Tensor& a, const at::Tensor& b) {
          return dit_block(mp->dit->shared[static_cast<size_t>(k)], mp->loop_weights(l, k), a, b, exec);
        }, g, c_l);
      return g;
    };
    const at::Tensor u = m.reinjected(h, e).to(at::kFloat);
    h = cfg.loop_routed(l) ? routed_loop(m, l, u, group, aux) : group(u);
  }
  return dit_final_layer(p.final_layer, recomputed_blocks(p.coda, h, c, own), c);
}

ForwardOutput dit_looped(const LoopedDiT& m, const at::Tensor& x, const at::Tensor& t, const at::Tensor& y,
                         const DiTExecution& exec) {
  const LoopedDiTParts& p = *m.dit;
  const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
  const at::Tensor c = p.t_embedder.forward(t) + p.y_embedder.forward(y);  // [B, D]
  const at::Tensor h = ops::position_add(p.x_embedder.forward_as_product(x, act), p.pos_embed);  // [B, T, D]
  std::vector<at::Tensor> aux;
  const at::Tensor out = exec.recompute ? dit_one_by_one(m, h, c, exec, aux)
                                        : dit_chained(m, h, c, act, !exec.gelu_recompute, exec.fp8, aux);
  return {unpatchify(out, m.config()), weighted_aux(m.config(), aux)};
}

// ---- single-stream blocks (unrouted: LoopedDiT runs routed single-stream loops on its plain path) ----

at::Tensor flush(SingleStreamChain& chain, const SingleStreamContext& ctx) {
  if (!chain.seq.empty())
    chain.start = single_stream_blocks_chained(chain.seq, chain.mods, chain.start, ctx, [&](const PostNormResidual& r) {
      return add_with_rms_norm(r, at::Tensor(), at::Tensor(), ctx.act).first;
    });
  chain.seq.clear();
  chain.mods.clear();
  return chain.start;
}

// Each loop's applications and modulations (as dit_loops), [L][K].
std::pair<std::vector<SingleStreamBlockSeq>, std::vector<std::vector<SingleStreamModulation>>> single_stream_loops(
    const LoopedDiT& m, const at::Tensor& silu_cl) {
  const DiTConfig& cfg = m.config();
  std::vector<SingleStreamBlockSeq> apps;
  std::vector<std::vector<SingleStreamModulation>> mods;
  Grid w, b;
  for (int64_t l = 0; l < cfg.loops; ++l) {
    apps.emplace_back();
    w.emplace_back(), b.emplace_back();
    for (int64_t k = 0; k < cfg.shared_group; ++k) {
      const SingleStreamBlockWeights lw = m.single_stream_loop_weights(l, k);
      apps.back().push_back({&m.single_stream->shared[static_cast<size_t>(k)], lw, at::Tensor(), "loop", l, loop_key(k, l)});
      w.back().push_back(lw.ada_w), b.back().push_back(at::Tensor());
    }
  }
  const at::Tensor product = loop_modulation_product(w, b, silu_cl);  // [L, B, K * 4D]
  for (int64_t l = 0; l < cfg.loops; ++l)
    mods.push_back(split_single_stream_modulations(product.select(0, l), static_cast<size_t>(cfg.shared_group)));
  return {apps, mods};
}

// Chained as dit_chained (no routing), from the tokens x0 [B, S, D] to the
// final layer's [B, S, p*p*out].
at::Tensor single_stream_chained(const LoopedDiT& m, const at::Tensor& x0, const at::Tensor& temb,
                                 const SingleStreamContext& ctx) {
  const DiTConfig& cfg = m.config();
  const LoopedSingleStreamParts& p = *m.single_stream;
  const at::Tensor silu_c = at::silu(temb).to(ctx.act);
  const SingleStreamBlockSeq ends = ends_of(p.prelude, p.coda);
  const auto end_mods = single_stream_modulations(ends, silu_c);
  const auto [apps, mods] = single_stream_loops(m, loop_silu(m, temb, ctx.act));
  const size_t P = p.prelude.size();
  SingleStreamChain chain{x0, {}, {}};
  for (size_t i = 0; i < P; ++i) chain.add(ends[i], end_mods[i]);
  const at::Tensor e = cfg.reinject == "none" ? at::Tensor() : flush(chain, ctx);
  for (int64_t l = 0; l < cfg.loops; ++l) {
    if (cfg.reinject == "concat") chain.start = m.reinjected(flush(chain, ctx), e).to(at::kFloat);
    const SingleStreamBlockSeq& group = apps[static_cast<size_t>(l)];
    for (size_t k = 0; k < group.size(); ++k) {
      SingleStreamApplication a = group[k];
      if (k == 0 && cfg.reinject == "add") a.enter_add = e;  // u = h + e, added inside the chain
      chain.add(a, mods[static_cast<size_t>(l)][k]);
    }
  }
  for (size_t j = P; j < ends.size(); ++j) chain.add(ends[j], end_mods[j]);
  if (chain.seq.empty()) return single_stream_final_layer(p.final_layer, chain.start, silu_c, ctx.act);
  const at::Tensor final_scale = single_stream_final_scale(p.final_layer, silu_c);
  return single_stream_blocks_chained(chain.seq, chain.mods, chain.start, ctx, [&](const PostNormResidual& last) {
    return single_stream_final_layer_after(p.final_layer, last, final_scale, ctx.act);
  });
}

// With recompute: every application alone (fused::single_stream_block), the
// loop's weights merged inside it, then the final layer.
at::Tensor single_stream_one_by_one(const LoopedDiT& m, at::Tensor h, const at::Tensor& temb,
                                    const SingleStreamContext& ctx) {
  const DiTConfig& cfg = m.config();
  const LoopedSingleStreamParts& p = *m.single_stream;
  const at::Tensor silu_c = at::silu(temb).to(ctx.act);
  auto own = [ctx](const SingleStreamBlock& block, const at::Tensor& a, const at::Tensor& b) {
    return single_stream_block(block, weights_of(block), a, b, ctx);
  };
  h = recomputed_blocks(p.prelude, h, silu_c, own);
  const at::Tensor e = h;
  const LoopedDiT* mp = &m;
  for (int64_t l = 0; l < cfg.loops; ++l) {
    PERFTRAIN_SCOPE_INDEXED("loop", l);
    const at::Tensor silu_l = at::silu(m.loop_condition(temb, l)).to(ctx.act);
    h = m.reinjected(h, e).to(at::kFloat);
    for (int64_t k = 0; k < cfg.shared_group; ++k)
      h = recomputed([mp, l, k, ctx](const at::Tensor& a, const at::Tensor& b) {
        return single_stream_block(mp->single_stream->shared[static_cast<size_t>(k)],
                                   mp->single_stream_loop_weights(l, k), a, b, ctx);
      }, h, silu_l);
  }
  return single_stream_final_layer(p.final_layer, recomputed_blocks(p.coda, h, silu_c, own), silu_c, ctx.act);
}

ForwardOutput single_stream_looped(const LoopedDiT& m, const at::Tensor& x, const at::Tensor& t,
                                   const Condition& cond, const DiTExecution& exec) {
  const DiTConfig& cfg = m.config();
  const LoopedSingleStreamParts& p = *m.single_stream;
  if (cfg.routing()) throw RuntimeError("looped_forward: single-stream blocks with routing run the plain path");
  const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
  const int64_t Tc = cfg.cond_tokens, T = cfg.tokens();
  const at::Tensor temb = p.t_embedder.forward(t);  // [B, D]
  const auto [ctok, mask] = single_stream_condition(cfg, p.y_embedder.get(), p.cond_embedder.get(), cond, x.size(0));
  const at::Tensor x0 = single_stream_tokens(p.x_embedder, single_stream_patches(x, cfg), ctok, act);
  SingleStreamContext ctx = single_stream_context(p.rope_cos.to(x.device()), p.rope_sin.to(x.device()), mask, act,
                                                  !exec.gelu_recompute);
  ctx.fp8 = exec.fp8;
  const at::Tensor all = exec.recompute ? single_stream_one_by_one(m, x0, temb, ctx) : single_stream_chained(m, x0, temb, ctx);
  const at::Tensor out = all.narrow(1, Tc, T);
  return {unpatchify(out, cfg), at::Tensor()};
}

}  // namespace

ForwardOutput looped_forward(const LoopedDiT& model, const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                             const DiTExecution& exec) {
  if (model.dit) return dit_looped(model, x, t, cond.labels, exec);
  return single_stream_looped(model, x, t, cond, exec);
}

}  // namespace perftrain::models::fused
