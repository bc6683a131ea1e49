// DeviceOptimizer's kernels against its CPU path (plain ATen, itself checked
// against AdamW + clip + EMA in device_optimizer_test.cpp) on tensors of odd
// sizes; the fp16 loss-scale rules on the device; the step captured in a CUDA
// graph replays exactly as the eager step; no allocation per step; the bf16
// parameter copies it keeps for the matrix products. Skips
// without a GPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "compat/compat.h"
#include "train/device_optimizer.h"
#include "support/tensor_checks.h"

namespace perftrain::train {
namespace {

// (rtol, atol), as these tests were written.
::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& ref, double rtol, double atol) {
  return perftrain::testing::all_close(a, ref, atol, rtol);
}

at::Generator gen_for(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }


float value(const at::Tensor& t) { return t.cpu().item<float>(); }
const at::Device kCuda(at::kCUDA, 0);

// The same weights on the CPU and on the GPU.
struct Pair {
  std::vector<std::pair<std::string, at::Tensor>> cpu, gpu;
  std::vector<at::Tensor> ema_cpu, ema_gpu;
};

Pair make_pair_of(const std::vector<std::vector<int64_t>>& shapes, at::Generator& gen) {
  Pair p;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "t" + std::to_string(i);
    auto w = at::randn(shapes[i], gen, at::kFloat);
    auto e = w + 0.1 * at::randn(shapes[i], gen, at::kFloat);
    p.cpu.emplace_back(name, w.clone().set_requires_grad(true));
    p.gpu.emplace_back(name, w.to(kCuda).set_requires_grad(true));
    p.ema_cpu.push_back(e.clone());
    p.ema_gpu.push_back(e.to(kCuda));
  }
  return p;
}

// Sizes 1, 7, 1000, 65537 (one past a chunk), 384x1152, 3x5x7.
const std::vector<std::vector<int64_t>> kShapes = {{1}, {7}, {1000}, {65537}, {384, 1152}, {3, 5, 7}};

void set_grads(Pair& p, at::Generator& gen, double gain, float scale) {
  for (size_t i = 0; i < p.cpu.size(); ++i) {
    auto g = gain * scale * at::randn(p.cpu[i].second.sizes(), gen, at::kFloat);
    p.cpu[i].second.mutable_grad() = g.clone();
    p.gpu[i].second.mutable_grad() = g.to(kCuda);
  }
}

void expect_same_state(const Pair& p, const DeviceOptimizer& gpu, const DeviceOptimizer& cpu, const std::string& when) {
  for (size_t i = 0; i < p.cpu.size(); ++i) {
    // fp32 on both sides; the GPU contracts to FMA and sums in another order (measured up to
    // 9e-6 absolute on p after a few steps; a wrong formula moves p by ~lr): 2e-5 absolute,
    // plus an absolute floor far below the values' size (weights O(1), gradients O(1e-3)).
    EXPECT_TRUE(close(p.gpu[i].second, p.cpu[i].second, 1e-5, 2e-5)) << p.cpu[i].first << " " << when;
    EXPECT_TRUE(close(p.ema_gpu[i], p.ema_cpu[i], 1e-5, 2e-5)) << "ema " << p.cpu[i].first << " " << when;
  }
  auto sg = gpu.state(), sc = cpu.state();
  ASSERT_EQ(sg.size(), sc.size());
  for (size_t k = 0; k < sg.size(); ++k) {
    ASSERT_EQ(sg[k].first, sc[k].first);
    // m ~ 1e-4 (may cancel to 0), v ~ 1e-8: absolute floors 1e-9 and 1e-13, 1e-4 relative.
    const bool m = sg[k].first.rfind("exp_avg.", 0) == 0, v = sg[k].first.rfind("exp_avg_sq.", 0) == 0;
    const double atol = m ? 1e-9 : v ? 1e-13 : 0.0;  // step counter and loss scale: exact
    EXPECT_TRUE(close(sg[k].second, sc[k].second, (m || v) ? 1e-4 : 1e-5, (m || v) ? atol : 2e-5)) << sg[k].first << " " << when;
  }
  // Norm: fp32 partial sums in a different order: 1e-5 relative; inf/NaN gradients: non-finite on both.
  const float ng = value(gpu.grad_norm()), nc = value(cpu.grad_norm());
  if (std::isfinite(nc)) EXPECT_NEAR(ng, nc, 1e-5 * nc) << when;
  else EXPECT_EQ(std::isnan(ng), std::isnan(nc)) << "norm " << ng << " vs " << nc << " " << when;
  EXPECT_EQ(std::isfinite(ng), std::isfinite(nc)) << when;
  EXPECT_EQ(value(gpu.lr()), value(cpu.lr())) << when;
  EXPECT_EQ(value(gpu.loss_scale()), value(cpu.loss_scale())) << when;
  EXPECT_EQ(value(gpu.skipped()), value(cpu.skipped())) << when;
}

