// ops::stacked_linear on the GPU, DiT-S/2's modulation shapes (12 layers of
// [6D, D] on silu(c) [B, D]) and an odd one: bf16 output and gradients
// against the fp32 reference; reading the bf16 copies as one view (laid out
// back to back, as the device optimizer does) gives bit for bit what their
// concatenation gives; so does running the weight gradients on the second
// stream; outputs and gradients come out of NaN-filled memory. Skips without
// a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "compat/compat.h"
#include "ops/compute_weights.h"
#include "ops/stacked_linear.h"
#include "ops/weight_grad_stream.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

const at::Device kCuda(at::kCUDA, 0);

struct Case {
  int64_t layers, rows, m, k;
};

struct Layers {
  at::Tensor x, dy;  // x bf16 [m, k]; dy bf16 [m, layers * rows]
  std::vector<at::Tensor> w, b;  // fp32 leaves
};

Layers make(const Case& c, uint64_t seed) {
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(seed);
  const auto f32 = at::TensorOptions().device(kCuda);
  Layers l;
  l.x = (at::randn({c.m, c.k}, g, f32) + 0.3).to(at::kBFloat16).requires_grad_(true);
  for (int64_t i = 0; i < c.layers; ++i) {
    l.w.push_back((at::randn({c.rows, c.k}, g, f32) / std::sqrt(double(c.k))).requires_grad_(true));
    l.b.push_back((at::randn({c.rows}, g, f32) * 0.1).requires_grad_(true));
  }
  l.dy = at::randn({c.m, c.layers * c.rows}, g, f32).to(at::kBFloat16);
  return l;
}

// Fills the caching allocator's free blocks with NaN, so that an output the
// op does not write shows up.
void poison_free_memory(int64_t elements) {
  at::full({elements}, std::numeric_limits<float>::quiet_NaN(), at::TensorOptions().device(kCuda));
}

// Output and gradients, copied out once the op's work (on the second stream
// too, with `second_stream`) has been joined.
std::pair<at::Tensor, std::vector<at::Tensor>> run(const Layers& l, const Case& c, bool second_stream = false) {
  poison_free_memory(4 * c.layers * c.rows * c.k + 4 * c.m * c.k);
  at::Tensor y;
  std::vector<at::Tensor> grads;
  {
    const WeightGradStream overlap(second_stream, kCuda);
    EXPECT_EQ(overlap.active(), second_stream);
    y = stacked_linear(l.x, l.w, l.b);
    std::vector<at::Tensor> inputs{l.x};
    inputs.insert(inputs.end(), l.w.begin(), l.w.end());
    inputs.insert(inputs.end(), l.b.begin(), l.b.end());
    grads = torch::autograd::grad({y}, inputs, {l.dy});
  }
  for (auto& g : grads) g = g.clone();  // out of the op's buffers before the next run reuses them
  return {y.clone(), grads};
}

void expect_identical(const std::pair<at::Tensor, std::vector<at::Tensor>>& a,
                      const std::pair<at::Tensor, std::vector<at::Tensor>>& b, const std::string& what) {
  EXPECT_TRUE(a.first.equal(b.first)) << what << ": output";
  ASSERT_EQ(a.second.size(), b.second.size());
  for (size_t i = 0; i < a.second.size(); ++i) EXPECT_TRUE(a.second[i].equal(b.second[i])) << what << ": gradient " << i;
}

TEST(StackedLinearGpu, MatchesTheReferenceAndReadsCopiesWithoutAConcatenation) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  for (const Case& c : {Case{12, 6 * 384, 32, 384}, Case{3, 40, 5, 24}}) {
    const std::string where = std::to_string(c.layers) + " x [" + std::to_string(c.rows) + ", " +
                              std::to_string(c.k) + "], m " + std::to_string(c.m);
    const Layers l = make(c, 7 + c.layers);

    // The fp32 reference and its gradients.
    std::vector<at::Tensor> w64, b64;
    for (const auto& w : l.w) w64.push_back(w.detach().to(at::kDouble).requires_grad_(true));
    for (const auto& b : l.b) b64.push_back(b.detach().to(at::kDouble).requires_grad_(true));
    const at::Tensor x64 = l.x.detach().to(at::kDouble).requires_grad_(true);
    const at::Tensor ref = stacked_linear_reference(x64, w64, b64);
    std::vector<at::Tensor> ref_in{x64};
    ref_in.insert(ref_in.end(), w64.begin(), w64.end());
    ref_in.insert(ref_in.end(), b64.begin(), b64.end());
    const auto ref_grads = torch::autograd::grad({ref}, ref_in, {l.dy.to(at::kFloat)});

    const auto cast = run(l, c);  // no scope: each weight cast, then concatenated
    EXPECT_FALSE(cast.first.isnan().any().item<bool>()) << where;
    EXPECT_LT(perftrain::testing::rel_l2(cast.first, ref), 1e-2) << where << ": output";
    ASSERT_EQ(cast.second.size(), ref_grads.size());
    for (size_t i = 0; i < ref_grads.size(); ++i) {
      EXPECT_FALSE(cast.second[i].isnan().any().item<bool>()) << where << ": gradient " << i;
      EXPECT_LT(perftrain::testing::rel_l2(cast.second[i], ref_grads[i]), 1e-2) << where << ": gradient " << i;
    }

    // bf16 copies back to back in one buffer: read as one view.
    const int64_t per_w = c.rows * c.k;
    const at::Tensor buffer = at::empty({c.layers * (per_w + c.rows)}, l.x.options().requires_grad(false));
    std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
    for (int64_t i = 0; i < c.layers; ++i) {
      at::Tensor wc = buffer.narrow(0, i * per_w, per_w).view({c.rows, c.k});
      at::Tensor bc = buffer.narrow(0, c.layers * per_w + i * c.rows, c.rows);
      wc.copy_(l.w[size_t(i)].detach());
      bc.copy_(l.b[size_t(i)].detach());
      pairs.emplace_back(l.w[size_t(i)], wc);
      pairs.emplace_back(l.b[size_t(i)], bc);
    }
    const ComputeWeights copies(pairs);
    {
      const ComputeWeightsScope scope(&copies);
      std::vector<at::Tensor> read;
      for (const auto& w : l.w) read.push_back(compute_weight(w, at::kBFloat16));
      EXPECT_EQ(detail::stacked_rows(read).data_ptr(), buffer.data_ptr()) << where << ": not read as one view";
      expect_identical(run(l, c), cast, where + ", one view");
      // The weight gradients on the second stream: the same bits.
      expect_identical(run(l, c, true), cast, where + ", second stream");
    }
  }
}

}  // namespace
}  // namespace perftrain::ops
