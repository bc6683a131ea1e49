// Training health on the GPU: the gradient statistics of monitored steps
// inside the captured step (its own graph) equal those of the eager step on
// the same batches; monitoring changes no weight (a run monitored every few
// steps ends bit-identical to one without); the non-finite guard skips a NaN
// step inside the captured graph and training goes on. Skips without a GPU.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "models/dit.h"
#include "train/nan_locator.h"
#include "train/speed.h"
#include "train/step_runner.h"

namespace perftrain::train {
namespace {

TrainConfig tiny(int64_t monitor_every, bool graph) {
  TrainConfig c = default_config(true);
  for (const char* o : {"model.depth=2", "model.hidden=128", "model.heads=2", "model.patch=2", "model.image_size=8",
                        "model.in_channels=4", "model.num_classes=5", "train.batch_size=16", "train.lr=1e-3",
                        "train.warmup_steps=3", "model.learn_sigma=false", "diffusion.objective=ddpm"})
    apply_override(c, o);
  c.health.monitor_every = monitor_every;
  c.speed.graph = graph;
  c.speed.gemm_tune = 0;  // cuBLASLt's first picks: the same algorithms in every run
  apply_speed_settings(c.speed);
  return c;
}

std::vector<data::Batch> batches(const TrainConfig& c, int n) {
  std::vector<data::Batch> out;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int i = 0; i < n; ++i) {
    data::Batch b;
    b.x = at::randn({c.optim.batch_size, c.model.in_channels, c.model.image_size, c.model.image_size}, gen);
    b.y = at::randint(c.model.num_classes, {c.optim.batch_size}, gen, at::kLong);
    b.x = b.x.pin_memory(), b.y = b.y.pin_memory();
    out.push_back(b);
  }
  return out;
}

struct Outcome {
  std::vector<observe::GradHealthSample> health;
  std::vector<at::Tensor> weights;
  std::string graph_status, monitor_note;
  WindowStats window;
};

Outcome train(const TrainConfig& c, const std::vector<data::Batch>& data, const std::string& precision) {
  const at::Device cuda(at::kCUDA, 0);
  auto built = models::build_model_and_ema(c.model, 7, cuda);
  at::Generator gen = at::globalContext().defaultGenerator(cuda).clone();
  gen.set_current_seed(11);
  StepOptions o;
  o.precision = precision;
  StepRunner r(*built.model, built.ema.get(), c, o, cuda, gen);
  for (const auto& b : data) r.step(b);
  Outcome out;
  out.window = r.take_window();
  out.health = r.take_grad_health(true);
  for (const auto& p : built.model->parameters()) out.weights.push_back(p.detach().cpu());
  out.graph_status = r.graph_status();
  out.monitor_note = r.monitor_note();
  return out;
}

double rel_diff(double a, double b) { return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-30}); }