TEST(DeviceOptimizerGpu, MatchesTheCpuPathOnOddSizes) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (double clip : {0.0, 1.0}) {
    auto gen = gen_for(21);
    Pair p = make_pair_of(kShapes, gen);
    DeviceOptimizerOptions o;
    o.lr = 1e-2, o.warmup_steps = 3, o.beta2 = 0.95, o.weight_decay = 0.05, o.grad_clip = clip;
    o.ema_decay = 0.99;
    DeviceOptimizer gpu(p.gpu, p.ema_gpu, o), cpu(p.cpu, p.ema_cpu, o);
    for (int step = 1; step <= 5; ++step) {
      // Gradients O(1e-3): norm ~0.7, under the clip of 1.0; at step 3 O(1): norm ~670, clipped.
      set_grads(p, gen, step == 3 ? 1.0 : 1e-3, 1.f);
      gpu.step();
      cpu.step();
      EXPECT_FALSE(p.gpu[4].second.grad().defined());
      expect_same_state(p, gpu, cpu, "clip " + std::to_string(clip) + " step " + std::to_string(step));
    }
  }
}

// The LR schedule evaluated by the prepare kernel (the cosine to lr_min,
// through the end of train.steps), the EMA start and the weight decay
// groups (the 1-D tensors here take none) give the CPU path's numbers.
TEST(DeviceOptimizerGpu, SchedulesAndDecayGroupsMatchTheCpuPath) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(23);
  Pair p = make_pair_of(kShapes, gen);
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.lr_min = 1e-3, o.warmup_steps = 2, o.total_steps = 6, o.lr_shape = kernels::LrShape::kCosine;
  o.weight_decay = 0.1, o.decay_all = false, o.ema_decay = 0.99, o.ema_start = 2;
  DeviceOptimizer gpu(p.gpu, p.ema_gpu, o), cpu(p.cpu, p.ema_cpu, o);
  for (int step = 1; step <= 7; ++step) {
    set_grads(p, gen, 1e-3, 1.f);
    gpu.step();
    cpu.step();
    expect_same_state(p, gpu, cpu, "step " + std::to_string(step));
  }
  EXPECT_EQ(value(gpu.lr()), 1e-3f) << "past train.steps: lr_min";
}

TEST(DeviceOptimizerGpu, Bf16ShadowsAreTheParametersInBf16AfterEveryStep) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(23);
  Pair p = make_pair_of(kShapes, gen);
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.bf16_shadows = true;
  DeviceOptimizer gpu(p.gpu, p.ema_gpu, o);
  const ops::ComputeWeights weights = gpu.compute_weights();
  ASSERT_EQ(weights.size(), kShapes.size());
  auto check = [&](const std::string& when) {
    for (const auto& [name, t] : p.gpu) {
      const at::Tensor copy = weights.find(t, at::kBFloat16);
      ASSERT_TRUE(copy.defined()) << name;
      EXPECT_TRUE(copy.equal(t.detach().to(at::kBFloat16))) << name << " " << when;
    }
  };
  check("at construction");
  for (int step = 1; step <= 3; ++step) {
    set_grads(p, gen, 1e-3, 1.f);
    gpu.step();
    check("after step " + std::to_string(step));
  }
  {  // a parameter changed by other means (a checkpoint loaded): refresh_shadows() catches up
    at::NoGradGuard no_grad;
    p.gpu[2].second.mul_(0.5);
  }
  gpu.refresh_shadows();
  check("after refresh_shadows");
}

