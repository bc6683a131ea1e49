// The gradient monitor and the NaN locator on a looped model: the shared
// block's gradient (summed over the loops, as its .grad), each loop's adapter
// gradients as their own group, and the loop of the first non-finite value.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "models/looped.h"
#include "observe/grad_health.h"
#include "train/grad_monitor.h"
#include "train/nan_locator.h"

namespace perftrain::train {
namespace {

// Looped-T/2 at 8x8: prelude 1, one shared block x 6 loops, coda 1, LoRA rank 2.
models::DiTConfig small_looped() {
  models::DiTConfig c = models::model_config("Looped-T/2");
  c.image_size = 8;
  c.num_classes = 10;
  c.prelude = 1;
  c.coda = 1;
  c.loops = 6;
  c.lora_rank = 2;
  c.depth = c.looped_depth();
  return c;
}

// A model whose adapters and modulations are not zero, so that every
// parameter gets a gradient.
std::unique_ptr<models::LoopedDiT> random_looped(const models::DiTConfig& cfg) {
  auto m = std::make_unique<models::LoopedDiT>(cfg, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  m->transform([&](const std::string& name, const at::Tensor& t) {
    return name == "pos_embed" ? t : at::randn(t.sizes(), gen) * 0.05;
  });
  return m;
}

at::Tensor loss_of(const models::LoopedDiT& m) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto& cfg = m.config();
  const at::Tensor x = at::randn({2, cfg.in_channels, cfg.image_size, cfg.image_size}, gen);
  models::Condition cond;
  cond.labels = at::randint(cfg.num_classes, {2}, gen, at::kLong);
  return m.forward(x, at::rand({2}, gen) * 999, cond).pow(2).mean();
}

double grad_norm_of(const models::LoopedDiT& m, const std::string& prefix) {
  double sq = 0;
  for (const auto& [name, p] : m.named_parameters())
    if (name.rfind(prefix, 0) == 0 && p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  return std::sqrt(sq);
}

TEST(LoopedHealth, MonitorReportsTheSharedBlockAndEachLoopsAdapters) {
  const auto m = random_looped(small_looped());
  loss_of(*m).backward();
  GradMonitor monitor(m->named_parameters());
  monitor.before_update();
  monitor.after_update();
  monitor.queue_readback(7);
  const auto samples = monitor.take_ready(/*wait=*/true);
  ASSERT_EQ(samples.size(), 1u);
  const observe::GradHealthSample& s = samples[0];
  ASSERT_EQ(s.loops.size(), 6u) << "one adapter group per loop, no routers";
  for (int64_t l = 0; l < 6; ++l) {
    const auto& g = s.loops[static_cast<size_t>(l)];
    EXPECT_EQ(g.name, "loop" + std::to_string(l) + "/adapters");
    const double want = grad_norm_of(*m, "adapters." + std::to_string(l) + ".");
    EXPECT_GT(want, 0);
    EXPECT_NEAR(g.stats.norm, want, 1e-4 * want) << g.name;
  }
  bool shared = false;
  for (const auto& mod : s.modules)
    if (mod.name == "shared.0") {
      shared = true;
      const double want = grad_norm_of(*m, "shared.0.");  // the .grad: every loop's contribution summed
      EXPECT_NEAR(mod.stats.norm, want, 1e-4 * want);
    }
  EXPECT_TRUE(shared);
}

TEST(LoopedHealth, LoopOfAParameterName) {
  EXPECT_EQ(observe::loop_of_parameter("adapters.5.0.attn.qkv.lora_A"), 5);
  EXPECT_EQ(observe::loop_of_parameter("routers.12.weight"), 12);
  EXPECT_EQ(observe::loop_of_parameter("shared.0.attn.qkv.weight"), -1);
  EXPECT_EQ(observe::loop_of_parameter("adapters"), -1);
}

TEST(LoopedHealth, LocatorNamesTheLoopOfANonFiniteAdapter) {
  const auto m = random_looped(small_looped());
  {
    at::NoGradGuard no_grad;
    m->named_parameters();
    for (auto& [name, p] : m->named_parameters())
      if (name == "adapters.4.0.attn.qkv.lora_B") p.fill_(NAN);
  }
  const NonFiniteSite site = locate_nonfinite(*m, [&] { return loss_of(*m); });
  ASSERT_TRUE(site.found);
  EXPECT_EQ(site.phase, "weights");
  EXPECT_EQ(site.loop, 4);
  EXPECT_NE(site.message().find("adapters.4.0.attn.qkv.lora_B at loop 4"), std::string::npos) << site.message();
}

// Finite adapters whose product overflows float32: the merged weight of
// loop 3 is infinite, and the shared block's output at that loop is the
// first non-finite value a module makes from finite inputs.
TEST(LoopedHealth, LocatorNamesTheLoopWhereTheSharedBlockWentNonFinite) {
  const auto m = random_looped(small_looped());
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : m->named_parameters())
      if (name == "adapters.3.0.mlp.fc1.lora_A" || name == "adapters.3.0.mlp.fc1.lora_B") p.fill_(1e25);
  }
  const NonFiniteSite site = locate_nonfinite(*m, [&] { return loss_of(*m); });
  ASSERT_TRUE(site.found);
  EXPECT_EQ(site.phase, "forward");
  EXPECT_EQ(site.module, "shared.0");
  EXPECT_EQ(site.loop, 3);
  EXPECT_EQ(site.calls, 6);
  EXPECT_NE(site.message().find("shared.0 at loop 3"), std::string::npos) << site.message();
}

}  // namespace
}  // namespace perftrain::train
