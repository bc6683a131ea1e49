// Sample-quality metrics on feature vectors (docs/guide/evaluation.md), each
// as its reference computes it:
//   Fréchet distance (FID when the features are Inception pool3): pytorch-fid's
//     calculate_frechet_distance, with the trace of sqrtm(S1 S2) taken as the
//     trace of the symmetric sqrt(S1^1/2 S2 S1^1/2) (the same eigenvalues),
//     from eigh in float64;
//   Inception score: exp(E_x KL(p(y|x) || p(y))) over `splits` equal parts,
//     their mean and standard deviation, from the 1008-way logits;
//   precision and recall: Kynkäänniemi et al. 2019, k-NN manifolds (a
//     point's radius: the distance to its k-th nearest other point of its
//     set), in float64, a block of rows at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace perftrain::observe::eval {

// The mean [D] and covariance [D, D] (unbiased, as np.cov) in float64.
struct FeatureStats {
  at::Tensor mu, sigma;
};

// UsageError when features are not [N, D] with N >= 2.
FeatureStats feature_stats(const at::Tensor& features);
// UsageError when the two dimensions differ.
double frechet_distance(const FeatureStats& a, const FeatureStats& b);

struct InceptionScore {
  double mean = 0, std = 0;
};
InceptionScore inception_score(const at::Tensor& logits, int64_t splits = 10);

struct PrecisionRecall {
  double precision = 0, recall = 0;
};
PrecisionRecall precision_recall(const at::Tensor& real, const at::Tensor& fake, int64_t k = 3);

}  // namespace perftrain::observe::eval
