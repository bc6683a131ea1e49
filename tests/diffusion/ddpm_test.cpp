// GaussianDiffusion: schedule tables, q_sample, the MSE and VLB terms against
// oracles whose loss is known to be zero, and reproducibility from the seed.
#include "diffusion/ddpm.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "test_util.h"

namespace perftrain::diffusion {
namespace {

using testing::alpha_bar;
using testing::cpu_gen;
using testing::max_abs_diff;

// [B] tensor of timesteps.
at::Tensor steps(std::vector<int64_t> ts) {
  return at::tensor(ts, at::TensorOptions().dtype(at::kLong));
}

// [B, 1, 1, 1] per-sample value f(t) for broadcasting.
template <class F>
at::Tensor per_sample(const at::Tensor& t, F f) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.size(0); ++i) v.push_back(f(t[i].item<int64_t>()));
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).view({-1, 1, 1, 1});
}

// eps that the model would need to predict exactly: recovered from x_t with
// x0 known, using the test's own float64 alpha_bar.
ModelFn oracle(const at::Tensor& x0, bool learn_sigma, double v = -1.0) {
  return [x0, learn_sigma, v](const at::Tensor& x_t, const at::Tensor& t, const at::Tensor&) {
    const at::Tensor ti = t.to(at::kLong);
    const at::Tensor s = per_sample(ti, [](int64_t k) { return std::sqrt(alpha_bar(k)); });
    const at::Tensor r = per_sample(ti, [](int64_t k) { return std::sqrt(1.0 - alpha_bar(k)); });
    const at::Tensor eps = x_t.to(at::kDouble).sub(s.mul(x0.to(at::kDouble))).div(r).to(at::kFloat);
    if (!learn_sigma) return eps;
    return at::cat({eps, at::full(eps.sizes(), v, eps.options())}, 1);
  };
}

TEST(Ddpm, ScheduleMatchesClosedForms) {
  GaussianDiffusion d;
  ASSERT_EQ(d.num_timesteps(), 1000);
  const auto& b = d.betas();
  const auto& ab = d.alphas_cumprod();
  EXPECT_DOUBLE_EQ(b[0], 1e-4);
  EXPECT_DOUBLE_EQ(b[999], 0.02);
  EXPECT_NEAR(b[500], 1e-4 + 500 * (0.02 - 1e-4) / 999, 1e-15);
  EXPECT_NEAR(ab[0], 0.9999, 1e-15);
  EXPECT_NEAR(ab[1], 0.9999 * (1 - (1e-4 + (0.02 - 1e-4) / 999)), 1e-15);
  EXPECT_NEAR(ab[999], 4.035829765375676e-05, 1e-15);  // DiT's value
  for (int64_t t : {0, 1, 250, 499, 999}) EXPECT_NEAR(ab[t] / alpha_bar(t), 1.0, 1e-12) << t;

  // posterior variance: beta_t (1 - abar_{t-1}) / (1 - abar_t); 0 at t = 0.
  const auto& pv = d.posterior_variance();
  EXPECT_EQ(pv[0], 0.0);
  for (int64_t t : {1, 2, 100, 999}) {
    const double want = b[t] * (1 - alpha_bar(t - 1)) / (1 - alpha_bar(t));
    EXPECT_NEAR(pv[t] / want, 1.0, 1e-12) << t;
    EXPECT_LT(pv[t], b[t]);
  }
  const auto& plv = d.posterior_log_variance_clipped();
  EXPECT_DOUBLE_EQ(plv[0], std::log(pv[1]));
  EXPECT_DOUBLE_EQ(plv[1], std::log(pv[1]));
  EXPECT_DOUBLE_EQ(plv[777], std::log(pv[777]));
}

TEST(Ddpm, RejectsBadSchedules) {
  EXPECT_THROW(GaussianDiffusion(1), UsageError);
  EXPECT_THROW(GaussianDiffusion(1000, 0.0, 0.02), UsageError);
  EXPECT_THROW(GaussianDiffusion(1000, 0.03, 0.02), UsageError);
  EXPECT_THROW(GaussianDiffusion(1000, 1e-4, 1.0), UsageError);
}

