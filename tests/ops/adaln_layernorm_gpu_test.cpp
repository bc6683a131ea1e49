// On a GPU: adaln_layernorm against its reference computed in float64 on the
// same (upcast) inputs, forward and backward, over the DiT widths and odd
// ones; every element written (outputs pre-filled with NaN through the kernel
// launches) and bit-identical reruns. Skips without a GPU. (Its capture in a
// CUDA graph is checked with gated_residual's, gated_residual_gpu_test.cpp.)
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/equal.h>
#include <c10/cuda/CUDAGuard.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "kernels/adaln_layernorm.h"
#include "ops/adaln_layernorm.h"
#include "support/kernel_launch.h"
#include "support/row_op_checks.h"

namespace perftrain::ops {
namespace {

using namespace perftrain::testing::row_ops;

const std::vector<Shape> kShapes = {{1, 1, 37}, {2, 3, 200}, {3, 256, 384}, {2, 256, 1152}, {4, 17, 1000},
                                    {256, 256, 384}};

// x, shift/scale, output dtypes: the bf16 autocast case (fp32 residual
// stream, bf16 modulation and output), pure fp32, all bf16, mixed, and half.
struct AdaLNCase {
  at::ScalarType x, mod, out;
};
const std::vector<AdaLNCase> kAdaLNCases = {{at::kFloat, at::kBFloat16, at::kBFloat16},
                                            {at::kFloat, at::kFloat, at::kFloat},
                                            {at::kBFloat16, at::kBFloat16, at::kBFloat16},
                                            {at::kBFloat16, at::kFloat, at::kFloat},
                                            {at::kFloat, at::kHalf, at::kHalf},
                                            {at::kHalf, at::kHalf, at::kHalf}};

std::string name(const AdaLNCase& c) { return dtype_names({{"x", c.x}, {"mod", c.mod}, {"out", c.out}}); }

TEST(AdaLNLayerNormGpu, MatchesFloat64Reference) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 1;
  for (const AdaLNCase& c : kAdaLNCases) {
    for (const Shape& s : kShapes) {
      const std::string where = name(c) + " " + name(s) + " ";
      at::Generator g = gen(seed++);
      // Chunks of one [B, 6D] tensor: row stride 6D, as the DiT block passes them.
      const at::Tensor mod = rnd({s.b, 6 * s.d}, g, c.mod, 0.5);
      const at::Tensor x = rnd({s.b, s.t, s.d}, g, c.x, 2.0, 0.3);
      const at::Tensor dy = rnd({s.b, s.t, s.d}, g, c.out);

      const at::Tensor mod_l = mod.detach().requires_grad_(true), x_l = x.detach().requires_grad_(true);
      const auto chunks = mod_l.chunk(6, 1);
      const at::Tensor y = adaln_layernorm(x_l, chunks[0], chunks[1], c.out);
      ASSERT_EQ(y.scalar_type(), c.out);
      const auto grads = torch::autograd::grad({y}, {x_l, chunks[0], chunks[1]}, {dy});
      ASSERT_EQ(grads[0].scalar_type(), c.x);
      ASSERT_EQ(grads[1].scalar_type(), c.mod);
      ASSERT_EQ(grads[2].scalar_type(), c.mod);

      const at::Tensor x64 = x.to(at::kDouble).requires_grad_(true);
      const at::Tensor shift64 = chunks[0].detach().to(at::kDouble).requires_grad_(true);
      const at::Tensor scale64 = chunks[1].detach().to(at::kDouble).requires_grad_(true);
      const at::Tensor y64 = adaln_layernorm_reference(x64, shift64, scale64, at::kDouble);
      const auto ref = torch::autograd::grad({y64}, {x64, shift64, scale64}, {dy.to(at::kDouble)});

      expect_close(y, y64, where + "y");
      expect_close(grads[0], ref[0], where + "dx");
      expect_rel_l2(grads[1], ref[1], where + "dshift");
      expect_rel_l2(grads[2], ref[2], where + "dscale");

      // Deterministic: a second run gives the same bits.
      const at::Tensor y2 = adaln_layernorm(x_l, chunks[0], chunks[1], c.out);
      const auto grads2 = torch::autograd::grad({y2}, {x_l, chunks[0], chunks[1]}, {dy});
      EXPECT_TRUE(at::equal(y, y2)) << where << "forward not bit-identical";
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(grads[i], grads2[i])) << where << "grad " << i;
    }
  }
}

