// residual_rms_adaln on the CPU: the op is its reference, which is rms_adaln
// of y, the tanh-gated residual and rms_adaln of x1; its values and all six
// gradients agree with an independent composition through ATen's own
// at::rms_norm and at::tanh, with both outputs used and with only one, with
// and without the weights and the scale; undefined weights are ones and an
// undefined scale is zero; chunks of wider modulations get their gradients in
// place; bad inputs raise UsageError.
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "ops/residual_rms_adaln.h"
#include "ops/rms_adaln.h"
#include "support/row_op_checks.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using namespace perftrain::testing::row_ops::cpu;

std::optional<at::Tensor> opt(const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; }

// The independent composition: ATen's RMSNorm and tanh, broadcast through expand.
std::pair<at::Tensor, at::Tensor> composed(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                           const at::Tensor& pw, const at::Tensor& qw, const at::Tensor& scale,
                                           double eps) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const at::Tensor yn = at::rms_norm(y, {d}, opt(pw), eps);
  const at::Tensor x1 = x + at::tanh(gate).view({b, 1, d}).expand({b, t, d}) * yn;
  at::Tensor h = at::rms_norm(x1, {d}, opt(qw), eps);
  if (scale.defined()) h = h * (1 + scale.view({b, 1, d}).expand({b, t, d}));
  return {x1, h};
}

TEST(ResidualRmsAdaLN, CpuOpIsTheReference) {
  for_each_dtypes([](const Shape& s, at::ScalarType x_dt, at::ScalarType m_dt, at::ScalarType a_dt,
                     at::Generator& g) {
    const at::Tensor x = (at::randn({s.b, s.t, s.d}, g) * 2 + 0.5).to(x_dt);
    const at::Tensor gate = at::randn({s.b, s.d}, g).to(m_dt);
    const at::Tensor y = (at::randn({s.b, s.t, s.d}, g) * 3).to(a_dt);
    const at::Tensor pw = at::randn({s.d}, g) * 0.3 + 1, qw = at::randn({s.d}, g) * 0.3 + 1;
    const at::Tensor scale = (at::randn({s.b, s.d}, g) * 0.5).to(m_dt);
    const auto [x1, h] = residual_rms_adaln(x, gate, y, pw, qw, scale, a_dt);
    EXPECT_EQ(x1.scalar_type(), x_dt);
    EXPECT_EQ(h.scalar_type(), a_dt);
    const auto [x1_ref, h_ref] = residual_rms_adaln_reference(x, gate, y, pw, qw, scale, a_dt);
    EXPECT_TRUE(at::equal(x1, x1_ref)) << shape_name(s);
    EXPECT_TRUE(at::equal(h, h_ref)) << shape_name(s);
    // The reference is rms_adaln of y, the gated residual, rms_adaln of x1, bit for bit.
    const at::Tensor yn = rms_adaln_reference(y, pw, at::Tensor(), at::kFloat);
    const at::Tensor x1_parts = (x.to(at::kFloat) + at::tanh(gate.to(at::kFloat)).unsqueeze(1) * yn).to(x_dt);
    EXPECT_TRUE(at::equal(x1, x1_parts)) << shape_name(s);
    EXPECT_TRUE(at::equal(h, rms_adaln_reference(x1_parts, qw, scale, a_dt))) << shape_name(s);
    EXPECT_FALSE(x1.isnan().any().item<bool>() || h.isnan().any().item<bool>()) << shape_name(s);
  });
}

