// Training health on the CPU: gradient statistics against a direct
// computation, the detectors on planted vanishing / exploding / dead layers,
// the NaN locator on a NaN planted in module k (forward and backward), the
// step runner's guard (skip and stop policies) and a diverging run stopped
// with the module named and no checkpoint from non-finite weights.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <iostream>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "base/fs.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "models/dit_config.h"
#include "models/single_stream.h"
#include "nn/module.h"
#include "observe/grad_health.h"
#include "support/test_support.h"
#include "train/device_optimizer.h"
#include "train/grad_monitor.h"
#include "train/nan_locator.h"
#include "train/step_runner.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using observe::GradHealthSample;
using observe::GradStats;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(HealthConfig, KeysAreValidatedNamingTheKey) {
  TrainConfig c = default_config(false);
  EXPECT_EQ(c.health.monitor_every, 50);
  EXPECT_EQ(c.health.nan_policy, "stop");
  std::string msg = perftrain::testing::error_of<UsageError>([&] {
    TrainConfig d = c;
    apply_override(d, "health.nan_policy=ignore");
    d.validate();
  });
  EXPECT_NE(msg.find("health.nan_policy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("skip"), std::string::npos) << msg;
  msg = perftrain::testing::error_of<UsageError>([&] {
    TrainConfig d = c;
    apply_override(d, "health.monitor_every=-1");
    d.validate();
  });
  EXPECT_NE(msg.find("health.monitor_every"), std::string::npos) << msg;
  msg = perftrain::testing::error_of<UsageError>([&] {
    TrainConfig d = c;
    apply_override(d, "health.explode_factor=0.5");
    d.validate();
  });
  EXPECT_NE(msg.find("health.explode_factor"), std::string::npos) << msg;
  TrainConfig d = c;
  apply_override(d, "health.monitor_every=0");
  apply_override(d, "health.anomaly_mode=true");
  d.validate();
  TrainConfig back = default_config(false);
  apply_toml(back, d.to_toml(), "config.toml");
  EXPECT_EQ(back.health.monitor_every, 0);
  EXPECT_TRUE(back.health.anomaly_mode);
}

// Random gradients with planted zeros, NaNs and Infs, and one all-zero.
std::vector<at::Tensor> planted_grads() {
  std::vector<at::Tensor> g = {at::randn({7, 5}), at::randn({33}), at::randn({4, 4, 3}), at::zeros({6})};
  g[0].view(-1).index_fill_(0, at::randint(35, {9}, at::kLong), 0.0);
  g[1][3] = kNaN;
  g[1][8] = kInf;
  g[2][1][2][0] = -kInf;
  g[2][0][0][0] = 0.0;
  return g;
}

TEST(GradHealth, StatisticsMatchADirectComputation) {
  at::manual_seed(11);
  const auto grads = planted_grads();
  const at::Tensor rows = grad_stat_rows(grads);
  ASSERT_EQ(rows.size(0), 4);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor g = grads[i].to(at::kDouble);
    const at::Tensor fin = at::isfinite(g);
    const double nonfinite = static_cast<double>(g.numel() - fin.sum().item<int64_t>());
    EXPECT_EQ(rows[i][kStatNonfinite].item<double>(), nonfinite) << i;
    EXPECT_EQ(rows[i][kStatNonzero].item<double>(), static_cast<double>((g != 0).sum().item<int64_t>())) << i;
    if (nonfinite == 0) {
      EXPECT_NEAR(rows[i][kStatNorm].item<double>(), g.norm().item<double>(), 1e-5) << i;
      EXPECT_NEAR(rows[i][kStatAbsSum].item<double>(), g.abs().sum().item<double>(), 1e-4) << i;
      EXPECT_NEAR(rows[i][kStatMaxAbs].item<double>(), g.abs().max().item<double>(), 1e-6) << i;
    } else {
      EXPECT_FALSE(std::isfinite(rows[i][kStatNorm].item<double>())) << i;
    }
  }
  // Host sample: shares, means and the per-module sums.
  const std::vector<std::string> names = {"blocks.0.attn.weight", "blocks.0.attn.bias", "blocks.1.mlp.weight",
                                          "final_layer.bias"};
  std::vector<int64_t> numels;
  for (const auto& g : grads) numels.push_back(g.numel());
  const GradHealthSample s = sample_from_rows(9, names, numels, rows);
  EXPECT_EQ(s.step, 9);
  const at::Tensor g0 = grads[0].to(at::kDouble);
  EXPECT_NEAR(s.params[0].stats.zero_share, (g0 == 0).sum().item<double>() / 35.0, 1e-12);
  EXPECT_NEAR(s.params[0].stats.mean_abs, g0.abs().mean().item<double>(), 1e-6);
  EXPECT_EQ(s.params[3].stats.zero_share, 1.0);
  ASSERT_EQ(s.modules.size(), 3u);
  EXPECT_EQ(s.modules[0].name, "blocks.0");
  EXPECT_EQ(s.modules[1].name, "blocks.1");
  EXPECT_EQ(s.modules[2].name, "final_layer");
  EXPECT_EQ(s.modules[0].stats.numel, 35 + 33);
  EXPECT_EQ(s.modules[0].stats.nonfinite, 2);
  EXPECT_EQ(s.modules[1].stats.nonfinite, 1);
  EXPECT_EQ(s.global.nonfinite, 3);
  EXPECT_EQ(s.global.numel, 35 + 33 + 48 + 6);
}

TEST(GradHealth, ModuleAndGlobalNormsAreThoseOfTheConcatenation) {
  at::manual_seed(12);
  std::vector<at::Tensor> g = {at::randn({10, 3}), at::randn({3}), at::randn({5, 5})};
  const at::Tensor rows = grad_stat_rows(g);
  const GradHealthSample s = sample_from_rows(1, {"x_embedder.proj.weight", "x_embedder.proj.bias", "pos"},
                                              {30, 3, 25}, rows);
  const at::Tensor first = at::cat({g[0].view(-1), g[1]}).to(at::kDouble);
  ASSERT_EQ(s.modules.size(), 2u);
  EXPECT_EQ(s.modules[0].name, "x_embedder");
  EXPECT_NEAR(s.modules[0].stats.norm, first.norm().item<double>(), 1e-5);
  EXPECT_NEAR(s.modules[0].stats.mean_abs, first.abs().mean().item<double>(), 1e-6);
  EXPECT_NEAR(s.modules[0].stats.max_abs, first.abs().max().item<double>(), 1e-6);
  const at::Tensor all = at::cat({first, g[2].view(-1).to(at::kDouble)});
  EXPECT_NEAR(s.global.norm, all.norm().item<double>(), 1e-5);
}

TEST(GradHealth, ModuleOfParameter) {
  EXPECT_EQ(observe::module_of_parameter("blocks.12.mlp.fc1.weight"), "blocks.12");
  EXPECT_EQ(observe::module_of_parameter("t_embedder.mlp.0.weight"), "t_embedder");
  EXPECT_EQ(observe::module_of_parameter("final_layer.linear.bias"), "final_layer");
  EXPECT_EQ(observe::module_of_parameter("pos_embed"), "pos_embed");
}

// The monitor's update columns: ||w|| before and ||w_after - w_before||.
TEST(GradHealth, MonitorMeasuresTheUpdate) {
  at::manual_seed(13);
  at::Tensor a = at::randn({6, 4}).requires_grad_(true), b = at::randn({4}).requires_grad_(true);
  a.mutable_grad() = at::randn({6, 4});
  b.mutable_grad() = at::randn({4});
  GradMonitor m({{"blocks.0.a", a}, {"blocks.0.b", b}});
  const at::Tensor a0 = a.detach().clone(), b0 = b.detach().clone();
  m.before_update();
  const at::Tensor da = at::randn({6, 4}) * 1e-2, db = at::randn({4}) * 1e-3;
  {
    at::NoGradGuard no_grad;
    a.add_(da);
    b.add_(db);
  }
  m.after_update();
  m.queue_readback(50);
  const auto samples = m.take_ready(true);
  ASSERT_EQ(samples.size(), 1u);
  const auto& s = samples[0];
  EXPECT_EQ(s.step, 50);
  EXPECT_NEAR(s.params[0].stats.weight_norm, a0.norm().item<double>(), 1e-5);
  EXPECT_NEAR(s.params[0].stats.update_norm, da.norm().item<double>(), 1e-6);
  EXPECT_NEAR(s.params[1].stats.update_ratio(), db.norm().item<double>() / b0.norm().item<double>(), 1e-5);
  EXPECT_NEAR(s.params[0].stats.norm, a.grad().norm().item<double>(), 1e-5);
  const double whole = std::sqrt(da.pow(2).sum().item<double>() + db.pow(2).sum().item<double>()) /
                       std::sqrt(a0.pow(2).sum().item<double>() + b0.pow(2).sum().item<double>());
  EXPECT_NEAR(s.global.update_ratio(), whole, 1e-5);
  EXPECT_TRUE(m.take_ready(true).empty());
}

// A direct histogram over grad_histogram_limits(), in double: an element x
// of a float32 gradient goes to the first bucket whose limit (as the float32
// the device compares with) is >= x; non-finite elements are left out.
std::vector<double> direct_histogram(const at::Tensor& g) {
  const std::vector<double>& limits = observe::grad_histogram_limits();
  std::vector<double> edges;
  for (size_t i = 0; i + 1 < limits.size(); ++i) edges.push_back(static_cast<float>(limits[i]));
  std::vector<double> counts(limits.size(), 0.0);
  const at::Tensor v = g.reshape({-1}).to(at::kDouble).contiguous();
  const double* p = v.data_ptr<double>();
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (!std::isfinite(p[i])) continue;
    size_t b = 0;
    while (b < edges.size() && edges[b] < p[i]) ++b;
    counts[b] += 1;
  }
  return counts;
}

