// Classifier-free guidance wrapper.
#include "diffusion/guidance.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"

namespace perftrain::diffusion {
namespace {

using testing::max_abs_diff;

constexpr int64_t kNull = 10;

// A label-dependent model that records the batch sizes it was called with;
// with two_c it also returns a label-dependent "variance" half.
ModelFn labelled(std::vector<int64_t>* batches, bool two_c) {
  return [=](const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) {
    batches->push_back(x.size(0));
    const at::Tensor yb = y.to(at::kFloat).view({-1, 1, 1, 1});
    const at::Tensor eps = x.mul(yb.add(1.0)).add(t.view({-1, 1, 1, 1}).mul(1e-3));
    return two_c ? at::cat({eps, x.sub(yb)}, 1) : eps;
  };
}

struct Inputs {
  at::Tensor x = at::randn({3, 2, 4, 4}, testing::cpu_gen(1));
  at::Tensor t = at::tensor(std::vector<float>{5.0f, 500.0f, 999.0f});
  at::Tensor y = at::tensor(std::vector<int64_t>{0, 3, 7});
  at::Tensor null = at::full({3}, kNull, at::TensorOptions().dtype(at::kLong));
};

TEST(Guidance, ScaleOneIsThePlainConditionalCall) {
  Inputs in;
  std::vector<int64_t> batches;
  const ModelFn m = labelled(&batches, false);
  const at::Tensor want = m(in.x, in.t, in.y);
  batches.clear();
  const at::Tensor got = classifier_free_guidance(m, kNull, 1.0)(in.x, in.t, in.y);
  EXPECT_EQ(max_abs_diff(got, want), 0.0);
  EXPECT_EQ(batches, std::vector<int64_t>{3});  // no doubling
}

TEST(Guidance, ScaleZeroIsTheUnconditionalCall) {
  Inputs in;
  std::vector<int64_t> batches;
  const ModelFn m = labelled(&batches, false);
  const at::Tensor want = m(in.x, in.t, in.null);
  batches.clear();
  const at::Tensor got = classifier_free_guidance(m, kNull, 0.0)(in.x, in.t, in.y);
  EXPECT_LT(max_abs_diff(got, want), 1e-6);
  EXPECT_EQ(batches, std::vector<int64_t>{6});  // one call on the doubled batch
}

TEST(Guidance, ExtrapolatesEpsAndKeepsConditionalVariance) {
  Inputs in;
  std::vector<int64_t> batches;
  const ModelFn m = labelled(&batches, true);
  const at::Tensor c = m(in.x, in.t, in.y);
  const at::Tensor u = m(in.x, in.t, in.null);
  const at::Tensor got = classifier_free_guidance(m, kNull, 4.0)(in.x, in.t, in.y);
  ASSERT_EQ(got.sizes(), c.sizes());
  const at::Tensor ce = c.narrow(1, 0, 2), ue = u.narrow(1, 0, 2);
  EXPECT_LT(max_abs_diff(got.narrow(1, 0, 2), ue.add(ce.sub(ue).mul(4.0))), 1e-5);
  EXPECT_EQ(max_abs_diff(got.narrow(1, 2, 2), c.narrow(1, 2, 2)), 0.0);
}

}  // namespace
}  // namespace perftrain::diffusion
