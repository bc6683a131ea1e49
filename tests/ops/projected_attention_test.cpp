// ops/projected_attention on the CPU (where it is linear then qkv_attention):
// output and the h, weight and bias gradients against the fp32 reference on
// odd sizes, with and without the bias; bad shapes are refused. The fused
// CUDA paths: projected_attention_gpu_test.cpp.
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/projected_attention.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using perftrain::testing::seeded_cpu_generator;

TEST(ProjectedAttention, CpuMatchesTheFp32ReferenceWithItsGradients) {
  auto g = seeded_cpu_generator(21);
  for (auto [B, T, heads, d] : {std::array<int64_t, 4>{2, 7, 3, 4}, {1, 13, 2, 8}}) {
    for (const bool with_bias : {true, false}) {
      const int64_t D = heads * d;
      const at::Tensor h = at::randn({B, T, D}, g).requires_grad_(true);
      const at::Tensor w = (at::randn({3 * D, D}, g) * 0.3).requires_grad_(true);
      const at::Tensor b = with_bias ? (at::randn({3 * D}, g) * 0.1).requires_grad_(true) : at::Tensor();
      const at::Tensor gout = at::randn({B, T, D}, g);
      const at::Tensor out = projected_attention(h, w, b, heads);
      const at::Tensor ref = projected_attention_reference(h, w, b, heads);
      const std::string what = "B " + std::to_string(B) + " T " + std::to_string(T) + (with_bias ? " bias" : "");
      expect_close(out, ref, 1e-6, 1e-5, what + " output");
      const auto inputs = with_bias ? std::vector<at::Tensor>{h, w, b} : std::vector<at::Tensor>{h, w};
      const auto got = torch::autograd::grad({(out * gout).sum()}, inputs);
      const auto want = torch::autograd::grad({(ref * gout).sum()}, inputs);
      for (size_t i = 0; i < inputs.size(); ++i) expect_close(got[i], want[i], 1e-6, 1e-5, what + " grad " + "hwb"[i]);
    }
  }
}

TEST(ProjectedAttention, RefusesBadShapes) {
  const at::Tensor h = at::randn({2, 7, 12}), w = at::randn({36, 12}), b = at::randn({36});
  EXPECT_THROW(projected_attention(h.view({14, 12}), w, b, 3), UsageError);    // h not [B, T, D]
  EXPECT_THROW(projected_attention(h, at::randn({24, 12}), at::Tensor(), 3), UsageError);  // weight not [3D, D]
  EXPECT_THROW(projected_attention(h, w, b, 5), UsageError);                   // 12 channels in 5 heads
  EXPECT_THROW(projected_attention(h, w, at::randn({35}), 3), UsageError);     // bias not [3D]
}

}  // namespace
}  // namespace perftrain::ops
