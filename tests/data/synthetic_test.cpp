#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "data/dataset.h"
#include "io/test_util.h"

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

TEST(Synthetic, ValuesAreStandardNormal) {
  const auto ds = make_synthetic(64, {4, 32, 32}, 1000, 7);
  double sum = 0, sq = 0, beyond2 = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < 64; ++i) {
    for (float v : sample(*ds, i)) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sq += double(v) * v;
      beyond2 += std::abs(v) > 2.0f;
      ++n;
    }
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);  // 262144 values: standard error 0.002
  EXPECT_NEAR(var, 1.0, 0.02);
  EXPECT_NEAR(beyond2 / n, 0.0455, 0.003);
}

TEST(Synthetic, BadArgumentsAreUsageErrors) {
  error_of<UsageError>([] { make_synthetic(0, {1, 2, 2}, 10, 0); });
  error_of<UsageError>([] { make_synthetic(10, {1, 0, 2}, 10, 0); });
  error_of<UsageError>([] { make_synthetic(10, {1, 2, 2}, 0, 0); });
}

}  // namespace
}  // namespace perftrain::data
