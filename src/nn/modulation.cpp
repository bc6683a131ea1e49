#include "nn/modulation.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/layer_norm.h>

namespace perftrain::nn {

at::Tensor layer_norm_no_affine(const at::Tensor& x, double eps) {
  return at::layer_norm(x, {x.size(-1)}, {}, {}, eps);
}

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

}  // namespace perftrain::nn
