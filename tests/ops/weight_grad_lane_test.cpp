// The weight-gradient stream's host side: when the step runner opens it, and
// that without an active scope (or on the CPU) the work runs inline.
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "ops/weight_grad_lane.h"

namespace perftrain::ops {
namespace {

TEST(WeightGradLane, OpensForSmallProductsOnly) {
  if (std::getenv("PERFTRAIN_DW_STREAM") != nullptr) GTEST_SKIP() << "PERFTRAIN_DW_STREAM is set";
  EXPECT_TRUE(weight_grad_overlap_for(32 * 256, 384));    // DiT-S/2 batch 32: measured faster
  EXPECT_TRUE(weight_grad_overlap_for(128 * 256, 384));   // batch 128: measured faster, at the limit
  EXPECT_FALSE(weight_grad_overlap_for(129 * 256, 384));
  EXPECT_TRUE(weight_grad_overlap_for(64 * 256, 768));    // DiT-B/2 batch 64: measured faster
  EXPECT_FALSE(weight_grad_overlap_for(256 * 256, 384));  // batch 256: measured slower
  EXPECT_FALSE(weight_grad_overlap_for(64 * 256, 1152));  // DiT-XL/2 batch 64: three times the work per product
}

TEST(WeightGradLane, RunsInlineWithoutAnActiveScope) {
  const WeightGradOverlap cpu_scope(true, at::Device(at::kCPU));
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

}  // namespace
}  // namespace perftrain::ops
