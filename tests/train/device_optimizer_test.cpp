// DeviceOptimizer on the CPU (its plain-ATen path) against the pieces it
// replaces: clip_grad_norm_ + lr_at + AdamW + ema_update_, step by step; the
// fp16 loss-scale rules; state() names and round trip; input errors.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "support/test_support.h"
#include "base/error.h"
#include "train/adamw.h"
#include "train/device_optimizer.h"
#include "train/ema.h"
#include "train/grad_clip.h"
#include "train/lr_schedule.h"
#include "support/tensor_checks.h"

namespace perftrain::train {
namespace {

// (rtol, atol), as these tests were written.
::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& ref, double rtol, double atol) {
  return perftrain::testing::all_close(a, ref, atol, rtol);
}

using Named = std::vector<std::pair<std::string, at::Tensor>>;

at::Generator gen_for(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }


float value(const at::Tensor& t) { return t.item<float>(); }

struct Twin {  // the same starting weights for the optimizer under test and the reference pieces
  std::vector<std::string> names;
  std::vector<at::Tensor> p, ema, p_ref, ema_ref;
  Named named(const std::vector<at::Tensor>& ts) const {
    Named out;
    for (size_t i = 0; i < ts.size(); ++i) out.emplace_back(names[i], ts[i]);
    return out;
  }
};

Twin make_twin(const std::vector<std::vector<int64_t>>& shapes, at::Generator& gen) {
  Twin t;
  for (size_t i = 0; i < shapes.size(); ++i) {
    t.names.push_back("layer" + std::to_string(i) + ".weight");
    auto w = at::randn(shapes[i], gen, at::kFloat);
    auto e = w + 0.1 * at::randn(shapes[i], gen, at::kFloat);
    t.p.push_back(w.clone().set_requires_grad(true));
    t.p_ref.push_back(w.clone().set_requires_grad(true));
    t.ema.push_back(e.clone());
    t.ema_ref.push_back(e.clone());
  }
  return t;
}

const std::vector<std::vector<int64_t>> kShapes = {{1}, {7}, {5, 3}, {33, 17}, {2, 3, 5}};

// Several steps with clipping on and off, warm-up and weight decay: the same
// numbers as the separate pieces the trainer calls.
void expect_matches_pieces(double grad_clip, double grad_gain) {
  auto gen = gen_for(11);
  Twin t = make_twin(kShapes, gen);
  DeviceOptimizerOptions o;
  o.lr = 3e-2, o.warmup_steps = 3, o.beta1 = 0.9, o.beta2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.1;
  o.grad_clip = grad_clip, o.ema_decay = 0.99, o.ema_warmup = true;
  DeviceOptimizer opt(t.named(t.p), t.ema, o);
  AdamW ref(t.named(t.p_ref), {o.beta1, o.beta2, o.eps, o.weight_decay});
  for (int step = 1; step <= 6; ++step) {
    for (size_t i = 0; i < t.p.size(); ++i) {
      auto g = grad_gain * at::randn(t.p[i].sizes(), gen, at::kFloat);
      t.p[i].mutable_grad() = g.clone();
      t.p_ref[i].mutable_grad() = g.clone();
    }
    at::Tensor norm = grad_clip > 0 ? clip_grad_norm_(t.p_ref, grad_clip) : global_grad_norm(t.p_ref);
    const double lr = lr_at(step, o.lr, o.warmup_steps);
    ref.step(lr);
    ema_update_(t.ema_ref, t.p_ref, ema_decay_at(step - 1, o.ema_decay, o.ema_warmup));
    opt.step();

    // Norm: fp32 sums in a different order; 1e-6 relative.
    EXPECT_NEAR(value(opt.grad_norm()), norm.item<double>(), 1e-6 * norm.item<double>()) << "step " << step;
    EXPECT_FLOAT_EQ(value(opt.lr()), static_cast<float>(lr)) << "step " << step;
    EXPECT_EQ(value(opt.steps_taken()), step);
    for (size_t i = 0; i < t.p.size(); ++i) {
      EXPECT_FALSE(t.p[i].grad().defined()) << "step() leaves gradients unset";
      // fp32 on both sides, different operation order: 1e-6 relative + 1e-7 absolute (values are O(0.1..1)).
      EXPECT_TRUE(close(t.p[i], t.p_ref[i], 1e-6, 1e-7)) << t.names[i] << " step " << step;
      EXPECT_TRUE(close(t.ema[i], t.ema_ref[i], 1e-6, 1e-7)) << t.names[i] << " step " << step;
      const auto s = opt.state(), r = ref.state();
      EXPECT_TRUE(close(s[3 * i].second, r[3 * i].second, 1e-6, 1e-7)) << "exp_avg " << t.names[i];
      EXPECT_TRUE(close(s[3 * i + 1].second, r[3 * i + 1].second, 1e-6, 1e-9)) << "exp_avg_sq " << t.names[i];
    }
  }
}

TEST(DeviceOptimizer, MatchesClipAdamWAndEmaWhenClipping) { expect_matches_pieces(1.0, 5.0); }
TEST(DeviceOptimizer, MatchesAdamWAndEmaWithoutClipping) { expect_matches_pieces(0.0, 1.0); }
TEST(DeviceOptimizer, ClipAboveTheNormChangesNothing) { expect_matches_pieces(1e6, 1.0); }

TEST(DeviceOptimizer, WithoutEmaWarmupTheDecayIsConstant) {
  auto gen = gen_for(12);
  Twin t = make_twin({{4, 4}}, gen);
  DeviceOptimizerOptions o;
  o.lr = 0;  // the weights stand still, so the EMA moves by exactly (1 - d) of the gap
  o.ema_decay = 0.9, o.ema_warmup = false;
  DeviceOptimizer opt(t.named(t.p), t.ema, o);
  auto expect = 0.9 * t.ema[0] + 0.1 * t.p[0].detach();
  t.p[0].mutable_grad() = at::randn({4, 4}, gen, at::kFloat);
  opt.step();
  EXPECT_TRUE(close(t.ema[0], expect, 1e-6, 1e-7));
}

TEST(DeviceOptimizer, ParameterWithoutGradientStandsStillButItsEmaFollows) {
  auto gen = gen_for(13);
  Twin t = make_twin({{3, 3}, {5}}, gen);
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.ema_decay = 0.5, o.ema_warmup = false;
  DeviceOptimizer opt(t.named(t.p), t.ema, o);
  auto p1 = t.p[1].detach().clone();
  auto e1 = t.ema[1].clone();
  t.p[0].mutable_grad() = at::randn({3, 3}, gen, at::kFloat);
  opt.step();
  EXPECT_TRUE(t.p[1].detach().equal(p1));
  EXPECT_TRUE(close(t.ema[1], 0.5 * e1 + 0.5 * p1, 1e-6, 1e-7));
  EXPECT_TRUE(opt.state()[3].second.abs().sum().item<float>() == 0) << "no moments for the idle parameter";
  EXPECT_GT((t.p[0].detach() - t.ema[0]).abs().sum().item<float>(), 0);
}

TEST(DeviceOptimizer, DynamicLossScaleSkipsInfAndNanStepsAndGrows) {
  auto gen = gen_for(14);
  Twin t = make_twin({{6, 5}, {7}}, gen);
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.weight_decay = 0.05, o.ema_decay = 0.9;
  DeviceOptimizerOptions d = o;
  d.dynamic_loss_scale = true, d.initial_loss_scale = 1024, d.growth_interval = 3;
  DeviceOptimizer scaled(t.named(t.p), t.ema, d);
  DeviceOptimizer plain(t.named(t.p_ref), t.ema_ref, o);
  EXPECT_EQ(value(plain.loss_scale()), 1.f);

  auto finite_step = [&](int step) {
    const float scale = value(scaled.loss_scale());
    for (size_t i = 0; i < t.p.size(); ++i) {
      auto g = at::randn(t.p[i].sizes(), gen, at::kFloat);
      t.p[i].mutable_grad() = g * scale;  // what backward of (loss * scale) gives
      t.p_ref[i].mutable_grad() = g.clone();
    }
    scaled.step();
    plain.step();
    EXPECT_NEAR(value(scaled.grad_norm()), value(plain.grad_norm()), 1e-6 * value(plain.grad_norm()));
    for (size_t i = 0; i < t.p.size(); ++i) {
      // Scaling by a power of two is exact, so the updates agree to rounding: 1e-6 relative.
      EXPECT_TRUE(close(t.p[i], t.p_ref[i], 1e-6, 1e-7)) << "step " << step;
      EXPECT_TRUE(close(t.ema[i], t.ema_ref[i], 1e-6, 1e-7)) << "step " << step;
    }
  };
  auto bad_step = [&](float poison) {
    std::vector<at::Tensor> before;
    for (size_t i = 0; i < t.p.size(); ++i) before.push_back(t.p[i].detach().clone());
    for (auto& [name, s] : scaled.state()) before.push_back(s.clone());
    for (auto& e : t.ema) before.push_back(e.clone());
    for (size_t i = 0; i < t.p.size(); ++i) t.p[i].mutable_grad() = at::randn(t.p[i].sizes(), gen, at::kFloat);
    t.p[1].mutable_grad().select(0, 3).fill_(poison);
    const float scale = value(scaled.loss_scale());
    scaled.step();
    EXPECT_FALSE(t.p[0].grad().defined());
    EXPECT_EQ(value(scaled.loss_scale()), scale / 2);
    std::vector<at::Tensor> after;
    for (size_t i = 0; i < t.p.size(); ++i) after.push_back(t.p[i].detach());
    auto st = scaled.state();
    for (size_t k = 0; k + 1 < st.size(); ++k) after.push_back(st[k].second);  // all but loss_scale
    after.push_back(st.back().second.clone().fill_(scale));                    // its old value, checked above
    for (auto& e : t.ema) after.push_back(e);
    ASSERT_EQ(before.size(), after.size());
    for (size_t k = 0; k < before.size(); ++k) EXPECT_TRUE(before[k].equal(after[k])) << "tensor " << k << " moved";
  };

  finite_step(1);
  EXPECT_EQ(value(scaled.loss_scale()), 1024.f);
  bad_step(std::numeric_limits<float>::infinity());
  EXPECT_EQ(value(scaled.skipped()), 1.f);
  EXPECT_EQ(value(scaled.steps_taken()), 1.f) << "a skipped step does not count";
  EXPECT_TRUE(std::isinf(value(scaled.grad_norm())));
  finite_step(2);
  finite_step(3);
  EXPECT_EQ(value(scaled.loss_scale()), 512.f) << "two good steps since the skip: no growth yet";
  finite_step(4);
  EXPECT_EQ(value(scaled.loss_scale()), 1024.f) << "growth after growth_interval = 3 good steps";
  bad_step(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(value(scaled.skipped()), 2.f);
  EXPECT_EQ(value(scaled.steps_taken()), 4.f);
  EXPECT_EQ(value(plain.skipped()), 0.f);
}

TEST(DeviceOptimizer, StateHasAdamWNamesAndRoundTrips) {
  auto gen = gen_for(15);
  Twin t = make_twin({{4, 2}, {9}}, gen);
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.dynamic_loss_scale = true, o.initial_loss_scale = 256, o.growth_interval = 1;
  DeviceOptimizer a(t.named(t.p), t.ema, o);
  for (int s = 0; s < 2; ++s) {
    for (auto& p : t.p) p.mutable_grad() = at::randn(p.sizes(), gen, at::kFloat);
    a.step();
  }
  EXPECT_EQ(value(a.loss_scale()), 1024.f);  // grew after each good step
  AdamW adamw(t.named(t.p_ref), {});
  auto sa = a.state(), sw = adamw.state();
  ASSERT_EQ(sa.size(), sw.size() + 1);
  for (size_t i = 0; i < sw.size(); ++i) {
    EXPECT_EQ(sa[i].first, sw[i].first);
    EXPECT_EQ(sa[i].second.sizes(), sw[i].second.sizes()) << sa[i].first;
    EXPECT_EQ(sa[i].second.scalar_type(), sw[i].second.scalar_type()) << sa[i].first;
  }
  EXPECT_EQ(sa.back().first, "loss_scale");

  // Restore into a fresh optimizer on a copy of the weights: the next steps agree exactly.
  std::vector<at::Tensor> p2, e2;
  for (auto& p : t.p) p2.push_back(p.detach().clone().set_requires_grad(true));
  for (auto& e : t.ema) e2.push_back(e.clone());
  DeviceOptimizer b(t.named(p2), e2, o);
  b.load_state(a.state());
  EXPECT_EQ(value(b.steps_taken()), 2.f);
  EXPECT_EQ(value(b.loss_scale()), 1024.f);
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0; i < p2.size(); ++i) {
      auto g = at::randn(p2[i].sizes(), gen, at::kFloat);
      t.p[i].mutable_grad() = g.clone();
      p2[i].mutable_grad() = g.clone();
    }
    a.step();
    b.step();
  }
  for (size_t i = 0; i < p2.size(); ++i) {
    EXPECT_TRUE(t.p[i].detach().equal(p2[i].detach()));
    EXPECT_TRUE(t.ema[i].equal(e2[i]));
  }
  sa = a.state();
  auto sb = b.state();
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(sa[i].second.equal(sb[i].second)) << sa[i].first;

