// The sample-quality metrics against closed forms and a plain reference
// (the pytorch-fid comparison is frechet_pytorch_fid_test.cpp).
#include <ATen/TensorOperators.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "observe/eval/metrics.h"
#include "support/test_support.h"

namespace perftrain::observe::eval {
namespace {

TEST(FrechetDistance, OfGaussiansWithKnownMomentsIsTheClosedForm) {
  // N(m1, a I) and N(m2, b I): |m1 - m2|^2 + D (sqrt(a) - sqrt(b))^2.
  const int64_t d = 5;
  FeatureStats x{at::zeros({d}, at::kDouble), at::eye(d, at::kDouble) * 4.0};
  FeatureStats y{at::full({d}, 1.0, at::kDouble), at::eye(d, at::kDouble) * 9.0};
  EXPECT_NEAR(frechet_distance(x, y), d * 1.0 + d * 1.0, 1e-9);
  EXPECT_NEAR(frechet_distance(x, x), 0.0, 1e-9);
}

TEST(FrechetDistance, StatisticsOfDifferentDimensionsAreRefused) {
  const auto a = feature_stats(at::randn({10, 3}));
  const auto b = feature_stats(at::randn({10, 4}));
  EXPECT_TRUE(perftrain::testing::contains(perftrain::testing::error_of<UsageError>([&] { frechet_distance(a, b); }),
                                           "3 and 4"));
}

TEST(InceptionScore, IsOneForIdenticalPredictionsAndTheClassCountForConfidentDistinctOnes) {
  EXPECT_NEAR(inception_score(at::zeros({20, 7}), 2).mean, 1.0, 1e-12);
  // Each sample certain of its own class, the classes equally often: IS = classes.
  at::Tensor logits = at::full({40, 4}, -1e4, at::kDouble);
  for (int64_t i = 0; i < 40; ++i) logits[i][i % 4] = 0;
  const auto is = inception_score(logits, 10);
  EXPECT_NEAR(is.mean, 4.0, 1e-9);
  EXPECT_NEAR(is.std, 0.0, 1e-9);
}

// Kynkäänniemi et al.'s definition, one pair at a time.
double covered(const at::Tensor& queries, const at::Tensor& set, int64_t k) {
  const int64_t n = set.size(0);
  std::vector<double> radius(n);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> d;
    for (int64_t j = 0; j < n; ++j)
      if (j != i) d.push_back((set[i] - set[j]).norm().item<double>());
    std::sort(d.begin(), d.end());
    radius[i] = d[k - 1];
  }
  int64_t inside = 0;
  for (int64_t q = 0; q < queries.size(0); ++q)
    for (int64_t i = 0; i < n; ++i)
      if ((queries[q] - set[i]).norm().item<double>() <= radius[i]) {
        ++inside;
        break;
      }
  return static_cast<double>(inside) / queries.size(0);
}

TEST(PrecisionRecall, EqualsThePairwiseDefinition) {
  const at::Tensor real = at::randn({40, 6}, at::kDouble);
  const at::Tensor fake = at::randn({30, 6}, at::kDouble) * 1.5 + 0.5;  // wider and shifted: both below 1
  const auto pr = precision_recall(real, fake, 3);
  EXPECT_DOUBLE_EQ(pr.precision, covered(fake, real, 3));
  EXPECT_DOUBLE_EQ(pr.recall, covered(real, fake, 3));
  EXPECT_LT(pr.precision, 1.0);
  const auto same = precision_recall(real, real, 3);
  EXPECT_DOUBLE_EQ(same.precision, 1.0);
  EXPECT_DOUBLE_EQ(same.recall, 1.0);
}

}  // namespace
}  // namespace perftrain::observe::eval