// Gradients over many decades of both signs, with exact zeros, a NaN and an
// Inf, and an undefined gradient.
std::vector<at::Tensor> wide_grads() {
  at::Tensor a = at::randn({40, 30}) * at::pow(10.0, at::rand({40, 30}) * 17 - 14);
  a.view(-1).slice(0, 0, 50).zero_();
  at::Tensor b = at::randn({64}) * 1e-3;
  b[3] = kNaN;
  b[7] = kInf;
  at::Tensor c = at::randn({7, 9}) * 300;  // beyond the last edges
  return {a, b, at::Tensor(), c};
}

TEST(GradHistograms, LimitsAreSymmetricWithAZeroBucket) {
  const auto& l = observe::grad_histogram_limits();
  ASSERT_EQ(l.size(), 115u);
  EXPECT_EQ(l.back(), std::numeric_limits<double>::max());
  for (size_t i = 0; i + 1 < l.size(); ++i) EXPECT_LT(l[i], l[i + 1]) << i;
  for (size_t i = 0; i < 57; ++i) EXPECT_DOUBLE_EQ(l[i], -l[113 - i]) << i;
  EXPECT_DOUBLE_EQ(l[56], -1e-12);
  EXPECT_DOUBLE_EQ(l[57], 1e-12);
  EXPECT_DOUBLE_EQ(l[113], 1e2);
}

