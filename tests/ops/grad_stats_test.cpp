// ops::grad_stats_into on the CPU (the reference path: the monitor's former
// ATen code) against a direct computation in double on fresh random
// gradients with values exactly on every bucket edge and one float step
// either side, zeros of both signs, subnormals, NaN, +-Inf, huge and tiny
// magnitudes, empty, undefined and odd-sized gradients, fp32/bf16/fp16, with
// and without a loss scale; the scale's handling against the former
// monitor's sequence bit for bit; argument errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/grad_stats.h"
#include "grad_stats_inputs.h"

namespace perftrain::ops {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using grad_stats_inputs::edge_and_special_values;
using grad_stats_inputs::monitor_edges;
using grad_stats_inputs::planted;

struct Direct {
  double norm = 0, abs_sum = 0, max_abs = 0, nonzero = 0, nonfinite = 0, min = 0, max = 0, sum = 0;
  std::vector<double> counts;
};

// In double over the gradient as float32 (what both paths compare); bucket
// by a linear scan: the first edge (times the scale, in float32) >= x.
Direct direct(const at::Tensor& grad, const at::Tensor& edges, float scale) {
  Direct d;
  d.counts.assign(static_cast<size_t>(edges.numel() + 1), 0.0);
  if (!grad.defined() || grad.numel() == 0) return d;
  const at::Tensor v = grad.reshape({-1}).to(at::kFloat).contiguous();
  const float* p = v.data_ptr<float>();
  const float* e = edges.data_ptr<float>();
  double sq = 0;
  d.min = kInf, d.max = -kInf;
  bool nan = false;
  for (int64_t i = 0; i < v.numel(); ++i) {
    const double x = p[i];
    sq += static_cast<float>(x * x);  // each square in fp32, as both paths (tiny ones underflow)
    d.abs_sum += std::fabs(x);
    d.sum += x;
    if (std::isnan(x)) nan = true;
    else d.max_abs = std::max(d.max_abs, std::fabs(x)), d.min = std::min(d.min, x), d.max = std::max(d.max, x);
    d.nonzero += x != 0;
    if (!std::isfinite(x)) {
      d.nonfinite += 1;
      continue;
    }
    size_t b = 0;
    while (b < static_cast<size_t>(edges.numel()) && e[b] * scale < p[i]) ++b;
    d.counts[b] += 1;
  }
  if (nan) d.max_abs = d.min = d.max = kNaN;
  // The fp32 result (over FLT_MAX: inf), then divided by the scale in fp32.
  const auto f32 = [scale](double v) { return static_cast<double>(static_cast<float>(static_cast<float>(v) / scale)); };
  d.norm = f32(std::sqrt(sq)), d.abs_sum = f32(d.abs_sum), d.sum = f32(d.sum);
  d.max_abs = f32(d.max_abs), d.min = f32(d.min), d.max = f32(d.max);
  return d;
}

// A sum's error grows with the sum of the magnitudes, not with the result.
bool same_sum(double got, double want, double abs_sum) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= 1e-5 * abs_sum + 1e-37;
}

// Same value: both NaN, both the same infinity, or within rel (0: as float32).
bool same(double got, double want, double rel) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  if (rel == 0) return got == static_cast<double>(static_cast<float>(want));
  return std::fabs(got - want) <= rel * std::fabs(want) + 1e-37;
}

