// The ones-column request on the CPU, where nothing takes it: residual_adaln
// and gelu_mlp give what they give without it, and the one-product weight
// gradient declines. Which MLP shapes ask for it once it is switched on.
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "ops/gelu_mlp.h"
#include "ops/linear.h"
#include "ops/residual_adaln.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

TEST(OnesColumn, CpuIgnoresTheRequest) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(3);
  const at::Tensor x = at::randn({2, 5, 16}, g), y = at::randn({2, 5, 16}, g);
  const at::Tensor gate = at::randn({2, 16}, g), shift = at::randn({2, 16}, g), scale = at::randn({2, 16}, g);
  const auto [x1a, ha] = residual_adaln(x, gate, y, shift, scale, at::kFloat);
  const auto [x1b, hb] = residual_adaln(x, gate, y, shift, scale, at::kFloat, 1e-6, at::Tensor(), true);
  EXPECT_TRUE(hb.is_contiguous());
  EXPECT_TRUE(at::equal(x1a, x1b));
  EXPECT_TRUE(at::equal(ha, hb));
  const at::Tensor w1 = at::randn({24, 16}, g), b1 = at::randn({24}, g), w2 = at::randn({16, 24}, g);
  EXPECT_TRUE(at::equal(gelu_mlp(ha, w1, b1, w2, at::Tensor()),
                        gelu_mlp(hb, w1, b1, w2, at::Tensor(), std::nullopt, true)));
  const at::Tensor dw = at::empty({24, 16}), db = at::empty({24});
  EXPECT_FALSE(detail::linear_weight_grad_from_ones_column(at::randn({10, 24}, g), at::randn({10, 16}, g), dw, db));
}

TEST(OnesColumn, AskedForWhereFc1BiasIsASeparateSum) {
  if (std::getenv("PERFTRAIN_FC1_BGRAD") != nullptr || std::getenv("PERFTRAIN_DGELU") != nullptr ||
      std::getenv("PERFTRAIN_GELU_BWD") != nullptr || std::getenv("PERFTRAIN_DW_STREAM") != nullptr)
    GTEST_SKIP() << "a PERFTRAIN_ switch is set";
  EXPECT_FALSE(gelu_mlp_takes_ones_column(65536, 768, 3072)) << "off by default";
  set_gelu_mlp_fc1_bias_from_ones_column(true);
  EXPECT_TRUE(gelu_mlp_takes_ones_column(65536, 768, 3072));    // DiT-B/2 b256: the DGELU epilogue path
  EXPECT_TRUE(gelu_mlp_takes_ones_column(65536, 1152, 4608));   // DiT-XL/2 b256: the same
  EXPECT_FALSE(gelu_mlp_takes_ones_column(65536, 384, 1536));   // DiT-S/2 b256: db1 from the fused GELU pass
  EXPECT_TRUE(gelu_mlp_takes_ones_column(8192, 384, 1536));     // DiT-S/2 b32: ATen's GELU pass, then a sum
  set_gelu_mlp_fc1_bias_from_ones_column(false);
  EXPECT_FALSE(gelu_mlp_takes_ones_column(8192, 384, 1536));
}

}  // namespace
}  // namespace perftrain::ops
