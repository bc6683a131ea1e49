// The initialisers the reference DiT uses, drawing from an explicit generator
// so that a seed fixes the whole model.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/TensorOptions.h>

namespace perftrain::nn {

// U(-a, a), a = sqrt(6 / (fan_in + fan_out)); fan_in is the product of all
// dimensions after the first (a conv weight viewed as [out, in*kh*kw]).
void xavier_uniform_(at::Tensor& w, at::Generator& gen);
void normal_(at::Tensor& w, double std, at::Generator& gen);

// Where parameters drawn from `gen` are created: float32 on the generator's
// device. A CUDA generator builds the model on the GPU directly (its init
// takes milliseconds; a CPU generator's draws of DiT-XL/2's 675M values take
// seconds), so the same seed gives a different initial model on CPU and GPU.
at::TensorOptions param_options(const at::Generator& gen);

}  // namespace perftrain::nn
