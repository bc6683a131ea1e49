#include "nn/linear.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>

#include "nn/init.h"

namespace perftrain::nn {

Linear::Linear(int64_t in_features, int64_t out_features, at::Generator& gen, bool has_bias) {
  weight = at::empty({out_features, in_features}, param_options(gen));
  xavier_uniform_(weight, gen);
  register_parameter("weight", &weight);
  if (has_bias) {
    bias = at::zeros({out_features}, param_options(gen));
    register_parameter("bias", &bias);
  }
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  return hooked({x}, [this](at::TensorList in) { return at::linear(in[0], weight, bias); });
}

SiLULinear::SiLULinear(int64_t in_features, int64_t out_features, at::Generator& gen, bool bias)
    : linear_(in_features, out_features, gen, bias) {
  register_module("1", &linear_);
}

at::Tensor SiLULinear::forward(const at::Tensor& x) const {
  return hooked({x}, [this](at::TensorList in) { return linear_.forward(at::silu(in[0])); });
}

}  // namespace perftrain::nn