TEST(GradHistograms, CountsEqualADirectHistogramOfTheGradients) {
  at::manual_seed(21);
  const auto grads = wide_grads();
  const at::Tensor rows = grad_histogram_rows(grads, grad_histogram_boundaries(at::TensorOptions()));
  ASSERT_EQ(rows.size(0), 4);
  ASSERT_EQ(rows.size(1), kHistLead + 115);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor counts = rows[i].slice(0, kHistLead).to(at::kDouble).contiguous();
    if (!grads[i].defined()) {
      EXPECT_EQ(counts.sum().item<double>(), 0.0);
      continue;
    }
    const std::vector<double> want = direct_histogram(grads[i]);
    int nonempty = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(counts[k].item<double>(), want[k]) << "gradient " << i << " bucket " << k;
      nonempty += want[k] > 0;
    }
    EXPECT_GT(nonempty, i == 0 ? 40 : 3) << i;  // the test covers many buckets
    const at::Tensor g = grads[i].to(at::kDouble);
    if (at::isfinite(g).all().item<bool>()) {
      EXPECT_NEAR(rows[i][0].item<double>(), g.min().item<double>(), 1e-6 * g.abs().max().item<double>()) << i;
      EXPECT_NEAR(rows[i][1].item<double>(), g.max().item<double>(), 1e-6 * g.abs().max().item<double>()) << i;
      EXPECT_NEAR(rows[i][2].item<double>(), g.sum().item<double>(), 1e-5 * g.abs().sum().item<double>()) << i;
    }
  }
  EXPECT_EQ(rows[1].slice(0, kHistLead).sum().item<double>(), 62.0);  // the NaN and the Inf are not counted
  EXPECT_GT(rows[0][kHistLead + 57].item<double>(), 49.0);           // the zeros sit in the zero bucket
}

// Through the monitor: per parameter and per module (the sum of its
// parameters' histograms), read back with the statistics.
TEST(GradHistograms, MonitorReadsThemBackPerParameterAndModule) {
  at::manual_seed(22);
  const auto grads = wide_grads();
  const std::vector<std::string> names = {"blocks.0.attn.weight", "blocks.0.attn.bias", "blocks.0.mlp.weight",
                                          "final_layer.weight"};
  const std::vector<std::vector<int64_t>> shapes = {{40, 30}, {64}, {5}, {7, 9}};
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (size_t i = 0; i < names.size(); ++i) {
    at::Tensor p = at::randn(shapes[i]).requires_grad_(true);
    if (grads[i].defined()) p.mutable_grad() = grads[i].clone();
    params.push_back({names[i], p});
  }
  GradMonitor m(params, /*histograms=*/true);
  m.before_update();
  m.after_update();
  m.queue_readback(7);
  const auto samples = m.take_ready(true);
  ASSERT_EQ(samples.size(), 1u);
  const GradHealthSample& s = samples[0];
  ASSERT_EQ(s.param_histograms.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& h = s.param_histograms[i].hist;
    EXPECT_EQ(s.param_histograms[i].name, names[i]);
    const std::vector<double> want = grads[i].defined() ? direct_histogram(grads[i]) : std::vector<double>(115, 0.0);
    EXPECT_EQ(h.counts, want) << names[i];
    EXPECT_EQ(h.finite, i != 1) << names[i];
  }
  EXPECT_EQ(s.params[2].stats.norm, 0.0);  // no gradient: counted as zeros
  EXPECT_EQ(s.params[2].stats.max_abs, 0.0);
  EXPECT_EQ(s.params[2].stats.zero_share, 1.0);
  ASSERT_EQ(s.module_histograms.size(), 2u);
  EXPECT_EQ(s.module_histograms[0].name, "blocks.0");
  std::vector<double> block(115, 0.0);
  for (size_t i = 0; i < 3; ++i)
    for (size_t k = 0; k < 115; ++k) block[k] += s.param_histograms[i].hist.counts[k];
  EXPECT_EQ(s.module_histograms[0].hist.counts, block);
  EXPECT_EQ(s.module_histograms[0].hist.num, 1200.0 + 62.0);
  EXPECT_FALSE(s.module_histograms[0].hist.finite);  // the NaN of blocks.0.attn.bias
  const auto& f = s.module_histograms[1].hist;
  const at::Tensor c = grads[3].to(at::kDouble);
  EXPECT_TRUE(f.finite);
  EXPECT_EQ(f.num, 63.0);
  EXPECT_NEAR(f.min, c.min().item<double>(), 1e-3);
  EXPECT_NEAR(f.max, c.max().item<double>(), 1e-3);
  EXPECT_NEAR(f.sum_squares, c.pow(2).sum().item<double>(), 1e-5 * c.pow(2).sum().item<double>());
  // Without histograms the sample has none.
  GradMonitor plain(params);
  plain.before_update();
  plain.after_update();
  plain.queue_readback(8);
  EXPECT_TRUE(plain.take_ready(true)[0].module_histograms.empty());
}

