// gated_residual on the CPU: the op is its reference, and the reference's
// values and gradients agree with an independent composition (broadcast
// through expand, not unsqueeze), with and without a bias; the bias is added
// to y; bad inputs raise UsageError.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "ops/gated_residual.h"
#include "support/row_op_checks.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using namespace perftrain::testing::row_ops::cpu;

TEST(GatedResidual, CpuOpIsTheReference) {
  for_each_dtypes([](const Shape& s, at::ScalarType x_dt, at::ScalarType g_dt, at::ScalarType y_dt,
                     at::Generator& g) {
    const at::Tensor x = at::randn({s.b, s.t, s.d}, g).to(x_dt);
    const at::Tensor gate = at::randn({s.b, s.d}, g).to(g_dt);
    const at::Tensor y = at::randn({s.b, s.t, s.d}, g).to(y_dt);
    const at::Tensor out = gated_residual(x, gate, y);
    EXPECT_EQ(out.scalar_type(), x_dt);
    EXPECT_TRUE(at::equal(out, gated_residual_reference(x, gate, y)));
    EXPECT_FALSE(out.isnan().any().item<bool>());
  });
}

// fp32 throughout, random upstream gradient. Tolerance (fp32, <= 9 terms per
// dgate sum): atol 1e-6 + rtol 1e-6.
TEST(GatedResidual, CpuMatchesCompositionForwardAndBackward) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    at::Generator g = gen(seed++);
    const at::Tensor x0 = at::randn({s.b, s.t, s.d}, g);
    const at::Tensor gate0 = at::randn({s.b, s.d}, g);
    const at::Tensor y0 = at::randn({s.b, s.t, s.d}, g);
    const at::Tensor dout = at::randn({s.b, s.t, s.d}, g);
    auto run = [&](bool ours) {
      return output_and_grads({x0, gate0, y0}, dout, [&](const std::vector<at::Tensor>& in) {
        return ours ? gated_residual(in[0], in[1], in[2])
                    : in[0] + in[1].view({s.b, 1, s.d}).expand({s.b, s.t, s.d}) * in[2];
      });
    };
    const auto ours = run(true), ref = run(false);
    const std::string where = shape_name(s);
    expect_close(ours[0], ref[0], 1e-6, 1e-6, where + "out");
    expect_close(ours[1], ref[1], 0, 0, where + "dx");  // dx is dout itself
    expect_close(ours[2], ref[2], 1e-6, 1e-6, where + "dgate");
    expect_close(ours[3], ref[3], 1e-6, 1e-6, where + "dy");
  }
}

// The bias is added to y before the gate: with an fp32 bias the op (on the CPU,
// the reference) equals the reference without a bias on y + bias (formed in
// fp32 either way), bit for bit; a bf16 bias is upcast first.
TEST(GatedResidual, CpuBiasIsAddedToY) {
  uint64_t seed = 50;
  for (const Shape& s : kShapes) {
    for (const auto x_dt : {at::kFloat, at::kBFloat16}) {
      for (const auto y_dt : {at::kFloat, at::kBFloat16}) {
        at::Generator g = gen(seed++);
        const at::Tensor x = at::randn({s.b, s.t, s.d}, g).to(x_dt);
        const at::Tensor gate = at::randn({s.b, s.d}, g).to(at::kBFloat16);
        const at::Tensor y = at::randn({s.b, s.t, s.d}, g).to(y_dt);
        const at::Tensor bias = at::randn({s.d}, g);
        const at::Tensor out = gated_residual(x, gate, y, bias);
        EXPECT_EQ(out.scalar_type(), x_dt);
        EXPECT_FALSE(out.isnan().any().item<bool>());
        EXPECT_TRUE(at::equal(out, gated_residual_reference(x, gate, y, bias)));
        EXPECT_TRUE(at::equal(out, gated_residual_reference(x, gate, y + bias)));
        EXPECT_FALSE(at::equal(out, gated_residual(x, gate, y)));  // the bias is not ignored
        EXPECT_TRUE(at::equal(gated_residual(x, gate, y, at::Tensor()), gated_residual(x, gate, y)));
        const at::Tensor bias16 = bias.to(at::kBFloat16);
        const at::Tensor y_plus_bias16 = y + bias16.to(at::kFloat);
        EXPECT_TRUE(at::equal(gated_residual(x, gate, y, bias16), gated_residual_reference(x, gate, y_plus_bias16)));
      }
    }
  }
}