TEST(HealthGpu, CapturedMonitoringMatchesEager) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const char* precision : {"fp32", "bf16"}) {
    const auto data = batches(tiny(5, true), 12);
    const Outcome captured = train(tiny(5, true), data, precision);
    const Outcome eager = train(tiny(5, false), data, precision);
    EXPECT_EQ(captured.graph_status.rfind("captured", 0), 0u) << captured.graph_status;
    EXPECT_EQ(captured.monitor_note, "");
    ASSERT_EQ(captured.health.size(), 2u) << precision;  // steps 5 and 10
    ASSERT_EQ(eager.health.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      const auto& a = captured.health[k];
      const auto& b = eager.health[k];
      EXPECT_EQ(a.step, b.step);
      ASSERT_EQ(a.params.size(), b.params.size());
      for (size_t i = 0; i < a.params.size(); ++i) {
        const auto& x = a.params[i].stats;
        const auto& y = b.params[i].stats;
        const std::string what = std::string(precision) + " step " + std::to_string(a.step) + " " + a.params[i].name;
        EXPECT_LT(rel_diff(x.norm, y.norm), 1e-3) << what;
        EXPECT_LT(rel_diff(x.max_abs, y.max_abs), 1e-3) << what;
        EXPECT_LT(rel_diff(x.mean_abs, y.mean_abs), 1e-3) << what;
        EXPECT_NEAR(x.zero_share, y.zero_share, 1e-3) << what;
        EXPECT_EQ(x.nonfinite, 0) << what;
        EXPECT_LT(rel_diff(x.weight_norm, y.weight_norm), 1e-4) << what;
        EXPECT_LT(rel_diff(x.update_norm, y.update_norm), 2e-2) << what;
      }
      EXPECT_GT(a.global.norm, 0);
      EXPECT_GT(a.global.update_ratio(), 0);
      // Gradient histograms (health.grad_histograms, on by default) from the
      // captured graph: every element counted once, and the buckets those of
      // the eager step up to the elements the two steps' last-bit differences
      // move across an edge.
      ASSERT_EQ(a.param_histograms.size(), a.params.size()) << precision;
      ASSERT_EQ(b.param_histograms.size(), b.params.size());
      double moved_max = 0;
      for (size_t i = 0; i < a.params.size(); ++i) {
        const auto& x = a.param_histograms[i].hist;
        const auto& y = b.param_histograms[i].hist;
        const std::string what = std::string(precision) + " step " + std::to_string(a.step) + " " + a.params[i].name;
        EXPECT_EQ(x.num, static_cast<double>(a.params[i].stats.numel)) << what;
        EXPECT_EQ(y.num, static_cast<double>(b.params[i].stats.numel)) << what;
        ASSERT_EQ(x.counts.size(), y.counts.size());
        double moved = 0;
        for (size_t k = 0; k < x.counts.size(); ++k) moved += std::abs(x.counts[k] - y.counts[k]);
        moved_max = std::max(moved_max, moved / std::max(x.num, 1.0));
        EXPECT_LE(moved, 0.02 * x.num + 2) << what;
        EXPECT_LT(rel_diff(x.max, y.max), 1e-3) << what;
        EXPECT_LT(rel_diff(x.min, y.min), 1e-3) << what;
      }
      std::cout << precision << " step " << a.step << ": histograms of captured and eager gradients differ in at most "
                << moved_max * 100 << "% of a parameter's elements\n";
    }
  }
}

TEST(HealthGpu, MonitoringChangesNoWeight) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const auto data = batches(tiny(3, true), 14);
  const Outcome monitored = train(tiny(3, true), data, "bf16");
  const Outcome plain = train(tiny(0, true), data, "bf16");
  EXPECT_EQ(monitored.health.size(), 4u);  // steps 3 (eager warm-up), 6, 9, 12 (captured)
  EXPECT_TRUE(plain.health.empty());
  ASSERT_EQ(monitored.weights.size(), plain.weights.size());
  for (size_t i = 0; i < plain.weights.size(); ++i)
    EXPECT_TRUE(monitored.weights[i].allclose(plain.weights[i], 1e-6, 1e-9)) << i;
  EXPECT_NEAR(monitored.window.loss, plain.window.loss, 1e-6 * std::abs(plain.window.loss));
}

TEST(HealthGpu, GuardSkipsANaNStepInsideTheGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  TrainConfig c = tiny(0, true);
  c.health.nan_policy = "skip";
  auto data = batches(c, 10);
  data[7].x[0][0][0][0] = std::numeric_limits<float>::quiet_NaN();  // step 8, after the capture
  const Outcome r = train(c, data, "bf16");
  EXPECT_EQ(r.graph_status.rfind("captured", 0), 0u) << r.graph_status;
  EXPECT_EQ(r.window.nonfinite_steps, 1);
  EXPECT_EQ(r.window.first_nonfinite_step, 8);
  EXPECT_TRUE(std::isfinite(r.window.loss));
  for (const auto& w : r.weights) EXPECT_TRUE(at::isfinite(w).all().item<bool>());
}

}  // namespace
}  // namespace perftrain::train