// The device optimizer's skip_nonfinite (here its CPU reference; the CUDA
// kernel in health_gpu_test through the step runner): an inf/NaN gradient
// changes no weight, moment, EMA or step count; the next finite one updates.
TEST(DeviceOptimizerGuard, SkipNonfiniteSkipsTheWholeUpdate) {
  at::manual_seed(18);
  at::Tensor a = at::randn({4, 3}).requires_grad_(true), b = at::randn({5}).requires_grad_(true);
  std::vector<at::Tensor> ema = {a.detach().clone(), b.detach().clone()};
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.ema_decay = 0.5, o.ema_warmup = false, o.skip_nonfinite = true;
  DeviceOptimizer opt({{"a", a}, {"b", b}}, ema, o);
  const at::Tensor a0 = a.detach().clone(), e0 = ema[0].clone();
  a.mutable_grad() = at::randn({4, 3});
  b.mutable_grad() = at::randn({5});
  b.mutable_grad()[2] = kNaN;
  opt.step();
  EXPECT_TRUE(a.detach().equal(a0));
  EXPECT_TRUE(ema[0].equal(e0));
  EXPECT_EQ(opt.skipped().item<float>(), 1.f);
  EXPECT_EQ(opt.steps_taken().item<float>(), 0.f);
  a.mutable_grad() = at::randn({4, 3});
  b.mutable_grad() = at::randn({5});
  opt.step();
  EXPECT_FALSE(a.detach().equal(a0));
  EXPECT_EQ(opt.steps_taken().item<float>(), 1.f);
  EXPECT_EQ(opt.skipped().item<float>(), 1.f);
}

// Healthy random samples of three modules, with one module's norm overridable.
GradHealthSample healthy(int64_t step, double scale = 1.0) {
  GradHealthSample s;
  s.step = step;
  for (const char* name : {"x_embedder.w", "blocks.0.w", "final_layer.w"}) {
    GradStats g;
    g.numel = 100;
    g.norm = scale * (0.5 + at::rand({1}).item<double>());
    g.mean_abs = g.norm / 10;
    g.max_abs = g.norm / 2;
    g.zero_share = 0.01;
    s.params.push_back({name, g});
  }
  observe::summarize_modules(s);
  return s;
}

std::vector<observe::HealthWarning> feed(observe::HealthDetectors& d, GradHealthSample s) {
  observe::summarize_modules(s);
  return d.observe(s);
}

TEST(HealthDetectors, QuietOnHealthyGradients) {
  at::manual_seed(14);
  observe::HealthDetectors d;
  for (int i = 1; i <= 40; ++i) EXPECT_TRUE(d.observe(healthy(50 * i)).empty()) << i;
}

TEST(HealthDetectors, VanishingAfterPatienceLowSamples) {
  at::manual_seed(15);
  observe::HealthThresholds t;
  t.vanish_norm = 1e-6;
  t.patience = 3;
  observe::HealthDetectors d(t);
  for (int i = 1; i <= 5; ++i) EXPECT_TRUE(d.observe(healthy(i)).empty());
  for (int i = 6; i <= 10; ++i) {
    GradHealthSample s = healthy(i);
    s.params[1].stats.norm = 1e-9;  // blocks.0
    const auto w = feed(d, s);
    if (i == 8) {
      ASSERT_EQ(w.size(), 1u) << i;
      EXPECT_EQ(w[0].kind, "vanishing");
      EXPECT_EQ(w[0].module, "blocks.0");
      EXPECT_EQ(w[0].step, 8);
    } else {
      EXPECT_TRUE(w.empty()) << i;  // once, when it starts
    }
  }
}

TEST(HealthDetectors, ExplodingAgainstTheRunningMedian) {
  at::manual_seed(16);
  observe::HealthDetectors d;  // factor 10, at least 5 samples
  EXPECT_TRUE(d.observe(healthy(1, 1000)).empty()) << "no median yet";
  for (int i = 2; i <= 8; ++i) EXPECT_TRUE(d.observe(healthy(i)).empty());
  const auto w = d.observe(healthy(9, 100));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].kind, "exploding");
  EXPECT_EQ(w[0].step, 9);
  EXPECT_TRUE(d.observe(healthy(10)).empty());
  EXPECT_EQ(d.warnings().size(), 1u);
}

