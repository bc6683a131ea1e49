// The initialisers the reference DiT uses, drawing from an explicit generator
// so that a seed fixes the whole model.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

namespace perftrain::nn {

// U(-a, a), a = sqrt(6 / (fan_in + fan_out)); fan_in is the product of all
// dimensions after the first (a conv weight viewed as [out, in*kh*kw]).
void xavier_uniform_(at::Tensor& w, at::Generator& gen);
void normal_(at::Tensor& w, double std, at::Generator& gen);

}  // namespace perftrain::nn