// The copies of one shape lie back to back in parameter order (what
// ops::stacked_linear reads as one matrix), each at a 64-element boundary,
// and still follow their parameters.
TEST(DeviceOptimizerGpu, Bf16ShadowsOfOneShapeAreAdjacent) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(24);
  Pair p = make_pair_of({{7}, {8, 8}, {3}, {8, 8}, {8, 8}}, gen);
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.bf16_shadows = true;
  DeviceOptimizer gpu(p.gpu, p.ema_gpu, o);
  const ops::ComputeWeights weights = gpu.compute_weights();
  std::vector<at::Tensor> copies;
  for (const auto& [name, t] : p.gpu) copies.push_back(weights.find(t, at::kBFloat16));
  for (const auto& c : copies) {
    ASSERT_TRUE(c.defined());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data_ptr()) % 128, 0u);
  }
  auto* w1 = static_cast<char*>(copies[1].data_ptr());
  EXPECT_EQ(static_cast<char*>(copies[3].data_ptr()), w1 + 64 * 2);
  EXPECT_EQ(static_cast<char*>(copies[4].data_ptr()), w1 + 128 * 2);
  set_grads(p, gen, 1e-3, 1.f);
  gpu.step();
  for (size_t i = 0; i < copies.size(); ++i)
    EXPECT_TRUE(copies[i].equal(p.gpu[i].second.detach().to(at::kBFloat16))) << p.gpu[i].first;
}

TEST(DeviceOptimizerGpu, DynamicLossScaleSkipsInfAndGrowsOnTheDevice) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(22);
  Pair p = make_pair_of(kShapes, gen);
  DeviceOptimizerOptions o;
  o.lr = 1e-3, o.weight_decay = 0.01, o.grad_clip = 1.0, o.ema_decay = 0.9;
  o.dynamic_loss_scale = true, o.initial_loss_scale = 65536, o.growth_interval = 3;
  DeviceOptimizer gpu(p.gpu, p.ema_gpu, o), cpu(p.cpu, p.ema_cpu, o);
  auto step_both = [&](float poison, const std::string& when) {
    set_grads(p, gen, 1e-3, value(gpu.loss_scale()));
    if (poison != 0) {
      p.cpu[3].second.mutable_grad().select(0, 65536).fill_(poison);  // in the second chunk
      p.gpu[3].second.mutable_grad().select(0, 65536).fill_(poison);
    }
    gpu.step();
    cpu.step();
    expect_same_state(p, gpu, cpu, when);
  };
  step_both(0, "step 1");
  EXPECT_EQ(value(gpu.loss_scale()), 65536.f);
  auto before = p.gpu[4].second.detach().clone();
  auto ema_before = p.ema_gpu[4].clone();
  step_both(std::numeric_limits<float>::infinity(), "inf step");
  EXPECT_EQ(value(gpu.loss_scale()), 32768.f) << "an inf gradient halves the scale";
  EXPECT_EQ(value(gpu.skipped()), 1.f);
  EXPECT_EQ(value(gpu.steps_taken()), 1.f) << "and the step is not taken";
  EXPECT_TRUE(p.gpu[4].second.detach().equal(before));
  EXPECT_TRUE(p.ema_gpu[4].equal(ema_before));
  step_both(0, "step 2");
  step_both(0, "step 3");
  EXPECT_EQ(value(gpu.loss_scale()), 32768.f);
  step_both(0, "step 4");
  EXPECT_EQ(value(gpu.loss_scale()), 65536.f) << "growth_interval = 3 good steps double it";
  step_both(std::numeric_limits<float>::quiet_NaN(), "nan step");
  EXPECT_EQ(value(gpu.skipped()), 2.f);
  EXPECT_EQ(value(gpu.steps_taken()), 4.f);
}

