// ops::linear on the CPU: the op (its reference there) agrees with an
// independent float64 composition forward and backward; the autograd
// function itself (hand-written backward, products through the ATen
// fallbacks the CUDA path also uses) agrees with the reference in fp32 and
// bf16; its column-block form (linear_column_blocks: one product, each
// block's gradient read apart) agrees with the whole layer, an absent block
// gradient counting as zeros; bad inputs raise UsageError naming what is wrong.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "ops/linear.h"
#include "support/tensor_checks.h"
#include "support/test_support.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;
at::Generator gen(uint64_t seed) { return perftrain::testing::seeded_cpu_generator(seed); }

// x's shape (leading dims + K) and N.
struct Shape {
  std::vector<int64_t> x;
  int64_t n;
};
const std::vector<Shape> kShapes = {{{1, 37}, 13}, {{7, 64}, 48}, {{2, 3, 37}, 13}, {{4, 5, 128}, 96}, {{33, 40}, 24}};

std::string name(const Shape& s, bool bias) {
  std::string r = "x [";
  for (size_t i = 0; i < s.x.size(); ++i) r += (i ? "," : "") + std::to_string(s.x[i]);
  return r + "] N=" + std::to_string(s.n) + (bias ? " bias " : " no-bias ");
}

struct Inputs {
  at::Tensor x, w, b, dy;
};

// x ~ N(0.3, 1), W ~ N(0, 1/K) (so y ~ N(0, 1)), b ~ N(0, 1), dy ~ N(0, 1).
Inputs make_inputs(const Shape& s, uint64_t seed, bool bias) {
  at::Generator g = gen(seed);
  const int64_t k = s.x.back();
  Inputs in;
  in.x = at::randn(s.x, g) + 0.3;
  in.w = at::randn({s.n, k}, g) / std::sqrt(double(k));
  if (bias) in.b = at::randn({s.n}, g);
  std::vector<int64_t> ys = s.x;
  ys.back() = s.n;
  in.dy = at::randn(ys, g);
  return in;
}

// {y, dx, dW, db} of f at (x, w, b) with upstream gradient dy.
template <class F>
std::vector<at::Tensor> run(F f, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
                            const at::Tensor& dy) {
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor w = w0.clone().requires_grad_(true);
  const at::Tensor b = b0.defined() ? b0.clone().requires_grad_(true) : at::Tensor();
  const at::Tensor y = f(x, w, b);
  std::vector<at::Tensor> inputs = {x, w};
  if (b.defined()) inputs.push_back(b);
  const auto grads = torch::autograd::grad({y}, inputs, {dy.to(y.scalar_type())});
  std::vector<at::Tensor> out = {y.detach()};
  for (const auto& gr : grads) out.push_back(gr);
  return out;
}

// Independent of ATen's linear: y = x W^T + b in float64, and its gradients
// written out by hand.
std::vector<at::Tensor> float64_oracle(const Inputs& in) {
  const at::Tensor x = in.x.to(at::kDouble), w = in.w.to(at::kDouble), dy = in.dy.to(at::kDouble);
  const int64_t k = x.size(-1), n = w.size(0);
  at::Tensor y = at::matmul(x, w.t());
  if (in.b.defined()) y = y + in.b.to(at::kDouble);
  const at::Tensor dy2 = dy.reshape({-1, n}), x2 = x.reshape({-1, k});
  std::vector<at::Tensor> out = {y, at::matmul(dy, w), at::matmul(dy2.t(), x2)};
  if (in.b.defined()) out.push_back(dy2.sum(0));
  return out;
}

const char* kWhat[] = {"y", "dx", "dW", "db"};

// fp32 on the CPU, K <= 128 terms per dot product: atol 1e-5 + rtol 1e-5.
TEST(Linear, CpuOpMatchesFloat64ForwardAndBackward) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    for (const bool bias : {true, false}) {
      const Inputs in = make_inputs(s, seed++, bias);
      const auto got = run([](auto& x, auto& w, auto& b) { return linear(x, w, b); }, in.x, in.w, in.b, in.dy);
      const auto ref = float64_oracle(in);
      ASSERT_EQ(got.size(), ref.size());
      EXPECT_EQ(got[0].scalar_type(), at::kFloat);
      for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], ref[i], 1e-5, 1e-5, name(s, bias) + kWhat[i]);
    }
  }
}

