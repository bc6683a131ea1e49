// ops::gelu_tanh_backward_ on the GPU: the fused in-place GELU backward with
// column sums against float64 (ATen's gelu_backward on double copies) for
// every float dtype, vector and odd widths, tails of the tanh included; the
// sums against float64 sums of the values it stored, into NaN-poisoned
// outputs; the same bits on a rerun. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "compat/compat.h"
#include "ops/gelu_backward.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

const at::Device kCuda(at::kCUDA, 0);

TEST(GeluBackwardGpu, MatchesFloat64WithColumnSums) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(11);
  struct Case {
    int64_t rows, cols;
  };
  const auto opts = at::TensorOptions().device(kCuda);
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
    // Relative rounding of one result in dt (the kernel rounds once; fp32 has
    // the fast exp's ~1e-6 besides).
    const double rtol = dt == at::kBFloat16 ? 1.0 / 128 : dt == at::kHalf ? 1.0 / 512 : 2e-5;
    for (const Case c : {Case{1, 8}, Case{7, 100}, Case{300, 384}, Case{1000, 257}, Case{4099, 1536}, Case{3, 5}}) {
      const std::string what =
          std::string(c10::toString(dt)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols);
      // pre spread wide (|x| up to ~12) so both tanh tails and the middle show.
      const at::Tensor pre = (at::randn({c.rows, c.cols}, g, opts) * 3.0).to(dt);
      const at::Tensor grad_in = (at::randn({c.rows, c.cols}, g, opts) + 0.25).to(dt);
      const at::Tensor want = at::gelu_backward(grad_in.to(at::kDouble), pre.to(at::kDouble), "tanh");

      at::Tensor grad = grad_in.clone();
      const at::Tensor sums = at::full({c.cols}, std::numeric_limits<double>::quiet_NaN(), opts.dtype(at::kFloat));
      gelu_tanh_backward_(grad, pre, sums);
      // An absolute term for results near zero (the derivative crosses zero
      // near x = -0.75), where fp32 evaluation error is large against the value.
      EXPECT_TRUE(perftrain::testing::all_close(grad, want, 2e-5, rtol)) << what;
      EXPECT_TRUE(perftrain::testing::all_close(sums, grad.to(at::kDouble).sum(0), 1e-6 * double(c.rows), 1e-5))
          << what << ": sums";

      // The same bits again, and the same elementwise result without the sums.
      at::Tensor again = grad_in.clone(), plain = grad_in.clone();
      const at::Tensor sums_again = at::full_like(sums, std::numeric_limits<double>::quiet_NaN());
      gelu_tanh_backward_(again, pre, sums_again);
      gelu_tanh_backward_(plain, pre);
      EXPECT_TRUE(at::equal(again, grad)) << what;
      EXPECT_TRUE(at::equal(sums_again, sums)) << what << ": a rerun gave other sums";
      EXPECT_TRUE(at::equal(plain, grad)) << what << ": without sums";
    }
  }
}

TEST(GeluBackwardGpu, SaturatesWithoutNaN) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const auto opts = at::TensorOptions().device(kCuda).dtype(at::kFloat);
  // exp(2u) overflows to inf for large x: tanh must come out as 1, not NaN.
  const at::Tensor pre = at::tensor({-1e4, -60.0, -9.0, 0.0, 9.0, 60.0, 1e4, -0.75}, opts.device(at::kCPU)).to(kCuda);
  at::Tensor grad = at::full({1, 8}, 2.0, opts);
  const at::Tensor pre2 = pre.view({1, 8});
  const at::Tensor want = at::gelu_backward(at::full({1, 8}, 2.0, opts.dtype(at::kDouble)), pre2.to(at::kDouble), "tanh");
  gelu_tanh_backward_(grad, pre2);
  EXPECT_TRUE(perftrain::testing::all_close(grad, want, 2e-5, 1e-5));
}

}  // namespace
}  // namespace perftrain::ops