TEST(HealthDetectors, DeadLayerAndNonFinite) {
  at::manual_seed(17);
  observe::HealthThresholds t;
  t.patience = 2;
  observe::HealthDetectors d(t);
  GradHealthSample s = healthy(1);
  s.params[2].stats.zero_share = 1.0;  // final_layer: all zero
  s.params[2].stats.norm = s.params[2].stats.mean_abs = s.params[2].stats.max_abs = 0;
  EXPECT_TRUE(feed(d, s).empty());
  s.step = 2;
  auto w = feed(d, s);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].kind, "dead");
  EXPECT_EQ(w[0].module, "final_layer");
  GradHealthSample n = healthy(3);
  n.params[0].stats.nonfinite = 4;
  w = feed(d, n);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].kind, "nonfinite");
  EXPECT_EQ(w[0].module, "x_embedder");
}

// A small module tree for the backward cases: each layer adds
// scale * sqrt(w) to its input (w = 1: finite everywhere) ...
class Layer : public nn::Module {
 public:
  explicit Layer(int kind) : kind_(kind) {
    w = at::ones({3});
    register_parameter("w", &w);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return hooked({x}, [this](at::TensorList in) {
      if (kind_ == 1) return in[0] + 0 * at::sqrt(w);  // w = 0: finite forward, NaN gradient of w
      if (kind_ == 2) return in[0] + at::sqrt(in[0] - in[0].detach());  // finite forward, inf input gradient
      return in[0] * w + 1;
    });
  }
  at::Tensor w;

 private:
  int kind_;
};

class Net : public nn::Module {
 public:
  Net(int k, int kind) {
    for (int i = 0; i < 4; ++i) layers.add(std::make_unique<Layer>(i == k ? kind : 0));
    register_module("layers", &layers);
  }
  at::Tensor forward(const at::Tensor& x) const {
    return hooked({x}, [this](at::TensorList in) {
      at::Tensor h = in[0];
      for (size_t i = 0; i < layers.size(); ++i) h = layers[i].forward(h);
      return h;
    });
  }
  nn::ModuleList<Layer> layers;
};

TEST(NanLocator, BackwardNaNOfAParameterIsTracedToItsModule) {
  for (int k = 0; k < 4; ++k) {
    Net net(k, 1);
    {
      at::NoGradGuard no_grad;
      net.layers[k].w.zero_();
    }
    for (auto& [n, p] : net.named_parameters()) p.requires_grad_(true);
    const at::Tensor x = at::randn({5, 3});
    const NonFiniteSite site = locate_nonfinite(net, [&] { return net.forward(x).pow(2).mean(); });
    ASSERT_TRUE(site.found) << k;
    EXPECT_EQ(site.phase, "backward") << site.message();
    EXPECT_EQ(site.module, "layers." + std::to_string(k)) << site.message();
    EXPECT_NE(site.detail.find("layers." + std::to_string(k) + ".w"), std::string::npos) << site.detail;
    for (auto& [n, p] : net.named_parameters()) EXPECT_FALSE(p.grad().defined()) << "no gradient left behind";
  }
}

TEST(NanLocator, BackwardInfOfAnInputGradientIsTracedToItsModule) {
  for (int k = 1; k < 4; ++k) {
    Net net(k, 2);
    for (auto& [n, p] : net.named_parameters()) p.requires_grad_(true);
    const at::Tensor x = at::randn({5, 3}).requires_grad_(true);
    const NonFiniteSite site = locate_nonfinite(net, [&] { return net.forward(x).pow(2).mean(); });
    ASSERT_TRUE(site.found) << k;
    EXPECT_EQ(site.phase, "backward");
    EXPECT_EQ(site.module, "layers." + std::to_string(k)) << site.message();
  }
}

TrainConfig tiny_dit() {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.depth=4", "model.hidden=32", "model.heads=2", "model.patch=2", "model.image_size=4",
                        "model.in_channels=1", "model.num_classes=3", "train.batch_size=8", "train.lr=1e-2",
                        "train.device=cpu", "train.precision=fp32"})
    apply_override(c, o);
  return c;
}