TEST(Ddpm, QSampleCoefficientsAndStatistics) {
  GaussianDiffusion d;
  const at::Tensor t = steps({0, 100, 500, 999});
  // Unit inputs expose the float32 device tables.
  const at::Tensor ones = at::ones({4, 1, 2, 2});
  const at::Tensor zeros = at::zeros({4, 1, 2, 2});
  const at::Tensor a = d.q_sample(ones, t, zeros);
  const at::Tensor s = d.q_sample(zeros, t, ones);
  for (int i = 0; i < 4; ++i) {
    const int64_t k = t[i].item<int64_t>();
    EXPECT_NEAR(a[i][0][0][0].item<float>(), std::sqrt(alpha_bar(k)), 1e-6) << k;
    EXPECT_NEAR(s[i][0][0][0].item<float>(), std::sqrt(1 - alpha_bar(k)), 1e-6) << k;
  }
  // Statistics: x0 = 0.7 everywhere, N(0,1) noise, 65536 values per sample.
  at::Generator gen = cpu_gen(7);
  const at::Tensor x0 = at::full({4, 1, 256, 256}, 0.7);
  const at::Tensor x_t = d.q_sample(x0, t, at::randn(x0.sizes(), gen));
  for (int i = 0; i < 4; ++i) {
    const int64_t k = t[i].item<int64_t>();
    EXPECT_NEAR(x_t[i].mean().item<double>(), 0.7 * std::sqrt(alpha_bar(k)), 0.01) << k;
    EXPECT_NEAR(x_t[i].std().item<double>(), std::sqrt(1 - alpha_bar(k)), 0.01) << k;
  }
}

TEST(Ddpm, OracleEpsGivesZeroMse) {
  GaussianDiffusion d;
  at::Generator gen = cpu_gen(1);
  const at::Tensor x0 = at::randn({16, 4, 8, 8}, gen);
  const at::Tensor y = at::zeros({16}, at::kLong);
  const LossTerms terms = d.training_loss(oracle(x0, false), x0, y, gen, false);
  EXPECT_LT(terms.loss.item<double>(), 1e-8);
  EXPECT_LT(terms.mse.item<double>(), 1e-8);
  EXPECT_FALSE(terms.vb.defined());
  // A model that is off by 0.1 everywhere costs exactly 0.01.
  const ModelFn off = [&](const at::Tensor& x_t, const at::Tensor& t, const at::Tensor& yy) {
    return oracle(x0, false)(x_t, t, yy).add(0.1);
  };
  EXPECT_NEAR(d.training_loss(off, x0, y, gen, false).loss.item<double>(), 0.01, 1e-5);
}

TEST(Ddpm, KlVanishesWhenModelMatchesPosterior) {
  // True eps and v = -1 (log var = posterior's): p == q, so KL = 0 at t > 0.
  GaussianDiffusion d;
  at::Generator gen = cpu_gen(2);
  const at::Tensor t = steps({1, 2, 10, 500, 998, 999});
  const at::Tensor x0 = at::randn({6, 4, 8, 8}, gen);
  const at::Tensor noise = at::randn(x0.sizes(), gen);
  const at::Tensor x_t = d.q_sample(x0, t, noise);
  const at::Tensor minus1 = at::full(x0.sizes(), -1.0);
  const at::Tensor vb = d.vb_terms_bpd(noise, minus1, x0, x_t, t);
  ASSERT_EQ(vb.sizes(), at::IntArrayRef({6}));
  EXPECT_LT(vb.abs().max().item<double>(), 1e-5);
  // The other end of the range (v = +1, variance beta_t) is penalized where
  // beta_t and the posterior variance differ (small t), and so is a wrong eps.
  const at::Tensor vb_beta = d.vb_terms_bpd(noise, minus1.neg(), x0, x_t, t);
  EXPECT_GT(vb_beta.narrow(0, 0, 3).min().item<double>(), 1e-3);
  EXPECT_GT(d.vb_terms_bpd(noise.add(0.3), minus1, x0, x_t, t).min().item<double>(), 1e-4);
}

TEST(Ddpm, DecoderNllAtTimeZero) {
  // At t = 0 the term is the decoder NLL, not the KL (which would be 0 here).
  GaussianDiffusion d;
  at::Generator gen = cpu_gen(3);
  const at::Tensor t = steps({0, 0});
  const at::Tensor x0 = at::rand({2, 1, 4, 4}, gen).mul(1.6).sub(0.8);  // inside (-0.999, 0.999)
  const at::Tensor noise = at::randn(x0.sizes(), gen);
  const at::Tensor x_t = d.q_sample(x0, t, noise);
  const at::Tensor vb = d.vb_terms_bpd(noise, at::full(x0.sizes(), -1.0), x0, x_t, t);
  // Model mean == x0 and std = sqrt(posterior_variance[1]) ~ 0.0074, so the bin
  // [x0 - 1/255, x0 + 1/255] has probability ~ erf(0.0039 / 0.0074 / sqrt 2).
  const double sd = std::sqrt(d.posterior_variance()[1]);
  const double p = std::erf((1.0 / 255.0) / sd / std::sqrt(2.0));
  for (int i = 0; i < 2; ++i)
    EXPECT_NEAR(vb[i].item<double>(), -std::log2(p), 2e-3) << i;
}

