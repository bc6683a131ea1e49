// y = x W^T + b, with PyTorch's parameter names ("weight", "bias").
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>

#include "nn/module.h"

namespace perftrain::nn {

class Linear : public Module {
 public:
  // Weights are xavier-uniform and the bias zero, as the reference DiT
  // initialises every nn.Linear; callers re-initialise where it differs.
  Linear(int64_t in_features, int64_t out_features, at::Generator& gen, bool bias = true);
  at::Tensor forward(const at::Tensor& x) const;

  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out] or undefined
};

// SiLU followed by a Linear, named like torch.nn.Sequential(SiLU(), Linear()):
// the linear is child "1" ("adaLN_modulation.1.weight").
class SiLULinear : public Module {
 public:
  SiLULinear(int64_t in_features, int64_t out_features, at::Generator& gen, bool bias = true);
  at::Tensor forward(const at::Tensor& x) const;
  Linear& linear() { return linear_; }
  const Linear& linear() const { return linear_; }

 private:
  Linear linear_;
};

}  // namespace perftrain::nn
