// The weight-gradient stream (ops/weight_grad_stream.h) on the GPU: a chain of
// the fused ops (projected attention, linear, GELU MLP) gives the same
// gradients with their weight gradients on the side stream as inline, bit for
// bit, and again after the inputs were released and their memory reused;
// inside a CUDA graph capture the two streams replay to the same result.
// Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "ops/gelu_mlp.h"
#include "ops/linear.h"
#include "ops/projected_attention.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {
namespace {

const at::Device kCuda(at::kCUDA, 0);
constexpr int64_t kBatch = 8, kTokens = 256, kDim = 384, kHeads = 6, kLayers = 3;

at::Tensor rnd(at::IntArrayRef shape, at::Generator& g, double scale) {
  return at::randn(shape, g, at::TensorOptions().device(kCuda)) * scale;
}

// Parameters of kLayers blocks (fp32 leaves, as the model's).
struct Params {
  std::vector<at::Tensor> all;
  explicit Params(uint64_t seed) {
    at::Generator g = at::cuda::detail::createCUDAGenerator(0);
    g.set_current_seed(seed);
    const double s = 1.0 / std::sqrt(double(kDim));
    for (int64_t l = 0; l < kLayers; ++l)
      for (auto shape : std::vector<std::vector<int64_t>>{{3 * kDim, kDim}, {3 * kDim}, {kDim, kDim}, {kDim},
                                                          {4 * kDim, kDim}, {4 * kDim}, {kDim, 4 * kDim}, {kDim}})
        all.push_back(rnd(shape, g, shape.size() == 2 ? s : 0.1).requires_grad_(true));
  }
};

// out = the blocks' chain on h (bf16), loss = (out * gout).sum(); backward
// leaves the gradients in the parameters' .grad.
void forward_backward(const Params& p, const at::Tensor& h0, const at::Tensor& gout) {
  at::Tensor h = h0;
  for (int64_t l = 0; l < kLayers; ++l) {
    const at::Tensor* w = &p.all[size_t(8 * l)];
    at::Tensor a = projected_attention(h, w[0], w[1], kHeads);
    h = h + linear(a, w[2], w[3]);
    h = h + gelu_mlp(h, w[4], w[5], w[6], w[7]);
  }
  (h.to(at::kFloat) * gout).sum().backward();
}

std::vector<at::Tensor> take_grads(const Params& p) {
  std::vector<at::Tensor> g;
  for (const auto& t : p.all) {
    g.push_back(t.grad().clone());
    t.mutable_grad() = at::Tensor();
  }
  return g;
}

void expect_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(a[i].isnan().any().item<bool>()) << what << ": NaN in gradient " << i;
    EXPECT_EQ((a[i] - b[i]).abs().max().item<double>(), 0.0) << what << ": gradient " << i << " differs";
  }
}

struct Inputs {
  at::Tensor h, gout;
  explicit Inputs(uint64_t seed) {
    at::Generator g = at::cuda::detail::createCUDAGenerator(0);
    g.set_current_seed(seed);
    h = rnd({kBatch, kTokens, kDim}, g, 1.0).to(at::kBFloat16);
    gout = rnd({kBatch, kTokens, kDim}, g, 1.0);
  }
};

TEST(WeightGradStreamGpu, SameGradientsAsInlineBitForBit) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  Params p(1);
  for (uint64_t seed : {11, 12}) {
    Inputs in(seed);
    forward_backward(p, in.h, in.gout);  // inline (also tunes the products' algorithms first)
    const auto inline_grads = take_grads(p);
    {
      const WeightGradStream overlap(true, kCuda);
      ASSERT_TRUE(overlap.active());
      forward_backward(p, in.h, in.gout);
    }
    const auto lane_grads = take_grads(p);
    expect_identical(lane_grads, inline_grads, "seed " + std::to_string(seed));
  }
}

TEST(WeightGradStreamGpu, ReleasedInputsAreNotOverwrittenBeforeTheSideStreamReadThem) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  Params p(2);
  Inputs in(21);
  forward_backward(p, in.h, in.gout);
  const auto inline_grads = take_grads(p);
  // Each backward frees its activations as it goes; fresh allocations on the
  // training stream (poisoned with NaN) reuse that memory right away. If the
  // side stream still read a released tensor, the NaNs would reach a gradient.
  {
    const WeightGradStream overlap(true, kCuda);
    at::Tensor h = in.h;
    for (int64_t l = 0; l < kLayers; ++l) {
      const at::Tensor* w = &p.all[size_t(8 * l)];
      h = h + linear(projected_attention(h, w[0], w[1], kHeads), w[2], w[3]);
      h = h + gelu_mlp(h, w[4], w[5], w[6], w[7]);
    }
    const at::Tensor loss = (h.to(at::kFloat) * in.gout).sum();
    h = at::Tensor();
    loss.backward();
    std::vector<at::Tensor> grabbed;
    for (int i = 0; i < 8; ++i)  // grab freed memory on the training stream
      grabbed.push_back(at::full({kBatch * kTokens, 4 * kDim}, std::numeric_limits<float>::quiet_NaN(),
                                 at::TensorOptions().device(kCuda).dtype(at::kBFloat16)));
  }
  expect_identical(take_grads(p), inline_grads, "after reuse");
}

TEST(WeightGradStreamGpu, CapturedTwoStreamBackwardReplaysToTheEagerGradients) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  Params p(3);
  Inputs in(31);
  {  // once eagerly with the lane: makes its stream and workspace before the capture
    const WeightGradStream overlap(true, kCuda);
    forward_backward(p, in.h, in.gout);
  }
  take_grads(p);

  at::Tensor h_static = in.h.clone(), g_static = in.gout.clone();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  at::cuda::CUDAGraph graph;
  std::vector<at::Tensor> captured;
  {
    side.synchronize();
    const c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    {
      const WeightGradStream overlap(true, kCuda);
      EXPECT_TRUE(overlap.active());
      forward_backward(p, h_static, g_static);
    }
    for (const auto& t : p.all) captured.push_back(t.grad());
    graph.capture_end();
  }
  for (auto& t : p.all) t.mutable_grad() = at::Tensor();
  for (uint64_t seed : {32, 33}) {
    Inputs fresh(seed);
    forward_backward(p, fresh.h, fresh.gout);
    const auto want = take_grads(p);
    h_static.copy_(fresh.h);
    g_static.copy_(fresh.gout);
    for (auto& c : captured) c.fill_(std::numeric_limits<float>::quiet_NaN());
    graph.replay();
    std::vector<at::Tensor> got;
    for (auto& c : captured) got.push_back(c.clone());
    expect_identical(got, want, "replay, seed " + std::to_string(seed));
  }
}

}  // namespace
}  // namespace perftrain::ops
