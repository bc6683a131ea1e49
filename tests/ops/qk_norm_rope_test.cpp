// qk_norm_rope on the CPU: the op is its reference, and the reference's
// values and gradients agree with an independent composition (the RMSNorm
// through the vector norm, the rotation as a complex product), at the head
// dims the models use and at odd token counts, with and without weights;
// q | k is read from the projection's [B, T, 3D] output in place, v is no
// input (its gradient is zero through the op); a strided view is taken as
// it is; bad inputs raise UsageError naming the op.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/complex.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/view_as_complex.h>
#include <ATen/ops/view_as_real.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "ops/qk_norm_rope.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
at::Generator gen(uint64_t seed) { return perftrain::testing::seeded_cpu_generator(seed); }

struct Case {
  int64_t b, t, heads, hd;
};
// The head dims the models use, odd token counts, one token.
const std::vector<Case> kCases = {{2, 5, 3, 32}, {1, 7, 2, 64}, {2, 3, 4, 72},  {1, 9, 2, 96},
                                  {1, 4, 2, 128}, {1, 1, 3, 64}, {1, 257, 1, 72}, {2, 288, 1, 8}};

std::string name(const Case& c) {
  return "B=" + std::to_string(c.b) + " T=" + std::to_string(c.t) + " H=" + std::to_string(c.heads) +
         " hd=" + std::to_string(c.hd) + " ";
}

// cos, sin [T, hd/2] of random angles (any table must do, not only rope_tables').
std::pair<at::Tensor, at::Tensor> tables(int64_t t, int64_t hd, at::Generator& g, at::ScalarType dt = at::kFloat) {
  const at::Tensor a = (at::rand({t, hd / 2}, g, at::kDouble) * 2 - 1) * 3 * M_PI;
  return {a.cos().to(dt), a.sin().to(dt)};
}

// q | k of a packed [B, T, 3D]: the first 2D columns, a view (the projection's layout).
at::Tensor qk_of(const at::Tensor& qkv) { return qkv.narrow(2, 0, qkv.size(2) / 3 * 2); }

// The op's q and k side by side, [B, T, 2D].
at::Tensor joined(const std::array<at::Tensor, 2>& qk) { return at::cat({qk[0], qk[1]}, 2); }

// The independent composition: RMSNorm as x * sqrt(hd) / sqrt(|x|^2 + hd * eps),
// the pair rotation as the complex product (x0 + i x1) (c + i s). qk [B, T, 2D]
// -> [B, T, 2D].
at::Tensor composition(const at::Tensor& qk, int64_t heads, const at::Tensor& qw, const at::Tensor& kw,
                       const at::Tensor& cos, const at::Tensor& sin, double eps) {
  const int64_t b = qk.size(0), t = qk.size(1), d = qk.size(2) / 2, hd = d / heads;
  const auto parts = qk.reshape({b, t, 2, heads, hd}).permute({2, 0, 3, 1, 4}).unbind(0);  // [B, H, T, hd]
  const at::Tensor rot = at::complex(cos, sin);                                             // [T, hd/2]
  auto one = [&](const at::Tensor& x, const at::Tensor& w) {
    const at::Tensor sq = at::linalg_vector_norm(x, 2, {-1}, /*keepdim=*/true).pow(2);
    at::Tensor n = x * std::sqrt(double(hd)) / at::sqrt(sq + double(hd) * eps);
    if (w.defined()) n = n * w;
    const at::Tensor z = at::view_as_complex(n.reshape({b, heads, t, hd / 2, 2}).contiguous()) * rot;
    return at::view_as_real(z).reshape({b, heads, t, hd});
  };
  const at::Tensor q = one(parts[0], qw), k = one(parts[1], kw);
  // [2, B, H, T, hd] -> [B, T, 2, H, hd] -> [B, T, 2D]
  return at::stack({q, k}, 0).permute({1, 3, 0, 2, 4}).reshape({b, t, 2 * d});
}

TEST(QkNormRope, CpuOpIsTheReference) {
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    for (const auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      at::Generator g = gen(seed++);
      const int64_t d = c.heads * c.hd;
      const at::Tensor qkv = at::randn({c.b, c.t, 3 * d}, g).to(dt);
      const at::Tensor qw = (at::randn({c.hd}, g) * 0.3 + 1).to(dt), kw = at::randn({c.hd}, g);
      const auto [cos, sin] = tables(c.t, c.hd, g);
      const auto out = qk_norm_rope(qk_of(qkv), c.heads, qw, kw, cos, sin);
      const auto ref = qk_norm_rope_reference(qk_of(qkv), c.heads, qw, kw, cos, sin);
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(out[i].scalar_type(), dt) << name(c);
        EXPECT_EQ(out[i].sizes(), at::IntArrayRef({c.b, c.t, d})) << name(c);
        EXPECT_TRUE(at::equal(out[i], ref[i])) << name(c);
        EXPECT_FALSE(out[i].isnan().any().item<bool>()) << name(c);
      }
    }
  }
}

