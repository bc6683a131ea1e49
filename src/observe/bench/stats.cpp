#include "observe/bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"

namespace perftrain::observe::bench {
namespace {

// P(lo <= Bin(n, 1/2) <= hi), summed in log space so that n in the thousands
// neither overflows a binomial coefficient nor underflows 2^-n.
double binomial_half_mass(int64_t n, int64_t lo, int64_t hi) {
  double p = 0;
  for (int64_t k = std::max<int64_t>(lo, 0); k <= std::min(hi, n); ++k)
    p += std::exp(std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) - n * std::log(2.0));
  return std::min(p, 1.0);
}

}  // namespace

double quantile_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) throw UsageError("quantile of an empty sample");
  if (!(q >= 0 && q <= 1)) throw UsageError("quantile must lie in [0, 1]");
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= sorted.size()) return sorted.back();
  const double frac = pos - static_cast<double>(i);
  return sorted[i] + frac * (sorted[i + 1] - sorted[i]);
}

MedianInterval median_confidence_interval(const std::vector<double>& sorted, double confidence) {
  if (sorted.empty()) throw UsageError("confidence interval of an empty sample");
  const int64_t n = static_cast<int64_t>(sorted.size());
  int64_t l = 1;
  // Coverage shrinks as l grows: take the largest l that still reaches it.
  for (int64_t cand = 2; cand <= (n + 1) / 2; ++cand) {
    if (binomial_half_mass(n, cand, n - cand) >= confidence) l = cand;
    else break;
  }
  MedianInterval ci;
  ci.rank_low = l;
  ci.rank_high = n + 1 - l;
  ci.low = sorted[l - 1];
  ci.high = sorted[n - l];
  ci.coverage = binomial_half_mass(n, l, n - l);
  return ci;
}

SampleSummary summarize(std::vector<double> samples) {
  if (samples.empty()) throw UsageError("no samples to summarize");
  for (double v : samples)
    if (!std::isfinite(v)) throw UsageError("a timing sample is not a finite number");
  std::sort(samples.begin(), samples.end());
  SampleSummary s;
  s.n = static_cast<int64_t>(samples.size());
  s.min = samples.front();
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(s.n);
  s.median = quantile_sorted(samples, 0.5);
  s.p10 = quantile_sorted(samples, 0.1);
  s.p90 = quantile_sorted(samples, 0.9);
  s.q1 = quantile_sorted(samples, 0.25);
  s.q3 = quantile_sorted(samples, 0.75);
  s.rel_iqr = s.median != 0 ? (s.q3 - s.q1) / std::fabs(s.median) : 0;
  s.ci = median_confidence_interval(samples);
  return s;
}

double run_to_run_spread(const std::vector<double>& repeat_medians) {
  if (repeat_medians.size() < 2) return 0;
  auto sorted = repeat_medians;
  std::sort(sorted.begin(), sorted.end());
  const double med = quantile_sorted(sorted, 0.5);
  return med != 0 ? (sorted.back() - sorted.front()) / std::fabs(med) : 0;
}

}  // namespace perftrain::observe::bench