TEST(DeviceOptimizerGpu, StepAllocatesNothing) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(23);
  Pair p = make_pair_of(kShapes, gen);
  DeviceOptimizerOptions o;
  o.grad_clip = 1.0, o.dynamic_loss_scale = true;
  DeviceOptimizer gpu(p.gpu, p.ema_gpu, o);
  set_grads(p, gen, 1.0, 1.f);
  gpu.step();
  set_grads(p, gen, 1.0, 1.f);
  auto count = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocation[0].allocated; };
  const auto before = count();
  gpu.step();
  EXPECT_EQ(count(), before) << "step() allocated device memory";
}

// Eager optimizer A and captured optimizer B from the same start: replays of
// B's graph give exactly A's numbers (same kernels, fixed grids and a fixed
// reduction order, so bitwise), including a skipped fp16 step.
TEST(DeviceOptimizerGpu, CapturedStepReplaysExactlyAsEager) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  auto gen = gen_for(24);
  Pair a = make_pair_of(kShapes, gen);
  std::vector<std::pair<std::string, at::Tensor>> b_params;
  std::vector<at::Tensor> b_ema, b_grads;
  for (size_t i = 0; i < a.gpu.size(); ++i) {
    b_params.emplace_back(a.gpu[i].first, a.gpu[i].second.detach().clone().set_requires_grad(true));
    b_ema.push_back(a.ema_gpu[i].clone());
    b_grads.push_back(at::empty_like(a.gpu[i].second.detach()));  // the graph reads these addresses
  }
  DeviceOptimizerOptions o;
  o.lr = 1e-2, o.warmup_steps = 4, o.weight_decay = 0.1, o.grad_clip = 0.5, o.ema_decay = 0.95;
  o.dynamic_loss_scale = true, o.initial_loss_scale = 1024, o.growth_interval = 2;
  DeviceOptimizer eager(a.gpu, a.ema_gpu, o), captured(b_params, b_ema, o);

  auto fresh_grads = [&](float poison) {
    const float scale = value(eager.loss_scale());
    for (size_t i = 0; i < a.gpu.size(); ++i) {
      auto g = (scale * at::randn(a.gpu[i].second.sizes(), gen, at::kFloat)).to(kCuda);
      if (poison != 0 && i == 2) g.select(0, 999).fill_(poison);
      a.gpu[i].second.mutable_grad() = g.clone();
      b_grads[i].copy_(g);
    }
  };
  auto attach = [&] {
    for (size_t i = 0; i < b_params.size(); ++i) b_params[i].second.mutable_grad() = b_grads[i];
  };
  // One eager step on both, then capture B's step on a side stream.
  fresh_grads(0);
  eager.step();
  attach();
  captured.step();
  attach();
  at::cuda::device_synchronize();
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    graph.capture_begin();
    captured.step();
    graph.capture_end();
  }
  EXPECT_FALSE(b_params[0].second.grad().defined());
  for (int step = 2; step <= 7; ++step) {
    const bool inf_step = step == 4;
    fresh_grads(inf_step ? std::numeric_limits<float>::infinity() : 0.f);
    eager.step();
    graph.replay();
    at::cuda::device_synchronize();
    for (size_t i = 0; i < b_params.size(); ++i) {
      EXPECT_TRUE(b_params[i].second.detach().equal(a.gpu[i].second.detach())) << a.gpu[i].first << " step " << step;
      EXPECT_TRUE(b_ema[i].equal(a.ema_gpu[i])) << "ema " << a.gpu[i].first << " step " << step;
    }
    auto se = eager.state(), sc = captured.state();
    for (size_t k = 0; k < se.size(); ++k) EXPECT_TRUE(se[k].second.equal(sc[k].second)) << se[k].first;
    EXPECT_EQ(value(captured.grad_norm()), value(eager.grad_norm()));
    EXPECT_EQ(value(captured.lr()), value(eager.lr()));
    EXPECT_EQ(value(captured.skipped()), inf_step || step > 4 ? 1.f : 0.f);
  }
  EXPECT_EQ(value(captured.steps_taken()), 6.f);  // 7 steps, one skipped
}

}  // namespace
}  // namespace perftrain::train
