// The optimizer's schedules and parameter groups on the CPU: each LR shape
// against its closed form, evaluated by the device optimizer (whose prepare
// kernel runs the same definition on the GPU) and the host path alike, also
// after a resume mid-schedule; the EMA start; weight decay on the matrix
// weights only, in AdamW and the device optimizer, against the formula.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "models/dit.h"
#include "train/adamw.h"
#include "train/config.h"
#include "train/device_optimizer.h"
#include "train/ema.h"
#include "train/lr_schedule.h"
#include "train/weight_decay.h"

namespace perftrain::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

kernels::LrSchedule schedule(const std::string& shape, int64_t warmup, int64_t total, double fraction = 0.2) {
  OptimConfig o;
  o.lr = 1e-3, o.lr_min = 1e-5, o.warmup_steps = warmup, o.steps = total, o.decay_fraction = fraction;
  o.lr_schedule = shape;
  return lr_schedule(o);
}

// The shapes as a user writes them down (transformers' and WSD papers'
// definitions on our 1-based step), independently of optimizer_schedule.h.
double closed_form(const std::string& shape, double step, double lr, double lr_min, double w, double total,
                   double fraction) {
  if (step < w) return lr * step / w;
  const double t = std::min(1.0, (step - w) / (total - w));
  if (shape == "cosine") return lr_min + (lr - lr_min) * 0.5 * (1 + std::cos(kPi * t));
  if (shape == "linear") return lr - (lr - lr_min) * t;
  if (shape == "wsd") {
    const double start = std::max(w, total * (1 - fraction));
    if (step <= start) return lr;
    return lr_min + (lr - lr_min) * (1 - std::sqrt(std::min(1.0, (step - start) / (total - start))));
  }
  return lr;
}

TEST(LrSchedule, EachShapeFollowsItsClosedFormAtEveryStep) {
  for (const std::string shape : {"constant", "cosine", "linear", "wsd"}) {
    const auto s = schedule(shape, 10, 100, 0.36);
    double previous = 0;
    for (int64_t step = 1; step <= 120; ++step) {
      const double lr = lr_at(step, s);
      EXPECT_NEAR(lr, closed_form(shape, step, 1e-3, 1e-5, 10, 100, 0.36), 1e-15) << shape << " step " << step;
      if (step <= 10) EXPECT_GT(lr, previous) << shape << ": warm-up rises, step " << step;
      else EXPECT_LE(lr, previous) << shape << ": never rises after the warm-up, step " << step;
      previous = lr;
    }
    EXPECT_DOUBLE_EQ(lr_at(1, s), 1e-4) << shape << ": warm-up from 0";
    EXPECT_DOUBLE_EQ(lr_at(10, s), 1e-3) << shape << ": the peak at the end of the warm-up";
    if (shape != "constant") {
      EXPECT_DOUBLE_EQ(lr_at(100, s), 1e-5) << shape << ": the last step takes lr_min";
      EXPECT_DOUBLE_EQ(lr_at(1000, s), 1e-5) << shape << ": and stays there";
    }
  }
  const double mid = (1e-3 + 1e-5) / 2;
  EXPECT_NEAR(lr_at(55, schedule("cosine", 10, 100)), mid, 1e-15) << "cosine is half-way at mid-decay";
  EXPECT_NEAR(lr_at(55, schedule("linear", 10, 100)), mid, 1e-15);
  // wsd: stable until 100 - 36 = 64, then 1 - sqrt(u): half-way at u = 1/4 (step 73).
  EXPECT_DOUBLE_EQ(lr_at(64, schedule("wsd", 10, 100, 0.36)), 1e-3);
  EXPECT_NEAR(lr_at(73, schedule("wsd", 10, 100, 0.36)), mid, 1e-15);
  // Without a warm-up the first step takes the peak.
  EXPECT_DOUBLE_EQ(lr_at(1, schedule("cosine", 0, 100)), 1e-3 * 0.5 * (1 + std::cos(kPi * 0.01)) + 1e-5 * 0.5 *
                                                              (1 - std::cos(kPi * 0.01)));
}

TEST(EmaSchedule, CopiesTheWeightsBeforeTheStartThenWarmsUpFromThere) {
  const kernels::EmaSchedule e{0.999, true, 5};
  for (int64_t u = 0; u < 5; ++u) EXPECT_EQ(ema_decay_at(u, e), 0.0) << "update " << u;
  EXPECT_DOUBLE_EQ(ema_decay_at(5, e), 0.1);
  EXPECT_DOUBLE_EQ(ema_decay_at(6, e), 2.0 / 11);
  EXPECT_DOUBLE_EQ(ema_decay_at(100000, e), 0.999);
  EXPECT_DOUBLE_EQ(ema_decay_at(5, kernels::EmaSchedule{0.999, false, 5}), 0.999);
  EXPECT_DOUBLE_EQ(ema_decay_at(0, kernels::EmaSchedule{0.999, true, 0}), ema_decay_at(0, 0.999, true));
}

