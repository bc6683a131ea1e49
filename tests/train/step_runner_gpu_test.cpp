// The speed engine on the GPU: the fused DiT blocks compute the same function
// as the plain ones (bf16 and fp32/TF32, forward and every gradient); the
// captured whole-step graph trains like the eager step on the same batches
// and allocates nothing per replay; fp16 with its device loss scale captures
// too; recompute gives the same gradients; the weight gradients on their own
// stream train like one stream. Skips without a GPU.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rand.h>

#include <cmath>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "models/dit.h"
#include "ops/weight_grad_stream.h"
#include "support/step_runs.h"
#include "support/tensor_checks.h"
#include "train/lr_schedule.h"
#include "train/step_runner.h"

namespace perftrain::train {
namespace {

TrainConfig tiny(bool learn_sigma) {
  TrainConfig c = default_config(true);
  for (const char* o : {"model.depth=2", "model.hidden=128", "model.heads=2", "model.patch=2", "model.image_size=8",
                        "model.in_channels=4", "model.num_classes=5", "train.batch_size=16", "train.lr=1e-3",
                        "train.grad_clip=1.0", "train.warmup_steps=3"})
    apply_override(c, o);
  c.model.learn_sigma = learn_sigma;
  c.diffusion.objective = "ddpm";
  return c;
}

double rel(const at::Tensor& a, const at::Tensor& b) { return perftrain::testing::rel_l2(a, b); }

struct Models {
  models::DiT model, ema;
  explicit Models(const TrainConfig& c, uint64_t seed = 7) : model(c.model, seed), ema(c.model, seed) {
    const at::Device cuda(at::kCUDA, 0);
    model.transform([&](const std::string&, const at::Tensor& t) { return t.to(cuda); });
    ema.transform([&](const std::string&, const at::Tensor& t) { return t.to(cuda); });
    for (auto& p : ema.parameters()) p.set_requires_grad(false);
    // adaLN-Zero starts every block as the identity: give the zero-initialised
    // layers random weights (the same for the same seed) so that every path
    // carries signal.
    at::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (auto& [name, p] : model.named_parameters())
      if (p.abs().max().item<double>() == 0) p.copy_(at::randn(p.sizes(), gen) * 0.05);
    for (size_t i = 0; i < model.parameters().size(); ++i) ema.parameters()[i].copy_(model.parameters()[i]);
  }
};

std::vector<data::Batch> batches(const TrainConfig& c, int n, bool pinned) {
  std::vector<data::Batch> out;
  auto gen = at::globalContext().defaultGenerator(at::kCPU);
  for (int i = 0; i < n; ++i) {
    data::Batch b;
    b.x = at::randn({c.optim.batch_size, c.model.in_channels, c.model.image_size, c.model.image_size});
    b.y = at::randint(c.model.num_classes, {c.optim.batch_size}, at::kLong);
    if (pinned) b.x = b.x.pin_memory(), b.y = b.y.pin_memory();
    out.push_back(b);
  }
  return out;
}

// Forward and backward of the whole DiT, fused blocks against plain blocks.
void compare_fused(bool bf16, double tol_out, double tol_grad) {
  TrainConfig c = tiny(true);
  Models a(c), b(c);
  models::DiTExecution fused;
  fused.fused_kernels = true;
  const at::Device cuda(at::kCUDA, 0);
  auto x = at::randn({3, 4, 8, 8}, at::TensorOptions().device(cuda));
  auto t = at::rand({3}, at::TensorOptions().device(cuda)) * 999;
  auto y = at::randint(5, {3}, at::TensorOptions().device(cuda).dtype(at::kLong));
  auto w = at::randn({3, 8, 8, 8}, at::TensorOptions().device(cuda));  // a random upstream gradient
  at::Tensor out_a, out_b;
  {
    compat::AutocastGuard g(at::kCUDA, at::kBFloat16, bf16);
    out_a = a.model.forward(x, t, y, fused);
    out_b = b.model.forward(x, t, y);
  }
  (out_a.to(at::kFloat) * w).sum().backward();
  (out_b.to(at::kFloat) * w).sum().backward();
  EXPECT_LT(rel(out_a, out_b), tol_out);
  auto pa = a.model.named_parameters(), pb = b.model.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].second.grad().defined()) << pa[i].first;
    EXPECT_FALSE(pa[i].second.grad().isnan().any().item<bool>()) << pa[i].first;
    EXPECT_LT(rel(pa[i].second.grad(), pb[i].second.grad()), tol_grad) << pa[i].first;
  }
}

