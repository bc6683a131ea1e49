#include "nn/rms_norm.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rsqrt.h>

#include "nn/init.h"

namespace perftrain::nn {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = (xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
  return weight.defined() ? y * weight.to(x.scalar_type()) : y;
}

RMSNorm::RMSNorm(int64_t dim, at::Generator& gen, bool affine, double eps) : eps_(eps) {
  if (affine) {
    weight = at::ones({dim}, param_options(gen));
    register_parameter("weight", &weight);
  }
}

}  // namespace perftrain::nn