void expect_rows_match(const std::vector<at::Tensor>& grads, const at::Tensor& stats, const at::Tensor& hist,
                       const at::Tensor& edges, float scale, double norm_rel, const std::string& what) {
  const at::Tensor s = stats.to(at::kDouble).contiguous(), h = hist.to(at::kDouble).contiguous();
  for (size_t i = 0; i < grads.size(); ++i) {
    const Direct d = direct(grads[i], edges, scale);
    const auto r = static_cast<int64_t>(i);
    const std::string who = what + " gradient " + std::to_string(i);
    EXPECT_PRED3(same, s[r][0].item<double>(), d.norm, norm_rel) << who << " norm";
    EXPECT_PRED3(same, s[r][1].item<double>(), d.abs_sum, norm_rel) << who << " sum |g|";
    EXPECT_PRED3(same, s[r][2].item<double>(), d.max_abs, norm_rel) << who << " max |g|";
    EXPECT_EQ(s[r][3].item<double>(), d.nonzero) << who << " nonzero";
    EXPECT_EQ(s[r][4].item<double>(), d.nonfinite) << who << " non-finite";
    EXPECT_PRED3(same, h[r][0].item<double>(), d.min, 0.0) << who << " min";
    EXPECT_PRED3(same, h[r][1].item<double>(), d.max, 0.0) << who << " max";
    EXPECT_PRED3(same_sum, h[r][2].item<double>(), d.sum, d.abs_sum) << who << " sum";
    int wrong = 0;
    for (size_t b = 0; b < d.counts.size(); ++b) {
      const double got = h[r][kGradHistLead + static_cast<int64_t>(b)].item<double>();
      if (got != d.counts[b] && ++wrong <= 5)
        ADD_FAILURE() << who << " bucket " << b << ": " << got << " want " << d.counts[b];
    }
  }
}

std::vector<at::Tensor> test_grads(const at::Tensor& edges, float scale) {
  const auto sv = edge_and_special_values(edges, scale);
  std::vector<at::Tensor> g;
  g.push_back(at::tensor(sv, at::kFloat));                  // every edge and its neighbours
  g.push_back(planted({37, 29}, sv, at::kFloat));           // odd sizes
  g.push_back(at::Tensor());                                // undefined
  g.push_back(at::empty({0, 4}));                           // empty
  g.push_back(planted({7}, {}, at::kFloat));                // tiny, no specials
  g.push_back(at::zeros({5, 3}));                           // all zero
  g.push_back(planted({70001}, sv, at::kFloat));            // over one kernel chunk
  g.push_back(planted({33, 65}, {}, at::kFloat) * 1e-30);   // tiny magnitudes, subnormals among them
  at::Tensor nan_inf = planted({1000}, {}, at::kFloat);
  nan_inf[10] = kNaN;
  nan_inf[20] = kInf;
  nan_inf[30] = -kInf;
  g.push_back(nan_inf);
  at::Tensor inf_only = planted({999}, {}, at::kFloat);
  inf_only[998] = kInf;
  g.push_back(inf_only);
  g.push_back(planted({123, 7}, sv, at::kFloat).t());  // not contiguous
  return g;
}

TEST(GradStats, CpuRowsEqualADirectComputation) {
  at::manual_seed(31);
  const at::Tensor edges = monitor_edges();
  for (const float scale : {1.f, 2048.f}) {
    const auto grads = test_grads(edges, scale);
    const auto n = static_cast<int64_t>(grads.size());
    const at::Tensor stats = at::full({n, 7}, kNaN), hist = at::full({n, kGradHistLead + 115}, kNaN);
    grad_stats_into(grads, stats, hist, edges, scale == 1.f ? at::Tensor() : at::full({}, scale));
    expect_rows_match(grads, stats, hist, edges, scale, 1e-5, "scale " + std::to_string(scale));
    // Columns past the statistics are left alone.
    EXPECT_TRUE(at::isnan(stats.narrow(1, kGradStatColumns, 2)).all().item<bool>());
    // Many buckets are covered, each edge's value lands in its own bucket.
    EXPECT_EQ((hist[0].narrow(0, kGradHistLead, 115) > 0).sum().item<int64_t>(), 115) << scale;
  }
}

TEST(GradStats, CpuReducedPrecisionGradients) {
  at::manual_seed(32);
  const at::Tensor edges = monitor_edges();
  const auto sv = edge_and_special_values(edges, 1.f);
  const std::vector<at::Tensor> grads = {planted({257, 3}, sv, at::kBFloat16), planted({4099}, sv, at::kHalf),
                                         planted({9}, {}, at::kBFloat16)};
  const at::Tensor stats = at::zeros({3, 5}), hist = at::zeros({3, kGradHistLead + 115});
  grad_stats_into(grads, stats, hist, edges);
  // The reference's norms come back in the gradient's dtype (1e-2: bf16's rounding).
  expect_rows_match(grads, stats, hist, edges, 1.f, 1e-2, "bf16/fp16");
}

