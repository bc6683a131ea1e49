// ops::position_add on the CPU (ATen's broadcast add, which the GPU kernel
// stands in for): the values, the gradient in y's dtype, and the shape checks.
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "base/error.h"
#include "ops/position_add.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

TEST(PositionAdd, CpuIsTheBroadcastAddWithItsGradient) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(7);
  const at::Tensor y = at::randn({3, 5, 8}, g).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor table = at::randn({1, 5, 8}, g);
  const at::Tensor out = position_add(y, table);
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(out, y.detach().to(at::kFloat) + table));
  const at::Tensor dout = at::randn({3, 5, 8}, g);
  const at::Tensor dy = torch::autograd::grad({out}, {y}, {dout})[0];
  EXPECT_TRUE(at::equal(dy, dout.to(at::kBFloat16)));
}

TEST(PositionAdd, ShapesThatDoNotMatchRaiseUsageError) {
  const at::Tensor y = at::randn({2, 4, 6});
  EXPECT_THROW(position_add(y, at::randn({4, 7})), UsageError);
  EXPECT_THROW(position_add(y, at::randn({2, 4, 6})), UsageError);  // per sample: not a position table
  EXPECT_THROW(position_add(at::randn({8, 6}), at::randn({8, 6})), UsageError);
  EXPECT_NO_THROW(position_add(y, at::randn({4, 6})));
}

}  // namespace
}  // namespace perftrain::ops