TEST(NanLocator, ForwardInfInBlockKIsTracedToThatBlock) {
  const TrainConfig c = tiny_dit();
  for (int k = 0; k < 4; ++k) {
    models::DiT model(c.model, 3);
    const std::string planted = "blocks." + std::to_string(k) + ".mlp.fc1";
    for (auto& [name, p] : model.named_parameters())
      if (name == planted + ".weight") {
        at::NoGradGuard no_grad;
        p[0][0] = kInf;
      }
    const at::Tensor x = at::randn({2, 1, 4, 4}), t = at::rand({2}) * 1000, y = at::randint(3, {2}, at::kLong);
    // Weights are checked first: an inf weight is named as such.
    NonFiniteSite site = locate_nonfinite(model, [&] { return model.forward(x, t, y).pow(2).mean(); });
    ASSERT_TRUE(site.found);
    EXPECT_EQ(site.phase, "weights");
    EXPECT_EQ(site.module, planted + ".weight");
    // An activation that overflows: huge finite weights. fc1 reads LayerNorm's rows (mean zero, unit
    // variance), so units 0-3 each take +-3e38 in another sign pattern over all the columns: each unit's
    // product is 3e38 times a sum of D signed unit-variance values, finite only while that sum is under
    // 1.13 in magnitude (fp32's largest value over 3e38), for every token and unit at once a chance of
    // about 1e-25. Two planted columns left the overflow to the draw.
    for (auto& [name, p] : model.named_parameters())
      if (name == planted + ".weight") {
        at::NoGradGuard no_grad;
        for (int64_t unit = 0; unit < 4; ++unit)
          for (int64_t col = 0; col < p.size(1); ++col) p[unit][col] = ((col >> unit) & 1) != 0 ? 3e38 : -3e38;
      }
    site = locate_nonfinite(model, [&] { return model.forward(x, t, y).pow(2).mean(); });
    ASSERT_TRUE(site.found) << k;
    EXPECT_EQ(site.phase, "forward") << site.message();
    EXPECT_EQ(site.module, planted) << site.message();
    EXPECT_EQ(site.type, "Linear");
    ASSERT_FALSE(site.inputs.empty());
    EXPECT_EQ(site.inputs[0].nan + site.inputs[0].inf, 0);
    ASSERT_FALSE(site.outputs.empty());
    EXPECT_GT(site.outputs[0].nan + site.outputs[0].inf, 0);
  }
}

// The single-stream family through the same hook point: its blocks,
// attention, norms and SwiGLU fire on the plain path the locator re-runs.
struct SingleStreamCase {
  std::unique_ptr<models::SingleStreamDiT> model;
  at::Tensor x, t;
  models::Condition cond;
  at::Tensor loss() const { return model->forward(x, t, cond).pow(2).mean(); }
};

SingleStreamCase single_stream_case(uint64_t seed) {
  models::DiTConfig c = models::model_config("SS-S/2");
  c.depth = 4, c.hidden = 32, c.heads = 2, c.patch = 2, c.image_size = 4, c.in_channels = 1, c.num_classes = 3;
  c.cond_tokens = 2;
  SingleStreamCase s;
  s.model = std::make_unique<models::SingleStreamDiT>(c, seed);
  // Every weight perturbed: the zero-initialised adaLN and final layers
  // would make most gradients exactly zero.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  s.model->transform(
      [&](const std::string&, const at::Tensor& w) { return w + 0.1 * at::randn(w.sizes(), gen, at::kFloat); });
  s.x = at::randn({2, 1, 4, 4}, gen);
  s.t = at::rand({2}, gen) * 1000;
  s.cond.labels = at::randint(3, {2}, gen, at::kLong);
  return s;
}

TEST(NanLocator, SingleStreamForwardOverflowInBlockKIsTracedToThatModule) {
  for (int k = 0; k < 4; ++k) {
    SingleStreamCase s = single_stream_case(30);
    const std::string planted = "blocks." + std::to_string(k) + ".ffn.gate";
    for (auto& [name, p] : s.model->named_parameters())
      if (name == planted + ".weight") {
        at::NoGradGuard no_grad;
        p[0].fill_(3e38);  // gate unit 0 overflows on every token
      }
    const NonFiniteSite site = locate_nonfinite(*s.model, [&] { return s.loss(); });
    ASSERT_TRUE(site.found) << k;
    EXPECT_EQ(site.phase, "forward") << site.message();
    EXPECT_EQ(site.module, planted) << site.message();
    EXPECT_EQ(site.type, "Linear");
    ASSERT_FALSE(site.inputs.empty());
    EXPECT_EQ(site.inputs[0].nan + site.inputs[0].inf, 0);
    EXPECT_GT(site.outputs[0].nan + site.outputs[0].inf, 0);
  }
}

// A NaN put into the gradient inside block k (on the input of its SwiGLU,
// after that module's own hook saw it finite): the first module whose input
// gradients are non-finite while its output's were finite is block k.
TEST(NanLocator, SingleStreamBackwardNaNInBlockKIsTracedToThatBlock) {
  for (int k = 0; k < 4; ++k) {
    SingleStreamCase s = single_stream_case(31);
    const std::string ffn = "blocks." + std::to_string(k) + ".ffn";
    auto plant = s.model->add_forward_hook(
        [&](const std::string& name, const nn::Module&, at::TensorList in, at::TensorList) {
          if (name != ffn || !at::GradMode::is_enabled() || !in[0].requires_grad()) return;
          in[0].register_hook([](const at::Tensor& g) { return g * std::numeric_limits<float>::quiet_NaN(); });
        });
    // Before the plant the same run is finite throughout.
    plant.remove();
    NonFiniteSite site = locate_nonfinite(*s.model, [&] { return s.loss(); });
    EXPECT_FALSE(site.found) << site.message();
    plant = s.model->add_forward_hook(
        [&](const std::string& name, const nn::Module&, at::TensorList in, at::TensorList) {
          if (name != ffn || !at::GradMode::is_enabled() || !in[0].requires_grad()) return;
          in[0].register_hook([](const at::Tensor& g) { return g * std::numeric_limits<float>::quiet_NaN(); });
        });
    site = locate_nonfinite(*s.model, [&] { return s.loss(); });
    ASSERT_TRUE(site.found) << k;
    EXPECT_EQ(site.phase, "backward") << site.message();
    EXPECT_EQ(site.module, "blocks." + std::to_string(k)) << site.message();
    EXPECT_EQ(site.type, "SingleStreamBlock") << site.message();
  }
}