TEST(Linear, CpuOpIsTheReferenceInXsDtype) {
  const Inputs in = make_inputs({{3, 5, 37}, 13}, 7, true);
  const at::Tensor xb = in.x.to(at::kBFloat16);
  const at::Tensor y = linear(xb, in.w, in.b);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 13}));
  EXPECT_TRUE(at::equal(y, linear_reference(xb, in.w, in.b).to(at::kBFloat16)));
  EXPECT_EQ(linear_reference(xb, in.w, in.b).scalar_type(), at::kFloat);
}

// The autograd function with its hand-written backward, fp32 inputs and fp32
// master parameters: same tolerance as above (fp32, <= 128 terms).
TEST(Linear, CpuFunctionMatchesReferenceFp32) {
  uint64_t seed = 100;
  const int64_t fallbacks = gemm_fallback_count();
  for (const Shape& s : kShapes) {
    for (const bool bias : {true, false}) {
      const Inputs in = make_inputs(s, seed++, bias);
      const auto got = run([](auto& x, auto& w, auto& b) { return detail::linear_function(x, w, b); }, in.x,
                           in.w, in.b, in.dy);
      const auto ref = run([](auto& x, auto& w, auto& b) { return linear_reference(x, w, b); }, in.x, in.w, in.b,
                           in.dy);
      for (size_t i = 0; i < got.size(); ++i) expect_close(got[i], ref[i], 1e-5, 1e-5, name(s, bias) + kWhat[i]);
    }
  }
  EXPECT_EQ(gemm_fallback_count(), fallbacks) << "the CPU path is not a cuBLASLt fallback";
}

// bf16 activations with fp32 master parameters, as in training: the weight
// is rounded to bf16 for the product. The reference sees the same bf16
// values (x, W and dy rounded first), so what remains is the rounding of
// the bf16 outputs (y, dx: |err| <= 2^-8 |v| plus fp32-accumulation noise:
// atol 2e-2 + rtol 1e-2) and, for dW and db written in fp32 from bf16
// inputs, only accumulation order (atol 1e-4 + rtol 1e-4).
TEST(Linear, CpuFunctionMatchesReferenceBf16WithFp32Master) {
  uint64_t seed = 200;
  for (const Shape& s : kShapes) {
    for (const bool bias : {true, false}) {
      Inputs in = make_inputs(s, seed++, bias);
      const at::Tensor xb = in.x.to(at::kBFloat16);
      const at::Tensor dyb = in.dy.to(at::kBFloat16);
      const at::Tensor w_rounded = in.w.to(at::kBFloat16).to(at::kFloat);
      const auto got = run([](auto& x, auto& w, auto& b) { return detail::linear_function(x, w, b); }, xb,
                           w_rounded, in.b, dyb);
      const auto ref = run([](auto& x, auto& w, auto& b) { return linear_reference(x, w, b); },
                           xb.to(at::kFloat), w_rounded, in.b, dyb.to(at::kFloat));
      EXPECT_EQ(got[0].scalar_type(), at::kBFloat16);
      EXPECT_EQ(got[1].scalar_type(), at::kBFloat16) << "dx in x's dtype";
      EXPECT_EQ(got[2].scalar_type(), at::kFloat) << "dW in the master weight's dtype";
      if (bias) EXPECT_EQ(got[3].scalar_type(), at::kFloat) << "db in the master bias's dtype";
      expect_close(got[0], ref[0], 2e-2, 1e-2, name(s, bias) + "y");
      expect_close(got[1], ref[1], 2e-2, 1e-2, name(s, bias) + "dx");
      for (size_t i = 2; i < got.size(); ++i) expect_close(got[i], ref[i], 1e-4, 1e-4, name(s, bias) + kWhat[i]);
    }
  }
}

