// ops::linear on the GPU: forward and backward against float64 over the DiT
// shapes and odd ones in bf16, fp32 (TF32) and fp16, with the fallback count
// (0 expected on the DiT shapes at training batch sizes); mixed devices
// raise UsageError; forward and backward capture into a CUDA graph and
// replay to the eager result; the column-block form (the single-stream qkv
// projection: q | k and v blocks, gradients read in place) against float64
// and linear's own products, and in a graph. Skips without a GPU.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "compat/compat.h"
#include "gpu_products.h"
#include "ops/linear.h"

namespace perftrain::ops {
namespace {

using namespace gpu_products;

struct KN {
  int64_t k, n;
  bool dit;
};
const std::vector<KN> kLinearShapes = {{384, 1152, true}, {384, 1536, true}, {1536, 384, true},
                                       {1152, 4608, true}, {40, 24, false}};

void check_linear(at::ScalarType dt, int64_t m, int64_t k, int64_t n, bool dit, uint64_t seed) {
  at::Generator g = cuda_gen(seed);
  const std::string name = case_name("linear", dt, m, k, n);
  const at::Tensor x = rnd({m, k}, g, dt, 1.0, 0.3).requires_grad_(true);
  const at::Tensor w = master({n, k}, g, dt, 1.0 / std::sqrt(double(k))).requires_grad_(true);
  const at::Tensor b = rnd({n}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dy = rnd({m, n}, g, dt);
  std::vector<at::Tensor> got;
  count_fallbacks(name, dit && m >= 8192, [&] {
    const at::Tensor y = linear(x, w, b);
    const auto grads = torch::autograd::grad({y}, {x, w, b}, {dy});
    got = {y, grads[0], grads[1], grads[2]};
  });
  ASSERT_EQ(got[0].scalar_type(), dt) << name;
  ASSERT_EQ(got[1].scalar_type(), dt) << name << " dx";
  ASSERT_EQ(got[2].scalar_type(), at::kFloat) << name << " dW";
  ASSERT_EQ(got[3].scalar_type(), at::kFloat) << name << " db";
  const at::Tensor xd = x.detach().to(at::kDouble), wd = w.detach().to(at::kDouble), dyd = dy.to(at::kDouble);
  const std::vector<at::Tensor> want = {at::matmul(xd, wd.t()) + b.detach().to(at::kDouble), at::matmul(dyd, wd),
                                        at::matmul(dyd.t(), xd), dyd.sum(0)};
  const char* what[] = {"y", "dx", "dW", "db"};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(rel_l2(got[i], want[i]), tolerance(dt)) << name << " " << what[i];
}

TEST(LinearGpu, MatchesFloat64) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 100;
  for (const auto dt : {at::kBFloat16, at::kFloat})
    for (const KN& s : kLinearShapes)
      for (const int64_t m : kRows) check_linear(dt, m, s.k, s.n, s.dit, seed++);
  check_linear(at::kHalf, 8192, 384, 1536, true, seed++);
  check_linear(at::kHalf, 7, 40, 24, false, seed++);
}

TEST(LinearGpu, MixedDevicesRaiseUsageError) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(3);
  const at::Tensor x = rnd({4, 40}, g, at::kBFloat16);
  const at::Tensor w = at::randn({24, 40});
  EXPECT_THROW(linear(x, w, at::Tensor()), UsageError);
  EXPECT_THROW(linear(x, w.to(kCuda), at::randn({24})), UsageError);
}

// A qkv-like layer, forward and backward, in a CUDA graph.
TEST(LinearGpu, CapturesInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(77);
  const at::ScalarType bf = at::kBFloat16;
  const int64_t b = 4, t = 256, c = 384;
  const at::Tensor x = rnd({b, t, c}, g, bf).requires_grad_(true);
  const at::Tensor wq = master({3 * c, c}, g, bf, 0.05).requires_grad_(true);
  const at::Tensor bq = rnd({3 * c}, g, at::kFloat).requires_grad_(true);
  const at::Tensor dq = rnd({b, t, 3 * c}, g, bf), x_next = rnd({b, t, c}, g, bf);
  expect_capture_matches_eager(
      [&] {
        const at::Tensor q = linear(x, wq, bq);
        std::vector<at::Tensor> out = torch::autograd::grad({q}, {x, wq, bq}, {dq});
        out.push_back(q.detach());
        return out;
      },
      x, x_next);
}

// linear_column_blocks at the single-stream qkv projection's shapes (SS-B/2:
// 768 wide, blocks of 2D and D; an odd one): y is linear's own product bit
// for bit (one product, split), dx (two products, the second accumulating),
// dW and db (row blocks from each block's gradient) against float64 of the
// joined gradient; no cuBLASLt fallback at the training shape.
TEST(LinearGpu, ColumnBlocksMatchFloat64AndTheWholeProduct) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  uint64_t seed = 500;
  for (const auto& [m, k] : {std::pair<int64_t, int64_t>{8192, 768}, {7, 40}}) {
    for (const bool bias : {false, true}) {
      at::Generator g = cuda_gen(seed++);
      const at::ScalarType dt = at::kBFloat16;
      const int64_t d = k;
      const std::string name = case_name("linear_column_blocks", dt, m, k, 3 * d) + (bias ? " bias" : "");
      const at::Tensor x = rnd({m, k}, g, dt, 1.0, 0.3).requires_grad_(true);
      const at::Tensor w = master({3 * d, k}, g, dt, 1.0 / std::sqrt(double(k))).requires_grad_(true);
      const at::Tensor b = bias ? rnd({3 * d}, g, at::kFloat).requires_grad_(true) : at::Tensor();
      const at::Tensor dqk = rnd({m, 2 * d}, g, dt), dv = rnd({m, d}, g, dt);
      std::vector<at::Tensor> got;
      count_fallbacks(name, m >= 8192, [&] {
        const std::vector<at::Tensor> blocks = linear_column_blocks(x, w, b, {2 * d, d});
        std::vector<at::Tensor> inputs = {x, w};
        if (bias) inputs.push_back(b);
        const auto grads = torch::autograd::grad({blocks[0], blocks[1]}, inputs, {dqk, dv});
        got = {at::cat({blocks[0], blocks[1]}, 1)};
        got.insert(got.end(), grads.begin(), grads.end());
      });
      EXPECT_TRUE(at::equal(got[0], linear(x, w, b))) << name << " y";
      const at::Tensor xd = x.detach().to(at::kDouble), wd = w.detach().to(at::kDouble);
      const at::Tensor dyd = at::cat({dqk, dv}, 1).to(at::kDouble);
      std::vector<at::Tensor> want = {at::matmul(dyd, wd), at::matmul(dyd.t(), xd)};
      if (bias) want.push_back(dyd.sum(0));
      const char* what[] = {"dx", "dW", "db"};
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_LT(rel_l2(got[i + 1], want[i]), tolerance(dt)) << name << " " << what[i];
    }
  }
}

// The column-block form, forward and backward, in a CUDA graph.
TEST(LinearGpu, ColumnBlocksCaptureInCudaGraph) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  at::Generator g = cuda_gen(78);
  const at::ScalarType bf = at::kBFloat16;
  const int64_t b = 4, t = 288, c = 384;
  const at::Tensor x = rnd({b, t, c}, g, bf).requires_grad_(true);
  const at::Tensor wq = master({3 * c, c}, g, bf, 0.05).requires_grad_(true);
  const at::Tensor dqk = rnd({b, t, 2 * c}, g, bf), dv = rnd({b, t, c}, g, bf), x_next = rnd({b, t, c}, g, bf);
  expect_capture_matches_eager(
      [&] {
        const std::vector<at::Tensor> blocks = linear_column_blocks(x, wq, at::Tensor(), {2 * c, c});
        std::vector<at::Tensor> out = torch::autograd::grad({blocks[0], blocks[1]}, {x, wq}, {dqk, dv});
        out.push_back(blocks[0].detach());
        out.push_back(blocks[1].detach());
        return out;
      },
      x, x_next);
}

}  // namespace
}  // namespace perftrain::ops
