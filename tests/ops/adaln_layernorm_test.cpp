// adaln_layernorm on the CPU: the op is its reference, and the reference's
// values and gradients agree with an independent composition through
// at::layer_norm; bad inputs raise UsageError naming the input.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "ops/adaln_layernorm.h"
#include "support/row_op_checks.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using namespace perftrain::testing::row_ops::cpu;

// The independent composition: ATen's own LayerNorm, then the modulation.
at::Tensor composed(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  const int64_t d = x.size(-1);
  return at::layer_norm(x, {d}, {}, {}, eps) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

TEST(AdaLNLayerNorm, CpuOpIsTheReference) {
  for_each_dtypes([](const Shape& s, at::ScalarType x_dt, at::ScalarType m_dt, at::ScalarType out_dt,
                     at::Generator& g) {
    const at::Tensor x = (at::randn({s.b, s.t, s.d}, g) * 2 + 0.5).to(x_dt);
    const at::Tensor shift = at::randn({s.b, s.d}, g).to(m_dt);
    const at::Tensor scale = (at::randn({s.b, s.d}, g) * 0.5).to(m_dt);
    const at::Tensor y = adaln_layernorm(x, shift, scale, out_dt);
    EXPECT_EQ(y.scalar_type(), out_dt);
    EXPECT_TRUE(at::equal(y, adaln_layernorm_reference(x, shift, scale, out_dt)));
    EXPECT_FALSE(y.isnan().any().item<bool>());
  });
}

// fp32 throughout: reference vs at::layer_norm composition, forward and all
// three gradients, with a random upstream gradient. Tolerance (fp32, D <= 1000
// terms per reduction): atol 1e-5 + rtol 1e-5.
TEST(AdaLNLayerNorm, CpuMatchesLayerNormCompositionForwardAndBackward) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    at::Generator g = gen(seed++);
    const at::Tensor x0 = at::randn({s.b, s.t, s.d}, g) * 3 - 1;
    const at::Tensor shift0 = at::randn({s.b, s.d}, g);
    const at::Tensor scale0 = at::randn({s.b, s.d}, g) * 0.5;
    const at::Tensor dy = at::randn({s.b, s.t, s.d}, g);
    auto run = [&](bool ours) {
      return output_and_grads({x0, shift0, scale0}, dy, [&](const std::vector<at::Tensor>& in) {
        return ours ? adaln_layernorm(in[0], in[1], in[2], at::kFloat) : composed(in[0], in[1], in[2], 1e-6);
      });
    };
    const auto ours = run(true), ref = run(false);
    const std::string where = shape_name(s);
    expect_close(ours[0], ref[0], 1e-5, 1e-5, where + "y");
    expect_close(ours[1], ref[1], 1e-5, 1e-5, where + "dx");
    expect_close(ours[2], ref[2], 1e-5, 1e-5, where + "dshift");
    expect_close(ours[3], ref[3], 1e-5, 1e-5, where + "dscale");
  }
}

// shift and scale as chunks of one [B, 6D] modulation tensor (row stride 6D),
// as the DiT block passes them; gradients land in the right chunks.
TEST(AdaLNLayerNorm, CpuStridedModulationChunks) {
  at::Generator g = gen(7);
  const int64_t b = 3, t = 4, d = 40;
  const at::Tensor x = at::randn({b, t, d}, g);
  const at::Tensor mod0 = at::randn({b, 6 * d}, g) * 0.3;
  const at::Tensor dy = at::randn({b, t, d}, g);
  auto run = [&](bool ours) {
    const at::Tensor mod = mod0.clone().requires_grad_(true);
    const auto chunks = mod.chunk(6, 1);
    EXPECT_EQ(chunks[0].stride(0), 6 * d);
    const at::Tensor y = ours ? adaln_layernorm(x, chunks[0], chunks[1], at::kFloat)
                              : composed(x, chunks[0], chunks[1], 1e-6);
    return torch::autograd::grad({y}, {mod}, {dy})[0];
  };
  const at::Tensor ours = run(true), ref = run(false);
  expect_close(ours, ref, 1e-5, 1e-5, "dmod");
  // Only the shift and scale chunks receive gradient.
  EXPECT_EQ(ours.narrow(1, 2 * d, 4 * d).abs().max().item<double>(), 0.0);
}

TEST(AdaLNLayerNorm, BadInputsRaiseUsageError) {
  const at::Tensor x = at::randn({2, 3, 8});
  const at::Tensor m = at::randn({2, 8});
  using testing::error_of;
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(at::randn({6, 8}), m, m, at::kFloat); })
                .find("x must be [B, T, D]"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(x, at::randn({3, 8}), m, at::kFloat); }).find("shift"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(x, m, at::randn({2, 7}), at::kFloat); }).find("scale"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(x, at::randn({2, 1, 8}), m, at::kFloat); }).find("shift"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(x.to(at::kInt), m, m, at::kFloat); }).find("x must be float32"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(x, m.to(at::kLong), m, at::kFloat); }).find("shift must be"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(x, m, m, at::kInt); }).find("out_dtype"), std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { adaln_layernorm(x, at::Tensor(), m, at::kFloat); }).find("defined"),
            std::string::npos);
}

}  // namespace
}  // namespace perftrain::ops