// fp32, random upstream gradient, every input (bias included) differentiated,
// against x + gate * (y + bias) through expand. Tolerance (fp32, <= 18 terms
// per dbias sum): atol 1e-5 + rtol 1e-5. A bf16 bias gets a bf16 gradient.
TEST(GatedResidual, CpuBiasGradientsMatchComposition) {
  uint64_t seed = 300;
  for (const Shape& s : kShapes) {
    at::Generator g = gen(seed++);
    const at::Tensor x0 = at::randn({s.b, s.t, s.d}, g);
    const at::Tensor gate0 = at::randn({s.b, s.d}, g);
    const at::Tensor y0 = at::randn({s.b, s.t, s.d}, g);
    const at::Tensor bias0 = at::randn({s.d}, g);
    const at::Tensor dout = at::randn({s.b, s.t, s.d}, g);
    auto run = [&](bool ours) {
      return output_and_grads({x0, gate0, y0, bias0}, dout, [&](const std::vector<at::Tensor>& in) {
        return ours ? gated_residual(in[0], in[1], in[2], in[3])
                    : in[0] + in[1].view({s.b, 1, s.d}).expand({s.b, s.t, s.d}) *
                                  (in[2] + in[3].view({1, 1, s.d}).expand({s.b, s.t, s.d}));
      });
    };
    const auto ours = run(true), ref = run(false);
    const std::string where = shape_name(s);
    const char* names[] = {"out", "dx", "dgate", "dy", "dbias"};
    for (size_t i = 0; i < ours.size(); ++i) expect_close(ours[i], ref[i], 1e-5, 1e-5, where + names[i]);

    const at::Tensor bias16 = bias0.to(at::kBFloat16).requires_grad_(true);
    const at::Tensor db16 = torch::autograd::grad({gated_residual(x0, gate0, y0, bias16)}, {bias16}, {dout})[0];
    EXPECT_EQ(db16.scalar_type(), at::kBFloat16) << where;
  }
}

// The gate as a chunk of one [B, 6D] modulation tensor (row stride 6D).
TEST(GatedResidual, CpuStridedGateChunk) {
  at::Generator g = gen(7);
  const int64_t b = 3, t = 4, d = 40;
  const at::Tensor x = at::randn({b, t, d}, g);
  const at::Tensor y = at::randn({b, t, d}, g);
  const at::Tensor mod0 = at::randn({b, 6 * d}, g);
  const at::Tensor dout = at::randn({b, t, d}, g);
  auto run = [&](bool ours) {
    const at::Tensor mod = mod0.clone().requires_grad_(true);
    const at::Tensor gate = mod.chunk(6, 1)[2];
    const at::Tensor out = ours ? gated_residual(x, gate, y) : x + gate.unsqueeze(1) * y;
    return torch::autograd::grad({out}, {mod}, {dout})[0];
  };
  const at::Tensor ours = run(true), ref = run(false);
  expect_close(ours, ref, 1e-6, 1e-6, "dmod");
  EXPECT_EQ(ours.narrow(1, 0, 2 * d).abs().max().item<double>(), 0.0);
}

TEST(GatedResidual, BadInputsRaiseUsageError) {
  const at::Tensor x = at::randn({2, 3, 8});
  const at::Tensor gate = at::randn({2, 8});
  using testing::error_of;
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(at::randn({6, 8}), gate, at::randn({6, 8})); })
                .find("x must be [B, T, D]"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, gate, at::randn({2, 3, 9})); }).find("y must have"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, at::randn({3, 8}), x); }).find("gate must be"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, at::randn({2, 7}), x); }).find("gate must be"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x.to(at::kInt), gate, x); }).find("x must be float32"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, gate.to(at::kLong), x); }).find("gate must be float32"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, gate, x.to(at::kShort)); }).find("y must be float32"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, gate, x, at::randn({9})); }).find("bias must be [8]"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, gate, x, at::randn({1, 8})); }).find("bias must be [8]"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { gated_residual(x, gate, x, at::randn({8}).to(at::kInt)); })
                .find("bias must be float32"),
            std::string::npos);
}

}  // namespace
}  // namespace perftrain::ops