  // AdamW's own state (no "loss_scale") loads too; a missing tensor is named.
  DeviceOptimizer c(t.named(p2), e2, o);
  c.load_state(adamw.state());
  EXPECT_EQ(value(c.loss_scale()), 256.f) << "no loss_scale in the state: keep the initial one";
  auto msg = perftrain::testing::error_of<RuntimeError>([&] { c.load_state({}); });
  EXPECT_NE(msg.find("exp_avg.layer0.weight"), std::string::npos) << msg;
  auto wrong = adamw.state();
  wrong[0].second = at::randn({3}, gen, at::kFloat);
  msg = perftrain::testing::error_of<RuntimeError>([&] { c.load_state(wrong); });
  EXPECT_NE(msg.find("wrong shape"), std::string::npos) << msg;
}

// Without the norm (the benchmark's step): the same update, the norm reads NaN;
// clipping and the fp16 loss scale refuse to run without it.
TEST(DeviceOptimizer, WithoutTheNormTheUpdateIsTheSame) {
  auto gen = gen_for(17);
  Twin t = make_twin(kShapes, gen);
  DeviceOptimizerOptions o;
  o.lr = 3e-2, o.weight_decay = 0.1, o.ema_decay = 0.99;
  DeviceOptimizer with_norm(t.named(t.p_ref), t.ema_ref, o);
  o.grad_norm = false;
  DeviceOptimizer without(t.named(t.p), t.ema, o);
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < t.p.size(); ++i) {
      auto g = at::randn(t.p[i].sizes(), gen, at::kFloat);
      t.p[i].mutable_grad() = g.clone();
      t.p_ref[i].mutable_grad() = g.clone();
    }
    with_norm.step();
    without.step();
    EXPECT_TRUE(std::isnan(value(without.grad_norm()))) << "step " << step;
    EXPECT_GT(value(with_norm.grad_norm()), 0.f);
    EXPECT_EQ(value(without.steps_taken()), step);
    for (size_t i = 0; i < t.p.size(); ++i) {
      EXPECT_TRUE(at::equal(t.p[i], t.p_ref[i])) << t.names[i] << " step " << step;
      EXPECT_TRUE(at::equal(t.ema[i], t.ema_ref[i])) << t.names[i] << " step " << step;
    }
  }
  for (const bool fp16 : {false, true}) {
    DeviceOptimizerOptions bad;
    bad.grad_norm = false;
    if (fp16) bad.dynamic_loss_scale = true; else bad.grad_clip = 1.0;
    const auto msg =
        perftrain::testing::error_of<UsageError>([&] { DeviceOptimizer({{"w", t.p[0]}}, {}, bad); });
    EXPECT_NE(msg.find("gradient norm"), std::string::npos) << msg;
  }
}

