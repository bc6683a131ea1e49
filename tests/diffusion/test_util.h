// Helpers shared by the diffusion tests: seeded CPU generators, float64
// closed-form schedule values, and tensor comparisons.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace perftrain::diffusion::testing {

inline at::Generator cpu_gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// alpha_bar_t of DiT's linear schedule, computed here independently of the
// library: prod_{i<=t} (1 - beta_i), beta_i = 1e-4 + i (0.02 - 1e-4) / 999.
inline double alpha_bar(int64_t t) {
  double log_ab = 0.0;
  for (int64_t i = 0; i <= t; ++i) log_ab += std::log1p(-(1e-4 + i * (0.02 - 1e-4) / 999.0));
  return std::exp(log_ab);
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return a.to(at::kDouble).sub(b.to(at::kDouble)).abs().max().item<double>();
}

inline std::vector<float> to_vector(const at::Tensor& x) {
  const at::Tensor c = x.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace perftrain::diffusion::testing
