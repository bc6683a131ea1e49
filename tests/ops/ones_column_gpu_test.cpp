// The ones column after the MLP's input rows (ops::residual_adaln with
// h_ones_column; fc1's weight and bias gradients then come from one product,
// ops::detail::linear_weight_grad_from_ones_column): residual_adaln writes
// the same h, the ones and zeros after each row, and the same gradients;
// the one-product gradients match float64 and the two-pass ones; gelu_mlp
// reading the strided input matches the dense input on both backward paths
// that sum fc1's bias separately. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/compat.h"
#include "ops/gelu_mlp.h"
#include "ops/linear.h"
#include "ops/residual_adaln.h"

namespace perftrain::ops {
namespace {

const at::Device kCuda(at::kCUDA, 0);

at::Generator cuda_gen(uint64_t seed) {
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(seed);
  return g;
}

at::Tensor rnd(at::IntArrayRef shape, at::Generator& g, at::ScalarType dt, double scale = 1.0) {
  return (at::randn(shape, g, at::TensorOptions().device(kCuda)) * scale).to(dt);
}

double rel_l2(const at::Tensor& got, const at::Tensor& ref) {
  const at::Tensor a = got.to(at::kDouble), b = ref.to(at::kDouble);
  if (a.isnan().any().item<bool>()) return std::numeric_limits<double>::quiet_NaN();
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

// The 8 elements after each of h's rows, [rows, 8].
at::Tensor pad_of(const at::Tensor& h) {
  const int64_t d = h.size(-1), rows = h.numel() / d;
  return h.as_strided({rows, 8}, {d + 8, 1}, h.storage_offset() + d);
}

// residual_adaln's inputs as DiT has them: x fp32, y bf16, and gate, shift,
// scale bf16 chunks of one [B, 6D] modulation; each requires grad.
struct Inputs {
  std::vector<at::Tensor> t;  // x, gate, y, shift, scale, bias
  Inputs(int64_t b, int64_t tokens, int64_t d, at::Generator& g) {
    const at::Tensor mod = rnd({b, 6 * d}, g, at::kBFloat16, 0.5);
    t = {rnd({b, tokens, d}, g, at::kFloat), mod.narrow(1, 0, d), rnd({b, tokens, d}, g, at::kBFloat16),
         mod.narrow(1, d, d), mod.narrow(1, 2 * d, d), rnd({d}, g, at::kFloat, 0.3)};
    for (at::Tensor& v : t) v = v.detach().requires_grad_(true);
  }
};

TEST(OnesColumnGpu, ResidualAdaLNWritesTheSameHAndTheOnes) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(71);
  for (const auto& s : std::vector<std::vector<int64_t>>{{2, 64, 384}, {3, 17, 768}, {2, 5, 37}}) {
    const int64_t b = s[0], tokens = s[1], d = s[2];
    const std::string where = "[" + std::to_string(b) + ", " + std::to_string(tokens) + ", " + std::to_string(d) + "]";
    const Inputs in(b, tokens, d, g);
    const auto& t = in.t;
    const at::Tensor dx1 = rnd({b, tokens, d}, g, at::kFloat), dh = rnd({b, tokens, d}, g, at::kBFloat16);
    std::vector<std::vector<at::Tensor>> results;
    for (const bool ones : {false, true}) {
      const auto [x1, h] = residual_adaln(t[0], t[1], t[2], t[3], t[4], at::kBFloat16, 1e-6, t[5], ones);
      std::vector<at::Tensor> r = torch::autograd::grad({x1, h}, t, {dx1, dh});
      r.insert(r.begin(), {x1.detach(), h.detach()});
      results.push_back(r);
      if (!ones) continue;
      if (d % 8 != 0) {
        EXPECT_TRUE(h.is_contiguous()) << where << ": no 16-byte path, no ones column";
        continue;
      }
      ASSERT_EQ(h.stride(1), d + 8) << where;
      at::Tensor want = at::zeros({8}, h.options());
      want[0] = 1.0;
      EXPECT_TRUE(at::equal(pad_of(h), want.expand({b * tokens, 8}))) << where << ": the ones column";
    }
    for (size_t i = 0; i < results[0].size(); ++i)
      EXPECT_TRUE(at::equal(results[0][i], results[1][i])) << where << " output " << i;
  }
}

// dY^T [x | 1] against float64 and against the two-pass form, into fp32 dW, db.
TEST(OnesColumnGpu, WeightAndBiasGradientsFromOneProduct) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(72);
  for (const auto& s : std::vector<std::vector<int64_t>>{{8192, 384, 1536}, {777, 768, 3072}, {64, 16, 40}}) {
    const int64_t m = s[0], k = s[1], n = s[2];
    const std::string where = std::to_string(m) + "x" + std::to_string(k) + " -> " + std::to_string(n);
    at::Tensor rows = rnd({m, k + 8}, g, at::kBFloat16);
    rows.narrow(1, k, 8).zero_();
    rows.narrow(1, k, 1).fill_(1.0);
    const at::Tensor x2 = rows.narrow(1, 0, k);
    const at::Tensor dy = rnd({m, n}, g, at::kBFloat16);
    auto nan = [&](at::IntArrayRef sizes) {
      return at::full(sizes, std::numeric_limits<double>::quiet_NaN(), dy.options().dtype(at::kFloat));
    };
    const at::Tensor dw = nan({n, k}), db = nan({n}), dw2 = nan({n, k}), db2 = nan({n});
    ASSERT_TRUE(detail::linear_weight_grad_from_ones_column(dy, x2, dw, db)) << where;
    detail::linear_weight_grad_into(dy, x2.contiguous(), dw2, db2);
    const at::Tensor dy64 = dy.to(at::kDouble);
    EXPECT_LT(rel_l2(dw, dy64.t().matmul(x2.to(at::kDouble))), 1e-5) << where << " dW";
    EXPECT_LT(rel_l2(db, dy64.sum(0)), 1e-5) << where << " db";
    EXPECT_LT(rel_l2(dw, dw2), 1e-5) << where << " dW against the two-pass form";
    EXPECT_LT(rel_l2(db, db2), 1e-5) << where << " db against the two-pass form";
  }
  // Not that layout (dense x): declined, nothing written.
  const at::Tensor x = rnd({64, 16}, g, at::kBFloat16), dy = rnd({64, 40}, g, at::kBFloat16);
  const at::Tensor dw = at::empty({40, 16}, dy.options().dtype(at::kFloat)), db = at::empty({40}, dw.options());
  EXPECT_FALSE(detail::linear_weight_grad_from_ones_column(dy, x, dw, db));
}

// gelu_mlp on h with the ones column against the same values dense, on the
// DGELU epilogue path and the split path with ATen's GELU pass (both sum
// fc1's bias separately otherwise).
TEST(OnesColumnGpu, GeluMlpOnTheStridedInputMatchesTheDenseOne) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(73);
  const int64_t b = 4, tokens = 64, c = 384, hdim = 1536;
  const Inputs in(b, tokens, c, g);
  const auto& t = in.t;
  const at::Tensor h = residual_adaln(t[0], t[1], t[2], t[3], t[4], at::kBFloat16, 1e-6, t[5], true).second.detach();
  ASSERT_EQ(h.stride(1), c + 8);
  const at::Tensor w1 = rnd({hdim, c}, g, at::kFloat, 1.5 / std::sqrt(double(c))).requires_grad_(true);
  const at::Tensor b1 = rnd({hdim}, g, at::kFloat, 0.5).requires_grad_(true);
  const at::Tensor w2 = rnd({c, hdim}, g, at::kFloat, 1.0 / std::sqrt(double(hdim))).requires_grad_(true);
  const at::Tensor dy = rnd({b, tokens, c}, g, at::kBFloat16);
  const char* what[] = {"y", "dx", "dW1", "db1", "dW2"};
  for (const bool epilogue : {true, false}) {
    set_gelu_mlp_dgelu_path(epilogue ? DGeluPath::kEpilogue : DGeluPath::kSplit);
    set_gelu_mlp_gelu_backward_form(GeluBackwardForm::kAten);
    std::vector<std::vector<at::Tensor>> results;
    for (const bool ones : {false, true}) {
      const at::Tensor x = (ones ? h : h.contiguous()).detach().requires_grad_(true);
      const at::Tensor y = gelu_mlp(x, w1, b1, w2, at::Tensor(), std::nullopt, ones);
      std::vector<at::Tensor> r = torch::autograd::grad({y}, {x, w1, b1, w2}, {dy});
      r.insert(r.begin(), y.detach());
      results.push_back(r);
    }
    for (size_t i = 0; i < results[0].size(); ++i)
      EXPECT_LT(rel_l2(results[1][i], results[0][i]), 5e-3)
          << (epilogue ? "epilogue path: " : "split path: ") << what[i];
  }
  set_gelu_mlp_gelu_backward_form(GeluBackwardForm::kAuto);
  set_gelu_mlp_dgelu_path(DGeluPath::kAuto);
}

}  // namespace
}  // namespace perftrain::ops