TEST(Ddpm, HybridLossAddsVbAndRejectsWrongChannels) {
  GaussianDiffusion d;
  at::Generator gen = cpu_gen(4);
  const at::Tensor x0 = at::randn({8, 4, 4, 4}, gen);
  const at::Tensor y = at::zeros({8}, at::kLong);
  const LossTerms h = d.training_loss(oracle(x0, true), x0, y, gen, true);
  ASSERT_TRUE(h.vb.defined());
  EXPECT_NEAR(h.loss.item<double>(), h.mse.item<double>() + h.vb.item<double>(), 1e-5);
  // A bf16 model output is upcast: the loss math stays float32.
  const ModelFn bf16 = [&](const at::Tensor& x_t, const at::Tensor& t, const at::Tensor& yy) {
    return oracle(x0, true)(x_t, t, yy).to(at::kBFloat16);
  };
  EXPECT_EQ(d.training_loss(bf16, x0, y, gen, true).loss.scalar_type(), at::kFloat);
  EXPECT_THROW(d.training_loss(oracle(x0, true), x0, y, gen, false), UsageError);
  EXPECT_THROW(d.training_loss(oracle(x0, false), x0, y, gen, true), UsageError);
}

TEST(Ddpm, SameSeedSameLossDifferentSeedDifferent) {
  GaussianDiffusion d;
  at::Generator data = cpu_gen(9);
  const at::Tensor x0 = at::randn({8, 4, 8, 8}, data);
  const at::Tensor y = at::zeros({8}, at::kLong);
  // A fixed model whose loss depends on both t and the noise.
  const ModelFn model = [](const at::Tensor& x, const at::Tensor& t, const at::Tensor&) {
    const at::Tensor eps = x.mul(0.5).add(t.view({-1, 1, 1, 1}).mul(1e-3));
    return at::cat({eps, x.tanh()}, 1);
  };
  auto loss = [&](uint64_t seed) {
    at::Generator g = cpu_gen(seed);
    return d.training_loss(model, x0, y, g, true).loss.item<float>();
  };
  EXPECT_EQ(loss(123), loss(123));
  EXPECT_NE(loss(123), loss(124));
  // training_loss == training_loss_at on the same draws (t first, then noise).
  at::Generator g = cpu_gen(123);
  const at::Tensor t = d.sample_timesteps(8, g, x0.device());
  const at::Tensor noise = at::randn(x0.sizes(), g);
  EXPECT_EQ(d.training_loss_at(model, x0, y, t, noise, true).loss.item<float>(), loss(123));
  EXPECT_GE(t.min().item<int64_t>(), 0);
  EXPECT_LT(t.max().item<int64_t>(), 1000);
}

TEST(Ddpm, VbTrainsOnlyTheVariance) {
  // d loss / d eps must be the MSE gradient alone: 2 (eps - noise) / numel.
  GaussianDiffusion d;
  at::Generator gen = cpu_gen(5);
  const at::Tensor x0 = at::randn({4, 2, 4, 4}, gen);
  const at::Tensor noise = at::randn(x0.sizes(), gen);
  const at::Tensor t = steps({0, 3, 400, 999});
  const at::Tensor out = at::cat({at::randn(x0.sizes(), gen), at::rand(x0.sizes(), gen).mul(2).sub(1)}, 1)
                             .requires_grad_(true);
  const ModelFn model = [&](const at::Tensor&, const at::Tensor&, const at::Tensor&) { return out; };
  const LossTerms terms = d.training_loss_at(model, x0, at::zeros({4}, at::kLong), t, noise, true);
  terms.loss.backward();
  const at::Tensor g_eps = out.grad().narrow(1, 0, 2);
  const at::Tensor want = out.detach().narrow(1, 0, 2).sub(noise).mul(2.0 / x0.numel());
  EXPECT_LT(max_abs_diff(g_eps, want), 1e-7);
  EXPECT_GT(out.grad().narrow(1, 2, 2).abs().max().item<double>(), 0.0);
}

}  // namespace
}  // namespace perftrain::diffusion
