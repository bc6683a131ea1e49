// ZeRO-1 (distributed.shard_optimizer) on the GPU: the sharded device optimizer
// (multi-tensor kernel over the owned tensors, the others' gradients in
// norm-only tables, follow_others' EMA and bf16 copies) simulated over 2 and
// 3 ranks against one unsharded optimizer; and the step runner with sharding
// on, through a real NCCL group of one rank (the only group one GPU allows:
// degenerate, but the broadcast, the state gather and the log line run),
// trains as the unsharded runner does, eager and captured in the step's CUDA
// graph. Skips without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "compat/compat.h"
#include "distributed/group.h"
#include "distributed/launch_env.h"
#include "models/dit.h"
#include "train/sharded_optimizer_sim.h"
#include "train/step_runner.h"

namespace perftrain::train {
namespace {

TEST(Zero1Gpu, ShardedDeviceOptimizerKernelEqualsOneOptimizer) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  for (int world : {2, 3}) {
    const auto r = testing::simulate_sharded_device_optimizer(at::Device(at::kCUDA, 0), world, /*shadows=*/true);
    EXPECT_LT(r.max_weight, 1e-5) << world;
    EXPECT_LT(r.max_ema, 1e-5) << world;
    EXPECT_LT(r.max_state, 1e-5) << world;
    EXPECT_LT(r.max_norm_rel, 1e-5) << world;
    EXPECT_TRUE(r.shadows_exact) << world;
    EXPECT_LT(r.state_tensors_sharded, r.state_tensors_whole) << world;
  }
}

TrainConfig tiny() {
  TrainConfig c = default_config(true);
  for (const char* o : {"model.depth=2", "model.hidden=128", "model.heads=2", "model.patch=2", "model.image_size=8",
                        "model.in_channels=4", "model.num_classes=5", "train.batch_size=8", "train.lr=1e-3",
                        "train.grad_clip=0.5", "train.warmup_steps=2", "train.weight_decay=0.01"})
    apply_override(c, o);
  return c;
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<at::Tensor> weights;  // model then EMA
  std::vector<std::pair<std::string, at::Tensor>> state;
  std::string sharding, graph_status;
};

TrainedRun train(const TrainConfig& c, distributed::Group& group, const std::vector<data::Batch>& data) {
  const at::Device cuda(at::kCUDA, 0);
  models::DiT model(c.model, 7), ema(c.model, 7);
  model.transform([&](const std::string&, const at::Tensor& t) { return t.to(cuda); });
  ema.transform([&](const std::string&, const at::Tensor& t) { return t.to(cuda); });
  {
    at::NoGradGuard ng;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    for (auto& [name, p] : model.named_parameters())  // adaLN-Zero's zeros: random, so every path carries signal
      if (p.abs().max().item<double>() == 0) p.copy_(at::randn(p.sizes(), gen) * 0.05);
    for (size_t i = 0; i < model.parameters().size(); ++i) ema.parameters()[i].copy_(model.parameters()[i]);
  }
  for (auto& p : ema.parameters()) p.set_requires_grad(false);
  at::Generator gen = at::globalContext().defaultGenerator(cuda).clone();
  gen.set_current_seed(3);
  StepOptions o;
  o.group = &group;
  StepRunner r(model, &ema, c, o, cuda, gen);
  TrainedRun out;
  for (const auto& b : data) {
    r.step(b);
    out.losses.push_back(r.take_window().loss);
  }
  for (auto& p : model.parameters()) out.weights.push_back(p.detach().cpu());
  for (auto& p : ema.parameters()) out.weights.push_back(p.detach().cpu());
  for (auto& [k, t] : r.optimizer_state()) out.state.emplace_back(k, t.cpu());
  out.sharding = r.optimizer_sharding();
  out.graph_status = r.graph_status();
  return out;
}

TEST(Zero1Gpu, NcclOneRankShardedRunnerTrainsAsUnsharded) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no CUDA GPU";
  distributed::LaunchEnv env;
  env.world_size = 1, env.master_addr = "127.0.0.1", env.from_env = true;
  env.master_port = distributed::free_loopback_port("test");
  distributed::GroupOptions go;
  go.timeout_s = 60;
  go.bucket_mb = 0.01;  // several broadcast buckets, and tensors larger than one
  distributed::Group group(env, at::Device(at::kCUDA, 0), go);
  TrainConfig c = tiny();
  c.distributed.bucket_mb = 0.01;
  std::vector<data::Batch> data;
  for (int i = 0; i < 6; ++i) {
    data::Batch b;
    b.x = at::randn({8, 4, 8, 8});
    b.y = at::randint(5, {8}, at::kLong);
    data.push_back(b);
  }
  for (const bool graph : {false, true}) {
    c.speed.graph = graph;
    c.distributed.shard_optimizer = false;
    const TrainedRun plain = train(c, group, data);
    c.distributed.shard_optimizer = true;
    const TrainedRun sharded = train(c, group, data);
    std::printf("%s: sharding line: %s\nstep: %s (unsharded: %s)\n", graph ? "graph" : "eager",
                sharded.sharding.c_str(), sharded.graph_status.c_str(), plain.graph_status.c_str());
    if (graph) {
      EXPECT_EQ(sharded.graph_status.rfind("captured", 0), 0u) << sharded.graph_status;
      EXPECT_EQ(plain.graph_status.rfind("captured", 0), 0u) << plain.graph_status;
    }
    EXPECT_TRUE(plain.sharding.empty());
    EXPECT_NE(sharded.sharding.find("optimizer state sharded over 1 ranks"), std::string::npos) << sharded.sharding;
    double loss_diff = 0, weight_diff = 0, state_diff = 0;
    ASSERT_EQ(plain.losses.size(), sharded.losses.size());
    for (size_t i = 0; i < plain.losses.size(); ++i)
      loss_diff = std::max(loss_diff, std::abs(plain.losses[i] - sharded.losses[i]));
    for (size_t i = 0; i < plain.weights.size(); ++i)
      weight_diff = std::max(weight_diff, plain.weights[i].sub(sharded.weights[i]).abs().max().item<double>());
    std::map<std::string, at::Tensor> ps(plain.state.begin(), plain.state.end());
    ASSERT_EQ(plain.state.size(), sharded.state.size());
    for (const auto& [k, t] : sharded.state) {
      ASSERT_TRUE(ps.count(k)) << k;
      state_diff = std::max(state_diff, t.sub(ps[k]).abs().max().item<double>());
    }
    std::printf(
        "%s: NCCL one rank, sharded vs unsharded after %zu steps: max |loss diff| %.3g, weights+EMA %.3g, "
        "optimizer state %.3g\n",
        graph ? "graph" : "eager", data.size(), loss_diff, weight_diff, state_diff);
    EXPECT_LT(loss_diff, 1e-5) << graph;
    EXPECT_LT(weight_diff, 1e-5) << graph;
    EXPECT_LT(state_diff, 1e-5) << graph;
  }
}

}  // namespace
}  // namespace perftrain::train
