// The step runner on the CPU: eager, says why, trains, and refuses the
// GPU-only precisions with a clear message.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include "base/error.h"
#include "models/dit.h"
#include "support/test_support.h"
#include "train/step_runner.h"

namespace perftrain::train {
namespace {

TrainConfig tiny_cpu() {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.depth=1", "model.hidden=32", "model.heads=2", "model.patch=2", "model.image_size=4",
                        "model.in_channels=1", "model.num_classes=3", "train.batch_size=8", "train.lr=1e-2"})
    apply_override(c, o);
  return c;
}

TEST(StepRunner, RunsEagerlyOnTheCpuAndSaysWhy) {
  TrainConfig c = tiny_cpu();
  auto built = models::build_model_and_ema(c.model, 1, at::Device(at::kCPU));
  models::DiT &model = *built.model, &ema = *built.ema;
  StepOptions o;
  o.precision = "fp32";
  StepRunner r(model, &ema, c, o, at::Device(at::kCPU), at::make_generator<at::CPUGeneratorImpl>(5));
  EXPECT_EQ(r.graph_status(), "eager: CPU device");
  data::Batch b{at::randn({8, 1, 4, 4}), at::randint(3, {8}, at::kLong)};
  for (int i = 0; i < 20; ++i) r.step(b);
  EXPECT_FALSE(r.graph_active());
  EXPECT_EQ(r.steps_done(), 20);
  WindowStats w = r.take_window();
  EXPECT_EQ(w.steps, 20);
  EXPECT_TRUE(std::isfinite(w.loss));
  EXPECT_GT(w.loss, 0);
  EXPECT_EQ(r.take_window().steps, 0);
  EXPECT_FALSE(r.optimizer_state().empty());
}

// Without an EMA model (the bench's step): it trains all the same.
TEST(StepRunner, TrainsWithoutAnEma) {
  TrainConfig c = tiny_cpu();
  auto model = models::build_model(c.model, 1, at::Device(at::kCPU));
  const at::Tensor before = model->parameters().front().detach().clone();
  StepOptions o;
  o.precision = "fp32";
  StepRunner r(*model, nullptr, c, o, at::Device(at::kCPU), at::make_generator<at::CPUGeneratorImpl>(5));
  data::Batch b{at::randn({8, 1, 4, 4}), at::randint(3, {8}, at::kLong)};
  for (int i = 0; i < 3; ++i) r.step(b);
  const WindowStats w = r.take_window();
  EXPECT_EQ(w.steps, 3);
  EXPECT_TRUE(std::isfinite(w.loss));
  EXPECT_FALSE(at::equal(before, model->parameters().front())) << "the weights moved";
}

TEST(StepRunner, RefusesHalfPrecisionOnTheCpu) {
  TrainConfig c = tiny_cpu();
  models::DiT model(c.model, 1), ema(c.model, 1);
  for (const char* p : {"bf16", "fp16"}) {
    StepOptions o;
    o.precision = p;
    auto msg = perftrain::testing::error_of<UsageError>([&] {
      StepRunner r(model, &ema, c, o, at::Device(at::kCPU), at::make_generator<at::CPUGeneratorImpl>(5));
    });
    EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace perftrain::train