// Only some inputs want gradients: the others come back undefined and the
// wanted ones are still right (the function saves only what they need).
TEST(Linear, CpuFunctionPartialGradients) {
  const Inputs in = make_inputs({{6, 37}, 13}, 300, true);
  const auto ref = float64_oracle(in);
  {
    const at::Tensor w = in.w.clone().requires_grad_(true);
    const at::Tensor y = detail::linear_function(in.x, w, in.b);
    const auto g = torch::autograd::grad({y}, {w}, {in.dy});
    expect_close(g[0], ref[2], 1e-5, 1e-5, "dW alone");
  }
  {
    const at::Tensor x = in.x.clone().requires_grad_(true);
    const at::Tensor b = in.b.clone().requires_grad_(true);
    const at::Tensor y = detail::linear_function(x, in.w, b);
    const auto g = torch::autograd::grad({y}, {x, b}, {in.dy});
    expect_close(g[0], ref[1], 1e-5, 1e-5, "dx without dW");
    expect_close(g[1], ref[3], 1e-5, 1e-5, "db without dW");
  }
}

// The output is a fresh tensor, not a view: it can be modified in place, and
// a broadcast upstream gradient (from sum()) is handled.
TEST(Linear, CpuFunctionOutputIsNotAViewAndTakesBroadcastGradients) {
  const Inputs in = make_inputs({{2, 3, 37}, 13}, 400, true);
  const at::Tensor x = in.x.clone().requires_grad_(true);
  const at::Tensor w = in.w.clone().requires_grad_(true);
  at::Tensor y = detail::linear_function(x, w, in.b);
  EXPECT_FALSE(y.is_view());
  y.mul_(2.0);
  const auto g = torch::autograd::grad({y.sum()}, {x, w});
  const at::Tensor dy = at::ones({2, 3, 13}) * 2.0;
  expect_close(g[0], at::matmul(dy, in.w), 1e-5, 1e-5, "dx");
  expect_close(g[1], at::matmul(dy.reshape({6, 13}).t(), in.x.reshape({6, 37})), 1e-5, 1e-5, "dW");
}

// No rows: an empty output and zero parameter gradients.
TEST(Linear, CpuFunctionEmptyBatch) {
  const at::Tensor x = at::randn({0, 37}, gen(5)).requires_grad_(true);
  const at::Tensor w = at::randn({13, 37}, gen(6)).requires_grad_(true);
  const at::Tensor b = at::randn({13}, gen(7)).requires_grad_(true);
  const at::Tensor y = detail::linear_function(x, w, b);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 13}));
  const auto g = torch::autograd::grad({y}, {w, b}, {at::zeros({0, 13})});
  EXPECT_TRUE(at::equal(g[0], at::zeros({13, 37})));
  EXPECT_TRUE(at::equal(g[1], at::zeros({13})));
}

// The column-block form against the whole layer's reference: the blocks are
// the columns of y (views of one product), and the gradients from per-block
// upstream gradients equal the whole layer's from their join, in fp32 and in
// bf16 with fp32 masters; a block without a gradient (one absent) counts as a
// zero block: its dW and db rows are zero.
TEST(Linear, CpuColumnBlocksMatchTheWholeLayer) {
  uint64_t seed = 500;
  for (const std::vector<int64_t>& widths : {std::vector<int64_t>{26, 13}, {5, 1, 7}, {13}}) {
    for (const bool bias : {true, false}) {
      for (const bool bf16 : {false, true}) {
        int64_t n = 0;
        for (const int64_t w : widths) n += w;
        Inputs in = make_inputs({{2, 7, 37}, n}, seed++, bias);
        const at::Tensor x0 = bf16 ? in.x.to(at::kBFloat16) : in.x;
        const at::Tensor w0 = bf16 ? in.w.to(at::kBFloat16).to(at::kFloat) : in.w;
        const at::Tensor dy = bf16 ? in.dy.to(at::kBFloat16) : in.dy;
        const std::string where = name({{2, 7, 37}, n}, bias) + std::to_string(widths.size()) + " blocks " +
                                  (bf16 ? "bf16 " : "fp32 ");
        for (const bool skip_last : {false, true}) {
          if (skip_last && widths.size() == 1) continue;
          const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
          const at::Tensor b = bias ? in.b.clone().requires_grad_(true) : at::Tensor();
          const std::vector<at::Tensor> blocks = detail::linear_column_blocks_function(x, w, b, widths);
          ASSERT_EQ(blocks.size(), widths.size());
          std::vector<at::Tensor> outs, grads;
          at::Tensor dy_used = dy.clone();
          int64_t off = 0;
          for (size_t i = 0; i < widths.size(); off += widths[i], ++i) {
            EXPECT_EQ(blocks[i].size(-1), widths[i]) << where;
            if (skip_last && i + 1 == widths.size()) {
              dy_used.narrow(-1, off, widths[i]).zero_();
              continue;
            }
            outs.push_back(blocks[i]);
            grads.push_back(dy.narrow(-1, off, widths[i]));
          }
          std::vector<at::Tensor> inputs = {x, w};
          if (bias) inputs.push_back(b);
          const auto got = torch::autograd::grad(outs, inputs, grads);
          const auto ref = run([](auto& xx, auto& ww, auto& bb) { return linear_reference(xx, ww, bb); },
                               x0.to(at::kFloat), w0, bias ? in.b : at::Tensor(), dy_used.to(at::kFloat));
          const at::Tensor y = at::cat(std::vector<at::Tensor>(blocks.begin(), blocks.end()), -1);
          const double tol = bf16 ? 2e-2 : 1e-5;
          const std::string w_ = where + (skip_last ? "last block without a gradient " : "");
          expect_close(y, ref[0], tol, tol, w_ + "y");
          expect_close(got[0], ref[1], tol, tol, w_ + "dx");
          EXPECT_EQ(got[0].scalar_type(), x0.scalar_type()) << w_;
          for (size_t i = 1; i < got.size(); ++i) {
            EXPECT_EQ(got[i].scalar_type(), at::kFloat) << w_ << kWhat[i + 1];
            expect_close(got[i], ref[i + 1], bf16 ? 1e-4 : 1e-5, 1e-4, w_ + kWhat[i + 1]);
          }
          if (skip_last) {
            EXPECT_TRUE(at::equal(got[1].narrow(0, n - widths.back(), widths.back()),
                                  at::zeros({widths.back(), 37})))
                << w_ << "dW rows of the block without a gradient";
          }
        }
      }
    }
  }
}

