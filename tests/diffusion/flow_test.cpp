// Rectified flow: interpolation, target, time sampling and the Euler sampler.
#include "diffusion/flow.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "test_util.h"

namespace perftrain::diffusion {
namespace {

using testing::cpu_gen;
using testing::max_abs_diff;

TEST(Flow, OracleVelocityGivesZeroLossAndModelSeesPathPoint) {
  RectifiedFlow flow;
  at::Generator gen = cpu_gen(1);
  const at::Tensor x0 = at::randn({4, 3, 4, 4}, gen);
  const at::Tensor noise = at::randn(x0.sizes(), gen);
  const at::Tensor t = at::tensor(std::vector<float>{0.0f, 0.25f, 0.5f, 1.0f});
  bool called = false;
  const ModelFn model = [&](const at::Tensor& x_t, const at::Tensor& tm, const at::Tensor&) {
    called = true;
    EXPECT_LT(max_abs_diff(tm, t.mul(1000.0)), 1e-4);
    const at::Tensor tb = t.view({4, 1, 1, 1});
    EXPECT_LT(max_abs_diff(x_t, x0.mul(tb.neg().add(1.0)).add(noise.mul(tb))), 1e-6);
    return noise.sub(x0);
  };
  const LossTerms terms = flow.training_loss_at(model, x0, at::zeros({4}, at::kLong), t, noise);
  EXPECT_TRUE(called);
  EXPECT_LT(terms.loss.item<double>(), 1e-12);
  EXPECT_FALSE(terms.vb.defined());
  // Off by 0.2 everywhere: loss 0.04; a 2C output uses only its first half.
  const ModelFn off = [&](const at::Tensor&, const at::Tensor&, const at::Tensor&) {
    return at::cat({noise.sub(x0).add(0.2), at::randn(x0.sizes())}, 1);
  };
  EXPECT_NEAR(flow.training_loss_at(off, x0, at::zeros({4}, at::kLong), t, noise).loss.item<double>(),
              0.04, 1e-5);
}

TEST(Flow, SameSeedSameLossDifferentSeedDifferent) {
  RectifiedFlow flow(FlowOptions{TimeSampling::LogitNormal, 0.0, 1.0});
  const at::Tensor x0 = at::randn({8, 4, 4, 4}, cpu_gen(3));
  const at::Tensor y = at::zeros({8}, at::kLong);
  const ModelFn model = [](const at::Tensor& x, const at::Tensor& t, const at::Tensor&) {
    return x.mul(0.5).add(t.view({-1, 1, 1, 1}).mul(1e-3));
  };
  auto loss = [&](uint64_t seed) {
    at::Generator g = cpu_gen(seed);
    return flow.training_loss(model, x0, y, g).loss.item<float>();
  };
  EXPECT_EQ(loss(10), loss(10));
  EXPECT_NE(loss(10), loss(11));
  at::Generator g = cpu_gen(10);  // draw order: t, then noise
  const at::Tensor t = flow.sample_time(8, g, x0.options());
  const at::Tensor noise = at::randn(x0.sizes(), g);
  EXPECT_EQ(flow.training_loss_at(model, x0, y, t, noise).loss.item<float>(), loss(10));
}

TEST(Flow, UniformTimeCoversUnitInterval) {
  RectifiedFlow flow;
  at::Generator gen = cpu_gen(4);
  const at::Tensor t = flow.sample_time(100000, gen, at::TensorOptions());
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_GE(t.min().item<double>(), 0.0);
  EXPECT_LT(t.max().item<double>(), 1.0);
  EXPECT_NEAR(t.mean().item<double>(), 0.5, 0.005);
  EXPECT_NEAR(t.lt(0.1).to(at::kDouble).mean().item<double>(), 0.1, 0.005);
}

TEST(Flow, LogitNormalTime) {
  at::Generator gen = cpu_gen(5);
  const at::Tensor t =
      RectifiedFlow(FlowOptions{TimeSampling::LogitNormal}).sample_time(100000, gen, at::TensorOptions());
  EXPECT_GT(t.min().item<double>(), 0.0);
  EXPECT_LT(t.max().item<double>(), 1.0);
  EXPECT_NEAR(t.median().item<double>(), 0.5, 0.01);
  // P(t < sigmoid(-1)) = P(N(0,1) < -1) = 0.1587.
  const double s = 1.0 / (1.0 + std::exp(1.0));
  EXPECT_NEAR(t.lt(s).to(at::kDouble).mean().item<double>(), 0.1587, 0.005);
  // Shifted mean moves the median to sigmoid(mean).
  const at::Tensor t2 = RectifiedFlow(FlowOptions{TimeSampling::LogitNormal, 1.0, 0.5})
                            .sample_time(100000, gen, at::TensorOptions());
  EXPECT_NEAR(t2.median().item<double>(), 1.0 / (1.0 + std::exp(-1.0)), 0.01);
  EXPECT_THROW(RectifiedFlow(FlowOptions{TimeSampling::LogitNormal, 0.0, 0.0}), UsageError);
}

TEST(Flow, EulerWithOracleVelocityRecoversSinglePoint) {
  RectifiedFlow flow;
  at::Generator gen = cpu_gen(6);
  const at::Tensor x0 = at::rand({1, 4, 8, 8}, gen).mul(2).sub(1).expand({2, 4, 8, 8}).contiguous();
  const at::Tensor noise = at::randn(x0.sizes(), gen);
  for (int steps : {1, 3, 25}) {
    std::vector<double> seen;
    // Exact velocity of the straight path through x0: (x_t - x0) / t.
    const ModelFn oracle = [&](const at::Tensor& x_t, const at::Tensor& tm, const at::Tensor&) {
      const double t = tm[0].item<double>() / 1000.0;
      seen.push_back(t);
      const at::Tensor want = x0.mul(1 - t).add(noise.mul(t));
      EXPECT_LT(max_abs_diff(x_t, want), 1e-5) << "t=" << t;
      return x_t.sub(x0).div(t);
    };
    const at::Tensor x = flow.euler_sample(oracle, noise, at::zeros({2}, at::kLong), steps);
    ASSERT_EQ(seen.size(), static_cast<size_t>(steps));
    for (int i = 0; i < steps; ++i) EXPECT_NEAR(seen[i], 1.0 - double(i) / steps, 1e-6);
    EXPECT_LT(max_abs_diff(x, x0), 1e-5) << steps;
  }
  EXPECT_THROW(flow.euler_sample([](const at::Tensor& x, const at::Tensor&, const at::Tensor&) { return x; },
                                 noise, at::zeros({2}, at::kLong), 0),
               UsageError);
}

}  // namespace
}  // namespace perftrain::diffusion
