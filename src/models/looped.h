// The looped DiT (docs/guide/architectures.md, "Looped"): prelude blocks,
// a group of K shared blocks applied L times, coda blocks, of one block kind
// (model.loop_block: DiT's adaLN-Zero block or the single-stream block, with
// that family's stem and final layer).
//   h = stem(x); c = conditioning
//   h = prelude(h, c); e = h
//   for loop l < L: c_l = c + loop_embed[l]; u = reinject(h, e)
//     plain loop:  h = shared_{K-1}(... shared_0(u, c_l; W_l0) ..., c_l; W_l,K-1)
//     routed loop (capacity < 1): the router's top-k image tokens of u, in
//       image order, go through the group; h = u + their gated change
//   h = coda(h, c); out = final_layer(h, c)
// Loop l's weights for group position k: W_lk = W_k + (alpha/r) B_lk A_lk
// (depth-wise LoRA, merged in float32; exact), bias b_k + delta_lk. With
// single-stream blocks loop_embed is added to the timestep embedding before
// its SiLU, and only image tokens are routed (the condition tokens always
// take part). Routing: s = router_l(u) [B, T]; idx = top-k(s) sorted;
// gate = 1 + sigmoid(s_idx) - sigmoid(s_idx).detach() (value 1, the router's
// gradient); aux = router_aux_weight * mean over routed loops of
// BCE-with-logits(s, top-k mask). Routers: Linear(D, 1), weight normal(0,
// 0.02), bias 0, one per routed loop ("routers.<l>").
// Names and math match bench/reference_looped.py. The model knows nothing of
// how it is run: as DiT, the execution plan comes in a DiTExecution.
#pragma once

#include <memory>
#include <vector>

#include "models/block_weights.h"
#include "models/diffusion_model.h"
#include "models/dit.h"
#include "models/looped_adapters.h"
#include "models/single_stream.h"

namespace perftrain::models {

// The stem, blocks and final layer of loop_block dit: models::DiT's modules
// under DiT's names (prelude, shared, coda in place of blocks).
struct LoopedDiTParts {
  LoopedDiTParts(const DiTConfig& cfg, at::Generator& gen);
  at::Tensor pos_embed;  // [1, T, D], fixed
  nn::PatchEmbed x_embedder;
  nn::TimestepEmbedder t_embedder;
  nn::LabelEmbedder y_embedder;
  nn::ModuleList<DiTBlock> prelude, shared, coda;
  FinalLayer final_layer;
};

// The same of loop_block single_stream: models::SingleStreamDiT's modules.
struct LoopedSingleStreamParts {
  LoopedSingleStreamParts(const DiTConfig& cfg, at::Generator& gen);
  nn::Linear x_embedder;  // patches [B, T, C*p*p] -> D
  nn::TimestepEmbedder t_embedder;
  std::unique_ptr<nn::LabelEmbedder> y_embedder;     // class labels
  std::unique_ptr<ConditionEmbedder> cond_embedder;  // features
  nn::ModuleList<SingleStreamBlock> prelude, shared, coda;
  SingleStreamFinalLayer final_layer;
  at::Tensor rope_cos, rope_sin;  // [Tc + T, head_dim/2], fixed, not in the state_dict
};

// Which image tokens a routed loop keeps and how they count.
struct LoopRoute {
  at::Tensor scores;  // [B, T] float32 router logits over the image tokens
  at::Tensor index;   // [B, k] int64 kept image tokens, ascending
  at::Tensor gate;    // [B, k] value 1, the router's gradient (1 + sigmoid(s) - sigmoid(s).detach())
  at::Tensor aux;     // scalar: BCE-with-logits(scores, kept mask), unweighted
};

// r with gate and aux computed from its scores and index.
LoopRoute with_gate_and_aux(LoopRoute r);

class LoopedDiT : public DiffusionModel {
 public:
  // On the CPU in float32, or on `device` from its generator (as DiT).
  LoopedDiT(const DiTConfig& cfg, uint64_t seed);
  LoopedDiT(const DiTConfig& cfg, uint64_t seed, const at::Device& device);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                     const DiTExecution& exec = {}) const override;
  // forward, and the routers' auxiliary loss (already weighted by
  // router_aux_weight; undefined without routing).
  ForwardOutput forward_train(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                              const DiTExecution& exec = {}) const override;
  const DiTConfig& config() const override { return cfg_; }
  // exec.fused_kernels runs models/fused/looped_fused.h's schedule.
  bool has_fused_path() const override { return true; }

  // Loop `loop`'s weights for the shared block at group position k: the
  // shared weights merged with that loop's adapters (the block's own weights
  // without adapters). loop_block dit, and single_stream.
  DiTBlockWeights loop_weights(int64_t loop, int64_t k) const;
  SingleStreamBlockWeights single_stream_loop_weights(int64_t loop, int64_t k) const;
  // c + loop_embed[loop]: [B, D] (single_stream: the timestep embedding's, before SiLU).
  at::Tensor loop_condition(const at::Tensor& c, int64_t loop) const;
  // A loop's input from the running h and the prelude's output e (model.reinject).
  at::Tensor reinjected(const at::Tensor& h, const at::Tensor& e) const;
  // Routed loop `loop` (config().loop_routed): its router on the image
  // tokens `image` [B, T, D].
  LoopRoute route(int64_t loop, const at::Tensor& image) const;
  // The adapters of loop `loop` at group position k, or nullptr (rank 0).
  const BlockAdapters* adapters_of(int64_t loop, int64_t k) const;
  const nn::Linear* router(int64_t loop) const { return routers.find(std::to_string(loop)); }

 private:
  LoopedDiT(const DiTConfig& cfg, at::Generator gen);
  void register_modules();
  ForwardOutput forward_body(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                             const DiTExecution& exec) const;
  ForwardOutput forward_dit(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y,
                            const DiTExecution& exec) const;
  ForwardOutput forward_single_stream(const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                                      const DiTExecution& exec) const;

  DiTConfig cfg_;

 public:
  // Exactly one of these, as model.loop_block says; public as DiT's modules
  // are: the fused schedule (models/fused) reads them.
  std::unique_ptr<LoopedDiTParts> dit;
  std::unique_ptr<LoopedSingleStreamParts> single_stream;
  at::Tensor loop_embed;                  // [L, D], zero-initialised, trainable
  std::unique_ptr<nn::Linear> reinject;   // reinject concat: Linear(2D, D), [I | 0] and bias 0
  nn::ModuleList<nn::ModuleList<BlockAdapters>> adapters;  // [l][k]; empty at lora_rank 0
  ModuleMap<nn::Linear> routers;          // "<l>" for each routed loop l
};

}  // namespace perftrain::models
