#include "observe/eval/metrics.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cdist.h>
#include <ATen/ops/linalg_eigh.h>
#include <ATen/ops/linalg_eigvalsh.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"

namespace perftrain::observe::eval {
namespace {

constexpr int64_t kRowBlock = 1024;  // rows of a distance block: 1024 x N float64 at a time

void check_matrix(const at::Tensor& t, const char* what, int64_t min_rows) {
  if (!t.defined() || t.dim() != 2 || t.size(0) < min_rows)
    throw UsageError(std::string(what) + " must be [N, D] with N >= " + std::to_string(min_rows));
}

// The symmetric square root of a symmetric positive semi-definite matrix
// (eigenvalues rounded below zero taken as zero).
at::Tensor psd_sqrt(const at::Tensor& m) {
  auto [w, v] = at::linalg_eigh(m);
  return (v * w.clamp_min(0).sqrt().unsqueeze(0)).mm(v.t());
}

// The distance from each row of `points` to its k-th nearest other row.
at::Tensor kth_neighbour_radii(const at::Tensor& points, int64_t k) {
  std::vector<at::Tensor> radii;
  for (int64_t i = 0; i < points.size(0); i += kRowBlock) {
    const at::Tensor d = at::cdist(points.narrow(0, i, std::min(kRowBlock, points.size(0) - i)), points);
    // k + 1 smallest: the point itself (distance 0) is the first.
    radii.push_back(std::get<0>(d.topk(k + 1, 1, /*largest=*/false, /*sorted=*/true)).select(1, k));
  }
  return at::cat(radii);
}

// The fraction of `queries` inside at least one ball (centres, radii).
double fraction_covered(const at::Tensor& queries, const at::Tensor& centres, const at::Tensor& radii) {
  int64_t inside = 0;
  for (int64_t i = 0; i < queries.size(0); i += kRowBlock) {
    const at::Tensor d = at::cdist(queries.narrow(0, i, std::min(kRowBlock, queries.size(0) - i)), centres);
    inside += d.le(radii.unsqueeze(0)).any(1).sum().item<int64_t>();
  }
  return static_cast<double>(inside) / static_cast<double>(queries.size(0));
}

}  // namespace

FeatureStats feature_stats(const at::Tensor& features) {
  check_matrix(features, "features", 2);
  at::NoGradGuard no_grad;
  const at::Tensor f = features.to(at::kDouble);
  FeatureStats s;
  s.mu = f.mean(0);
  const at::Tensor c = f - s.mu;
  s.sigma = c.t().mm(c) / static_cast<double>(f.size(0) - 1);
  return s;
}

double frechet_distance(const FeatureStats& a, const FeatureStats& b) {
  if (a.mu.numel() != b.mu.numel() || a.sigma.sizes() != b.sigma.sizes() ||
      a.sigma.numel() != a.mu.numel() * a.mu.numel())
    throw UsageError("Fréchet distance: statistics of different dimensions (" + std::to_string(a.mu.numel()) +
                     " and " + std::to_string(b.mu.numel()) + ")");
  at::NoGradGuard no_grad;
  const at::Tensor mu1 = a.mu.to(at::kDouble).flatten(), mu2 = b.mu.to(a.mu.device(), at::kDouble).flatten();
  const at::Tensor s1 = a.sigma.to(at::kDouble), s2 = b.sigma.to(a.sigma.device(), at::kDouble);
  const at::Tensor diff = mu1 - mu2;
  const at::Tensor root1 = psd_sqrt(s1);
  at::Tensor m = root1.mm(s2).mm(root1);
  m = (m + m.t()) * 0.5;
  const double tr_covmean = at::linalg_eigvalsh(m).clamp_min(0).sqrt().sum().item<double>();
  return diff.dot(diff).item<double>() + s1.trace().item<double>() + s2.trace().item<double>() - 2 * tr_covmean;
}

InceptionScore inception_score(const at::Tensor& logits, int64_t splits) {
  check_matrix(logits, "logits", splits);
  at::NoGradGuard no_grad;
  const at::Tensor logp = at::log_softmax(logits.to(at::kDouble), 1);
  const int64_t n = logp.size(0);
  std::vector<double> scores;
  for (int64_t s = 0; s < splits; ++s) {
    const int64_t begin = s * n / splits, end = (s + 1) * n / splits;
    const at::Tensor part = logp.narrow(0, begin, end - begin);
    const at::Tensor log_py = part.exp().mean(0).log();
    const double kl = (part.exp() * (part - log_py.unsqueeze(0))).sum(1).mean().item<double>();
    scores.push_back(std::exp(kl));
  }
  InceptionScore out;
  for (double v : scores) out.mean += v / splits;
  for (double v : scores) out.std += (v - out.mean) * (v - out.mean) / splits;
  out.std = std::sqrt(out.std);
  return out;
}

PrecisionRecall precision_recall(const at::Tensor& real, const at::Tensor& fake, int64_t k) {
  check_matrix(real, "real features", k + 1);
  check_matrix(fake, "generated features", k + 1);
  if (real.size(1) != fake.size(1))
    throw UsageError("precision/recall: real features have " + std::to_string(real.size(1)) +
                     " dimensions, generated " + std::to_string(fake.size(1)));
  at::NoGradGuard no_grad;
  const at::Tensor r = real.to(at::kDouble), f = fake.to(real.device(), at::kDouble);
  PrecisionRecall out;
  out.precision = fraction_covered(f, r, kth_neighbour_radii(r, k));
  out.recall = fraction_covered(r, f, kth_neighbour_radii(f, k));
  return out;
}

}  // namespace perftrain::observe::eval
