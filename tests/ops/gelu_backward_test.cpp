// ops::gelu_tanh_backward_ on the CPU (ATen's path): the in-place result and
// the column sums against float64, and the argument checks.
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <limits>

#include "base/error.h"
#include "ops/gelu_backward.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

TEST(GeluBackward, CpuMatchesFloat64WithColumnSums) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(5);
  const at::Tensor pre = at::randn({33, 19}, g) * 3.0, grad_in = at::randn({33, 19}, g);
  at::Tensor grad = grad_in.clone();
  const at::Tensor sums = at::full({19}, std::numeric_limits<double>::quiet_NaN(), at::kFloat);
  gelu_tanh_backward_(grad, pre, sums);
  const at::Tensor want = at::gelu_backward(grad_in.to(at::kDouble), pre.to(at::kDouble), "tanh");
  EXPECT_TRUE(perftrain::testing::all_close(grad, want, 1e-5, 1e-5));
  EXPECT_TRUE(perftrain::testing::all_close(sums, want.sum(0), 1e-5, 1e-5));
}

TEST(GeluBackward, RefusesMismatchedShapesAndSums) {
  at::Tensor grad = at::randn({4, 8});
  EXPECT_THROW(gelu_tanh_backward_(grad, at::randn({4, 7})), UsageError);
  EXPECT_THROW(gelu_tanh_backward_(grad, at::randn({4, 8}).to(at::kDouble)), UsageError);
  EXPECT_THROW(gelu_tanh_backward_(grad, at::randn({4, 8}), at::empty({7}, at::kFloat)), UsageError);
  EXPECT_THROW(gelu_tanh_backward_(grad, at::randn({4, 8}), at::empty({8}, at::kDouble)), UsageError);
  at::Tensor strided = at::randn({8, 4}).t();
  EXPECT_THROW(gelu_tanh_backward_(strided, at::randn({4, 8})), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
