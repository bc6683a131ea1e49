// train.precision = fp8 on the GPU: the captured step trains like the eager
// one (the scaling update inside the graph), fp8 stays near bf16 over a few
// steps, and a model whose widths the fp8 products do not take runs those
// linears in bf16 and says which. Skips without a GPU.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <cmath>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "models/diffusion_model.h"
#include "support/step_runs.h"
#include "support/tensor_checks.h"
#include "train/step_runner.h"

namespace perftrain::train {
namespace {

// 16 tokens of width `hidden`, batch 16: M = 256.
TrainConfig tiny(int64_t hidden) {
  TrainConfig c = default_config(true);
  const std::vector<std::string> keys = {"model.depth=2", "model.hidden=" + std::to_string(hidden),
                                         "model.heads=2", "model.patch=2", "model.image_size=8",
                                         "model.in_channels=4", "model.num_classes=5", "model.learn_sigma=false",
                                         "train.batch_size=16", "train.lr=1e-3", "train.warmup_steps=0",
                                         "speed.gemm_tune=0"};
  for (const std::string& o : keys)
    apply_override(c, o);
  return c;
}

std::vector<data::Batch> batches(const TrainConfig& c, int n) {
  std::vector<data::Batch> out;
  auto gen = at::globalContext().defaultGenerator(at::kCPU);
  for (int i = 0; i < n; ++i) {
    data::Batch b;
    b.x = at::randn({c.optim.batch_size, c.model.in_channels, c.model.image_size, c.model.image_size}).pin_memory();
    b.y = at::randint(c.model.num_classes, {c.optim.batch_size}, at::kLong).pin_memory();
    out.push_back(b);
  }
  return out;
}

struct Fp8Run {
  perftrain::testing::Trained trained;
  std::string fp8_note;
};

Fp8Run train_steps(const TrainConfig& c, const std::string& precision, const std::vector<data::Batch>& data) {
  const at::Device cuda(at::kCUDA, 0);
  auto built = models::build_diffusion_model_and_ema(c.model, 7, cuda);
  at::Generator gen = at::globalContext().defaultGenerator(cuda).clone();
  gen.set_current_seed(3);
  StepOptions o;
  o.precision = precision;
  StepRunner r(*built.model, built.ema.get(), c, o, cuda, gen);
  Fp8Run out{perftrain::testing::run_steps(r, data, *built.model, *built.ema), r.fp8_note()};
  return out;
}

TEST(Fp8TrainGpu, CapturedStepTrainsLikeTheEagerOne) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  TrainConfig c = tiny(128);
  const auto data = batches(c, 8);
  c.speed.graph = false;
  const Fp8Run eager = train_steps(c, "fp8", data);
  c.speed.graph = true;
  const Fp8Run graph = train_steps(c, "fp8", data);
  EXPECT_EQ(graph.trained.graph_status.rfind("captured", 0), 0u) << graph.trained.graph_status;
  EXPECT_EQ(graph.fp8_note, "fp8 products in 8 linears (delayed scaling, amax history 16, margin 0)");
  for (size_t i = 0; i < eager.trained.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(graph.trained.losses[i])) << "step " << i + 1;
    EXPECT_NEAR(graph.trained.losses[i], eager.trained.losses[i], 2e-3 * std::abs(eager.trained.losses[i]) + 1e-5)
        << "step " << i + 1;
  }
  for (size_t i = 0; i < eager.trained.weights.size(); ++i)
    EXPECT_LT(perftrain::testing::rel_l2(graph.trained.weights[i], eager.trained.weights[i]), 1e-3) << "tensor " << i;
}

TEST(Fp8TrainGpu, StaysNearBf16) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const TrainConfig c = tiny(128);
  const auto data = batches(c, 10);
  const Fp8Run bf16 = train_steps(c, "bf16", data), fp8 = train_steps(c, "fp8", data);
  for (size_t i = 0; i < bf16.trained.losses.size(); ++i)
    EXPECT_NEAR(fp8.trained.losses[i], bf16.trained.losses[i], 0.05 * std::abs(bf16.trained.losses[i]))
        << "step " << i + 1;
}

// Width 120: K and N of every block linear are not multiples of 16.
TEST(Fp8TrainGpu, LayersTheProductsDoNotTakeRunBf16AndAreNamed) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const TrainConfig c = tiny(120);
  const Fp8Run r = train_steps(c, "fp8", batches(c, 2));
  EXPECT_NE(r.fp8_note.find("fp8 products in 0 linears"), std::string::npos) << r.fp8_note;
  EXPECT_NE(r.fp8_note.find("8 ran bf16"), std::string::npos) << r.fp8_note;
  EXPECT_NE(r.fp8_note.find("blocks.0.attn.qkv"), std::string::npos) << r.fp8_note;
  for (double l : r.trained.losses) EXPECT_TRUE(std::isfinite(l));
}

}  // namespace
}  // namespace perftrain::train
