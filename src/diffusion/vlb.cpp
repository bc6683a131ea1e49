// Written with Tensor methods rather than operators: the operator overloads
// live in <ATen/TensorOperators.h>, which pulls in every ATen op header.
// Operation order follows guided-diffusion so float32 rounding matches.
#include "diffusion/vlb.h"

#include <ATen/ops/where.h>

#include <cmath>

namespace perftrain::diffusion {

at::Tensor mean_flat(const at::Tensor& x) { return x.flatten(1).mean(1); }

at::Tensor normal_kl(const at::Tensor& mean1, const at::Tensor& logvar1, const at::Tensor& mean2,
                     const at::Tensor& logvar2) {
  // 0.5 * (-1 + lv2 - lv1 + exp(lv1 - lv2) + (m1 - m2)^2 * exp(-lv2))
  return logvar2.add(-1.0)
      .sub(logvar1)
      .add(logvar1.sub(logvar2).exp())
      .add(mean1.sub(mean2).square().mul(logvar2.neg().exp()))
      .mul(0.5);
}

at::Tensor approx_standard_normal_cdf(const at::Tensor& x) {
  // 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
  const double k = std::sqrt(2.0 / M_PI);
  return x.add(x.pow(3).mul(0.044715)).mul(k).tanh().add(1.0).mul(0.5);
}

at::Tensor discretized_gaussian_log_likelihood(const at::Tensor& x, const at::Tensor& means,
                                               const at::Tensor& log_scales) {
  const at::Tensor centered = x.sub(means);
  const at::Tensor inv_stdv = log_scales.neg().exp();
  const at::Tensor cdf_plus = approx_standard_normal_cdf(inv_stdv.mul(centered.add(1.0 / 255.0)));
  const at::Tensor cdf_min = approx_standard_normal_cdf(inv_stdv.mul(centered.sub(1.0 / 255.0)));
  // Clamps keep log() finite where the float32 CDF saturates.
  const at::Tensor log_cdf_plus = cdf_plus.clamp_min(1e-12).log();
  const at::Tensor log_one_minus_cdf_min = cdf_min.neg().add(1.0).clamp_min(1e-12).log();
  const at::Tensor log_cdf_delta = cdf_plus.sub(cdf_min).clamp_min(1e-12).log();
  return at::where(x.lt(-0.999), log_cdf_plus,
                   at::where(x.gt(0.999), log_one_minus_cdf_min, log_cdf_delta));
}

}  // namespace perftrain::diffusion
