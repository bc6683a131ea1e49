// ops::gelu_mlp on the CPU: the op (its reference there) agrees with an
// independent float64 composition (tanh-GELU and its derivative written out)
// forward and backward; the autograd function itself (hand-written backward
// through the ATen fallbacks) agrees with the reference in fp32 and bf16,
// including hidden widths cuBLASLt's GELU epilogue could not take; bad
// inputs raise UsageError.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/gelu_mlp.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
at::Generator gen(uint64_t seed) { return perftrain::testing::seeded_cpu_generator(seed); }

// ||got - ref|| / ||ref|| below tol; a NaN anywhere fails.
void expect_rel_l2(const at::Tensor& got, const at::Tensor& ref, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": undefined";
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  const at::Tensor g = got.to(at::kDouble), r = ref.to(at::kDouble);
  EXPECT_FALSE(g.isnan().any().item<bool>()) << what << ": NaN in the result";
  const double err = (g - r).norm().item<double>() / r.norm().item<double>();
  EXPECT_LT(err, tol) << what << ": relative L2 error";
}

// x's shape (leading dims + C), hidden width H, output width D.
struct Shape {
  std::vector<int64_t> x;
  int64_t h, d;
};
// H = 20 and 13 are not multiples of 8 (no fused GELU on CUDA), 24 and 64 are.
const std::vector<Shape> kShapes = {
    {{1, 37}, 24, 13}, {{7, 40}, 20, 40}, {{2, 3, 37}, 13, 5}, {{4, 5, 64}, 256, 64}, {{33, 16}, 64, 16}};

std::string name(const Shape& s) {
  std::string r = "x [";
  for (size_t i = 0; i < s.x.size(); ++i) r += (i ? "," : "") + std::to_string(s.x[i]);
  return r + "] H=" + std::to_string(s.h) + " D=" + std::to_string(s.d) + " ";
}

struct Inputs {
  at::Tensor x, w1, b1, w2, b2, dy;
  std::vector<at::Tensor> params() const { return {x, w1, b1, w2, b2}; }
};

// Scaled so the pre-activation ~ N(0, 1.5^2) spans GELU's curved region.
Inputs make_inputs(const Shape& s, uint64_t seed) {
  at::Generator g = gen(seed);
  const int64_t c = s.x.back();
  Inputs in;
  in.x = at::randn(s.x, g) + 0.2;
  in.w1 = at::randn({s.h, c}, g) * (1.5 / std::sqrt(double(c)));
  in.b1 = at::randn({s.h}, g) * 0.5;
  in.w2 = at::randn({s.d, s.h}, g) / std::sqrt(double(s.h));
  in.b2 = at::randn({s.d}, g);
  std::vector<int64_t> ys = s.x;
  ys.back() = s.d;
  in.dy = at::randn(ys, g);
  return in;
}

// {y, dx, dW1, db1, dW2, db2} of f with upstream gradient in.dy.
template <class F>
std::vector<at::Tensor> run(F f, const Inputs& in) {
  std::vector<at::Tensor> p;
  for (const auto& t : in.params()) p.push_back(t.clone().requires_grad_(true));
  const at::Tensor y = f(p[0], p[1], p[2], p[3], p[4]);
  const auto grads = torch::autograd::grad({y}, p, {in.dy.to(y.scalar_type())});
  std::vector<at::Tensor> out = {y.detach()};
  for (const auto& g : grads) out.push_back(g);
  return out;
}

// float64, not through ATen's gelu or linear: the tanh form and its
// derivative written out, gradients by the chain rule by hand.
std::vector<at::Tensor> float64_oracle(const Inputs& in) {
  auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  const at::Tensor x = d(in.x), w1 = d(in.w1), b1 = d(in.b1), w2 = d(in.w2), b2 = d(in.b2), dy = d(in.dy);
  const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
  const at::Tensor pre = at::matmul(x, w1.t()) + b1;
  const at::Tensor u = (pre + pre * pre * pre * k1) * k0;
  const at::Tensor t = at::tanh(u);
  const at::Tensor act = pre * 0.5 * (t + 1.0);
  const at::Tensor y = at::matmul(act, w2.t()) + b2;
  const at::Tensor dgelu = (t + 1.0) * 0.5 + pre * 0.5 * (1.0 - t * t) * k0 * (1.0 + pre * pre * (3.0 * k1));
  const at::Tensor dact = at::matmul(dy, w2);
  const at::Tensor dpre = dact * dgelu;
  const int64_t c = x.size(-1), h = w1.size(0), dd = w2.size(0);
  const at::Tensor x2 = x.reshape({-1, c}), act2 = act.reshape({-1, h}), dpre2 = dpre.reshape({-1, h}),
                   dy2 = dy.reshape({-1, dd});
  return {y, at::matmul(dpre, w1), at::matmul(dpre2.t(), x2), dpre2.sum(0), at::matmul(dy2.t(), act2), dy2.sum(0)};
}

