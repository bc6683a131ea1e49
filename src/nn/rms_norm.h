// RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps), computed in
// float32 and returned in x's dtype, times a learned weight ("weight", ones
// at init) unless built without one.
#pragma once

#include <ATen/core/Generator.h>

#include "nn/module.h"

namespace perftrain::nn {

// The function alone (weight may be undefined).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps = 1e-6);

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, at::Generator& gen, bool affine = true, double eps = 1e-6);
  at::Tensor forward(const at::Tensor& x) const {
    return hooked({x}, [this](at::TensorList in) { return rms_norm(in[0], weight, eps_); });
  }

  at::Tensor weight;  // [dim] or undefined

 private:
  double eps_;
};

}  // namespace perftrain::nn