// A few float32 parameters with fixed gradients per step, for the device
// optimizer's CPU path (the same semantics as the kernel; the closed forms
// are the one definition the kernel evaluates).
struct Params {
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::vector<at::Tensor> ema;
  explicit Params(uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    named = {{"a.weight", at::randn({4, 3}, gen).set_requires_grad(true)},
             {"a.bias", at::randn({4}, gen).set_requires_grad(true)}};
    for (auto& [name, p] : named) ema.push_back(p.detach().clone());
  }
  void set_grads(int64_t step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    for (auto& [name, p] : named) p.mutable_grad() = at::randn(p.sizes(), gen);
  }
};

DeviceOptimizerOptions cosine_options() {
  DeviceOptimizerOptions o;
  ops::set_schedules(o, schedule("cosine", 3, 20), kernels::EmaSchedule{0.9, true, 0});
  o.weight_decay = 0.01, o.grad_clip = 1.0;
  return o;
}

// The device optimizer's LR is the closed form at every step, and a run
// resumed from its state at step 8 (the trainer sets the schedule step from
// the checkpoint's) takes the same LRs and ends with the same weights.
TEST(LrSchedule, DeviceOptimizerTakesTheClosedFormAndResumesMidSchedule) {
  const auto s = schedule("cosine", 3, 20);
  Params whole(1);
  DeviceOptimizer a(whole.named, whole.ema, cosine_options());
  std::vector<float> lrs;
  for (int64_t step = 1; step <= 20; ++step) {
    whole.set_grads(step);
    a.step();
    lrs.push_back(a.lr().item<float>());
    EXPECT_EQ(lrs.back(), static_cast<float>(lr_at(step, s))) << "step " << step;
  }
  Params part(1);
  std::vector<std::pair<std::string, at::Tensor>> state;
  {
    DeviceOptimizer b(part.named, part.ema, cosine_options());
    for (int64_t step = 1; step <= 8; ++step) part.set_grads(step), b.step();
    for (const auto& [name, t] : b.state()) state.emplace_back(name, t.clone());
  }
  DeviceOptimizer c(part.named, part.ema, cosine_options());
  c.load_state(state);
  c.set_schedule_step(8);
  for (int64_t step = 9; step <= 20; ++step) {
    part.set_grads(step);
    c.step();
    EXPECT_EQ(c.lr().item<float>(), lrs[step - 1]) << "resumed, step " << step;
  }
  for (size_t i = 0; i < whole.named.size(); ++i) {
    EXPECT_TRUE(whole.named[i].second.equal(part.named[i].second)) << whole.named[i].first;
    EXPECT_TRUE(whole.ema[i].equal(part.ema[i])) << "EMA of " << whole.named[i].first;
  }
}

// A step skipped for a non-finite gradient still moves the schedule on: the
// LR depends on the global step only.
TEST(LrSchedule, SkippedStepsStillAdvanceTheSchedule) {
  const auto s = schedule("linear", 0, 10);
  Params p(2);
  DeviceOptimizerOptions o = cosine_options();
  ops::set_schedules(o, s, kernels::EmaSchedule{0.9, true, 0});
  o.skip_nonfinite = true;
  DeviceOptimizer opt(p.named, p.ema, o);
  for (int64_t step = 1; step <= 6; ++step) {
    p.set_grads(step);
    if (step == 3) p.named[0].second.mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
    opt.step();
    EXPECT_EQ(opt.lr().item<float>(), static_cast<float>(lr_at(step, s))) << "step " << step;
  }
  EXPECT_EQ(opt.skipped().item<float>(), 1.f);
  EXPECT_EQ(opt.steps_taken().item<float>(), 5.f) << "AdamW's own count leaves the skipped step out";
}

TEST(EmaSchedule, DeviceOptimizerCopiesTheWeightsUntilEmaStart) {
  Params p(3);
  DeviceOptimizerOptions o = cosine_options();
  o.ema_start = 3;
  DeviceOptimizer opt(p.named, p.ema, o);
  for (int64_t step = 1; step <= 4; ++step) {
    p.set_grads(step);
    opt.step();
    for (size_t i = 0; i < p.ema.size(); ++i) {
      if (step <= 3) EXPECT_TRUE(p.ema[i].equal(p.named[i].second.detach())) << "step " << step;
      else EXPECT_FALSE(p.ema[i].equal(p.named[i].second.detach())) << "step " << step;
    }
  }
}

