// rms_adaln on the CPU: the op is its reference; the reference's values and
// gradients (x, weight, scale) agree with an independent composition through
// ATen's own at::rms_norm, with and without the weight and the scale; an
// undefined weight is ones and an undefined scale is zero; a chunk of a wider
// modulation gets its gradient in place; bad inputs raise UsageError.
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "ops/rms_adaln.h"
#include "support/row_op_checks.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
using namespace perftrain::testing::row_ops::cpu;

// The independent composition: ATen's RMSNorm with the weight, then the scale.
at::Tensor composed(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale, double eps) {
  const std::optional<at::Tensor> w = weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt;
  const at::Tensor n = at::rms_norm(x, {x.size(2)}, w, eps);
  return scale.defined() ? n * (1 + scale.unsqueeze(1)) : n;
}

TEST(RmsAdaLN, CpuOpIsTheReference) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    for (const auto x_dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const auto m_dt : {at::kFloat, at::kBFloat16}) {
        for (const auto out_dt : {at::kFloat, at::kBFloat16}) {
          at::Generator g = gen(seed++);
          const at::Tensor x = (at::randn({s.b, s.t, s.d}, g) * 2 + 0.5).to(x_dt);
          const at::Tensor w = (at::randn({s.d}, g) * 0.3 + 1).to(m_dt);
          const at::Tensor scale = (at::randn({s.b, s.d}, g) * 0.5).to(m_dt);
          const at::Tensor h = rms_adaln(x, w, scale, out_dt);
          EXPECT_EQ(h.scalar_type(), out_dt);
          EXPECT_EQ(h.sizes(), x.sizes());
          EXPECT_TRUE(at::equal(h, rms_adaln_reference(x, w, scale, out_dt))) << shape_name(s);
          EXPECT_FALSE(h.isnan().any().item<bool>()) << shape_name(s);
          // The weight and the scale enter: dropping either changes the result.
          EXPECT_FALSE(at::equal(h, rms_adaln(x, at::Tensor(), scale, out_dt))) << shape_name(s) << " weight ignored";
          EXPECT_FALSE(at::equal(h, rms_adaln(x, w, at::Tensor(), out_dt))) << shape_name(s) << " scale ignored";
        }
      }
    }
  }
}

// An undefined weight is ones and an undefined scale is zero, bit for bit
// (both multiply by exactly 1).
TEST(RmsAdaLN, CpuUndefinedWeightAndScale) {
  at::Generator g = gen(20);
  const Shape s{2, 5, 72};
  const at::Tensor x = at::randn({s.b, s.t, s.d}, g) * 3;
  const at::Tensor w = at::randn({s.d}, g), scale = at::randn({s.b, s.d}, g);
  const at::Tensor ones = at::ones({s.d}), zeros = at::zeros({s.b, s.d});
  EXPECT_TRUE(at::equal(rms_adaln(x, at::Tensor(), scale, at::kFloat), rms_adaln(x, ones, scale, at::kFloat)));
  EXPECT_TRUE(at::equal(rms_adaln(x, w, at::Tensor(), at::kFloat), rms_adaln(x, w, zeros, at::kFloat)));
  const at::Tensor plain = rms_adaln(x, at::Tensor(), at::Tensor(), at::kFloat);
  // Without either, rows have mean square 1 (eps aside).
  expect_close((plain * plain).mean({-1}), at::ones({s.b, s.t}), 1e-4, 1e-4, "mean square of rms(x)");
}