TEST(StepRunnerGpu, FusedBlocksMatchPlainBlocksBf16) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  compare_fused(true, 2e-2, 5e-2);  // both sides round to bf16, differently
}

TEST(StepRunnerGpu, FusedBlocksMatchPlainBlocksFp32) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::globalContext().setAllowTF32CuBLAS(true);
  compare_fused(false, 5e-3, 1e-2);  // TF32 products on both sides
}

TEST(StepRunnerGpu, RecomputeGivesTheSameGradients) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::globalContext().setAllowTF32CuBLAS(false);
  TrainConfig c = tiny(false);
  Models a(c), b(c);
  models::DiTExecution recompute;
  recompute.recompute = true;
  const at::Device cuda(at::kCUDA, 0);
  auto x = at::randn({2, 4, 8, 8}, at::TensorOptions().device(cuda));
  auto t = at::rand({2}, at::TensorOptions().device(cuda)) * 999;
  auto y = at::randint(5, {2}, at::TensorOptions().device(cuda).dtype(at::kLong));
  a.model.forward(x, t, y, recompute).square().sum().backward();
  b.model.forward(x, t, y).square().sum().backward();
  auto pa = a.model.named_parameters(), pb = b.model.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_LT(rel(pa[i].second.grad(), pb[i].second.grad()), 1e-4) << pa[i].first;
  at::globalContext().setAllowTF32CuBLAS(true);
}

using perftrain::testing::Trained;

// The losses and the model's and EMA's weights after `data`, from fresh
// models and a generator seeded with `seed`.
Trained train_steps(const TrainConfig& c, const std::vector<data::Batch>& data, const StepOptions& o, uint64_t seed) {
  const at::Device cuda(at::kCUDA, 0);
  Models m(c);
  at::Generator gen = at::globalContext().defaultGenerator(cuda).clone();
  gen.set_current_seed(seed);
  StepRunner r(m.model, &m.ema, c, o, cuda, gen);
  return perftrain::testing::run_steps(r, data, m.model, m.ema);
}

// The same steps, eager and captured: the same losses and weights.
TEST(StepRunnerGpu, GraphReplayTrainsLikeTheEagerStep) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  TrainConfig c = tiny(true);
  auto data = batches(c, 10, /*pinned=*/true);
  c.speed.graph = false;
  const Trained eager = train_steps(c, data, StepOptions{}, 3);
  c.speed.graph = true;
  const Trained graph = train_steps(c, data, StepOptions{}, 3);
  EXPECT_FALSE(eager.graph_active);
  EXPECT_EQ(graph.graph_status.rfind("captured", 0), 0u) << graph.graph_status;
  for (size_t i = 0; i < eager.losses.size(); ++i)
    EXPECT_NEAR(graph.losses[i], eager.losses[i], 2e-3 * std::abs(eager.losses[i]) + 1e-5) << "step " << i + 1;
  for (size_t i = 0; i < eager.weights.size(); ++i)
    EXPECT_LT(rel(graph.weights[i], eager.weights[i]), 1e-3) << "tensor " << i;
}

// Weight gradients on their own stream (the default at this size) train like
// one stream, eager and captured.
TEST(StepRunnerGpu, WeightGradStreamTrainsLikeOneStream) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  TrainConfig c = tiny(true);
  auto data = batches(c, 8, /*pinned=*/true);
  for (bool graph : {false, true}) {
    const std::string mode = graph ? "graph" : "eager";
    c.speed.graph = graph;
    ops::set_weight_grad_stream_mode(ops::WeightGradStreamMode::kOff);  // speed.weight_grad_stream = off
    const Trained one = train_steps(c, data, StepOptions{}, 5);
    ops::set_weight_grad_stream_mode(ops::WeightGradStreamMode::kAuto);  // the default: on at this size
    const Trained two = train_steps(c, data, StepOptions{}, 5);
    EXPECT_FALSE(one.weight_grad_stream) << mode;
    EXPECT_EQ(two.graph_active, graph) << two.graph_status;
    // DiT uses each weight once: the first step's graph check keeps the second stream.
    EXPECT_TRUE(two.weight_grad_stream) << mode;
    // The products are the same bits (tests/ops/weight_grad_stream_gpu_test.cpp);
    // the small margin is for cuDNN's attention backward, which need not be
    // bit-reproducible run to run. A race would be far outside it.
    for (size_t i = 0; i < one.losses.size(); ++i)
      EXPECT_NEAR(two.losses[i], one.losses[i], 1e-6 * std::abs(one.losses[i]) + 1e-7) << mode << ", step " << i + 1;
    for (size_t i = 0; i < one.weights.size(); ++i)
      EXPECT_LT(rel(two.weights[i], one.weights[i]), 1e-5) << mode << ", tensor " << i;
  }
}

