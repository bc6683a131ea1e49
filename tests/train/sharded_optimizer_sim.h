// ZeRO-1 inside one process: `world` DeviceOptimizers, each owning the
// parameters shard_owners gives its rank, on its own copy of the weights,
// against one unsharded DeviceOptimizer on the same gradients. Between steps
// the owners' weights are copied to the other copies (what
// OptimizerShards::broadcast_weights does between processes) and
// follow_others() runs. Clipping is active (so every rank's norm must count
// the gradients it does not own), and one step carries an inf in a gradient
// only rank 1 owns (so rank 0 must skip that step from a norm-only gradient).
// Shared by the CPU test (the optimizer's ATen path) and the GPU test (the
// multi-tensor kernel with its norm-only tables and bf16 copies).
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/randn.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "train/device_optimizer.h"
#include "train/sharded_optimizer.h"

namespace perftrain::train::testing {

struct ShardSimResult {
  double max_weight = 0, max_ema = 0, max_state = 0, max_norm_rel = 0;
  bool shadows_exact = true;
  size_t state_tensors_sharded = 0, state_tensors_whole = 0;
};

inline double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return a.to(at::kCPU).sub(b.to(at::kCPU)).abs().max().item<double>();
}

inline ShardSimResult simulate_sharded_device_optimizer(at::Device device, int world, bool shadows) {
  const std::vector<std::vector<int64_t>> shapes = {{64, 32}, {32}, {17, 5}, {70000}, {8, 8, 3}, {1}, {40, 40}, {5}};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::vector<std::string> names;
  std::vector<at::Tensor> w0, e0;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < shapes.size(); ++i) {
    names.push_back("p" + std::to_string(i));
    w0.push_back(at::randn(shapes[i], gen, f32));
    e0.push_back(w0.back() + 0.1 * at::randn(shapes[i], gen, f32));
    numels.push_back(w0.back().numel());
  }
  const std::vector<int> owner = shard_owners(numels, world);
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.warmup_steps = 2, o.weight_decay = 0.05, o.grad_clip = 0.5;
  o.ema_decay = 0.9, o.ema_warmup = true, o.skip_nonfinite = true, o.bf16_shadows = shadows;
  struct Copy {
    std::vector<at::Tensor> p, ema;
    std::unique_ptr<DeviceOptimizer> opt;
  };
  auto make = [&](std::vector<bool> owned) {
    Copy c;
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (size_t i = 0; i < shapes.size(); ++i) {
      c.p.push_back(w0[i].to(device).clone().set_requires_grad(true));
      c.ema.push_back(e0[i].to(device).clone());
      named.emplace_back(names[i], c.p.back());
    }
    c.opt = std::make_unique<DeviceOptimizer>(named, c.ema, o, std::move(owned));
    return c;
  };
  Copy whole = make({});
  std::vector<Copy> ranks;
  for (int r = 0; r < world; ++r) {
    std::vector<bool> owned;
    for (const int w : owner) owned.push_back(w == r);
    ranks.push_back(make(owned));
  }
  // The parameter with the inf: one rank 1 owns (rank 0 does not).
  size_t inf_param = 0;
  while (inf_param < owner.size() && owner[inf_param] != 1) ++inf_param;
  EXPECT_LT(inf_param, owner.size()) << "rank 1 owns nothing";
  ShardSimResult res;
  for (int step = 0; step < 6; ++step) {
    std::vector<at::Tensor> g;
    for (const auto& s : shapes) g.push_back(at::randn(s, gen, f32) * (0.2 + step));
    if (step == 3) g[inf_param].view({-1})[0] = std::numeric_limits<float>::infinity();
    auto set_grads = [&](Copy& c) {
      for (size_t i = 0; i < g.size(); ++i) c.p[i].mutable_grad() = g[i].to(device).clone();
    };
    set_grads(whole);
    whole.opt->step();
    for (auto& c : ranks) set_grads(c), c.opt->step();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < owner.size(); ++i)
      for (int r = 0; r < world; ++r)
        if (r != owner[i]) ranks[r].p[i].copy_(ranks[owner[i]].p[i]);
    for (auto& c : ranks) c.opt->follow_others();
    const double n = whole.opt->grad_norm().item<double>();
    for (auto& c : ranks) {
      const double m = c.opt->grad_norm().item<double>();
      if (std::isfinite(n) || std::isfinite(m))
        res.max_norm_rel = std::max(res.max_norm_rel, std::abs(m - n) / n);
      EXPECT_EQ(c.opt->skipped().item<float>(), whole.opt->skipped().item<float>()) << "step " << step;
      EXPECT_EQ(c.opt->steps_taken().item<float>(), whole.opt->steps_taken().item<float>()) << "step " << step;
    }
  }
  EXPECT_EQ(whole.opt->skipped().item<float>(), 1.f);
  std::map<std::string, at::Tensor> ref;
  for (const auto& [k, t] : whole.opt->state()) ref[k] = t;
  res.state_tensors_whole = whole.opt->state().size();
  for (int r = 0; r < world; ++r) {
    const Copy& c = ranks[r];
    for (size_t i = 0; i < shapes.size(); ++i) {
      res.max_weight = std::max(res.max_weight, max_abs(c.p[i], whole.p[i]));
      res.max_ema = std::max(res.max_ema, max_abs(c.ema[i], whole.ema[i]));
      if (shadows) {
        const at::Tensor copy = c.opt->compute_weights().find(c.p[i], at::kBFloat16);
        if (!copy.defined() || !copy.to(at::kCPU).equal(c.p[i].detach().to(at::kBFloat16).to(at::kCPU)))
          res.shadows_exact = false;
      }
    }
    const auto state = c.opt->state();
    res.state_tensors_sharded = std::max(res.state_tensors_sharded, state.size());
    for (const auto& [k, t] : state) {
      EXPECT_TRUE(ref.count(k)) << k;
      if (ref.count(k)) res.max_state = std::max(res.max_state, max_abs(t, ref[k]));
    }
  }
  // Re-sliced on load: a fresh rank-0 optimizer of another world size takes its part of the whole state.
  {
    std::vector<bool> owned;
    for (const int w : shard_owners(numels, world + 1)) owned.push_back(w == 0);
    Copy fresh = make(owned);
    fresh.opt->load_state(whole.opt->state());
    for (const auto& [k, t] : fresh.opt->state()) EXPECT_EQ(max_abs(t, ref.at(k)), 0.0) << k;
  }
  std::printf("ZeRO-1 simulated over %d ranks on %s: max |weight diff| %.3g, EMA %.3g, moments %.3g, "
              "norm rel %.3g, bf16 copies %s, state tensors %zu of %zu\n",
              world, device.str().c_str(), res.max_weight, res.max_ema, res.max_state, res.max_norm_rel,
              shadows ? (res.shadows_exact ? "exact" : "WRONG") : "off", res.state_tensors_sharded,
              res.state_tensors_whole);
  return res;
}

}  // namespace perftrain::train::testing