// fp32 throughout: op vs the composition, forward and the gradients of x,
// weight and scale, for each of weight and scale present or absent.
// Tolerance (fp32, D <= 1000 terms per row reduction, <= 18 rows per column
// sum): atol 1e-5 + rtol 1e-5.
TEST(RmsAdaLN, CpuMatchesCompositionForwardAndBackward) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    for (const bool with_w : {false, true}) {
      for (const bool with_scale : {false, true}) {
        at::Generator g = gen(seed++);
        const at::Tensor x0 = at::randn({s.b, s.t, s.d}, g) * 3 - 1;
        const at::Tensor w0 = at::randn({s.d}, g) * 0.5 + 1;
        const at::Tensor scale0 = at::randn({s.b, s.d}, g) * 0.5;
        const at::Tensor dh = at::randn({s.b, s.t, s.d}, g);
        std::vector<at::Tensor> inputs = {x0};
        if (with_w) inputs.push_back(w0);
        if (with_scale) inputs.push_back(scale0);
        auto run = [&](bool ours) {
          return output_and_grads(inputs, dh, [&](const std::vector<at::Tensor>& in) {
            const at::Tensor w = with_w ? in[1] : at::Tensor(), scale = with_scale ? in.back() : at::Tensor();
            return ours ? rms_adaln(in[0], w, scale, at::kFloat) : composed(in[0], w, scale, 1e-6);
          });
        };
        const auto ours = run(true), ref = run(false);
        const std::string where = shape_name(s) + (with_w ? "weight " : "") + (with_scale ? "scale " : "");
        ASSERT_EQ(ours.size(), ref.size()) << where;
        ASSERT_EQ(ours.size(), size_t(2 + with_w + with_scale)) << where;
        const char* names[] = {"h", "dx", with_w ? "dweight" : "dscale", "dscale"};
        for (size_t i = 0; i < ours.size(); ++i) {
          ASSERT_TRUE(ours[i].defined()) << where << names[i];
          EXPECT_GT(ours[i].abs().max().item<double>(), 0.0) << where << names[i];
          expect_close(ours[i], ref[i], 1e-5, 1e-5, where + names[i]);
        }
      }
    }
  }
}

// As the model takes it: scale a chunk of a [B, 3D] modulation (row stride
// 3D); the gradient lands in exactly that chunk.
TEST(RmsAdaLN, CpuStridedScaleChunk) {
  at::Generator g = gen(7);
  const int64_t b = 3, t = 4, d = 40;
  const at::Tensor x = at::randn({b, t, d}, g), w = at::randn({d}, g) + 1;
  const at::Tensor mod0 = at::randn({b, 3 * d}, g) * 0.3;
  const at::Tensor dh = at::randn({b, t, d}, g);
  auto run = [&](bool ours) {
    const at::Tensor mod = mod0.clone().requires_grad_(true);
    const auto c = mod.chunk(3, 1);
    EXPECT_EQ(c[1].stride(0), 3 * d);
    const at::Tensor h = ours ? rms_adaln(x, w, c[1], at::kFloat) : composed(x, w, c[1], 1e-6);
    return torch::autograd::grad({h}, {mod}, {dh})[0];
  };
  const at::Tensor ours = run(true), ref = run(false);
  expect_close(ours, ref, 1e-5, 1e-5, "dmod");
  EXPECT_EQ(ours.narrow(1, 0, d).abs().max().item<double>(), 0.0);
  EXPECT_EQ(ours.narrow(1, 2 * d, d).abs().max().item<double>(), 0.0);
  EXPECT_GT(ours.narrow(1, d, d).abs().max().item<double>(), 0.0);
}

TEST(RmsAdaLN, BadInputsRaiseUsageError) {
  const at::Tensor x = at::randn({2, 3, 8});
  const at::Tensor m = at::randn({2, 8}), w = at::randn({8});
  using testing::error_of;
  auto msg = [&](auto&& f) { return error_of<UsageError>(f); };
  auto has = [](const std::string& s, const char* part) {
    return s.find(part) != std::string::npos && s.find("rms_adaln") != std::string::npos;
  };
  EXPECT_TRUE(has(msg([&] { rms_adaln(at::randn({6, 8}), w, m, at::kFloat); }), "x must be [B, T, D]"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x, w, at::randn({3, 8}), at::kFloat); }), "scale must be [2, 8]"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x, w, at::randn({2, 1, 8}), at::kFloat); }), "scale must be"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x, at::randn({7}), m, at::kFloat); }), "weight must be [8]"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x, at::randn({1, 8}), m, at::kFloat); }), "weight must be [8]"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x, w.to(at::kInt), m, at::kFloat); }), "weight must be float32"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x.to(at::kInt), w, m, at::kFloat); }), "x must be float32"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x, w, m.to(at::kLong), at::kFloat); }), "scale must be float32"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(x, w, m, at::kInt); }), "out_dtype"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(at::Tensor(), w, m, at::kFloat); }), "defined"));
  EXPECT_TRUE(has(msg([&] { rms_adaln(at::randn({2, 3, 0}), at::Tensor(), at::Tensor(), at::kFloat); }), "D >= 1"));
}

}  // namespace
}  // namespace perftrain::ops
