// The single-stream DiT's fused step with its weight gradients on the second
// stream (ops/weight_grad_stream.h) against the same step on one stream: the
// products of stacked_linear ([gate; up] and the stacked adaLN, whose
// gradients reach .grad as row blocks of one buffer), the norm weights'
// batch sums of rms_adaln, residual_rms_adaln and qk_norm_rope all run there.
// A gradient read before the side stream wrote it, or a weight used twice,
// would show as a difference here. Eager and captured, class tokens and
// masked condition features. And the bf16 step under recompute against the
// chained one. Prints the largest differences. Skips without a GPU.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "models/diffusion_model.h"
#include "ops/weight_grad_stream.h"
#include "support/tensor_checks.h"
#include "train/step_runner.h"

namespace perftrain::train {
namespace {

TrainConfig tiny(int64_t cond_dim, bool graph) {
  TrainConfig c = default_config(true);
  for (const char* o : {"model.name=SS-S/2", "model.depth=3", "model.hidden=128", "model.heads=2",
                        "model.image_size=8", "model.in_channels=4", "model.num_classes=5", "model.cond_tokens=5",
                        "train.batch_size=8", "train.lr=1e-3", "train.grad_clip=1.0", "train.warmup_steps=2"})
    apply_override(c, o);
  c.model.cond_dim = cond_dim;
  c.model.learn_sigma = true;
  c.diffusion.objective = "ddpm";
  c.speed.fused_kernels = true;
  c.speed.graph = graph;
  return c;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> weights;
  bool two_streams = false;
  std::string note, graph_status;
};

TrainRun train(const TrainConfig& c, ops::WeightGradStreamMode mode, int steps) {
  ops::set_weight_grad_stream_mode(mode);
  const at::Device cuda(at::kCUDA, 0);
  auto m = models::build_diffusion_model_and_ema(c.model, 11, cuda);
  {  // the zero-initialised layers away from zero, the same for both runs
    at::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    for (auto& [name, p] : m.model->named_parameters())
      if (p.abs().max().item<double>() == 0) p.copy_(at::randn(p.sizes(), gen) * 0.05);
    for (size_t i = 0; i < m.model->parameters().size(); ++i) m.ema->parameters()[i].copy_(m.model->parameters()[i]);
  }
  at::Generator gen = at::globalContext().defaultGenerator(cuda).clone();
  gen.set_current_seed(9);
  StepRunner r(*m.model, m.ema.get(), c, StepOptions{}, cuda, gen);
  auto data_gen = at::make_generator<at::CPUGeneratorImpl>(17);
  TrainRun out;
  for (int i = 0; i < steps; ++i) {
    data::Batch b;
    const int64_t B = c.optim.batch_size;
    b.x = at::randn({B, c.model.in_channels, c.model.image_size, c.model.image_size}, data_gen).pin_memory();
    b.y = at::randint(c.model.num_classes, {B}, data_gen, at::kLong).pin_memory();
    if (c.model.cond_dim > 0) {
      b.cond = at::randn({B, c.model.cond_tokens, c.model.cond_dim}, data_gen).pin_memory();
      b.cond_len = at::randint(0, c.model.cond_tokens + 1, {B}, data_gen, at::kLong).pin_memory();
    }
    r.step(b);
    out.losses.push_back(r.take_window().loss);
  }
  out.two_streams = r.weight_grad_stream();
  out.note = r.weight_grad_note();
  out.graph_status = r.graph_status();
  for (const auto& [name, p] : m.model->named_parameters()) out.weights.emplace_back(name, p.detach().cpu());
  ops::set_weight_grad_stream_mode(ops::WeightGradStreamMode::kAuto);
  return out;
}

void expect_same_with_two_streams(int64_t cond_dim, bool graph) {
  const TrainConfig c = tiny(cond_dim, graph);
  const int steps = 8;
  const TrainRun one = train(c, ops::WeightGradStreamMode::kOff, steps);
  const TrainRun two = train(c, ops::WeightGradStreamMode::kOn, steps);
  const std::string what = std::string(cond_dim > 0 ? "masked features" : "class tokens") + (graph ? ", captured" : ", eager");
  EXPECT_FALSE(one.two_streams) << what;
  EXPECT_TRUE(two.two_streams) << what << ": " << two.note;
  EXPECT_EQ(two.note, "") << what << ": a weight used twice in the fused single-stream step";
  if (graph) EXPECT_EQ(two.graph_status.rfind("captured", 0), 0u) << two.graph_status;
  double worst_loss = 0;
  for (int i = 0; i < steps; ++i) {
    ASSERT_TRUE(std::isfinite(two.losses[i])) << what << ", step " << i + 1;
    worst_loss = std::max(worst_loss, std::abs(two.losses[i] - one.losses[i]) / std::abs(one.losses[i]));
  }
  // The same kernels in the same order on each stream: equal up to the
  // products' algorithm choice (the side stream has its own cuBLASLt
  // workspace); a race gives differences of the weights' own size.
  EXPECT_LT(worst_loss, 1e-4) << what;
  double worst = 0;
  std::string worst_name;
  ASSERT_EQ(one.weights.size(), two.weights.size());
  for (size_t i = 0; i < one.weights.size(); ++i) {
    const double e = perftrain::testing::rel_l2(two.weights[i].second, one.weights[i].second);
    EXPECT_LT(e, 1e-4) << what << ": " << one.weights[i].first;
    if (e > worst) worst = e, worst_name = one.weights[i].first;
  }
  std::cout << what << ": loss rel diff " << worst_loss << ", worst weight " << worst_name << " rel " << worst << "\n";
}

TEST(SingleStreamStreamGpu, TwoStreamsGiveTheOneStreamStepWithClassTokens) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  expect_same_with_two_streams(0, false);
  expect_same_with_two_streams(0, true);
}

TEST(SingleStreamStreamGpu, TwoStreamsGiveTheOneStreamStepWithMaskedFeatures) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  expect_same_with_two_streams(24, false);
  expect_same_with_two_streams(24, true);
}