const char* kWhat[] = {"y", "dx", "dW1", "db1", "dW2", "db2"};

auto op = [](auto& x, auto& w1, auto& b1, auto& w2, auto& b2) { return gelu_mlp(x, w1, b1, w2, b2); };
auto fn = [](auto& x, auto& w1, auto& b1, auto& w2, auto& b2) { return detail::gelu_mlp_function(x, w1, b1, w2, b2); };
auto ref = [](auto& x, auto& w1, auto& b1, auto& w2, auto& b2) { return gelu_mlp_reference(x, w1, b1, w2, b2); };
auto fn_pre_only = [](auto& x, auto& w1, auto& b1, auto& w2, auto& b2) {
  return detail::gelu_mlp_function(x, w1, b1, w2, b2, /*keep_activation=*/false);
};

// fp32 on the CPU against float64, <= 256 terms per dot product:
// atol 2e-5 + rtol 2e-5.
TEST(GeluMlp, CpuOpMatchesFloat64ForwardAndBackward) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    const Inputs in = make_inputs(s, seed++);
    const auto got = run(op, in);
    const auto want = float64_oracle(in);
    EXPECT_EQ(got[0].scalar_type(), at::kFloat);
    for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], 2e-5, 2e-5, name(s) + kWhat[i]);
  }
}

TEST(GeluMlp, CpuOpIsTheReferenceInXsDtype) {
  const Inputs in = make_inputs({{3, 5, 37}, 24, 13}, 7);
  const at::Tensor xb = in.x.to(at::kBFloat16);
  const at::Tensor y = gelu_mlp(xb, in.w1, in.b1, in.w2, in.b2);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 13}));
  EXPECT_TRUE(at::equal(y, gelu_mlp_reference(xb, in.w1, in.b1, in.w2, in.b2).to(at::kBFloat16)));
}

// The autograd function with its hand-written backward, fp32: same
// tolerance as above.
TEST(GeluMlp, CpuFunctionMatchesReferenceFp32) {
  uint64_t seed = 100;
  const int64_t fallbacks = gemm_fallback_count();
  for (const Shape& s : kShapes) {
    const Inputs in = make_inputs(s, seed++);
    const auto got = run(fn, in);
    const auto want = run(ref, in);
    for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], 2e-5, 2e-5, name(s) + kWhat[i]);
  }
  EXPECT_EQ(gemm_fallback_count(), fallbacks) << "the CPU path is not a cuBLASLt fallback";
}

// bf16 activations, fp32 master parameters. The reference sees the same bf16
// x, weights and dy, but keeps the hidden activation in fp32 where the
// function rounds pre and act to bf16 (rel 2^-9 each) before fc2 and the
// weight gradients. The weight gradients sum M random-signed terms, so an
// element can be near zero while its rounding error is not: compare whole
// tensors, relative L2 error < 1e-2 (expected ~2^-8; a wrong formula is O(1)).
TEST(GeluMlp, CpuFunctionMatchesReferenceBf16WithFp32Master) {
  uint64_t seed = 200;
  for (const Shape& s : kShapes) {
    Inputs in = make_inputs(s, seed++);
    in.x = in.x.to(at::kBFloat16);
    in.dy = in.dy.to(at::kBFloat16);
    in.w1 = in.w1.to(at::kBFloat16).to(at::kFloat);
    in.w2 = in.w2.to(at::kBFloat16).to(at::kFloat);
    const auto got = run(fn, in);
    Inputs in32 = in;
    in32.x = in.x.to(at::kFloat);
    in32.dy = in.dy.to(at::kFloat);
    const auto want = run(ref, in32);
    EXPECT_EQ(got[0].scalar_type(), at::kBFloat16);
    EXPECT_EQ(got[1].scalar_type(), at::kBFloat16) << "dx in x's dtype";
    for (size_t i = 2; i < got.size(); ++i) EXPECT_EQ(got[i].scalar_type(), at::kFloat) << kWhat[i];
    for (size_t i = 0; i < got.size(); ++i) expect_rel_l2(got[i], want[i], 1e-2, name(s) + kWhat[i]);
  }
}

