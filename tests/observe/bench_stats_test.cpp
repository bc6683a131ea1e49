// Step-time statistics: quantiles as numpy computes them, the order-statistic
// confidence interval of the median (its ranks against the binomial table,
// and its coverage on random samples), and refusal of NaN / empty samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "base/error.h"
#include "observe/bench/stats.h"

namespace {

using namespace perftrain::observe::bench;

TEST(BenchStats, QuantilesMatchNumpyLinearInterpolation) {
  // numpy.percentile([1, 2, 3, 4, 10], [10, 25, 50, 75, 90]) = [1.4, 2, 3, 4, 7.6]
  const std::vector<double> x = {1, 2, 3, 4, 10};
  EXPECT_NEAR(quantile_sorted(x, 0.10), 1.4, 1e-12);
  EXPECT_NEAR(quantile_sorted(x, 0.25), 2.0, 1e-12);
  EXPECT_NEAR(quantile_sorted(x, 0.50), 3.0, 1e-12);
  EXPECT_NEAR(quantile_sorted(x, 0.75), 4.0, 1e-12);
  EXPECT_NEAR(quantile_sorted(x, 0.90), 7.6, 1e-12);
  EXPECT_EQ(quantile_sorted(x, 0.0), 1.0);
  EXPECT_EQ(quantile_sorted(x, 1.0), 10.0);
  EXPECT_EQ(quantile_sorted({4.5}, 0.3), 4.5);
  EXPECT_THROW(quantile_sorted({}, 0.5), perftrain::UsageError);
  EXPECT_THROW(quantile_sorted(x, 1.5), perftrain::UsageError);
}

TEST(BenchStats, SummaryOfAShuffledSample) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> d(1.0, 0.3);
  for (int n : {1, 2, 7, 30, 31}) {
    std::vector<double> x(n);
    for (auto& v : x) v = d(rng);
    auto sorted = x;
    std::sort(sorted.begin(), sorted.end());
    const auto s = summarize(x);
    EXPECT_EQ(s.n, n);
    EXPECT_EQ(s.min, sorted.front());
    EXPECT_EQ(s.max, sorted.back());
    const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    EXPECT_NEAR(s.median, median, 1e-12 * median) << "n=" << n;
    EXPECT_LE(s.min, s.p10);
    EXPECT_LE(s.p10, s.q1);
    EXPECT_LE(s.q1, s.median);
    EXPECT_LE(s.median, s.q3);
    EXPECT_LE(s.q3, s.p90);
    EXPECT_LE(s.p90, s.max);
    EXPECT_NEAR(s.rel_iqr, (s.q3 - s.q1) / s.median, 1e-12);
    EXPECT_LE(s.ci.low, s.median);
    EXPECT_GE(s.ci.high, s.median);
    // Order does not matter.
    std::shuffle(x.begin(), x.end(), rng);
    EXPECT_EQ(summarize(x).median, s.median);
  }
}

TEST(BenchStats, MedianIntervalRanksMatchTheBinomialTable) {
  // Largest l with P(l <= Bin(n, 1/2) <= n - l) >= 0.95, computed exactly
  // (python: math.comb): n=6 -> 1 (0.96875), 10 -> 2 (0.97852), 20 -> 6
  // (0.95861), 30 -> 10 (0.95723), 100 -> 40 (0.96480).
  struct Case {
    int n, l;
    double coverage;
  };
  for (const Case c : {Case{6, 1, 0.96875}, Case{10, 2, 0.978515625}, Case{20, 6, 0.9586105346679688},
                       Case{30, 10, 0.9572260547429323}, Case{100, 40, 0.9647997997822951}}) {
    std::vector<double> x(c.n);
    for (int i = 0; i < c.n; ++i) x[i] = 10.0 + i;  // sorted, distinct
    const auto ci = median_confidence_interval(x);
    EXPECT_EQ(ci.rank_low, c.l) << "n=" << c.n;
    EXPECT_EQ(ci.rank_high, c.n + 1 - c.l) << "n=" << c.n;
    EXPECT_EQ(ci.low, x[c.l - 1]);
    EXPECT_EQ(ci.high, x[c.n - c.l]);
    EXPECT_NEAR(ci.coverage, c.coverage, 1e-9) << "n=" << c.n;  // lgamma sums: ~1e-13 off
  }
  // Below 6 samples 95% cannot be reached: the range, with its lower coverage.
  const auto ci5 = median_confidence_interval({1, 2, 3, 4, 5});
  EXPECT_EQ(ci5.rank_low, 1);
  EXPECT_EQ(ci5.rank_high, 5);
  EXPECT_NEAR(ci5.coverage, 0.9375, 1e-12);
}

TEST(BenchStats, MedianIntervalCoversTheTrueMedianAsOftenAsItSays) {
  // Exponential(1) has median ln 2. 4000 samples of n = 30: the interval
  // covers it with probability 0.9572; the observed rate's standard error is
  // 0.0032, so [0.945, 0.970] is about +-4 standard errors.
  std::mt19937_64 rng(12345);
  std::exponential_distribution<double> d(1.0);
  const double truth = std::log(2.0);
  int covered = 0;
  const int trials = 4000;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> x(30);
    for (auto& v : x) v = d(rng);
    const auto s = summarize(x);
    covered += s.ci.low <= truth && truth <= s.ci.high;
  }
  const double rate = static_cast<double>(covered) / trials;
  EXPECT_GT(rate, 0.945);
  EXPECT_LT(rate, 0.970);
}

TEST(BenchStats, NaNInfinityAndEmptyAreErrors) {
  EXPECT_THROW(summarize({}), perftrain::UsageError);
  EXPECT_THROW(summarize({1.0, std::numeric_limits<double>::quiet_NaN(), 2.0}), perftrain::UsageError);
  EXPECT_THROW(summarize({1.0, std::numeric_limits<double>::infinity()}), perftrain::UsageError);
}

TEST(BenchStats, RunToRunSpread) {
  EXPECT_EQ(run_to_run_spread({}), 0.0);
  EXPECT_EQ(run_to_run_spread({5.0}), 0.0);
  EXPECT_NEAR(run_to_run_spread({10.0, 11.0, 10.5}), 1.0 / 10.5, 1e-12);
  EXPECT_NEAR(run_to_run_spread({12.0, 10.0}), 2.0 / 11.0, 1e-12);
}

}  // namespace
