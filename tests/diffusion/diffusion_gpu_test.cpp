// On a GPU: the losses agree with the CPU, and both training losses
// (random draws included) can be captured in a CUDA graph and replayed,
// which fails loudly if the loss path does a host sync. Skips without a GPU.
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "diffusion/ddpm.h"
#include "diffusion/flow.h"
#include "test_util.h"

namespace perftrain::diffusion {
namespace {

using testing::alpha_bar;
using testing::cpu_gen;
using testing::max_abs_diff;

const c10::Device kCuda(c10::DeviceType::CUDA, 0);

bool have_gpu() { return c10::cuda::device_count() > 0; }

at::Tensor eps_and_v(const at::Tensor& x, const at::Tensor& t, const at::Tensor&) {
  return at::cat({x.mul(0.5).add(t.view({-1, 1, 1, 1}).mul(1e-3)), x.tanh()}, 1);
}

TEST(DiffusionGpu, DdpmLossMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  GaussianDiffusion d;
  at::Generator g = cpu_gen(1);
  const at::Tensor x0 = at::randn({8, 4, 8, 8}, g);
  const at::Tensor noise = at::randn(x0.sizes(), g);
  const at::Tensor t = at::tensor(std::vector<int64_t>{0, 0, 1, 5, 100, 500, 998, 999});
  const at::Tensor y = at::zeros({8}, at::kLong);
  const LossTerms cpu = d.training_loss_at(eps_and_v, x0, y, t, noise, true);
  // Tables follow x0 to the GPU on demand.
  const LossTerms gpu = d.training_loss_at(eps_and_v, x0.to(kCuda), y.to(kCuda), t.to(kCuda),
                                           noise.to(kCuda), true);
  EXPECT_EQ(gpu.loss.device(), kCuda);
  EXPECT_NEAR(gpu.loss.item<double>(), cpu.loss.item<double>(), 1e-5 * cpu.loss.item<double>());
  EXPECT_NEAR(gpu.vb.item<double>(), cpu.vb.item<double>(), 1e-5 * cpu.vb.item<double>());
}

// Captures `step` (after a warm-up) with `gen` registered, replays it three
// times and returns the losses.
template <class Step>
std::vector<double> capture_and_replay(at::Generator& gen, Step step) {
  c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
  step();  // warm-up outside the capture
  at::cuda::CUDAGraph graph;
  graph.register_generator_state(gen);
  graph.capture_begin();
  const at::Tensor loss = step();
  graph.capture_end();
  std::vector<double> out;
  for (int i = 0; i < 3; ++i) {
    graph.replay();
    out.push_back(loss.item<double>());
  }
  return out;
}

TEST(DiffusionGpu, TrainingLossesCaptureInCudaGraph) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  GaussianDiffusion d;
  d.to(kCuda);  // before capture: moving tables is a host->device copy
  const RectifiedFlow flow(FlowOptions{TimeSampling::LogitNormal});
  const at::Tensor x0 = at::randn({16, 4, 8, 8}, cpu_gen(2)).to(kCuda);
  const at::Tensor y = at::zeros({16}, at::TensorOptions(kCuda).dtype(at::kLong));
  at::Generator gen = at::cuda::detail::createCUDAGenerator(0);
  gen.set_current_seed(7);

  const std::vector<double> ddpm = capture_and_replay(
      gen, [&] { return d.training_loss(eps_and_v, x0, y, gen, true).loss; });
  const std::vector<double> rf = capture_and_replay(gen, [&] {
    return flow.training_loss(
        [](const at::Tensor& x, const at::Tensor& t, const at::Tensor&) { return x.mul(0.5); },
        x0, y, gen).loss;
  });
  for (const auto* v : {&ddpm, &rf}) {
    for (double l : *v) EXPECT_TRUE(std::isfinite(l) && l > 0.0) << l;
    // Each replay draws new t and noise from the generator.
    EXPECT_NE((*v)[0], (*v)[1]);
    EXPECT_NE((*v)[1], (*v)[2]);
  }
}

TEST(DiffusionGpu, DdimOracleOnGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  GaussianDiffusion d;
  const at::Tensor x0 = at::randn({1, 4, 8, 8}, cpu_gen(3)).clamp(-1, 1).expand({2, 4, 8, 8}).to(kCuda);
  const at::Tensor noise = at::randn(x0.sizes(), cpu_gen(4)).to(kCuda);
  const ModelFn oracle = [&](const at::Tensor& x_t, const at::Tensor& t, const at::Tensor&) {
    const double ab = alpha_bar(static_cast<int64_t>(t[0].item<float>()));
    return x_t.sub(x0.mul(std::sqrt(ab))).div(std::sqrt(1.0 - ab));
  };
  const at::Tensor x = d.ddim_sample(oracle, noise, at::zeros({2}, at::TensorOptions(kCuda).dtype(at::kLong)), 25);
  EXPECT_EQ(x.device(), kCuda);
  EXPECT_LT(max_abs_diff(x.cpu(), x0.cpu()), 1e-4);
}

}  // namespace
}  // namespace perftrain::diffusion