TEST(NanLocator, NothingFoundOnAHealthyModel) {
  const TrainConfig c = tiny_dit();
  models::DiT model(c.model, 3);
  const at::Tensor x = at::randn({2, 1, 4, 4}), t = at::rand({2}) * 1000, y = at::randint(3, {2}, at::kLong);
  const NonFiniteSite site = locate_nonfinite(model, [&] { return model.forward(x, t, y).pow(2).mean(); });
  EXPECT_FALSE(site.found) << site.message();
  EXPECT_EQ(first_nonfinite_tensor(model), "");
}

std::vector<at::Tensor> copies(const models::DiT& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].equal(b[i])) return false;
  return true;
}

// A single-stream model through the step runner: per-module statistics and
// gradient histograms of its blocks, and the eager re-run of a NaN step
// names the module that made the first non-finite value.
TEST(StepRunnerGuard, SingleStreamModelIsMonitoredAndLocated) {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.name=SS-S/2", "model.depth=4", "model.hidden=32", "model.heads=2", "model.patch=2",
                        "model.image_size=4", "model.in_channels=1", "model.num_classes=3", "model.cond_tokens=2",
                        "train.batch_size=8", "train.device=cpu", "train.precision=fp32", "health.monitor_every=2",
                        "health.nan_policy=skip"})
    apply_override(c, o);
  ASSERT_TRUE(c.model.single_stream());
  auto built = models::build_diffusion_model_and_ema(c.model, 1, at::Device(at::kCPU));
  StepOptions o;
  o.precision = "fp32";
  StepRunner r(*built.model, built.ema.get(), c, o, at::Device(at::kCPU), at::make_generator<at::CPUGeneratorImpl>(5));
  data::Batch good{at::randn({8, 1, 4, 4}), at::randint(3, {8}, at::kLong)};
  data::Batch bad{good.x.clone(), good.y};
  bad.x[2][0][1][1] = kNaN;
  r.step(good);
  r.step(good);
  r.step(bad);
  r.step(good);
  const WindowStats w = r.take_window();
  EXPECT_EQ(w.first_nonfinite_step, 3);
  const NonFiniteSite site = r.locate_nonfinite(3);
  ASSERT_TRUE(site.found) << site.message();
  EXPECT_EQ(site.phase, "forward") << site.message();
  EXPECT_EQ(site.module, "x_embedder") << "the patch embedding reads the NaN pixel first: " << site.message();
  const auto health = r.take_grad_health(true);
  ASSERT_EQ(health.size(), 2u);
  std::vector<std::string> modules;
  for (const auto& m : health[1].modules) modules.push_back(m.name);
  EXPECT_EQ(modules, (std::vector<std::string>{"x_embedder", "t_embedder", "y_embedder", "blocks.0", "blocks.1",
                                               "blocks.2", "blocks.3", "final_layer"}));
  ASSERT_EQ(health[1].module_histograms.size(), modules.size());
  for (size_t i = 0; i < modules.size(); ++i) {
    EXPECT_EQ(health[1].module_histograms[i].hist.num, static_cast<double>(health[1].modules[i].stats.numel))
        << modules[i];
    EXPECT_GT(health[1].modules[i].stats.numel, 0) << modules[i];
  }
  EXPECT_GT(health[1].modules[3].stats.norm, 0);  // blocks.0 trains
}

// A NaN in the data at step 3: skip skips that update and goes on; stop
// also skips every later one (the weights stay those step 3 saw).
TEST(StepRunnerGuard, SkipAndStopPolicies) {
  for (const std::string policy : {"skip", "stop"}) {
    TrainConfig c = tiny_dit();
    apply_override(c, "health.nan_policy=" + policy);
    apply_override(c, "health.monitor_every=2");
    auto built = models::build_model_and_ema(c.model, 1, at::Device(at::kCPU));
    StepOptions o;
    o.precision = "fp32";
    StepRunner r(*built.model, built.ema.get(), c, o, at::Device(at::kCPU), at::make_generator<at::CPUGeneratorImpl>(5));
    data::Batch good{at::randn({8, 1, 4, 4}), at::randint(3, {8}, at::kLong)};
    data::Batch bad{good.x.clone(), good.y};
    bad.x[2][0][1][1] = kNaN;
    r.step(good);
    r.step(good);
    const auto before = copies(*built.model);
    r.step(bad);
    EXPECT_TRUE(same(before, copies(*built.model))) << policy << ": step 3's update was skipped";
    r.step(good);
    r.step(good);
    const WindowStats w = r.take_window();
    EXPECT_EQ(w.first_nonfinite_step, 3) << policy;
    EXPECT_TRUE(std::isfinite(w.loss)) << policy;
    if (policy == "skip") {
      EXPECT_EQ(w.nonfinite_steps, 1);
      EXPECT_FALSE(same(before, copies(*built.model))) << "steps 4 and 5 trained";
    } else {
      EXPECT_EQ(w.nonfinite_steps, 3);
      EXPECT_TRUE(same(before, copies(*built.model))) << "stop: nothing trained after step 3";
    }
    EXPECT_EQ(first_nonfinite_tensor(*built.model), "");
    // The eager re-run of step 3's batch: the NaN is in the input itself.
    const NonFiniteSite site = r.locate_nonfinite(3);
    ASSERT_TRUE(site.found) << site.message();
    EXPECT_EQ(site.phase, "forward");
    EXPECT_EQ(r.locate_nonfinite(1).found, false);
    // Monitored steps 2 and 4 (step 3's NaN gradient was skipped, not monitored).
    const auto health = r.take_grad_health(true);
    ASSERT_EQ(health.size(), 2u);
    EXPECT_EQ(health[0].step, 2);
    EXPECT_EQ(health[1].step, 4);
    EXPECT_GT(health[0].global.norm, 0);
    EXPECT_GT(health[0].global.update_ratio(), 0);
    EXPECT_EQ(health[0].global.nonfinite, 0);
  }
}

