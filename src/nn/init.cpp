#include "nn/init.h"

#include <cmath>

namespace perftrain::nn {

void xavier_uniform_(at::Tensor& w, at::Generator& gen) {
  const int64_t fan_out = w.size(0);
  const int64_t fan_in = w.numel() / fan_out;
  const double a = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  at::NoGradGuard no_grad;
  w.uniform_(-a, a, gen);
}

void normal_(at::Tensor& w, double std, at::Generator& gen) {
  at::NoGradGuard no_grad;
  w.normal_(0.0, std, gen);
}

at::TensorOptions param_options(const at::Generator& gen) {
  return at::TensorOptions().dtype(at::kFloat).device(gen.device());
}

}  // namespace perftrain::nn