// Keeping only the pre-activation and computing GELU again for dW2 gives the
// same numbers: on the CPU both paths run the same ATen GELU, so bit for bit
// (fp32 and bf16), including dW2 alone (fc1 frozen: pre kept only for it).
TEST(GeluMlp, CpuFunctionSavingOnlyThePreActivationIsBitIdentical) {
  uint64_t seed = 400;
  for (const auto dt : {at::kFloat, at::kBFloat16}) {
    for (const Shape& s : kShapes) {
      Inputs in = make_inputs(s, seed++);
      in.x = in.x.to(dt);
      in.dy = in.dy.to(dt);
      const auto kept = run(fn, in);
      const auto again = run(fn_pre_only, in);
      const at::Tensor w2 = in.w2.clone().requires_grad_(true);
      const at::Tensor y = detail::gelu_mlp_function(in.x, in.w1, in.b1, w2, in.b2, /*keep_activation=*/false);
      const at::Tensor dw2_alone = torch::autograd::grad({y}, {w2}, {in.dy})[0];
      for (size_t i = 0; i < kept.size(); ++i)
        EXPECT_TRUE(at::equal(kept[i], again[i])) << name(s) << kWhat[i] << " " << c10::toString(dt);
      EXPECT_TRUE(at::equal(dw2_alone, kept[4])) << name(s) << "dW2 alone " << c10::toString(dt);
    }
  }
}

// Only fc2 trains (fc1 frozen, x a constant), then only fc1's bias: the
// wanted gradients are right and the rest come back undefined.
TEST(GeluMlp, CpuFunctionPartialGradients) {
  const Inputs in = make_inputs({{6, 37}, 24, 13}, 300);
  const auto want = float64_oracle(in);
  {
    const at::Tensor w2 = in.w2.clone().requires_grad_(true), b2 = in.b2.clone().requires_grad_(true);
    const at::Tensor y = detail::gelu_mlp_function(in.x, in.w1, in.b1, w2, b2);
    const auto g = torch::autograd::grad({y}, {w2, b2}, {in.dy});
    expect_close(g[0], want[4], 2e-5, 2e-5, "dW2 alone");
    expect_close(g[1], want[5], 2e-5, 2e-5, "db2 alone");
  }
  {
    const at::Tensor b1 = in.b1.clone().requires_grad_(true);
    const at::Tensor y = detail::gelu_mlp_function(in.x, in.w1, b1, in.w2, in.b2);
    const auto g = torch::autograd::grad({y}, {b1}, {in.dy});
    expect_close(g[0], want[3], 2e-5, 2e-5, "db1 without dW1");
  }
}

// Both forms of the split path's GELU backward (on the CPU the fused one is
// ATen's gelu_backward and a sum: this checks where db1 comes from and its
// dtype), with all gradients and with db1 alone.
TEST(GeluMlp, CpuFunctionBothGeluBackwardFormsMatchFloat64) {
  const GeluBackwardForm before = gelu_mlp_gelu_backward_form();
  uint64_t seed = 600;
  for (const GeluBackwardForm form : {GeluBackwardForm::kAten, GeluBackwardForm::kFused}) {
    set_gelu_mlp_gelu_backward_form(form);
    const std::string what = form == GeluBackwardForm::kAten ? " aten" : " fused";
    for (const Shape& s : kShapes) {
      const Inputs in = make_inputs(s, seed++);
      const auto got = run(fn, in);
      const auto want = float64_oracle(in);
      for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], want[i], 2e-5, 2e-5, name(s) + kWhat[i] + what);
      EXPECT_EQ(got[3].scalar_type(), at::kFloat) << name(s) << "db1 in b1's dtype" << what;
    }
    const Inputs in = make_inputs({{6, 37}, 24, 13}, seed++);
    const at::Tensor b1 = in.b1.clone().requires_grad_(true);
    const at::Tensor y = detail::gelu_mlp_function(in.x, in.w1, b1, in.w2, in.b2);
    expect_close(torch::autograd::grad({y}, {b1}, {in.dy})[0], float64_oracle(in)[3], 2e-5, 2e-5,
                 "db1 without dW1" + what);
  }
  set_gelu_mlp_gelu_backward_form(GeluBackwardForm::kFused);
  EXPECT_TRUE(gelu_mlp_fused_gelu_backward(32 * 256, 384)) << "forced fused";
  set_gelu_mlp_gelu_backward_form(GeluBackwardForm::kAten);
  EXPECT_FALSE(gelu_mlp_fused_gelu_backward(256 * 256, 384)) << "forced ATen";
  set_gelu_mlp_gelu_backward_form(GeluBackwardForm::kAuto);
  EXPECT_FALSE(gelu_mlp_fused_gelu_backward(32 * 256, 384)) << "DiT-S/2 b32: ATen's, beside the second stream";
  EXPECT_TRUE(gelu_mlp_fused_gelu_backward(256 * 256, 384)) << "DiT-S/2 b256: the fused pass";
  set_gelu_mlp_gelu_backward_form(before);
}