TEST(WeightDecay, DecaysTheMatrixWeightsOfADitOnly) {
  TrainConfig c = default_config(false);
  auto model = models::build_model(c.model, 1, at::Device(at::kCPU));
  int decayed = 0, exempt = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    const bool expect = p.dim() >= 2 && name.find("adaLN") == std::string::npos &&
                        name.find("embedding_table") == std::string::npos && name != "pos_embed";
    EXPECT_EQ(decays(name, p), expect) << name;
    (expect ? decayed : exempt) += 1;
  }
  EXPECT_GT(decayed, 0);
  EXPECT_GT(exempt, 0);
  const at::Tensor matrix = at::zeros({4, 4}), vector = at::zeros({4});
  for (const char* name : {"blocks.0.attn.qkv.weight", "blocks.3.mlp.fc2.weight", "x_embedder.proj.weight",
                           "t_embedder.mlp.0.weight", "final_layer.linear.weight", "cond_embedder.proj.weight"})
    EXPECT_TRUE(decays(name, matrix)) << name;
  for (const char* name : {"blocks.0.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.weight",
                           "y_embedder.embedding_table.weight", "pos_embed", "blocks.0.time_embed.weight",
                           "blocks.0.attn_norm.weight", "blocks.0.attn.q_norm.weight"})
    EXPECT_FALSE(decays(name, matrix)) << name;
  EXPECT_FALSE(decays("blocks.0.attn.qkv.bias", vector));
  EXPECT_EQ(decay_flags({{"b", vector}, {"w", matrix}}, false), (std::vector<bool>{false, true}));
  EXPECT_EQ(decay_flags({{"b", vector}, {"w", matrix}}, true), (std::vector<bool>{true, true}));
}

// One parameter of each group, through AdamW and the device optimizer (with
// train.decay_all off and on): each update equals the textbook AdamW in
// float64, with the decay term exactly where its group has it.
TEST(WeightDecay, BothOptimizersDecayEachGroupAsTheFormulaSays) {
  const double lr = 1e-2, wd = 0.3;
  for (const bool decay_all : {false, true}) {
    for (const bool device : {false, true}) {
      const std::string what = std::string(device ? "device optimizer" : "AdamW") + (decay_all ? ", decay_all" : "");
      auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
      std::vector<std::pair<std::string, at::Tensor>> named = {
          {"blocks.0.mlp.fc1.weight", at::randn({4, 3}, gen).set_requires_grad(true)},
          {"blocks.0.mlp.fc1.bias", at::randn({4}, gen).set_requires_grad(true)},
          {"y_embedder.embedding_table.weight", at::randn({5, 3}, gen).set_requires_grad(true)},
          {"blocks.0.adaLN_modulation.1.weight", at::randn({6, 3}, gen).set_requires_grad(true)}};
      std::vector<at::Tensor> w, m, v;
      for (auto& [name, p] : named) {
        w.push_back(p.detach().to(at::kDouble));
        m.push_back(at::zeros_like(w.back()));
        v.push_back(at::zeros_like(w.back()));
      }
      std::unique_ptr<AdamW> host;
      std::unique_ptr<DeviceOptimizer> dev;
      if (device) {
        DeviceOptimizerOptions o;
        o.lr = lr, o.weight_decay = wd, o.decay_all = decay_all, o.ema_decay = 0.9;
        dev = std::make_unique<DeviceOptimizer>(named, std::vector<at::Tensor>{}, o);
      } else {
        host = std::make_unique<AdamW>(named, AdamWOptions{0.9, 0.999, 1e-8, wd, decay_all});
      }
      for (int step = 1; step <= 3; ++step) {
        std::vector<at::Tensor> g;
        for (auto& [name, p] : named) {
          g.push_back(at::randn(p.sizes(), gen));
          p.mutable_grad() = g.back().clone();
        }
        if (device) dev->step();
        else host->step(lr);
        for (size_t i = 0; i < named.size(); ++i) {
          const at::Tensor gd = g[i].to(at::kDouble);
          if (decay_all || decays(named[i].first, named[i].second)) w[i] = w[i] * (1 - lr * wd);
          m[i] = 0.9 * m[i] + 0.1 * gd;
          v[i] = 0.999 * v[i] + 0.001 * gd * gd;
          w[i] = w[i] - lr * (m[i] / (1 - std::pow(0.9, step))) / ((v[i] / (1 - std::pow(0.999, step))).sqrt() + 1e-8);
        }
      }
      // (The decay term moves a weight by lr * wd = 0.3% a step, far outside the tolerance.)
      for (size_t i = 0; i < named.size(); ++i)
        EXPECT_TRUE(named[i].second.detach().to(at::kDouble).allclose(w[i], 1e-5, 1e-6)) << what << ": " << named[i].first;
    }
  }
}

}  // namespace
}  // namespace perftrain::train
