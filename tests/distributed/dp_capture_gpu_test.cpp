// Data parallel on CUDA through NCCL, with the one rank one GPU allows:
// (a) the step runner with a group of one rank captures its whole step, the
// bucketed all-reduce included, and trains like the runner without a group
// (the mean over one rank is the identity); (b) the overlapped buckets
// captured in a CUDA graph with a backward, replayed on new inputs, give the
// gradients an eager backward gives, and buckets left during the captured
// backward. Each test prints its largest differences. Skips without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "distributed/grad_buckets.h"
#include "distributed/group.h"
#include "distributed/launch_env.h"
#include "models/dit.h"
#include "support/step_runs.h"
#include "support/tensor_checks.h"
#include "train/step_runner.h"

namespace perftrain {
namespace {

std::unique_ptr<distributed::Group> nccl_one_rank(double bucket_mb) {
  distributed::LaunchEnv env;
  env.world_size = 1, env.master_addr = "127.0.0.1", env.from_env = true;
  env.master_port = distributed::free_loopback_port("test");
  distributed::GroupOptions o;
  o.timeout_s = 60;
  o.bucket_mb = bucket_mb;
  return std::make_unique<distributed::Group>(env, at::Device(at::kCUDA, 0), o);
}

train::TrainConfig tiny() {
  train::TrainConfig c = train::default_config(true);
  for (const char* o : {"model.depth=2", "model.hidden=128", "model.heads=2", "model.patch=2", "model.image_size=8",
                        "model.in_channels=4", "model.num_classes=5", "train.batch_size=16", "train.lr=1e-3",
                        "train.grad_clip=1.0", "train.warmup_steps=3"})
    train::apply_override(c, o);
  c.model.learn_sigma = true;
  c.diffusion.objective = "ddpm";
  c.distributed.bucket_mb = 0.05;  // ~50 KB: several buckets in this small model
  return c;
}

using perftrain::testing::Trained;

Trained train_steps(const train::TrainConfig& c, const std::vector<data::Batch>& data, distributed::Group* group) {
  const at::Device cuda(at::kCUDA, 0);
  models::DiT model(c.model, 7), ema(c.model, 7);
  model.transform([&](const std::string&, const at::Tensor& t) { return t.to(cuda); });
  ema.transform([&](const std::string&, const at::Tensor& t) { return t.to(cuda); });
  for (auto& p : ema.parameters()) p.set_requires_grad(false);
  {  // adaLN-Zero's zero layers get random weights, so that every path carries signal
    at::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    for (auto& p : model.parameters())
      if (p.abs().max().item<double>() == 0) p.copy_(at::randn(p.sizes(), gen) * 0.05);
    for (size_t i = 0; i < model.parameters().size(); ++i) ema.parameters()[i].copy_(model.parameters()[i]);
  }
  at::Generator gen = at::globalContext().defaultGenerator(cuda).clone();
  gen.set_current_seed(3);
  train::StepOptions o;
  o.group = group;
  train::StepRunner r(model, &ema, c, o, cuda, gen);
  return perftrain::testing::run_steps(r, data, model, ema);
}

// (a) A group of one rank on CUDA: the step is captured, all-reduce
// included, and trains like no group, eager and captured.
TEST(DistGpu, OneRankGroupStepIsCapturedAndTrainsLikeNoGroup) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  train::TrainConfig c = tiny();
  std::vector<data::Batch> data;
  for (int i = 0; i < 8; ++i) {
    data::Batch b;
    b.x = at::randn({c.optim.batch_size, c.model.in_channels, c.model.image_size, c.model.image_size}).pin_memory();
    b.y = at::randint(c.model.num_classes, {c.optim.batch_size}, at::kLong).pin_memory();
    data.push_back(b);
  }
  auto group = nccl_one_rank(c.distributed.bucket_mb);
  for (bool graph : {false, true}) {
    const std::string mode = graph ? "graph" : "eager";
    c.speed.graph = graph;
    const Trained alone = train_steps(c, data, nullptr);
    const Trained grouped = train_steps(c, data, group.get());
    std::printf("%s: without group: %s; with group: %s; weight-grad stream %d\n", mode.c_str(),
                alone.graph_status.c_str(), grouped.graph_status.c_str(), grouped.weight_grad_stream ? 1 : 0);
    std::printf("%s: %s\n", mode.c_str(), grouped.data_parallel_note.c_str());
    EXPECT_NE(grouped.data_parallel_note.find("each sent as soon as backward has filled it"), std::string::npos)
        << grouped.data_parallel_note;
    if (graph) {
      EXPECT_EQ(grouped.graph_status.rfind("captured at step", 0), 0u) << grouped.graph_status;
    } else {
      EXPECT_EQ(grouped.graph_status.rfind("eager", 0), 0u) << grouped.graph_status;
    }
    double loss_diff = 0, weight_rel = 0;
    bool exact = true;
    for (size_t i = 0; i < alone.losses.size(); ++i) {
      loss_diff = std::max(loss_diff, std::abs(grouped.losses[i] - alone.losses[i]) / std::abs(alone.losses[i]));
      EXPECT_NEAR(grouped.losses[i], alone.losses[i], 1e-6 * std::abs(alone.losses[i]) + 1e-7)
          << mode << ", step " << i + 1;
    }
    for (size_t i = 0; i < alone.weights.size(); ++i) {
      weight_rel = std::max(weight_rel, perftrain::testing::rel_l2(grouped.weights[i], alone.weights[i]));
      exact = exact && grouped.weights[i].equal(alone.weights[i]);
      EXPECT_LT(perftrain::testing::rel_l2(grouped.weights[i], alone.weights[i]), 1e-5) << mode << ", tensor " << i;
    }
    std::printf("%s: one-rank group vs none after %zu steps: max rel loss diff %.3g, max rel weight diff %.3g, "
                "bit-exact weights %s\n",
                mode.c_str(), data.size(), loss_diff, weight_rel, exact ? "yes" : "no");
  }
}

// (b) The overlapped buckets in a captured backward, replayed, equal eager.
TEST(DistGpu, CapturedBucketsReplayLikeEager) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  const at::Device cuda(at::kCUDA, 0);
  const auto f32 = at::TensorOptions().device(cuda);
  const int width = 256, layers = 6;
  std::vector<at::Tensor> params;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (int l = 0; l < layers; ++l) {
    params.push_back((at::randn({width, width}, gen) / 16).to(cuda).requires_grad_(true));
    params.push_back((at::randn({width}, gen) / 4).to(cuda).requires_grad_(true));
  }
  auto loss_of = [&](const at::Tensor& x) {
    at::Tensor h = x;
    for (int l = 0; l < layers; ++l) h = at::tanh(at::matmul(h, params[2 * l]) + params[2 * l + 1]);
    return (h * h).mean();
  };
  auto clear = [&] {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
  };
  auto group = nccl_one_rank(0.3);
  distributed::GradBucketOptions bo;
  bo.bucket_mb = 0.3;  // one layer per bucket (256 KB + 1 KB)
  distributed::GradBuckets buckets(*group, params, bo);
  ASSERT_GE(buckets.buckets().size(), 5u);