// The scale as the monitor applied it before the op existed: statistics of
// the scaled gradients divided by the scale, edges times the scale.
TEST(GradStats, ScaleIsTheFormerMonitorSequence) {
  at::manual_seed(33);
  const at::Tensor edges = monitor_edges();
  const at::Tensor scale = at::full({}, 65536.f);
  std::vector<at::Tensor> grads = test_grads(edges, 65536.f);
  const auto n = static_cast<int64_t>(grads.size());
  const at::Tensor stats = at::zeros({n, 7}), hist = at::zeros({n, kGradHistLead + 115});
  grad_stats_into(grads, stats, hist, edges, scale);
  at::Tensor want_stats = at::zeros({n, 7});
  want_stats.narrow(1, 0, 5).copy_(grad_stat_rows_reference(grads));
  want_stats.narrow(1, 0, 3).div_(scale);
  at::Tensor want_hist = grad_histogram_rows_reference(grads, edges * scale);
  want_hist.narrow(1, 0, kGradHistLead).div_(scale);
  EXPECT_TRUE(at::equal(at::nan_to_num(stats, 7.0), at::nan_to_num(want_stats, 7.0)));
  EXPECT_TRUE(at::equal(at::nan_to_num(hist, 7.0), at::nan_to_num(want_hist, 7.0)));
  // And the scale changes the buckets: the unscaled edges give other counts.
  const at::Tensor unscaled = grad_histogram_rows_reference(grads, edges);
  EXPECT_FALSE(at::equal(unscaled.narrow(1, kGradHistLead, 115), hist.narrow(1, kGradHistLead, 115)));
}

TEST(GradStats, NoHistogramsWritesOnlyTheStatistics) {
  at::manual_seed(34);
  const std::vector<at::Tensor> grads = {at::randn({6, 5}), at::randn({11})};
  const at::Tensor stats = at::full({2, 7}, -1.0);
  grad_stats_into(grads, stats, {}, {});
  EXPECT_NEAR(stats[0][0].item<double>(), grads[0].to(at::kDouble).norm().item<double>(), 1e-5);
  EXPECT_EQ(stats[1][3].item<double>(), 11.0);
  EXPECT_TRUE((stats.narrow(1, 5, 2) == -1).all().item<bool>());
  grad_stats_into({}, at::zeros({0, 5}), {}, {});  // no gradients: nothing to do
}

TEST(GradStats, BadArgumentsRaiseUsageError) {
  const std::vector<at::Tensor> grads = {at::randn({4})};
  const at::Tensor edges = monitor_edges();
  EXPECT_THROW(grad_stats_into(grads, at::zeros({2, 5}), {}, {}), UsageError);                 // rows
  EXPECT_THROW(grad_stats_into(grads, at::zeros({1, 4}), {}, {}), UsageError);                 // columns
  EXPECT_THROW(grad_stats_into(grads, at::zeros({1, 5}, at::kDouble), {}, {}), UsageError);    // dtype
  EXPECT_THROW(grad_stats_into(grads, at::zeros({5, 2}).t().narrow(0, 0, 1), {}, {}), UsageError);  // column stride
  EXPECT_THROW(grad_stats_into(grads, at::zeros({1, 5}), at::zeros({1, 100}), edges), UsageError);  // width
  EXPECT_THROW(grad_stats_into(grads, at::zeros({1, 5}), at::zeros({1, 118}), {}), UsageError);     // no edges
  EXPECT_THROW(grad_stats_into(grads, at::zeros({1, 5}), {}, {}, at::ones({2})), UsageError);       // scale
}

}  // namespace
}  // namespace perftrain::ops