// bf16 with the optimizer's weight copies: the fused step under recompute
// (block by block, each re-run in backward on autograd's thread with the
// forward's copies) trains like the chained step, captured.
TEST(SingleStreamStreamGpu, RecomputeStepTrainsLikeTheChainedStep) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const int64_t cond_dim : {int64_t(0), int64_t(24)}) {
    TrainConfig c = tiny(cond_dim, true);
    const int steps = 8;
    const TrainRun chained = train(c, ops::WeightGradStreamMode::kOff, steps);
    c.speed.recompute = true;
    const TrainRun recompute = train(c, ops::WeightGradStreamMode::kOff, steps);
    EXPECT_EQ(recompute.graph_status.rfind("captured", 0), 0u) << recompute.graph_status;
    double worst_loss = 0, worst = 0;
    std::string worst_name;
    for (int i = 0; i < steps; ++i) {
      ASSERT_TRUE(std::isfinite(recompute.losses[i])) << "step " << i + 1;
      worst_loss = std::max(worst_loss, std::abs(recompute.losses[i] - chained.losses[i]) / std::abs(chained.losses[i]));
    }
    for (size_t i = 0; i < chained.weights.size(); ++i) {
      const double e = perftrain::testing::rel_l2(recompute.weights[i].second, chained.weights[i].second);
      EXPECT_LT(e, 2e-2) << "cond_dim " << cond_dim << ": " << chained.weights[i].first;
      if (e > worst) worst = e, worst_name = chained.weights[i].first;
    }
    // The same function through other op compositions in bf16: rounding apart.
    EXPECT_LT(worst_loss, 2e-2) << "cond_dim " << cond_dim;
    std::cout << "recompute vs chained, cond_dim " << cond_dim << ": loss rel diff " << worst_loss
              << ", worst weight " << worst_name << " rel " << worst << "\n";
  }
}

}  // namespace
}  // namespace perftrain::train