  at::Tensor x_static = at::randn({64, width}, f32);
  auto side = c10::cuda::getStreamFromPool(false, 0);
  auto main = at::cuda::getCurrentCUDAStream(0);
  at::cuda::CUDAEvent fork;
  fork.record(main);
  fork.block(side);
  at::cuda::CUDAGraph graph;
  std::vector<at::Tensor> captured;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    for (int warm = 0; warm < 3; ++warm) {  // eager: the first observes, then overlapped
      clear();
      buckets.begin();
      loss_of(x_static).backward();
      buckets.finish();
    }
    clear();
    graph.capture_begin();  // the global mode, as the step runner's
    buckets.begin();
    loss_of(x_static).backward();
    buckets.finish();
    graph.capture_end();
    for (auto& p : params) captured.push_back(p.grad());
  }
  at::cuda::CUDAEvent join;
  join.record(side);
  join.block(main);
  const int64_t early = buckets.sent_during_backward();
  std::printf("captured backward: %ld of %zu buckets sent during it\n", static_cast<long>(early),
              buckets.buckets().size());
  EXPECT_GT(early, 0);
  double max_diff = 0;
  for (int round = 0; round < 3; ++round) {
    const at::Tensor x = at::randn({64, width}, f32);
    clear();
    loss_of(x).backward();  // eager, hooks not armed
    std::vector<at::Tensor> want;
    for (auto& p : params) want.push_back(p.grad().clone());
    x_static.copy_(x);
    graph.replay();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(captured[i].defined()) << i;
      const double d = (captured[i] - want[i]).abs().max().item<double>();
      const double scale = want[i].abs().max().item<double>();
      EXPECT_GT(scale, 0) << "param " << i;
      max_diff = std::max(max_diff, d / scale);
      EXPECT_LT(d, 1e-5 * scale + 1e-9) << "round " << round << ", param " << i;
    }
  }
  std::printf("captured buckets replayed vs eager: max |diff| / max |grad| %.3g\n", max_diff);
}

}  // namespace
}  // namespace perftrain