TrainConfig diverging(const std::string& runs, const std::string& policy) {
  TrainConfig c = tiny_dit();
  for (const char* o : {"data.source=synthetic", "data.synthetic_size=32", "train.lr=1e20", "train.warmup_steps=0",
                        "log.every=1", "log.checkpoint_every=1", "log.sample_every=0", "diffusion.sample_steps=2",
                        "log.sample_per_class=1", "health.monitor_every=1", "log.tensorboard=false"})
    apply_override(c, o);
  apply_override(c, "health.nan_policy=" + policy);
  c.optim.steps = 6;
  c.run.dir = runs;
  c.run.name = policy;
  return c;
}

TEST(TrainerHealth, DivergingRunStopsNamingTheModuleAndWritesNoBadCheckpoint) {
  perftrain::testing::TempDir tmp;
  std::ostringstream log;
  const std::string msg =
      perftrain::testing::error_of<RuntimeError>([&] { run_training(diverging(tmp.path(), "stop"), {}, log); });
  EXPECT_NE(msg.find("non-finite"), std::string::npos) << msg;
  // Named: the first module whose output overflowed (or, where every module's
  // output stayed finite, the loss).
  EXPECT_TRUE(msg.find("first non-finite forward: ") != std::string::npos ||
              msg.find("the loss is not") != std::string::npos)
      << msg;
  std::cout << msg << "\n";
  EXPECT_NE(msg.find("health.nan_policy"), std::string::npos) << msg;
  const std::string report = perftrain::testing::read_raw(tmp.path() + "/stop/report.md");
  EXPECT_NE(report.find("## Training health"), std::string::npos);
  EXPECT_NE(report.find("first non-finite value"), std::string::npos) << report;
  // The stop's metrics line carries grad_norm too: null, the step's norm was NaN.
  const std::string metrics = perftrain::testing::read_raw(tmp.path() + "/stop/metrics.jsonl");
  const auto last_line = metrics.substr(metrics.rfind('\n', metrics.size() - 2) + 1);
  const auto stop_line = nlohmann::json::parse(last_line);
  ASSERT_TRUE(stop_line.contains("nonfinite_steps")) << last_line;
  ASSERT_TRUE(stop_line.contains("grad_norm")) << last_line;
  EXPECT_TRUE(stop_line["grad_norm"].is_null()) << last_line;
  // Every checkpoint written holds finite weights.
  int checked = 0;
  for (const auto& step : fs::list_directory(tmp.path() + "/stop/ckpt")) {
    const std::string f = tmp.path() + "/stop/ckpt/" + step + "/model.safetensors";
    if (!fs::exists(f)) continue;
    auto file = io::SafetensorsFile::open(f);
    for (const auto& n : file.names()) EXPECT_TRUE(at::isfinite(file.get(n)).all().item<bool>()) << step << " " << n;
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

TEST(TrainerHealth, SkipPolicyGoesOn) {
  perftrain::testing::TempDir tmp;
  std::ostringstream log;
  const TrainSummary s = run_training(diverging(tmp.path(), "skip"), {}, log);
  EXPECT_EQ(s.last_step, 6);
  EXPECT_GT(s.nonfinite_steps, 0) << log.str();
  EXPECT_FALSE(s.nonfinite_site.empty());
  const std::string metrics = perftrain::testing::read_raw(tmp.path() + "/skip/metrics.jsonl");
  EXPECT_NE(metrics.find("\"nonfinite_steps\""), std::string::npos);
  EXPECT_NE(metrics.find("\"grad_modules\""), std::string::npos);
  EXPECT_NE(metrics.find("\"blocks.3\""), std::string::npos);
  // Every line carries the last step's gradient norm (the host optimizer
  // without clipping here): a number, or null where that step's was NaN/Inf.
  std::istringstream lines(metrics);
  int with_norm = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto rec = nlohmann::json::parse(line);
    EXPECT_TRUE(rec.contains("grad_norm") && (rec["grad_norm"].is_number() || rec["grad_norm"].is_null())) << line;
    with_norm += rec.contains("grad_norm");
  }
  EXPECT_EQ(with_norm, 5);  // steps 2..6 (the first step is timed apart)
}

}  // namespace
}  // namespace perftrain::train