// Undefined weights are ones, an undefined scale is zero, bit for bit.
TEST(ResidualRmsAdaLN, CpuUndefinedWeightsAndScale) {
  at::Generator g = gen(30);
  const Shape s{2, 5, 72};
  const at::Tensor x = at::randn({s.b, s.t, s.d}, g), y = at::randn({s.b, s.t, s.d}, g) * 4;
  const at::Tensor gate = at::randn({s.b, s.d}, g), scale = at::randn({s.b, s.d}, g);
  const at::Tensor pw = at::randn({s.d}, g) + 1, qw = at::randn({s.d}, g) + 1;
  const at::Tensor ones = at::ones({s.d}), zeros = at::zeros({s.b, s.d});
  auto same = [](const std::pair<at::Tensor, at::Tensor>& a, const std::pair<at::Tensor, at::Tensor>& b) {
    return at::equal(a.first, b.first) && at::equal(a.second, b.second);
  };
  const at::Tensor u;
  EXPECT_TRUE(same(residual_rms_adaln(x, gate, y, u, qw, scale, at::kFloat),
                   residual_rms_adaln(x, gate, y, ones, qw, scale, at::kFloat)));
  EXPECT_TRUE(same(residual_rms_adaln(x, gate, y, pw, u, scale, at::kFloat),
                   residual_rms_adaln(x, gate, y, pw, ones, scale, at::kFloat)));
  EXPECT_TRUE(same(residual_rms_adaln(x, gate, y, pw, qw, u, at::kFloat),
                   residual_rms_adaln(x, gate, y, pw, qw, zeros, at::kFloat)));
  // And each one enters when given.
  const auto full = residual_rms_adaln(x, gate, y, pw, qw, scale, at::kFloat);
  EXPECT_FALSE(at::equal(full.first, residual_rms_adaln(x, gate, y, u, qw, scale, at::kFloat).first));
  EXPECT_FALSE(at::equal(full.second, residual_rms_adaln(x, gate, y, pw, u, scale, at::kFloat).second));
  EXPECT_FALSE(at::equal(full.second, residual_rms_adaln(x, gate, y, pw, qw, u, at::kFloat).second));
}

// fp32 throughout: op vs the composition, forward and all six gradients, with
// random upstream gradients for both outputs, for h only and for x1 only (then
// pre_weight and scale get no gradient); with all optional inputs and with
// none. Tolerance (fp32, D <= 1000 terms per row reduction, <= 18 rows per
// column sum): atol 1e-5 + rtol 1e-5.
TEST(ResidualRmsAdaLN, CpuMatchesCompositionForwardAndBackward) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    for (const Use use : kUses) {
      for (const bool with_opt : {true, false}) {
        at::Generator g = gen(seed++);
        const at::Tensor x0 = at::randn({s.b, s.t, s.d}, g) * 3 - 1;
        const at::Tensor gate0 = at::randn({s.b, s.d}, g);
        const at::Tensor y0 = at::randn({s.b, s.t, s.d}, g) * 2;
        const at::Tensor pw0 = at::randn({s.d}, g) * 0.5 + 1, qw0 = at::randn({s.d}, g) * 0.5 + 1;
        const at::Tensor scale0 = at::randn({s.b, s.d}, g) * 0.5;
        const at::Tensor dx1 = at::randn({s.b, s.t, s.d}, g), dh = at::randn({s.b, s.t, s.d}, g);
        auto run = [&](bool ours) {
          std::vector<at::Tensor> in = {x0.clone(), gate0.clone(), y0.clone()};
          if (with_opt) in.insert(in.end(), {pw0.clone(), qw0.clone(), scale0.clone()});
          for (at::Tensor& t : in) t.requires_grad_(true);
          const at::Tensor pw = with_opt ? in[3] : at::Tensor(), qw = with_opt ? in[4] : at::Tensor(),
                           scale = with_opt ? in[5] : at::Tensor();
          const auto [x1, h] = ours ? residual_rms_adaln(in[0], in[1], in[2], pw, qw, scale, at::kFloat)
                                    : composed(in[0], in[1], in[2], pw, qw, scale, 1e-6);
          return outputs_and_grads(x1, h, in, use, dx1, dh);
        };
        const auto ours = run(true), ref = run(false);
        const std::string where = shape_name(s) + std::string(testing::row_ops::name(use)) + " " +
                                  (with_opt ? "with weights and scale " : "without ");
        ASSERT_EQ(ours.size(), with_opt ? 8u : 5u) << where;
        const char* names[] = {"x1", "h", "dx", "dgate", "dy", "dpost_weight", "dpre_weight", "dscale"};
        for (size_t i = 0; i < ours.size(); ++i) {
          if (use == Use::kX1Only && (i == 6 || i == 7)) {
            EXPECT_FALSE(ours[i].defined() && ours[i].abs().max().item<double>() > 0) << where << names[i];
            continue;
          }
          ASSERT_TRUE(ours[i].defined()) << where << names[i];
          EXPECT_GT(ours[i].abs().max().item<double>(), 0.0) << where << names[i];
          expect_close(ours[i], ref[i], 1e-5, 1e-5, where + names[i]);
        }
      }
    }
  }
}

