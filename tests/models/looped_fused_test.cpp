// The looped DiT's fused schedule (models/fused/looped_fused.h) against its
// plain forward on the CPU, where each fused op runs its fp32 reference: the
// prediction, the routers' auxiliary loss, the input gradient and every
// parameter's gradient (shared weights summed over loops, adapters, routers,
// loop_embed, reinject), chained, with gelu_recompute and under recompute.
// DiT blocks: shared group of 2, depth-wise LoRA (on the modulation too:
// per-loop modulation weights), reinject add and concat, routing at capacity
// 0.5; single-stream blocks: LoRA with reinject add, and routing (on the
// plain path under fused_kernels).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "models/looped.h"
#include "support/tensor_checks.h"

namespace perftrain::models {
namespace {

using perftrain::testing::rel_err;
using perftrain::testing::seeded_cpu_generator;

// A small looped config: 8x8 images at patch 2 (16 tokens), width 64.
DiTConfig small(const std::string& loop_block, const std::function<void(DiTConfig&)>& change) {
  DiTConfig c = model_config("Looped-S/2");
  c.hidden = 64, c.heads = 4, c.patch = 2, c.image_size = 8, c.in_channels = 4, c.num_classes = 5;
  c.loop_block = loop_block;
  c.prelude = 1, c.coda = 1, c.shared_group = 1, c.loops = 3;
  if (loop_block == "single_stream") c.cond_tokens = 2;
  change(c);
  c.depth = c.looped_depth();
  return c;
}

struct Result {
  at::Tensor out, aux, dx;
  std::vector<at::Tensor> grads;  // the model's parameters, in order (undefined: none)
};

Result run(LoopedDiT& m, const at::Tensor& x, const at::Tensor& t, const at::Tensor& y, const at::Tensor& gout,
           const DiTExecution& exec) {
  Result r;
  const at::Tensor xl = x.clone().set_requires_grad(true);
  Condition cond;
  cond.labels = y;
  const ForwardOutput o = m.forward_train(xl, t, cond, exec);
  r.out = o.out, r.aux = o.aux_loss;
  at::Tensor loss = (o.out * gout).sum();
  if (o.aux_loss.defined()) loss = loss + o.aux_loss;
  loss.backward();
  r.dx = xl.grad();
  for (auto& p : m.parameters()) {
    r.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    p.mutable_grad() = at::Tensor();
  }
  return r;
}

void expect_fused_matches_plain(const DiTConfig& cfg, uint64_t seed) {
  LoopedDiT model(cfg, seed);
  ASSERT_TRUE(model.has_fused_path());
  auto gen = seeded_cpu_generator(seed + 1);
  // Away from adaLN-Zero, zero adapters' B and a zero loop_embed, so that every path carries signal.
  model.transform([&](const std::string& name, const at::Tensor& w) {
    return name == "pos_embed" ? w : w + 0.1 * at::randn(w.sizes(), gen, at::kFloat);
  });
  const int64_t B = 2;
  const at::Tensor x = at::randn({B, cfg.in_channels, cfg.image_size, cfg.image_size}, gen, at::kFloat);
  const at::Tensor t = at::rand({B}, gen, at::kFloat) * 999;
  const at::Tensor y = at::randint(0, cfg.num_classes + 1, {B}, gen, at::kLong);
  const at::Tensor gout = at::randn({B, cfg.out_channels(), cfg.image_size, cfg.image_size}, gen, at::kFloat);
  const Result plain = run(model, x, t, y, gout, {});
  EXPECT_EQ(plain.aux.defined(), cfg.routing());
  const auto names = model.named_parameters();
  for (const int variant : {0, 1, 2}) {  // chained; gelu_recompute; recompute (one by one)
    DiTExecution exec;
    exec.fused_kernels = true, exec.gelu_recompute = variant == 1, exec.recompute = variant == 2;
    const std::string what = cfg.name + " " + (variant == 0 ? "chained" : variant == 1 ? "gelu_recompute" : "recompute");
    const Result fused = run(model, x, t, y, gout, exec);
    // The same math in fp32, summed in other orders.
    const double tol = 1e-5;
    ASSERT_EQ(fused.out.sizes(), plain.out.sizes()) << what;
    EXPECT_LT(rel_err(fused.out, plain.out), tol) << what;
    EXPECT_LT(rel_err(fused.dx, plain.dx), tol) << what << " dx";
    ASSERT_EQ(fused.aux.defined(), plain.aux.defined()) << what;
    if (plain.aux.defined()) EXPECT_LT(rel_err(fused.aux, plain.aux), tol) << what << " aux";
    for (size_t k = 0; k < plain.grads.size(); ++k) {
      ASSERT_TRUE(plain.grads[k].defined()) << names[k].first;
      ASSERT_TRUE(fused.grads[k].defined()) << names[k].first << ", " << what;
      EXPECT_GT(plain.grads[k].abs().max().item<double>(), 0) << names[k].first;
      EXPECT_LT(rel_err(fused.grads[k], plain.grads[k]), tol) << names[k].first << ", " << what;
    }
  }
}

TEST(LoopedFused, SharedBlockAppliedPerLoopMatchesThePlainPath) {
  expect_fused_matches_plain(small("dit", [](DiTConfig&) {}), 3);
}

// Two shared blocks per loop, adapters on every target with bias deltas
// (per-loop modulation weights: the batched modulation product), e added at
// each loop's start inside the chain.
TEST(LoopedFused, GroupOfTwoWithLoraOnEveryTargetAndReinjectAddMatchesThePlainPath) {
  expect_fused_matches_plain(small("dit", [](DiTConfig& c) {
    c.shared_group = 2, c.lora_rank = 4, c.lora_targets = "attn,mlp,adaln", c.lora_bias = true, c.reinject = "add";
  }), 5);
}

// Loops 0 and 1 routed (capacity 0.5 to 0.75 over 3 loops: the last one
// not), a group of two on the kept tokens, LoRA, reinject concat.
TEST(LoopedFused, RoutedLoopsWithLoraAndReinjectConcatMatchThePlainPath) {
  expect_fused_matches_plain(small("dit", [](DiTConfig& c) {
    c.shared_group = 2, c.lora_rank = 4, c.reinject = "concat", c.route_capacity = 0.5, c.route_capacity_end = 1.0;
  }), 7);
}

// Every loop routed, no prelude or coda (the chain opens and closes at the
// routed loops alone), adapters on the modulation.
TEST(LoopedFused, EveryLoopRoutedWithoutPreludeOrCodaMatchesThePlainPath) {
  expect_fused_matches_plain(small("dit", [](DiTConfig& c) {
    c.prelude = 0, c.coda = 0, c.lora_rank = 2, c.lora_targets = "adaln", c.route_capacity = 0.5;
  }), 9);
}

TEST(LoopedFused, SingleStreamGroupOfTwoWithLoraAndReinjectAddMatchesThePlainPath) {
  expect_fused_matches_plain(small("single_stream", [](DiTConfig& c) {
    c.shared_group = 2, c.lora_rank = 4, c.lora_targets = "attn,mlp,adaln", c.reinject = "add";
  }), 11);
}

// Routed single-stream loops run the plain path under fused_kernels too.
TEST(LoopedFused, SingleStreamRoutedMatchesThePlainPath) {
  expect_fused_matches_plain(small("single_stream", [](DiTConfig& c) {
    c.reinject = "concat", c.route_capacity = 0.5;
  }), 13);
}

}  // namespace
}  // namespace perftrain::models
