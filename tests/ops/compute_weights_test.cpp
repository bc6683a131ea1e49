// ops::compute_weight and its scope: a registered copy is found only inside a
// ComputeWeightsScope on the same thread and only for its own dtype; outside,
// or for other tensors, the weight is cast as before; scopes nest and a null
// scope hides the outer one; a whole-parameter view reads the copy's view.
#include <ATen/ops/allclose.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "base/error.h"
#include "ops/compute_weights.h"
#include "ops/recompute.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

TEST(ComputeWeights, TheScopeDecidesWhetherTheCopyIsRead) {
  auto gen = perftrain::testing::seeded_cpu_generator(4);
  const at::Tensor w = at::randn({6, 5}, gen, at::kFloat), other = at::randn({6, 5}, gen, at::kFloat);
  // A deliberately different "copy", so that reading it is visible.
  const at::Tensor copy = (w * 2).to(at::kBFloat16);
  const ComputeWeights weights({{w, copy}});
  EXPECT_EQ(weights.size(), 1u);

  auto cast = compute_weight(w, at::kBFloat16);  // no scope: a cast of w
  EXPECT_TRUE(cast.equal(w.to(at::kBFloat16)));
  {
    const ComputeWeightsScope scope(&weights);
    EXPECT_TRUE(compute_weight(w, at::kBFloat16).is_same(copy));
    EXPECT_TRUE(compute_weight(other, at::kBFloat16).equal(other.to(at::kBFloat16)));  // not registered
    EXPECT_TRUE(compute_weight(w, at::kHalf).equal(w.to(at::kHalf)));                  // another dtype
    EXPECT_TRUE(compute_weight(w, at::kFloat).is_same(w));                             // already that dtype
    std::thread([&] {  // another thread sees no scope
      EXPECT_TRUE(compute_weight(w, at::kBFloat16).equal(w.to(at::kBFloat16)));
    }).join();
    {
      const ComputeWeightsScope hide(nullptr);
      EXPECT_TRUE(compute_weight(w, at::kBFloat16).equal(w.to(at::kBFloat16)));
    }
    EXPECT_TRUE(compute_weight(w, at::kBFloat16).is_same(copy));  // the outer scope is back
  }
  EXPECT_TRUE(compute_weight(w, at::kBFloat16).equal(w.to(at::kBFloat16)));
  EXPECT_FALSE(compute_weight(at::Tensor(), at::kBFloat16).defined());
}

// A conv weight read as a matrix: a reshaping view of the whole parameter
// finds the same view of the copy; a view of part of it is cast.
TEST(ComputeWeights, AWholeViewOfAParameterReadsItsCopy) {
  auto gen = perftrain::testing::seeded_cpu_generator(5);
  const at::Tensor w = at::randn({6, 2, 2, 2}, gen, at::kFloat).set_requires_grad(true);
  const at::Tensor copy = (w.detach() * 2).to(at::kBFloat16);
  const ComputeWeights weights({{w, copy}});
  const ComputeWeightsScope scope(&weights);
  const at::Tensor as_matrix = w.view({6, 8});
  const at::Tensor got = compute_weight(as_matrix, at::kBFloat16);
  EXPECT_EQ(got.sizes(), as_matrix.sizes());
  EXPECT_EQ(got.data_ptr(), copy.data_ptr());
  const at::Tensor part = w.view({6, 8}).narrow(0, 1, 3);
  EXPECT_TRUE(compute_weight(part, at::kBFloat16).equal(part.detach().to(at::kBFloat16)));
  EXPECT_THROW(ComputeWeights({{w, at::randn({5, 6}, gen, at::kFloat)}}), UsageError);
}

// ops::recompute's backward runs the block again on autograd's thread (for
// CUDA tensors), where the step's scope is not: it re-installs the copies the
// forward read, so the re-run reads the same weights (not a cast of each).
// Here the backward runs on another thread, as autograd's does, and the
// "copy" is deliberately 2 w, so which one each run read shows in the values.
TEST(ComputeWeights, RecomputeReRunsTheBlockWithTheForwardsCopies) {
  auto gen = perftrain::testing::seeded_cpu_generator(6);
  const at::Tensor w = at::randn({4, 3}, gen, at::kFloat);
  const at::Tensor copy = (w * 2).to(at::kBFloat16);
  const ComputeWeights weights({{w, copy}});
  for (const bool scoped : {true, false}) {
    std::vector<bool> read_copy;  // per call of the block: forward, then the re-run
    const BlockFn fn = [&](const at::Tensor& x, const at::Tensor& c) {
      const at::Tensor wc = compute_weight(w, at::kBFloat16);
      read_copy.push_back(wc.is_same(copy));
      return at::matmul(x, wc.to(at::kFloat).t()) + c;
    };
    const at::Tensor x = at::randn({5, 3}, gen, at::kFloat).set_requires_grad(true);
    const at::Tensor c = at::randn({5, 4}, gen, at::kFloat).set_requires_grad(true);
    const at::Tensor gout = at::randn({5, 4}, gen, at::kFloat);
    at::Tensor y;
    {
      const ComputeWeightsScope scope(scoped ? &weights : nullptr);
      y = recompute(fn, x, c);
    }
    // The backward on a thread with the other scope state than the forward's.
    std::thread([&] {
      const ComputeWeightsScope other(scoped ? nullptr : &weights);
      y.backward(gout);
    }).join();
    ASSERT_EQ(read_copy.size(), 2u);
    EXPECT_EQ(read_copy[0], scoped);
    EXPECT_EQ(read_copy[1], scoped) << "the re-run read other weights than the forward";
    const at::Tensor used = scoped ? copy.to(at::kFloat) : w.to(at::kBFloat16).to(at::kFloat);
    EXPECT_TRUE(at::allclose(x.grad(), at::matmul(gout, used), 1e-5, 1e-5)) << (scoped ? "scoped" : "unscoped");
    EXPECT_TRUE(at::allclose(c.grad(), gout));
  }
}

}  // namespace
}  // namespace perftrain::ops
