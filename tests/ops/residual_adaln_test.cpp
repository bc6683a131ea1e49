// residual_adaln on the CPU: the op is its reference (gated_residual then
// adaln_layernorm), and the reference's values and gradients agree with an
// independent composition through expand and at::layer_norm, with both
// outputs used and with only one of them used, with and without a bias; the
// bias is added to y; bad inputs raise UsageError.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "ops/adaln_layernorm.h"
#include "ops/gated_residual.h"
#include "ops/residual_adaln.h"
#include "support/row_op_checks.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using namespace perftrain::testing::row_ops::cpu;

// The independent composition: broadcast through expand, ATen's own LayerNorm.
std::pair<at::Tensor, at::Tensor> composed(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                           const at::Tensor& shift, const at::Tensor& scale, double eps,
                                           const at::Tensor& bias = at::Tensor()) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const at::Tensor yb = bias.defined() ? y + bias.view({1, 1, d}).expand({b, t, d}) : y;
  const at::Tensor x1 = x + gate.view({b, 1, d}).expand({b, t, d}) * yb;
  const at::Tensor h = at::layer_norm(x1, {d}, {}, {}, eps) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
  return {x1, h};
}

TEST(ResidualAdaLN, CpuOpIsTheReference) {
  for_each_dtypes([](const Shape& s, at::ScalarType x_dt, at::ScalarType m_dt, at::ScalarType a_dt,
                     at::Generator& g) {
    const at::Tensor x = (at::randn({s.b, s.t, s.d}, g) * 2 + 0.5).to(x_dt);
    const at::Tensor gate = at::randn({s.b, s.d}, g).to(m_dt);
    const at::Tensor y = at::randn({s.b, s.t, s.d}, g).to(a_dt);
    const at::Tensor shift = at::randn({s.b, s.d}, g).to(m_dt);
    const at::Tensor scale = (at::randn({s.b, s.d}, g) * 0.5).to(m_dt);
    const auto [x1, h] = residual_adaln(x, gate, y, shift, scale, a_dt);
    EXPECT_EQ(x1.scalar_type(), x_dt);
    EXPECT_EQ(h.scalar_type(), a_dt);
    // The reference is the two unfused references, bit for bit.
    const at::Tensor x1_ref = gated_residual_reference(x, gate, y);
    EXPECT_TRUE(at::equal(x1, x1_ref)) << shape_name(s);
    EXPECT_TRUE(at::equal(h, adaln_layernorm_reference(x1_ref, shift, scale, a_dt))) << shape_name(s);
    EXPECT_FALSE(x1.isnan().any().item<bool>() || h.isnan().any().item<bool>()) << shape_name(s);
  });
}

// The bias is added to y before the gate: with an fp32 bias the op (on the CPU,
// the reference) equals the reference without a bias on y + bias (formed in
// fp32 either way), bit for bit, for both outputs.
TEST(ResidualAdaLN, CpuBiasIsAddedToY) {
  uint64_t seed = 50;
  for (const Shape& s : kShapes) {
    for (const auto x_dt : {at::kFloat, at::kBFloat16}) {
      for (const auto a_dt : {at::kFloat, at::kBFloat16}) {  // y and h
        at::Generator g = gen(seed++);
        const at::Tensor x = (at::randn({s.b, s.t, s.d}, g) * 2 + 0.5).to(x_dt);
        const at::Tensor gate = at::randn({s.b, s.d}, g).to(at::kBFloat16);
        const at::Tensor y = at::randn({s.b, s.t, s.d}, g).to(a_dt);
        const at::Tensor shift = at::randn({s.b, s.d}, g).to(at::kBFloat16);
        const at::Tensor scale = (at::randn({s.b, s.d}, g) * 0.5).to(at::kBFloat16);
        const at::Tensor bias = at::randn({s.d}, g);
        const auto [x1, h] = residual_adaln(x, gate, y, shift, scale, a_dt, 1e-6, bias);
        EXPECT_EQ(x1.scalar_type(), x_dt);
        EXPECT_EQ(h.scalar_type(), a_dt);
        EXPECT_FALSE(x1.isnan().any().item<bool>() || h.isnan().any().item<bool>()) << shape_name(s);
        const auto [x1_ref, h_ref] = residual_adaln_reference(x, gate, y + bias, shift, scale, a_dt);
        EXPECT_TRUE(at::equal(x1, x1_ref)) << shape_name(s);
        EXPECT_TRUE(at::equal(h, h_ref)) << shape_name(s);
        EXPECT_TRUE(at::equal(x1, gated_residual_reference(x, gate, y, bias))) << shape_name(s);
        EXPECT_FALSE(at::equal(x1, residual_adaln(x, gate, y, shift, scale, a_dt).first)) << shape_name(s) << " bias ignored";
      }
    }
  }
}