// Values and gradients of the projection's output (q | k, and v: zero),
// q_weight, k_weight against the composition on a random upstream gradient,
// in fp32 (tolerance atol 1e-5 + rtol 1e-5: a norm over <= 128 terms, weight
// sums over <= 4 * 288 rows) and in fp64 through the reference (atol 1e-10 +
// rtol 1e-10: the two formulas only).
TEST(QkNormRope, ReferenceMatchesCompositionForwardAndBackward) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    for (const auto dt : {at::kFloat, at::kDouble}) {
      for (const bool weights : {true, false}) {
        at::Generator g = gen(seed++);
        const int64_t d = c.heads * c.hd;
        const at::Tensor qkv0 = at::randn({c.b, c.t, 3 * d}, g, dt) * 1.7 + 0.2;
        const at::Tensor qw0 = at::randn({c.hd}, g, dt) * 0.5 + 1, kw0 = at::randn({c.hd}, g, dt) * 0.5 + 1;
        const auto [cos, sin] = tables(c.t, c.hd, g, dt);
        const at::Tensor dout = at::randn({c.b, c.t, 2 * d}, g, dt);
        const double eps = 1e-6;
        auto run = [&](bool ours) {
          const at::Tensor qkv = qkv0.clone().requires_grad_(true);
          const at::Tensor qw = weights ? qw0.clone().requires_grad_(true) : at::Tensor();
          const at::Tensor kw = weights ? kw0.clone().requires_grad_(true) : at::Tensor();
          std::vector<at::Tensor> inputs = {qkv};
          if (weights) inputs.insert(inputs.end(), {qw, kw});
          std::vector<at::Tensor> res;
          if (ours) {
            const auto out = dt == at::kFloat ? qk_norm_rope(qk_of(qkv), c.heads, qw, kw, cos, sin, eps)
                                              : qk_norm_rope_reference(qk_of(qkv), c.heads, qw, kw, cos, sin, eps);
            res.push_back(joined(out).detach());
            for (const at::Tensor& gr : torch::autograd::grad({out[0], out[1]}, inputs,
                                                              {dout.narrow(2, 0, d), dout.narrow(2, d, d)}))
              res.push_back(gr);
          } else {
            const at::Tensor out = composition(qk_of(qkv), c.heads, qw, kw, cos, sin, eps);
            res.push_back(out.detach());
            for (const at::Tensor& gr : torch::autograd::grad({out}, inputs, {dout})) res.push_back(gr);
          }
          return res;
        };
        const auto ours = run(true), ref = run(false);
        const double tol = dt == at::kFloat ? 1e-5 : 1e-10;
        const std::string where = name(c) + c10::toString(dt) + (weights ? " weights " : " no weights ");
        ASSERT_EQ(ours.size(), ref.size());
        EXPECT_EQ(ours[0].scalar_type(), dt);
        expect_close(ours[0], ref[0], tol, tol, where + "out");
        expect_close(ours[1], ref[1], tol, tol, where + "dqkv");
        // v is no input: its part of the projection's gradient is zero.
        EXPECT_TRUE(at::equal(ours[1].narrow(2, 2 * d, d), at::zeros({c.b, c.t, d}, dt))) << where;
        if (weights) {
          expect_close(ours[2], ref[2], tol * 10, tol, where + "dq_weight");
          expect_close(ours[3], ref[3], tol * 10, tol, where + "dk_weight");
        }
      }
    }
  }
}

// Undefined weights are ones; a q weight changes only the q part.
TEST(QkNormRope, UndefinedWeightsAreOnes) {
  at::Generator g = gen(7);
  const int64_t b = 2, t = 11, heads = 3, hd = 72, d = heads * hd;
  const at::Tensor qk = at::randn({b, t, 2 * d}, g);
  const auto [cos, sin] = tables(t, hd, g);
  const at::Tensor ones = at::ones({hd});
  const auto none = qk_norm_rope(qk, heads, at::Tensor(), at::Tensor(), cos, sin);
  EXPECT_TRUE(at::equal(joined(none), joined(qk_norm_rope(qk, heads, ones, ones, cos, sin))));
  const at::Tensor qw = at::randn({hd}, g);
  const auto with_q = qk_norm_rope(qk, heads, qw, at::Tensor(), cos, sin);
  EXPECT_FALSE(at::equal(with_q[0], none[0]));
  EXPECT_TRUE(at::equal(with_q[1], none[1]));
}

