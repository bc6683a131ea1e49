// ops::stacked_linear on the CPU: the autograd function (hand-written
// backward, products through the ATen fallbacks the CUDA path also uses)
// agrees with separate at::linear layers forward and backward, with and
// without biases, at odd sizes; the weights are read as one view when they
// lie back to back and concatenated otherwise; bad inputs raise UsageError.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "base/error.h"
#include "ops/stacked_linear.h"
#include "support/tensor_checks.h"

namespace perftrain::ops {
namespace {

using perftrain::testing::expect_close;

struct Layers {
  at::Tensor x, dy;
  std::vector<at::Tensor> w, b;
};

Layers make_layers(const std::vector<int64_t>& rows, int64_t m, int64_t k, bool bias, uint64_t seed) {
  at::Generator g = perftrain::testing::seeded_cpu_generator(seed);
  Layers l;
  l.x = (at::randn({m, k}, g) + 0.3).set_requires_grad(true);
  int64_t n = 0;
  for (const int64_t r : rows) {
    l.w.push_back((at::randn({r, k}, g) / std::sqrt(double(k))).set_requires_grad(true));
    if (bias) l.b.push_back(at::randn({r}, g).set_requires_grad(true));
    n += r;
  }
  l.dy = at::randn({m, n}, g);
  return l;
}

std::vector<at::Tensor> grads_of(const at::Tensor& y, const at::Tensor& dy, const Layers& l) {
  std::vector<at::Tensor> inputs{l.x};
  inputs.insert(inputs.end(), l.w.begin(), l.w.end());
  inputs.insert(inputs.end(), l.b.begin(), l.b.end());
  return torch::autograd::grad({y}, inputs, {dy});
}

TEST(StackedLinear, MatchesSeparateLayersForwardAndBackward) {
  for (const bool bias : {true, false}) {
    const Layers l = make_layers({13, 7, 20}, 9, 37, bias, bias ? 1 : 2);
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < l.w.size(); ++i) parts.push_back(at::linear(l.x, l.w[i], bias ? l.b[i] : at::Tensor()));
    const at::Tensor ref = at::cat(parts, 1);
    const at::Tensor got = detail::stacked_linear_function(l.x, l.w, l.b);
    expect_close(got, ref, 1e-5, 1e-5, "forward");
    const auto gref = grads_of(ref, l.dy, l), ggot = grads_of(got, l.dy, l);
    ASSERT_EQ(ggot.size(), gref.size());
    for (size_t i = 0; i < gref.size(); ++i) expect_close(ggot[i], gref[i], 1e-4, 1e-5, "gradient " + std::to_string(i));
    // The public op on the CPU is the reference, which agrees too.
    expect_close(stacked_linear(l.x, l.w, l.b), ref, 1e-5, 1e-5, "op");
  }
}

// Only the biases train (frozen weights, an input without gradient): the
// backward saved neither x nor the weights and still gives the column sums.
TEST(StackedLinear, BiasesAloneGetTheirGradients) {
  Layers l = make_layers({5, 3}, 4, 6, true, 4);
  const at::Tensor x = l.x.detach();
  std::vector<at::Tensor> frozen;
  for (const auto& w : l.w) frozen.push_back(w.detach());
  const at::Tensor y = detail::stacked_linear_function(x, frozen, l.b);
  const auto grads = torch::autograd::grad({y}, l.b, {l.dy});
  ASSERT_EQ(grads.size(), 2u);
  expect_close(grads[0], l.dy.narrow(1, 0, 5).sum(0), 1e-5, 1e-5, "first bias");
  expect_close(grads[1], l.dy.narrow(1, 5, 3).sum(0), 1e-5, 1e-5, "second bias");
}

TEST(StackedLinear, ReadsAdjacentRowsAsOneView) {
  const at::Tensor buffer = at::randn({3 * 4 * 5 + 8});
  std::vector<at::Tensor> adjacent;
  for (int i = 0; i < 3; ++i) adjacent.push_back(buffer.narrow(0, 20 * i, 20).view({4, 5}));
  const at::Tensor view = detail::stacked_rows(adjacent);
  EXPECT_EQ(view.sizes(), (std::vector<int64_t>{12, 5}));
  EXPECT_EQ(view.data_ptr(), buffer.data_ptr());
  EXPECT_TRUE(view.equal(at::cat(adjacent, 0)));
  // A gap, another order or another storage: a concatenation (a new buffer).
  std::vector<at::Tensor> gap{buffer.narrow(0, 0, 20).view({4, 5}), buffer.narrow(0, 28, 20).view({4, 5})};
  std::vector<at::Tensor> reversed{adjacent[1], adjacent[0]};
  std::vector<at::Tensor> apart{adjacent[0], at::randn({4, 5})};
  for (const auto& parts : {gap, reversed, apart}) {
    const at::Tensor joined = detail::stacked_rows(parts);
    EXPECT_NE(joined.data_ptr(), buffer.data_ptr());
    EXPECT_TRUE(joined.equal(at::cat(parts, 0)));
  }
}

TEST(StackedLinear, RejectsBadInputs) {
  const Layers l = make_layers({4, 6}, 3, 8, true, 3);
  EXPECT_THROW(stacked_linear(l.x, {}), UsageError);
  EXPECT_THROW(stacked_linear(l.x, l.w, {l.b[0]}), UsageError);                 // one bias for two weights
  EXPECT_THROW(stacked_linear(l.x, {l.w[0], at::randn({4, 7})}), UsageError);  // K differs
  EXPECT_THROW(stacked_linear(l.x, {l.w[0], l.w[1].to(at::kDouble)}), UsageError);
}

}  // namespace
}  // namespace perftrain::ops