// The DGELU epilogue only on products above the measured size (DiT-S/2
// b256: 65536 x 1536 outputs, split; DiT-B/2 b256, twice that, epilogue);
// the forced paths either way.
TEST(GeluMlp, DGeluPathBySize) {
  const DGeluPath before = gelu_mlp_dgelu_path();
  set_gelu_mlp_dgelu_path(DGeluPath::kAuto);
  EXPECT_FALSE(gelu_mlp_dgelu_in_epilogue(32 * 256, 1536));   // DiT-S/2 b32
  EXPECT_FALSE(gelu_mlp_dgelu_in_epilogue(64 * 256, 1536));   // b64
  EXPECT_FALSE(gelu_mlp_dgelu_in_epilogue(256 * 256, 1536));  // b256
  EXPECT_TRUE(gelu_mlp_dgelu_in_epilogue(512 * 256, 1536));   // b512
  EXPECT_TRUE(gelu_mlp_dgelu_in_epilogue(256 * 256, 3072));   // DiT-B/2 b256
  EXPECT_TRUE(gelu_mlp_dgelu_in_epilogue(256 * 256, 4608));   // DiT-XL/2 b256
  set_gelu_mlp_dgelu_path(DGeluPath::kEpilogue);
  EXPECT_TRUE(gelu_mlp_dgelu_in_epilogue(8, 8));
  set_gelu_mlp_dgelu_path(DGeluPath::kSplit);
  EXPECT_FALSE(gelu_mlp_dgelu_in_epilogue(256 * 256, 4608));
  set_gelu_mlp_dgelu_path(before);
}

TEST(GeluMlp, BadInputsRaiseUsageError) {
  using testing::error_of;
  const Inputs in = make_inputs({{4, 37}, 24, 13}, 9);
  auto contains = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nmissing: " << part;
  };
  for (auto op_or_function : {&gelu_mlp, &detail::gelu_mlp_function}) {
    auto f = [op_or_function](const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                              const at::Tensor& b2) { return op_or_function(x, w1, b1, w2, b2, true); };
    contains(error_of<UsageError>([&] { f(at::randn({4, 36}), in.w1, in.b1, in.w2, in.b2); }), "K=36");
    contains(error_of<UsageError>([&] { f(at::randn({}), in.w1, in.b1, in.w2, in.b2); }), "0-d");
    contains(error_of<UsageError>([&] { f(at::randint(0, 3, {4, 37}, gen(1)), in.w1, in.b1, in.w2, in.b2); }),
             "float32, bfloat16 or float16");
    contains(error_of<UsageError>([&] { f(in.x, in.w1, in.b1, at::randn({13, 23}), in.b2); }), "H=24");
    contains(error_of<UsageError>([&] { f(in.x, in.w1, at::Tensor(), in.w2, in.b2); }), "required");
    contains(error_of<UsageError>([&] { f(in.x, in.w1, in.b1, in.w2, at::randn({12})); }), "gelu_mlp fc2: bias");
    contains(error_of<UsageError>([&] { f(in.x, in.w1, in.b1.to(at::kBFloat16), in.w2, in.b2); }),
             "gelu_mlp fc1: bias must be float32 or");
  }
}

}  // namespace
}  // namespace perftrain::ops
