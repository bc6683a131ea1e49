// Pieces of the variational lower bound, as in OpenAI's guided-diffusion
// (diffusion/losses.py), which DiT uses unchanged. Pure element-wise tensor
// math: no host syncs, so they can live inside a captured CUDA graph.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::diffusion {

// Mean over every dimension but the first: [B, ...] -> [B].
at::Tensor mean_flat(const at::Tensor& x);

// KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))), element-wise, in nats.
at::Tensor normal_kl(const at::Tensor& mean1, const at::Tensor& logvar1, const at::Tensor& mean2,
                     const at::Tensor& logvar2);

// The tanh approximation of the standard normal CDF that guided-diffusion
// uses (kept for bit-compatibility of the loss values, not for accuracy).
at::Tensor approx_standard_normal_cdf(const at::Tensor& x);

// Log-likelihood (nats) of x under a Gaussian discretized into bins of width
// 2/255 on [-1, 1]; the outermost bins (|x| > 0.999) extend to infinity.
at::Tensor discretized_gaussian_log_likelihood(const at::Tensor& x, const at::Tensor& means,
                                               const at::Tensor& log_scales);

}  // namespace perftrain::diffusion