TEST(StepRunnerGpu, ReplaysAllocateNothingAndFp16Captures) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const char* precision : {"bf16", "fp16"}) {
    TrainConfig c = tiny(false);
    const at::Device cuda(at::kCUDA, 0);
    auto data = batches(c, 4, true);
    Models m(c);
    at::Generator gen = at::globalContext().defaultGenerator(cuda).clone();
    StepOptions o;
    o.precision = precision;
    StepRunner r(m.model, &m.ema, c, o, cuda, gen);
    for (int i = 0; i < 5; ++i) r.step(data[i % 4]);
    ASSERT_TRUE(r.graph_active()) << precision << ": " << r.graph_status();
    compat::synchronize(cuda);
    const int64_t before = compat::allocated_bytes(cuda);
    for (int i = 0; i < 20; ++i) r.step(data[i % 4]);
    compat::synchronize(cuda);
    EXPECT_EQ(compat::allocated_bytes(cuda), before) << precision;
    WindowStats w = r.take_window();
    EXPECT_TRUE(std::isfinite(w.loss)) << precision;
    EXPECT_GT(w.grad_norm, 0) << precision;
    if (std::string(precision) == "fp16") EXPECT_GT(w.loss_scale, 1.0);
  }
}

// Gradient accumulation inside the captured step: 2 micro-batches of 8
// replay like the eager step, and train like one batch of 16 (the same rows
// and draws) within bf16 tolerance; a cosine schedule's LR is the closed
// form at each replay.
TEST(StepRunnerGpu, AccumulatedStepCapturesAndTrainsLikeOneBigBatch) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  TrainConfig c = tiny(true);
  apply_override(c, "train.lr_schedule=cosine");
  c.optim.steps = 10;
  auto data = batches(c, 10, /*pinned=*/true);
  const Trained big = train_steps(c, data, StepOptions{}, 3);
  c.optim.batch_size = 8;
  c.optim.accumulate = 2;
  const Trained graph = train_steps(c, data, StepOptions{}, 3);
  c.speed.graph = false;
  const Trained eager = train_steps(c, data, StepOptions{}, 3);
  EXPECT_EQ(graph.graph_status.rfind("captured", 0), 0u) << graph.graph_status;
  EXPECT_TRUE(graph.weight_grad_stream) << "the first micro-batch's weight gradients keep their stream";
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_NEAR(graph.losses[i], eager.losses[i], 2e-3 * std::abs(eager.losses[i]) + 1e-5) << "step " << i + 1;
    EXPECT_NEAR(graph.losses[i], big.losses[i], 1e-2 * std::abs(big.losses[i]) + 1e-5) << "step " << i + 1;
  }
  for (size_t i = 0; i < eager.weights.size(); ++i) {
    EXPECT_LT(rel(graph.weights[i], eager.weights[i]), 1e-3) << "tensor " << i;
    EXPECT_LT(rel(graph.weights[i], big.weights[i]), 1e-2) << "tensor " << i;
  }
  // The schedule on the device, replayed: the closed form at each step.
  Models m(c);
  c.speed.graph = true;
  const at::Device cuda(at::kCUDA, 0);
  StepRunner r(m.model, &m.ema, c, StepOptions{}, cuda, at::globalContext().defaultGenerator(cuda).clone());
  const auto s = lr_schedule(c.optim);
  for (int64_t step = 1; step <= 10; ++step) {
    r.step(data[step - 1]);
    EXPECT_NEAR(r.take_window().lr, lr_at(step, s), 1e-7 * lr_at(step, s) + 1e-12) << "step " << step;
  }
  EXPECT_TRUE(r.graph_active()) << r.graph_status();
}

}  // namespace
}  // namespace perftrain::train