// The op on the CPU is the reference, split; bad widths are refused.
TEST(Linear, ColumnBlocksOnTheCpuAndBadWidths) {
  using testing::error_of;
  const Inputs in = make_inputs({{3, 37}, 13}, 600, true);
  const std::vector<at::Tensor> blocks = linear_column_blocks(in.x, in.w, in.b, {8, 5});
  const at::Tensor ref = linear_reference(in.x, in.w, in.b);
  EXPECT_TRUE(at::equal(blocks[0], ref.narrow(1, 0, 8)));
  EXPECT_TRUE(at::equal(blocks[1], ref.narrow(1, 8, 5)));
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{8, 4}, {13, 0}, {}, {14, -1}}) {
    const std::string msg = error_of<UsageError>([&] { linear_column_blocks(in.x, in.w, in.b, bad); });
    EXPECT_NE(msg.find("linear_column_blocks: widths"), std::string::npos) << msg;
  }
  const std::string msg = error_of<UsageError>([&] { linear_column_blocks(at::randn({3, 36}), in.w, in.b, {13}); });
  EXPECT_NE(msg.find("K=36"), std::string::npos) << msg;
}

TEST(Linear, BadInputsRaiseUsageError) {
  using testing::error_of;
  const at::Tensor x = at::randn({4, 37});
  const at::Tensor w = at::randn({13, 37});
  const at::Tensor b = at::randn({13});
  auto contains = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nmissing: " << part;
  };
  for (auto f : {&linear, &detail::linear_function}) {
    contains(error_of<UsageError>([&] { f(at::randn({4, 36}), w, b); }), "K=36");
    contains(error_of<UsageError>([&] { f(at::randn({}), w, b); }), "0-d");
    contains(error_of<UsageError>([&] { f(at::randint(0, 5, {4, 37}, gen(1)), w, b); }),
             "float32, bfloat16 or float16");
    contains(error_of<UsageError>([&] { f(x, at::randn({37}), b); }), "2-D");
    contains(error_of<UsageError>([&] { f(x, w, at::randn({12})); }), "bias must be [N] = [13]");
    contains(error_of<UsageError>([&] { f(x, w.to(at::kBFloat16), b); }), "weight must be float32 or");
    contains(error_of<UsageError>([&] { f(x.to(at::kBFloat16), w, b.to(at::kHalf)); }), "bias must be float32 or");
    contains(error_of<UsageError>([&] { f(at::Tensor(), w, b); }), "undefined");
  }
}

}  // namespace
}  // namespace perftrain::ops