// At angle 0 (cos 1, sin 0) the op is the RMSNorm alone: each head of q and k
// has mean square 1 (eps = 0).
TEST(QkNormRope, ZeroAngleIsTheNormAlone) {
  at::Generator g = gen(8);
  const int64_t b = 1, t = 6, heads = 2, hd = 64, d = heads * hd;
  const at::Tensor qkv = at::randn({b, t, 3 * d}, g) * 5;
  const at::Tensor cos = at::ones({t, hd / 2}), sin = at::zeros({t, hd / 2});
  const at::Tensor out = joined(qk_norm_rope(qk_of(qkv), heads, at::Tensor(), at::Tensor(), cos, sin, 0.0));
  const at::Tensor ms = out.reshape({b, t, 2 * heads, hd}).pow(2).mean(-1);
  expect_close(ms, at::ones_like(ms), 1e-5, 0, "mean square");
}

// A view of a wider tensor (the last dimension contiguous) gives what its copy gives.
TEST(QkNormRope, StridedViewInput) {
  at::Generator g = gen(9);
  const int64_t b = 2, t = 5, heads = 2, hd = 32, d = heads * hd;
  const at::Tensor wide = at::randn({b, t, 3 * d + 10}, g);
  const at::Tensor view = wide.narrow(2, 4, 2 * d);
  const auto [cos, sin] = tables(t, hd, g);
  const at::Tensor w = at::randn({hd}, g);
  EXPECT_TRUE(at::equal(joined(qk_norm_rope(view, heads, w, w, cos, sin)),
                        joined(qk_norm_rope(view.contiguous(), heads, w, w, cos, sin))));
}

void expect_usage_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("qk_norm_rope"), std::string::npos) << what << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a UsageError: " << e.what();
  }
}

TEST(QkNormRope, BadInputsAreUsageErrors) {
  at::Generator g = gen(10);
  const int64_t b = 2, t = 5, heads = 2, hd = 8, d = heads * hd;
  const at::Tensor qk = at::randn({b, t, 2 * d}, g);  // q | k
  const auto [cos, sin] = tables(t, hd, g);
  const at::Tensor w = at::randn({hd}, g);
  const at::Tensor u;
  // Sanity: the good call works.
  EXPECT_NO_THROW(qk_norm_rope(qk, heads, w, w, cos, sin));
  expect_usage_error([&] { qk_norm_rope(u, heads, w, w, cos, sin); }, "undefined qk");
  expect_usage_error([&] { qk_norm_rope(qk.view({b * t, 2 * d}), heads, w, w, cos, sin); }, "2-D qk");
  expect_usage_error([&] { qk_norm_rope(qk.narrow(2, 0, 2 * d - 1), heads, w, w, cos, sin); }, "2D odd");
  expect_usage_error([&] { qk_norm_rope(qk, 3, w, w, cos, sin); }, "heads not dividing D");
  expect_usage_error([&] { qk_norm_rope(qk, 0, w, w, cos, sin); }, "zero heads");
  expect_usage_error([&] { qk_norm_rope(at::randn({b, t, 2 * 6}, g), 2, u, u, cos.narrow(1, 0, 1), sin.narrow(1, 0, 1)); },
                     "odd head dim");
  expect_usage_error([&] { qk_norm_rope(qk.to(at::kDouble), heads, w, w, cos, sin); }, "float64 qk");
  expect_usage_error([&] { qk_norm_rope(qk.to(at::kInt), heads, w, w, cos, sin); }, "int qk");
  expect_usage_error([&] { qk_norm_rope(qk, heads, at::randn({hd + 2}, g), w, cos, sin); }, "q_weight size");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, at::randn({1, hd}, g), cos, sin); }, "k_weight 2-D");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, w.to(at::kInt), cos, sin); }, "int k_weight");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, w, u, sin); }, "undefined cos");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, w, cos.narrow(0, 0, t - 1), sin); }, "cos rows");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, w, cos, sin.narrow(1, 0, hd / 2 - 1)); }, "sin cols");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, w, cos.to(at::kBFloat16), sin); }, "bf16 cos");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, w, cos, sin.to(at::kDouble)); }, "fp64 sin in the op");
  expect_usage_error([&] { qk_norm_rope(qk, heads, w, w, cos, sin, -1.0); }, "negative eps");
}

}  // namespace
}  // namespace perftrain::ops