TEST(DeviceOptimizer, RejectsBadInputsWithClearErrors) {
  auto gen = gen_for(16);
  auto p = at::randn({4}, gen, at::kFloat).set_requires_grad(true);
  auto d = at::randn({4}, gen, at::kDouble).set_requires_grad(true);
  auto e = at::randn({4}, gen, at::kFloat);
  auto msg = perftrain::testing::error_of<UsageError>([&] { DeviceOptimizer({{"w", d}}, {}, {}); });
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
  msg = perftrain::testing::error_of<UsageError>([&] { DeviceOptimizer({{"w", p}}, {e, e}, {}); });
  EXPECT_NE(msg.find("EMA"), std::string::npos) << msg;
  msg = perftrain::testing::error_of<UsageError>([&] { DeviceOptimizer({{"w", p}}, {at::randn({5}, gen)}, {}); });
  EXPECT_NE(msg.find("sizes"), std::string::npos) << msg;
  DeviceOptimizerOptions bad;
  bad.beta2 = 1.0;
  msg = perftrain::testing::error_of<UsageError>([&] { DeviceOptimizer({{"w", p}}, {e}, bad); });
  EXPECT_NE(msg.find("beta"), std::string::npos) << msg;

  DeviceOptimizer opt({{"w", p}}, {e}, {});
  p.mutable_grad() = at::randn({2, 2}, gen, at::kFloat);
  msg = perftrain::testing::error_of<UsageError>([&] { opt.step(); });
  EXPECT_NE(msg.find("gradient of parameter 'w'"), std::string::npos) << msg;
  p.mutable_grad() = at::randn({8}, gen, at::kFloat).slice(0, 0, 8, 2);
  msg = perftrain::testing::error_of<UsageError>([&] { opt.step(); });
  EXPECT_NE(msg.find("contiguous"), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::train