// The kernel launches write every element of their outputs and read no
// scratch they did not write: outputs and scratch start as NaN, results must
// match the op (which is checked against the reference above) bit for bit.
TEST(AdaLNLayerNormGpu, KernelsWriteEveryOutputElement) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const testing::KernelLaunch launch;
  uint64_t seed = 5000;
  for (const Shape& s : {Shape{1, 1, 37}, Shape{2, 3, 200}, Shape{3, 256, 384}, Shape{4, 17, 1000}}) {
    const int b = int(s.b), t = int(s.t), d = int(s.d);
    at::Generator g = gen(seed++);
    const at::Tensor x = rnd({s.b, s.t, s.d}, g, at::kFloat);
    const at::Tensor shift = rnd({s.b, s.d}, g, at::kBFloat16), scale = rnd({s.b, s.d}, g, at::kBFloat16, 0.5);
    const at::Tensor dy = rnd({s.b, s.t, s.d}, g, at::kBFloat16);

    at::Tensor y = nan_like({s.b, s.t, s.d}, at::kBFloat16);
    at::Tensor mean = nan_like({s.b * s.t}, at::kFloat), rstd = nan_like({s.b * s.t}, at::kFloat);
    using bf16 = __nv_bfloat16;
    kernels::adaln_layernorm_forward<float, bf16, bf16>(
        x.data_ptr<float>(), static_cast<const bf16*>(shift.data_ptr()), d, static_cast<const bf16*>(scale.data_ptr()),
        d, static_cast<bf16*>(y.data_ptr()), mean.data_ptr<float>(), rstd.data_ptr<float>(), b, t, d, 1e-6f,
        launch.stream);
    EXPECT_TRUE(at::equal(y, adaln_layernorm(x, shift, scale, at::kBFloat16))) << name(s) << " adaln forward";
    EXPECT_FALSE(mean.isnan().any().item<bool>() || rstd.isnan().any().item<bool>()) << name(s);

    const int tiles = kernels::adaln_layernorm_backward_tiles(b, t, launch.sms);
    at::Tensor dx = nan_like({s.b, s.t, s.d}, at::kFloat);
    at::Tensor dshift = nan_like({s.b, s.d}, at::kBFloat16), dscale = nan_like({s.b, s.d}, at::kBFloat16);
    at::Tensor partials = nan_like({2, s.b, tiles, s.d}, at::kFloat);
    kernels::adaln_layernorm_backward<float, bf16, bf16>(
        static_cast<const bf16*>(dy.data_ptr()), x.data_ptr<float>(), static_cast<const bf16*>(scale.data_ptr()), d,
        mean.data_ptr<float>(), rstd.data_ptr<float>(), dx.data_ptr<float>(), static_cast<bf16*>(dshift.data_ptr()),
        static_cast<bf16*>(dscale.data_ptr()), partials.data_ptr<float>(), b, t, d, tiles, launch.stream);
    {
      const at::Tensor xl = x.detach().requires_grad_(true);
      const at::Tensor sl = shift.detach().requires_grad_(true), cl = scale.detach().requires_grad_(true);
      const auto gr = torch::autograd::grad({adaln_layernorm(xl, sl, cl, at::kBFloat16)}, {xl, sl, cl}, {dy});
      EXPECT_TRUE(at::equal(dx, gr[0])) << name(s) << " adaln dx";
      EXPECT_TRUE(at::equal(dshift, gr[1])) << name(s) << " adaln dshift";
      EXPECT_TRUE(at::equal(dscale, gr[2])) << name(s) << " adaln dscale";
    }
  }
}

// Bad inputs that only exist on a GPU: tensors on different devices.
TEST(AdaLNLayerNormGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  const at::Tensor x = at::randn({2, 3, 8}).to(kCuda);
  const at::Tensor m = at::randn({2, 8});
  EXPECT_THROW(adaln_layernorm(x, m, m.to(kCuda), at::kBFloat16), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
