// AdamW, EMA and clipping against plain formulas on random tensors.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/stack.h>
#include <gtest/gtest.h>

#include <cmath>

#include "train/adamw.h"
#include "train/ema.h"
#include "train/grad_clip.h"
#include "train/lr_schedule.h"

namespace perftrain::train {
namespace {

at::Generator gen_for(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

TEST(AdamW, MatchesTheTextbookUpdateOverSeveralSteps) {
  auto gen = gen_for(1);
  auto p1 = at::randn({5, 3}, gen, at::kFloat).set_requires_grad(true);
  auto p2 = at::randn({7}, gen, at::kFloat).set_requires_grad(true);
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  AdamW opt({{"a", p1}, {"b", p2}}, o);
  // Reference in float64.
  std::vector<at::Tensor> w = {p1.detach().to(at::kDouble), p2.detach().to(at::kDouble)};
  std::vector<at::Tensor> m = {at::zeros_like(w[0]), at::zeros_like(w[1])};
  std::vector<at::Tensor> v = {at::zeros_like(w[0]), at::zeros_like(w[1])};
  const double lr = 1e-2;
  for (int step = 1; step <= 4; ++step) {
    std::vector<at::Tensor> g = {at::randn({5, 3}, gen, at::kFloat), at::randn({7}, gen, at::kFloat)};
    p1.mutable_grad() = g[0].clone();
    p2.mutable_grad() = g[1].clone();
    opt.step(lr);
    for (int i = 0; i < 2; ++i) {
      auto gd = g[i].to(at::kDouble);
      w[i] = w[i] * (1 - lr * o.weight_decay);
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * gd;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * gd * gd;
      auto mhat = m[i] / (1 - std::pow(o.beta1, step));
      auto vhat = v[i] / (1 - std::pow(o.beta2, step));
      w[i] = w[i] - lr * mhat / (vhat.sqrt() + o.eps);
    }
    EXPECT_FALSE(p1.grad().defined()) << "step() leaves gradients unset";
  }
  EXPECT_TRUE(p1.detach().to(at::kDouble).allclose(w[0], 1e-5, 1e-6));
  EXPECT_TRUE(p2.detach().to(at::kDouble).allclose(w[1], 1e-5, 1e-6));
  EXPECT_EQ(opt.steps_taken(), 4);
}

TEST(AdamW, StateRoundTripsAndRejectsMissingTensors) {
  auto gen = gen_for(2);
  auto p = at::randn({4}, gen, at::kFloat).set_requires_grad(true);
  AdamW a({{"p", p}}, {});
  p.mutable_grad() = at::randn({4}, gen, at::kFloat);
  a.step(0.1);
  AdamW b({{"p", p}}, {});
  b.load_state(a.state());
  EXPECT_EQ(b.steps_taken(), 1);
  for (size_t i = 0; i < a.state().size(); ++i) EXPECT_TRUE(a.state()[i].second.equal(b.state()[i].second));
  EXPECT_THROW(b.load_state({}), std::exception);
}

TEST(Ema, UpdateIsTheConvexCombinationAndWarmupRamps) {
  auto gen = gen_for(3);
  auto e = at::randn({6}, gen, at::kFloat), p = at::randn({6}, gen, at::kFloat);
  auto expect = 0.9 * e + 0.1 * p;
  ema_update_({e}, {p}, 0.9);
  EXPECT_TRUE(e.allclose(expect, 1e-6, 1e-7));
  EXPECT_DOUBLE_EQ(ema_decay_at(0, 0.9999, true), 0.1);
  EXPECT_DOUBLE_EQ(ema_decay_at(1000000, 0.9999, true), 0.9999);
  EXPECT_DOUBLE_EQ(ema_decay_at(0, 0.9999, false), 0.9999);
}

TEST(GradClip, ScalesToMaxNormOnlyWhenAbove) {
  auto gen = gen_for(4);
  auto a = at::randn({10}, gen, at::kFloat).set_requires_grad(true);
  auto b = at::randn({3, 3}, gen, at::kFloat).set_requires_grad(true);
  a.mutable_grad() = at::randn({10}, gen, at::kFloat) * 5;
  b.mutable_grad() = at::randn({3, 3}, gen, at::kFloat) * 5;
  const double before = std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  auto norm = clip_grad_norm_({a, b}, 1.0);
  EXPECT_NEAR(norm.item<double>(), before, 1e-4 * before);
  const double after = std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  EXPECT_NEAR(after, 1.0, 1e-4);
  auto g = a.grad().clone();
  clip_grad_norm_({a, b}, 100.0);  // below the limit: unchanged
  EXPECT_TRUE(a.grad().equal(g));
}

TEST(LrSchedule, LinearWarmupThenConstant) {
  EXPECT_DOUBLE_EQ(lr_at(1, 1e-3, 10), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(10, 1e-3, 10), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(500, 1e-3, 10), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(1, 1e-3, 0), 1e-3);
}

}  // namespace
}  // namespace perftrain::train