// As the model chains it: gate from block i's modulation, scale from block
// i+1's, both chunks of [B, 4D] tensors (row stride 4D); the gradients land in
// exactly those chunks.
TEST(ResidualRmsAdaLN, CpuStridedModulationChunks) {
  at::Generator g = gen(7);
  const int64_t b = 3, t = 4, d = 40;
  const at::Tensor x = at::randn({b, t, d}, g), y = at::randn({b, t, d}, g);
  const at::Tensor pw = at::randn({d}, g) + 1, qw = at::randn({d}, g) + 1;
  const at::Tensor mod_a0 = at::randn({b, 4 * d}, g) * 0.3, mod_b0 = at::randn({b, 4 * d}, g) * 0.3;
  const at::Tensor dx1 = at::randn({b, t, d}, g), dh = at::randn({b, t, d}, g);
  auto run = [&](bool ours) {
    const at::Tensor mod_a = mod_a0.clone().requires_grad_(true), mod_b = mod_b0.clone().requires_grad_(true);
    const auto ca = mod_a.chunk(4, 1), cb = mod_b.chunk(4, 1);
    EXPECT_EQ(ca[1].stride(0), 4 * d);
    const auto [x1, h] = ours ? residual_rms_adaln(x, ca[1], y, pw, qw, cb[2], at::kFloat)
                              : composed(x, ca[1], y, pw, qw, cb[2], 1e-6);
    return torch::autograd::grad({x1, h}, {mod_a, mod_b}, {dx1, dh});
  };
  const auto ours = run(true), ref = run(false);
  expect_close(ours[0], ref[0], 1e-5, 1e-5, "dmod of block i");
  expect_close(ours[1], ref[1], 1e-5, 1e-5, "dmod of block i+1");
  EXPECT_EQ(ours[0].narrow(1, 0, d).abs().max().item<double>(), 0.0);
  EXPECT_EQ(ours[0].narrow(1, 2 * d, 2 * d).abs().max().item<double>(), 0.0);
  EXPECT_GT(ours[0].narrow(1, d, d).abs().max().item<double>(), 0.0);
  EXPECT_EQ(ours[1].narrow(1, 0, 2 * d).abs().max().item<double>(), 0.0);
  EXPECT_EQ(ours[1].narrow(1, 3 * d, d).abs().max().item<double>(), 0.0);
  EXPECT_GT(ours[1].narrow(1, 2 * d, d).abs().max().item<double>(), 0.0);
}

TEST(ResidualRmsAdaLN, BadInputsRaiseUsageError) {
  const at::Tensor x = at::randn({2, 3, 8});
  const at::Tensor m = at::randn({2, 8}), w = at::randn({8});
  using testing::error_of;
  auto msg = [&](auto&& f) { return error_of<UsageError>(f); };
  auto has = [](const std::string& s, const char* part) {
    return s.find(part) != std::string::npos && s.find("residual_rms_adaln") != std::string::npos;
  };
  const auto f = at::kFloat;
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(at::randn({6, 8}), m, at::randn({6, 8}), w, w, m, f); }),
                  "x must be [B, T, D]"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, at::randn({2, 3, 9}), w, w, m, f); }), "y must have"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, at::randn({3, 8}), x, w, w, m, f); }), "gate must be [2, 8]"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, x, w, w, at::randn({2, 1, 8}), f); }), "scale must be"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, x, at::randn({7}), w, m, f); }), "post_weight must be [8]"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, x, w, at::randn({8, 1}), m, f); }), "pre_weight must be [8]"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, x, w, w.to(at::kLong), m, f); }), "pre_weight must be float32"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x.to(at::kInt), m, x, w, w, m, f); }), "x must be float32"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m.to(at::kLong), x, w, w, m, f); }), "gate must be float32"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, x.to(at::kDouble), w, w, m, f); }), "y must be float32"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, x, w, w, m, at::kInt); }), "out_dtype"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, at::Tensor(), x, w, w, m, f); }), "gate must be a defined"));
  EXPECT_TRUE(has(msg([&] { residual_rms_adaln(x, m, at::Tensor(), w, w, m, f); }), "y must be a defined"));
}

}  // namespace
}  // namespace perftrain::ops
