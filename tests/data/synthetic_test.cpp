#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "data/dataset.h"
#include "support/test_support.h"

namespace perftrain::data {
namespace {

using perftrain::testing::error_of;

std::vector<float> sample(const Dataset& ds, int64_t i, int64_t* label = nullptr) {
  const auto s = ds.sample_shape();
  std::vector<float> x(s[0] * s[1] * s[2]);
  int64_t y = -1;
  ds.gather(&i, 1, x.data(), &y);
  if (label != nullptr) *label = y;
  return x;
}

TEST(Synthetic, SampleDependsOnlyOnSeedAndIndex) {
  const auto ds = make_synthetic(100, {3, 5, 7}, 10, 42);  // odd element count
  EXPECT_EQ(ds->size(), 100);
  EXPECT_EQ(ds->num_classes(), 10);
  const int64_t idx[3] = {17, 3, 17};
  std::vector<float> x(3 * 105);
  int64_t y[3];
  ds->gather(idx, 3, x.data(), y);
  EXPECT_EQ(std::vector<float>(x.begin(), x.begin() + 105), sample(*ds, 17));
  EXPECT_EQ(std::vector<float>(x.begin() + 105, x.begin() + 210), sample(*ds, 3));
  EXPECT_EQ(std::vector<float>(x.begin() + 210, x.end()), sample(*ds, 17));
  EXPECT_EQ(y[0], 7);
  EXPECT_EQ(y[1], 3);
  EXPECT_NE(sample(*ds, 3), sample(*ds, 4));
  EXPECT_EQ(sample(*make_synthetic(5, {3, 5, 7}, 10, 42), 3), sample(*ds, 3));  // not size-dependent
  EXPECT_NE(sample(*make_synthetic(100, {3, 5, 7}, 10, 43), 3), sample(*ds, 3));
}

TEST(Synthetic, ValuesHaveZeroMeanAndUnitVariance) {
  const auto ds = make_synthetic(64, {4, 32, 32}, 1000, 7);
  double sum = 0, sq = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < 64; ++i) {
    for (float v : sample(*ds, i)) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sq += double(v) * v;
      ++n;
    }
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);  // 262144 values: standard error 0.002
  EXPECT_NEAR(var, 1.0, 0.02);
}

TEST(Synthetic, SamplesOfOneClassShareAPattern) {
  // Correlation of two samples: 0.64 (pattern variance) within a class, about
  // 0 across classes. This is what makes the data learnable.
  const auto ds = make_synthetic(20, {2, 16, 16}, 5, 3);
  auto corr = [&](int64_t a, int64_t b) {
    auto x = sample(*ds, a), y = sample(*ds, b);
    double s = 0;
    for (size_t k = 0; k < x.size(); ++k) s += double(x[k]) * y[k];
    return s / x.size();
  };
  EXPECT_NEAR(corr(0, 5), 0.64, 0.12);   // both class 0
  EXPECT_NEAR(corr(1, 11), 0.64, 0.12);  // both class 1
  EXPECT_LT(std::abs(corr(0, 1)), 0.3);
  EXPECT_LT(std::abs(corr(2, 4)), 0.3);
}

TEST(Synthetic, IndexOutsideTheDatasetIsNamed) {
  const auto ds = make_synthetic(10, {1, 2, 2}, 3, 0);
  std::vector<float> x(8);
  int64_t y[2];
  for (int64_t bad : {int64_t(10), int64_t(-1)}) {
    const int64_t idx[2] = {0, bad};
    const std::string msg = error_of<RuntimeError>([&] { ds->gather(idx, 2, x.data(), y); });
    EXPECT_NE(msg.find("synthetic (10 samples 1x2x2, 3 classes, seed 0)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index " + std::to_string(bad) + " out of range"), std::string::npos) << msg;
  }
}

TEST(Synthetic, BadArgumentsAreUsageErrors) {
  error_of<UsageError>([] { make_synthetic(0, {1, 2, 2}, 10, 0); });
  error_of<UsageError>([] { make_synthetic(10, {1, 0, 2}, 10, 0); });
  error_of<UsageError>([] { make_synthetic(10, {1, 2, 2}, 0, 0); });
  // A size whose loader order would not fit in memory (was std::bad_alloc on
  // the loader thread): refused with the bound, nothing allocated.
  const std::string msg = error_of<UsageError>([] { make_synthetic(100000000000, {1, 2, 2}, 10, 0); });
  EXPECT_NE(msg.find("from 1 to 100000000, got 100000000000"), std::string::npos) << msg;
  EXPECT_EQ(make_synthetic(kMaxSyntheticSize, {1, 2, 2}, 10, 0)->size(), kMaxSyntheticSize);
}

}  // namespace
}  // namespace perftrain::data