// fp32 throughout: op vs the composition, forward and all five gradients
// (six with the bias), with random upstream gradients for both outputs, for h
// only (dx1_ext undefined) and for x1 only (dh undefined: shift and scale get
// no gradient). Tolerance (fp32, D <= 1000 terms per row reduction, <= 18 per
// column sum): atol 1e-5 + rtol 1e-5.
TEST(ResidualAdaLN, CpuMatchesCompositionForwardAndBackward) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    for (const Use use : kUses) {
      for (const bool with_bias : {false, true}) {
        at::Generator g = gen(seed++);
        const at::Tensor x0 = at::randn({s.b, s.t, s.d}, g) * 3 - 1;
        const at::Tensor gate0 = at::randn({s.b, s.d}, g);
        const at::Tensor y0 = at::randn({s.b, s.t, s.d}, g);
        const at::Tensor shift0 = at::randn({s.b, s.d}, g);
        const at::Tensor scale0 = at::randn({s.b, s.d}, g) * 0.5;
        const at::Tensor dx1 = at::randn({s.b, s.t, s.d}, g), dh = at::randn({s.b, s.t, s.d}, g);
        const at::Tensor bias0 = at::randn({s.d}, g);
        auto run = [&](bool ours) {
          std::vector<at::Tensor> in = {x0.clone(), gate0.clone(), y0.clone(), shift0.clone(), scale0.clone()};
          if (with_bias) in.push_back(bias0.clone());
          for (at::Tensor& t : in) t.requires_grad_(true);
          const at::Tensor bias = with_bias ? in[5] : at::Tensor();
          const auto [x1, h] = ours ? residual_adaln(in[0], in[1], in[2], in[3], in[4], at::kFloat, 1e-6, bias)
                                    : composed(in[0], in[1], in[2], in[3], in[4], 1e-6, bias);
          return outputs_and_grads(x1, h, in, use, dx1, dh);
        };
        const auto ours = run(true), ref = run(false);
        const std::string where = shape_name(s) + std::string(testing::row_ops::name(use)) + " " +
                                  (with_bias ? "with bias " : "");
        ASSERT_EQ(ours.size(), with_bias ? 8u : 7u) << where;
        const char* names[] = {"x1", "h", "dx", "dgate", "dy", "dshift", "dscale", "dbias"};
        for (size_t i = 0; i < ours.size(); ++i) {
          if (use == Use::kX1Only && (i == 5 || i == 6)) {
            EXPECT_FALSE(ours[i].defined()) << where << names[i] << ": h unused, so no gradient";
            EXPECT_FALSE(ref[i].defined()) << where << names[i];
            continue;
          }
          expect_close(ours[i], ref[i], 1e-5, 1e-5, where + names[i]);
        }
      }
    }
  }
}

// As the DiT model chains it: gate from block i's [B, 6D] modulation (chunk
// 5, gate_mlp), shift and scale from block i+1's (chunks 0 and 1): row stride
// 6D; the gradients land in exactly those chunks.
TEST(ResidualAdaLN, CpuStridedModulationChunks) {
  at::Generator g = gen(7);
  const int64_t b = 3, t = 4, d = 40;
  const at::Tensor x = at::randn({b, t, d}, g), y = at::randn({b, t, d}, g);
  const at::Tensor mod_a0 = at::randn({b, 6 * d}, g) * 0.3, mod_b0 = at::randn({b, 6 * d}, g) * 0.3;
  const at::Tensor dx1 = at::randn({b, t, d}, g), dh = at::randn({b, t, d}, g);
  auto run = [&](bool ours) {
    const at::Tensor mod_a = mod_a0.clone().requires_grad_(true), mod_b = mod_b0.clone().requires_grad_(true);
    const auto ca = mod_a.chunk(6, 1), cb = mod_b.chunk(6, 1);
    EXPECT_EQ(ca[5].stride(0), 6 * d);
    const auto [x1, h] = ours ? residual_adaln(x, ca[5], y, cb[0], cb[1], at::kFloat)
                              : composed(x, ca[5], y, cb[0], cb[1], 1e-6);
    return torch::autograd::grad({x1, h}, {mod_a, mod_b}, {dx1, dh});
  };
  const auto ours = run(true), ref = run(false);
  expect_close(ours[0], ref[0], 1e-5, 1e-5, "dmod of block i");
  expect_close(ours[1], ref[1], 1e-5, 1e-5, "dmod of block i+1");
  EXPECT_EQ(ours[0].narrow(1, 0, 5 * d).abs().max().item<double>(), 0.0);  // only gate_mlp
  EXPECT_EQ(ours[1].narrow(1, 2 * d, 4 * d).abs().max().item<double>(), 0.0);  // only shift/scale_msa
  EXPECT_GT(ours[0].narrow(1, 5 * d, d).abs().max().item<double>(), 0.0);
}

TEST(ResidualAdaLN, BadInputsRaiseUsageError) {
  const at::Tensor x = at::randn({2, 3, 8});
  const at::Tensor m = at::randn({2, 8});
  using testing::error_of;
  auto msg = [&](auto&& f) { return error_of<UsageError>(f); };
  auto has = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };
  EXPECT_TRUE(has(msg([&] { residual_adaln(at::randn({6, 8}), m, at::randn({6, 8}), m, m, at::kFloat); }),
                  "x must be [B, T, D]"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, at::randn({2, 3, 9}), m, m, at::kFloat); }), "y must have"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, at::randn({3, 8}), x, m, m, at::kFloat); }), "gate must be [2, 8]"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, x, at::randn({2, 7}), m, at::kFloat); }), "shift must be"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, x, m, at::randn({2, 1, 8}), at::kFloat); }), "scale must be"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x.to(at::kInt), m, x, m, m, at::kFloat); }), "x must be float32"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m.to(at::kLong), x, m, m, at::kFloat); }), "gate must be float32"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, x.to(at::kDouble), m, m, at::kFloat); }), "y must be float32"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, x, m, m, at::kInt); }), "out_dtype"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, x, at::Tensor(), m, at::kFloat); }), "defined"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, x, m, m, at::kFloat, 1e-6, at::randn({7})); }), "bias must be [8]"));
  EXPECT_TRUE(has(msg([&] { residual_adaln(x, m, x, m, m, at::kFloat, 1e-6, m); }), "bias must be [8]"));
  EXPECT_TRUE(
      has(msg([&] { residual_adaln(x, m, x, m, m, at::kFloat, 1e-6, at::randn({8}).to(at::kLong)); }), "bias must be"));
}

}  // namespace
}  // namespace perftrain::ops
