// The weight-gradient stream's host side: when the step runner opens it, that
// without an active scope (or on the CPU) the work runs inline, and the check
// of a built graph for weights used more than once.
#include <ATen/TensorOperators.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ops/gelu_mlp.h"
#include "ops/stacked_linear.h"
#include "ops/weight_grad_stream.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

TEST(WeightGradStream, OpensForSmallProductsOnly) {
  ASSERT_EQ(weight_grad_stream_mode(), WeightGradStreamMode::kAuto) << "the default rule";
  EXPECT_TRUE(weight_grad_stream_for(32 * 256, 384));    // DiT-S/2 batch 32: measured faster
  EXPECT_TRUE(weight_grad_stream_for(128 * 256, 384));   // batch 128: measured faster, at the limit
  EXPECT_FALSE(weight_grad_stream_for(129 * 256, 384));
  EXPECT_TRUE(weight_grad_stream_for(64 * 256, 768));    // DiT-B/2 batch 64: measured faster
  EXPECT_FALSE(weight_grad_stream_for(256 * 256, 384));  // batch 256: measured slower
  EXPECT_FALSE(weight_grad_stream_for(64 * 256, 1152));  // DiT-XL/2 batch 64: three times the work per product
}

// The [speed] key weight_grad_stream's other two rules: every size, never.
TEST(WeightGradStream, ModeOnAndOffOverrideTheSizeRule) {
  set_weight_grad_stream_mode(WeightGradStreamMode::kOn);
  EXPECT_TRUE(weight_grad_stream_for(256 * 256, 1152));
  EXPECT_FALSE(weight_grad_stream_size_rule(256 * 256, 1152)) << "the size rule ignores the mode";
  set_weight_grad_stream_mode(WeightGradStreamMode::kOff);
  EXPECT_FALSE(weight_grad_stream_for(32 * 256, 384));
  EXPECT_TRUE(weight_grad_stream_size_rule(32 * 256, 384)) << "the size rule ignores the mode";
  // gelu_mlp's GELU-backward form follows the size rule, not the mode, so
  // that one stream and two give the same bits.
  EXPECT_EQ(gelu_mlp_fused_gelu_backward(32 * 256, 384), false);
  set_weight_grad_stream_mode(WeightGradStreamMode::kAuto);
  EXPECT_TRUE(weight_grad_stream_for(32 * 256, 384));
}

TEST(WeightGradStream, RunsInlineWithoutAnActiveScope) {
  const WeightGradStream cpu_scope(true, at::Device(at::kCPU));
  EXPECT_FALSE(cpu_scope.active());
  int runs = 0;
  bool on_side = true;
  run_weight_grads(
      [&] {
        ++runs;
        on_side = on_weight_grad_stream();
      },
      {at::ones({2})});
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(on_side);
}

// The graph check the step runner makes before the first backward: a weight
// reached by two edges (used twice, or twice by one op) is named; weights
// used once, inputs that need no gradient and a graph-less root are not.
TEST(WeightGradStream, FindsWeightsUsedMoreThanOnce) {
  auto gen = perftrain::testing::seeded_cpu_generator(3);
  const at::Tensor x = at::randn({5, 4}, gen);
  const at::Tensor w1 = at::randn({4, 4}, gen).set_requires_grad(true);
  const at::Tensor w2 = at::randn({4, 4}, gen).set_requires_grad(true);
  const at::Tensor b = at::randn({4}, gen).set_requires_grad(true);
  const std::vector<std::pair<std::string, at::Tensor>> names{{"w1", w1}, {"w2", w2}, {"b", b}};

  const at::Tensor once = (at::matmul(at::matmul(x, w1) + b, w2)).sum();
  EXPECT_TRUE(leaves_used_more_than_once(once, names).empty());
  const at::Tensor looped = (at::matmul(at::matmul(x, w1), w1) + b).sum();  // a layer applied twice
  EXPECT_EQ(leaves_used_more_than_once(looped, names), (std::vector<std::string>{"w1"}));
  const at::Tensor twice_in_one_op = (at::matmul(x, w2 + w2) + b + b).sum();
  auto both = leaves_used_more_than_once(twice_in_one_op, names);
  std::sort(both.begin(), both.end());
  EXPECT_EQ(both, (std::vector<std::string>{"b", "w2"}));
  EXPECT_EQ(leaves_used_more_than_once(looped), (std::vector<std::string>{"leaf 0"}));  // no names given
  // The stacked modulation product reads each weight once; the same weight
  // listed twice is two uses.
  const at::Tensor xs = x.clone().set_requires_grad(true);
  EXPECT_TRUE(leaves_used_more_than_once(detail::stacked_linear_function(xs, {w1, w2}, {}).sum(), names).empty());
  EXPECT_EQ(leaves_used_more_than_once(detail::stacked_linear_function(xs, {w1, w1}, {}).sum(), names),
            (std::vector<std::string>{"w1"}));
  EXPECT_TRUE(leaves_used_more_than_once(x.sum(), names).empty());  // no graph
}

}  // namespace
}  // namespace perftrain::ops
