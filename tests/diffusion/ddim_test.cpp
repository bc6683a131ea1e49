// DDIM with the exact eps of a single-point dataset: every intermediate x_t
// must lie on sqrt(abar_t) x0 + sqrt(1 - abar_t) noise, and x_0 must be x0.
#include <ATen/ops/cat.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "diffusion/ddpm.h"
#include "test_util.h"

namespace perftrain::diffusion {
namespace {

using testing::alpha_bar;
using testing::cpu_gen;
using testing::max_abs_diff;

struct Call {
  int64_t t;
  at::Tensor x;
};

// eps(x_t, t) = (x_t - sqrt(abar) x0) / sqrt(1 - abar), with the test's own
// float64 abar; records every call. learn_sigma appends garbage channels.
ModelFn oracle(const at::Tensor& x0, std::vector<Call>* calls, bool learn_sigma = false) {
  return [=](const at::Tensor& x_t, const at::Tensor& t, const at::Tensor&) {
    const int64_t k = static_cast<int64_t>(t[0].item<float>());
    EXPECT_EQ(t.min().item<float>(), t.max().item<float>());
    calls->push_back({k, x_t.clone()});
    const double ab = alpha_bar(k);
    const at::Tensor eps = x_t.to(at::kDouble)
                               .sub(x0.to(at::kDouble).mul(std::sqrt(ab)))
                               .div(std::sqrt(1.0 - ab))
                               .to(at::kFloat);
    return learn_sigma ? at::cat({eps, at::zeros(eps.sizes()).add(123.0)}, 1) : eps;
  };
}

TEST(Ddim, TimestepsMatchDiTSpacing) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(GaussianDiffusion::ddim_timesteps(1000, 2), (V{0, 999}));
  EXPECT_EQ(GaussianDiffusion::ddim_timesteps(1000, 3), (V{0, 500, 999}));
  // Ties round half to even, as Python's round() in space_timesteps.
  EXPECT_EQ(GaussianDiffusion::ddim_timesteps(1000, 7), (V{0, 166, 333, 500, 666, 832, 999}));
  const V s250 = GaussianDiffusion::ddim_timesteps(1000, 250);
  ASSERT_EQ(s250.size(), 250u);
  EXPECT_EQ(V(s250.begin(), s250.begin() + 4), (V{0, 4, 8, 12}));
  EXPECT_EQ(V(s250.end() - 4, s250.end()), (V{987, 991, 995, 999}));
  EXPECT_EQ(GaussianDiffusion::ddim_timesteps(1000, 1), (V{999}));
  EXPECT_EQ(GaussianDiffusion::ddim_timesteps(1000, 1000).size(), 1000u);
  EXPECT_THROW(GaussianDiffusion::ddim_timesteps(1000, 0), UsageError);
  EXPECT_THROW(GaussianDiffusion::ddim_timesteps(1000, 1001), UsageError);
}

void check_recovers(int steps, double eta, bool learn_sigma) {
  GaussianDiffusion d;
  at::Generator gen = cpu_gen(11);
  const at::Tensor x0 = at::rand({1, 4, 8, 8}, gen).mul(2).sub(1).expand({3, 4, 8, 8}).contiguous();
  const at::Tensor noise = at::randn(x0.sizes(), gen);
  std::vector<Call> calls;
  at::Generator sgen = cpu_gen(12);
  const at::Tensor x = d.ddim_sample(oracle(x0, &calls, learn_sigma), noise,
                                     at::zeros({3}, at::kLong), steps, eta, false, &sgen);
  const std::vector<int64_t> ts = GaussianDiffusion::ddim_timesteps(1000, steps);
  ASSERT_EQ(calls.size(), ts.size());
  const double ab_start = alpha_bar(ts.back());
  const at::Tensor eps_start =
      noise.sub(x0.mul(std::sqrt(ab_start))).div(std::sqrt(1 - ab_start));
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].t, ts[ts.size() - 1 - i]);
    if (eta == 0.0) {
      // Deterministic DDIM keeps the eps implied by the start x_T = noise,
      // so every x_t lies on the forward path sqrt(ab) x0 + sqrt(1-ab) eps.
      const double ab = alpha_bar(calls[i].t);
      const at::Tensor want = x0.mul(std::sqrt(ab)).add(eps_start.mul(std::sqrt(1 - ab)));
      EXPECT_LT(max_abs_diff(calls[i].x, want), 2e-5) << "t=" << calls[i].t;
    }
  }
  // One step jumps from t = 999, where 1/sqrt(abar) ~ 157 amplifies float32
  // rounding; otherwise the last step is at t = 0 and well conditioned.
  EXPECT_LT(max_abs_diff(x, x0), steps == 1 ? 2e-4 : 1e-5) << "steps=" << steps << " eta=" << eta;
}

TEST(Ddim, OracleRecoversSinglePoint) {
  check_recovers(50, 0.0, false);
  check_recovers(7, 0.0, false);
  check_recovers(1, 0.0, false);
}

TEST(Ddim, UsesOnlyEpsHalfOfLearnedSigmaOutput) { check_recovers(10, 0.0, true); }

TEST(Ddim, StochasticEtaStillRecoversSinglePoint) {
  // With the exact x0 prediction the last step (abar_prev = 1, sigma = 0)
  // lands on x0 whatever noise eta > 0 injected on the way.
  check_recovers(20, 1.0, false);
}

TEST(Ddim, EtaNeedsGeneratorAndIsReproducible) {
  GaussianDiffusion d;
  const at::Tensor noise = at::randn({2, 3, 4, 4});
  const ModelFn model = [](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
    return x.mul(0.3);
  };
  const at::Tensor y = at::zeros({2}, at::kLong);
  EXPECT_THROW(d.ddim_sample(model, noise, y, 10, 0.5), UsageError);
  at::Generator g1 = cpu_gen(5), g2 = cpu_gen(5), g3 = cpu_gen(6);
  const at::Tensor a = d.ddim_sample(model, noise, y, 10, 0.5, false, &g1);
  const at::Tensor b = d.ddim_sample(model, noise, y, 10, 0.5, false, &g2);
  const at::Tensor c = d.ddim_sample(model, noise, y, 10, 0.5, false, &g3);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  EXPECT_GT(max_abs_diff(a, c), 1e-3);
  // eta = 0 needs no generator and is deterministic.
  EXPECT_EQ(max_abs_diff(d.ddim_sample(model, noise, y, 10), d.ddim_sample(model, noise, y, 10)), 0.0);
}

TEST(Ddim, ClipBoundsPredictedX0) {
  GaussianDiffusion d;
  const at::Tensor noise = at::randn({2, 3, 4, 4}, cpu_gen(8));
  // Predicts x0 far outside [-1, 1]: clipping keeps the result in range.
  const ModelFn model = [](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
    return x.mul(-5.0);
  };
  const at::Tensor y = at::zeros({2}, at::kLong);
  const at::Tensor x = d.ddim_sample(model, noise, y, 10, 0.0, /*clip_x0=*/true);
  EXPECT_LE(x.abs().max().item<double>(), 1.0 + 1e-6);
  EXPECT_GT(d.ddim_sample(model, noise, y, 10).abs().max().item<double>(), 2.0);
}

}  // namespace
}  // namespace perftrain::diffusion
