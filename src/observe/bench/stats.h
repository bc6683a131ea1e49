// Statistics of repeated timings: a step time is a noisy sample with a long
// right tail (a clock change, a page fault, another process), so the bench
// reports the median, the spread around it, and a distribution-free 95%
// confidence interval of the median from order statistics (no normality
// assumed, no resampling noise), instead of a mean and a standard deviation.
#pragma once

#include <cstdint>
#include <vector>

namespace perftrain::observe::bench {

// The q-quantile (0 <= q <= 1) of `sorted` (ascending, non-empty) with linear
// interpolation between closest ranks (numpy.percentile's default).
double quantile_sorted(const std::vector<double>& sorted, double q);

// An interval [x_(l), x_(n+1-l)] of the sorted sample (1-based ranks) that
// holds the true median with probability `coverage` = P(l <= Bin(n, 1/2) <= n-l),
// l the largest rank for which that is at least the confidence asked. Below 6
// samples no such l exists for 95%: then l = 1 (the range) and coverage says
// how much less it is.
struct MedianInterval {
  double low = 0, high = 0;
  int64_t rank_low = 0, rank_high = 0;  // 1-based ranks of low and high
  double coverage = 0;                  // achieved coverage probability
};
MedianInterval median_confidence_interval(const std::vector<double>& sorted, double confidence = 0.95);

struct SampleSummary {
  int64_t n = 0;
  double median = 0, mean = 0, min = 0, max = 0;
  double p10 = 0, p90 = 0, q1 = 0, q3 = 0;
  double rel_iqr = 0;  // (q3 - q1) / median: the spread as a fraction of the median
  MedianInterval ci;   // 95% interval of the median
};

// Summary of a sample in any order. Throws UsageError when it is empty or
// holds a NaN or an infinity (a timing that is not a number is a bug, not
// noise).
SampleSummary summarize(std::vector<double> samples);

// (max - min) / median of per-repeat medians: how much a whole timed window
// moves from one repeat to the next (0 for a single repeat).
double run_to_run_spread(const std::vector<double>& repeat_medians);

}  // namespace perftrain::observe::bench
